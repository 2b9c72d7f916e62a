//! Golden tests of the iptables renderer: each case builds pods and policies, runs them through
//! the engine, renders the target pod and compares the text with `tests/golden/iptables/<case>.txt`
//! (exact: the renderer is deterministic). `NETWARDEN_BLESS=1 cargo test` rewrites the files;
//! review the diff before keeping it.
//!
//! A second test feeds every golden ruleset to `ipset restore` and `iptables-restore --test` /
//! `ip6tables-restore --test` inside a throwaway netns, proving the kernel tools accept them.

use std::path::PathBuf;

use netwarden_engine::testing::{
    interface, ip_block, netpol, pod_with_interfaces, pods_with, port, rule, selector, tcp,
};
use netwarden_engine::{
    Engine, EngineOptions, Mode, NetworkId, Peer, Pod, PodInterface, PodKey, PodRules, Policy,
    PolicyKind, PolicyPort, PolicyScope, Protocol,
};
use netwarden_render::iptables::{render_iptables, IptablesRuleset};
use netwarden_render::RenderOptions;
use netwarden_testing::{root_or_skip, ScratchNetns};

fn mk_pod(name: &str, app: &str, interfaces: Vec<PodInterface>) -> Pod {
    pod_with_interfaces("ns", name, &[("app", app)], interfaces)
}

/// A NetworkPolicy `ns/<name>` on `app=<target_app>`, isolating nothing yet.
fn mk_policy(name: &str, target_app: &str) -> Policy {
    netpol("ns", name, selector(&[("app", target_app)]), None, None)
}

fn pods_peer(app: &str) -> Peer {
    pods_with(&[("app", app)])
}

/// The standard cast: `ns/server` (app=web, the target), two clients and an outsider.
fn cast(dual_stack: bool) -> Vec<Pod> {
    let ips = |v4: &'static str, v6: &'static str| -> Vec<&'static str> {
        if dual_stack {
            vec![v4, v6]
        } else {
            vec![v4]
        }
    };
    vec![
        mk_pod(
            "server",
            "web",
            vec![interface(
                "eth0",
                NetworkId::Primary,
                &ips("10.0.0.10", "fd00::10"),
            )],
        ),
        mk_pod(
            "client-a",
            "client",
            vec![interface(
                "eth0",
                NetworkId::Primary,
                &ips("10.0.0.20", "fd00::20"),
            )],
        ),
        mk_pod(
            "client-b",
            "client",
            vec![interface(
                "eth0",
                NetworkId::Primary,
                &ips("10.0.0.21", "fd00::21"),
            )],
        ),
        mk_pod(
            "other",
            "other",
            vec![interface(
                "eth0",
                NetworkId::Primary,
                &ips("10.0.0.30", "fd00::30"),
            )],
        ),
    ]
}

fn server_rules(pods: Vec<Pod>, policies: Vec<Policy>) -> PodRules {
    let mut engine = Engine::new(EngineOptions::default());
    for p in pods {
        engine.set_pod(p);
    }
    for p in policies {
        engine.set_policy(p);
    }
    engine
        .pod_rules(&PodKey::new("ns", "server"))
        .expect("server exists")
}

struct Case {
    name: &'static str,
    rules: PodRules,
    opts: RenderOptions,
}

fn case(name: &'static str, pods: Vec<Pod>, policies: Vec<Policy>) -> Case {
    Case {
        name,
        rules: server_rules(pods, policies),
        opts: RenderOptions::default(),
    }
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();

    // A policy selecting someone else: the server is not isolated at all.
    let mut p = mk_policy("other-only", "other");
    p.ingress = Some(vec![]);
    out.push(case("open_pod", cast(false), vec![p]));

    let mut p = mk_policy("web-from-clients", "web");
    p.ingress = Some(vec![rule(
        vec![pods_peer("client")],
        vec![tcp(80), tcp(443)],
    )]);
    out.push(case("ingress_pod_peers_ports", cast(false), vec![p]));

    let mut p = mk_policy("egress-db", "web");
    p.egress = Some(vec![rule(
        vec![ip_block(
            "172.16.0.0/12",
            &["172.16.5.0/24", "172.20.0.1/32"],
        )],
        vec![tcp(5432)],
    )]);
    out.push(case("egress_ipblock_except", cast(false), vec![p]));

    let mut p = mk_policy("dual", "web");
    p.ingress = Some(vec![rule(vec![pods_peer("client")], vec![tcp(8080)])]);
    p.egress = Some(vec![rule(
        vec![ip_block("fd00::/64", &["fd00::30/128"])],
        vec![],
    )]);
    out.push(case("dual_stack", cast(true), vec![p]));

    let mut p = mk_policy("ranges", "web");
    p.ingress = Some(vec![rule(
        vec![],
        vec![
            port(Protocol::Tcp, Some(8000), Some(8080)),
            port(Protocol::Udp, Some(5000), Some(5100)),
            port(Protocol::Udp, Some(9000), None),
        ],
    )]);
    out.push(case("endport_ranges", cast(false), vec![p]));

    let mut p = mk_policy("sctp", "web");
    p.ingress = Some(vec![
        rule(
            vec![pods_peer("client")],
            vec![port(Protocol::Sctp, Some(3868), None)],
        ),
        rule(
            vec![pods_peer("other")],
            vec![port(Protocol::Sctp, None, None)],
        ),
    ]);
    out.push(case("sctp", cast(false), vec![p]));

    let mut p = mk_policy("many-ports", "web");
    let mut ports: Vec<PolicyPort> = (0..20).map(|i| tcp(7000 + 2 * i)).collect();
    ports.push(port(Protocol::Tcp, Some(9000), Some(9100)));
    p.ingress = Some(vec![rule(vec![pods_peer("client")], ports)]);
    out.push(case("more_than_15_ports", cast(false), vec![p]));

    let mut p = mk_policy("preview", "web");
    p.mode = Mode::Monitor;
    p.ingress = Some(vec![rule(vec![pods_peer("client")], vec![tcp(80)])]);
    out.push(case("monitor_only", cast(false), vec![p]));

    let mut enforced = mk_policy("current", "web");
    enforced.ingress = Some(vec![rule(
        vec![pods_peer("client"), pods_peer("other")],
        vec![tcp(80)],
    )]);
    let mut monitored = mk_policy("tighter", "web");
    monitored.mode = Mode::Monitor;
    monitored.replaces = Some("current".into());
    monitored.ingress = Some(vec![rule(vec![pods_peer("client")], vec![tcp(80)])]);
    out.push(case(
        "enforced_and_monitored",
        cast(false),
        vec![enforced, monitored],
    ));

    let mut p = mk_policy("logged", "web");
    p.log_denies = true;
    p.ingress = Some(vec![rule(vec![pods_peer("client")], vec![tcp(80)])]);
    p.egress = Some(vec![rule(vec![pods_peer("client")], vec![])]);
    out.push(case("log_denies", cast(false), vec![p]));

    // Egress, dual-stack: an enforced policy logging denies plus a monitored one: both marks,
    // the would-deny log before the accept and the deny log after it.
    let mut enforced = mk_policy("egress-logged", "web");
    enforced.log_denies = true;
    enforced.egress = Some(vec![rule(vec![pods_peer("client")], vec![tcp(5432)])]);
    let mut monitored = mk_policy("egress-preview", "web");
    monitored.mode = Mode::Monitor;
    monitored.egress = Some(vec![rule(
        vec![pods_peer("client")],
        vec![tcp(5432), tcp(6432)],
    )]);
    out.push(case(
        "monitor_with_log_denies",
        cast(true),
        vec![enforced, monitored],
    ));

    // Two interfaces; a NetworkPolicy isolates only the primary one: net1 passes untouched,
    // forwarding is rejected (on by default) ...
    let mut pods = cast(false);
    pods[0].interfaces.push(interface(
        "net1",
        NetworkId::nad("ns", "data"),
        &["192.168.1.10"],
    ));
    let mut p = mk_policy("primary-only", "web");
    p.ingress = Some(vec![rule(vec![pods_peer("client")], vec![])]);
    out.push(case("forward_rejection", pods.clone(), vec![p.clone()]));
    // ... unless switched off.
    let mut c = case("no_forward", pods, vec![p]);
    c.opts.reject_forward = false;
    out.push(c);

    // A DanmNetworkPolicy isolating egress implies outgoing DNS (SPEC 3.1), on every interface
    // it isolates; a NetworkPolicy never does (see egress_ipblock_except).
    let mut pods = cast(true);
    pods[0].interfaces.push(interface(
        "net1",
        NetworkId::nad("ns", "data"),
        &["192.168.1.10"],
    ));
    let mut p = mk_policy("danm-egress", "web");
    p.kind = PolicyKind::DanmNetworkPolicy;
    p.scope = PolicyScope::AllInterfaces;
    p.egress = Some(vec![rule(vec![pods_peer("client")], vec![tcp(443)])]);
    out.push(case("danm_egress_implies_dns", pods, vec![p]));

    // "Everything" blocks: hash:net takes no /0, so each is stored as two /1 halves.
    let mut p = mk_policy("everything", "web");
    p.ingress = Some(vec![rule(
        vec![ip_block("0.0.0.0/0", &[]), ip_block("::/0", &[])],
        vec![tcp(80)],
    )]);
    out.push(case("everything_blocks", cast(true), vec![p]));

    out
}

fn serialize(r: &IptablesRuleset) -> String {
    format!(
        "### ipset\n{}### v4\n{}### v6\n{}",
        r.ipset_script(),
        r.v4,
        r.v6
    )
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/iptables")
}

#[test]
fn golden_rulesets() {
    let bless = std::env::var_os("NETWARDEN_BLESS").is_some();
    let mut failures = Vec::new();
    for c in cases() {
        let got = serialize(&render_iptables(&c.rules, &c.opts).unwrap());
        let path = golden_dir().join(format!("{}.txt", c.name));
        if bless {
            std::fs::create_dir_all(golden_dir()).unwrap();
            std::fs::write(&path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run with NETWARDEN_BLESS=1)", path.display()));
        if got != want {
            failures.push(format!("--- {} ---\n{got}", c.name));
        }
    }
    assert!(
        failures.is_empty(),
        "rulesets differ from golden files:\n{}",
        failures.join("\n")
    );
}

#[test]
fn rendering_is_deterministic_and_sets_are_shared() {
    for c in cases() {
        let a = render_iptables(&c.rules, &c.opts).unwrap();
        let b = render_iptables(&c.rules.clone(), &c.opts).unwrap();
        assert_eq!(a, b, "{}", c.name);
        // Every referenced set is created by the script, and nothing else.
        let referenced: std::collections::BTreeSet<String> = [&a.v4, &a.v6]
            .iter()
            .flat_map(|t| t.split("--match-set ").skip(1))
            .map(|s| s.split_whitespace().next().unwrap().to_string())
            .collect();
        assert_eq!(referenced, a.set_names(), "{}", c.name);
    }
    // Two clients with the same peers on two ports share one set.
    let c = cases()
        .into_iter()
        .find(|c| c.name == "ingress_pod_peers_ports")
        .unwrap();
    assert_eq!(
        render_iptables(&c.rules, &c.opts)
            .unwrap()
            .set_names()
            .len(),
        1
    );
}

#[test]
fn golden_rulesets_accepted_by_iptables_restore() {
    if !root_or_skip() {
        return;
    }
    for c in cases() {
        let r = render_iptables(&c.rules, &c.opts).unwrap();
        // A fresh netns per case: each set name must be created by its own script.
        let ns = ScratchNetns::new("nwipt-golden").expect("root");
        let (ok, _, stderr) = ns.run("ipset", &["restore"], &r.ipset_script());
        assert!(ok, "{}: ipset restore: {stderr}", c.name);
        for (program, text) in [("iptables-restore", &r.v4), ("ip6tables-restore", &r.v6)] {
            let (ok, _, stderr) = ns.run(program, &["-w", "--test"], text);
            assert!(ok, "{}: {program} --test: {stderr}\n{text}", c.name);
        }
        // The script is idempotent: running it again over the live sets succeeds.
        let (ok, _, stderr) = ns.run("ipset", &["restore"], &r.ipset_script());
        assert!(ok, "{}: second ipset restore: {stderr}", c.name);
        let (_, listed, _) = ns.run("ipset", &["list", "-n"], "");
        let names: std::collections::BTreeSet<String> =
            listed.lines().map(str::to_string).collect();
        assert_eq!(names, r.set_names(), "{}: temporaries left behind", c.name);
    }
}
