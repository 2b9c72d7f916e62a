//! Engine semantics, table-driven: objects in, verdicts out (SPEC section 3 and 4).

use netwarden_engine::testing::*;
use netwarden_engine::*;

/// Allowed (enforced, staged) for `from → to` on `network`, first address of `family_v6`.
fn verdict(
    engine: &mut Engine,
    from: &str,
    to: &str,
    network: &NetworkId,
    port: u16,
    protocol: Protocol,
    v6: bool,
) -> (bool, bool) {
    let all = engine.all_pod_rules();
    let key = |s: &str| {
        let (ns, name) = s.split_once('/').unwrap();
        PodKey::new(ns, name)
    };
    let (fk, tk) = (key(from), key(to));
    let src = all[&fk]
        .interfaces
        .iter()
        .find(|i| &i.network == network)
        .expect("src iface");
    let dst = all[&tk]
        .interfaces
        .iter()
        .find(|i| &i.network == network)
        .expect("dst iface");
    let pick = |ips: &[std::net::IpAddr]| {
        *ips.iter()
            .find(|ip| ip.is_ipv6() == v6)
            .expect("address of family")
    };
    let v = flow_verdict(
        FlowEnd {
            pod: &fk,
            interface: src,
            ip: pick(&src.ips),
        },
        FlowEnd {
            pod: &tk,
            interface: dst,
            ip: pick(&dst.ips),
        },
        protocol,
        port,
    );
    (v.allowed, v.staged_allowed)
}

fn allowed(engine: &mut Engine, from: &str, to: &str, port: u16) -> bool {
    verdict(
        engine,
        from,
        to,
        &NetworkId::Primary,
        port,
        Protocol::Tcp,
        false,
    )
    .0
}

fn base() -> Engine {
    base_with(EngineOptions::default())
}

fn base_with(options: EngineOptions) -> Engine {
    let mut e = Engine::new(options);
    e.set_namespace(namespace("x", &[("ns", "x")]));
    e.set_namespace(namespace("y", &[("ns", "y")]));
    e.set_pod(pod("x", "a", &[("pod", "a")], &["10.0.0.1", "fd00::1"]));
    e.set_pod(pod("x", "b", &[("pod", "b")], &["10.0.0.2", "fd00::2"]));
    e.set_pod(pod("y", "a", &[("pod", "a")], &["10.0.1.1", "fd00::101"]));
    e
}

#[test]
fn no_policy_allows_everything() {
    let mut e = base();
    assert!(allowed(&mut e, "x/a", "x/b", 80));
    assert!(allowed(&mut e, "y/a", "x/b", 80));
}

#[test]
fn default_deny_ingress_keeps_loopback() {
    let mut e = base();
    e.set_policy(netpol("x", "deny", selector(&[]), Some(vec![]), None));
    assert!(!allowed(&mut e, "x/a", "x/b", 80));
    assert!(!allowed(&mut e, "y/a", "x/b", 80));
    assert!(
        allowed(&mut e, "x/b", "x/b", 80),
        "a pod always reaches itself"
    );
    assert!(allowed(&mut e, "x/b", "y/a", 80), "egress not isolated");
}

#[test]
fn pod_and_namespace_selectors_and_vs_or() {
    let mut e = base();
    // One peer with both selectors: pods labelled a in namespaces labelled y (AND).
    e.set_policy(netpol(
        "x",
        "and",
        selector(&[("pod", "b")]),
        Some(vec![rule(
            vec![pods_peer(
                Some(selector(&[("pod", "a")])),
                Some(selector(&[("ns", "y")])),
            )],
            vec![],
        )]),
        None,
    ));
    assert!(allowed(&mut e, "y/a", "x/b", 80));
    assert!(!allowed(&mut e, "x/a", "x/b", 80));
    // Two peers: either (OR).
    e.set_policy(netpol(
        "x",
        "and",
        selector(&[("pod", "b")]),
        Some(vec![rule(
            vec![
                pods_peer(Some(selector(&[("pod", "a")])), None),
                pods_peer(None, Some(selector(&[("ns", "y")]))),
            ],
            vec![],
        )]),
        None,
    ));
    assert!(allowed(&mut e, "y/a", "x/b", 80));
    assert!(allowed(&mut e, "x/a", "x/b", 80));
}

#[test]
fn match_expressions() {
    let mut e = base();
    let sel = LabelSelector {
        match_labels: Default::default(),
        match_expressions: vec![Requirement {
            key: "pod".into(),
            operator: Operator::NotIn,
            values: vec!["a".into()],
        }],
    };
    e.set_policy(netpol(
        "x",
        "p",
        selector(&[("pod", "a")]),
        Some(vec![rule(vec![pods_peer(Some(sel), None)], vec![])]),
        None,
    ));
    assert!(allowed(&mut e, "x/b", "x/a", 80));
    assert!(
        !allowed(&mut e, "y/a", "x/a", 80),
        "podSelector alone is the policy's namespace only"
    );
}

#[test]
fn ports_and_end_port() {
    let mut e = base();
    let range = PolicyPort {
        protocol: Protocol::Tcp,
        port: Some(PortRef::Number(80)),
        end_port: Some(82),
    };
    e.set_policy(netpol(
        "x",
        "p",
        selector(&[("pod", "b")]),
        Some(vec![rule(vec![], vec![range])]),
        None,
    ));
    assert!(allowed(&mut e, "x/a", "x/b", 80));
    assert!(allowed(&mut e, "x/a", "x/b", 82));
    assert!(!allowed(&mut e, "x/a", "x/b", 83));
    assert!(
        !verdict(
            &mut e,
            "x/a",
            "x/b",
            &NetworkId::Primary,
            80,
            Protocol::Udp,
            false
        )
        .0,
        "TCP rule does not allow UDP"
    );
    assert!(
        !verdict(
            &mut e,
            "x/a",
            "x/b",
            &NetworkId::Primary,
            80,
            Protocol::Sctp,
            false
        )
        .0,
        "nor SCTP"
    );
}

#[test]
fn named_ports_resolve_per_destination() {
    let mut e = base();
    e.set_pod(with_port(
        pod("x", "b", &[("pod", "b")], &["10.0.0.2"]),
        "http",
        8080,
        Protocol::Tcp,
    ));
    e.set_pod(with_port(
        pod("y", "a", &[("pod", "a")], &["10.0.1.1"]),
        "http",
        9090,
        Protocol::Tcp,
    ));
    // Ingress on x/b: named port resolves on x/b itself.
    e.set_policy(netpol(
        "x",
        "in",
        selector(&[("pod", "b")]),
        Some(vec![rule(vec![], vec![named(Protocol::Tcp, "http")])]),
        None,
    ));
    assert!(allowed(&mut e, "x/a", "x/b", 8080));
    assert!(!allowed(&mut e, "x/a", "x/b", 9090));
    // A named port with the wrong protocol resolves to nothing.
    e.set_policy(netpol(
        "x",
        "in",
        selector(&[("pod", "b")]),
        Some(vec![rule(vec![], vec![named(Protocol::Udp, "http")])]),
        None,
    ));
    assert!(!allowed(&mut e, "x/a", "x/b", 8080));
    // Egress from x/a: resolves on each destination pod.
    e.remove_policy(&PolicyRef {
        kind: PolicyKind::NetworkPolicy,
        key: ObjectKey::new("x", "in"),
    });
    e.set_policy(netpol(
        "x",
        "out",
        selector(&[("pod", "a")]),
        None,
        Some(vec![rule(vec![], vec![named(Protocol::Tcp, "http")])]),
    ));
    assert!(allowed(&mut e, "x/a", "x/b", 8080));
    assert!(!allowed(&mut e, "x/a", "x/b", 9090));
    assert!(allowed(&mut e, "x/a", "y/a", 9090));
    assert!(!allowed(&mut e, "x/a", "y/a", 8080));
}

#[test]
fn ip_block_with_except_matches_pod_addresses() {
    let mut e = base();
    e.set_policy(netpol(
        "x",
        "p",
        selector(&[("pod", "b")]),
        Some(vec![rule(
            vec![ip_block("10.0.0.0/16", &["10.0.1.0/24"])],
            vec![],
        )]),
        None,
    ));
    assert!(allowed(&mut e, "x/a", "x/b", 80));
    assert!(!allowed(&mut e, "y/a", "x/b", 80));
    // IPv6 is not in the block.
    assert!(
        !verdict(
            &mut e,
            "x/a",
            "x/b",
            &NetworkId::Primary,
            80,
            Protocol::Tcp,
            true
        )
        .0
    );
}

#[test]
fn egress_needs_both_sides() {
    let mut e = base();
    e.set_policy(netpol(
        "x",
        "eg",
        selector(&[("pod", "a")]),
        None,
        Some(vec![rule(
            vec![pods_peer(None, Some(selector(&[("ns", "y")])))],
            vec![],
        )]),
    ));
    assert!(allowed(&mut e, "x/a", "y/a", 80));
    assert!(!allowed(&mut e, "x/a", "x/b", 80));
    e.set_policy(netpol("y", "deny", selector(&[]), Some(vec![]), None));
    assert!(
        !allowed(&mut e, "x/a", "y/a", 80),
        "destination ingress denies"
    );
    assert!(allowed(&mut e, "x/a", "x/a", 80));
}

/// SPEC 3.1: outgoing DNS is implied only where a DanmNetworkPolicy isolates egress (seed 004's
/// rule); NetworkPolicy and MultiNetworkPolicy keep the exact Kubernetes semantics. `--dns=all`
/// implies it for every egress isolation, `--dns=none` never.
#[test]
fn dns_is_implied_only_by_danm_egress_isolation() {
    let udp53 = |e: &mut Engine, staged: bool| {
        let v = verdict(
            e,
            "x/a",
            "y/a",
            &NetworkId::Primary,
            53,
            Protocol::Udp,
            false,
        );
        if staged {
            v.1
        } else {
            v.0
        }
    };
    let deny_egress = |kind: PolicyKind, name: &str| {
        let mut p = policy(
            kind,
            "x",
            name,
            selector(&[("pod", "a")]),
            None,
            Some(vec![]),
        );
        if kind == PolicyKind::MultiNetworkPolicy {
            p.scope = PolicyScope::Networks(vec![NetworkId::Primary]);
        }
        p
    };
    for (mode, kind, expected) in [
        (DnsMode::Danm, PolicyKind::NetworkPolicy, false),
        (DnsMode::Danm, PolicyKind::MultiNetworkPolicy, false),
        (DnsMode::Danm, PolicyKind::DanmNetworkPolicy, true),
        (DnsMode::All, PolicyKind::NetworkPolicy, true),
        (DnsMode::All, PolicyKind::DanmNetworkPolicy, true),
        (DnsMode::None, PolicyKind::DanmNetworkPolicy, false),
        (DnsMode::None, PolicyKind::NetworkPolicy, false),
    ] {
        let mut e = base_with(EngineOptions {
            dns: mode,
            ..Default::default()
        });
        e.set_policy(deny_egress(kind, "eg"));
        assert_eq!(udp53(&mut e, false), expected, "{mode:?} {kind:?} UDP");
        assert_eq!(
            allowed(&mut e, "x/a", "y/a", 53),
            expected,
            "{mode:?} {kind:?} TCP"
        );
        assert!(!allowed(&mut e, "x/a", "y/a", 80), "{mode:?} {kind:?} 80");
    }
    // Additive across kinds: a DanmNetworkPolicy beside a NetworkPolicy implies DNS.
    let mut e = base();
    e.set_policy(deny_egress(PolicyKind::NetworkPolicy, "np"));
    assert!(!udp53(&mut e, false));
    e.set_policy(deny_egress(PolicyKind::DanmNetworkPolicy, "danm"));
    assert!(udp53(&mut e, false));
    // Per view: an enforced NetworkPolicy denies DNS; a monitored DanmNetworkPolicy implies it
    // in the staged view only (monitoring never changes enforcement).
    let mut e = base();
    e.set_policy(deny_egress(PolicyKind::NetworkPolicy, "np"));
    let mut monitored = deny_egress(PolicyKind::DanmNetworkPolicy, "danm");
    monitored.mode = Mode::Monitor;
    e.set_policy(monitored);
    assert!(!udp53(&mut e, false));
    assert!(udp53(&mut e, true));
    // And the reverse: an enforced Danm policy implies DNS, a monitored one replacing it with a
    // NetworkPolicy would not (a would-deny).
    let mut e = base();
    e.set_policy(deny_egress(PolicyKind::DanmNetworkPolicy, "danm"));
    let mut np = deny_egress(PolicyKind::NetworkPolicy, "np");
    np.mode = Mode::Monitor;
    np.replaces = Some("danm".into());
    e.set_policy(np);
    assert!(udp53(&mut e, false));
    assert!(!udp53(&mut e, true));
    // Ingress is never opened by the DNS allowance.
    let mut e = base();
    let mut ingress = policy(
        PolicyKind::DanmNetworkPolicy,
        "y",
        "in",
        selector(&[]),
        Some(vec![]),
        None,
    );
    ingress.scope = PolicyScope::AllInterfaces;
    e.set_policy(ingress);
    assert!(!udp53(&mut e, false));
}

fn multinet() -> (Engine, NetworkId, NetworkId) {
    let mut e = Engine::new(EngineOptions::default());
    let net1 = NetworkId::nad("x", "net1");
    let net2 = NetworkId::nad("x", "net2");
    e.set_namespace(namespace("x", &[]));
    e.set_namespace(namespace("y", &[]));
    e.set_pod(with_interface(
        pod("x", "a", &[("app", "a")], &["10.0.0.1"]),
        "net1",
        net1.clone(),
        &["192.168.1.1", "fd01::1"],
    ));
    e.set_pod(with_interface(
        with_interface(
            pod("x", "b", &[("app", "b")], &["10.0.0.2"]),
            "net1",
            net1.clone(),
            &["192.168.1.2", "fd01::2"],
        ),
        "net2",
        net2.clone(),
        &["192.168.2.2"],
    ));
    e.set_pod(with_interface(
        pod("y", "c", &[("app", "c")], &["10.0.1.3"]),
        "net2",
        net2.clone(),
        &["192.168.2.3"],
    ));
    (e, net1, net2)
}

#[test]
fn multi_network_policy_isolates_only_its_networks() {
    let (mut e, net1, net2) = multinet();
    let mut p = policy(
        PolicyKind::MultiNetworkPolicy,
        "x",
        "m",
        selector(&[("app", "b")]),
        Some(vec![]),
        None,
    );
    p.scope = PolicyScope::Networks(vec![net1.clone()]);
    e.set_policy(p);
    assert!(!verdict(&mut e, "x/a", "x/b", &net1, 80, Protocol::Tcp, false).0);
    assert!(!verdict(&mut e, "x/a", "x/b", &net1, 80, Protocol::Tcp, true).0);
    assert!(
        verdict(
            &mut e,
            "x/a",
            "x/b",
            &NetworkId::Primary,
            80,
            Protocol::Tcp,
            false
        )
        .0
    );
    assert!(verdict(&mut e, "y/c", "x/b", &net2, 80, Protocol::Tcp, false).0);
}

#[test]
fn multi_network_peers_contribute_only_their_policy_for_addresses() {
    let (mut e, net1, _) = multinet();
    let mut p = policy(
        PolicyKind::MultiNetworkPolicy,
        "x",
        "m",
        selector(&[("app", "b")]),
        Some(vec![rule(
            vec![pods_peer(Some(selector(&[("app", "a")])), None)],
            vec![],
        )]),
        None,
    );
    p.scope = PolicyScope::Networks(vec![net1.clone()]);
    e.set_policy(p);
    assert!(verdict(&mut e, "x/a", "x/b", &net1, 80, Protocol::Tcp, false).0);
    let rules = e.pod_rules(&PodKey::new("x", "b")).unwrap();
    let iface = rules.interface("net1").unwrap();
    let Isolation::Isolated(allow) = &iface.ingress.enforced else {
        panic!("isolated")
    };
    let PeerMatch::Addrs(set) = &allow[0].clauses[0].peers else {
        panic!("addrs")
    };
    assert!(set.contains("192.168.1.1".parse().unwrap()));
    assert!(
        !set.contains("10.0.0.1".parse().unwrap()),
        "primary address of the peer is not on net1"
    );
}

#[test]
fn danm_policy_isolates_all_interfaces_and_network_selector_narrows_peers() {
    let (mut e, net1, net2) = multinet();
    e.set_policy(policy(
        PolicyKind::DanmNetworkPolicy,
        "x",
        "d",
        selector(&[("app", "b")]),
        Some(vec![]),
        None,
    ));
    for net in [&NetworkId::Primary, &net1] {
        assert!(!verdict(&mut e, "x/a", "x/b", net, 80, Protocol::Tcp, false).0);
    }
    assert!(!verdict(&mut e, "y/c", "x/b", &net2, 80, Protocol::Tcp, false).0);
    // networkSelector alone: interfaces on x/net1 of pods in the policy's namespace.
    let net_sel = vec![NetworkSelectorEntry {
        kind: NetworkType::NetworkAttachmentDefinition,
        namespace: Some("x".into()),
        name: "net1".into(),
    }];
    e.set_policy(policy(
        PolicyKind::DanmNetworkPolicy,
        "x",
        "d",
        selector(&[("app", "b")]),
        Some(vec![rule(
            vec![Peer::Pods {
                pod_selector: None,
                namespace_selector: None,
                network_selector: Some(net_sel),
            }],
            vec![],
        )]),
        None,
    ));
    assert!(verdict(&mut e, "x/a", "x/b", &net1, 80, Protocol::Tcp, false).0);
    assert!(
        !verdict(
            &mut e,
            "x/a",
            "x/b",
            &NetworkId::Primary,
            80,
            Protocol::Tcp,
            false
        )
        .0,
        "a's primary address is not selected"
    );
}

#[test]
fn kinds_stack_additively() {
    let (mut e, net1, _) = multinet();
    e.set_policy(netpol(
        "x",
        "np",
        selector(&[("app", "b")]),
        Some(vec![]),
        None,
    ));
    let mut m = policy(
        PolicyKind::MultiNetworkPolicy,
        "x",
        "m",
        selector(&[("app", "b")]),
        Some(vec![rule(
            vec![pods_peer(Some(selector(&[("app", "a")])), None)],
            vec![tcp(80)],
        )]),
        None,
    );
    m.scope = PolicyScope::Networks(vec![net1.clone()]);
    e.set_policy(m);
    e.set_policy(policy(
        PolicyKind::DanmNetworkPolicy,
        "x",
        "d",
        selector(&[("app", "b")]),
        Some(vec![rule(
            vec![pods_peer(Some(selector(&[("app", "a")])), None)],
            vec![tcp(81)],
        )]),
        None,
    ));
    assert!(verdict(&mut e, "x/a", "x/b", &net1, 80, Protocol::Tcp, false).0);
    assert!(verdict(&mut e, "x/a", "x/b", &net1, 81, Protocol::Tcp, false).0);
    assert!(!verdict(&mut e, "x/a", "x/b", &net1, 82, Protocol::Tcp, false).0);
    assert!(
        verdict(
            &mut e,
            "x/a",
            "x/b",
            &NetworkId::Primary,
            81,
            Protocol::Tcp,
            false
        )
        .0
    );
    assert!(
        !verdict(
            &mut e,
            "x/a",
            "x/b",
            &NetworkId::Primary,
            80,
            Protocol::Tcp,
            false
        )
        .0
    );
}

#[test]
fn monitor_mode_never_changes_enforcement() {
    let mut e = base();
    let mut m = netpol("x", "mon", selector(&[("pod", "b")]), Some(vec![]), None);
    m.mode = Mode::Monitor;
    e.set_policy(m);
    let (a, s) = verdict(
        &mut e,
        "x/a",
        "x/b",
        &NetworkId::Primary,
        80,
        Protocol::Tcp,
        false,
    );
    assert!(a && !s, "monitored deny-all: traffic flows, staged denies");
    // With an enforced allow-from-a beside it: enforcement unchanged, staged = union.
    e.set_policy(netpol(
        "x",
        "enf",
        selector(&[("pod", "b")]),
        Some(vec![rule(
            vec![pods_peer(Some(selector(&[("pod", "a")])), None)],
            vec![],
        )]),
        None,
    ));
    assert_eq!(
        verdict(
            &mut e,
            "x/a",
            "x/b",
            &NetworkId::Primary,
            80,
            Protocol::Tcp,
            false
        ),
        (true, true)
    );
    assert_eq!(
        verdict(
            &mut e,
            "y/a",
            "x/b",
            &NetworkId::Primary,
            80,
            Protocol::Tcp,
            false
        ),
        (false, false)
    );
}

#[test]
fn replaces_removes_the_enforced_policy_from_the_staged_view() {
    let mut e = base();
    e.set_policy(netpol(
        "x",
        "old",
        selector(&[("pod", "b")]),
        Some(vec![rule(
            vec![pods_peer(None, Some(selector(&[])))],
            vec![],
        )]),
        None,
    ));
    let mut new = netpol(
        "x",
        "new",
        selector(&[("pod", "b")]),
        Some(vec![rule(
            vec![pods_peer(Some(selector(&[("pod", "a")])), None)],
            vec![],
        )]),
        None,
    );
    new.mode = Mode::Monitor;
    new.replaces = Some("old".into());
    e.set_policy(new);
    assert_eq!(
        verdict(
            &mut e,
            "x/a",
            "x/b",
            &NetworkId::Primary,
            80,
            Protocol::Tcp,
            false
        ),
        (true, true)
    );
    assert_eq!(
        verdict(
            &mut e,
            "y/a",
            "x/b",
            &NetworkId::Primary,
            80,
            Protocol::Tcp,
            false
        ),
        (true, false)
    );
    let rules = e.pod_rules(&PodKey::new("x", "b")).unwrap();
    assert_eq!(
        rules.interfaces[0].ingress.staged_cause(),
        StagedCause::ReplacedAllow
    );
}

#[test]
fn host_network_pods_are_never_isolated() {
    let mut e = base();
    let mut hn = pod("x", "h", &[("pod", "h")], &["172.16.0.1"]);
    hn.host_network = true;
    e.set_pod(hn);
    e.set_policy(netpol(
        "x",
        "deny",
        selector(&[]),
        Some(vec![]),
        Some(vec![]),
    ));
    let rules = e.pod_rules(&PodKey::new("x", "h")).unwrap();
    assert!(!rules.is_isolated());
}

#[test]
fn services_vips_follow_allowed_endpoints() {
    let mut e = base();
    e.set_pod(with_port(
        pod("y", "a", &[("pod", "a")], &["10.0.1.1"]),
        "web",
        8080,
        Protocol::Tcp,
    ));
    e.set_service(Service {
        key: ObjectKey::new("y", "svc"),
        cluster_ips: vec!["10.96.0.10".parse().unwrap()],
        selector: Some(labels(&[("pod", "a")])),
        endpoint_addrs: vec![],
        ports: vec![ServicePort {
            protocol: Protocol::Tcp,
            port: 80,
            target: PortRef::Named("web".into()),
        }],
    });
    e.set_policy(netpol(
        "x",
        "eg",
        selector(&[("pod", "a")]),
        None,
        Some(vec![rule(
            vec![pods_peer(None, Some(selector(&[("ns", "y")])))],
            vec![tcp(8080)],
        )]),
    ));
    let rules = e.pod_rules(&PodKey::new("x", "a")).unwrap();
    let vip: std::net::IpAddr = "10.96.0.10".parse().unwrap();
    let (ok, _) = rules.interfaces[0]
        .egress
        .enforced
        .evaluate(vip, Protocol::Tcp, 80);
    assert!(ok, "ClusterIP:80 allowed because endpoint y/a:8080 is");
    let (ok, _) = rules.interfaces[0]
        .egress
        .enforced
        .evaluate(vip, Protocol::Tcp, 81);
    assert!(!ok);
}

#[test]
fn endpoint_slice_vips_follow_the_pod_behind_the_address() {
    // Found by the engine fuzz target: a Service without selector (EndpointSlice addresses)
    // whose target port is named resolves it on the pod holding the endpoint address, but
    // only pods a Service *selects* dropped the cached egress rules, so the VIP stayed allowed
    // (or stayed denied) after that pod changed.
    let vip: std::net::IpAddr = "10.96.0.10".parse().unwrap();
    let vip_allowed = |e: &mut Engine| {
        let rules = e.pod_rules(&PodKey::new("x", "a")).unwrap();
        rules.interfaces[0]
            .egress
            .enforced
            .evaluate(vip, Protocol::Tcp, 80)
            .0
    };
    let mut e = base();
    e.set_service(Service {
        key: ObjectKey::new("y", "svc"),
        cluster_ips: vec![vip],
        selector: None,
        endpoint_addrs: vec!["10.0.1.1".parse().unwrap()],
        ports: vec![ServicePort {
            protocol: Protocol::Tcp,
            port: 80,
            target: PortRef::Named("web".into()),
        }],
    });
    e.set_policy(netpol(
        "x",
        "eg",
        selector(&[("pod", "a")]),
        None,
        Some(vec![rule(vec![], vec![tcp(8080)])]),
    ));
    // y/a (10.0.1.1) declares no port "web" yet: nothing to resolve the target on.
    assert!(!vip_allowed(&mut e));
    let with_web = with_port(
        pod("y", "a", &[("pod", "a")], &["10.0.1.1", "fd00::101"]),
        "web",
        8080,
        Protocol::Tcp,
    );
    e.set_pod(with_web.clone());
    assert!(vip_allowed(&mut e), "the endpoint now serves web on 8080");
    e.remove_pod(&PodKey::new("y", "a"));
    assert!(!vip_allowed(&mut e), "no pod behind the address any more");
    e.set_pod(with_web);
    assert!(vip_allowed(&mut e));
}

#[test]
fn incremental_recompute_touches_only_affected_pods() {
    let mut e = base();
    e.set_pod(pod("y", "z", &[("pod", "z")], &["10.0.1.9"]));
    e.set_policy(netpol(
        "x",
        "p",
        selector(&[("pod", "b")]),
        Some(vec![rule(
            vec![pods_peer(
                Some(selector(&[("role", "client")])),
                Some(selector(&[])),
            )],
            vec![],
        )]),
        None,
    ));
    e.all_pod_rules();
    assert!(e.take_dirty().is_empty());
    // A label nobody selects on: only the pod itself.
    e.set_pod(pod("y", "z", &[("pod", "z"), ("tier", "x")], &["10.0.1.9"]));
    assert_eq!(
        e.take_dirty().into_iter().collect::<Vec<_>>(),
        vec![PodKey::new("y", "z")]
    );
    // Becoming a peer: the policy's targets too.
    e.set_pod(pod(
        "y",
        "z",
        &[("pod", "z"), ("role", "client")],
        &["10.0.1.9"],
    ));
    let dirty = e.take_dirty();
    assert!(dirty.contains(&PodKey::new("x", "b")) && dirty.contains(&PodKey::new("y", "z")));
    assert!(!dirty.contains(&PodKey::new("x", "a")));
    assert!(allowed(&mut e, "y/z", "x/b", 80));
}

/// The ingress peers `web` allows on its primary interface, as the kernel gets them.
fn web_ingress_allows(engine: &mut Engine, addr: &str) -> bool {
    let rules = engine.pod_rules(&PodKey::new("ns", "web")).unwrap();
    let iface = rules.interfaces.iter().find(|i| i.name == "eth0").unwrap();
    iface
        .ingress
        .enforced
        .evaluate(addr.parse().unwrap(), Protocol::Tcp, 80)
        .0
}

/// Issue 20, defect 2: a DanmEp lent `cli` another pod's (`db`'s) address; `db` then passed
/// where only `cli` may. An address two pods claim is kept out of every allow set until only
/// one claims it — computed incrementally as a fresh engine computes it.
#[test]
fn an_address_two_pods_claim_is_in_no_allow_set() {
    let mut engine = Engine::new(EngineOptions::default());
    engine.set_pod(pod("ns", "web", &[("app", "web")], &["10.0.0.1"]));
    engine.set_pod(pod("ns", "cli", &[("app", "cli")], &["10.0.0.2"]));
    engine.set_pod(pod("ns", "db", &[("app", "db")], &["10.0.0.3"]));
    // A DanmNetworkPolicy peer contributes all of its pods' addresses.
    engine.set_policy(policy(
        PolicyKind::DanmNetworkPolicy,
        "ns",
        "web-in",
        selector(&[("app", "web")]),
        Some(vec![rule(vec![pods_with(&[("app", "cli")])], vec![])]),
        None,
    ));
    assert!(web_ingress_allows(&mut engine, "10.0.0.2"));
    assert!(!web_ingress_allows(&mut engine, "10.0.0.3"));
    engine.take_dirty();
    // cli claims db's address too, on a secondary interface.
    let lent = with_interface(
        pod("ns", "cli", &[("app", "cli")], &["10.0.0.2"]),
        "net5",
        NetworkId::Named {
            kind: NetworkType::DanmNet,
            namespace: Some("ns".into()),
            name: "n5".into(),
        },
        &["10.0.0.3"],
    );
    engine.set_pod(lent.clone());
    assert!(engine.is_ambiguous("10.0.0.3".parse().unwrap()));
    assert!(engine.pod_at("10.0.0.3".parse().unwrap()).is_none());
    assert!(engine.take_dirty().contains(&PodKey::new("ns", "web")));
    assert!(
        !web_ingress_allows(&mut engine, "10.0.0.3"),
        "db must not pass as cli"
    );
    assert!(
        web_ingress_allows(&mut engine, "10.0.0.2"),
        "cli's own address still passes"
    );
    // The same objects, fresh.
    let mut fresh = Engine::new(EngineOptions::default());
    for p in engine.pods() {
        fresh.set_pod(p.clone());
    }
    for p in engine.policies() {
        fresh.set_policy(p.clone());
    }
    assert_eq!(fresh.all_pod_rules(), engine.all_pod_rules());
    // db goes: the address has one claimant again, and it is cli's.
    engine.remove_pod(&PodKey::new("ns", "db"));
    assert!(!engine.is_ambiguous("10.0.0.3".parse().unwrap()));
    assert!(web_ingress_allows(&mut engine, "10.0.0.3"));
    // hostNetwork pods share the node's address by design: never ambiguous.
    let mut h1 = pod("ns", "h1", &[], &["192.168.0.1"]);
    h1.host_network = true;
    let mut h2 = h1.clone();
    h2.key = PodKey::new("ns", "h2");
    engine.set_pod(h1);
    engine.set_pod(h2);
    assert!(!engine.is_ambiguous("192.168.0.1".parse().unwrap()));
}

/// A locked-down pod isolates every interface both ways, allowing nothing, whatever its
/// policies allow; lifting it gives its own rules back.
#[test]
fn a_locked_down_pod_allows_nothing() {
    let mut engine = Engine::new(EngineOptions::default());
    let web = with_interface(
        pod("ns", "web", &[("app", "web")], &["10.0.0.1"]),
        "net1",
        NetworkId::nad("ns", "n1"),
        &["10.1.0.1"],
    );
    engine.set_pod(web);
    let key = PodKey::new("ns", "web");
    let open = engine.pod_rules(&key).unwrap();
    assert!(!open.needs_rules());
    engine.take_dirty();
    engine.set_lockdown(&key, Some("two pods claim its netns".into()));
    assert_eq!(engine.take_dirty(), [key.clone()].into());
    let locked = engine.pod_rules(&key).unwrap();
    assert_eq!(locked.interfaces.len(), 2);
    for iface in &locked.interfaces {
        for d in [&iface.ingress, &iface.egress] {
            assert!(d.enforced.is_isolated() && d.enforced.rules().is_empty());
            assert_eq!(d.staged, d.enforced);
        }
    }
    engine.set_lockdown(&key, Some("two pods claim its netns".into()));
    assert!(
        engine.take_dirty().is_empty(),
        "the same reason again changes nothing"
    );
    engine.set_lockdown(&key, None);
    assert_eq!(engine.pod_rules(&key).unwrap(), open);
}
