//! The admin policies' tiers in the engine (SPEC 8): feeding admin policies and Nodes, which
//! pods their changes make dirty, and each pod interface's Admin and Baseline rules
//! ([`TierRules`]), resolved to address sets like section 3's rules.
//!
//! The peers' address sets are cached per (policy, direction, rule): a subject pod's rules
//! reuse them, so a `namespaces: {}` subject costs one set per rule, not one per pod. A pod
//! change drops the sets whose peers select the pod (before or after the change) and makes the
//! subjects of those policies dirty; a namespace relabel or a Node change drops what it can
//! affect. An Allow rule's pod peers leave out the addresses two pods claim (SPEC 7), so an
//! address becoming or ceasing to be claimed twice drops the sets of the Allow rules whose
//! peers select one of its claimants. The selector sets are kept only while an admin policy
//! exists (nothing keeps them exact otherwise).

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::addrset::AddrSet;
use crate::admin::{
    AdminAction, AdminPeer, AdminPolicy, AdminPort, AdminRef, Node, PodsSelector, Tier,
};
use crate::model::{Direction, Mode, NetworkId, Pod, PodInterface, PodKey, Protocol};
use crate::rules::{Clause, PeerMatch, PortMatch, PortRange, TierOrigin, TierRule, TierRules};

use super::Engine;

/// The key of a cached tier list: the policies that apply (by the address of the engine's
/// `Arc`, stable while the list lives: any admin policy change drops every list), in order,
/// one direction, one tier. Pods that the same policies apply to share one list (all the pods
/// of a namespace, as a rule), so the rules are resolved once for them all.
pub(super) type TierListKey = (Vec<usize>, Direction, Tier);

/// A cached rule's peers: the union of their addresses, and (for an egress rule with named
/// ports, which resolve on them) the pods behind the pod peers.
#[derive(Debug)]
pub(super) struct TierPeers {
    addrs: Arc<AddrSet>,
    pods: Vec<PodKey>,
}

impl Engine {
    /// Sets an admin policy (SPEC 8); the pods it or its previous version selects are dirty.
    pub fn set_admin_policy(&mut self, policy: impl Into<Arc<AdminPolicy>>) {
        let policy: Arc<AdminPolicy> = policy.into();
        let reference = policy.reference();
        if self.admin_policies.get(&reference) == Some(&policy) {
            return;
        }
        self.remove_admin_policy(&reference);
        self.mark_admin_subjects_dirty(&policy);
        self.admin_policies.insert(reference, policy);
        self.forget_tier_lists();
    }

    /// Drops the lists of applicable policies per namespace and the resolved tier lists (an
    /// admin policy, a namespace's labels, a peer or a Node changed).
    fn forget_tier_lists(&mut self) {
        self.admin_by_namespace.clear();
        self.tier_lists.clear();
    }

    pub fn remove_admin_policy(&mut self, reference: &AdminRef) {
        let Some(old) = self.admin_policies.remove(reference) else {
            return;
        };
        self.tier_peers.retain(|(r, _, _), _| r != reference);
        self.mark_admin_subjects_dirty(&old);
        self.forget_tier_lists();
    }

    pub(super) fn has_admin_policies(&self) -> bool {
        !self.admin_policies.is_empty()
    }

    pub fn admin_policies(&self) -> impl Iterator<Item = &Arc<AdminPolicy>> {
        self.admin_policies.values()
    }

    pub fn admin_policy(&self, reference: &AdminRef) -> Option<&Arc<AdminPolicy>> {
        self.admin_policies.get(reference)
    }

    /// Sets a Node (its labels and addresses matter to `nodes` peers).
    pub fn set_node(&mut self, node: Node) {
        if self.nodes.get(&node.name).map(|n| &**n) == Some(&node) {
            return;
        }
        self.nodes.insert(node.name.clone(), Arc::new(node));
        self.node_changed();
    }

    pub fn remove_node(&mut self, name: &str) {
        if self.nodes.remove(name).is_some() {
            self.node_changed();
        }
    }

    pub fn nodes(&self) -> impl Iterator<Item = &Arc<Node>> {
        self.nodes.values()
    }

    /// The pods an admin policy applies to: its subject, with an interface it covers, never
    /// host-network pods.
    pub fn admin_subjects(&self, policy: &AdminPolicy) -> Vec<PodKey> {
        self.pods_selected(&policy.subject)
            .into_iter()
            .filter(|pod| pod.interfaces.iter().any(|i| policy.covers_interface(i)))
            .map(|pod| pod.key.clone())
            .collect()
    }

    /// The pods (never host-network ones) `selector` selects, in key order.
    fn pods_selected(&self, selector: &PodsSelector) -> Vec<&Pod> {
        let namespaces: Vec<&String> = self
            .pods_by_namespace
            .keys()
            .filter(|ns| selector.namespaces.matches(&self.namespace_labels_ref(ns)))
            .collect();
        namespaces
            .into_iter()
            .flat_map(|ns| self.candidates_in(ns, &selector.pods))
            .filter(|pod| !pod.host_network && selector.pods.matches(&pod.labels))
            .collect()
    }

    fn mark_admin_subjects_dirty(&mut self, policy: &AdminPolicy) {
        // Every pod dirty already (the cluster being fed before its first computation): no
        // subject to look for. 200 admin policies selecting whole namespaces evaluated their
        // subjects against 100,000 pods for nothing (9% of that first computation).
        if self.every_pod_dirty {
            return;
        }
        let mut policies = vec![policy];
        // A monitored policy replacing another changes the staged view of the other's pods.
        let other = policy.replaces.as_ref().and_then(|replaced| {
            self.admin_policies
                .get(&AdminRef {
                    kind: policy.kind,
                    name: replaced.clone(),
                })
                .cloned()
        });
        policies.extend(other.as_deref());
        let mut subjects = Vec::new();
        for policy in policies {
            // Pods already dirty (every pod while the cluster is first fed) are not copied
            // again: a whole-namespace subject names thousands.
            subjects.extend(
                self.pods_selected(&policy.subject)
                    .into_iter()
                    .filter(|pod| !self.dirty.contains(&pod.key))
                    .filter(|pod| pod.interfaces.iter().any(|i| policy.covers_interface(i)))
                    .map(|pod| pod.key.clone()),
            );
        }
        self.dirty.extend(subjects);
    }

    /// Drops the cached peers of the admin rules `stale` names, marking their subjects dirty.
    fn invalidate_tiers(&mut self, stale: BTreeSet<AdminRef>) {
        if stale.is_empty() {
            return;
        }
        self.tier_peers.retain(|(r, _, _), _| !stale.contains(r));
        self.forget_tier_lists();
        for reference in stale {
            if let Some(policy) = self.admin_policies.get(&reference).cloned() {
                self.mark_admin_subjects_dirty(&policy);
            }
        }
    }

    /// A pod changed in a way other pods can see: the admin rules whose pod peers select it
    /// (before or after) are stale.
    pub(super) fn admin_pod_changed(&mut self, old: Option<&Pod>, new: Option<&Pod>) {
        if self.admin_policies.is_empty() {
            // Nothing follows the pods now: the selector sets the removed policies left
            // would go stale, and a later policy naming the same selector would find them.
            self.selector_addrs.clear();
            return;
        }
        let versions: Vec<(&Pod, crate::labels::Labels)> = old
            .into_iter()
            .chain(new)
            .filter(|pod| !pod.host_network)
            .map(|pod| (pod, self.namespace_labels(&pod.key.namespace)))
            .collect();
        self.selector_addrs.retain(|(selector, _), _| {
            !versions
                .iter()
                .any(|(pod, ns_labels)| selector.matches(ns_labels, &pod.labels))
        });
        let stale = self.policies_selecting(&versions, |_| true);
        self.invalidate_tiers(stale);
    }

    /// A namespace's labels changed: every admin policy may select other pods now, as
    /// subjects or as peers.
    pub(super) fn admin_namespace_changed(&mut self, namespace: &str) {
        if self.admin_policies.is_empty() {
            // As for a pod change: no stale selector set may outlive the policies.
            self.selector_addrs.clear();
            return;
        }
        // Its pods may have become or stopped being subjects, or peers.
        self.dirty_namespace_pods(namespace);
        self.selector_addrs.clear();
        let all: BTreeSet<AdminRef> = self.admin_policies.keys().cloned().collect();
        self.invalidate_tiers(all);
    }

    fn node_changed(&mut self) {
        let stale: BTreeSet<AdminRef> = self
            .admin_policies
            .values()
            .filter(|p| {
                p.egress
                    .iter()
                    .flat_map(|r| &r.peers)
                    .any(|peer| matches!(peer, AdminPeer::Nodes(_)))
            })
            .map(|p| p.reference())
            .collect();
        self.invalidate_tiers(stale);
    }

    /// The Admin or Baseline rules of one direction of `iface` of `pod`, per view.
    pub(super) fn tier_rules(
        &mut self,
        pod: &Pod,
        iface: &PodInterface,
        direction: Direction,
        tier: Tier,
    ) -> TierRules {
        if pod.host_network || self.admin_policies.is_empty() {
            return TierRules::default();
        }
        let applicable: Vec<Arc<AdminPolicy>> = self
            .admin_for_namespace(&pod.key.namespace)
            .iter()
            .filter(|p| {
                p.tier == tier
                    && !p.rules(direction).is_empty()
                    && p.subject.pods.matches(&pod.labels)
                    && p.covers_interface(iface)
            })
            .cloned()
            .collect();
        if applicable.is_empty() {
            return TierRules::default();
        }
        // Named ports of ingress rules resolve on this pod: its list is its own.
        let shared = direction == Direction::Egress
            || !applicable.iter().any(|p| {
                p.ingress
                    .iter()
                    .flat_map(|r| r.ports.iter().flatten())
                    .any(|port| matches!(port, AdminPort::Named(_)))
            });
        let key: Option<TierListKey> = shared.then(|| {
            (
                applicable.iter().map(|p| Arc::as_ptr(p) as usize).collect(),
                direction,
                tier,
            )
        });
        if let Some(found) = key.as_ref().and_then(|k| self.tier_lists.get(k)) {
            return found.clone();
        }
        // Enforced policies a monitored one replaces leave the staged view.
        let replaced: BTreeSet<AdminRef> = self
            .admin_policies
            .values()
            .filter(|p| p.mode == Mode::Monitor)
            .filter_map(|p| {
                p.replaces.as_ref().map(|name| AdminRef {
                    kind: p.kind,
                    name: name.clone(),
                })
            })
            .collect();
        let staged_differs = applicable
            .iter()
            .any(|p| p.mode == Mode::Monitor || replaced.contains(&p.reference()));
        let mut enforced = Vec::new();
        let mut staged = Vec::new();
        for policy in applicable {
            let rules = self.resolve_tier_rules(&policy, direction, pod);
            match policy.mode {
                Mode::Enforce => {
                    if staged_differs && !replaced.contains(&policy.reference()) {
                        staged.extend(rules.iter().cloned());
                    }
                    enforced.extend(rules);
                }
                Mode::Monitor => staged.extend(rules),
            }
        }
        let enforced: Arc<[TierRule]> = enforced.into();
        let rules = TierRules {
            staged: if staged_differs {
                staged.into()
            } else {
                enforced.clone()
            },
            enforced,
        };
        if let Some(key) = key {
            self.tier_lists.insert(key, rules.clone());
        }
        rules
    }

    /// The admin policies whose subject's namespace selector selects `namespace`, in
    /// evaluation order (cached until an admin policy or a namespace's labels change).
    fn admin_for_namespace(&mut self, namespace: &str) -> Arc<[Arc<AdminPolicy>]> {
        if let Some(found) = self.admin_by_namespace.get(namespace) {
            return found.clone();
        }
        let labels = self.namespace_labels(namespace);
        let mut list: Vec<Arc<AdminPolicy>> = self
            .admin_policies
            .values()
            .filter(|p| p.subject.namespaces.matches(&labels))
            .cloned()
            .collect();
        list.sort_by(|a, b| a.order(b));
        let list: Arc<[Arc<AdminPolicy>]> = list.into();
        self.admin_by_namespace
            .insert(namespace.to_string(), list.clone());
        list
    }

    /// `policy`'s rules of `direction` for the subject `pod`.
    fn resolve_tier_rules(
        &mut self,
        policy: &AdminPolicy,
        direction: Direction,
        pod: &Pod,
    ) -> Vec<TierRule> {
        let reference = policy.reference();
        (0..policy.rules(direction).len())
            .map(|index| {
                let rule = &policy.rules(direction)[index];
                let peers = self.tier_peers(policy, direction, index);
                let clauses = match &rule.ports {
                    None => vec![Clause {
                        peers: PeerMatch::Addrs(peers.addrs.clone()),
                        ports: PortMatch::Any,
                    }],
                    Some(ports) => self.tier_port_clauses(policy, ports, &peers, direction, pod),
                };
                TierRule {
                    origin: TierOrigin {
                        policy: reference.clone(),
                        tier: policy.tier,
                        priority: policy.priority,
                        direction,
                        index,
                        name: rule.name.clone(),
                        mode: policy.mode,
                    },
                    action: rule.action,
                    clauses: clauses
                        .into_iter()
                        .filter(|c| !matches!(&c.peers, PeerMatch::Addrs(a) if a.is_empty()))
                        .collect(),
                }
            })
            .collect()
    }

    /// Clauses for a rule with `ports`: numbers and ranges apply to every peer; a named port
    /// resolves on the destination — the subject on ingress, each peer pod on egress, for the
    /// addresses it has on `policy`'s networks (peers on which it resolves to one number form
    /// one clause).
    fn tier_port_clauses(
        &self,
        policy: &AdminPolicy,
        ports: &[AdminPort],
        peers: &TierPeers,
        direction: Direction,
        pod: &Pod,
    ) -> Vec<Clause> {
        let mut numbers: Vec<PortRange> = Vec::new();
        let mut named: Vec<&str> = Vec::new();
        for port in ports {
            match port {
                AdminPort::Numbers(range) => numbers.push(*range),
                AdminPort::Named(name) => named.push(name),
            }
        }
        let resolve = |target: &Pod, name: &str| -> Vec<PortRange> {
            Protocol::ALL
                .iter()
                .filter_map(|protocol| {
                    target.named_port(name, *protocol).map(|port| PortRange {
                        protocol: *protocol,
                        ports: Some((port, port)),
                    })
                })
                .collect()
        };
        let mut clauses = Vec::new();
        if direction == Direction::Ingress {
            numbers.extend(named.iter().flat_map(|name| resolve(pod, name)));
        } else if !named.is_empty() {
            // Peer pods grouped by what the names resolve to on them.
            let networks = policy.peer_networks();
            let mut groups: std::collections::BTreeMap<Vec<PortRange>, Vec<std::net::IpAddr>> =
                Default::default();
            for key in &peers.pods {
                let Some(target) = self.pod(key) else {
                    continue;
                };
                let mut resolved: Vec<PortRange> = named
                    .iter()
                    .flat_map(|name| resolve(target, name))
                    .collect();
                if resolved.is_empty() {
                    continue;
                }
                resolved.sort();
                resolved.dedup();
                // Only the addresses the pod is a peer by: one it holds on another network
                // is another pod's there (secondary networks reuse addresses), and the
                // packet goes to that one.
                let addrs = target
                    .interfaces
                    .iter()
                    .filter(|i| networks.contains(&i.network))
                    .flat_map(|i| i.ips.iter().copied())
                    .filter(|ip| peers.addrs.contains(*ip));
                groups.entry(resolved).or_default().extend(addrs);
            }
            for (ranges, addrs) in groups {
                clauses.push(Clause {
                    peers: PeerMatch::Addrs(Arc::new(AddrSet::from_addrs(addrs))),
                    ports: PortMatch::Only(ranges),
                });
            }
        }
        if !numbers.is_empty() {
            clauses.insert(
                0,
                Clause {
                    peers: PeerMatch::Addrs(peers.addrs.clone()),
                    ports: PortMatch::Only(numbers),
                },
            );
        }
        clauses
    }

    /// The addresses on `networks` of the pods `selector` selects, shared by every admin rule
    /// that names the same selector (administrators reuse a few namespace selectors).
    fn selector_addrs(&mut self, selector: &PodsSelector, networks: &[NetworkId]) -> Arc<AddrSet> {
        let key = (selector.clone(), networks.to_vec());
        if let Some(found) = self.selector_addrs.get(&key) {
            return found.clone();
        }
        let addrs = self.pods_selected(selector).into_iter().flat_map(|pod| {
            pod.interfaces
                .iter()
                .filter(|i| networks.contains(&i.network))
                .flat_map(|i| i.ips.iter().copied())
        });
        let set = Arc::new(AddrSet::from_addrs(addrs));
        self.selector_addrs.insert(key, set.clone());
        set
    }

    /// `addrs` without the addresses two pods claim: an Allow rule's pod peers leave them
    /// out, as every allow set does (SPEC 7). A Deny or Pass keeps them: leaving one out of a
    /// Deny would open what the administrator closed.
    fn without_ambiguous(&self, addrs: Arc<AddrSet>) -> Arc<AddrSet> {
        let ambiguous = AddrSet::from_addrs(
            self.ambiguous
                .iter()
                .copied()
                .filter(|ip| addrs.contains(*ip)),
        );
        if ambiguous.is_empty() {
            addrs
        } else {
            Arc::new(addrs.difference(&ambiguous))
        }
    }

    /// Addresses of `claimants` became ambiguous or stopped being so: the Allow rules whose
    /// pod peers select one of them (they leave such addresses out) are stale.
    pub(super) fn admin_ambiguity_changed(&mut self, claimants: &[&Pod]) {
        if self.admin_policies.is_empty() {
            return;
        }
        let versions: Vec<(&Pod, crate::labels::Labels)> = claimants
            .iter()
            .copied()
            .filter(|pod| !pod.host_network)
            .map(|pod| (pod, self.namespace_labels(&pod.key.namespace)))
            .collect();
        let stale = self.policies_selecting(&versions, |rule| rule.action == AdminAction::Allow);
        self.invalidate_tiers(stale);
    }

    /// The admin policies with a rule (of those `which` keeps) whose pod peers select one of
    /// `versions` (a pod, with its namespace's labels).
    fn policies_selecting(
        &self,
        versions: &[(&Pod, crate::labels::Labels)],
        which: impl Fn(&crate::admin::AdminRule) -> bool,
    ) -> BTreeSet<AdminRef> {
        self.admin_policies
            .values()
            .filter(|policy| {
                [Direction::Ingress, Direction::Egress]
                    .iter()
                    .flat_map(|d| policy.rules(*d))
                    .filter(|rule| which(rule))
                    .flat_map(|rule| &rule.peers)
                    .any(|peer| match peer {
                        AdminPeer::Pods(selector) => versions
                            .iter()
                            .any(|(pod, ns_labels)| selector.matches(ns_labels, &pod.labels)),
                        _ => false,
                    })
            })
            .map(|policy| policy.reference())
            .collect()
    }

    /// The peers of `policy`'s rule `index` of `direction` (cached).
    fn tier_peers(
        &mut self,
        policy: &AdminPolicy,
        direction: Direction,
        index: usize,
    ) -> Arc<TierPeers> {
        let key = (policy.reference(), direction, index);
        if let Some(found) = self.tier_peers.get(&key) {
            return found.clone();
        }
        let networks = policy.peer_networks();
        let rule = &policy.rules(direction)[index];
        // The pods are kept only where a named port resolves on them (egress).
        let keep_pods = direction == Direction::Egress
            && rule
                .ports
                .iter()
                .flatten()
                .any(|port| matches!(port, AdminPort::Named(_)));
        let mut sets: Vec<Arc<AddrSet>> = Vec::new();
        let mut pods: BTreeSet<PodKey> = BTreeSet::new();
        for peer in &rule.peers {
            match peer {
                AdminPeer::Pods(selector) => {
                    if keep_pods {
                        let selected = self.pods_selected(selector);
                        pods.extend(selected.iter().map(|pod| pod.key.clone()));
                    }
                    let addrs = self.selector_addrs(selector, &networks);
                    sets.push(if rule.action == AdminAction::Allow {
                        self.without_ambiguous(addrs)
                    } else {
                        addrs
                    });
                }
                AdminPeer::Networks(cidrs) => {
                    sets.extend(cidrs.iter().map(|c| Arc::new(AddrSet::from_net(c))));
                }
                AdminPeer::Nodes(selector) => {
                    let addrs = self
                        .nodes
                        .values()
                        .filter(|node| selector.matches(&node.labels))
                        .flat_map(|node| node.addresses.iter().copied());
                    sets.push(Arc::new(AddrSet::from_addrs(addrs)));
                }
                // Matches nothing until names are resolved (SPEC 8).
                AdminPeer::DomainNames(_) => {}
            }
        }
        // One peer (the usual case): its set as it is, shared.
        let addrs = match <[Arc<AddrSet>; 1]>::try_from(sets) {
            Ok([one]) => one,
            Err(sets) => Arc::new(AddrSet::union_of(sets.iter().map(|s| &**s))),
        };
        let peers = Arc::new(TierPeers {
            addrs,
            pods: pods.into_iter().collect(),
        });
        self.tier_peers.insert(key, peers.clone());
        peers
    }
}

#[cfg(test)]
mod tests {
    use crate::admin::{AdminAction, AdminKind, AdminPeer, AdminPort, PodsSelector, Tier};
    use crate::rules::{Decision, PortRange};
    use crate::testing::*;
    use crate::{Engine, EngineOptions, PodKey, Protocol};

    /// Namespaces `a` (team=a) and `b` (team=b); pods a/x (10.0.0.1), a/y (10.0.0.2), b/z
    /// (10.0.1.1, serving `web` on TCP 8080).
    fn cluster() -> Engine {
        let mut e = Engine::new(EngineOptions::default());
        e.set_namespace(namespace("a", &[("team", "a")]));
        e.set_namespace(namespace("b", &[("team", "b")]));
        e.set_pod(pod("a", "x", &[("app", "x")], &["10.0.0.1"]));
        e.set_pod(pod("a", "y", &[("app", "y")], &["10.0.0.2"]));
        e.set_pod(with_port(
            pod("b", "z", &[("app", "z")], &["10.0.1.1"]),
            "web",
            8080,
            Protocol::Tcp,
        ));
        e
    }

    fn ingress_of(e: &mut Engine, ns: &str, name: &str) -> crate::rules::DirectionRules {
        e.pod_rules(&PodKey::new(ns, name)).unwrap().interfaces[0]
            .ingress
            .clone()
    }

    fn allowed(rules: &crate::rules::DirectionRules, from: &str, port: u16) -> bool {
        rules
            .decide(false, from.parse().unwrap(), Protocol::Tcp, port)
            .allowed()
    }

    #[test]
    fn admin_deny_beats_a_network_policy_allow_and_pass_hands_over() {
        let mut e = cluster();
        // b's pods allow everything from anywhere (namespaced tier).
        e.set_policy(netpol(
            "b",
            "all",
            selector(&[]),
            Some(vec![rule(vec![], vec![])]),
            None,
        ));
        let deny_a = admin_policy(
            AdminKind::AdminNetworkPolicy,
            "deny-a",
            10,
            in_namespaces(&[("team", "b")]),
            vec![admin_rule(
                AdminAction::Deny,
                vec![AdminPeer::Pods(in_namespaces(&[("team", "a")]))],
                None,
            )],
            vec![],
        );
        e.set_admin_policy(deny_a.clone());
        let z = ingress_of(&mut e, "b", "z");
        assert!(!allowed(&z, "10.0.0.1", 80));
        assert!(matches!(
            z.decide(false, "10.0.0.1".parse().unwrap(), Protocol::Tcp, 80),
            Decision::Admin(_)
        ));
        // A Pass at a lower priority number from a/x hands it to the namespaced tier.
        let pass_x = admin_policy(
            AdminKind::ClusterNetworkPolicy,
            "pass-x",
            5,
            in_namespaces(&[("team", "b")]),
            vec![admin_rule(
                AdminAction::Pass,
                vec![AdminPeer::Pods(PodsSelector {
                    namespaces: selector(&[]),
                    pods: selector(&[("app", "x")]),
                })],
                None,
            )],
            vec![],
        );
        e.set_admin_policy(pass_x);
        let z = ingress_of(&mut e, "b", "z");
        assert!(
            allowed(&z, "10.0.0.1", 80),
            "passed, then allowed by the NetworkPolicy"
        );
        assert!(!allowed(&z, "10.0.0.2", 80), "still denied");
        // Without the NetworkPolicy, the pass goes on to Baseline, then default allow.
        e.remove_policy(&netpol("b", "all", selector(&[]), None, None).reference());
        let mut baseline = admin_policy(
            AdminKind::BaselineAdminNetworkPolicy,
            "default",
            0,
            in_namespaces(&[]),
            vec![admin_rule(
                AdminAction::Deny,
                vec![AdminPeer::Pods(in_namespaces(&[]))],
                None,
            )],
            vec![],
        );
        e.set_admin_policy(baseline.clone());
        let z = ingress_of(&mut e, "b", "z");
        assert!(
            !allowed(&z, "10.0.0.1", 80),
            "the baseline denies what passed"
        );
        assert!(matches!(
            z.decide(false, "10.0.0.1".parse().unwrap(), Protocol::Tcp, 80),
            Decision::Baseline(_)
        ));
        // Monitored, the baseline leaves enforcement alone and shows in the staged view.
        baseline.mode = crate::Mode::Monitor;
        e.set_admin_policy(baseline);
        let z = ingress_of(&mut e, "b", "z");
        assert!(allowed(&z, "10.0.0.1", 80));
        assert!(!z
            .decide(true, "10.0.0.1".parse().unwrap(), Protocol::Tcp, 80)
            .allowed());
        assert!(z.has_monitor());
        assert_eq!(z.baseline.enforced.len(), 0);
        assert_eq!(z.baseline.staged[0].origin.tier, Tier::Baseline);
        // Would-denies name it and say why.
        assert_eq!(z.staged_cause(), crate::rules::StagedCause::AdminTier);
        assert_eq!(
            z.monitored_admin()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["BaselineAdminNetworkPolicy/default"]
        );
    }

    #[test]
    fn priorities_order_policies_and_rules_keep_their_order() {
        let mut e = cluster();
        let subject = in_namespaces(&[("team", "b")]);
        let from_a = || vec![AdminPeer::Pods(in_namespaces(&[("team", "a")]))];
        e.set_admin_policy(admin_policy(
            AdminKind::AdminNetworkPolicy,
            "later",
            20,
            subject.clone(),
            vec![admin_rule(AdminAction::Allow, from_a(), None)],
            vec![],
        ));
        e.set_admin_policy(admin_policy(
            AdminKind::ClusterNetworkPolicy,
            "first",
            10,
            subject,
            vec![
                admin_rule(
                    AdminAction::Allow,
                    from_a(),
                    Some(vec![AdminPort::Numbers(PortRange {
                        protocol: Protocol::Tcp,
                        ports: Some((8000, 8100)),
                    })]),
                ),
                admin_rule(AdminAction::Deny, from_a(), None),
            ],
            vec![],
        ));
        let z = ingress_of(&mut e, "b", "z");
        assert!(allowed(&z, "10.0.0.1", 8080), "the range allows");
        assert!(
            !allowed(&z, "10.0.0.1", 9000),
            "the second rule of the first policy denies"
        );
        assert!(allowed(&z, "10.9.9.9", 9000), "not a peer: default allow");
    }

    #[test]
    fn named_ports_resolve_on_the_destination_and_changes_reach_subjects() {
        let mut e = cluster();
        // Egress of a's pods: deny to b's pods on the port named `web`.
        e.set_admin_policy(admin_policy(
            AdminKind::AdminNetworkPolicy,
            "no-web",
            1,
            in_namespaces(&[("team", "a")]),
            vec![],
            vec![admin_rule(
                AdminAction::Deny,
                vec![AdminPeer::Pods(in_namespaces(&[("team", "b")]))],
                Some(vec![AdminPort::Named("web".into())]),
            )],
        ));
        let egress = |e: &mut Engine| {
            e.pod_rules(&PodKey::new("a", "x")).unwrap().interfaces[0]
                .egress
                .clone()
        };
        let x = egress(&mut e);
        let to = |r: &crate::rules::DirectionRules, ip: &str, port| {
            r.decide(false, ip.parse().unwrap(), Protocol::Tcp, port)
                .allowed()
        };
        assert!(!to(&x, "10.0.1.1", 8080));
        assert!(to(&x, "10.0.1.1", 8081));
        e.take_dirty();
        // A new pod in b is a peer at once: a's pods are recomputed.
        e.set_pod(with_port(
            pod("b", "w", &[], &["10.0.1.2"]),
            "web",
            9090,
            Protocol::Tcp,
        ));
        let dirty = e.take_dirty();
        assert!(dirty.contains(&PodKey::new("a", "x")), "{dirty:?}");
        let x = egress(&mut e);
        assert!(!to(&x, "10.0.1.2", 9090));
        assert!(
            to(&x, "10.0.1.2", 8080),
            "the name resolves per destination"
        );
        // Relabelling namespace b takes its pods out of the peers.
        e.set_namespace(namespace("b", &[("team", "c")]));
        let x = egress(&mut e);
        assert!(to(&x, "10.0.1.1", 8080));
    }

    #[test]
    fn nodes_peers_match_node_addresses_never_pods() {
        let mut e = cluster();
        e.set_admin_policy(admin_policy(
            AdminKind::ClusterNetworkPolicy,
            "no-nodes",
            1,
            in_namespaces(&[]),
            vec![],
            vec![admin_rule(
                AdminAction::Deny,
                vec![AdminPeer::Nodes(selector(&[]))],
                None,
            )],
        ));
        e.set_node(crate::admin::Node {
            name: "n1".into(),
            labels: labels(&[]),
            addresses: vec!["192.168.0.1".parse().unwrap()],
        });
        let x = e.pod_rules(&PodKey::new("a", "x")).unwrap().interfaces[0]
            .egress
            .clone();
        let to = |ip: &str| {
            x.decide(false, ip.parse().unwrap(), Protocol::Tcp, 80)
                .allowed()
        };
        assert!(!to("192.168.0.1"));
        assert!(to("10.0.1.1"));
    }

    /// Egress of a/x to `ip`, TCP `port`, in the enforced view.
    fn x_may_reach(e: &mut Engine, ip: &str, port: u16) -> bool {
        e.pod_rules(&PodKey::new("a", "x")).unwrap().interfaces[0]
            .egress
            .decide(false, ip.parse().unwrap(), Protocol::Tcp, port)
            .allowed()
    }

    /// Found by the fuzzer: an admin Allow let an address two pods claim through (SPEC 7 keeps
    /// it out of every allow set), and the pods whose peers it joins or leaves when the second
    /// claim comes or goes must be recomputed. A Deny keeps it (fail closed).
    #[test]
    fn an_address_two_pods_claim_is_no_admin_allow_but_stays_denied() {
        let mut e = cluster();
        let to_b = |action| {
            admin_policy(
                AdminKind::AdminNetworkPolicy,
                "to-b",
                1,
                in_namespaces(&[("team", "a")]),
                vec![],
                vec![
                    admin_rule(
                        action,
                        vec![AdminPeer::Pods(in_namespaces(&[("team", "b")]))],
                        None,
                    ),
                    admin_rule(
                        AdminAction::Deny,
                        vec![AdminPeer::Networks(vec!["0.0.0.0/0".parse().unwrap()])],
                        None,
                    ),
                ],
            )
        };
        e.set_admin_policy(to_b(AdminAction::Allow));
        assert!(x_may_reach(&mut e, "10.0.1.1", 80));
        e.take_dirty();
        // A pod of namespace a (no peer of the rule) claims b/z's address too.
        e.set_pod(pod("a", "dup", &[], &["10.0.1.1"]));
        assert!(e.take_dirty().contains(&PodKey::new("a", "x")));
        assert!(
            !x_may_reach(&mut e, "10.0.1.1", 80),
            "ambiguous: not allowed"
        );
        e.remove_pod(&PodKey::new("a", "dup"));
        assert!(e.take_dirty().contains(&PodKey::new("a", "x")));
        assert!(x_may_reach(&mut e, "10.0.1.1", 80), "one claim again");
        // As a Deny, the rule keeps the address while it is ambiguous.
        e.set_admin_policy(to_b(AdminAction::Deny));
        e.set_pod(pod("a", "dup", &[], &["10.0.1.1"]));
        let rules = e.pod_rules(&PodKey::new("a", "x")).unwrap();
        let first = &rules.interfaces[0].egress.admin.enforced[0];
        assert_eq!(first.action, AdminAction::Deny);
        assert!(first.matches("10.0.1.1".parse().unwrap(), Protocol::Tcp, 80));
    }

    /// Found by the fuzzer: an egress named port resolved on a peer pod for an address it
    /// holds on another network than the policy's (where that address is another pod's).
    #[test]
    fn an_egress_named_port_resolves_on_the_peer_by_its_address_on_the_policy_network() {
        let net1 = crate::NetworkId::nad("a", "net1");
        let net2 = crate::NetworkId::nad("a", "net2");
        let mut e = Engine::new(EngineOptions::default());
        e.set_namespace(namespace("a", &[("team", "a")]));
        e.set_pod(with_interface(
            pod("a", "x", &[("app", "x")], &["10.0.0.1"]),
            "net1",
            net1.clone(),
            &["192.168.0.1"],
        ));
        // a/y holds 192.168.0.2 on net1 and serves `web`; a/w holds the same address on
        // net2 and serves `web` on another port.
        e.set_pod(with_port(
            with_interface(
                pod("a", "y", &[("app", "y")], &["10.0.0.2"]),
                "net1",
                net1.clone(),
                &["192.168.0.2"],
            ),
            "web",
            8080,
            Protocol::Tcp,
        ));
        e.set_pod(with_port(
            with_interface(
                pod("a", "w", &[("app", "w")], &["10.0.0.3"]),
                "net2",
                net2,
                &["192.168.0.2"],
            ),
            "web",
            9090,
            Protocol::Tcp,
        ));
        let mut no_web = admin_policy(
            AdminKind::AdminNetworkPolicy,
            "no-web",
            1,
            in_namespaces(&[("team", "a")]),
            vec![],
            vec![admin_rule(
                AdminAction::Deny,
                vec![AdminPeer::Pods(in_namespaces(&[("team", "a")]))],
                Some(vec![AdminPort::Named("web".into())]),
            )],
        );
        no_web.scope = crate::PolicyScope::Networks(vec![net1]);
        e.set_admin_policy(no_web);
        let rules = e.pod_rules(&PodKey::new("a", "x")).unwrap();
        let egress = &rules.interface("net1").unwrap().egress;
        let to = |port| {
            egress
                .decide(false, "192.168.0.2".parse().unwrap(), Protocol::Tcp, port)
                .allowed()
        };
        assert!(!to(8080), "a/y's port, a/y's address on net1");
        assert!(to(9090), "a/w's port: a/w is not at 192.168.0.2 on net1");
    }

    /// Found by the fuzzer: with every admin policy gone, pod changes no longer updated the
    /// cached selector sets, and a later policy with the same selector used a stale one.
    #[test]
    fn selector_sets_do_not_outlive_the_admin_policies() {
        let mut e = cluster();
        let deny_b = admin_policy(
            AdminKind::AdminNetworkPolicy,
            "deny-b",
            1,
            in_namespaces(&[("team", "a")]),
            vec![],
            vec![admin_rule(
                AdminAction::Deny,
                vec![AdminPeer::Pods(in_namespaces(&[("team", "b")]))],
                None,
            )],
        );
        e.set_admin_policy(deny_b.clone());
        assert!(!x_may_reach(&mut e, "10.0.1.1", 80));
        e.remove_admin_policy(&deny_b.reference());
        e.set_pod(pod("b", "new", &[], &["10.0.1.9"]));
        e.set_admin_policy(deny_b);
        assert!(
            !x_may_reach(&mut e, "10.0.1.9", 80),
            "the new pod of b is a peer"
        );
    }
}
