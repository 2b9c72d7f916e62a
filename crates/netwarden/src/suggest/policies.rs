//! From observed flows to least-privilege policies of one kind (pure: no I/O).
//!
//! One policy per workload and kind — per workload and network for MultiNetworkPolicy, whose
//! `policy-for` names the network — isolating only the directions in which the workload logged
//! traffic (see [`super::flows`]). Each rule allows one peer on the ports seen from it:
//! - a workload of the state: its exact selector (see [`super::workloads`]) as `podSelector`,
//!   with `namespaceSelector` on `kubernetes.io/metadata.name` when it lives in another
//!   namespace, and for DanmNetworkPolicy on a secondary network a `networkSelector` naming it;
//! - an address that is no pod's: an `ipBlock` of exactly that address (`/32`, `/128`).
//!
//! Ports are numbers, or the destination's port name when every replica of the destination
//! workload declares that port under that name. A flow is allowed on both of its ends where
//! the suggestion isolates them, whichever end logged it: an egress seen only by the client
//! must still be let in by a server whose ingress is isolated.
//!
//! Flows the Admin tier decides (SPEC 8, see [`super::tiers`]) are reported: a flow it denies
//! gets no rule on either side, a side it settles gets none there.
//!
//! What a kind cannot express is reported, not approximated: NetworkPolicy covers the primary
//! network only, MultiNetworkPolicy names NetworkAttachmentDefinitions only (not the primary
//! network, nor DANM networks). DanmNetworkPolicy expresses every network, but isolates every
//! interface of its pods, and a peer on the primary network (no `networkSelector`) contributes
//! all of the peer's interfaces.

use std::collections::BTreeMap;

use ipnet::IpNet;
use netwarden_engine::hash::hash_bytes;
use netwarden_engine::{
    AdminRef, Direction, IpBlock, LabelSelector, Mode, NetworkId, NetworkSelectorEntry,
    NetworkType, ObjectKey, Peer, Policy, PolicyKind, PolicyPort, PolicyRule, PolicyScope, PortRef,
    Protocol,
};
use netwarden_manifest::NAMESPACE_NAME_LABEL;

use super::flows::{End, Flow, Observations, Seen};
use super::tiers::{AdminTiers, FlowTiers};
use super::workloads::{dns_label_chars, WorkloadId, Workloads};

/// Longest name a suggested policy gets (a DNS-1123 label, so any tool accepts it).
pub const MAX_NAME: usize = 63;

/// A suggested policy and, per rule, the flows that justify it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuggestedPolicy {
    /// In monitor mode (`netwarden.io/mode: monitor`).
    pub policy: Policy,
    /// One list per rule of `policy.ingress`, in the same order.
    pub ingress_evidence: Vec<Vec<(Flow, Seen)>>,
    /// One list per rule of `policy.egress`, in the same order.
    pub egress_evidence: Vec<Vec<(Flow, Seen)>>,
    /// Per direction the policy isolates, the Baseline policies that stop applying there
    /// (the Baseline tier is consulted only where no namespaced policy isolates, SPEC 8).
    pub baseline: Vec<(Direction, Vec<AdminRef>)>,
}

/// An observed flow the Admin tier decides for some of its pod pairs or views (SPEC 8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminDecided {
    pub flow: Flow,
    pub seen: Seen,
    pub tiers: FlowTiers,
    /// For a denied flow: the sides a suggestion isolates with no rule for it (the Admin tier
    /// leaving them to the namespaced tier), which refuse it too.
    pub refused_too: Vec<Direction>,
}

/// A flow the requested kind cannot allow, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unexpressible {
    pub flow: Flow,
    pub seen: Seen,
    pub reason: &'static str,
}

/// The policies suggested for one kind, sorted by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suggestion {
    pub kind: PolicyKind,
    pub policies: Vec<SuggestedPolicy>,
    pub unexpressible: Vec<Unexpressible>,
    /// Flows the Admin tier decides, denied or not, sorted.
    pub admin: Vec<AdminDecided>,
}

/// The part of a workload one policy covers: the whole workload, or (MultiNetworkPolicy) its
/// interfaces on one network.
type Unit = (WorkloadId, Option<NetworkId>);

/// Which unit of `kind` a flow on `network` belongs to, or why `kind` cannot express it.
fn unit_network(kind: PolicyKind, network: &NetworkId) -> Result<Option<NetworkId>, &'static str> {
    match (kind, network) {
        (PolicyKind::NetworkPolicy, NetworkId::Primary) => Ok(None),
        (PolicyKind::NetworkPolicy, _) => {
            Err("a NetworkPolicy covers the primary network only (use --kind MultiNetworkPolicy or DanmNetworkPolicy)")
        }
        (PolicyKind::DanmNetworkPolicy, _) => Ok(None),
        (
            PolicyKind::MultiNetworkPolicy,
            NetworkId::Named {
                kind: NetworkType::NetworkAttachmentDefinition,
                ..
            },
        ) => Ok(Some(network.clone())),
        (PolicyKind::MultiNetworkPolicy, NetworkId::Primary) => {
            Err("a MultiNetworkPolicy names secondary networks only (use --kind NetworkPolicy for the primary network)")
        }
        (PolicyKind::MultiNetworkPolicy, NetworkId::Named { .. }) => {
            Err("policy-for names NetworkAttachmentDefinitions only (use --kind DanmNetworkPolicy for DANM networks)")
        }
    }
}

/// A rule's peer: the other end, and for DanmNetworkPolicy the secondary network it is on.
type PeerKey = (End, Option<NetworkId>);

/// The rules of one direction of one unit being built: peer → (protocol, port) → flow.
type Rules = BTreeMap<PeerKey, BTreeMap<(Protocol, u16), (PolicyPort, Flow, Seen)>>;

#[derive(Default)]
struct UnitRules {
    ingress: Option<Rules>,
    egress: Option<Rules>,
}

/// The policies of `kind` that allow every flow of `observations` on the units that logged,
/// but for what the Admin tier decides (`tiers`; [`AdminTiers::default`] without admin
/// policies).
pub fn suggest(
    workloads: &Workloads,
    observations: &Observations,
    tiers: &AdminTiers,
    kind: PolicyKind,
) -> Suggestion {
    // Units and the directions they isolate: those their workload logged in.
    let mut units: BTreeMap<Unit, UnitRules> = BTreeMap::new();
    for (workload, direction, network) in &observations.watched {
        let Ok(net) = unit_network(kind, network) else {
            continue;
        };
        let unit = units.entry((*workload, net)).or_default();
        match direction {
            Direction::Ingress => unit.ingress.get_or_insert_with(Rules::new),
            Direction::Egress => unit.egress.get_or_insert_with(Rules::new),
        };
    }

    let mut unexpressible = Vec::new();
    let mut admin = Vec::new();
    for (flow, seen) in observations.sorted_flows() {
        let decided = tiers.flows.get(flow);
        if let Some(t) = decided {
            // No namespaced rule can allow what the Admin tier denies: none is written, so a
            // side the suggestion isolates (and the Admin tier leaves to it) refuses the flow
            // too, and says so in would-deny events while it is monitored.
            let refused_too = if t.denied {
                let net = unit_network(kind, &flow.network).ok();
                [
                    (flow.src, Direction::Egress),
                    (flow.dst, Direction::Ingress),
                ]
                .into_iter()
                .filter(|(own, direction)| {
                    let End::Workload(own) = own else {
                        return false;
                    };
                    let unit = net.as_ref().and_then(|n| units.get(&(*own, n.clone())));
                    !t.settled.contains(direction)
                        && unit.is_some_and(|u| match direction {
                            Direction::Ingress => u.ingress.is_some(),
                            Direction::Egress => u.egress.is_some(),
                        })
                })
                .map(|(_, direction)| direction)
                .collect()
            } else {
                Vec::new()
            };
            admin.push(AdminDecided {
                flow: flow.clone(),
                seen: *seen,
                tiers: t.clone(),
                refused_too,
            });
            if t.denied {
                continue;
            }
        }
        let net = match unit_network(kind, &flow.network) {
            Ok(net) => net,
            Err(reason) => {
                unexpressible.push(Unexpressible {
                    flow: flow.clone(),
                    seen: *seen,
                    reason,
                });
                continue;
            }
        };
        let peer_network = (kind == PolicyKind::DanmNetworkPolicy && !flow.network.is_primary())
            .then(|| flow.network.clone());
        let port = policy_port(workloads, flow);
        // Ingress at the destination, egress at the source, where the suggestion isolates.
        let sides = [
            (flow.dst, flow.src, Direction::Ingress),
            (flow.src, flow.dst, Direction::Egress),
        ];
        for (own, other, direction) in sides {
            let End::Workload(own) = own else { continue };
            // A side the Admin tier decides never reaches a namespaced rule.
            if decided.is_some_and(|t| t.settled.contains(&direction)) {
                continue;
            }
            let Some(unit) = units.get_mut(&(own, net.clone())) else {
                continue;
            };
            let rules = match direction {
                Direction::Ingress => unit.ingress.as_mut(),
                Direction::Egress => unit.egress.as_mut(),
            };
            if let Some(rules) = rules {
                rules
                    .entry((other, peer_network.clone()))
                    .or_default()
                    .insert(
                        (flow.protocol, flow.port),
                        (port.clone(), flow.clone(), *seen),
                    );
            }
        }
    }

    let mut policies: Vec<SuggestedPolicy> = units
        .into_iter()
        .map(|((id, net), rules)| {
            let workload = workloads.get(id);
            let (ingress, ingress_evidence) = finish(workloads, &workload.namespace, rules.ingress);
            let (egress, egress_evidence) = finish(workloads, &workload.namespace, rules.egress);
            // The networks the policy covers, for the Baseline note.
            let networks: Vec<NetworkId> = match &net {
                Some(network) => vec![network.clone()],
                None if kind == PolicyKind::NetworkPolicy => vec![NetworkId::Primary],
                None => workloads.networks_of(id),
            };
            let baseline = [
                (Direction::Ingress, ingress.is_some()),
                (Direction::Egress, egress.is_some()),
            ]
            .into_iter()
            .filter(|(_, isolated)| *isolated)
            .map(|(d, _)| (d, tiers.baseline_of(id, d, networks.iter())))
            .filter(|(_, names)| !names.is_empty())
            .collect();
            let name = match &net {
                None => format!("suggested-{}", workload.name),
                Some(network) => format!(
                    "suggested-{}-{}",
                    workload.name,
                    network_name(network, &workload.namespace)
                ),
            };
            SuggestedPolicy {
                policy: Policy {
                    kind,
                    key: ObjectKey::new(workload.namespace.clone(), fit_name(&name)),
                    pod_selector: workload.selector.clone(),
                    ingress,
                    egress,
                    scope: match (kind, net) {
                        (PolicyKind::NetworkPolicy, _) => PolicyScope::Primary,
                        (PolicyKind::DanmNetworkPolicy, _) => PolicyScope::AllInterfaces,
                        (PolicyKind::MultiNetworkPolicy, net) => {
                            PolicyScope::Networks(net.into_iter().collect())
                        }
                    },
                    mode: Mode::Monitor,
                    replaces: None,
                    log_denies: false,
                },
                ingress_evidence,
                egress_evidence,
                baseline,
            }
        })
        .collect();
    policies.sort_by(|a, b| a.policy.key.cmp(&b.policy.key));
    Suggestion {
        kind,
        policies,
        unexpressible,
        admin,
    }
}

/// The rules of one direction (one per peer, ports sorted) and their evidence; `None` when the
/// direction is not isolated.
#[allow(clippy::type_complexity)]
fn finish(
    workloads: &Workloads,
    namespace: &str,
    rules: Option<Rules>,
) -> (Option<Vec<PolicyRule>>, Vec<Vec<(Flow, Seen)>>) {
    let Some(rules) = rules else {
        return (None, Vec::new());
    };
    let mut out = Vec::new();
    let mut evidence = Vec::new();
    for ((end, network), ports) in rules {
        let mut rule_ports = Vec::new();
        let mut flows = Vec::new();
        for (port, flow, seen) in ports.into_values() {
            // Two numbers of one workload can share no name, so ports never repeat.
            rule_ports.push(port);
            flows.push((flow, seen));
        }
        out.push(PolicyRule {
            peers: vec![peer(workloads, end, network.as_ref(), namespace)],
            ports: rule_ports,
        });
        evidence.push(flows);
    }
    (Some(out), evidence)
}

/// The peer for `end` in a policy of `namespace` (see the module doc).
fn peer(workloads: &Workloads, end: End, network: Option<&NetworkId>, namespace: &str) -> Peer {
    match end {
        End::Address(ip) => Peer::IpBlock(IpBlock {
            cidr: IpNet::from(ip),
            except: Vec::new(),
        }),
        End::Workload(id) => {
            let w = workloads.get(id);
            Peer::Pods {
                pod_selector: Some(w.selector.clone()),
                namespace_selector: (w.namespace != namespace).then(|| LabelSelector {
                    match_labels: [(NAMESPACE_NAME_LABEL.to_owned(), w.namespace.clone())].into(),
                    match_expressions: Vec::new(),
                }),
                network_selector: network.and_then(network_entry).map(|e| vec![e]),
            }
        }
    }
}

/// The `networkSelector` entry naming `network`.
fn network_entry(network: &NetworkId) -> Option<NetworkSelectorEntry> {
    let NetworkId::Named {
        kind,
        namespace,
        name,
    } = network
    else {
        return None;
    };
    Some(NetworkSelectorEntry {
        kind: *kind,
        // DanmNet and TenantNetwork are named relative to the pod owning the interface.
        namespace: (*kind == NetworkType::NetworkAttachmentDefinition)
            .then(|| namespace.clone())
            .flatten(),
        name: name.clone(),
    })
}

/// The destination's port name when every replica declares this port under one name.
fn policy_port(workloads: &Workloads, flow: &Flow) -> PolicyPort {
    let named = match flow.dst {
        End::Workload(id) => workloads
            .get(id)
            .named_ports
            .get(&(flow.protocol, flow.port))
            .cloned(),
        End::Address(_) => None,
    };
    PolicyPort {
        protocol: flow.protocol,
        port: Some(named.map_or(PortRef::Number(flow.port), PortRef::Named)),
        end_port: None,
    }
}

/// A network's part of a policy name: its name, prefixed by its namespace when that is not the
/// policy's.
fn network_name(network: &NetworkId, namespace: &str) -> String {
    match network {
        NetworkId::Primary => "default".to_owned(),
        NetworkId::Named {
            namespace: Some(ns),
            name,
            ..
        } if ns != namespace => dns_label_chars(&format!("{ns}-{name}")),
        NetworkId::Named { name, .. } => dns_label_chars(name),
    }
}

/// `name` if it fits [`MAX_NAME`]; else its head and the hash of the whole name, so that two
/// long names sharing a head still differ.
pub fn fit_name(name: &str) -> String {
    if name.len() <= MAX_NAME {
        return name.to_owned();
    }
    let hash = format!("{:08x}", hash_bytes(name.as_bytes()) as u32);
    let head = name[..MAX_NAME - hash.len() - 1].trim_end_matches('-');
    format!("{head}-{hash}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_cut_with_a_hash() {
        assert_eq!(fit_name("suggested-web"), "suggested-web");
        let long = format!("suggested-{}", "a".repeat(80));
        let other = format!("suggested-{}b", "a".repeat(80));
        let (x, y) = (fit_name(&long), fit_name(&other));
        assert_eq!(x.len(), MAX_NAME);
        assert_ne!(x, y);
        assert!(
            netwarden_manifest::validate::dns1123_label(&x).is_ok(),
            "{x}"
        );
    }
}
