//! Learn mode in the renderers: learn rules never change a verdict (every scenario, traced with
//! and without learn mode over a grid of packets), every new TCP/UDP/SCTP flow of a learning
//! pod is logged with a key that maps back to its interface and direction, the iptables
//! backend refuses a learning pod, and the libnftables JSON the dataplane applies loads into
//! the kernel as exactly the table the nft text describes.

mod common;

use std::net::IpAddr;

use common::*;
use netwarden_engine::{Direction, PodRules, Protocol};
use netwarden_render::nft::{build_table, Transaction, LEARN_FULL_COUNTER};
use netwarden_render::tracer::{trace, TracePacket, TraceProtocol};
use netwarden_render::{log_keys, parse_log_prefix, render_iptables, LogAction, RenderError};
use netwarden_testing::ScratchNetns;

/// Packets on every interface of the pod, both directions, several peers and ports, every
/// protocol, new and established, plus loopback and forwarded ones.
fn packets(rules: &PodRules) -> Vec<TracePacket> {
    let peers: Vec<IpAddr> = [
        "10.0.0.2",
        "10.0.0.9",
        "192.168.1.7",
        "fd00::2",
        "fd00:1::5",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    let protocols = [
        TraceProtocol::L4(Protocol::Tcp),
        TraceProtocol::L4(Protocol::Udp),
        TraceProtocol::L4(Protocol::Sctp),
        TraceProtocol::Icmp,
    ];
    let mut out = Vec::new();
    for iface in &rules.interfaces {
        for direction in [Direction::Ingress, Direction::Egress] {
            for &peer in &peers {
                for protocol in protocols {
                    for port in [53, 80, 443, 8080] {
                        for (new_connection, loopback, forwarded) in [
                            (true, false, false),
                            (false, false, false),
                            (true, true, false),
                            (true, false, true),
                        ] {
                            out.push(TracePacket {
                                direction,
                                interface: iface.name.clone(),
                                peer,
                                local: None,
                                protocol,
                                port,
                                new_connection,
                                loopback,
                                forwarded,
                                mark: 0,
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

/// The families learn mode watches on an interface with these addresses.
fn watched(rules: &PodRules, interface: &str, peer: IpAddr) -> bool {
    let ips = &rules.interface(interface).unwrap().ips;
    let (v4, v6) = (
        ips.iter().any(IpAddr::is_ipv4),
        ips.iter().any(IpAddr::is_ipv6),
    );
    match (v4, v6) {
        (true, false) => peer.is_ipv4(),
        (false, true) => peer.is_ipv6(),
        _ => true,
    }
}

#[test]
fn learn_rules_never_change_a_verdict_and_log_every_new_flow() {
    let mut checked = 0;
    for (name, rules, opts) in scenarios() {
        let quiet = PodRules {
            learn: false,
            ..rules.clone()
        };
        let learning = PodRules {
            learn: true,
            ..rules.clone()
        };
        let keys = log_keys(&learning);
        for p in packets(&learning) {
            let before = trace(&quiet, &opts, &p).unwrap();
            let after = trace(&learning, &opts, &p).unwrap();
            // The verdict, the monitor's log message and the mark are those without learning.
            assert_eq!(after.verdict, before.verdict, "{name}: {p:?}");
            assert_eq!(after.logged, before.logged, "{name}: {p:?}");
            assert_eq!(after.log_prefix, before.log_prefix, "{name}: {p:?}");
            assert_eq!(after.mark, before.mark, "{name}: {p:?}");
            assert_eq!(before.observed, None, "{name}: {p:?}");
            let expect = p.new_connection
                && !p.loopback
                && !p.forwarded
                && matches!(p.protocol, TraceProtocol::L4(_))
                && watched(&learning, &p.interface, p.peer);
            assert_eq!(after.observed.is_some(), expect, "{name}: {p:?}");
            if let Some(prefix) = &after.observed {
                let (action, key) = parse_log_prefix(prefix).expect("our prefix");
                assert_eq!(action, LogAction::Observed);
                let info = &keys[&key.0];
                assert_eq!(
                    (info.interface.as_str(), info.direction),
                    (p.interface.as_str(), p.direction),
                    "{name}: {p:?}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 10_000, "only {checked} packets traced");
}

#[test]
fn a_pod_only_learning_gets_base_chains_with_learn_rules_only() {
    let (_, rules, opts) = scenarios()
        .into_iter()
        .find(|s| s.0 == "learn_open")
        .unwrap();
    assert!(!rules.is_isolated());
    let table = build_table(&rules, &opts).unwrap().expect("a table");
    let names: Vec<&str> = table.chains.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["input", "output"]);
    // eth0 dual-stack, net1 IPv4: 3 families × 2 directions → per direction v4 and v6 sets.
    assert_eq!(table.learn_sets.len(), 4);
    assert_eq!(table.counters, [LEARN_FULL_COUNTER]);
    // Per chain: lo, established, (eth0: 2 families + net1: 1) × 3 protocols × 2 rules, ND.
    let input = table.chain("input").unwrap();
    assert_eq!(input.rules.len(), 2 + 3 * 3 * 2 + 4);
    // Without learning the pod has no table at all.
    let quiet = PodRules {
        learn: false,
        ..rules
    };
    assert!(build_table(&quiet, &opts).unwrap().is_none());
}

#[test]
fn iptables_refuses_a_learning_pod() {
    for (name, rules, opts) in scenarios() {
        let learning = PodRules {
            learn: true,
            ..rules
        };
        let err = render_iptables(&learning, &opts).expect_err(name);
        assert_eq!(
            err,
            RenderError::LearnNeedsNft {
                pod: learning.pod.clone()
            }
        );
        let text = err.to_string();
        assert!(
            text.contains("ns/pod") && text.contains("--learn") && text.contains("nft"),
            "{text}"
        );
    }
}

/// The JSON transaction (what the dataplane applies) and the text (what `render` prints and the
/// golden files hold) give the same kernel table, learn sets, counter and rules included.
#[test]
fn json_and_text_load_the_same_learn_table() {
    let Some(by_json) = ScratchNetns::new("nwrt-lrnj") else {
        return;
    };
    let by_text = ScratchNetns::new("nwrt-lrnt").expect("root");
    for (name, rules, opts) in scenarios()
        .into_iter()
        .filter(|s| s.0.starts_with("learn_"))
    {
        let table = build_table(&rules, &opts).unwrap().unwrap();
        let tx = Transaction::create(&table);
        let (ok, _, stderr) = by_json.nft(&["-j", "-f", "-"], &tx.to_json());
        assert!(ok, "{name}: JSON refused: {stderr}\n{}", tx.to_json());
        let (ok, _, stderr) = by_text.nft(&["-f", "-"], &tx.to_text());
        assert!(ok, "{name}: text refused: {stderr}\n{}", tx.to_text());
        let list = |ns: &ScratchNetns| {
            let (ok, out, stderr) = ns.nft(&["list", "table", "inet", "netwarden"], "");
            assert!(ok, "{stderr}");
            out
        };
        // The text applies again over the table (it says `dynamic`); so does the JSON without
        // its learn sets, the way the planner sends it once the kernel holds them.
        let (ok, _, stderr) = by_text.nft(&["-f", "-"], &tx.to_text());
        assert!(ok, "{name}: text refused over itself: {stderr}");
        let mut again = Transaction::default();
        again.declare_some(&table, |_| true, |_| false);
        again.refill_chains(&table);
        let (ok, _, stderr) = by_json.nft(&["-j", "-f", "-"], &again.to_json());
        assert!(ok, "{name}: JSON refused over itself: {stderr}");
        let (j, t) = (list(&by_json), list(&by_text));
        assert_eq!(j, t, "{name}: JSON and text differ");
        for set in &table.learn_sets {
            assert!(j.contains(&format!("set {} {{", set.name)), "{name}: {j}");
        }
        assert!(j.contains("flags dynamic,timeout"), "{name}: {j}");
        assert!(
            j.contains(&format!("counter {LEARN_FULL_COUNTER}")),
            "{name}: {j}"
        );
        for ns in [&by_json, &by_text] {
            let (ok, _, stderr) = ns.nft(&["delete", "table", "inet", "netwarden"], "");
            assert!(ok, "{stderr}");
        }
    }
}
