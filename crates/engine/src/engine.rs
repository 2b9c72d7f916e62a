//! The engine: indexes of the cluster's objects, a cache of resolved rules shared by every pod
//! a policy selects, and dirty tracking so that one object's change recomputes only the pods it
//! affects.
//!
//! Feeding follows the index pattern: `set_*` / `remove_*` per object, which never fail (objects
//! were validated at the edge). `take_dirty` then names the pods whose rules may have changed,
//! and `pod_rules` computes them.
//!
//! How a change finds what it affects (issue 8, "incremental at cluster scale"):
//! - Only **cached** rules can be stale. Computing a pod caches every rule it uses, and a
//!   cached rule leaves the cache only with the pods using it marked dirty; so a rule not in
//!   the cache is held by no pod that has not already been named, and a change need not look
//!   at it (a policy whose targets were never computed, such as another node's, costs
//!   nothing).
//! - A pod change compares the pod's contribution to each cached rule before and after (the
//!   addresses a peer takes from it, the named ports it resolves) and drops the rules where it
//!   differs. A change that other pods cannot see (netns, interface names) dirties only the pod.
//! - A Service is kept with its endpoints resolved ([`ServiceEntry`]). A Service change, or a
//!   pod change that changes a Service's resolved endpoints, compares that Service's virtual
//!   IP contribution to each cached egress rule before and after (SPEC 3.2) and drops only the
//!   rules where it differs.
//! - A dropped rule marks dirty the pods that use it: the policy's targets with an interface
//!   the policy covers.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

mod tiers;

use crate::addrset::AddrSet;
use crate::admin::{AdminPolicy, AdminRef, Node, Tier};
use crate::labelindex::{Candidates, LabelIndex};
use crate::model::*;
use crate::peersets::{PeerSetId, PeerSetKey, PeerSets};
use crate::rules::*;
use crate::selectorindex::{Reach, SelectorIndex};
use crate::sorted::{insert_sorted, remove_sorted};

/// Where outgoing DNS (TCP/UDP 53) is allowed without a rule (SPEC 3.1, `--dns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DnsMode {
    /// Seed 004's rule for DanmNetworkPolicy: allowed on an interface that a
    /// DanmNetworkPolicy isolates in egress. NetworkPolicy and MultiNetworkPolicy keep the exact
    /// Kubernetes semantics (an egress-isolated pod reaches nothing its rules do not allow).
    #[default]
    Danm,
    /// Allowed on every egress-isolated interface, whatever isolates it.
    All,
    /// Never implied: DNS needs a rule like any other port.
    None,
}

impl DnsMode {
    /// Whether a view isolated by `policies` (their kinds) allows DNS without a rule.
    pub fn allows(self, mut kinds: impl Iterator<Item = PolicyKind>) -> bool {
        match self {
            DnsMode::All => true,
            DnsMode::None => false,
            DnsMode::Danm => kinds.any(|k| k == PolicyKind::DanmNetworkPolicy),
        }
    }
}

/// Switches that change what the engine computes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EngineOptions {
    /// Outgoing DNS without a rule (SPEC 3.1).
    pub dns: DnsMode,
    /// Log every enforced deny, whatever the policies' `netwarden.io/log`.
    pub log_all_denies: bool,
    /// Pods in learn mode whatever their annotations (`--learn NS/POD|NS/*`).
    pub learn: Vec<LearnSelector>,
}

/// A policy's number in the engine: the rule keys and indexes hold it instead of the
/// policy's names (copied and compared for every candidate of every pod event otherwise).
/// A number is given back when its policy is removed, and reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct PolicyId(u32);

/// A pod's number in the engine: the label index files numbers, not `namespace/name` copies,
/// and a candidate is found by number without a lookup by name. Given back when the pod goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct PodId(u32);

/// A pod-peer set of at least this many address ranges keeps a clause of its own in every rule
/// naming the peer (shared, not copied into a union per rule; see [`ResolvedRule::peers`]).
const SHARED_PEER_SET_MIN_RANGES: usize = 64;

/// Key of a policy rule in the cache and the indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct RuleKey {
    policy: PolicyId,
    direction: Direction,
    index: u32,
}

impl RuleKey {
    fn new(policy: PolicyId, direction: Direction, index: usize) -> Self {
        Self {
            policy,
            direction,
            index: u32::try_from(index).expect("fewer than 2^32 rules in a policy"),
        }
    }
}

/// The target-independent part of a resolved rule, shared by every pod the policy selects.
#[derive(Debug, Clone)]
struct ResolvedRule {
    /// The policy the rule is of, as it is now (a changed or removed policy's rules leave
    /// the cache): a change compares every cached rule without looking its policy up.
    policy: Arc<Policy>,
    /// The rule's peers (`[Any]` for a rule without peers): the union of its ipBlocks and
    /// small pod-peer sets, then each large pod-peer set on its own. Not one union of all:
    /// a large set is shared by every rule naming the peer, where a union would be a copy
    /// per rule — at 100,000 pods, thousands of copies of team-wide sets. A clause per match
    /// allows exactly what one clause with the union would.
    peers: Vec<PeerMatch>,
    /// Egress only: the clauses, named ports resolved per destination pod and Service VIPs
    /// added. Ingress rules resolve ports against the target pod instead.
    egress_clauses: Vec<Clause>,
    /// How many of `egress_clauses` come from the rule itself; the rest are Service VIPs,
    /// derived from these (what a Service change is compared against).
    egress_base: usize,
}

impl ResolvedRule {
    /// The egress clauses before Service VIPs are added.
    fn base_clauses(&self) -> &[Clause] {
        &self.egress_clauses[..self.egress_base]
    }
}

/// A Service with its endpoints resolved against the pods: everything the reachability of its
/// virtual IPs depends on (SPEC 3.2). Two entries that are equal add the same VIPs to every
/// egress rule.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ServiceEntry {
    service: Service,
    endpoints: Endpoints,
}

/// A Service's endpoints: per address, the port each of the Service's ports targets there
/// (`None`: a named target that the pod behind the address does not declare, or no pod known
/// behind it). A set, since only "does a rule allow one of them" matters.
type Endpoints = BTreeSet<(IpAddr, Vec<Option<u16>>)>;

/// What other pods' rules can see of a pod: all of it but its netns, its node and its interfaces' names
/// and prefix lengths (so a field added to [`Pod`] counts until shown otherwise). Two pods
/// with equal views change no other pod's rules.
fn peer_view(pod: &Pod) -> Pod {
    Pod {
        netns: None,
        // Which node runs a pod decides who enforces its rules, not what they allow.
        node_name: None,
        // Which incarnation of a pod runs says where its netns is, not what it allows.
        uid: None,
        // Learn mode logs the pod's own flows; peers see the same addresses either way.
        learn: false,
        interfaces: pod
            .interfaces
            .iter()
            .map(|i| PodInterface {
                name: String::new(),
                prefix_lens: Vec::new(),
                ..i.clone()
            })
            .collect(),
        ..pod.clone()
    }
}

#[derive(Debug, Default, Clone)]
pub struct Engine {
    options: EngineOptions,
    namespaces: BTreeMap<String, Namespace>,
    /// Every pod's number, in key order; the pods themselves are in `pod_slots`.
    pods: BTreeMap<PodKey, PodId>,
    /// The pods by number (`None`: a free number). Shared, so that computing a pod's rules
    /// holds it without copying it while the engine changes its caches.
    pod_slots: Vec<Option<Arc<Pod>>>,
    free_pod_ids: Vec<PodId>,
    pods_by_namespace: BTreeMap<String, BTreeSet<String>>,
    /// Pods (by number) by label per namespace: pod peers are found through it ([`LabelIndex`]).
    labels: LabelIndex<PodId>,
    /// Shared so that computing a pod borrows its policies without copying them.
    policies: BTreeMap<PolicyRef, Arc<Policy>>,
    /// Each policy's number, and the policies by number (`None`: a free number).
    policy_ids: HashMap<PolicyRef, PolicyId>,
    policies_by_id: Vec<Option<Arc<Policy>>>,
    free_policy_ids: Vec<PolicyId>,
    /// Every policy, filed by the pods its pod selector can select (its targets).
    policies_by_target: SelectorIndex<PolicyId>,
    /// Per namespace, the names of the policies that monitored policies replace, with how
    /// many replace each (an enforced policy so named leaves the staged view).
    replaced_names: HashMap<String, BTreeMap<String, usize>>,
    services: BTreeMap<ObjectKey, ServiceEntry>,
    /// Which pods hold each address, on any interface, in address order: EndpointSlice
    /// addresses resolve named target ports on the first of them (in key order), and egress
    /// named ports resolve on the pods a rule's peers hold, found by range lookups.
    /// (Sorted `Vec`s, not sets: almost every address has one holder, and a set per address
    /// cost ~700 bytes each — 8 MiB at 10,000 pods.)
    pods_by_addr: BTreeMap<IpAddr, Vec<PodKey>>,
    /// The addresses whose holders changed since [`Engine::take_address_changes`] last ran,
    /// for whoever keeps a copy of [`Engine::pods_by_address`] to follow.
    address_changes: AddressChanges,
    /// Which Services have each address among their resolved endpoints, in address order: a
    /// rule's peers, as ranges, find the Services whose VIPs they can reach without a walk
    /// over every Service.
    services_by_endpoint: BTreeMap<IpAddr, Vec<ObjectKey>>,
    cache: HashMap<RuleKey, Arc<ResolvedRule>>,
    /// The address sets of pod peers, numbered by what determines them ([`PeerSets`]): each
    /// is found once for every rule that names it. A pod change other pods can see drops
    /// the sets that held or now hold the pod; a namespace relabel drops them all.
    peer_sets: PeerSets,
    /// Each filed rule's peers' set numbers (`None` for an ipBlock), in peer order.
    rule_peer_sets: HashMap<RuleKey, Vec<Option<PeerSetId>>>,
    /// Every policy rule, filed by the pods its pod peers can select ([`SelectorIndex`]): a
    /// pod change tests only the rules (and their peer sets) that can see the pod.
    rules_by_peer: SelectorIndex<RuleKey>,
    /// Egress rules with an ipBlock peer or no peers at all: they can reach any address, so
    /// any pod's named ports and any Service's endpoints may matter to them.
    egress_unselective: BTreeSet<RuleKey>,
    /// Services with a selector, filed by the pods it can select.
    services_by_selector: SelectorIndex<ObjectKey>,
    dirty: BTreeSet<PodKey>,
    /// Every pod is in `dirty`: nothing computed and taken since the engine was made (the
    /// cluster being fed). A pod enters only through `set_pod`, which names it dirty, and
    /// `dirty` empties only when taken, so this holds until then. Marking pods dirty has
    /// nothing to look for meanwhile.
    every_pod_dirty: bool,
    /// Addresses two pods or more claim ([`Engine::is_ambiguous`]).
    ambiguous: HashSet<IpAddr>,
    /// Pods whose netns is locked down ([`Engine::set_lockdown`]), with why.
    lockdown: BTreeMap<PodKey, String>,
    /// Admin policies (SPEC 8) and the Nodes their `nodes` peers select ([`tiers`]).
    admin_policies: BTreeMap<AdminRef, Arc<AdminPolicy>>,
    nodes: BTreeMap<String, Arc<Node>>,
    /// The peers of each admin rule, by (policy, direction, rule index).
    tier_peers: HashMap<(AdminRef, Direction, usize), Arc<tiers::TierPeers>>,
    /// Per namespace, the admin policies whose subject selects it, in evaluation order.
    admin_by_namespace: HashMap<String, Arc<[Arc<AdminPolicy>]>>,
    /// Resolved tier lists shared by the pods the same policies apply to.
    tier_lists: HashMap<tiers::TierListKey, TierRules>,
    /// The addresses of the pods an admin peer selector selects, per selector and networks.
    selector_addrs: HashMap<(crate::admin::PodsSelector, Vec<NetworkId>), Arc<AddrSet>>,
}

/// What changed in [`Engine::pods_by_address`] ([`Engine::take_address_changes`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AddressChanges {
    /// These addresses (their holder may be another now, or none).
    Listed(BTreeSet<IpAddr>),
    /// Too many to list, or never asked before: take the whole map again.
    #[default]
    All,
}

impl Engine {
    pub fn new(options: EngineOptions) -> Self {
        Engine {
            options,
            every_pod_dirty: true,
            ..Default::default()
        }
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    pub fn pods(&self) -> impl Iterator<Item = &Pod> {
        self.pods.values().map(|id| self.pod_by_id(*id))
    }

    pub fn pod(&self, key: &PodKey) -> Option<&Pod> {
        self.pods.get(key).map(|id| self.pod_by_id(*id))
    }

    fn pod_by_id(&self, id: PodId) -> &Pod {
        self.pod_slots[id.0 as usize]
            .as_deref()
            .expect("a pod number in use")
    }

    /// Which pod holds each address (any interface; of several, the first in key order, unless
    /// two pods claim it: then none): how events name their `peer`.
    pub fn pods_by_address(&self) -> std::collections::HashMap<IpAddr, PodKey> {
        let mut map = std::collections::HashMap::with_capacity(self.pods_by_addr.len());
        map.extend(
            self.pods_by_addr
                .keys()
                .filter_map(|ip| Some((*ip, self.pod_at(*ip)?.clone()))),
        );
        map
    }

    /// The pod [`Engine::pods_by_address`] names for one address: none when two pods claim
    /// it ([`Engine::is_ambiguous`]).
    pub fn pod_at(&self, ip: IpAddr) -> Option<&PodKey> {
        if self.is_ambiguous(ip) {
            return None;
        }
        self.pods_by_addr
            .get(&ip)
            .and_then(|holders| holders.first())
    }

    /// The addresses whose holders changed since the last call, so that a copy of
    /// [`Engine::pods_by_address`] follows with [`Engine::pod_at`] instead of being built
    /// again (at 100,000 pods, building it took the agent about 100 ms after every sync).
    pub fn take_address_changes(&mut self) -> AddressChanges {
        std::mem::replace(
            &mut self.address_changes,
            AddressChanges::Listed(BTreeSet::new()),
        )
    }

    fn address_changed(&mut self, ip: IpAddr) {
        if let AddressChanges::Listed(ips) = &mut self.address_changes {
            ips.insert(ip);
            // Past this many, building the copy again costs less than following each.
            if ips.len() > 4096 && ips.len() > self.pods_by_addr.len() / 8 {
                self.address_changes = AddressChanges::All;
            }
        }
    }

    pub fn policies(&self) -> impl Iterator<Item = &Policy> {
        self.policies.values().map(Arc::as_ref)
    }

    pub fn policy(&self, reference: &PolicyRef) -> Option<&Policy> {
        self.policies.get(reference).map(Arc::as_ref)
    }

    pub fn namespace_labels(&self, namespace: &str) -> Labels {
        self.namespace_labels_ref(namespace).into_owned()
    }

    /// [`Engine::namespace_labels`], borrowed when the namespace is known.
    fn namespace_labels_ref(&self, namespace: &str) -> Cow<'_, Labels> {
        match self.namespaces.get(namespace) {
            Some(ns) => Cow::Borrowed(&ns.labels),
            // Kubernetes labels every namespace with its own name.
            None => Cow::Owned(Labels::from([(
                "kubernetes.io/metadata.name".to_string(),
                namespace.to_string(),
            )])),
        }
    }

    fn namespace_matches(&self, namespace: &str, selector: &LabelSelector) -> bool {
        match self.namespaces.get(namespace) {
            Some(ns) => selector.matches(&ns.labels),
            None => selector.matches(&self.namespace_labels(namespace)),
        }
    }

    /// Names the pods whose rules may differ from what [`Engine::pod_rules`] last returned for
    /// them. A caller that holds a pod's rules recomputes them whenever the pod is named: the
    /// engine looks only at the rules it has cached, so a pod named and not recomputed is not
    /// named again for later changes (an agent holds, and recomputes, only its node's pods).
    pub fn take_dirty(&mut self) -> BTreeSet<PodKey> {
        self.every_pod_dirty = false;
        std::mem::take(&mut self.dirty)
    }

    /// Whether the namespace asks for learn mode on all its pods.
    fn namespace_learns(&self, namespace: &str) -> bool {
        self.namespaces.get(namespace).is_some_and(|ns| ns.learn)
    }

    /// Whether the pod is in learn mode: its own annotation, its namespace's, or a selector.
    fn learns(&self, pod: &Pod) -> bool {
        pod.learn
            || self.namespace_learns(&pod.key.namespace)
            || self.options.learn.iter().any(|s| s.matches(&pod.key))
    }

    /// A namespace-wide switch changed: every pod of it must be recomputed.
    fn dirty_namespace_pods(&mut self, namespace: &str) {
        if let Some(names) = self.pods_by_namespace.get(namespace) {
            self.dirty.extend(
                names
                    .iter()
                    .map(|name| PodKey::new(namespace.to_string(), name.clone())),
            );
        }
    }

    // ----- feeding -------------------------------------------------------------------------

    pub fn set_namespace(&mut self, namespace: Namespace) {
        let old_labels = self.namespace_labels(&namespace.name);
        let new_labels = namespace.labels.clone();
        let old_learn = self.namespace_learns(&namespace.name);
        if old_learn != namespace.learn {
            self.dirty_namespace_pods(&namespace.name);
        }
        let name = namespace.name.clone();
        self.namespaces.insert(namespace.name.clone(), namespace);
        if old_labels != new_labels {
            self.admin_namespace_changed(&name);
            self.forget_peer_sets();
            // Only a change of membership in a namespaceSelector matters.
            self.invalidate_rules_where(|_, peer| match peer {
                Peer::Pods {
                    namespace_selector: Some(sel),
                    ..
                } => sel.matches(&old_labels) != sel.matches(&new_labels),
                _ => false,
            });
        }
    }

    pub fn remove_namespace(&mut self, name: &str) {
        if let Some(old) = self.namespaces.remove(name) {
            if old.learn {
                self.dirty_namespace_pods(name);
            }
            let new_labels = self.namespace_labels(name);
            if old.labels != new_labels {
                self.admin_namespace_changed(name);
            }
            self.forget_peer_sets();
            self.invalidate_rules_where(|_, peer| match peer {
                Peer::Pods {
                    namespace_selector: Some(sel),
                    ..
                } => sel.matches(&old.labels) != sel.matches(&new_labels),
                _ => false,
            });
        }
    }

    /// Sets a pod; an `Arc<Pod>` is kept as it is, shared with whoever handed it in.
    pub fn set_pod(&mut self, pod: impl Into<Arc<Pod>>) {
        let pod: Arc<Pod> = pod.into();
        let key = pod.key.clone();
        if self.pod(&key) == Some(&*pod) {
            return;
        }
        self.dirty.insert(key.clone());
        self.pods_by_namespace
            .entry(key.namespace.clone())
            .or_default()
            .insert(key.name.clone());
        let namespace = &pod.key.namespace;
        let old = match self.pods.get(&key) {
            Some(&id) => {
                let old = self.pod_slots[id.0 as usize].replace(pod.clone());
                let old = old.expect("a pod number in use");
                if old.labels != pod.labels {
                    self.labels.remove(namespace, &id, &old.labels);
                    self.labels.insert(namespace, &id, &pod.labels);
                }
                Some(old)
            }
            None => {
                let id = match self.free_pod_ids.pop() {
                    Some(id) => {
                        self.pod_slots[id.0 as usize] = Some(pod.clone());
                        id
                    }
                    None => {
                        self.pod_slots.push(Some(pod.clone()));
                        PodId(u32::try_from(self.pod_slots.len() - 1).expect("< 2^32 pods"))
                    }
                };
                self.pods.insert(key, id);
                self.labels.insert(namespace, &id, &pod.labels);
                None
            }
        };
        if let Some(old) = &old {
            if peer_view(old) == peer_view(&pod) {
                // Only the pod itself can see this change (its netns, its interface names).
                return;
            }
            self.unindex_addrs(old);
        }
        self.index_addrs(&pod);
        self.pod_changed(old.as_deref(), Some(&pod));
        self.follow_ambiguity(old.as_deref(), Some(&pod));
    }

    pub fn remove_pod(&mut self, key: &PodKey) {
        if let Some(id) = self.pods.remove(key) {
            let old = self.pod_slots[id.0 as usize]
                .take()
                .expect("a pod number in use");
            self.free_pod_ids.push(id);
            if let Some(names) = self.pods_by_namespace.get_mut(&key.namespace) {
                names.remove(&key.name);
            }
            self.labels.remove(&key.namespace, &id, &old.labels);
            self.unindex_addrs(&old);
            self.pod_changed(Some(&old), None);
            self.follow_ambiguity(Some(&old), None);
            self.dirty.insert(key.clone());
            self.lockdown.remove(key);
        }
    }

    // ----- addresses two pods claim ---------------------------------------------------------

    /// The pods other than `except` that claim `ip` as peers would (hostNetwork pods share the
    /// node's addresses by design and are no peers).
    fn other_claimants(&self, ip: &IpAddr, except: &PodKey) -> usize {
        self.pods_by_addr.get(ip).map_or(0, |holders| {
            holders
                .iter()
                .filter(|k| *k != except)
                .filter(|k| self.pod(k).is_some_and(|p| !p.host_network))
                .count()
        })
    }

    /// Whether two pods (or more) claim `ip`: then no rule can tell them apart by address, so
    /// it is kept out of every pod peer's allow set until only one claims it (SPEC 7; a
    /// DanmEp lending a pod another's address let that other pod pass: issue 20, defect 2).
    pub fn is_ambiguous(&self, ip: IpAddr) -> bool {
        // Almost always empty: peer sets of 100,000 addresses pay nothing for the check.
        !self.ambiguous.is_empty() && self.ambiguous.contains(&ip)
    }

    /// After a pod changed (`old` → `new`, the indexes already hold `new`): every address
    /// that became ambiguous or stopped being so changes what each of its claimants gives
    /// the peer sets, whatever their own objects say; the rules that can select them are
    /// computed again.
    fn follow_ambiguity(&mut self, old: Option<&Pod>, new: Option<&Pod>) {
        let Some(key) = old.or(new).map(|p| p.key.clone()) else {
            return;
        };
        let claims = |pod: Option<&Pod>, ip: &IpAddr| {
            pod.is_some_and(|p| !p.host_network && p.interfaces.iter().any(|i| i.ips.contains(ip)))
        };
        let ips: BTreeSet<IpAddr> = old
            .into_iter()
            .chain(new)
            .flat_map(|p| p.interfaces.iter().flat_map(|i| i.ips.iter().copied()))
            .collect();
        let mut claimants: BTreeSet<PodKey> = BTreeSet::new();
        for ip in ips {
            let others = self.other_claimants(&ip, &key);
            let before = others + usize::from(claims(old, &ip)) > 1;
            let after = others + usize::from(claims(new, &ip)) > 1;
            if before != after {
                if after {
                    self.ambiguous.insert(ip);
                } else {
                    self.ambiguous.remove(&ip);
                }
                claimants.extend(self.pods_by_addr.get(&ip).into_iter().flatten().cloned());
                claimants.insert(key.clone());
            }
        }
        if !claimants.is_empty() && self.has_admin_policies() {
            // The claimants' peers in admin Allow rules too (the pod itself may be gone).
            let pods: Vec<Pod> = claimants
                .iter()
                .filter_map(|k| self.pod(k).or(old.filter(|p| p.key == *k)).cloned())
                .collect();
            self.admin_ambiguity_changed(&pods.iter().collect::<Vec<_>>());
        }
        if claimants.is_empty() || (self.cache.is_empty() && self.peer_sets.none_resolved()) {
            return;
        }
        let mut stale: BTreeSet<RuleKey> = BTreeSet::new();
        for claimant in claimants {
            let Some(pod) = self.pod(&claimant).or(old.filter(|p| p.key == claimant)) else {
                continue;
            };
            stale.extend(self.rules_selecting(pod));
        }
        let sets: Vec<PeerSetId> = stale
            .iter()
            .flat_map(|rule| {
                self.rule_peer_sets
                    .get(rule)
                    .into_iter()
                    .flatten()
                    .flatten()
            })
            .copied()
            .collect();
        for id in sets {
            self.peer_sets.forget(id);
        }
        self.invalidate(stale.into_iter().collect());
    }

    // ----- lockdown ---------------------------------------------------------------------------

    /// Locks a pod's netns down (`why`), or lifts it (`None`): while locked, the pod's rules
    /// isolate every interface in both directions and allow nothing but what SPEC 3.1 always
    /// allows, whatever the policies say. The agent uses it where it cannot tell which pod a
    /// netns belongs to (two pods claim it and no runtime says which): failing closed, the
    /// legitimate pod is cut off rather than left open.
    pub fn set_lockdown(&mut self, key: &PodKey, why: Option<String>) {
        let changed = match why {
            Some(why) => self.lockdown.insert(key.clone(), why.clone()).as_ref() != Some(&why),
            None => self.lockdown.remove(key).is_some(),
        };
        if changed && self.pods.contains_key(key) {
            self.dirty.insert(key.clone());
        }
    }

    /// Why a pod is locked down, if it is.
    pub fn lockdown(&self, key: &PodKey) -> Option<&str> {
        self.lockdown.get(key).map(String::as_str)
    }

    fn index_addrs(&mut self, pod: &Pod) {
        for ip in pod.interfaces.iter().flat_map(|i| &i.ips) {
            let holders = self
                .pods_by_addr
                .entry(*ip)
                .or_insert_with(|| Vec::with_capacity(1));
            insert_sorted(holders, pod.key.clone());
            self.address_changed(*ip);
        }
    }

    fn unindex_addrs(&mut self, pod: &Pod) {
        for ip in pod.interfaces.iter().flat_map(|i| &i.ips) {
            if let Some(holders) = self.pods_by_addr.get_mut(ip) {
                remove_sorted(holders, &pod.key);
                if holders.is_empty() {
                    self.pods_by_addr.remove(ip);
                }
                self.address_changed(*ip);
            }
        }
    }

    /// Sets a policy; an `Arc<Policy>` is kept as it is, shared with whoever handed it in.
    pub fn set_policy(&mut self, policy: impl Into<Arc<Policy>>) {
        let policy: Arc<Policy> = policy.into();
        let reference = policy.reference();
        if self.policies.get(&reference) == Some(&policy) {
            return;
        }
        self.remove_policy(&reference);
        self.mark_policy_targets_dirty(&policy);
        let id = match self.free_policy_ids.pop() {
            Some(id) => id,
            None => {
                self.policies_by_id.push(None);
                PolicyId(u32::try_from(self.policies_by_id.len() - 1).expect("< 2^32 policies"))
            }
        };
        self.file_rules(id, &policy, true);
        if let Some(name) = replaced_name(&policy) {
            *self
                .replaced_names
                .entry(policy.key.namespace.clone())
                .or_default()
                .entry(name.to_string())
                .or_default() += 1;
        }
        self.policy_ids.insert(reference.clone(), id);
        self.policies_by_id[id.0 as usize] = Some(policy.clone());
        self.policies.insert(reference, policy);
    }

    pub fn remove_policy(&mut self, reference: &PolicyRef) {
        let Some(old) = self.policies.remove(reference) else {
            return;
        };
        let id = self
            .policy_ids
            .remove(reference)
            .expect("every policy has a number");
        self.policies_by_id[id.0 as usize] = None;
        self.free_policy_ids.push(id);
        self.file_rules(id, &old, false);
        if let Some(name) = replaced_name(&old) {
            if let Some(names) = self.replaced_names.get_mut(&old.key.namespace) {
                if let Some(count) = names.get_mut(name) {
                    *count -= 1;
                    if *count == 0 {
                        names.remove(name);
                    }
                }
                if names.is_empty() {
                    self.replaced_names.remove(&old.key.namespace);
                }
            }
        }
        for direction in [Direction::Ingress, Direction::Egress] {
            for index in 0..old.rules(direction).map_or(0, <[PolicyRule]>::len) {
                self.cache.remove(&RuleKey::new(id, direction, index));
            }
        }
        self.mark_policy_targets_dirty(&old);
    }

    /// Files (or unfiles) `policy` (numbered `id`) in [`Engine::policies_by_target`], and
    /// every rule of it in [`Engine::rules_by_peer`] and [`Engine::egress_unselective`].
    fn file_rules(&mut self, id: PolicyId, policy: &Policy, insert: bool) {
        let targets = Reach {
            namespace: &policy.key.namespace,
            namespace_selector: None,
            pod_selector: Some(&policy.pod_selector),
        };
        if insert {
            self.policies_by_target.insert(&id, targets);
        } else {
            self.policies_by_target.remove(&id, targets);
        }
        for direction in [Direction::Ingress, Direction::Egress] {
            for (index, rule) in policy
                .rules(direction)
                .unwrap_or_default()
                .iter()
                .enumerate()
            {
                let key = RuleKey::new(id, direction, index);
                let unselective = rule.peers.is_empty()
                    || rule.peers.iter().any(|p| matches!(p, Peer::IpBlock(_)));
                if direction == Direction::Egress && unselective {
                    if insert {
                        self.egress_unselective.insert(key);
                    } else {
                        self.egress_unselective.remove(&key);
                    }
                }
                for peer in &rule.peers {
                    let Some(reach) = peer_reach(policy, peer) else {
                        continue;
                    };
                    if insert {
                        self.rules_by_peer.insert(&key, reach);
                    } else {
                        self.rules_by_peer.remove(&key, reach);
                    }
                }
                if insert {
                    let ids = rule
                        .peers
                        .iter()
                        .map(|peer| Some(self.peer_sets.file(peer_set_key(policy, peer)?)))
                        .collect();
                    self.rule_peer_sets.insert(key, ids);
                } else {
                    let ids = self.rule_peer_sets.remove(&key).unwrap_or_default();
                    for id in ids.into_iter().flatten() {
                        self.peer_sets.unfile(id);
                    }
                }
            }
        }
    }

    /// Files (or unfiles) a Service with a selector in [`Engine::services_by_selector`].
    fn file_service(&mut self, service: &Service, insert: bool) {
        let Some(selector) = &service.selector else {
            return;
        };
        let selector = LabelSelector {
            match_labels: selector.clone(),
            match_expressions: Vec::new(),
        };
        let reach = Reach {
            namespace: &service.key.namespace,
            namespace_selector: None,
            pod_selector: Some(&selector),
        };
        if insert {
            self.services_by_selector.insert(&service.key, reach);
        } else {
            self.services_by_selector.remove(&service.key, reach);
        }
    }

    /// The rules whose pod peers can select `pod` (a superset, from the index).
    fn rules_selecting(&self, pod: &Pod) -> Vec<RuleKey> {
        let namespace_labels = self.namespace_labels_ref(&pod.key.namespace);
        self.rules_by_peer
            .candidates(&pod.key.namespace, &namespace_labels, &pod.labels)
            .into_iter()
            .copied()
            .collect()
    }

    /// The policy numbered `id` (`None` once removed).
    fn policy_by_id(&self, id: PolicyId) -> Option<&Arc<Policy>> {
        self.policies_by_id
            .get(id.0 as usize)
            .and_then(Option::as_ref)
    }

    /// The egress rules whose clauses can reach one of `addrs`: those selecting a pod that
    /// holds one, and those reaching any address.
    fn egress_rules_reaching(&self, addrs: &BTreeSet<IpAddr>) -> BTreeSet<RuleKey> {
        let mut out = self.egress_unselective.clone();
        for addr in addrs {
            for holder in self.pods_by_addr.get(addr).into_iter().flatten() {
                if let Some(pod) = self.pod(holder) {
                    out.extend(
                        self.rules_selecting(pod)
                            .into_iter()
                            .filter(|key| key.direction == Direction::Egress),
                    );
                }
            }
        }
        out
    }

    pub fn set_service(&mut self, service: Service) {
        if self.services.get(&service.key).map(|e| &e.service) == Some(&service) {
            return;
        }
        let key = service.key.clone();
        let entry = ServiceEntry {
            endpoints: self.resolve_endpoints(&service),
            service,
        };
        let no_endpoints = Endpoints::new();
        let old_endpoints = self
            .services
            .get(&key)
            .map_or(&no_endpoints, |e| &e.endpoints);
        let moved = endpoint_moves(&key, old_endpoints, &entry.endpoints);
        self.reindex_endpoints(moved);
        self.file_service(&entry.service, true);
        let old = self.services.insert(key.clone(), entry);
        if let Some(old) = &old {
            self.file_service(&old.service, false);
        }
        let stale = self.vips_changed(old.as_ref(), self.services.get(&key));
        self.invalidate(stale);
    }

    pub fn remove_service(&mut self, key: &ObjectKey) {
        if let Some(old) = self.services.remove(key) {
            self.file_service(&old.service, false);
            let moved = endpoint_moves(key, &old.endpoints, &Endpoints::new());
            self.reindex_endpoints(moved);
            let stale = self.vips_changed(Some(&old), None);
            self.invalidate(stale);
        }
    }

    /// Applies [`endpoint_moves`] to the endpoint index.
    fn reindex_endpoints(&mut self, moves: Vec<(IpAddr, ObjectKey, bool)>) {
        for (addr, key, added) in moves {
            let services = self
                .services_by_endpoint
                .entry(addr)
                .or_insert_with(|| Vec::with_capacity(1));
            if added {
                insert_sorted(services, key);
            } else {
                remove_sorted(services, &key);
                if services.is_empty() {
                    self.services_by_endpoint.remove(&addr);
                }
            }
        }
    }

    /// The cached egress rules to which a Service (`old` → `new`) adds other VIPs.
    fn vips_changed(&self, old: Option<&ServiceEntry>, new: Option<&ServiceEntry>) -> Vec<RuleKey> {
        let has_vips =
            |e: Option<&ServiceEntry>| e.is_some_and(|e| !e.service.cluster_ips.is_empty());
        // Nothing computed yet (objects still being fed): nothing to drop.
        if self.cache.is_empty() || (!has_vips(old) && !has_vips(new)) {
            return Vec::new();
        }
        self.egress_rules_reaching(&vip_relevant_addrs(old, new))
            .into_iter()
            .filter(|key| {
                self.cache.get(key).is_some_and(|resolved| {
                    let base = resolved.base_clauses();
                    vip_contribution(old, base) != vip_contribution(new, base)
                })
            })
            .collect()
    }

    /// A Service's endpoints as the pods are now.
    fn resolve_endpoints(&self, service: &Service) -> Endpoints {
        match &service.selector {
            Some(selector) => self
                .candidates_in(
                    &service.key.namespace,
                    &LabelSelector {
                        match_labels: selector.clone(),
                        match_expressions: Vec::new(),
                    },
                )
                .into_iter()
                .filter(|pod| service_selects(service, pod))
                .flat_map(|pod| {
                    let targets = service_targets(service, Some(pod));
                    pod.primary()
                        .into_iter()
                        .flat_map(|i| &i.ips)
                        .map(move |a| (*a, targets.clone()))
                })
                .collect(),
            None => service
                .endpoint_addrs
                .iter()
                .map(|addr| (*addr, service_targets(service, self.pod_by_addr(*addr))))
                .collect(),
        }
    }

    /// A policy's own targets and, when it replaces another policy, that policy's targets too
    /// (their staged view changes).
    fn mark_policy_targets_dirty(&mut self, policy: &Policy) {
        let mut targets = self.targets(policy);
        if let Some(replaced) = &policy.replaces {
            let ns = &policy.key.namespace;
            for other in self.policies.values() {
                if other.key.namespace == *ns && other.key.name == *replaced {
                    targets.extend(self.targets(other));
                }
            }
        }
        self.dirty.extend(targets);
    }

    /// The pods whose rules use `policy`'s rules: its targets with an interface it covers.
    fn users(&self, policy: &Policy) -> Vec<PodKey> {
        self.candidates_in(&policy.key.namespace, &policy.pod_selector)
            .into_iter()
            .filter(|pod| selects(policy, pod))
            .filter(|pod| pod.interfaces.iter().any(|i| policy.covers_interface(i)))
            .map(|pod| pod.key.clone())
            .collect()
    }

    /// Drops cached rules, marking dirty the pods that use them.
    fn invalidate(&mut self, stale: Vec<RuleKey>) {
        let mut policies = BTreeSet::new();
        for key in stale {
            self.cache.remove(&key);
            policies.insert(key.policy);
        }
        for id in policies {
            if let Some(policy) = self.policy_by_id(id) {
                let users = self.users(policy);
                self.dirty.extend(users);
            }
        }
    }

    /// Pods a policy selects (same namespace, podSelector, never hostNetwork pods).
    pub fn targets(&self, policy: &Policy) -> Vec<PodKey> {
        self.candidates_in(&policy.key.namespace, &policy.pod_selector)
            .into_iter()
            .filter(|pod| selects(policy, pod))
            .map(|pod| pod.key.clone())
            .collect()
    }

    /// The pods of `namespace` that can match `selector`, in key order: the label index's
    /// candidates, or every pod of the namespace (a superset; the caller tests each).
    fn candidates_in(&self, namespace: &str, selector: &LabelSelector) -> Vec<&Pod> {
        match self.labels.candidates(namespace, selector) {
            Candidates::Among(ids) => ids.into_iter().map(|id| self.pod_by_id(*id)).collect(),
            Candidates::Everyone => self
                .pods
                .range(PodKey::new(namespace, "")..)
                .take_while(|(key, _)| key.namespace == namespace)
                .map(|(_, id)| self.pod_by_id(*id))
                .collect(),
        }
    }

    /// Whether a policy selects any pod: [`Engine::targets`] without collecting them, stopping
    /// at the first (cheap enough to ask of every policy after every change).
    pub fn selects_any_pod(&self, policy: &Policy) -> bool {
        self.candidates_in(&policy.key.namespace, &policy.pod_selector)
            .into_iter()
            .any(|pod| selects(policy, pod))
    }

    /// A pod changed in a way other pods can see (`old` → `new`; the indexes hold `new`):
    /// drops the cached rules whose result changes with it, directly or through a Service.
    fn pod_changed(&mut self, old: Option<&Pod>, new: Option<&Pod>) {
        self.admin_pod_changed(old, new);
        let versions = || old.into_iter().chain(new);
        // The rules whose peers can select the pod, before or after the change (none needed
        // while nothing is computed: objects still being fed).
        let computed = !self.cache.is_empty() || !self.peer_sets.none_resolved();
        let selecting: BTreeSet<RuleKey> = versions()
            .filter(|_| computed)
            .flat_map(|pod| self.rules_selecting(pod))
            .collect();
        self.forget_peer_sets_of(&selecting, old, new);
        // Services whose endpoints this pod is, was, or resolves named ports for.
        let mut moved: Vec<ServiceEntry> = Vec::new();
        let affected: BTreeSet<ObjectKey> = versions()
            .flat_map(|pod| self.services_depending_on(pod))
            .filter(|key| {
                self.services
                    .get(key)
                    .is_some_and(|e| versions().any(|pod| service_depends_on_pod(&e.service, pod)))
            })
            .collect();
        for key in affected {
            let endpoints = self.resolve_endpoints(&self.services[&key].service);
            if self.services[&key].endpoints == endpoints {
                continue;
            }
            let moves = endpoint_moves(&key, &self.services[&key].endpoints, &endpoints);
            self.reindex_endpoints(moves);
            let entry = self.services.get_mut(&key).expect("listed above");
            moved.push(ServiceEntry {
                service: entry.service.clone(),
                endpoints: std::mem::replace(&mut entry.endpoints, endpoints),
            });
        }
        if self.cache.is_empty() {
            // Nothing computed yet (objects still being fed): nothing to drop.
            return;
        }
        // The rules to test: those that can select the pod; for egress named ports, those
        // selecting another pod on one of its addresses (the address is in their peers) or
        // reaching any address; for Service VIPs, those reaching a moved endpoint.
        let mut candidates = selecting;
        let mut own_addrs: BTreeSet<IpAddr> = versions()
            .flat_map(|pod| pod.interfaces.iter().flat_map(|i| i.ips.iter().copied()))
            .collect();
        for before in &moved {
            let after = self.services.get(&before.service.key);
            own_addrs.extend(vip_relevant_addrs(Some(before), after));
        }
        candidates.extend(self.egress_rules_reaching(&own_addrs));
        let stale: Vec<RuleKey> = candidates
            .into_iter()
            .filter(|key| {
                let Some(resolved) = self.cache.get(key) else {
                    return false;
                };
                let direction = key.direction;
                let policy = &resolved.policy;
                let Some(rule) = policy
                    .rules(direction)
                    .and_then(|r| r.get(key.index as usize))
                else {
                    return true;
                };
                if self.rule_depends_on_pod(policy, direction, rule, resolved, old, new) {
                    return true;
                }
                direction == Direction::Egress
                    && moved.iter().any(|before| {
                        let after = self.services.get(&before.service.key);
                        let base = resolved.base_clauses();
                        vip_contribution(Some(before), base) != vip_contribution(after, base)
                    })
            })
            .collect();
        self.invalidate(stale);
    }

    /// The Services that may depend on `pod` (a superset): those whose selector can select
    /// it and those with one of its addresses among their endpoints.
    fn services_depending_on(&self, pod: &Pod) -> Vec<ObjectKey> {
        let no_labels = Labels::new();
        let mut out: Vec<ObjectKey> = self
            .services_by_selector
            .candidates(&pod.key.namespace, &no_labels, &pod.labels)
            .into_iter()
            .cloned()
            .collect();
        for ip in pod.interfaces.iter().flat_map(|i| &i.ips) {
            out.extend(
                self.services_by_endpoint
                    .get(ip)
                    .into_iter()
                    .flatten()
                    .cloned(),
            );
        }
        out
    }

    /// Whether a pod's change (old → new) changes the resolution of `rule`, cached as
    /// `resolved` (Service VIPs aside).
    fn rule_depends_on_pod(
        &self,
        policy: &Policy,
        direction: Direction,
        rule: &PolicyRule,
        resolved: &ResolvedRule,
        old: Option<&Pod>,
        new: Option<&Pod>,
    ) -> bool {
        let contribution = |pod: Option<&Pod>, peer: &Peer| -> Option<Vec<IpAddr>> {
            let pod = pod?;
            self.peer_selects_pod(policy, peer, pod)
                .then(|| contributed_addrs(policy, peer, pod).collect())
        };
        let pod_peer_changed = rule.peers.iter().any(|peer| match peer {
            Peer::Pods { .. } => contribution(old, peer) != contribution(new, peer),
            Peer::IpBlock(_) => false,
        });
        if pod_peer_changed {
            return true;
        }
        // Egress named ports resolve on each destination pod the peers allow, whoever it is.
        // The peers did not change (above), so the cached ones tell which addresses count.
        direction == Direction::Egress
            && named_port_contribution(rule, &resolved.peers, old)
                != named_port_contribution(rule, &resolved.peers, new)
    }

    fn peer_selects_pod(&self, policy: &Policy, peer: &Peer, pod: &Pod) -> bool {
        let Peer::Pods {
            pod_selector,
            namespace_selector,
            ..
        } = peer
        else {
            return false;
        };
        if pod.host_network {
            return false;
        }
        let namespace_ok = match namespace_selector {
            Some(sel) => self.namespace_matches(&pod.key.namespace, sel),
            None => pod.key.namespace == policy.key.namespace,
        };
        namespace_ok && peer_pod_matches(pod_selector.as_ref(), pod)
    }

    /// Drops cached rules with a peer satisfying `affected`, marking their users dirty.
    fn invalidate_rules_where(&mut self, affected: impl Fn(&Policy, &Peer) -> bool) {
        let stale: Vec<RuleKey> = self
            .cache
            .iter()
            .filter(|(key, resolved)| {
                let policy = &resolved.policy;
                policy
                    .rules(key.direction)
                    .and_then(|r| r.get(key.index as usize))
                    .is_none_or(|rule| rule.peers.iter().any(|peer| affected(policy, peer)))
            })
            .map(|(key, _)| *key)
            .collect();
        self.invalidate(stale);
    }

    // ----- computing -----------------------------------------------------------------------

    /// Pods selected as peers by a pod-based peer of `policy`: in each namespace the peer
    /// admits, the pod selector's candidates from the label index, each tested in full (the
    /// same pods as testing every pod of those namespaces with [`Engine::peer_selects_pod`]).
    fn peer_pods<'a>(&'a self, policy: &'a Policy, peer: &'a Peer) -> Vec<&'a Pod> {
        let Peer::Pods {
            namespace_selector,
            pod_selector,
            ..
        } = peer
        else {
            return Vec::new();
        };
        let namespaces: Vec<&String> = match namespace_selector {
            Some(sel) => self
                .pods_by_namespace
                .keys()
                .filter(|ns| self.namespace_matches(ns, sel))
                .collect(),
            None => vec![&policy.key.namespace],
        };
        let everything = LabelSelector::everything();
        let selector = pod_selector.as_ref().unwrap_or(&everything);
        let mut out = Vec::new();
        for ns in namespaces {
            out.extend(self.candidates_in(ns, selector));
        }
        // The namespaces listed are the ones the peer accepts: only the pods are left to check
        // ([`Engine::peer_selects_pod`] without matching each pod's namespace again).
        out.retain(|pod| peer_pod_matches(pod_selector.as_ref(), pod));
        out
    }

    /// The addresses `peer` of `policy` stands for; a pod peer's set is found once per
    /// [`PeerSetKey`] until pods or namespaces change.
    /// `id`: the peer's set number (`None` for an ipBlock, or a rule not filed).
    fn peer_addrs(&mut self, policy: &Policy, peer: &Peer, id: Option<PeerSetId>) -> Arc<AddrSet> {
        if let Peer::IpBlock(block) = peer {
            return Arc::new(AddrSet::from_ip_block(block));
        }
        if let Some(hit) = id.and_then(|id| self.peer_sets.addrs(id)) {
            return hit.clone();
        }
        let set = Arc::new(AddrSet::from_addrs(
            self.peer_pods(policy, peer)
                .into_iter()
                .flat_map(|pod| contributed_addrs(policy, peer, pod))
                .filter(|ip| !self.is_ambiguous(*ip)),
        ));
        if let Some(id) = id {
            self.peer_sets.keep(id, set.clone());
        }
        set
    }

    /// Forgets every resolved peer set (namespace labels changed: any set may differ).
    fn forget_peer_sets(&mut self) {
        self.peer_sets.forget_all();
    }

    /// Forgets the resolved peer sets whose addresses a pod's change (`old` → `new`) changes:
    /// the pod's contribution to them differs (it joins, leaves, or brings other addresses).
    /// The others stay exact (dropping them all on every pod event cost more than the
    /// lookups they save).
    /// Only the sets of the rules `selecting` the pod are looked at: every set is named by a
    /// filed rule ([`Engine::remove_policy`] drops a removed policy's), and a set the pod is
    /// or was in is named by a rule that can select it.
    fn forget_peer_sets_of(
        &mut self,
        selecting: &BTreeSet<RuleKey>,
        old: Option<&Pod>,
        new: Option<&Pod>,
    ) {
        if self.peer_sets.none_resolved() {
            return;
        }
        let mut stale = Vec::new();
        for key in selecting {
            for id in self.rule_peer_sets.get(key).into_iter().flatten().flatten() {
                if self.peer_sets.addrs(*id).is_some() {
                    let set = self.peer_sets.key(*id);
                    if self.peer_set_share(set, old) != self.peer_set_share(set, new) {
                        stale.push(*id);
                    }
                }
            }
        }
        for id in stale {
            self.peer_sets.forget(id);
        }
    }

    /// The addresses `pod` gives the peer set of `key` (`None`: it is not in the set).
    fn peer_set_share(&self, key: &PeerSetKey, pod: Option<&Pod>) -> Option<Vec<IpAddr>> {
        let pod = pod?;
        let (peer, own_namespace, kind, scope) = key;
        let Peer::Pods {
            pod_selector,
            namespace_selector,
            ..
        } = peer
        else {
            return None;
        };
        let namespace_ok = match namespace_selector {
            Some(sel) => self.namespace_matches(&pod.key.namespace, sel),
            None => own_namespace.as_deref() == Some(pod.key.namespace.as_str()),
        };
        (namespace_ok && peer_pod_matches(pod_selector.as_ref(), pod))
            .then(|| addrs_counted(*kind, scope, peer, pod).collect())
    }

    fn resolve_rule(
        &mut self,
        id: PolicyId,
        policy: &Policy,
        direction: Direction,
        index: usize,
        rule: &PolicyRule,
    ) -> ResolvedRule {
        let peers = if rule.peers.is_empty() {
            vec![PeerMatch::Any]
        } else {
            let ids = self
                .rule_peer_sets
                .get(&RuleKey::new(id, direction, index))
                .cloned()
                .unwrap_or_default();
            // Large pod-peer sets keep a clause each, shared with every rule naming the
            // peer; the rest (ipBlocks, which no other rule shares, and small sets) are
            // merged into one clause, so a rule of 20,000 ipBlocks stays one set.
            let mut merged: Vec<Arc<AddrSet>> = Vec::new();
            let mut shared: Vec<PeerMatch> = Vec::new();
            for (i, peer) in rule.peers.iter().enumerate() {
                let set = self.peer_addrs(policy, peer, ids.get(i).copied().flatten());
                let pods = matches!(peer, Peer::Pods { .. });
                if pods && set.range_count() >= SHARED_PEER_SET_MIN_RANGES {
                    let set = PeerMatch::Addrs(set);
                    if !shared.contains(&set) {
                        shared.push(set);
                    }
                } else {
                    merged.push(set);
                }
            }
            let merged = match merged.as_slice() {
                [] => None,
                [only] => Some(only.clone()),
                _ => Some(Arc::new(AddrSet::union_of(
                    merged.iter().map(|s| s.as_ref()),
                ))),
            };
            merged
                .map(PeerMatch::Addrs)
                .into_iter()
                .chain(shared)
                .collect()
        };
        let (egress_clauses, egress_base) = match direction {
            Direction::Ingress => (Vec::new(), 0),
            Direction::Egress => {
                let base = self.egress_clauses(&peers, rule);
                let len = base.len();
                (self.with_service_vips(base), len)
            }
        };
        // The engine's own copy, shared (computing a pod borrows policies the engine holds).
        let policy = self
            .policy_by_id(id)
            .cloned()
            .unwrap_or_else(|| Arc::new(policy.clone()));
        ResolvedRule {
            policy,
            peers,
            egress_clauses,
            egress_base,
        }
    }

    /// Egress clauses: numeric ports apply to every peer; a named port applies to each
    /// destination pod that declares it, on the number that pod gives it.
    fn egress_clauses(&self, peers: &[PeerMatch], rule: &PolicyRule) -> Vec<Clause> {
        if rule.ports.is_empty() {
            return clauses_per_peer(peers, &PortMatch::Any);
        }
        let numeric: Vec<PortRange> = rule.ports.iter().filter_map(numeric_range).collect();
        let mut clauses = if numeric.is_empty() {
            Vec::new()
        } else {
            clauses_per_peer(peers, &PortMatch::Only(numeric))
        };
        // (protocol, number) → destination addresses that give the name that number.
        let mut named: BTreeMap<PortRange, Vec<IpAddr>> = BTreeMap::new();
        // Per pod, then per port: each range's addresses are normalised into a set below, so
        // the order they come in does not matter.
        for pod in self.pods_within(peers) {
            named_port_addrs(rule, peers, pod, |range, addr| {
                named.entry(range).or_default().push(addr)
            });
        }
        for (range, addrs) in named {
            if !addrs.is_empty() {
                clauses.push(Clause {
                    peers: PeerMatch::Addrs(Arc::new(AddrSet::from_addrs(addrs))),
                    ports: PortMatch::Only(vec![range]),
                });
            }
        }
        clauses
    }

    /// Adds Service virtual IPs (SPEC 3.2) to a rule's own egress clauses.
    fn with_service_vips(&self, mut clauses: Vec<Clause>) -> Vec<Clause> {
        let mut vips: BTreeMap<PortRange, Vec<IpAddr>> = BTreeMap::new();
        for key in self.services_reachable_from(&clauses) {
            let Some(entry) = self.services.get(key) else {
                continue;
            };
            for (range, vip) in vip_contribution(Some(entry), &clauses) {
                vips.entry(range).or_default().push(vip);
            }
        }
        for (range, addrs) in vips {
            clauses.push(Clause {
                peers: PeerMatch::Addrs(Arc::new(AddrSet::from_addrs(addrs))),
                ports: PortMatch::Only(vec![range]),
            });
        }
        clauses
    }

    /// The pods with an address in one of `peers` (the only ones an egress named port can
    /// resolve on), each once, in key order.
    fn pods_within(&self, peers: &[PeerMatch]) -> Vec<&Pod> {
        let mut keys: BTreeSet<&PodKey> = BTreeSet::new();
        for peer in peers {
            let set = match peer {
                PeerMatch::Any => return self.pods().collect(),
                PeerMatch::Addrs(set) => set,
            };
            let v4 = set.v4_ranges().map(|(a, b)| (IpAddr::V4(a), IpAddr::V4(b)));
            let v6 = set.v6_ranges().map(|(a, b)| (IpAddr::V6(a), IpAddr::V6(b)));
            keys.extend(
                v4.chain(v6)
                    .flat_map(|(first, last)| self.pods_by_addr.range(first..=last))
                    .flat_map(|(_, keys)| keys),
            );
        }
        keys.into_iter().filter_map(|k| self.pod(k)).collect()
    }

    /// The Services with an endpoint address that one of `clauses` accepts: the only ones
    /// whose VIPs they can add (an exact filter, found by range lookups in the endpoint index).
    fn services_reachable_from(&self, clauses: &[Clause]) -> BTreeSet<&ObjectKey> {
        let mut out = BTreeSet::new();
        for clause in clauses {
            let set = match &clause.peers {
                PeerMatch::Any => return self.services.keys().collect(),
                PeerMatch::Addrs(set) => set,
            };
            let v4 = set.v4_ranges().map(|(a, b)| (IpAddr::V4(a), IpAddr::V4(b)));
            let v6 = set.v6_ranges().map(|(a, b)| (IpAddr::V6(a), IpAddr::V6(b)));
            for (first, last) in v4.chain(v6) {
                for (_, keys) in self.services_by_endpoint.range(first..=last) {
                    out.extend(keys);
                }
            }
        }
        out
    }

    /// The pod an EndpointSlice address belongs to: the first holder in key order.
    fn pod_by_addr(&self, addr: IpAddr) -> Option<&Pod> {
        self.pods_by_addr
            .get(&addr)
            .and_then(|holders| holders.first())
            .and_then(|key| self.pod(key))
    }

    fn resolved(
        &mut self,
        id: PolicyId,
        policy: &Policy,
        direction: Direction,
        index: usize,
        rule: &PolicyRule,
    ) -> Arc<ResolvedRule> {
        let key = RuleKey::new(id, direction, index);
        if let Some(hit) = self.cache.get(&key) {
            return hit.clone();
        }
        let resolved = Arc::new(self.resolve_rule(id, policy, direction, index, rule));
        self.cache.insert(key, resolved.clone());
        resolved
    }

    /// The allow rule of one policy rule for one target pod.
    fn allow_rule(
        &mut self,
        id: PolicyId,
        policy: &Policy,
        direction: Direction,
        index: usize,
        rule: &PolicyRule,
        target: &Pod,
    ) -> AllowRule {
        let resolved = self.resolved(id, policy, direction, index, rule);
        let origin = RuleOrigin {
            policy: policy.reference(),
            direction,
            index,
            mode: policy.mode,
        };
        let clauses = match direction {
            Direction::Egress => resolved.egress_clauses.clone(),
            Direction::Ingress => {
                let ports = if rule.ports.is_empty() {
                    Some(PortMatch::Any)
                } else {
                    let ranges: Vec<PortRange> = rule
                        .ports
                        .iter()
                        .filter_map(|p| resolve_on_target(p, target))
                        .collect();
                    (!ranges.is_empty()).then_some(PortMatch::Only(ranges))
                };
                ports
                    .map(|ports| clauses_per_peer(&resolved.peers, &ports))
                    .unwrap_or_default()
            }
        };
        AllowRule { origin, clauses }
    }

    /// Computes everything netwarden programs for one pod (`None` for an unknown pod).
    pub fn pod_rules(&mut self, key: &PodKey) -> Option<PodRules> {
        let pod = self.pod_slots[self.pods.get(key)?.0 as usize]
            .clone()
            .expect("a pod number in use");
        let policies: Vec<(PolicyId, Arc<Policy>)> = if pod.host_network {
            Vec::new()
        } else {
            let mut selecting: Vec<(PolicyId, Arc<Policy>)> = self
                .policies_by_target
                .candidates(&key.namespace, &Labels::new(), &pod.labels)
                .into_iter()
                .filter_map(|id| Some((*id, self.policy_by_id(*id)?.clone())))
                .filter(|(_, p)| selects(p, &pod))
                .collect();
            // In policy order, as the rules are listed.
            selecting.sort_by(|(_, a), (_, b)| (a.kind, &a.key).cmp(&(b.kind, &b.key)));
            selecting
        };
        // Enforced policies that a monitored policy replaces leave the staged view.
        let replaced: BTreeSet<String> = self
            .replaced_names
            .get(&key.namespace)
            .into_iter()
            .flat_map(BTreeMap::keys)
            .cloned()
            .collect();
        if self.lockdown.contains_key(key) {
            return Some(PodRules::lockdown(&pod));
        }
        let mut interfaces = Vec::new();
        for iface in &pod.interfaces {
            let mut ingress =
                self.direction_rules(&pod, iface, Direction::Ingress, &policies, &replaced);
            let mut egress =
                self.direction_rules(&pod, iface, Direction::Egress, &policies, &replaced);
            for (rules, direction) in [
                (&mut ingress, Direction::Ingress),
                (&mut egress, Direction::Egress),
            ] {
                rules.admin = self.tier_rules(&pod, iface, direction, Tier::Admin);
                rules.baseline = self.tier_rules(&pod, iface, direction, Tier::Baseline);
            }
            interfaces.push(InterfaceRules {
                name: iface.name.clone(),
                network: iface.network.clone(),
                ips: iface.ips.clone(),
                ingress,
                egress,
            });
        }
        Some(PodRules {
            pod: key.clone(),
            netns: pod.netns.clone(),
            interfaces,
            learn: self.learns(&pod),
        })
    }

    fn direction_rules(
        &mut self,
        pod: &Pod,
        iface: &PodInterface,
        direction: Direction,
        policies: &[(PolicyId, Arc<Policy>)],
        replaced_names: &BTreeSet<String>,
    ) -> DirectionRules {
        let isolating: Vec<&(PolicyId, Arc<Policy>)> = policies
            .iter()
            .filter(|(_, p)| p.rules(direction).is_some() && p.covers_interface(iface))
            .collect();
        if isolating.is_empty() {
            return DirectionRules::open();
        }
        let mut out = DirectionRules::open();
        let mut enforced_rules = Vec::new();
        let mut staged_rules = Vec::new();
        let mut any_staged = false;
        // Without a monitored or replaced policy the staged view is the enforced one: its
        // rules are not gathered twice.
        let staged_differs = isolating
            .iter()
            .any(|(_, p)| p.mode == Mode::Monitor || replaced_names.contains(&p.key.name));
        for (id, policy) in isolating {
            let reference = policy.reference();
            let replaced =
                policy.mode == Mode::Enforce && replaced_names.contains(&policy.key.name);
            let rules = policy.rules(direction).unwrap_or_default();
            let allow: Vec<AllowRule> = rules
                .iter()
                .enumerate()
                .map(|(i, r)| self.allow_rule(*id, policy, direction, i, r, pod))
                .collect();
            match policy.mode {
                Mode::Enforce => {
                    out.enforced_policies.push(reference.clone());
                    out.log_denies |= policy.log_denies;
                    if replaced {
                        out.replaced_policies.push(reference);
                    } else {
                        any_staged = true;
                        if staged_differs {
                            staged_rules.extend(allow.iter().cloned());
                        }
                    }
                    enforced_rules.extend(allow);
                }
                Mode::Monitor => {
                    out.monitored_policies.push(reference);
                    any_staged = true;
                    staged_rules.extend(allow);
                }
            }
        }
        out.log_denies |= self.options.log_all_denies;
        if direction == Direction::Egress {
            let dns = self.options.dns;
            let kind_of = |r: &PolicyRef| r.kind;
            out.implicit_dns = ImplicitDns {
                enforced: !out.enforced_policies.is_empty()
                    && dns.allows(out.enforced_policies.iter().map(kind_of)),
                staged: any_staged
                    && dns.allows(
                        out.enforced_policies
                            .iter()
                            .filter(|p| !out.replaced_policies.contains(p))
                            .chain(&out.monitored_policies)
                            .map(kind_of),
                    ),
            };
        }
        out.enforced = if out.enforced_policies.is_empty() {
            Isolation::Open
        } else {
            Isolation::Isolated(enforced_rules.into())
        };
        out.staged = if !out.has_monitor() {
            out.enforced.clone()
        } else if any_staged {
            Isolation::Isolated(staged_rules.into())
        } else {
            Isolation::Open
        };
        out
    }

    /// Rules for every pod, keyed by pod.
    pub fn all_pod_rules(&mut self) -> BTreeMap<PodKey, PodRules> {
        let keys: Vec<PodKey> = self.pods.keys().cloned().collect();
        self.every_pod_dirty = false;
        self.dirty.clear();
        keys.into_iter()
            .filter_map(|k| self.pod_rules(&k).map(|r| (k, r)))
            .collect()
    }
}

/// The pod half of [`Engine::peer_selects_pod`], for a pod of a namespace the peer accepts:
/// not host-network, and its labels match the peer's pod selector (if any).
fn peer_pod_matches(pod_selector: Option<&LabelSelector>, pod: &Pod) -> bool {
    !pod.host_network && pod_selector.is_none_or(|sel| sel.matches(&pod.labels))
}

/// Whether `policy` selects `pod` as a target.
pub fn selects(policy: &Policy, pod: &Pod) -> bool {
    !pod.host_network
        && policy.key.namespace == pod.key.namespace
        && policy.pod_selector.matches(&pod.labels)
}

/// The name of the policy `policy` replaces in the staged view: only a monitored policy does.
fn replaced_name(policy: &Policy) -> Option<&str> {
    (policy.mode == Mode::Monitor)
        .then_some(policy.replaces.as_deref())
        .flatten()
}

/// The [`PeerSetKey`] of a pod peer of `policy` (`None` for an ipBlock).
fn peer_set_key(policy: &Policy, peer: &Peer) -> Option<PeerSetKey> {
    let Peer::Pods {
        namespace_selector, ..
    } = peer
    else {
        return None;
    };
    Some((
        peer.clone(),
        namespace_selector
            .is_none()
            .then(|| policy.key.namespace.clone()),
        policy.kind,
        policy.scope.clone(),
    ))
}

/// Where a pod peer of `policy` looks for pods (`None` for an ipBlock).
fn peer_reach<'a>(policy: &'a Policy, peer: &'a Peer) -> Option<Reach<'a>> {
    let Peer::Pods {
        pod_selector,
        namespace_selector,
        ..
    } = peer
    else {
        return None;
    };
    Some(Reach {
        namespace: &policy.key.namespace,
        namespace_selector: namespace_selector.as_ref(),
        pod_selector: pod_selector.as_ref(),
    })
}

/// The endpoint addresses whose reachability decides what a Service change (`old` → `new`)
/// does to egress rules' VIPs: every endpoint when its VIPs or ports change, else the
/// endpoints that came, went or resolve their targets differently.
fn vip_relevant_addrs(old: Option<&ServiceEntry>, new: Option<&ServiceEntry>) -> BTreeSet<IpAddr> {
    let same_front = match (old, new) {
        (Some(o), Some(n)) => {
            o.service.cluster_ips == n.service.cluster_ips && o.service.ports == n.service.ports
        }
        _ => false,
    };
    match (old.map(|e| &e.endpoints), new.map(|e| &e.endpoints)) {
        (Some(o), Some(n)) if same_front => {
            o.symmetric_difference(n).map(|(addr, _)| *addr).collect()
        }
        (o, n) => o
            .into_iter()
            .chain(n)
            .flatten()
            .map(|(addr, _)| *addr)
            .collect(),
    }
}

fn service_selects(service: &Service, pod: &Pod) -> bool {
    service.key.namespace == pod.key.namespace
        && service.selector.as_ref().is_some_and(|sel| {
            !sel.is_empty() && sel.iter().all(|(k, v)| pod.labels.get(k) == Some(v))
        })
}

/// How the endpoint index changes when `key`'s endpoints go from `old` to `new`: (address,
/// Service, added) for each address only one of them has.
fn endpoint_moves(
    key: &ObjectKey,
    old: &Endpoints,
    new: &Endpoints,
) -> Vec<(IpAddr, ObjectKey, bool)> {
    let old: BTreeSet<IpAddr> = old.iter().map(|(a, _)| *a).collect();
    let new: BTreeSet<IpAddr> = new.iter().map(|(a, _)| *a).collect();
    let gone = old.difference(&new).map(|a| (*a, key.clone(), false));
    let came = new.difference(&old).map(|a| (*a, key.clone(), true));
    gone.chain(came).collect()
}

/// The port each of `service`'s ports targets on the pod behind an endpoint (`None` for a
/// named target the pod does not declare, or when no pod is known).
fn service_targets(service: &Service, pod: Option<&Pod>) -> Vec<Option<u16>> {
    service
        .ports
        .iter()
        .map(|sp| match &sp.target {
            PortRef::Number(n) => Some(*n),
            PortRef::Named(name) => pod.and_then(|p| p.named_port(name, sp.protocol)),
        })
        .collect()
}

/// The (port, VIP) pairs a Service adds to egress clauses `base` (SPEC 3.2): ClusterIP:port
/// is allowed when `base` allows one of the Service's endpoints on the port it targets.
fn vip_contribution(
    entry: Option<&ServiceEntry>,
    base: &[Clause],
) -> BTreeSet<(PortRange, IpAddr)> {
    let mut out = BTreeSet::new();
    let Some(ServiceEntry { service, endpoints }) = entry else {
        return out;
    };
    if service.cluster_ips.is_empty() {
        return out;
    }
    for (i, sp) in service.ports.iter().enumerate() {
        let reachable = endpoints.iter().any(|(addr, targets)| {
            targets[i].is_some_and(|t| base.iter().any(|c| c.matches(*addr, sp.protocol, t)))
        });
        if reachable {
            let range = PortRange {
                protocol: sp.protocol,
                ports: Some((sp.port, sp.port)),
            };
            out.extend(service.cluster_ips.iter().map(|vip| (range, *vip)));
        }
    }
    out
}

/// One clause per peer, all on `ports`.
fn clauses_per_peer(peers: &[PeerMatch], ports: &PortMatch) -> Vec<Clause> {
    peers
        .iter()
        .map(|peers| Clause {
            peers: peers.clone(),
            ports: ports.clone(),
        })
        .collect()
}

/// Whether one of `peers` accepts `addr`.
fn any_contains(peers: &[PeerMatch], addr: IpAddr) -> bool {
    peers.iter().any(|p| p.contains(addr))
}

/// What `pod` adds to the named-port clauses of an egress `rule` whose peers are `peers`: per
/// named port it declares, its addresses the peers allow, on its number for that name.
fn named_port_contribution(
    rule: &PolicyRule,
    peers: &[PeerMatch],
    pod: Option<&Pod>,
) -> BTreeSet<(PortRange, IpAddr)> {
    let mut out = BTreeSet::new();
    if let Some(pod) = pod {
        named_port_addrs(rule, peers, pod, |range, addr| {
            out.insert((range, addr));
        });
    }
    out
}

/// Calls `add` with each (port, address) that `pod` gives an egress `rule`'s named ports: the
/// number the pod declares for the name, on each of its addresses the peers allow (none for a
/// hostNetwork pod). The one place egress clauses and their cache invalidation
/// ([`named_port_contribution`]) read a pod's named ports, so the two cannot disagree.
fn named_port_addrs(
    rule: &PolicyRule,
    peers: &[PeerMatch],
    pod: &Pod,
    mut add: impl FnMut(PortRange, IpAddr),
) {
    if pod.host_network {
        return;
    }
    for port in &rule.ports {
        let Some(PortRef::Named(name)) = &port.port else {
            continue;
        };
        let Some(number) = pod.named_port(name, port.protocol) else {
            continue;
        };
        let range = PortRange {
            protocol: port.protocol,
            ports: Some((number, number)),
        };
        let addrs = pod.interfaces.iter().flat_map(|i| i.ips.iter().copied());
        for addr in addrs.filter(|a| any_contains(peers, *a)) {
            add(range, addr);
        }
    }
}

/// Whether a Service's endpoints, or the ports they resolve named targets on, can change with
/// `pod`: the pods its selector picks, and for EndpointSlice addresses the pods holding one
/// (a named target port resolves on the pod behind the address).
fn service_depends_on_pod(service: &Service, pod: &Pod) -> bool {
    service_selects(service, pod)
        || (service.selector.is_none()
            && pod
                .interfaces
                .iter()
                .any(|i| i.ips.iter().any(|ip| service.endpoint_addrs.contains(ip))))
}

/// The addresses a selected peer pod contributes, by policy kind (SPEC 3, "Per kind").
fn contributed_addrs<'a>(
    policy: &'a Policy,
    peer: &'a Peer,
    pod: &'a Pod,
) -> impl Iterator<Item = IpAddr> + 'a {
    addrs_counted(policy.kind, &policy.scope, peer, pod)
}

/// [`contributed_addrs`] from what it depends on: the policy's kind and scope.
fn addrs_counted<'a>(
    kind: PolicyKind,
    scope: &'a PolicyScope,
    peer: &'a Peer,
    pod: &'a Pod,
) -> impl Iterator<Item = IpAddr> + 'a {
    let network_selector = match peer {
        Peer::Pods {
            network_selector, ..
        } => network_selector.as_ref(),
        Peer::IpBlock(_) => None,
    };
    pod.interfaces
        .iter()
        .filter(move |iface| match kind {
            PolicyKind::NetworkPolicy => iface.is_primary(),
            PolicyKind::DanmNetworkPolicy => network_selector.is_none_or(|entries| {
                entries
                    .iter()
                    .any(|e| e.matches(&iface.network, &pod.key.namespace))
            }),
            PolicyKind::MultiNetworkPolicy => scope.covers(iface),
        })
        .flat_map(|iface| iface.ips.iter().copied())
}

fn numeric_range(port: &PolicyPort) -> Option<PortRange> {
    match &port.port {
        None => Some(PortRange {
            protocol: port.protocol,
            ports: None,
        }),
        Some(PortRef::Number(n)) => Some(PortRange {
            protocol: port.protocol,
            ports: Some((*n, port.end_port.unwrap_or(*n).max(*n))),
        }),
        Some(PortRef::Named(_)) => None,
    }
}

/// An ingress port resolved on the target pod itself (the destination of ingress traffic).
fn resolve_on_target(port: &PolicyPort, target: &Pod) -> Option<PortRange> {
    match &port.port {
        Some(PortRef::Named(name)) => target.named_port(name, port.protocol).map(|n| PortRange {
            protocol: port.protocol,
            ports: Some((n, n)),
        }),
        _ => numeric_range(port),
    }
}
