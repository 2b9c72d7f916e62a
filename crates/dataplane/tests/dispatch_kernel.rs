//! Dispatch by destination address against the real kernel, on both backends (nft and
//! iptables): real TCP connections through real rules in throwaway network namespaces
//! (issue 20, defect 3).
//!
//! ```text
//!   b (eth0 10.241.0.2, fd41::2) ──veth── (eth0 10.241.0.1, fd41::1) s (the isolated pod)
//!   c (eth0 10.242.0.2, fd42::2) ──veth── (net1 10.242.0.1, fd42::1) s
//!   added after the apply, unknown to netwarden:
//!   d (eth0 10.243.0.2)          ──veth── (net2 10.243.0.1)           s
//!   e (eth0 10.244.0.2)          ──veth── (net3, no address)          s   (10.245.0.1 on s's lo)
//! ```
//!
//! (a) `route_through_net1_*`: a NetworkPolicy isolates s's eth0 only. c, a peer on net1's
//! network, routes s's primary address through net1 (`ip route add 10.241.0.1/32 dev eth0` in
//! c): the packet arrives on the open net1, and must still be judged by eth0's policy.
//! (b) `new_interfaces_*`: a DanmNetworkPolicy isolates every interface; two interfaces appear
//! after the apply, one with an address and one without. Traffic on them is refused until
//! they are known; a packet for eth0's address arriving on one of them is judged by eth0's
//! policy. Every refusal is checked against a listener that accepts once the rules are gone.
//!
//! Namespaces are named with a unique per-process prefix and deleted on drop (their veths go
//! with them), also when an assertion fails. No packet leaves them.

use std::path::{Path, PathBuf};

use netwarden_dataplane::apply::{ApplyOutcome, Dataplane};
use netwarden_dataplane::iptables_apply::IptablesDataplane;
use netwarden_dataplane::NftDataplane;
use netwarden_engine::testing::{
    interface, ip_block, netpol, pod_with_interfaces, pods_with, policy, rule, selector, tcp,
};
use netwarden_engine::{Engine, EngineOptions, NetworkId, PodKey, PodRules, Policy, PolicyKind};
use netwarden_render::RenderOptions;
use netwarden_testing::{
    assert_connects, assert_refused_fast, ip, listen, mac_of, pin_neighbours, root_or_skip, veth,
    wait_reachable, Namespaces,
};

/// The namespaces (deleted on drop, even when a test fails) and their paths.
struct Topology {
    namespaces: Namespaces,
    s: PathBuf,
    b: PathBuf,
    c: PathBuf,
}

fn topology(tag: &str) -> Topology {
    let mut namespaces = Namespaces::new(&format!("nwdsp{tag}"));
    let (s, b, c) = (
        namespaces.create("s"),
        namespaces.create("b"),
        namespaces.create("c"),
    );
    veth(
        &s,
        "eth0",
        &["10.241.0.1/24", "fd41::1/64"],
        &b,
        "eth0",
        &["10.241.0.2/24", "fd41::2/64"],
    );
    veth(
        &s,
        "net1",
        &["10.242.0.1/24", "fd42::1/64"],
        &c,
        "eth0",
        &["10.242.0.2/24", "fd42::2/64"],
    );
    pin_neighbours(&s, "eth0", &b, "eth0");
    pin_neighbours(&s, "net1", &c, "eth0");
    Topology {
        namespaces,
        s,
        b,
        c,
    }
}

/// In `peer`: `addr` (s's, on some other interface) routed through `peer_if`, its neighbour
/// entry pinned to the MAC of s's `s_if` at the other end of that veth.
fn route_through(peer: &Path, peer_if: &str, s: &Path, s_if: &str, addr: &str) {
    let host = if addr.contains(':') {
        format!("{addr}/128")
    } else {
        format!("{addr}/32")
    };
    ip(peer, &["route", "replace", &host, "dev", peer_if]);
    let mac = mac_of(s, s_if);
    ip(
        peer,
        &[
            "neigh",
            "replace",
            addr,
            "lladdr",
            &mac,
            "dev",
            peer_if,
            "nud",
            "permanent",
        ],
    );
}

/// The server's rules with the interfaces netwarden knows (`known`: name, network, addresses)
/// under `policies`. b is `app=client`, c `app=other`.
fn server_rules(known: &[(&str, NetworkId, &[&str])], policies: &[Policy]) -> PodRules {
    let mut engine = Engine::new(EngineOptions::default());
    engine.set_pod(pod_with_interfaces(
        "ns",
        "server",
        &[("app", "web")],
        known
            .iter()
            .map(|(name, net, ips)| interface(name, net.clone(), ips))
            .collect(),
    ));
    engine.set_pod(pod_with_interfaces(
        "ns",
        "client-b",
        &[("app", "client")],
        vec![interface(
            "eth0",
            NetworkId::Primary,
            &["10.241.0.2", "fd41::2"],
        )],
    ));
    engine.set_pod(pod_with_interfaces(
        "ns",
        "client-c",
        &[("app", "other")],
        vec![interface(
            "eth0",
            NetworkId::Primary,
            &["10.242.0.2", "fd42::2"],
        )],
    ));
    for p in policies {
        engine.set_policy(p.clone());
    }
    engine.pod_rules(&PodKey::new("ns", "server")).unwrap()
}

fn eth0_net1() -> Vec<(&'static str, NetworkId, &'static [&'static str])> {
    vec![
        ("eth0", NetworkId::Primary, &["10.241.0.1", "fd41::1"]),
        (
            "net1",
            NetworkId::nad("ns", "data"),
            &["10.242.0.1", "fd42::1"],
        ),
    ]
}

fn apply<D: Dataplane>(dp: &mut D, ns: &Path, rules: &PodRules) {
    let ruleset = dp.render(rules).expect("renders");
    assert_eq!(dp.apply(ns, &ruleset).unwrap(), ApplyOutcome::Applied);
}

/// (a) A peer on net1's network reaching the primary address through net1 is judged by eth0's
/// policy: refused where eth0's policy refuses, allowed where it allows; net1's own traffic
/// stays open.
fn route_through_net1<D: Dataplane>(tag: &str, mut dp: D) {
    let t = topology(tag);
    let (s, b, c) = (&t.s, &t.b, &t.c);
    let _l = [
        listen(s, "10.241.0.1:8080"),
        listen(s, "10.241.0.1:9090"),
        listen(s, "[fd41::1]:8080"),
        listen(s, "[fd41::1]:9090"),
        listen(s, "10.242.0.1:9090"),
    ];
    route_through(c, "eth0", s, "net1", "10.241.0.1");
    route_through(c, "eth0", s, "net1", "fd41::1");
    // Without rules the route works: this is the path the policy must close.
    wait_reachable(c, "10.241.0.1:9090");
    wait_reachable(c, "[fd41::1]:9090");
    wait_reachable(b, "10.241.0.1:9090");

    // A NetworkPolicy: eth0 only; b and c are allowed on 8080.
    let mut np = netpol("ns", "np", selector(&[("app", "web")]), None, None);
    np.ingress = Some(vec![rule(
        vec![
            pods_with(&[("app", "client")]),
            pods_with(&[("app", "other")]),
        ],
        vec![tcp(8080)],
    )]);
    apply(&mut dp, s, &server_rules(&eth0_net1(), &[np]));

    assert_connects(b, "10.241.0.1:8080", "b on eth0, allowed");
    assert_refused_fast(b, "10.241.0.1:9090", "b on eth0, denied");
    for (addr, why) in [
        (
            "10.241.0.1:9090",
            "eth0's address routed in through net1 (v4)",
        ),
        (
            "[fd41::1]:9090",
            "eth0's address routed in through net1 (v6)",
        ),
    ] {
        assert_refused_fast(c, addr, why);
    }
    // Judged by eth0's policy, which allows c on 8080: not merely closed.
    assert_connects(
        c,
        "10.241.0.1:8080",
        "through net1, allowed by eth0's policy",
    );
    assert_connects(
        c,
        "[fd41::1]:8080",
        "through net1, allowed by eth0's policy",
    );
    // net1 itself is not isolated.
    assert_connects(c, "10.242.0.1:9090", "net1's own address, open");

    // Without the rules the same connections pass: the refusals above were the rules'.
    dp.remove(s).unwrap();
    assert_connects(c, "10.241.0.1:9090", "rules removed");
}

/// (b) Interfaces that appear after the apply are closed while the pod is isolated, with or
/// without an address; a packet for a known address arriving on one is judged by its owner.
fn new_interfaces<D: Dataplane>(tag: &str, mut dp: D) {
    let mut t = topology(tag);
    let (s, b) = (t.s.clone(), t.b.clone());
    // A DanmNetworkPolicy isolates every interface; it allows b, and the address blocks the
    // new interfaces' peers come from, on 8080: were net2/net3 known, d and e would pass.
    let mut danm = policy(
        PolicyKind::DanmNetworkPolicy,
        "ns",
        "danm",
        selector(&[("app", "web")]),
        None,
        None,
    );
    danm.ingress = Some(vec![rule(
        vec![
            pods_with(&[("app", "client")]),
            ip_block("10.243.0.0/24", &[]),
            ip_block("10.244.0.0/24", &[]),
        ],
        vec![tcp(8080)],
    )]);
    let _l0 = [listen(&s, "10.241.0.1:8080"), listen(&s, "10.241.0.1:9090")];
    wait_reachable(&b, "10.241.0.1:8080");
    apply(&mut dp, &s, &server_rules(&eth0_net1(), &[danm.clone()]));
    assert_connects(&b, "10.241.0.1:8080", "b allowed");

    // After the apply: net2 with an address ...
    let d = t.namespaces.create("d");
    veth(
        &s,
        "net2",
        &["10.243.0.1/24"],
        &d,
        "eth0",
        &["10.243.0.2/24"],
    );
    pin_neighbours(&s, "net2", &d, "eth0");
    // ... and net3 without one; s reaches e by a route, and holds 10.245.0.1 on lo (a local
    // address no interface netwarden knows owns).
    let e = t.namespaces.create("e");
    veth(&s, "net3", &[], &e, "eth0", &["10.244.0.2/24"]);
    ip(&s, &["route", "add", "10.244.0.2/32", "dev", "net3"]);
    ip(&s, &["addr", "add", "10.245.0.1/32", "dev", "lo"]);
    pin_neighbours(&s, "net3", &e, "eth0");
    route_through(&e, "eth0", &s, "net3", "10.245.0.1");
    route_through(&e, "eth0", &s, "net3", "10.241.0.1");
    let _l1 = [listen(&s, "10.243.0.1:8080"), listen(&s, "10.245.0.1:8080")];

    assert_refused_fast(&d, "10.243.0.1:8080", "unknown interface with an address");
    assert_refused_fast(
        &e,
        "10.245.0.1:8080",
        "unknown interface without an address",
    );
    // A known address through the unknown interface: eth0's policy decides.
    assert_refused_fast(
        &e,
        "10.241.0.1:9090",
        "eth0's address via net3, denied by eth0",
    );
    assert_connects(
        &e,
        "10.241.0.1:8080",
        "eth0's address via net3, allowed by eth0",
    );

    // Once net2 is known (the next sync), its own policy decides: d is allowed on 8080.
    let mut known = eth0_net1();
    known.push(("net2", NetworkId::nad("ns", "extra"), &["10.243.0.1"]));
    apply(&mut dp, &s, &server_rules(&known, &[danm]));
    assert_connects(&d, "10.243.0.1:8080", "net2 known, allowed by its policy");
    assert_refused_fast(&e, "10.245.0.1:8080", "net3 still unknown");

    // Without rules every path above connects: the refusals were the rules'.
    dp.remove(&s).unwrap();
    assert_connects(&e, "10.245.0.1:8080", "rules removed");
    assert_connects(&e, "10.241.0.1:9090", "rules removed");
}

#[test]
fn route_through_net1_is_judged_by_eth0_nft() {
    if !root_or_skip() {
        return;
    }
    route_through_net1("rn", NftDataplane::new(RenderOptions::default()));
}

#[test]
fn route_through_net1_is_judged_by_eth0_iptables() {
    if !root_or_skip() {
        return;
    }
    route_through_net1("ri", IptablesDataplane::new(RenderOptions::default()));
}

#[test]
fn new_interfaces_are_closed_nft() {
    if !root_or_skip() {
        return;
    }
    new_interfaces("nn", NftDataplane::new(RenderOptions::default()));
}

#[test]
fn new_interfaces_are_closed_iptables() {
    if !root_or_skip() {
        return;
    }
    new_interfaces("ni", IptablesDataplane::new(RenderOptions::default()));
}
