//! `netwarden suggest` properties over random clusters (with random admin policies, SPEC 8)
//! and random observed traffic (issue 9, item 2; issue 23), for each of the three kinds:
//! 1. the YAML loads back through the manifest loader without a problem, into exactly the
//!    policies suggested (so it is valid, and the comments changed nothing);
//! 2. with those policies, every observed flow the Admin tier does not deny in the staged view
//!    is allowed in the staged view on every side a suggestion isolates, and keeps its verdict
//!    on a side no suggestion isolates (the suggestion is namespaced: it cannot change what the
//!    Admin tier decides, nor a side it leaves alone);
//! 3. every (pod, direction, network) that logged is isolated where the kind reaches it;
//! 4. least privilege: where the suggestion isolates, no namespaced rule allows a flow between
//!    two pods of workloads with no observed flow between them on that network, protocol and
//!    port, nor an address never seen;
//! 5. nothing the Admin tier decides is dropped silently: every observed flow it decides for
//!    some pod pair in some view is listed (in the YAML's header), and a flow it denies for
//!    every pair in both views, or a side it decides so, gets no rule.
//!
//! Workloads are computed here independently of the code under test: pods with the same
//! namespace, `app` and `tier` labels (the random `pod-template-hash` differs per pod).

use std::collections::BTreeSet;
use std::net::IpAddr;

use netwarden::inventory::engine_from;
use netwarden::suggest::{self, AdminTiers, End, Observations, Workloads};
use netwarden::synthetic::{namespace_json, pod_json};
use netwarden_engine::testing::*;
use netwarden_engine::*;
use netwarden_manifest::{Inventory, LoadOptions, Loader};
use netwarden_monitor::{Event, EventAction, Timestamp};
use proptest::prelude::*;

const PORTS: [(Protocol, u16); 4] = [
    (Protocol::Tcp, 80),
    (Protocol::Tcp, 5432),
    (Protocol::Udp, 5353),
    (Protocol::Sctp, 9000),
];
const KINDS: [PolicyKind; 3] = [
    PolicyKind::NetworkPolicy,
    PolicyKind::MultiNetworkPolicy,
    PolicyKind::DanmNetworkPolicy,
];
/// An address no flow uses: never allowed where a suggestion isolates.
const NEVER_SEEN: &str = "192.0.2.250";

#[derive(Debug, Clone)]
struct PodSpec {
    ns: usize,
    app: Option<usize>,
    tier: Option<usize>,
    hash: u8,
    v6: bool,
    net1: bool,
    /// Declares 80/TCP as `http` (replicas may disagree: then no named port).
    http: bool,
}

#[derive(Debug, Clone)]
struct FlowSpec {
    src: usize,
    dst: usize,
    external: u8,
    secondary: bool,
    port: usize,
    /// 0: logged by the source (egress), 1: by the destination (ingress), 2: both.
    logged: u8,
    time: i64,
}

/// One admin policy rule: action (0 Allow, 1 Deny, 2 Pass; Pass is Deny in the Baseline
/// tier), peer namespace (`None`: every namespace) and app, or (3) the external addresses'
/// CIDR; one port of [`PORTS`] or all.
#[derive(Debug, Clone)]
struct AdminRuleSpec {
    action: u8,
    peer_ns: Option<usize>,
    peer_app: Option<usize>,
    cidr: bool,
    port: Option<usize>,
}

#[derive(Debug, Clone)]
struct AdminSpec {
    baseline: bool,
    monitor: bool,
    /// `k8s.v1.cni.cncf.io/policy-for: ns0/net1` instead of the primary network.
    secondary: bool,
    priority: u32,
    subject_ns: Option<usize>,
    subject_app: Option<usize>,
    ingress: Vec<AdminRuleSpec>,
    egress: Vec<AdminRuleSpec>,
}

fn arb_admin_rule() -> impl Strategy<Value = AdminRuleSpec> {
    (
        0..3u8,
        prop::option::of(0..2usize),
        prop::option::weighted(0.3, 0..3usize),
        prop::bool::weighted(0.15),
        prop::option::of(0..PORTS.len()),
    )
        .prop_map(|(action, peer_ns, peer_app, cidr, port)| AdminRuleSpec {
            action,
            peer_ns,
            peer_app,
            cidr,
            port,
        })
}

fn arb_admin() -> impl Strategy<Value = AdminSpec> {
    (
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.2),
        0..4u32,
        prop::option::of(0..2usize),
        prop::option::weighted(0.3, 0..3usize),
        prop::collection::vec(arb_admin_rule(), 0..3),
        prop::collection::vec(arb_admin_rule(), 0..3),
    )
        .prop_map(
            |(baseline, monitor, secondary, priority, subject_ns, subject_app, ingress, egress)| {
                AdminSpec {
                    baseline,
                    monitor,
                    secondary,
                    priority,
                    subject_ns,
                    subject_app,
                    ingress,
                    egress,
                }
            },
        )
}

/// Pods of namespace `ns` (any when `None`) with `app` (any when `None`).
fn pods_selector(ns: Option<usize>, app: Option<usize>) -> PodsSelector {
    PodsSelector {
        namespaces: ns.map_or_else(LabelSelector::default, |n| {
            selector(&[("team", &format!("ns{n}"))])
        }),
        pods: app.map_or_else(LabelSelector::default, |a| {
            selector(&[("app", &format!("a{a}"))])
        }),
    }
}

fn build_admin(specs: &[AdminSpec]) -> Vec<AdminPolicy> {
    specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let rules = |list: &[AdminRuleSpec], egress: bool| -> Vec<AdminRule> {
                list.iter()
                    .enumerate()
                    .map(|(n, r)| AdminRule {
                        name: Some(format!("r{n}")),
                        action: match (r.action, s.baseline) {
                            (0, _) => AdminAction::Allow,
                            (1, _) | (_, true) => AdminAction::Deny,
                            _ => AdminAction::Pass,
                        },
                        // `networks` is an egress peer only.
                        peers: vec![if r.cidr && egress {
                            AdminPeer::Networks(vec!["192.0.2.0/24".parse().unwrap()])
                        } else {
                            AdminPeer::Pods(pods_selector(r.peer_ns, r.peer_app))
                        }],
                        ports: r.port.map(|p| {
                            let (protocol, port) = PORTS[p];
                            vec![AdminPort::Numbers(PortRange {
                                protocol,
                                ports: Some((port, port)),
                            })]
                        }),
                    })
                    .collect()
            };
            let (kind, tier, name) = match (s.baseline, i % 2) {
                (true, _) => (
                    AdminKind::ClusterNetworkPolicy,
                    Tier::Baseline,
                    format!("b{i}"),
                ),
                (false, 0) => (
                    AdminKind::ClusterNetworkPolicy,
                    Tier::Admin,
                    format!("a{i}"),
                ),
                (false, _) => (AdminKind::AdminNetworkPolicy, Tier::Admin, format!("a{i}")),
            };
            AdminPolicy {
                kind,
                name,
                tier,
                priority: s.priority,
                subject: pods_selector(s.subject_ns, s.subject_app),
                ingress: rules(&s.ingress, false),
                egress: rules(&s.egress, true),
                scope: if s.secondary {
                    PolicyScope::Networks(vec![net1()])
                } else {
                    PolicyScope::Primary
                },
                mode: if s.monitor {
                    Mode::Monitor
                } else {
                    Mode::Enforce
                },
                replaces: None,
                log_denies: false,
            }
        })
        .collect()
}

fn arb_pod() -> impl Strategy<Value = PodSpec> {
    (
        0..2usize,
        prop::option::of(0..3usize),
        prop::option::weighted(0.3, 0..2usize),
        any::<u8>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(ns, app, tier, hash, v6, net1, http)| PodSpec {
            ns,
            app,
            tier,
            hash,
            v6,
            net1,
            http,
        })
}

fn arb_flow() -> impl Strategy<Value = FlowSpec> {
    (
        0..16usize,
        0..16usize,
        0..6u8,
        any::<bool>(),
        0..PORTS.len(),
        0..3u8,
        0..1000i64,
    )
        .prop_map(
            |(src, dst, external, secondary, port, logged, time)| FlowSpec {
                src,
                dst,
                external,
                secondary,
                port,
                logged,
                time,
            },
        )
}

fn net1() -> NetworkId {
    NetworkId::nad("ns0", "net1")
}

fn build_pods(specs: &[PodSpec]) -> Vec<Pod> {
    specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let n = i + 1;
            let mut labels = vec![("pod-template-hash", format!("h{}", s.hash))];
            if let Some(a) = s.app {
                labels.push(("app", format!("a{a}")));
            }
            if let Some(t) = s.tier {
                labels.push(("tier", format!("t{t}")));
            }
            let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let v4 = format!("10.0.0.{n}");
            let v6 = format!("fd00::{n}");
            let ips: Vec<&str> = if s.v6 { vec![&v4, &v6] } else { vec![&v4] };
            let mut p = pod(&format!("ns{}", s.ns), &format!("w{i}"), &labels, &ips);
            if s.net1 {
                p = with_interface(p, "net1", net1(), &[&format!("192.168.0.{n}")]);
            }
            if s.http {
                p = with_port(p, "http", 80, Protocol::Tcp);
            }
            p
        })
        .collect()
}

/// A flow as the test sees it: concrete ends (pod or address), network, port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Concrete {
    src: Result<usize, IpAddr>,
    dst: Result<usize, IpAddr>,
    network: NetworkId,
    protocol: Protocol,
    port: u16,
}

fn address(pod: &Pod, network: &NetworkId) -> Option<IpAddr> {
    pod.interface_on(network).map(|i| i.ips[0])
}

/// Resolves the random flows against the pods; the events learn mode would log for them.
fn traffic(pods: &[Pod], specs: &[FlowSpec], secondary: &NetworkId) -> (Vec<Concrete>, Vec<Event>) {
    let mut flows = Vec::new();
    let mut events = Vec::new();
    for f in specs {
        let (src, dst) = (f.src % pods.len(), f.dst % pods.len());
        // 1: the source is outside, 2: the destination is; else both are pods.
        let (src, dst): (Result<usize, IpAddr>, Result<usize, IpAddr>) = match f.external {
            1 => (
                Err(format!("192.0.2.{}", f.src + 1).parse().unwrap()),
                Ok(dst),
            ),
            2 => (
                Ok(src),
                Err(format!("192.0.2.{}", f.dst + 101).parse().unwrap()),
            ),
            _ => (Ok(src), Ok(dst)),
        };
        let on_secondary = |e: &Result<usize, IpAddr>| {
            e.as_ref()
                .map_or(true, |&i| pods[i].interface_on(secondary).is_some())
        };
        let network = if f.secondary && on_secondary(&src) && on_secondary(&dst) {
            secondary.clone()
        } else {
            NetworkId::Primary
        };
        let ip = |e: &Result<usize, IpAddr>| match e {
            Ok(i) => address(&pods[*i], &network).unwrap(),
            Err(ip) => *ip,
        };
        let (src_ip, dst_ip) = (ip(&src), ip(&dst));
        let (protocol, port) = PORTS[f.port];
        let c = Concrete {
            src,
            dst,
            network: network.clone(),
            protocol,
            port,
        };
        let mut log = |at: usize, direction: Direction| {
            let p = &pods[at];
            events.push(Event {
                time: Timestamp::from_secs(1_700_000_000 + f.time),
                node: "n".into(),
                action: EventAction::Observed,
                direction,
                pod: p.key.to_string(),
                interface: p.interface_on(&network).unwrap().name.clone(),
                network: network.to_string(),
                peer: None,
                src: src_ip,
                dst: dst_ip,
                sport: Some(40000),
                dport: Some(port),
                protocol: protocol.as_str().into(),
                policies: vec![],
                enforced_policies: vec![],
                cause: None,
            });
        };
        if let Ok(s) = src {
            if f.logged != 1 || dst.is_err() {
                log(s, Direction::Egress);
            }
        }
        if let Ok(d) = dst {
            if f.logged != 0 || src.is_err() {
                log(d, Direction::Ingress);
            }
        }
        flows.push(c);
    }
    (flows, events)
}

/// The test's own workload key: namespace, app, tier.
fn workload(pods: &[Pod], i: usize) -> (String, Option<String>, Option<String>) {
    let p = &pods[i];
    (
        p.key.namespace.clone(),
        p.labels.get("app").cloned(),
        p.labels.get("tier").cloned(),
    )
}

/// A side of a concrete flow in the staged view of `rules`: (allowed, denied by the Admin
/// tier, isolated by a namespaced policy), from the engine's evaluation.
fn staged_side(
    direction: Direction,
    rules: &DirectionRules,
    peer: IpAddr,
    f: &Concrete,
    loopback: bool,
) -> (bool, bool, bool) {
    let admin_deny = !loopback
        && matches!(
            rules.decide(true, peer, f.protocol, f.port),
            Decision::Admin(r) if r.action == AdminAction::Deny
        );
    (
        side_allows(direction, rules, true, peer, f.protocol, f.port, loopback),
        admin_deny,
        rules.staged.is_isolated(),
    )
}

/// Whether the Admin tier decides a side of `f` in either view.
fn admin_decides(ends: &[(Direction, &DirectionRules, IpAddr)], f: &Concrete) -> bool {
    ends.iter().any(|(_, rules, peer)| {
        [false, true].into_iter().any(|staged| {
            matches!(
                rules.decide(staged, *peer, f.protocol, f.port),
                Decision::Admin(_)
            )
        })
    })
}

fn check(
    kind: PolicyKind,
    pods: &[Pod],
    admin: &[AdminPolicy],
    flows: &[Concrete],
    events: &[Event],
) -> Result<(), TestCaseError> {
    // The events as a stream, with a line that is no event in the middle.
    let mut lines: Vec<String> = events.iter().map(Event::to_json_line).collect();
    lines.insert(
        lines.len() / 2,
        "{\"record\": \"status\", \"node\": \"n\"}".into(),
    );
    let stream = lines.join("\n") + "\n";
    let workloads = Workloads::new(pods);
    let mut obs = Observations::default();
    obs.read(&workloads, "events", stream.as_bytes()).unwrap();
    prop_assert_eq!(obs.skipped.not_events, 1);
    prop_assert_eq!(obs.events, events.len() as u64);

    // The cluster the events were seen in: namespaces, pods and the admin policies.
    let cluster_loader = || {
        let mut loader = Loader::new(LoadOptions::default());
        for ns in ["ns0", "ns1"] {
            loader.add_value(
                "cluster.yaml",
                ns,
                &namespace_json(&Namespace {
                    name: ns.into(),
                    labels: [("team".to_owned(), ns.to_owned())].into_iter().collect(),
                    learn: false,
                }),
            );
        }
        for p in pods {
            loader.add_value("cluster.yaml", &p.key.to_string(), &pod_json(p));
        }
        loader
    };
    let cluster = Inventory {
        admin_policies: admin.to_vec(),
        ..cluster_loader().finish()
    };
    let tiers: AdminTiers =
        suggest::admin_tiers(&cluster, EngineOptions::default(), &workloads, &obs);
    let suggestion = suggest::suggest(&workloads, &obs, &tiers, kind);
    let yaml = suggest::yaml::render(&suggestion, &workloads, &obs);

    // 1. Loads back, exactly.
    let mut loader = cluster_loader();
    loader.add_str("suggested.yaml", &yaml);
    let mut inventory = loader.finish();
    prop_assert!(
        inventory.problems.is_empty(),
        "{:#?}\n{}",
        inventory.problems,
        yaml
    );
    let mut loaded = inventory.policies.clone();
    loaded.sort_by(|a, b| a.key.cmp(&b.key));
    let suggested: Vec<Policy> = suggestion
        .policies
        .iter()
        .map(|p| p.policy.clone())
        .collect();
    prop_assert_eq!(&loaded, &suggested, "{}", yaml);

    inventory.admin_policies = admin.to_vec();
    let mut engine = engine_from(&inventory, EngineOptions::default());
    let rules = engine.all_pod_rules();
    let before = engine_from(&cluster, EngineOptions::default()).all_pod_rules();
    let iface = |i: usize, network: &NetworkId| {
        rules[&pods[i].key]
            .interfaces
            .iter()
            .find(|f| &f.network == network)
            .unwrap()
    };
    let iface_before = |i: usize, network: &NetworkId| {
        before[&pods[i].key]
            .interfaces
            .iter()
            .find(|f| &f.network == network)
            .unwrap()
    };
    let end = |i: usize, network: &NetworkId| FlowEnd {
        pod: &pods[i].key,
        interface: iface(i, network),
        ip: address(&pods[i], network).unwrap(),
    };
    let ip_of = |e: &Result<usize, IpAddr>, network: &NetworkId| match e {
        Ok(i) => address(&pods[*i], network).unwrap(),
        Err(ip) => *ip,
    };

    // 2. Every observed flow the Admin tier does not deny is allowed where a suggestion
    //    isolates, and keeps its verdict elsewhere.
    for f in flows {
        let (src_ip, dst_ip) = (ip_of(&f.src, &f.network), ip_of(&f.dst, &f.network));
        let loopback = matches!((f.src, f.dst), (Ok(s), Ok(d)) if s == d);
        let mut sides = Vec::new();
        if let Ok(s) = f.src {
            sides.push((Direction::Egress, s, dst_ip));
        }
        if let Ok(d) = f.dst {
            sides.push((Direction::Ingress, d, src_ip));
        }
        let after: Vec<_> = sides
            .iter()
            .map(|(dir, i, peer)| {
                staged_side(
                    *dir,
                    iface(*i, &f.network).direction(*dir),
                    *peer,
                    f,
                    loopback,
                )
            })
            .collect();
        if after.iter().any(|(_, admin_deny, _)| *admin_deny) {
            continue;
        }
        for ((dir, i, peer), (allowed, _, isolated)) in sides.iter().zip(&after) {
            let context = || format!("{f:?}: {dir} of {}\n{yaml}", pods[*i].key);
            if *isolated {
                prop_assert!(
                    *allowed,
                    "denied where the suggestion isolates: {}",
                    context()
                );
            } else {
                let (was, _, _) = staged_side(
                    *dir,
                    iface_before(*i, &f.network).direction(*dir),
                    *peer,
                    f,
                    loopback,
                );
                prop_assert_eq!(*allowed, was, "verdict changed: {}", context());
            }
        }
        if let (Ok(s), Ok(d)) = (f.src, f.dst) {
            // The engine's whole verdict agrees on pod pairs.
            let v = flow_verdict(end(s, &f.network), end(d, &f.network), f.protocol, f.port);
            prop_assert_eq!(
                v.staged_allowed,
                after.iter().all(|a| a.0),
                "{:?}\n{}",
                f,
                yaml
            );
        }
    }

    // 5. What the Admin tier decides is listed, and gets no rule where it settles.
    let flow_of = |f: &Concrete| {
        let e = |x: &Result<usize, IpAddr>| match x {
            Ok(i) => End::Workload(workloads.of_pod(&pods[*i].key).unwrap()),
            Err(ip) => End::Address(*ip),
        };
        suggest::Flow {
            network: f.network.clone(),
            src: e(&f.src),
            dst: e(&f.dst),
            protocol: f.protocol,
            port: f.port,
        }
    };
    for f in flows {
        if matches!((f.src, f.dst), (Ok(s), Ok(d)) if s == d) {
            continue; // a pod to itself: no admin policy applies
        }
        let (src_ip, dst_ip) = (ip_of(&f.src, &f.network), ip_of(&f.dst, &f.network));
        let mut ends = Vec::new();
        if let Ok(s) = f.src {
            ends.push((
                Direction::Egress,
                iface(s, &f.network).direction(Direction::Egress),
                dst_ip,
            ));
        }
        if let Ok(d) = f.dst {
            ends.push((
                Direction::Ingress,
                iface(d, &f.network).direction(Direction::Ingress),
                src_ip,
            ));
        }
        if admin_decides(&ends, f) {
            let flow = flow_of(f);
            let listed = suggestion.admin.iter().find(|a| a.flow == flow);
            prop_assert!(
                listed.is_some(),
                "{:?} decided by the Admin tier, not listed\n{}",
                f,
                yaml
            );
            let seen = obs.flows[&flow];
            let line = format!(
                "#   {} - ",
                suggest::yaml::describe(&workloads, &flow, &seen)
            );
            prop_assert!(yaml.contains(&line), "{} missing\n{}", line, yaml);
        }
    }
    for a in &suggestion.admin {
        for p in &suggestion.policies {
            for (direction, evidence) in [
                (Direction::Ingress, &p.ingress_evidence),
                (Direction::Egress, &p.egress_evidence),
            ] {
                let used = evidence.iter().flatten().any(|(flow, _)| flow == &a.flow);
                prop_assert!(
                    !(used && (a.tiers.denied || a.tiers.settled.contains(&direction))),
                    "{:?} has a rule on {} that can never take effect\n{}",
                    a.flow,
                    direction,
                    yaml
                );
            }
        }
    }

    // 3. What logged is isolated where the kind reaches.
    for e in events {
        let i = pods
            .iter()
            .position(|p| p.key.to_string() == e.pod)
            .unwrap();
        let network = pods[i]
            .interfaces
            .iter()
            .find(|f| f.name == e.interface)
            .unwrap()
            .network
            .clone();
        let reaches = match kind {
            PolicyKind::NetworkPolicy => network.is_primary(),
            PolicyKind::MultiNetworkPolicy => !network.is_primary(),
            PolicyKind::DanmNetworkPolicy => true,
        };
        if reaches {
            let isolated = iface(i, &network)
                .direction(e.direction)
                .staged
                .is_isolated();
            prop_assert!(
                isolated,
                "{} {} on {} not isolated\n{}",
                e.pod,
                e.direction,
                network,
                yaml
            );
        }
    }

    // 4. Least privilege: no namespaced rule allows what was not observed (an admin rule
    //    may: that is the cluster's, not the suggestion's). A DanmNetworkPolicy peer on the
    //    primary network (no networkSelector) contributes all of the peer's interfaces.
    let observed: BTreeSet<_> = flows
        .iter()
        .filter_map(|f| {
            let (Ok(s), Ok(d)) = (f.src, f.dst) else {
                return None;
            };
            Some((
                workload(pods, s),
                workload(pods, d),
                f.network.clone(),
                f.protocol,
                f.port,
            ))
        })
        .collect();
    let seen = |s: usize, d: usize, network: &NetworkId, protocol: Protocol, port: u16| {
        let key = |n: &NetworkId| {
            (
                workload(pods, s),
                workload(pods, d),
                n.clone(),
                protocol,
                port,
            )
        };
        observed.contains(&key(network))
            || (kind == PolicyKind::DanmNetworkPolicy
                && observed.contains(&key(&NetworkId::Primary)))
    };
    let never: IpAddr = NEVER_SEEN.parse().unwrap();
    let networks: BTreeSet<NetworkId> = pods
        .iter()
        .flat_map(|p| p.interfaces.iter().map(|i| i.network.clone()))
        .collect();
    for network in networks {
        let members: Vec<usize> = (0..pods.len())
            .filter(|&i| address(&pods[i], &network).is_some())
            .collect();
        for &s in &members {
            for &d in &members {
                if s == d {
                    continue; // loopback is always allowed
                }
                for (protocol, port) in PORTS {
                    let v = flow_verdict(end(s, &network), end(d, &network), protocol, port);
                    if seen(s, d, &network, protocol, port) {
                        continue;
                    }
                    let by_rule = |side: &SideVerdict| {
                        side.isolated && side.allowed && side.tier_rule.is_none()
                    };
                    prop_assert!(
                        !by_rule(&v.ingress.staged),
                        "{} -> {} {}/{} on {}: allowed in by the suggestion but never observed\n{}",
                        pods[s].key,
                        pods[d].key,
                        port,
                        protocol,
                        network,
                        yaml
                    );
                    prop_assert!(
                        !by_rule(&v.egress.staged),
                        "{} -> {} {}/{} on {}: allowed out by the suggestion but never observed\n{}",
                        pods[s].key, pods[d].key, port, protocol, network, yaml
                    );
                }
            }
        }
        for &i in &members {
            for direction in [Direction::Ingress, Direction::Egress] {
                let r = &iface(i, &network).direction(direction).staged;
                prop_assert!(
                    !r.is_isolated() || !r.evaluate(never, Protocol::Tcp, 80).0,
                    "{} {} on {} allows an address never seen",
                    pods[i].key,
                    direction,
                    network
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn suggestions_allow_what_was_observed_and_little_else(
        pod_specs in prop::collection::vec(arb_pod(), 1..8),
        flow_specs in prop::collection::vec(arb_flow(), 0..16),
        admin_specs in prop::collection::vec(arb_admin(), 0..5),
    ) {
        let pods = build_pods(&pod_specs);
        let admin = build_admin(&admin_specs);
        let (flows, events) = traffic(&pods, &flow_specs, &net1());
        for kind in KINDS {
            check(kind, &pods, &admin, &flows, &events)?;
        }
    }
}

/// The examples' topology with hand-picked flows: the output names the flows, uses the named
/// port, a namespaceSelector across namespaces, and says what NetworkPolicy cannot express.
#[test]
fn examples_output_reads_as_intended() {
    let inventory = netwarden_manifest::load_paths(
        &[std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/multinet/pods.yaml")],
        &LoadOptions::default(),
    );
    let pods = inventory.pods.clone();
    let find = |name: &str| pods.iter().position(|p| p.key.name == name).unwrap();
    let (frontend, api, db) = (find("frontend"), find("api"), find("db"));
    let specs = [
        // frontend -> api 8080 (api names it http), both ends log.
        FlowSpec {
            src: frontend,
            dst: api,
            external: 0,
            secondary: false,
            port: 0,
            logged: 2,
            time: 0,
        },
        // api -> db 5432 on storage-net, logged by db.
        FlowSpec {
            src: api,
            dst: db,
            external: 0,
            secondary: true,
            port: 1,
            logged: 1,
            time: 5,
        },
    ];
    let (mut flows, mut events) = traffic(&pods, &specs, &NetworkId::nad("data", "storage-net"));
    // traffic() probes the fixed PORTS; the examples serve http on 8080.
    for e in &mut events {
        if e.dport == Some(80) {
            e.dport = Some(8080);
        }
    }
    flows[0].port = 8080;
    let workloads = Workloads::new(&pods);
    let mut obs = Observations::default();
    for e in &events {
        obs.add(&workloads, e);
    }
    let none = AdminTiers::default();
    let s = suggest::suggest(&workloads, &obs, &none, PolicyKind::NetworkPolicy);
    let yaml = suggest::yaml::render(&s, &workloads, &obs);
    assert!(yaml.contains("name: \"suggested-api\""), "{yaml}");
    assert!(yaml.contains("port: \"http\""), "{yaml}");
    assert!(yaml.contains("netwarden.io/mode: \"monitor\""), "{yaml}");
    assert!(
        yaml.contains("#   web/frontend -> web/api 8080/TCP on default: 2 seen"),
        "{yaml}"
    );
    assert!(
        yaml.contains("# Not expressible as NetworkPolicy (1 flow(s)"),
        "{yaml}"
    );
    let s = suggest::suggest(&workloads, &obs, &none, PolicyKind::MultiNetworkPolicy);
    let yaml = suggest::yaml::render(&s, &workloads, &obs);
    assert!(
        yaml.contains("k8s.v1.cni.cncf.io/policy-for: \"data/storage-net\""),
        "{yaml}"
    );
    assert!(
        yaml.contains("kubernetes.io/metadata.name: \"web\""),
        "{yaml}"
    );
    for kind in KINDS {
        check(kind, &pods, &[], &flows, &events).unwrap();
    }
}
