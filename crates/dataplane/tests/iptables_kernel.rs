//! The iptables backend against the real kernel: three throwaway network namespaces joined by
//! veth pairs, real TCP connections over IPv4 and IPv6.
//!
//! ```text
//!   client-b (eth0 10.231.0.2, fd31::2) ──veth── (eth0 10.231.0.1, fd31::1) server
//!   client-c (eth0 10.232.0.2)          ──veth── (net1 10.232.0.1)           server
//! ```
//!
//! Rules come from the engine (pods and policies built by hand) through the iptables renderer
//! and are applied with [`IptablesDataplane`] into the server's netns only.

use std::path::{Path, PathBuf};

use netwarden_dataplane::apply::{ApplyOutcome, Dataplane};
use netwarden_dataplane::iptables_apply::{
    iptables_variant, IptablesDataplane, IptablesRulesetRef,
};
use netwarden_engine::testing::{
    interface, pod_with_interfaces, pods_with, policy, rule, selector, tcp,
};
use netwarden_engine::{
    Engine, EngineOptions, Mode, NetworkId, PodKey, Policy, PolicyKind, PolicyRule,
};
use netwarden_render::RenderOptions;
use netwarden_testing::{
    assert_connects, assert_refused_fast, listen, pin_neighbours, root_or_skip, run_in, veth,
    Namespaces,
};

/// The three namespaces (deleted on drop, their veth ends with them, even when a test fails).
struct Topology {
    _namespaces: Namespaces,
    server: PathBuf,
    client_b: PathBuf,
    client_c: PathBuf,
}

fn topology(tag: &str) -> Topology {
    let mut namespaces = Namespaces::new(&format!("nwipt{tag}"));
    let (s, b, c) = (
        namespaces.create("s"),
        namespaces.create("b"),
        namespaces.create("c"),
    );
    // Both veth pairs are created inside the server netns with the peer end placed straight
    // into the client netns: the root namespace never holds a link.
    veth(
        &s,
        "eth0",
        &["10.231.0.1/24", "fd31::1/64"],
        &b,
        "eth0",
        &["10.231.0.2/24", "fd31::2/64"],
    );
    veth(
        &s,
        "net1",
        &["10.232.0.1/24"],
        &c,
        "eth0",
        &["10.232.0.2/24"],
    );
    pin_neighbours(&s, "eth0", &b, "eth0");
    pin_neighbours(&s, "net1", &c, "eth0");
    Topology {
        _namespaces: namespaces,
        server: s,
        client_b: b,
        client_c: c,
    }
}

/// A policy of `kind` on the server (`app=web`), isolating nothing yet.
fn web_policy(kind: PolicyKind, name: &str) -> Policy {
    policy(kind, "ns", name, selector(&[("app", "web")]), None, None)
}

/// Allows TCP `port` from the pods `app` in `apps`.
fn from(apps: &[&str], port: u16) -> PolicyRule {
    rule(
        apps.iter().map(|a| pods_with(&[("app", a)])).collect(),
        vec![tcp(port)],
    )
}

/// The server's rules under `policies`, rendered for the iptables backend.
fn server_ruleset(policies: Vec<Policy>) -> IptablesRulesetRef {
    let mut engine = Engine::new(EngineOptions::default());
    engine.set_pod(pod_with_interfaces(
        "ns",
        "server",
        &[("app", "web")],
        vec![
            interface("eth0", NetworkId::Primary, &["10.231.0.1", "fd31::1"]),
            interface("net1", NetworkId::nad("ns", "data"), &["10.232.0.1"]),
        ],
    ));
    engine.set_pod(pod_with_interfaces(
        "ns",
        "client-b",
        &[("app", "client")],
        vec![interface(
            "eth0",
            NetworkId::Primary,
            &["10.231.0.2", "fd31::2"],
        )],
    ));
    engine.set_pod(pod_with_interfaces(
        "ns",
        "client-c",
        &[("app", "other")],
        vec![interface("eth0", NetworkId::Primary, &["10.232.0.2"])],
    ));
    for p in policies {
        engine.set_policy(p);
    }
    let rules = engine.pod_rules(&PodKey::new("ns", "server")).unwrap();
    IptablesDataplane::new(RenderOptions::default())
        .render(&rules)
        .unwrap()
}

fn our_sets(ns: &Path) -> Vec<String> {
    let out = run_in(ns, "ipset", &["list", "-n"]);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|n| netwarden_render::iptables::is_owned_set(n))
        .map(str::to_string)
        .collect()
}

#[test]
fn iptables_backend_enforces_updates_and_removes() {
    if !root_or_skip() {
        return;
    }
    eprintln!("iptables variant: {:?}", iptables_variant().unwrap());
    let topo = topology("e2e");
    let (s, b, c) = (
        topo.server.clone(),
        topo.client_b.clone(),
        topo.client_c.clone(),
    );
    let _l = [
        listen(&s, "10.231.0.1:8080"),
        listen(&s, "10.231.0.1:9090"),
        listen(&s, "10.232.0.1:8080"),
        listen(&s, "10.232.0.1:9090"),
        listen(&s, "[fd31::1]:8080"),
        listen(&s, "[fd31::1]:9090"),
        listen(&b, "10.231.0.2:7070"),
    ];
    let mut dp = IptablesDataplane::new(RenderOptions::default());

    // Before any rule: everything connects.
    assert_connects(&b, "10.231.0.1:9090", "before any rule");

    // 1. DanmNetworkPolicy isolating every interface: only app=client on 8080.
    let mut danm = web_policy(PolicyKind::DanmNetworkPolicy, "danm");
    danm.ingress = Some(vec![from(&["client"], 8080)]);
    let first = server_ruleset(vec![danm.clone()]);
    assert_eq!(dp.apply(&s, &first).unwrap(), ApplyOutcome::Applied);
    assert_connects(&b, "10.231.0.1:8080", "step 1");
    assert_refused_fast(&b, "10.231.0.1:9090", "step 1");
    assert_connects(&b, "[fd31::1]:8080", "step 1");
    assert_refused_fast(&b, "[fd31::1]:9090", "step 1");
    assert_refused_fast(&c, "10.232.0.1:8080", "step 1");
    let sets_before = our_sets(&s);
    assert_eq!(sets_before.len(), 2, "one set per family: {sets_before:?}");
    let read = dp.read_back(&s).unwrap().expect("rules present");
    assert!(
        read.contains(":DANM_INGRESS_V4") && read.contains(":DANM_INGRESS_V6"),
        "{read}"
    );
    assert!(read.contains("-A INPUT -j DANM_INGRESS_V4"), "{read}");

    // 2. Identical re-apply: nothing sent.
    assert_eq!(dp.apply(&s, &first).unwrap(), ApplyOutcome::Unchanged);

    // 3. Peers change: client-c is now allowed too. New set, old one destroyed.
    danm.ingress = Some(vec![from(&["client", "other"], 8080)]);
    assert_eq!(
        dp.apply(&s, &server_ruleset(vec![danm])).unwrap(),
        ApplyOutcome::Applied
    );
    assert_connects(&c, "10.232.0.1:8080", "step 3");
    assert_refused_fast(&c, "10.232.0.1:9090", "step 3");
    assert_connects(&b, "10.231.0.1:8080", "step 3");
    let sets_after = our_sets(&s);
    assert_eq!(sets_after.len(), 2, "{sets_after:?}");
    assert_ne!(sets_before, sets_after, "the v4 set was replaced");
    assert!(sets_after.contains(
        &sets_before
            .iter()
            .find(|n| n.starts_with("nw6-"))
            .unwrap()
            .clone()
    ));

    // 4. A NetworkPolicy isolates the primary interface only: net1 passes untouched; egress
    //    isolated with no rule: the server's own connections are refused fast (RST in OUTPUT).
    let mut np = web_policy(PolicyKind::NetworkPolicy, "np");
    np.ingress = Some(vec![from(&["client"], 8080)]);
    np.egress = Some(vec![]);
    assert_eq!(
        dp.apply(&s, &server_ruleset(vec![np])).unwrap(),
        ApplyOutcome::Applied
    );
    assert_connects(&c, "10.232.0.1:9090", "step 4");
    assert_refused_fast(&b, "10.231.0.1:9090", "step 4");
    assert_connects(&b, "10.231.0.1:8080", "step 4");
    assert_refused_fast(&s, "10.231.0.2:7070", "step 4");

    // 5. Monitor only: nothing is blocked, the would-deny log rule sees the new connection.
    let mut mon = web_policy(PolicyKind::NetworkPolicy, "preview");
    mon.mode = Mode::Monitor;
    mon.ingress = Some(vec![from(&["client"], 8080)]);
    assert_eq!(
        dp.apply(&s, &server_ruleset(vec![mon])).unwrap(),
        ApplyOutcome::Applied
    );
    assert_connects(&b, "10.231.0.1:9090", "step 5");
    let counters = run_in(&s, "iptables-save", &["-c", "-t", "filter"]);
    assert!(counters.status.success(), "{counters:?}");
    let counters = String::from_utf8_lossy(&counters.stdout);
    let nflog = counters
        .lines()
        .find(|l| l.contains("NFLOG") && l.contains("nw:wd:"))
        .expect(&counters);
    assert!(
        !nflog.starts_with("[0:"),
        "would-deny rule matched: {nflog}"
    );

    // 6. The pod is no longer selected: the empty ruleset is a removal.
    let open = server_ruleset(vec![]);
    assert!(open.is_none());
    assert_eq!(dp.apply(&s, &open).unwrap(), ApplyOutcome::Removed);
    assert_eq!(dp.read_back(&s).unwrap(), None);
    assert!(our_sets(&s).is_empty());
    assert_connects(&b, "10.231.0.1:9090", "step 6");
    assert_connects(&s, "10.231.0.2:7070", "step 6");

    // 7. remove() is idempotent, and succeeds for a netns that is gone.
    dp.remove(&s).unwrap();
    dp.remove(Path::new("/run/netns/nwipt-does-not-exist"))
        .unwrap();
}

#[test]
fn failed_restore_keeps_old_rules_and_forces_full_resync() {
    if !root_or_skip() {
        return;
    }
    let topo = topology("fail");
    let (s, b) = (topo.server.clone(), topo.client_b.clone());
    let _l = [listen(&s, "10.231.0.1:8080"), listen(&s, "10.231.0.1:9090")];
    let mut dp = IptablesDataplane::new(RenderOptions::default());
    let mut danm = web_policy(PolicyKind::DanmNetworkPolicy, "danm");
    danm.ingress = Some(vec![from(&["client"], 8080)]);
    let good = server_ruleset(vec![danm]);
    assert_eq!(dp.apply(&s, &good).unwrap(), ApplyOutcome::Applied);

    // A v4 text the kernel refuses: the restore fails as a whole, the old table stays.
    let mut bad = (*good.clone().unwrap()).clone();
    bad.v4 = format!(
        "{}-A NO_SUCH_CHAIN -j ACCEPT\nCOMMIT\n",
        bad.v4.trim_end_matches("COMMIT\n")
    );
    assert!(dp.apply(&s, &Some(std::sync::Arc::new(bad))).is_err());
    assert_connects(
        &b,
        "10.231.0.1:8080",
        "a failed restore keeps the old rules",
    );
    assert_refused_fast(
        &b,
        "10.231.0.1:9090",
        "a failed restore keeps the old rules",
    );
    // The failure forgot the netns: the good ruleset is sent again in full.
    assert_eq!(dp.apply(&s, &good).unwrap(), ApplyOutcome::Applied);
    assert_eq!(dp.apply(&s, &good).unwrap(), ApplyOutcome::Unchanged);
    dp.remove(&s).unwrap();
    assert_eq!(dp.read_back(&s).unwrap(), None);
}
