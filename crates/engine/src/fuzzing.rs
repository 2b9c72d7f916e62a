//! Fuzzing support: a small cluster and a history of changes decoded from arbitrary bytes, and
//! the invariants the engine keeps on it. [`check_engine`] serves the libFuzzer target
//! (`fuzz/fuzz_targets/engine.rs`) and the CI test (`tests/fuzz_engine.rs`).
//!
//! The invariants:
//! - nothing panics;
//! - **verdicts follow the specification**: every verdict [`flow_verdict`] gives from the
//!   computed rules, enforced and staged, for every pair of pod addresses and for addresses
//!   outside the cluster, Service virtual IPs and Node addresses, equals a reference evaluation
//!   written straight from SPEC sections 3, 4 and 8 over the objects (`Reference`: Admin tier,
//!   namespaced tier, Baseline tier, allow), which shares nothing with the engine's resolution
//!   but the model's predicates (label and network selector matching, the named-port lookup):
//!   no [`AddrSet`], no cache, no peer sets, no tier lists;
//! - **incremental equals fresh**: an engine fed the initial objects and then the changes one
//!   by one, recomputing only the pods [`Engine::take_dirty`] names, holds after every change
//!   the same rules as an engine fed the objects of that moment at once, in another order
//!   (changes include Services created, edited and deleted, EndpointSlice addresses moving
//!   between pods, pods with named ports behind Services, pod changes only the pod itself can
//!   see, and admin policies and Nodes created, edited — rules, subject, priority, mode — and
//!   deleted, between the others: what the engine's admin caches in `engine/tiers.rs` must
//!   follow);
//! - **feeding is idempotent**: setting every object again as it is marks no pod dirty;
//! - the computed rules are well-formed (a direction is isolated exactly when a policy isolates
//!   it; the staged view equals the enforced one when no policy is monitored or replaced;
//!   implicit DNS only on egress and only in an isolated view; the Admin and Baseline tiers
//!   empty where no admin policy applies, holding every rule of those that do in evaluation
//!   order, and equal in both views where none of them is monitored or replaced);
//! - [`AddrSet`] algebra ([`check_addr_sets`]): union and intersection idempotent, commutative
//!   and associative, differences exact, membership equal to a naive walk over the blocks, CIDR
//!   decomposition exact and disjoint.
//!
//! The universe is kept small (three namespaces, a handful of label values, four networks, a
//! few addresses per pod, admin priorities from a short list, Node addresses that pods hold
//! too) so that random bytes make selectors, names, priorities and addresses collide.
//!
//! Inputs decode in the order the fields were added: the admin policies, Nodes and their
//! changes last, so that the committed seeds (found before them) decode as they did.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
// Reading past the end gives zeros: every input decodes, and a short one to a small cluster.
use netwarden_fuzzbytes::Bytes;

use crate::addrset::AddrSet;
use crate::admin::{
    AdminAction, AdminKind, AdminPeer, AdminPolicy, AdminPort, AdminRef, AdminRule, Node,
    PodsSelector, Tier,
};
use crate::engine::{DnsMode, Engine, EngineOptions};
use crate::model::*;
use crate::rules::{DirectionRules, Isolation, PodRules, PortRange, TierRules};
use crate::verdict::{flow_verdict, FlowEnd};

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const APPS: [&str; 3] = ["a", "b", "c"];
const TEAMS: [&str; 2] = ["red", "blue"];
const NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// The most pods and policies a scenario holds (the checks are quadratic in the addresses).
const MAX_PODS: usize = 5;
const MAX_POLICIES: usize = 4;
/// The address every hostNetwork pod has (they share the node's).
const NODE_IP: Ipv4Addr = Ipv4Addr::new(172, 18, 0, 1);

fn networks() -> [NetworkId; 4] {
    let named = |kind, namespace: Option<&str>, name: &str| NetworkId::Named {
        kind,
        namespace: namespace.map(str::to_string),
        name: name.to_string(),
    };
    [
        NetworkId::nad("x", "net1"),
        NetworkId::nad("y", "net2"),
        // DANM networks: a DanmNet lives in the pod's namespace (filled in per pod).
        named(NetworkType::DanmNet, Some("x"), "d1"),
        named(NetworkType::ClusterNetwork, None, "c1"),
    ]
}

/// A namespace for a pod or a policy: mostly `x`, so that policies select pods.
fn namespace_name(b: &mut Bytes) -> &'static str {
    const WEIGHTED: [&str; 4] = ["x", "x", "y", "z"];
    WEIGHTED[b.below(WEIGHTED.len())]
}

fn selector(b: &mut Bytes, key: &str, values: &[&str]) -> LabelSelector {
    let value = |b: &mut Bytes| b.pick(values).to_string();
    let mut sel = LabelSelector::default();
    match b.below(6) {
        0 => {}
        1 | 2 => {
            sel.match_labels.insert(key.into(), value(b));
        }
        _ => {
            let operator = *b.pick(&[
                Operator::In,
                Operator::NotIn,
                Operator::Exists,
                Operator::DoesNotExist,
            ]);
            let values = match operator {
                Operator::In | Operator::NotIn => (0..1 + b.below(2)).map(|_| value(b)).collect(),
                Operator::Exists | Operator::DoesNotExist => Vec::new(),
            };
            let key = if b.one_in(3) { "tier" } else { key };
            sel.match_expressions.push(Requirement {
                key: key.into(),
                operator,
                values,
            });
        }
    }
    sel
}

fn namespace_selector(b: &mut Bytes) -> LabelSelector {
    if b.one_in(3) {
        let mut sel = LabelSelector::default();
        sel.match_labels
            .insert(NAME_LABEL.into(), b.pick(&NAMESPACES).to_string());
        sel
    } else {
        selector(b, "team", &TEAMS)
    }
}

fn namespace(b: &mut Bytes, name: &str) -> Namespace {
    let mut labels = Labels::new();
    // Kubernetes labels every namespace with its name; a manifest may lack it.
    if !b.one_in(4) {
        labels.insert(NAME_LABEL.into(), name.into());
    }
    if !b.one_in(3) {
        labels.insert("team".into(), b.pick(&TEAMS).to_string());
    }
    Namespace {
        name: name.into(),
        labels,
        learn: false,
    }
}

/// Pod number `index` in namespace `ns` (its addresses derive from the number, so that they
/// stay unique per pod on the primary network; secondary networks may reuse addresses, as
/// separate networks do).
fn pod(b: &mut Bytes, index: usize, ns: &str) -> Pod {
    let mut labels = Labels::new();
    if !b.one_in(4) {
        labels.insert("app".into(), b.pick(&APPS).to_string());
    }
    if b.one_in(2) {
        labels.insert("tier".into(), "front".into());
    }
    let host_network = b.one_in(8);
    let n = index as u8 + 1;
    let mut interfaces = Vec::new();
    if host_network {
        interfaces.push(PodInterface {
            name: "eth0".into(),
            network: NetworkId::Primary,
            ips: vec![IpAddr::V4(NODE_IP)],
            prefix_lens: vec![16],
        });
    } else {
        // A pod without a primary interface is rare (DANM-only pods).
        if !b.one_in(8) {
            let mut ips = Vec::new();
            let family = b.below(4);
            if family != 3 {
                ips.push(IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)));
            }
            if family >= 2 {
                ips.push(IpAddr::V6(Ipv6Addr::new(
                    0xfd00,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    n.into(),
                )));
            }
            interfaces.push(PodInterface {
                name: "eth0".into(),
                network: NetworkId::Primary,
                prefix_lens: ips
                    .iter()
                    .map(|ip| if ip.is_ipv4() { 24 } else { 64 })
                    .collect(),
                ips,
            });
        }
        if b.one_in(2) {
            let mut network = b.pick(&networks()).clone();
            if let NetworkId::Named {
                kind: NetworkType::DanmNet,
                namespace,
                ..
            } = &mut network
            {
                *namespace = Some(ns.to_string());
            }
            let host = if b.one_in(3) { 1 } else { n };
            let ip = if b.one_in(4) {
                IpAddr::V6(Ipv6Addr::new(0xfd01, 0, 0, 0, 0, 0, 0, host.into()))
            } else {
                IpAddr::V4(Ipv4Addr::new(192, 168, 0, host))
            };
            interfaces.push(PodInterface {
                name: "net1".into(),
                network,
                ips: vec![ip],
                prefix_lens: vec![if ip.is_ipv4() { 24 } else { 64 }],
            });
        }
    }
    let mut container_ports = Vec::new();
    for _ in 0..b.below(3) {
        let (name, protocol, port) = *b.pick(&[
            ("http", Protocol::Tcp, 80),
            ("http", Protocol::Tcp, 81),
            ("http", Protocol::Udp, 8080),
            ("dns", Protocol::Udp, 53),
            ("dns", Protocol::Tcp, 53),
        ]);
        container_ports.push(ContainerPort {
            name: Some(name.into()),
            port,
            protocol,
        });
    }
    Pod {
        key: PodKey::new(ns, format!("pod{index}")),
        labels,
        host_network,
        container_ports,
        interfaces,
        netns: None,
        node_name: None,
        uid: None,
        learn: false,
    }
}

fn ip_block(b: &mut Bytes) -> IpBlock {
    let net = |s: &str| s.parse::<IpNet>().expect("fuzzing CIDR");
    const BLOCKS: &[(&str, &[&str])] = &[
        ("10.0.0.0/24", &["10.0.0.2/32"]),
        ("10.0.0.0/31", &[]),
        ("10.0.0.0/8", &["10.0.0.0/30", "10.96.0.0/16"]),
        ("192.168.0.0/16", &[]),
        ("192.168.0.0/24", &["192.168.0.1/32", "fd01::/64"]),
        ("fd00::/64", &["fd00::1/128"]),
        ("0.0.0.0/0", &[]),
        ("::/0", &["fd00::/16"]),
        ("172.18.0.0/16", &[]),
        ("10.96.0.0/12", &[]),
        ("203.0.113.0/24", &["203.0.113.0/25"]),
    ];
    let (cidr, except) = *b.pick(BLOCKS);
    IpBlock {
        cidr: net(cidr),
        except: except.iter().map(|e| net(e)).collect(),
    }
}

fn peer(b: &mut Bytes, kind: PolicyKind) -> Peer {
    if b.one_in(3) {
        return Peer::IpBlock(ip_block(b));
    }
    let pod_selector = (!b.one_in(3)).then(|| selector(b, "app", &APPS));
    let namespace_selector = b.one_in(2).then(|| namespace_selector(b));
    let network_selector = (kind == PolicyKind::DanmNetworkPolicy && b.one_in(2)).then(|| {
        (0..1 + b.below(2))
            .map(|_| {
                let (kind, namespace, name) = *b.pick(&[
                    (NetworkType::NetworkAttachmentDefinition, Some("x"), "net1"),
                    (NetworkType::NetworkAttachmentDefinition, Some("y"), "net2"),
                    (NetworkType::DanmNet, None, "d1"),
                    (NetworkType::ClusterNetwork, None, "c1"),
                    (NetworkType::TenantNetwork, None, "d1"),
                ]);
                NetworkSelectorEntry {
                    kind,
                    namespace: namespace.map(str::to_string),
                    name: name.into(),
                }
            })
            .collect()
    });
    if pod_selector.is_none() && namespace_selector.is_none() && network_selector.is_none() {
        // An empty peer is refused at the edge; this one is "every pod of the namespace".
        return Peer::Pods {
            pod_selector: Some(LabelSelector::default()),
            namespace_selector: None,
            network_selector: None,
        };
    }
    Peer::Pods {
        pod_selector,
        namespace_selector,
        network_selector,
    }
}

fn policy_port(b: &mut Bytes) -> PolicyPort {
    let protocol = *b.pick(&Protocol::ALL);
    match b.below(5) {
        0 => PolicyPort {
            protocol,
            port: None,
            end_port: None,
        },
        1 => PolicyPort {
            protocol,
            port: Some(PortRef::Number(80)),
            end_port: Some(81),
        },
        2 => PolicyPort {
            protocol,
            port: Some(PortRef::Named(b.pick(&["http", "dns"]).to_string())),
            end_port: None,
        },
        _ => PolicyPort {
            protocol,
            port: Some(PortRef::Number(*b.pick(&[53, 80, 81, 8080]))),
            end_port: None,
        },
    }
}

fn rules(b: &mut Bytes, kind: PolicyKind) -> Option<Vec<PolicyRule>> {
    if b.one_in(3) {
        return None;
    }
    Some(
        (0..b.below(3))
            .map(|_| PolicyRule {
                peers: (0..b.below(3)).map(|_| peer(b, kind)).collect(),
                ports: (0..b.below(3)).map(|_| policy_port(b)).collect(),
            })
            .collect(),
    )
}

/// Policy number `index`: its name is `p<index mod 3>`, so names repeat across kinds and
/// `replaces` finds them.
fn policy(b: &mut Bytes, index: usize) -> Policy {
    let kind = *b.pick(&[
        PolicyKind::NetworkPolicy,
        PolicyKind::DanmNetworkPolicy,
        PolicyKind::MultiNetworkPolicy,
    ]);
    let scope = match kind {
        PolicyKind::NetworkPolicy => PolicyScope::Primary,
        PolicyKind::DanmNetworkPolicy => PolicyScope::AllInterfaces,
        PolicyKind::MultiNetworkPolicy => {
            let nets = networks();
            PolicyScope::Networks(
                (0..b.below(3))
                    .map(|_| b.pick(&nets[..2]).clone())
                    .collect(),
            )
        }
    };
    let mode = if b.one_in(3) {
        Mode::Monitor
    } else {
        Mode::Enforce
    };
    Policy {
        kind,
        key: ObjectKey::new(namespace_name(b), format!("p{}", index % 3)),
        pod_selector: selector(b, "app", &APPS),
        ingress: rules(b, kind),
        egress: rules(b, kind),
        scope,
        mode,
        replaces: (mode == Mode::Monitor && b.one_in(2)).then(|| format!("p{}", b.below(3))),
        log_denies: b.one_in(4),
    }
}

// ----- admin policies and Nodes (SPEC 8) ---------------------------------------------------

/// The most admin policies a scenario starts with.
const MAX_ADMIN_POLICIES: usize = 4;
/// Priorities of the Admin tier: few, so that ties (ordered by kind, then name) are common.
const PRIORITIES: [u32; 5] = [0, 5, 5, 5, 9];
/// Node addresses: the hostNetwork pods' address, another node's, a pod's primary address and
/// a secondary-network address pods reuse (both collisions a `nodes` peer meets on a badly
/// addressed cluster), a pod's IPv6 address, and an address outside every pod.
const NODE_ADDRS: [&str; 6] = [
    "172.18.0.1",
    "172.18.0.2",
    "10.0.0.1",
    "192.168.0.1",
    "fd00::1",
    "203.0.113.1",
];

/// Pods by namespace labels and pod labels; a third of them `namespaces:` subjects or peers
/// (every pod of the namespaces).
fn pods_selector(b: &mut Bytes) -> PodsSelector {
    if b.one_in(3) {
        PodsSelector::namespaces(namespace_selector(b))
    } else {
        PodsSelector {
            namespaces: namespace_selector(b),
            pods: selector(b, "app", &APPS),
        }
    }
}

/// An admin rule's ports: numbers, ranges and every port of a protocol, and named ports
/// where the CRD allows them (not beside `networks`, `nodes` or `domainNames` peers).
fn admin_ports(b: &mut Bytes, named_ok: bool) -> Option<Vec<AdminPort>> {
    if b.one_in(3) {
        return None;
    }
    let port = |b: &mut Bytes| {
        let protocol = *b.pick(&Protocol::ALL);
        let ports = match b.below(5) {
            0 => None,
            1 => Some(*b.pick(&[(80, 81), (53, 8080)])),
            _ => {
                let n = *b.pick(&[53, 80, 81, 8080]);
                Some((n, n))
            }
        };
        AdminPort::Numbers(PortRange { protocol, ports })
    };
    Some(
        (0..1 + b.below(2))
            .map(|_| {
                if named_ok && b.one_in(3) {
                    AdminPort::Named(b.pick(&["http", "dns"]).to_string())
                } else {
                    port(b)
                }
            })
            .collect(),
    )
}

/// One admin rule as the CRD validation lets it through: Pass only in the Admin tier,
/// `networks`, `nodes` and `domainNames` only in egress, `domainNames` only with Allow.
fn admin_rule(b: &mut Bytes, index: usize, direction: Direction, tier: Tier) -> AdminRule {
    let actions: &[AdminAction] = match tier {
        Tier::Admin => &[AdminAction::Allow, AdminAction::Deny, AdminAction::Pass],
        Tier::Baseline => &[AdminAction::Allow, AdminAction::Deny],
    };
    let action = *b.pick(actions);
    let net = |s: &str| s.parse::<IpNet>().expect("fuzzing CIDR");
    let peers: Vec<AdminPeer> = (0..1 + b.below(2))
        .map(|_| match (direction, b.below(7)) {
            (Direction::Egress, 4) => AdminPeer::Networks(
                (0..1 + b.below(2))
                    .map(|_| {
                        net(b.pick::<&str>(&[
                            "10.0.0.0/24",
                            "10.0.0.0/31",
                            "10.0.0.2/32",
                            "192.168.0.0/24",
                            "fd00::/64",
                            "0.0.0.0/0",
                            "::/0",
                            "172.18.0.0/16",
                            "10.96.0.0/12",
                            "203.0.113.0/25",
                        ]))
                    })
                    .collect(),
            ),
            (Direction::Egress, 5) => AdminPeer::Nodes(selector(b, "zone", &ZONES)),
            (Direction::Egress, 6) if action == AdminAction::Allow => {
                AdminPeer::DomainNames(vec!["example.com".into()])
            }
            _ => AdminPeer::Pods(pods_selector(b)),
        })
        .collect();
    let named_ok = peers.iter().all(|p| matches!(p, AdminPeer::Pods(_)));
    AdminRule {
        name: b.one_in(2).then(|| format!("r{index}")),
        action,
        peers,
        ports: admin_ports(b, named_ok),
    }
}

const ZONES: [&str; 2] = ["east", "west"];

/// Admin policy number `index`: of the three kinds (a BaselineAdminNetworkPolicy is the
/// singleton `default`, the others are `a<index mod 3>`, so names repeat across kinds and
/// `replaces` finds them), priorities colliding, some monitored, some replacing, some for
/// secondary networks.
fn admin_policy(b: &mut Bytes, index: usize) -> AdminPolicy {
    let kind = *b.pick(&[
        AdminKind::ClusterNetworkPolicy,
        AdminKind::AdminNetworkPolicy,
        AdminKind::BaselineAdminNetworkPolicy,
    ]);
    let tier = match kind {
        AdminKind::ClusterNetworkPolicy if b.one_in(3) => Tier::Baseline,
        AdminKind::BaselineAdminNetworkPolicy => Tier::Baseline,
        _ => Tier::Admin,
    };
    let (name, priority) = match kind {
        AdminKind::BaselineAdminNetworkPolicy => ("default".to_string(), 0),
        _ => (format!("a{}", index % 3), *b.pick(&PRIORITIES)),
    };
    let subject = pods_selector(b);
    let ingress = (0..b.below(3))
        .map(|i| admin_rule(b, i, Direction::Ingress, tier))
        .collect();
    let egress = (0..b.below(3))
        .map(|i| admin_rule(b, i, Direction::Egress, tier))
        .collect();
    let scope = if b.one_in(4) {
        let nets = networks();
        PolicyScope::Networks(
            (0..1 + b.below(2))
                .map(|_| b.pick(&nets[..2]).clone())
                .collect(),
        )
    } else {
        PolicyScope::Primary
    };
    let mode = if b.one_in(3) {
        Mode::Monitor
    } else {
        Mode::Enforce
    };
    AdminPolicy {
        kind,
        name,
        tier,
        priority,
        subject,
        ingress,
        egress,
        scope,
        mode,
        replaces: (mode == Mode::Monitor && b.one_in(2))
            .then(|| b.pick(&["a0", "a1", "a2", "default"]).to_string()),
        log_denies: b.one_in(4),
    }
}

/// Node number `index`: labels for `nodes` selectors, and one or two addresses.
fn node(b: &mut Bytes, index: usize) -> Node {
    let mut labels = Labels::new();
    if !b.one_in(3) {
        labels.insert("zone".into(), b.pick(&ZONES).to_string());
    }
    if b.one_in(3) {
        labels.insert("tier".into(), "infra".into());
    }
    Node {
        name: format!("n{index}"),
        labels,
        addresses: (0..1 + b.below(2))
            .map(|_| b.pick(&NODE_ADDRS).parse().expect("fuzzing address"))
            .collect(),
    }
}

/// A change to the admin policies or Nodes of `state`: mostly edits.
fn admin_change(b: &mut Bytes, state: &State) -> Change {
    let nth = |b: &mut Bytes, n: usize| b.below(n.max(1));
    match b.below(8) {
        0..=3 if !state.admin_policies.is_empty() => {
            let old = state
                .admin_policies
                .values()
                .nth(nth(b, state.admin_policies.len()))
                .expect("index below len");
            let mut policy = old.clone();
            match b.below(6) {
                0 => return Change::RemoveAdminPolicy(old.reference()),
                1 => {
                    policy.mode = match policy.mode {
                        Mode::Enforce => Mode::Monitor,
                        Mode::Monitor => Mode::Enforce,
                    };
                    if policy.mode == Mode::Enforce {
                        policy.replaces = None;
                    }
                }
                2 => policy.subject = pods_selector(b),
                3 if policy.kind != AdminKind::BaselineAdminNetworkPolicy => {
                    policy.priority = *b.pick(&PRIORITIES);
                }
                _ => {
                    // One direction's rules redrawn; what identifies the policy and its
                    // view kept.
                    let direction = *b.pick(&[Direction::Ingress, Direction::Egress]);
                    let rules = (0..1 + b.below(2))
                        .map(|i| admin_rule(b, i, direction, policy.tier))
                        .collect();
                    match direction {
                        Direction::Ingress => policy.ingress = rules,
                        Direction::Egress => policy.egress = rules,
                    }
                }
            }
            Change::SetAdminPolicy(policy)
        }
        0..=4 => {
            let index = MAX_ADMIN_POLICIES + b.below(3);
            Change::SetAdminPolicy(admin_policy(b, index))
        }
        5 | 6 if !state.nodes.is_empty() => {
            let old = state
                .nodes
                .values()
                .nth(nth(b, state.nodes.len()))
                .expect("index below len");
            let mut node = old.clone();
            match b.below(3) {
                0 => return Change::RemoveNode(old.name.clone()),
                1 => {
                    node.labels = self::node(b, 0).labels;
                }
                _ => {
                    node.addresses = self::node(b, 0).addresses;
                }
            }
            Change::SetNode(node)
        }
        _ => {
            let index = b.below(3);
            Change::SetNode(node(b, index))
        }
    }
}

fn service(b: &mut Bytes, index: usize, pods: &[Pod]) -> Service {
    let n = index as u8 + 1;
    let cluster_ips = match b.below(4) {
        0 => Vec::new(),
        1 => vec![IpAddr::V6(Ipv6Addr::new(
            0xfd96,
            0,
            0,
            0,
            0,
            0,
            0,
            n.into(),
        ))],
        _ => vec![IpAddr::V4(Ipv4Addr::new(10, 96, 0, n))],
    };
    let (selector, endpoint_addrs) = match b.below(3) {
        // EndpointSlices: some pod primary addresses, or an address no pod holds.
        0 => (
            None,
            (0..1 + b.below(2))
                .map(|_| endpoint_addr(b, pods))
                .collect(),
        ),
        // A selector with no label selects nothing.
        1 if b.one_in(2) => (Some(Labels::new()), Vec::new()),
        _ => {
            let mut labels = Labels::new();
            labels.insert("app".into(), b.pick(&APPS).to_string());
            (Some(labels), Vec::new())
        }
    };
    Service {
        key: ObjectKey::new(namespace_name(b), format!("svc{index}")),
        cluster_ips,
        selector,
        endpoint_addrs,
        ports: service_ports(b),
    }
}

/// An EndpointSlice address: a pod's primary address, or one no pod holds.
fn endpoint_addr(b: &mut Bytes, pods: &[Pod]) -> IpAddr {
    let candidates: Vec<IpAddr> = pods
        .iter()
        .filter(|p| !p.host_network)
        .filter_map(Pod::primary)
        .flat_map(|i| i.ips.iter().copied())
        .collect();
    if candidates.is_empty() || b.one_in(4) {
        IpAddr::V4(Ipv4Addr::new(10, 0, 9, 9))
    } else {
        *b.pick(&candidates)
    }
}

fn service_ports(b: &mut Bytes) -> Vec<ServicePort> {
    (0..1 + b.below(2))
        .map(|_| {
            let (protocol, port, target) = b
                .pick(&[
                    (Protocol::Tcp, 8080, PortRef::Number(80)),
                    (Protocol::Tcp, 8080, PortRef::Named("http".into())),
                    (Protocol::Tcp, 80, PortRef::Number(81)),
                    (Protocol::Udp, 53, PortRef::Named("dns".into())),
                    (Protocol::Udp, 53, PortRef::Number(53)),
                ])
                .clone();
            ServicePort {
                protocol,
                port,
                target,
            }
        })
        .collect()
}

/// An edit of an existing Service: its endpoints move, its selector, ports or virtual IPs
/// change.
fn service_edit(b: &mut Bytes, old: &Service, pods: &[Pod]) -> Service {
    let mut service = old.clone();
    match b.below(5) {
        // An EndpointSlice address moves to another pod (or nowhere), goes, or comes.
        0 | 1 if service.selector.is_none() => {
            let addrs = &mut service.endpoint_addrs;
            match b.below(3) {
                0 if !addrs.is_empty() => {
                    let at = b.below(addrs.len());
                    addrs[at] = endpoint_addr(b, pods);
                }
                1 if !addrs.is_empty() => {
                    let at = b.below(addrs.len());
                    addrs.remove(at);
                }
                _ => addrs.push(endpoint_addr(b, pods)),
            }
        }
        0 | 1 => {
            let mut labels = Labels::new();
            if !b.one_in(4) {
                labels.insert("app".into(), b.pick(&APPS).to_string());
            }
            service.selector = Some(labels);
        }
        2 => service.ports = service_ports(b),
        3 => {
            // From selector to EndpointSlices or back.
            if service.selector.is_some() {
                service.selector = None;
                service.endpoint_addrs = vec![endpoint_addr(b, pods)];
            } else {
                service.selector = Some(Labels::from([(
                    "app".to_string(),
                    b.pick(&APPS).to_string(),
                )]));
                service.endpoint_addrs.clear();
            }
        }
        _ => {
            service.cluster_ips = if service.cluster_ips.is_empty() {
                vec![IpAddr::V4(Ipv4Addr::new(10, 96, 1, 1))]
            } else {
                Vec::new()
            }
        }
    }
    service
}

/// One change to the cluster, as the agent's sources deliver them.
#[derive(Debug, Clone)]
pub enum Change {
    SetNamespace(Namespace),
    RemoveNamespace(String),
    SetPod(Pod),
    RemovePod(PodKey),
    SetPolicy(Policy),
    RemovePolicy(PolicyRef),
    SetService(Service),
    RemoveService(ObjectKey),
    SetAdminPolicy(AdminPolicy),
    RemoveAdminPolicy(AdminRef),
    SetNode(Node),
    RemoveNode(String),
}

/// A cluster, the changes it goes through, and the engine's switches.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub options: EngineOptions,
    pub namespaces: Vec<Namespace>,
    pub pods: Vec<Pod>,
    pub policies: Vec<Policy>,
    pub services: Vec<Service>,
    pub admin_policies: Vec<AdminPolicy>,
    pub nodes: Vec<Node>,
    pub changes: Vec<Change>,
}

/// The objects after every change, keyed as the engine keys them. Public for the property
/// tests that compare one cluster under two sets of objects (`tests/admin_properties.rs`).
#[derive(Debug, Clone, Default)]
pub struct State {
    pub namespaces: BTreeMap<String, Namespace>,
    pub pods: BTreeMap<PodKey, Pod>,
    pub policies: BTreeMap<PolicyRef, Policy>,
    pub services: BTreeMap<ObjectKey, Service>,
    pub admin_policies: BTreeMap<AdminRef, AdminPolicy>,
    pub nodes: BTreeMap<String, Node>,
}

impl State {
    /// The rules of a fresh engine fed these objects.
    pub fn rules(&self, options: &EngineOptions) -> BTreeMap<PodKey, PodRules> {
        fresh_rules(options, self)
    }

    /// Every verdict [`check_engine`] compares with the reference, from `rules` (computed for
    /// these objects): per flow (pod to pod, and between each pod and each outside address,
    /// for every probe), whether it is allowed in the enforced and in the staged view.
    pub fn verdicts(&self, rules: &BTreeMap<PodKey, PodRules>) -> BTreeMap<String, (bool, bool)> {
        let mut out = BTreeMap::new();
        let outside = PodKey::new("§outside", "§outside");
        let ends: Vec<FlowEnd> = rules
            .iter()
            .flat_map(|(key, r)| {
                r.interfaces.iter().flat_map(move |iface| {
                    iface.ips.iter().map(move |ip| FlowEnd {
                        pod: key,
                        interface: iface,
                        ip: *ip,
                    })
                })
            })
            .collect();
        let name = |e: &FlowEnd| format!("{} {} {}", e.pod, e.interface.name, e.ip);
        for &(protocol, port) in &PROBES {
            for src in &ends {
                let mut peers: Vec<(FlowEnd, FlowEnd)> = ends
                    .iter()
                    .filter(|dst| dst.ip.is_ipv4() == src.ip.is_ipv4())
                    .map(|dst| (*src, *dst))
                    .collect();
                for addr in outside_addresses(self) {
                    if addr.is_ipv4() == src.ip.is_ipv4() {
                        let there = FlowEnd {
                            pod: &outside,
                            interface: src.interface,
                            ip: addr,
                        };
                        peers.push((*src, there));
                        peers.push((there, *src));
                    }
                }
                for (from, to) in peers {
                    let v = flow_verdict(from, to, protocol, port);
                    // The outside end's own side is no pod's: only the pod's side counts.
                    let (enforced, staged) = if *from.pod == outside {
                        (v.ingress.enforced.allowed, v.ingress.staged.allowed)
                    } else if *to.pod == outside {
                        (v.egress.enforced.allowed, v.egress.staged.allowed)
                    } else {
                        (v.allowed, v.staged_allowed)
                    };
                    out.insert(
                        format!("{} -> {} {protocol}/{port}", name(&from), name(&to)),
                        (enforced, staged),
                    );
                }
            }
        }
        out
    }

    fn apply(&mut self, change: &Change) {
        match change.clone() {
            Change::SetNamespace(n) => {
                self.namespaces.insert(n.name.clone(), n);
            }
            Change::RemoveNamespace(name) => {
                self.namespaces.remove(&name);
            }
            Change::SetPod(p) => {
                self.pods.insert(p.key.clone(), p);
            }
            Change::RemovePod(key) => {
                self.pods.remove(&key);
            }
            Change::SetPolicy(p) => {
                self.policies.insert(p.reference(), p);
            }
            Change::RemovePolicy(reference) => {
                self.policies.remove(&reference);
            }
            Change::SetService(s) => {
                self.services.insert(s.key.clone(), s);
            }
            Change::RemoveService(key) => {
                self.services.remove(&key);
            }
            Change::SetAdminPolicy(p) => {
                self.admin_policies.insert(p.reference(), p);
            }
            Change::RemoveAdminPolicy(reference) => {
                self.admin_policies.remove(&reference);
            }
            Change::SetNode(n) => {
                self.nodes.insert(n.name.clone(), n);
            }
            Change::RemoveNode(name) => {
                self.nodes.remove(&name);
            }
        }
    }
}

fn feed(engine: &mut Engine, change: &Change) {
    match change.clone() {
        Change::SetNamespace(n) => engine.set_namespace(n),
        Change::RemoveNamespace(name) => engine.remove_namespace(&name),
        Change::SetPod(p) => engine.set_pod(p),
        Change::RemovePod(key) => engine.remove_pod(&key),
        Change::SetPolicy(p) => engine.set_policy(p),
        Change::RemovePolicy(reference) => engine.remove_policy(&reference),
        Change::SetService(s) => engine.set_service(s),
        Change::RemoveService(key) => engine.remove_service(&key),
        Change::SetAdminPolicy(p) => engine.set_admin_policy(p),
        Change::RemoveAdminPolicy(reference) => engine.remove_admin_policy(&reference),
        Change::SetNode(n) => engine.set_node(n),
        Change::RemoveNode(name) => engine.remove_node(&name),
    }
}

impl Scenario {
    /// Decodes a scenario from arbitrary bytes (every input decodes).
    pub fn from_bytes(data: &[u8]) -> Scenario {
        let mut b = Bytes::new(data);
        let options = EngineOptions {
            dns: *b.pick(&[DnsMode::Danm, DnsMode::All, DnsMode::None]),
            log_all_denies: b.one_in(4),
            learn: Vec::new(),
        };
        let mut namespaces = Vec::new();
        for name in NAMESPACES {
            if !b.one_in(4) {
                namespaces.push(namespace(&mut b, name));
            }
        }
        let pods: Vec<Pod> = (0..1 + b.below(MAX_PODS))
            .map(|i| {
                let ns = namespace_name(&mut b);
                pod(&mut b, i, ns)
            })
            .collect();
        let policies = (0..1 + b.below(MAX_POLICIES))
            .map(|i| policy(&mut b, i))
            .collect();
        let services = (0..b.below(3)).map(|i| service(&mut b, i, &pods)).collect();
        let mut scenario = Scenario {
            options,
            namespaces,
            pods,
            policies,
            services,
            admin_policies: Vec::new(),
            nodes: Vec::new(),
            changes: Vec::new(),
        };
        let mut state = scenario.initial_state();
        for _ in 0..b.below(8) {
            let change = change(&mut b, &state);
            state.apply(&change);
            scenario.changes.push(change);
        }
        // Admin policies, Nodes and their changes come after everything above, and none of
        // them when the bytes are used up (zeros): the committed seeds, found before admin
        // policies existed, decode to the scenarios they were found as.
        scenario.admin_policies = (0..b.below(MAX_ADMIN_POLICIES + 1))
            .map(|i| admin_policy(&mut b, i))
            .collect();
        scenario.nodes = (0..b.below(3)).map(|i| node(&mut b, i)).collect();
        // Their changes go between the others: each after the previous one, some changes
        // of the cluster later (they touch other objects, so the order they are drawn in
        // against the admin objects alone holds in the merged history).
        let mut admin_state = State::default();
        for change in scenario.initial_changes() {
            admin_state.apply(&change);
        }
        let mut merged = Vec::new();
        let mut others = std::mem::take(&mut scenario.changes).into_iter();
        for _ in 0..b.below(8) {
            merged.extend(others.by_ref().take(b.below(3)));
            let change = admin_change(&mut b, &admin_state);
            admin_state.apply(&change);
            merged.push(change);
        }
        merged.extend(others);
        scenario.changes = merged;
        scenario
    }

    /// The objects after every change.
    pub fn final_state(&self) -> State {
        let mut state = self.initial_state();
        for change in &self.changes {
            state.apply(change);
        }
        state
    }

    fn initial_state(&self) -> State {
        let mut state = State::default();
        for change in self.initial_changes() {
            state.apply(&change);
        }
        state
    }

    /// The initial objects as changes, in the order an agent's first list delivers them.
    fn initial_changes(&self) -> Vec<Change> {
        let mut out: Vec<Change> = self
            .namespaces
            .iter()
            .cloned()
            .map(Change::SetNamespace)
            .collect();
        out.extend(self.pods.iter().cloned().map(Change::SetPod));
        out.extend(self.policies.iter().cloned().map(Change::SetPolicy));
        out.extend(self.services.iter().cloned().map(Change::SetService));
        out.extend(self.nodes.iter().cloned().map(Change::SetNode));
        out.extend(
            self.admin_policies
                .iter()
                .cloned()
                .map(Change::SetAdminPolicy),
        );
        out
    }
}

/// A change to the current `state`: mostly edits of existing objects (what dirty tracking must
/// follow), sometimes new or removed ones.
fn change(b: &mut Bytes, state: &State) -> Change {
    let nth = |b: &mut Bytes, n: usize| b.below(n.max(1));
    match b.below(10) {
        0 => {
            let name = *b.pick(&NAMESPACES);
            if b.one_in(3) {
                Change::RemoveNamespace(name.into())
            } else {
                Change::SetNamespace(namespace(b, name))
            }
        }
        1..=3 if !state.pods.is_empty() => {
            let old = state
                .pods
                .values()
                .nth(nth(b, state.pods.len()))
                .expect("index below len");
            let mut pod = old.clone();
            match b.below(6) {
                0 => return Change::RemovePod(old.key.clone()),
                5 => {
                    // What only the pod itself sees: its netns, its interfaces' names.
                    pod.netns = Some(format!("/run/netns/{}", b.below(3)));
                    for (i, iface) in pod.interfaces.iter_mut().enumerate() {
                        if b.one_in(2) {
                            iface.name = format!("if{i}x");
                        }
                    }
                }
                1 => {
                    pod.labels.insert("app".into(), b.pick(&APPS).to_string());
                }
                2 => {
                    pod.labels.remove("app");
                    pod.labels.remove("tier");
                }
                3 => {
                    pod.container_ports.clear();
                    if b.one_in(2) {
                        pod.container_ports.push(ContainerPort {
                            name: Some("http".into()),
                            port: *b.pick(&[80, 81]),
                            protocol: Protocol::Tcp,
                        });
                    }
                }
                _ => {
                    // Same pod number (same addresses), everything else redrawn, namespace kept.
                    let index: usize = pod.key.name[3..].parse().expect("pod<index>");
                    let redrawn = self::pod(b, index, &pod.key.namespace);
                    pod = Pod {
                        key: pod.key,
                        ..redrawn
                    };
                }
            }
            Change::SetPod(pod)
        }
        4 => {
            let ns = namespace_name(b);
            let index = MAX_PODS + b.below(2);
            Change::SetPod(pod(b, index, ns))
        }
        5..=7 if !state.policies.is_empty() => {
            let old = state
                .policies
                .values()
                .nth(nth(b, state.policies.len()))
                .expect("index below len");
            let mut policy = old.clone();
            match b.below(4) {
                0 => return Change::RemovePolicy(old.reference()),
                1 => {
                    policy.mode = match policy.mode {
                        Mode::Enforce => Mode::Monitor,
                        Mode::Monitor => Mode::Enforce,
                    };
                    if policy.mode == Mode::Enforce {
                        policy.replaces = None;
                    }
                }
                2 => policy.pod_selector = selector(b, "app", &APPS),
                _ => {
                    let redrawn = self::policy(b, 0);
                    policy = Policy {
                        kind: policy.kind,
                        key: policy.key,
                        scope: policy.scope,
                        replaces: policy.replaces,
                        mode: policy.mode,
                        ..redrawn
                    };
                }
            }
            Change::SetPolicy(policy)
        }
        8 => {
            let index = MAX_POLICIES + b.below(3);
            Change::SetPolicy(policy(b, index))
        }
        _ => {
            let pods: Vec<Pod> = state.pods.values().cloned().collect();
            match b.below(4) {
                0 | 1 if !state.services.is_empty() => {
                    let old = state
                        .services
                        .values()
                        .nth(nth(b, state.services.len()))
                        .expect("index below len");
                    if b.one_in(4) {
                        Change::RemoveService(old.key.clone())
                    } else {
                        Change::SetService(service_edit(b, old, &pods))
                    }
                }
                _ => {
                    let index = b.below(3);
                    Change::SetService(service(b, index, &pods))
                }
            }
        }
    }
}

// ----- the reference evaluation -----------------------------------------------------------

/// Verdicts computed straight from SPEC sections 3, 4 and 8 over the objects: for one side (a
/// pod interface and a direction) and one view, the Admin tier's first matching rule decides
/// (Allow, Deny; Pass goes on); then, if a policy of the view isolates the side, allowed iff a
/// rule of one that does allows the peer address and the port; otherwise the Baseline tier's
/// first matching rule decides; otherwise allowed. Deliberately naive: it walks the objects
/// for every question.
///
/// Where the SPEC is silent it follows the engine's choices: a pod selector never
/// picks a hostNetwork pod (its address is the node's); `replaces` names a policy of any kind;
/// Service virtual IPs are allowed by every egress rule that allows an endpoint, whatever the
/// interface; a Service selector picks hostNetwork pods too; admin rules see Service virtual
/// IPs as plain addresses (SPEC 3.2 is the namespaced tier's; only a `networks` CIDR holding
/// one matches it).
///
/// What it reads from SPEC 8 where a choice had to be made:
/// - a `nodes` peer matches exactly the selected Nodes' `status.addresses`: "never pod
///   addresses" is read as "selecting Nodes selects no pod", not as "minus every address a pod
///   holds" — the kernel sees an address, and a Node address that a pod also holds (a badly
///   addressed cluster) matches the Node peer, as a `networks` CIDR holding a pod address
///   matches it;
/// - SPEC 7 keeps an address two pods claim out of every allow set: out of the pod peers of
///   an admin Allow rule, but not of a Deny or Pass rule's (those sets decide a deny or a
///   hand-over, and leaving the address out of a Deny would open what the administrator
///   closed);
/// - an egress named port resolves on the pods the rule's pod peers select that hold the
///   address on the policy's networks (the destination pods the peer stands for).
struct Reference<'a> {
    options: &'a EngineOptions,
    namespaces: &'a BTreeMap<String, Namespace>,
    pods: Vec<&'a Pod>,
    policies: Vec<&'a Policy>,
    services: Vec<&'a Service>,
    admin_policies: Vec<&'a AdminPolicy>,
    nodes: Vec<&'a Node>,
}

/// One side of a flow for the reference: the pod, its interface, the direction, and the view.
#[derive(Debug, Clone, Copy)]
struct Side<'a> {
    pod: &'a Pod,
    iface: &'a PodInterface,
    direction: Direction,
    staged: bool,
}

impl<'a> Reference<'a> {
    fn new(options: &'a EngineOptions, state: &'a State) -> Self {
        Reference {
            options,
            namespaces: &state.namespaces,
            pods: state.pods.values().collect(),
            policies: state.policies.values().collect(),
            services: state.services.values().collect(),
            admin_policies: state.admin_policies.values().collect(),
            nodes: state.nodes.values().collect(),
        }
    }

    fn namespace_labels(&self, name: &str) -> std::borrow::Cow<'a, Labels> {
        match self.namespaces.get(name) {
            Some(ns) => std::borrow::Cow::Borrowed(&ns.labels),
            // A namespace without an object still has its name label (Kubernetes sets it).
            None => {
                std::borrow::Cow::Owned(Labels::from([(NAME_LABEL.to_string(), name.to_string())]))
            }
        }
    }

    /// The policies isolating `side` in its view.
    fn isolating(&self, side: Side) -> Vec<&'a Policy> {
        let replaced = |p: &Policy| {
            p.mode == Mode::Enforce
                && self.policies.iter().any(|m| {
                    m.mode == Mode::Monitor
                        && m.key.namespace == p.key.namespace
                        && m.replaces.as_deref() == Some(p.key.name.as_str())
                })
        };
        self.policies
            .iter()
            .copied()
            .filter(|p| {
                !side.pod.host_network
                    && p.key.namespace == side.pod.key.namespace
                    && p.pod_selector.matches(&side.pod.labels)
                    && p.rules(side.direction).is_some()
                    && match &p.scope {
                        PolicyScope::Primary => side.iface.network == NetworkId::Primary,
                        PolicyScope::AllInterfaces => true,
                        PolicyScope::Networks(nets) => nets.contains(&side.iface.network),
                    }
            })
            .filter(|p| {
                if side.staged {
                    p.mode == Mode::Monitor || !replaced(p)
                } else {
                    p.mode == Mode::Enforce
                }
            })
            .collect()
    }

    /// Whether pod `peer_pod`'s interface `iface` is an address source for `peer` of `policy`.
    fn peer_selects(
        &self,
        policy: &Policy,
        peer: &Peer,
        peer_pod: &Pod,
        iface: &PodInterface,
    ) -> bool {
        let Peer::Pods {
            pod_selector,
            namespace_selector,
            network_selector,
        } = peer
        else {
            return false;
        };
        // hostNetwork pods have the node's address: no pod selector picks them.
        if peer_pod.host_network {
            return false;
        }
        let namespace_ok = match namespace_selector {
            None => peer_pod.key.namespace == policy.key.namespace,
            Some(sel) => sel.matches(&self.namespace_labels(&peer_pod.key.namespace)),
        };
        let pod_ok = pod_selector
            .as_ref()
            .is_none_or(|sel| sel.matches(&peer_pod.labels));
        let iface_ok = match policy.kind {
            PolicyKind::NetworkPolicy => iface.network == NetworkId::Primary,
            PolicyKind::DanmNetworkPolicy => network_selector.as_ref().is_none_or(|entries| {
                entries
                    .iter()
                    .any(|e| e.matches(&iface.network, &peer_pod.key.namespace))
            }),
            PolicyKind::MultiNetworkPolicy => match &policy.scope {
                PolicyScope::Networks(nets) => nets.contains(&iface.network),
                _ => false,
            },
        };
        namespace_ok && pod_ok && iface_ok
    }

    fn peer_allows(&self, policy: &Policy, rule: &PolicyRule, addr: IpAddr) -> bool {
        rule.peers.is_empty()
            || rule.peers.iter().any(|peer| match peer {
                Peer::IpBlock(block) => {
                    block.cidr.contains(&addr) && !block.except.iter().any(|e| e.contains(&addr))
                }
                // An address two pods claim allows neither (SPEC 7).
                Peer::Pods { .. } => {
                    !self.claimed_twice(addr)
                        && self.pods.iter().any(|p| {
                            p.interfaces.iter().any(|i| {
                                i.ips.contains(&addr) && self.peer_selects(policy, peer, p, i)
                            })
                        })
                }
            })
    }

    /// Whether two pods (hostNetwork pods aside) hold `addr`, on any interfaces.
    fn claimed_twice(&self, addr: IpAddr) -> bool {
        self.pods
            .iter()
            .filter(|p| !p.host_network && p.interfaces.iter().any(|i| i.ips.contains(&addr)))
            .count()
            > 1
    }

    /// Whether `rule` allows `port`: numbers directly; a named port on the destination pod
    /// (the target itself for ingress; for egress, any pod holding the peer address).
    fn port_allows(
        &self,
        rule: &PolicyRule,
        side: Side,
        addr: IpAddr,
        protocol: Protocol,
        port: u16,
    ) -> bool {
        rule.ports.is_empty()
            || rule.ports.iter().any(|p| {
                p.protocol == protocol
                    && match &p.port {
                        None => true,
                        Some(PortRef::Number(n)) => (*n..=p.end_port.unwrap_or(*n)).contains(&port),
                        Some(PortRef::Named(name)) => match side.direction {
                            Direction::Ingress => side.pod.named_port(name, protocol) == Some(port),
                            Direction::Egress => self.pods.iter().any(|d| {
                                !d.host_network
                                    && d.interfaces.iter().any(|i| i.ips.contains(&addr))
                                    && d.named_port(name, protocol) == Some(port)
                            }),
                        },
                    }
            })
    }

    /// A rule allows a flow to an address and port directly.
    fn rule_allows(
        &self,
        policy: &Policy,
        rule: &PolicyRule,
        side: Side,
        addr: IpAddr,
        protocol: Protocol,
        port: u16,
    ) -> bool {
        self.peer_allows(policy, rule, addr) && self.port_allows(rule, side, addr, protocol, port)
    }

    /// SPEC 3.2: an egress rule allowing a Service's endpoint on its target port also allows the
    /// Service's virtual IPs on the Service port.
    fn rule_allows_vip(
        &self,
        policy: &Policy,
        rule: &PolicyRule,
        side: Side,
        addr: IpAddr,
        protocol: Protocol,
        port: u16,
    ) -> bool {
        self.services.iter().any(|s| {
            s.cluster_ips.contains(&addr)
                && s.ports.iter().any(|sp| {
                    sp.protocol == protocol
                        && sp.port == port
                        && self.endpoints(s).into_iter().any(|(ep, pod)| {
                            let target = match &sp.target {
                                PortRef::Number(n) => Some(*n),
                                PortRef::Named(name) => {
                                    pod.and_then(|p| p.named_port(name, protocol))
                                }
                            };
                            target.is_some_and(|t| {
                                self.rule_allows(policy, rule, side, ep, protocol, t)
                            })
                        })
                })
        })
    }

    /// A Service's endpoints: the primary addresses of the pods its selector picks (an empty
    /// selector picks none), or the EndpointSlice addresses with the pod holding each.
    fn endpoints(&self, service: &Service) -> Vec<(IpAddr, Option<&'a Pod>)> {
        match &service.selector {
            Some(sel) => self
                .pods
                .iter()
                .copied()
                .filter(|p| {
                    p.key.namespace == service.key.namespace
                        && !sel.is_empty()
                        && sel.iter().all(|(k, v)| p.labels.get(k) == Some(v))
                })
                .flat_map(|p| {
                    p.interfaces
                        .iter()
                        .filter(|i| i.network == NetworkId::Primary)
                        .flat_map(move |i| i.ips.iter().map(move |ip| (*ip, Some(p))))
                })
                .collect(),
            None => service
                .endpoint_addrs
                .iter()
                .map(|ep| {
                    let pod = self
                        .pods
                        .iter()
                        .copied()
                        .find(|p| p.interfaces.iter().any(|i| i.ips.contains(ep)));
                    (*ep, pod)
                })
                .collect(),
        }
    }

    // ----- SPEC 8: the admin tiers

    /// Whether the admin policy `policy` names `side`'s pod and interface as its subject, with
    /// rules in its direction: the pod (never a hostNetwork one) in a namespace and with labels
    /// the subject selects, on an interface of the policy's networks.
    fn admin_applies(&self, policy: &AdminPolicy, side: Side) -> bool {
        !side.pod.host_network
            && policy
                .subject
                .namespaces
                .matches(&self.namespace_labels(&side.pod.key.namespace))
            && policy.subject.pods.matches(&side.pod.labels)
            && !policy.rules(side.direction).is_empty()
            && match &policy.scope {
                PolicyScope::Networks(nets) => nets.contains(&side.iface.network),
                _ => side.iface.network == NetworkId::Primary,
            }
    }

    /// The admin policies of `tier` that apply to `side` in its view, in evaluation order
    /// (priority, then kind, then name). The staged view has the monitored ones and leaves
    /// out the enforced ones a monitored policy of the same kind replaces.
    fn admin_tier(&self, side: Side, tier: Tier) -> Vec<&'a AdminPolicy> {
        let replaced = |p: &AdminPolicy| {
            self.admin_policies.iter().any(|m| {
                m.mode == Mode::Monitor
                    && m.kind == p.kind
                    && m.replaces.as_deref() == Some(p.name.as_str())
            })
        };
        let mut out: Vec<&AdminPolicy> = self
            .admin_policies
            .iter()
            .copied()
            .filter(|p| p.tier == tier && self.admin_applies(p, side))
            .filter(|p| match (p.mode, side.staged) {
                (Mode::Monitor, staged) => staged,
                (Mode::Enforce, false) => true,
                (Mode::Enforce, true) => !replaced(p),
            })
            .collect();
        out.sort_by(|a, b| (a.priority, a.kind, &a.name).cmp(&(b.priority, b.kind, &b.name)));
        out
    }

    /// Whether pod `peer_pod` holds `addr` on a network of `policy` and `selector` selects it.
    fn admin_pod_peer(
        &self,
        policy: &AdminPolicy,
        selector: &PodsSelector,
        peer_pod: &Pod,
        addr: IpAddr,
    ) -> bool {
        let on_network = |network: &NetworkId| match &policy.scope {
            PolicyScope::Networks(nets) => nets.contains(network),
            _ => *network == NetworkId::Primary,
        };
        !peer_pod.host_network
            && selector
                .namespaces
                .matches(&self.namespace_labels(&peer_pod.key.namespace))
            && selector.pods.matches(&peer_pod.labels)
            && peer_pod
                .interfaces
                .iter()
                .any(|i| on_network(&i.network) && i.ips.contains(&addr))
    }

    /// Whether an admin rule's peers and ports match a flow with `addr` at the other end.
    fn admin_rule_matches(
        &self,
        policy: &AdminPolicy,
        rule: &AdminRule,
        side: Side,
        addr: IpAddr,
        protocol: Protocol,
        port: u16,
    ) -> bool {
        let peer_ok = rule.peers.iter().any(|peer| match peer {
            AdminPeer::Pods(selector) => {
                (rule.action != AdminAction::Allow || !self.claimed_twice(addr))
                    && self
                        .pods
                        .iter()
                        .any(|p| self.admin_pod_peer(policy, selector, p, addr))
            }
            AdminPeer::Networks(cidrs) => cidrs.iter().any(|c| c.contains(&addr)),
            AdminPeer::Nodes(selector) => self
                .nodes
                .iter()
                .any(|n| selector.matches(&n.labels) && n.addresses.contains(&addr)),
            // Not resolved: matches nothing (SPEC 8, fail closed for an Allow).
            AdminPeer::DomainNames(_) => false,
        });
        let port_ok = |p: &AdminPort| match p {
            AdminPort::Numbers(range) => {
                range.protocol == protocol
                    && range.ports.is_none_or(|(lo, hi)| (lo..=hi).contains(&port))
            }
            AdminPort::Named(name) => match side.direction {
                Direction::Ingress => side.pod.named_port(name, protocol) == Some(port),
                Direction::Egress => self.pods.iter().any(|d| {
                    d.named_port(name, protocol) == Some(port)
                        && rule.peers.iter().any(|peer| match peer {
                            AdminPeer::Pods(selector) => {
                                self.admin_pod_peer(policy, selector, d, addr)
                            }
                            _ => false,
                        })
                }),
            },
        };
        peer_ok
            && rule
                .ports
                .as_ref()
                .is_none_or(|ports| ports.iter().any(port_ok))
    }

    /// The action of the first rule of `tier` in `side`'s view that matches the flow.
    fn admin_decision(
        &self,
        side: Side,
        tier: Tier,
        addr: IpAddr,
        protocol: Protocol,
        port: u16,
    ) -> Option<AdminAction> {
        self.admin_tier(side, tier).into_iter().find_map(|policy| {
            policy
                .rules(side.direction)
                .iter()
                .find(|rule| self.admin_rule_matches(policy, rule, side, addr, protocol, port))
                .map(|rule| rule.action)
        })
    }

    /// The verdict of one side in one view, for a peer address, protocol and port: Admin
    /// tier, namespaced tier, Baseline tier, allow (SPEC 8); a pod to itself before any.
    fn side_allows(
        &self,
        side: Side,
        addr: IpAddr,
        protocol: Protocol,
        port: u16,
        loopback: bool,
    ) -> bool {
        if loopback {
            return true;
        }
        match self.admin_decision(side, Tier::Admin, addr, protocol, port) {
            Some(AdminAction::Allow) => return true,
            Some(AdminAction::Deny) => return false,
            Some(AdminAction::Pass) | None => {}
        }
        let isolating = self.isolating(side);
        if isolating.is_empty() {
            // A Pass in the Baseline tier is refused at the edge: the generator has none.
            return self.admin_decision(side, Tier::Baseline, addr, protocol, port)
                != Some(AdminAction::Deny);
        }
        let dns = side.direction == Direction::Egress
            && port == 53
            && matches!(protocol, Protocol::Tcp | Protocol::Udp)
            && match self.options.dns {
                DnsMode::All => true,
                DnsMode::None => false,
                DnsMode::Danm => isolating
                    .iter()
                    .any(|p| p.kind == PolicyKind::DanmNetworkPolicy),
            };
        dns || isolating.iter().any(|policy| {
            policy
                .rules(side.direction)
                .unwrap_or_default()
                .iter()
                .any(|rule| {
                    self.rule_allows(policy, rule, side, addr, protocol, port)
                        || (side.direction == Direction::Egress
                            && self.rule_allows_vip(policy, rule, side, addr, protocol, port))
                })
        })
    }
}

// ----- the checks -------------------------------------------------------------------------

/// Decodes `data` into a scenario and checks every invariant of the module documentation, and
/// the [`AddrSet`] algebra on the same bytes; panics on a violation.
pub fn check_engine(data: &[u8]) {
    check_addr_sets(data);
    check_scenario(&Scenario::from_bytes(data));
}

/// Checks the engine invariants on one scenario; panics on a violation.
pub fn check_scenario(scenario: &Scenario) {
    // Incremental: initial objects, then each change, recomputing only the dirty pods.
    let mut engine = Engine::new(scenario.options.clone());
    for change in scenario.initial_changes() {
        feed(&mut engine, &change);
    }
    let mut rules = engine.all_pod_rules();
    let mut state = scenario.initial_state();
    let mut fresh_rules = fresh_rules(&scenario.options, &state);
    for (step, change) in scenario.changes.iter().enumerate() {
        feed(&mut engine, change);
        state.apply(change);
        for key in engine.take_dirty() {
            match engine.pod_rules(&key) {
                Some(r) => rules.insert(key, r),
                None => rules.remove(&key),
            };
        }
        fresh_rules = self::fresh_rules(&scenario.options, &state);
        if rules != fresh_rules {
            let differing: Vec<&PodKey> = fresh_rules
                .keys()
                .chain(rules.keys())
                .filter(|k| rules.get(*k) != fresh_rules.get(*k))
                .collect();
            panic!(
                "after change {step} ({change:?}), incremental rules differ from fresh ones for {differing:?}\nscenario: {scenario:#?}"
            );
        }
    }
    // Idempotent: the same objects again change nothing.
    for n in state.namespaces.values() {
        engine.set_namespace(n.clone());
    }
    for p in state.pods.values() {
        engine.set_pod(p.clone());
    }
    for p in state.policies.values() {
        engine.set_policy(p.clone());
    }
    for s in state.services.values() {
        engine.set_service(s.clone());
    }
    for n in state.nodes.values() {
        engine.set_node(n.clone());
    }
    for p in state.admin_policies.values() {
        engine.set_admin_policy(p.clone());
    }
    let dirty = engine.take_dirty();
    assert!(
        dirty.is_empty(),
        "unchanged objects marked {dirty:?} dirty\nscenario: {scenario:#?}"
    );
    let reference = Reference::new(&scenario.options, &state);
    for pod_rules in fresh_rules.values() {
        check_well_formed(pod_rules, &state, &reference);
    }
    check_verdicts(&scenario.options, &state, &fresh_rules);
}

/// The rules of a fresh engine fed `state` at once, admin policies, Nodes, policies and
/// Services before the pods they concern (the reverse of an agent's first list).
fn fresh_rules(options: &EngineOptions, state: &State) -> BTreeMap<PodKey, PodRules> {
    let mut fresh = Engine::new(options.clone());
    for p in state.admin_policies.values().rev() {
        fresh.set_admin_policy(p.clone());
    }
    for n in state.nodes.values().rev() {
        fresh.set_node(n.clone());
    }
    for p in state.policies.values().rev() {
        fresh.set_policy(p.clone());
    }
    for s in state.services.values() {
        fresh.set_service(s.clone());
    }
    for p in state.pods.values().rev() {
        fresh.set_pod(p.clone());
    }
    for n in state.namespaces.values() {
        fresh.set_namespace(n.clone());
    }
    fresh.all_pod_rules()
}

fn check_well_formed(rules: &PodRules, state: &State, reference: &Reference) {
    let pod = &state.pods[&rules.pod];
    assert_eq!(
        rules.interfaces.len(),
        pod.interfaces.len(),
        "{:?}",
        rules.pod
    );
    for (iface, pi) in rules.interfaces.iter().zip(&pod.interfaces) {
        assert_eq!(
            (&iface.name, &iface.network, &iface.ips),
            (&pi.name, &pi.network, &pi.ips)
        );
        for direction in [Direction::Ingress, Direction::Egress] {
            let d: &DirectionRules = iface.direction(direction);
            let at = format!("{} {} {direction}", rules.pod, iface.name);
            assert_eq!(
                d.enforced.is_isolated(),
                !d.enforced_policies.is_empty(),
                "{at}: enforced isolation and policies disagree"
            );
            if !d.has_monitor() {
                assert_eq!(
                    d.staged, d.enforced,
                    "{at}: staged differs without monitoring"
                );
            }
            for p in &d.replaced_policies {
                assert!(
                    d.enforced_policies.contains(p),
                    "{at}: replaced {p} not enforced"
                );
            }
            if pod.host_network {
                assert!(
                    !d.enforced.is_isolated() && !d.staged.is_isolated(),
                    "{at}: hostNetwork pod isolated"
                );
            }
            if direction == Direction::Ingress {
                assert_eq!(
                    d.implicit_dns,
                    Default::default(),
                    "{at}: implicit DNS on ingress"
                );
            }
            assert!(
                (!d.implicit_dns.enforced || d.enforced.is_isolated())
                    && (!d.implicit_dns.staged || d.staged.is_isolated()),
                "{at}: implicit DNS in an open view"
            );
            for rule in d.enforced.rules().iter().chain(d.staged.rules()) {
                assert_eq!(
                    rule.origin.direction, direction,
                    "{at}: rule of the other direction"
                );
            }
            if let Isolation::Isolated(r) = &d.enforced {
                assert!(
                    r.iter().all(|r| r.origin.mode == Mode::Enforce),
                    "{at}: monitored rule enforced"
                );
            }
            for (tier, rules) in [(Tier::Admin, &d.admin), (Tier::Baseline, &d.baseline)] {
                check_tier_well_formed(
                    &at,
                    tier,
                    rules,
                    Side {
                        pod,
                        iface: pi,
                        direction,
                        staged: false,
                    },
                    reference,
                );
            }
        }
    }
}

/// One tier of one side: empty when no admin policy of the tier applies; in each view, every
/// rule of the applicable policies in evaluation order (an origin list the reference computes
/// from the objects); the staged view equal to the enforced one when none of them is monitored
/// or replaced; only enforced rules enforced.
fn check_tier_well_formed(
    at: &str,
    tier: Tier,
    rules: &TierRules,
    side: Side,
    reference: &Reference,
) {
    let applicable: Vec<&AdminPolicy> = reference
        .admin_policies
        .iter()
        .copied()
        .filter(|p| p.tier == tier && reference.admin_applies(p, side))
        .collect();
    if applicable.is_empty() {
        assert!(
            rules.is_empty(),
            "{at}: {tier} rules without an admin policy applying"
        );
        return;
    }
    for staged in [false, true] {
        let expected: Vec<(AdminRef, usize)> = reference
            .admin_tier(Side { staged, ..side }, tier)
            .into_iter()
            .flat_map(|p| (0..p.rules(side.direction).len()).map(|i| (p.reference(), i)))
            .collect();
        let got: Vec<(AdminRef, usize)> = rules
            .view(staged)
            .iter()
            .map(|r| (r.origin.policy.clone(), r.origin.index))
            .collect();
        assert_eq!(got, expected, "{at}: {tier} rules (staged: {staged})");
        for r in rules.view(staged) {
            assert!(
                r.origin.tier == tier && r.origin.direction == side.direction,
                "{at}: {tier} rule {:?} out of place",
                r.origin
            );
        }
    }
    assert!(
        rules
            .enforced
            .iter()
            .all(|r| r.origin.mode == Mode::Enforce),
        "{at}: monitored {tier} rule enforced"
    );
    let monitored_or_replaced = applicable.iter().any(|p| {
        p.mode == Mode::Monitor
            || reference.admin_policies.iter().any(|m| {
                m.mode == Mode::Monitor
                    && m.kind == p.kind
                    && m.replaces.as_deref() == Some(p.name.as_str())
            })
    });
    if !monitored_or_replaced {
        assert_eq!(
            rules.staged, rules.enforced,
            "{at}: {tier} staged differs without monitoring"
        );
    }
}

/// The protocols and ports every side is asked about: each port a policy, a container or a
/// Service of the universe names, and one nobody names.
const PROBES: [(Protocol, u16); 8] = [
    (Protocol::Tcp, 80),
    (Protocol::Tcp, 81),
    (Protocol::Tcp, 8080),
    (Protocol::Tcp, 53),
    (Protocol::Udp, 53),
    (Protocol::Udp, 8080),
    (Protocol::Sctp, 80),
    (Protocol::Tcp, 9),
];

/// Addresses outside the pods: the Service VIPs, and addresses in and out of the ipBlocks.
fn outside_addresses(state: &State) -> Vec<IpAddr> {
    let mut out: BTreeSet<IpAddr> = [
        "203.0.113.200",
        "203.0.113.1",
        "10.0.9.9",
        "2001:db8::1",
        "fd00::99",
    ]
    .iter()
    .map(|a| a.parse().expect("fuzzing address"))
    .collect();
    for s in state.services.values() {
        out.extend(s.cluster_ips.iter().copied());
    }
    // Node addresses (`nodes` peers), those no pod holds among them.
    out.extend(
        state
            .nodes
            .values()
            .flat_map(|n| n.addresses.iter().copied()),
    );
    out.into_iter().collect()
}

/// An end of a flow outside every pod (its `pod` is no pod's key, so never loopback).
struct Outside {
    key: PodKey,
}

fn check_verdicts(options: &EngineOptions, state: &State, rules: &BTreeMap<PodKey, PodRules>) {
    let reference = Reference::new(options, state);
    // Every (pod, interface, address) of the cluster, with its rules.
    let mut ends = Vec::new();
    for (key, pod_rules) in rules {
        let pod = &state.pods[key];
        for (iface, pi) in pod_rules.interfaces.iter().zip(&pod.interfaces) {
            for ip in &iface.ips {
                ends.push((pod, pi, iface, *ip));
            }
        }
    }
    let outside = Outside {
        key: PodKey::new("§outside", "§outside"),
    };
    let side = |pod, iface, direction, staged| Side {
        pod,
        iface,
        direction,
        staged,
    };
    for &(pod, pi, iface, ip) in &ends {
        for &(protocol, port) in &PROBES {
            // Pod to pod: both sides, and the flow as a whole.
            for &(dpod, dpi, diface, dip) in &ends {
                if ip.is_ipv4() != dip.is_ipv4() {
                    continue;
                }
                let v = flow_verdict(
                    FlowEnd {
                        pod: &pod.key,
                        interface: iface,
                        ip,
                    },
                    FlowEnd {
                        pod: &dpod.key,
                        interface: diface,
                        ip: dip,
                    },
                    protocol,
                    port,
                );
                let loopback = pod.key == dpod.key;
                for staged in [false, true] {
                    let egress = reference.side_allows(
                        side(pod, pi, Direction::Egress, staged),
                        dip,
                        protocol,
                        port,
                        loopback,
                    );
                    let ingress = reference.side_allows(
                        side(dpod, dpi, Direction::Ingress, staged),
                        ip,
                        protocol,
                        port,
                        loopback,
                    );
                    let (got_egress, got_ingress, got) = if staged {
                        (
                            v.egress.staged.allowed,
                            v.ingress.staged.allowed,
                            v.staged_allowed,
                        )
                    } else {
                        (
                            v.egress.enforced.allowed,
                            v.ingress.enforced.allowed,
                            v.allowed,
                        )
                    };
                    let view = if staged { "staged" } else { "enforced" };
                    assert!(
                        got_egress == egress && got_ingress == ingress && got == (egress && ingress),
                        "{view} verdict {} {} {ip} -> {} {} {dip} {protocol}/{port}: engine egress {got_egress} ingress {got_ingress}, reference egress {egress} ingress {ingress}\nobjects: {state:#?}",
                        pod.key, iface.name, dpod.key, diface.name
                    );
                }
                assert_eq!(
                    v.cause.is_some(),
                    v.allowed && !v.staged_allowed,
                    "a cause without a would-deny, or the reverse"
                );
            }
            // To and from addresses outside the pods (Service VIPs among them).
            for addr in outside_addresses(state) {
                if ip.is_ipv4() != addr.is_ipv4() {
                    continue;
                }
                let there = FlowEnd {
                    pod: &outside.key,
                    interface: iface,
                    ip: addr,
                };
                let here = FlowEnd {
                    pod: &pod.key,
                    interface: iface,
                    ip,
                };
                let out = flow_verdict(here, there, protocol, port);
                let into = flow_verdict(there, here, protocol, port);
                for staged in [false, true] {
                    let egress = reference.side_allows(
                        side(pod, pi, Direction::Egress, staged),
                        addr,
                        protocol,
                        port,
                        false,
                    );
                    let ingress = reference.side_allows(
                        side(pod, pi, Direction::Ingress, staged),
                        addr,
                        protocol,
                        port,
                        false,
                    );
                    let (got_egress, got_ingress) = if staged {
                        (out.egress.staged.allowed, into.ingress.staged.allowed)
                    } else {
                        (out.egress.enforced.allowed, into.ingress.enforced.allowed)
                    };
                    assert!(
                        got_egress == egress && got_ingress == ingress,
                        "{} {} {ip} with outside {addr} {protocol}/{port} (staged: {staged}): engine egress {got_egress} ingress {got_ingress}, reference egress {egress} ingress {ingress}\nobjects: {state:#?}",
                        pod.key, iface.name
                    );
                }
            }
        }
    }
}

// ----- AddrSet algebra --------------------------------------------------------------------

/// A block of addresses from the bytes: near 10.0.0.0 or fd00:: (so blocks overlap and touch),
/// sometimes a whole family or the last addresses (where ranges saturate).
fn block(b: &mut Bytes) -> IpNet {
    let net = match b.below(8) {
        0 => IpNet::new(
            IpAddr::V4(Ipv4Addr::from(u32::MAX - u32::from(b.u8()))),
            24 + b.below(9) as u8,
        ),
        1 => IpNet::new(
            IpAddr::V6(Ipv6Addr::from(u128::MAX - u128::from(b.u8()))),
            120 + b.below(9) as u8,
        ),
        2 if b.one_in(4) => IpNet::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        3 => IpNet::new(
            IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(b.u8()))),
            120 + b.below(9) as u8,
        ),
        _ => IpNet::new(
            IpAddr::V4(Ipv4Addr::new(10, 0, b.u8() % 4, b.u8())),
            22 + b.below(11) as u8,
        ),
    };
    net.expect("prefix in range").trunc()
}

fn first_last(net: &IpNet) -> (IpAddr, IpAddr) {
    (net.network(), net.broadcast())
}

fn neighbours(addr: IpAddr) -> [IpAddr; 3] {
    match addr {
        IpAddr::V4(a) => {
            let n = u32::from(a);
            [n.wrapping_sub(1), n, n.wrapping_add(1)].map(|x| IpAddr::V4(Ipv4Addr::from(x)))
        }
        IpAddr::V6(a) => {
            let n = u128::from(a);
            [n.wrapping_sub(1), n, n.wrapping_add(1)].map(|x| IpAddr::V6(Ipv6Addr::from(x)))
        }
    }
}

/// Checks the [`AddrSet`] algebra on sets built from `data`; panics on a violation.
pub fn check_addr_sets(data: &[u8]) {
    let mut b = Bytes::new(data);
    let lists: Vec<Vec<IpNet>> = (0..3)
        .map(|_| (0..b.below(5)).map(|_| block(&mut b)).collect())
        .collect();
    let sets: Vec<AddrSet> = lists
        .iter()
        .map(|nets| AddrSet::union_of(nets.iter().map(AddrSet::from_net)))
        .collect();
    // Every address where membership can change, and its neighbours.
    let mut probes: BTreeSet<IpAddr> = BTreeSet::new();
    for net in lists.iter().flatten() {
        let (first, last) = first_last(net);
        probes.extend(neighbours(first));
        probes.extend(neighbours(last));
    }
    probes.extend([
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    ]);
    let naive = |nets: &[IpNet], addr: IpAddr| nets.iter().any(|n| n.contains(&addr));
    let [a, b, c] = [&sets[0], &sets[1], &sets[2]];
    let union = |x: &AddrSet, y: &AddrSet| {
        let mut u = x.clone();
        u.union_with(y);
        u
    };
    for (set, nets) in sets.iter().zip(&lists) {
        for &addr in &probes {
            assert_eq!(set.contains(addr), naive(nets, addr), "{addr} in {nets:?}");
        }
        // Built one block at a time, the same set.
        let mut folded = AddrSet::new();
        for n in nets {
            folded.union_with(&AddrSet::from_net(n));
        }
        assert_eq!(&folded, set, "union_of and union_with disagree on {nets:?}");
        // The CIDR decomposition covers exactly the set, with disjoint blocks.
        let cidrs: Vec<IpNet> = set
            .v4_cidrs()
            .into_iter()
            .map(IpNet::V4)
            .chain(set.v6_cidrs().into_iter().map(IpNet::V6))
            .collect();
        assert_eq!(
            &AddrSet::union_of(cidrs.iter().map(AddrSet::from_net)),
            set,
            "CIDRs {cidrs:?} of {nets:?}"
        );
        assert!(cidrs.len() >= set.range_count());
        for (i, x) in cidrs.iter().enumerate() {
            for y in &cidrs[i + 1..] {
                assert!(
                    !x.contains(y) && !y.contains(x),
                    "overlapping CIDRs {x} {y}"
                );
            }
        }
    }
    let empty = AddrSet::new();
    assert_eq!(&union(a, a), a, "union not idempotent");
    assert_eq!(union(a, b), union(b, a), "union not commutative");
    assert_eq!(
        union(&union(a, b), c),
        union(a, &union(b, c)),
        "union not associative"
    );
    assert_eq!(
        AddrSet::union_of([a.clone(), b.clone(), c.clone()]),
        union(&union(a, b), c)
    );
    assert_eq!(&a.intersection(a), a, "intersection not idempotent");
    assert_eq!(
        a.intersection(b),
        b.intersection(a),
        "intersection not commutative"
    );
    assert!(a.difference(a).is_empty(), "A - A not empty");
    assert_eq!(&a.difference(&empty), a);
    assert_eq!(
        union(&a.difference(b), &a.intersection(b)),
        *a,
        "(A-B) + (A&B) != A"
    );
    assert!(
        a.difference(b).intersection(b).is_empty(),
        "(A-B) & B not empty"
    );
    for &addr in &probes {
        let (ia, ib) = (naive(&lists[0], addr), naive(&lists[1], addr));
        assert_eq!(a.difference(b).contains(addr), ia && !ib, "{addr} in A-B");
        assert_eq!(a.intersection(b).contains(addr), ia && ib, "{addr} in A&B");
    }
    // An ipBlock: its CIDR minus its excepts (those of the other family ignored).
    if let Some(&cidr) = lists[0].first() {
        let except = lists[1].clone();
        let block = AddrSet::from_ip_block(&IpBlock {
            cidr,
            except: except.clone(),
        });
        for &addr in &probes {
            assert_eq!(
                block.contains(addr),
                cidr.contains(&addr) && !naive(&except, addr),
                "{addr} in {cidr} except {except:?}"
            );
        }
    }
}
