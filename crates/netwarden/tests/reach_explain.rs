//! Property: `reach` and `explain` agree on every probe of random clusters (issue: foundation).
//! Both are computed from the same rules, but through different lookups (reach walks networks,
//! explain walks one pair's shared networks), so this pins that they pick the same interfaces,
//! addresses and verdicts.

use netwarden::cli_args::{PodSelectorArg, PortProto};
use netwarden::explain::explain;
use netwarden::reach::{reach, Family, ReachQuery};
use netwarden_engine::testing::*;
use netwarden_engine::*;
use proptest::prelude::*;

fn arb_policy(i: usize) -> impl Strategy<Value = Policy> {
    (
        0..3usize,
        0..3usize,
        any::<bool>(),
        0..3usize,
        any::<bool>(),
        80u16..82,
    )
        .prop_map(move |(kind, app, egress, peer, monitor, port)| {
            let kind = [
                PolicyKind::NetworkPolicy,
                PolicyKind::DanmNetworkPolicy,
                PolicyKind::MultiNetworkPolicy,
            ][kind];
            let apps = ["a", "b", "c"];
            let peer = match peer {
                0 => pods_peer(Some(selector(&[("app", apps[(app + 1) % 3])])), None),
                1 => pods_peer(None, Some(selector(&[]))),
                _ => ip_block("10.0.0.0/24", &["10.0.0.2/32"]),
            };
            let rules = Some(vec![rule(vec![peer], vec![tcp(port)])]);
            let (ingress, egress) = if egress { (None, rules) } else { (rules, None) };
            let mut p = policy(
                kind,
                "x",
                &format!("p{i}"),
                selector(&[("app", apps[app])]),
                ingress,
                egress,
            );
            if kind == PolicyKind::MultiNetworkPolicy {
                p.scope = PolicyScope::Networks(vec![NetworkId::nad("x", "net1")]);
            }
            if monitor {
                p.mode = Mode::Monitor;
            }
            p
        })
}

fn arb_policies() -> impl Strategy<Value = Vec<Policy>> {
    (0..4usize).prop_flat_map(|n| (0..n).map(arb_policy).collect::<Vec<_>>())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn reach_agrees_with_explain(policies in arb_policies(), dual in any::<bool>()) {
        let mut e = Engine::new(EngineOptions::default());
        for (i, app) in ["a", "b", "c"].iter().enumerate() {
            let v4 = format!("10.0.0.{}", i + 1);
            let v6 = format!("fd00::{}", i + 1);
            let ips: Vec<&str> = if dual { vec![&v4, &v6] } else { vec![&v4] };
            let mut p = pod("x", app, &[("app", app)], &ips);
            if i != 2 {
                p = with_interface(p, "net1", NetworkId::nad("x", "net1"), &[&format!("192.168.0.{}", i + 1)]);
            }
            e.set_pod(p);
        }
        for p in policies {
            e.set_policy(p);
        }
        let rules = e.all_pod_rules();
        let ports = vec![PortProto { port: 80, protocol: Protocol::Tcp }, PortProto { port: 81, protocol: Protocol::Tcp }];
        let report = reach(&e, &rules, &ReachQuery { ports: ports.clone(), network: None, from: PodSelectorArg::All, to: PodSelectorArg::All });
        prop_assert!(!report.probes.is_empty());
        for p in &report.probes {
            let port = PortProto { port: p.port, protocol: p.protocol };
            let ex = explain(&rules, &p.from, &p.to, port, Some(&p.network.display_name()), Some(p.family)).unwrap();
            prop_assert_eq!(ex.len(), 1);
            prop_assert_eq!(ex[0].verdict.allowed, p.allowed);
            prop_assert_eq!(ex[0].verdict.staged_allowed, p.staged_allowed);
            prop_assert_eq!(ex[0].src, p.src);
            prop_assert_eq!(ex[0].dst, p.dst);
            prop_assert!(matches!(p.family, Family::Ipv4 | Family::Ipv6));
        }
    }
}
