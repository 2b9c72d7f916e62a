//! [`ClusterSet`]: the objects of a live cluster, as a watch delivers them one at a time,
//! reduced by exactly the code that loads manifests.
//!
//! Each object is kept as the first pass (`read`) of a one-document "file" named by its kind,
//! namespace and name, and [`ClusterSet::inventory`] runs the loader's second pass (`assemble`)
//! over all of them. So the cluster and a directory holding the same objects give the same
//! [`Inventory`], problems included (kind, `ns/name`, field, reason), and the agent feeds the
//! engine the same way from both.
//!
//! Only reduced objects are held (labels, addresses, ports, policy specs), never a full Pod
//! spec or status: memory follows what the engine needs, not what the API server stores.
//! Pods and policies are held as `Arc`s, and the deltas hand on those same `Arc`s: the engine
//! keeps them, so the agent holds each object once.
//! [`ClusterSet::upsert`] says whether the reduced object changed, so an update that touches
//! nothing netwarden reads (`status.conditions`, `resourceVersion`, `managedFields`, a
//! container image) causes no work downstream.
//!
//! The node agent does not assemble the whole cluster after each event: every object belongs
//! to one *unit* (a Pod with the DanmEps that name it, a Service with its EndpointSlices, a
//! Namespace, or an object on its own such as a policy), and [`ClusterSet::take_delta`] runs
//! the same second pass over only the units touched since the last call, keeping what it
//! needs to say what was removed, which namespaces exist only because objects refer to them,
//! and which pods share an address. [`ClusterSet::inventory`] (the whole view, for analysis)
//! and the deltas always agree: a property test feeds both the same random operations.
//!
//! An update the reader rejects (a field of the wrong type in a policy CRD, say) keeps the last
//! good version of that object, with a warning, exactly as a manifest file being edited does
//! ([`crate::ManifestSet`]); only a delete (or a relist that no longer has it) removes an
//! object.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use netwarden_engine::sorted::{insert_sorted, remove_sorted};
use netwarden_engine::{AdminPolicy, Namespace, NetworkId, ObjectKey, Pod, PolicyRef};
use serde_json::Value;

use crate::assemble::{
    ambiguous_address, assemble, assemble_shared, report_equal_priorities, Part,
};
use crate::overlay::{self, Layered};
use crate::read::{FileRead, Object, Outcome};
use crate::set::merge;
use crate::{
    validate, Inventory, InventoryDelta, LoadOptions, Problem, Severity, NAMESPACE_NAME_LABEL,
};

/// What problems name as the "file" of an object read from the cluster.
pub const CLUSTER_SOURCE: &str = "cluster";

/// How the API names an object: kind, namespace (`""` for cluster-scoped kinds) and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterKey {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl ClusterKey {
    pub fn new(
        kind: impl Into<String>,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        ClusterKey {
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// `ns/name`, or `name` for a cluster-scoped kind, as problems name objects: escaped and
    /// shortened as the loader does (the parts are whatever the object said, valid or not).
    pub fn object(&self) -> String {
        let name = if self.name.is_empty() {
            "(no name)".to_string()
        } else {
            validate::shorten(&self.name)
        };
        if self.namespace.is_empty() {
            name
        } else {
            format!("{}/{name}", validate::shorten(&self.namespace))
        }
    }

    /// The key of an object as the API serves it (missing parts read as `""`: such an object
    /// is still held, with the reader's problem, so that its delete finds it).
    pub fn of(object: &Value) -> Self {
        let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_string();
        let meta = object.get("metadata");
        ClusterKey {
            kind: text(object.get("kind")),
            namespace: text(meta.and_then(|m| m.get("namespace"))),
            name: text(meta.and_then(|m| m.get("name"))),
        }
    }
}

impl fmt::Display for ClusterKey {
    /// `Kind ns/name` (`Kind name` when cluster-scoped). A missing kind or name is said so:
    /// the text labels the object's problems, which must name something.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.kind.is_empty() {
            "(no kind)".to_string()
        } else {
            validate::shorten(&self.kind)
        };
        write!(f, "{kind} {}", self.object())
    }
}

/// What one object of the assembled view is built from: a change to any member makes the
/// unit assemble again (see the [module documentation](self)).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Unit {
    /// A Namespace object (its presence also follows the objects that refer to it).
    Namespace(String),
    /// A Pod and the DanmEps that name it.
    Pod(String, String),
    /// A Service and the EndpointSlices that name it.
    Service(String, String),
    /// An object on its own: a policy, or an object of our kinds that did not load (boxed: the
    /// rarer variant is kept from making every unit key, pods' included, larger).
    Alone(Box<ClusterKey>),
}

impl Unit {
    /// The unit of one held object (`read` is its one-document first pass).
    fn of(key: &ClusterKey, read: &FileRead) -> Unit {
        let loaded = read.entries.iter().find_map(|e| match &e.outcome {
            Outcome::Loaded(o) => Some(o),
            _ => None,
        });
        let Some(object) = loaded else {
            return Unit::Alone(Box::new(key.clone()));
        };
        let pair = |(ns, name): (&str, &str)| (ns.to_string(), name.to_string());
        match &object.object {
            Object::Namespace(n) => Unit::Namespace(n.name.clone()),
            Object::Pod(_) => Unit::Pod(object.id.namespace.clone(), object.id.name.clone()),
            Object::DanmEp(ep) => {
                let (ns, name) = pair(ep.pod_key());
                Unit::Pod(ns, name)
            }
            Object::Service(_) => {
                Unit::Service(object.id.namespace.clone(), object.id.name.clone())
            }
            Object::Slice(slice) => {
                let (ns, name) = pair(slice.service_key());
                Unit::Service(ns, name)
            }
            Object::Policy(_) | Object::AdminPolicy(_) | Object::Node(_) => {
                Unit::Alone(Box::new(key.clone()))
            }
        }
    }
}

/// The object a unit produced at its last assembly.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Produced {
    Namespace(Box<Namespace>),
    /// The pod handed to the engine (shared: its addresses are read from it).
    Pod(Arc<Pod>),
    Service(ObjectKey),
    Policy(PolicyRef),
    /// Shared: [`ClusterSet::problems`] compares the priorities of all of them.
    AdminPolicy(Arc<AdminPolicy>),
    Node(String),
}

impl Produced {
    /// The namespace an object of this unit makes exist (Namespaces themselves aside).
    fn refers_to(&self) -> Option<&str> {
        match self {
            Produced::Namespace(_) => None,
            Produced::Pod(pod) => Some(&pod.key.namespace),
            Produced::Service(key) => Some(&key.namespace),
            Produced::Policy(r) => Some(&r.key.namespace),
            // Cluster-scoped.
            Produced::AdminPolicy(_) | Produced::Node(_) => None,
        }
    }
}

/// A unit as last assembled.
#[derive(Debug, Clone, Default)]
struct UnitState {
    produced: Option<Produced>,
    /// Its problems (reading and joining).
    problems: Vec<Problem>,
}

impl UnitState {
    /// The pod it produced, if any.
    fn pod(&self) -> Option<&Arc<Pod>> {
        match &self.produced {
            Some(Produced::Pod(pod)) => Some(pod),
            _ => None,
        }
    }

    /// A pod's addresses (network, address, interface name), for the claimed-twice check;
    /// none for a hostNetwork pod (it shares the node's by design).
    fn addresses(&self) -> impl Iterator<Item = (&NetworkId, IpAddr, &str)> {
        self.pod()
            .filter(|pod| !pod.host_network)
            .into_iter()
            .flat_map(|pod| &pod.interfaces)
            .flat_map(|iface| {
                iface
                    .ips
                    .iter()
                    .map(move |ip| (&iface.network, *ip, iface.name.as_str()))
            })
    }
}

/// One unit: its objects, and what it produced at its last assembly. Kept while it has
/// either (a unit whose last object is gone keeps its state until the next delta removes what
/// it produced).
#[derive(Debug, Default)]
struct UnitEntry {
    /// Its objects, sorted (most units have one: a `Vec`, not a tree, per unit).
    members: Vec<ClusterKey>,
    state: UnitState,
}

impl UnitEntry {
    fn is_empty(&self) -> bool {
        self.members.is_empty() && self.state.produced.is_none() && self.state.problems.is_empty()
    }
}

/// The incremental second pass: units, what each produced, and the cross-unit facts (which
/// namespaces objects refer to, which pods hold each address).
#[derive(Debug, Default)]
struct Assembled {
    /// Every unit, its members and state under one key (a node agent holds one per pod).
    /// The entries are boxed: a table slot holds a key and a pointer (64 bytes, not ~190), so
    /// each doubling while a list fills it copies and faults in a third of the memory, and the
    /// table's empty slots (up to half of it after a doubling) cost a third as much. At
    /// 100,000 pods the growth was ~22% of reducing an object during the initial list.
    units: HashMap<Unit, Box<UnitEntry>>,
    /// Units touched since the last delta.
    dirty: BTreeSet<Unit>,
    /// Per namespace, how many units produce an object in it.
    references: HashMap<String, usize>,
    /// The namespaces the last delta left in the engine's view.
    present: BTreeSet<String>,
    /// The pods holding each address, on any network (hostNetwork pods left out).
    /// Sorted by key; the pods themselves (shared), not copies of their keys.
    owners: HashMap<IpAddr, Vec<Arc<Pod>>>,
    /// Addresses held by more than one pod, with the problems saying so.
    shared: BTreeMap<IpAddr, Vec<Problem>>,
}

/// The cluster's objects, reduced; see the [module documentation](self).
#[derive(Debug)]
pub struct ClusterSet {
    opts: LoadOptions,
    /// One first pass per object; only objects of the kinds netwarden reads (and those of its
    /// kinds that could not be read, with their problems) are held.
    objects: BTreeMap<ClusterKey, FileRead>,
    /// Objects held per kind.
    counts: BTreeMap<String, usize>,
    assembled: Assembled,
    /// Problems of the last LIST of each kind that are not any one held object's: an object
    /// named twice in one list (the second ignored), an item of another kind (ignored).
    list_problems: BTreeMap<String, Vec<Problem>>,
}

impl ClusterSet {
    pub fn new(opts: LoadOptions) -> Self {
        ClusterSet {
            opts,
            objects: BTreeMap::new(),
            counts: BTreeMap::new(),
            assembled: Assembled::default(),
            list_problems: BTreeMap::new(),
        }
    }

    /// Reports a problem of the list of `kind` in progress (the lister skipped what it is
    /// about): kept, in [`ClusterSet::problems`] and the inventory, until
    /// [`ClusterSet::clear_list_problems`] for that kind. Whether it is new.
    pub fn report_list_problem(&mut self, kind: &str, problem: Problem) -> bool {
        let problems = self.list_problems.entry(kind.to_string()).or_default();
        if problems.contains(&problem) {
            return false;
        }
        problems.push(problem);
        true
    }

    /// Forgets the list problems of `kind` (a new list of it starts, or it is no longer
    /// listed). Whether there were any.
    pub fn clear_list_problems(&mut self, kind: &str) -> bool {
        self.list_problems.remove(kind).is_some()
    }

    fn list_problems(&self) -> impl Iterator<Item = &Problem> {
        self.list_problems.values().flatten()
    }

    /// Holds `read` as the object `key` (replacing what was held), keeping the units and
    /// counts in step.
    fn hold(&mut self, key: ClusterKey, read: FileRead) {
        let unit = Unit::of(&key, &read);
        self.release(&key);
        // Counted without copying the kind, but for the first object of a kind.
        match self.counts.get_mut(&key.kind) {
            Some(n) => *n += 1,
            None => {
                self.counts.insert(key.kind.clone(), 1);
            }
        }
        let a = &mut self.assembled;
        let entry = a.units.entry(unit.clone()).or_default();
        insert_sorted(&mut entry.members, key.clone());
        entry.members.shrink_to_fit();
        a.dirty.insert(unit);
        self.objects.insert(key, read);
    }

    /// Stops holding `key`; whether it was held.
    fn release(&mut self, key: &ClusterKey) -> bool {
        let Some(read) = self.objects.remove(key) else {
            return false;
        };
        if let Some(n) = self.counts.get_mut(&key.kind) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&key.kind);
            }
        }
        let a = &mut self.assembled;
        let unit = Unit::of(key, &read);
        if let Some(entry) = a.units.get_mut(&unit) {
            remove_sorted(&mut entry.members, key);
            if entry.is_empty() {
                a.units.remove(&unit);
            }
        }
        a.dirty.insert(unit);
        true
    }

    /// Adds or replaces one object (JSON as the API serves it, with `apiVersion` and `kind`).
    /// Returns whether the reduced object (or its problems) changed: `false` means nothing
    /// netwarden reads changed, and no work should follow.
    pub fn upsert(&mut self, object: &Value) -> bool {
        let key = ClusterKey::of(object);
        let mut seen = FileRead {
            documents: 1,
            ..FileRead::default()
        };
        seen.add_value(CLUSTER_SOURCE, &key.to_string(), object);
        let previous = self.objects.get(&key);
        let mut next = merge(CLUSTER_SOURCE, previous.cloned(), seen);
        // What the merge says about the "file" as a whole (keeping the last good version of
        // a version it cannot identify) names no object; here the file is this object.
        for problem in &mut next.file_problems {
            if problem.object.is_empty() {
                problem.kind.clone_from(&key.kind);
                problem.object = key.object();
            }
        }
        // Held for as long as the object exists: without the room a growing vector keeps
        // (four entries of 136 bytes for the one an object has).
        next.entries.shrink_to_fit();
        next.file_problems.shrink_to_fit();
        if next.entries.is_empty() && next.file_problems.is_empty() {
            // Not one of our kinds (or nothing of it to keep).
            return self.release(&key);
        }
        if previous == Some(&next) {
            return false;
        }
        self.hold(key, next);
        true
    }

    /// Removes one object; returns whether it was held.
    pub fn remove(&mut self, kind: &str, namespace: &str, name: &str) -> bool {
        self.release(&ClusterKey::new(kind, namespace, name))
    }

    /// After a relist of `kind`: removes the objects of that kind not in `present` (they were
    /// deleted while the watch was down). Returns the keys removed.
    pub fn retain_kind(&mut self, kind: &str, present: &BTreeSet<ClusterKey>) -> Vec<ClusterKey> {
        let gone: Vec<ClusterKey> = self
            .objects
            .keys()
            .filter(|k| k.kind == kind && !present.contains(*k))
            .cloned()
            .collect();
        for key in &gone {
            self.release(key);
        }
        gone
    }

    /// How many objects of each kind are held (kept as objects come and go: asked after
    /// every event).
    pub fn counts(&self) -> BTreeMap<String, usize> {
        self.counts.clone()
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Everything held, through the loader's second pass (DanmEps joined to pods,
    /// EndpointSlices to Services, implicit namespaces added), with every problem.
    pub fn inventory(&self) -> Inventory {
        let mut inv = assemble(self.objects.values().map(Part::File), &self.opts);
        inv.problems.extend(self.list_problems().cloned());
        inv
    }

    /// What changed in the assembled view since the last call (the first call: everything),
    /// assembling again only the units touched since (see the [module documentation](self)).
    pub fn take_delta(&mut self) -> InventoryDelta {
        let mut delta = InventoryDelta::default();
        let a = &mut self.assembled;
        let dirty = std::mem::take(&mut a.dirty);
        // Namespaces whose presence may change: declared or no longer, referred to or no longer.
        let mut namespaces: BTreeSet<String> = BTreeSet::new();
        // Addresses whose owners changed.
        let mut addresses: BTreeSet<IpAddr> = BTreeSet::new();
        for unit in dirty {
            let old = a
                .units
                .get_mut(&unit)
                .map(|e| std::mem::take(&mut e.state))
                .unwrap_or_default();
            let parts = a
                .units
                .get(&unit)
                .into_iter()
                .flat_map(|e| &e.members)
                .filter_map(|key| self.objects.get(key))
                .map(Part::File);
            let mut inv = assemble_shared(parts, &self.opts);
            let mut new = UnitState {
                problems: std::mem::take(&mut inv.problems),
                ..UnitState::default()
            };
            if let Unit::Namespace(name) = &unit {
                new.produced = inv
                    .namespaces
                    .into_iter()
                    .find(|n| &n.name == name)
                    .map(|n| Produced::Namespace(Box::new(n)));
                namespaces.insert(name.clone());
            } else if let Some(pod) = inv.pods.pop() {
                new.produced = Some(Produced::Pod(pod.clone()));
                delta.pods.push(pod);
            } else if let Some(service) = inv.services.pop() {
                new.produced = Some(Produced::Service(service.key.clone()));
                delta.services.push(service);
            } else if let Some(policy) = inv.policies.pop() {
                new.produced = Some(Produced::Policy(policy.reference()));
                delta.policies.push(policy);
            } else if let Some(policy) = inv.admin_policies.pop() {
                new.produced = Some(Produced::AdminPolicy(policy.clone()));
                delta.admin_policies.push(policy);
            } else if let Some(node) = inv.nodes.pop() {
                new.produced = Some(Produced::Node(node.name.clone()));
                delta.nodes.push(node);
            }
            // What the unit produced before and not now is removed.
            match (&old.produced, &new.produced) {
                (Some(Produced::Pod(old)), n) if !matches!(n, Some(Produced::Pod(new)) if new.key == old.key) => {
                    delta.pods_removed.push(old.key.clone())
                }
                (Some(Produced::Service(k)), n) if n != &Some(Produced::Service(k.clone())) => {
                    delta.services_removed.push(k.clone())
                }
                (Some(Produced::Policy(r)), n) if n != &Some(Produced::Policy(r.clone())) => {
                    delta.policies_removed.push(r.clone())
                }
                (Some(Produced::AdminPolicy(old)), n) if !matches!(n, Some(Produced::AdminPolicy(new)) if new.reference() == old.reference()) => {
                    delta.admin_policies_removed.push(old.reference())
                }
                (Some(Produced::Node(old)), n) if n != &Some(Produced::Node(old.clone())) => {
                    delta.nodes_removed.push(old.clone())
                }
                _ => {}
            }
            for (produced, step) in [(&old.produced, -1isize), (&new.produced, 1)] {
                if let Some(ns) = produced.as_ref().and_then(Produced::refers_to) {
                    let n = a.references.entry(ns.to_string()).or_insert(0);
                    *n = n.checked_add_signed(step).unwrap_or(0);
                    if *n == 0 {
                        a.references.remove(ns);
                    }
                    namespaces.insert(ns.to_string());
                }
            }
            if let Some(pod) = old.pod() {
                for (_, slot, _) in old.addresses() {
                    if let Some(owners) = a.owners.get_mut(&slot) {
                        if let Ok(i) = owners.binary_search_by(|p| p.key.cmp(&pod.key)) {
                            owners.remove(i);
                        }
                        if owners.is_empty() {
                            a.owners.remove(&slot);
                        }
                    }
                    addresses.insert(slot);
                }
            }
            if let Some(pod) = new.pod() {
                for (_, slot, _) in new.addresses() {
                    let owners = a
                        .owners
                        .entry(slot)
                        .or_insert_with(|| Vec::with_capacity(1));
                    match owners.binary_search_by(|p| p.key.cmp(&pod.key)) {
                        Ok(i) => owners[i] = pod.clone(),
                        Err(i) => owners.insert(i, pod.clone()),
                    }
                    addresses.insert(slot);
                }
            }
            match a.units.entry(unit) {
                Entry::Occupied(mut held) => {
                    held.get_mut().state = new;
                    if held.get().is_empty() {
                        held.remove();
                    }
                }
                Entry::Vacant(free) => {
                    let entry = UnitEntry {
                        members: Vec::new(),
                        state: new,
                    };
                    if !entry.is_empty() {
                        free.insert(Box::new(entry));
                    }
                }
            }
        }
        for name in namespaces {
            let declared = match a
                .units
                .get(&Unit::Namespace(name.clone()))
                .map(|e| &e.state)
            {
                Some(UnitState {
                    produced: Some(Produced::Namespace(ns)),
                    ..
                }) => Some((**ns).clone()),
                _ => None,
            };
            let implicit = || {
                a.references.contains_key(&name).then(|| Namespace {
                    name: name.clone(),
                    labels: netwarden_engine::Labels::from([(
                        NAMESPACE_NAME_LABEL.to_string(),
                        name.clone(),
                    )]),
                    learn: false,
                })
            };
            match declared.or_else(implicit) {
                Some(ns) => {
                    a.present.insert(name);
                    delta.namespaces.push(ns);
                }
                None => {
                    if a.present.remove(&name) {
                        delta.namespaces_removed.push(name);
                    }
                }
            }
        }
        for slot in addresses {
            a.shared.remove(&slot);
            let Some(owners) = a.owners.get(&slot).filter(|o| o.len() > 1) else {
                continue;
            };
            let mut owners = owners.iter();
            let Some(first) = owners.next().map(|pod| &pod.key) else {
                continue;
            };
            let problems: Vec<Problem> = owners
                .map(|pod| &pod.key)
                .flat_map(|key| {
                    let state = a
                        .units
                        .get(&Unit::Pod(key.namespace.clone(), key.name.clone()))
                        .map(|e| &e.state);
                    state
                        .into_iter()
                        .flat_map(UnitState::addresses)
                        .filter(|(_, ip, _)| *ip == slot)
                        .map(|(net, ip, iface)| Problem {
                            file: CLUSTER_SOURCE.into(),
                            kind: "Pod".into(),
                            object: key.to_string(),
                            field: String::new(),
                            reason: ambiguous_address(ip, net, iface, first, CLUSTER_SOURCE),
                            severity: Severity::Error,
                        })
                        .collect::<Vec<_>>()
                })
                .collect();
            a.shared.insert(slot, problems);
        }
        delta
    }

    /// Every problem of the assembled view as of the last [`ClusterSet::take_delta`]: those of
    /// each unit, then the shared addresses, then admin policies sharing a priority.
    pub fn problems(&self) -> Vec<Problem> {
        let mut admin: Vec<(Arc<AdminPolicy>, String, String)> = self
            .assembled
            .units
            .values()
            .filter_map(|e| match &e.state.produced {
                Some(Produced::AdminPolicy(p)) => Some((
                    p.clone(),
                    CLUSTER_SOURCE.to_string(),
                    validate::shorten(&p.name),
                )),
                _ => None,
            })
            .collect();
        admin.sort_by(|a, b| a.0.order(&b.0));
        let mut equal_priorities = Vec::new();
        report_equal_priorities(&admin, &mut equal_priorities);
        let mut units: Vec<(&Unit, &UnitState)> = self
            .assembled
            .units
            .iter()
            .map(|(unit, e)| (unit, &e.state))
            .filter(|(_, s)| !s.problems.is_empty())
            .collect();
        units.sort_by(|a, b| a.0.cmp(b.0));
        units
            .into_iter()
            .flat_map(|(_, s)| s.problems.iter().cloned())
            .chain(self.assembled.shared.values().flatten().cloned())
            .chain(equal_priorities)
            .chain(self.list_problems().cloned())
            .collect()
    }

    /// "The cluster plus these files" (`reach`/`explain`/`validate --kube -f`): the manifests
    /// under `paths` are read as `-f` reads them, and each object they hold replaces the
    /// cluster's object of the same kind, namespace and name; a file object the cluster does
    /// not have is added. An object a file names but cannot load (rejected by an error)
    /// still hides the cluster's version: the user meant to replace it, and analysing the old
    /// one instead would answer a question nobody asked. Two objects with the same name inside
    /// the files stay duplicates (an error), exactly as without `--kube`. An object annotated
    /// `netwarden.io/delete: "true"` deletes the cluster's object ([`crate::overlay`]).
    pub fn overlay(&self, paths: &[PathBuf]) -> Inventory {
        self.lay_over(&overlay::read_paths(paths)).0
    }

    /// `netwarden diff --kube --with CHANGES`: the cluster as it is, and with the changes laid
    /// over it as [`ClusterSet::overlay`] does, deletion markers included ([`crate::overlay`]).
    pub fn layer(&self, changes: &[PathBuf]) -> Layered {
        let (changed, unmatched_deletions) = self.lay_over(&overlay::read_paths(changes));
        Layered {
            base: self.inventory(),
            changed,
            unmatched_deletions,
        }
    }

    fn lay_over(&self, changes: &[overlay::Step]) -> (Inventory, Vec<Problem>) {
        let (mut inv, problems) =
            overlay::lay_over(self.objects.values().map(Part::File), changes, &self.opts);
        inv.problems.extend(self.list_problems().cloned());
        (inv, problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_str, Severity};
    use serde_json::json;

    /// A unit table slot stays a pod's two names and a pointer (see [`Assembled::units`]).
    #[test]
    fn a_unit_table_slot_stays_small() {
        let slot = std::mem::size_of::<(Unit, Box<UnitEntry>)>();
        assert!(slot <= 64, "{slot} bytes");
    }

    fn pod(name: &str, labels: Value, node: &str, ip: &str) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "labels": labels,
                         "resourceVersion": "1", "uid": "u-1",
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox:1",
                     "ports": [{"name": "http", "containerPort": 80}]}]},
            "status": {"podIPs": [{"ip": ip}], "phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True"}]}
        })
    }

    fn objects() -> Vec<Value> {
        vec![
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "ns", "labels": {"team": "a"}}}),
            pod("a", json!({"app": "web"}), "n1", "10.0.0.1"),
            pod("b", json!({"app": "db"}), "n2", "10.0.0.2"),
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                   "metadata": {"name": "deny", "namespace": "ns"},
                   "spec": {"podSelector": {"matchLabels": {"app": "db"}},
                            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}}),
            json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": "db", "namespace": "ns"},
                   "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "db"},
                            "ports": [{"port": 5432}]}}),
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                   "metadata": {"name": "db-x", "namespace": "ns",
                                "labels": {"kubernetes.io/service-name": "db"}},
                   "addressType": "IPv4",
                   "endpoints": [{"addresses": ["10.0.0.2"], "conditions": {"ready": true}}]}),
            // Not ours: ignored by both.
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": "d", "namespace": "ns"}}),
        ]
    }

    /// The inventory with every list in a canonical order (a directory loads in file order,
    /// the cluster in key order).
    fn sorted(mut inv: Inventory) -> Inventory {
        inv.namespaces.sort_by(|a, b| a.name.cmp(&b.name));
        inv.pods.sort_by(|a, b| a.key.cmp(&b.key));
        inv.policies.sort_by_key(|p| p.reference());
        inv.services.sort_by(|a, b| a.key.cmp(&b.key));
        inv.problems.sort_by_key(|p| p.to_string());
        inv
    }

    fn as_file(objects: &[Value]) -> Inventory {
        let text: String = objects.iter().map(|o| format!("---\n{o}\n")).collect();
        parse_str(CLUSTER_SOURCE, &text, &LoadOptions::default())
    }

    #[test]
    fn the_cluster_reduces_objects_as_the_loader_does() {
        let mut set = ClusterSet::new(LoadOptions::default());
        for o in objects() {
            set.upsert(&o);
        }
        let inv = set.inventory();
        assert_eq!(sorted(inv.clone()), sorted(as_file(&objects())));
        assert_eq!(inv.pods.len(), 2);
        let a = inv.pods.iter().find(|p| p.key.name == "a").unwrap();
        assert_eq!(a.node_name.as_deref(), Some("n1"));
        assert_eq!(inv.services.len(), 1);
        assert_eq!(
            set.counts().get("Deployment"),
            None,
            "other kinds are not held"
        );
        assert_eq!(set.counts()["Pod"], 2);
    }

    /// The agent holds each pod and policy once: a delta hands on the objects the set keeps,
    /// not copies (a DanmEp joined to a pod makes its own version of that pod).
    #[test]
    fn deltas_share_pods_and_policies_with_the_set() {
        /// The object the set holds under `kind`, `name` (namespace `ns`).
        fn held<'a>(set: &'a ClusterSet, kind: &str, name: &str) -> &'a Object {
            let read = &set.objects[&ClusterKey::new(kind, "ns", name)];
            match &read.entries[0].outcome {
                Outcome::Loaded(o) => &o.object,
                other => panic!("{kind} {name} not loaded: {other:?}"),
            }
        }
        let same_pod = |set: &ClusterSet, pod: &Arc<Pod>| match held(set, "Pod", &pod.key.name) {
            Object::Pod(rec) => Arc::ptr_eq(&rec.pod, pod),
            _ => false,
        };
        let mut set = ClusterSet::new(LoadOptions::default());
        for o in objects() {
            set.upsert(&o);
        }
        let first = set.take_delta();
        assert_eq!(first.pods.len(), 2);
        for pod in &first.pods {
            assert!(same_pod(&set, pod), "{}: the set's own", pod.key);
        }
        let Object::Policy(policy) = held(&set, "NetworkPolicy", "deny") else {
            panic!("not a policy");
        };
        assert!(Arc::ptr_eq(policy, &first.policies[0]));
        // Touching the unit again hands on the new version, again the set's own.
        set.upsert(&pod("a", json!({"app": "web2"}), "n1", "10.0.0.1"));
        let second = set.take_delta();
        assert_eq!(second.pods.len(), 1);
        assert!(same_pod(&set, &second.pods[0]));
        assert_eq!(second.pods[0].labels["app"], "web2");
    }

    #[test]
    fn changes_nobody_reads_cause_no_work() {
        let mut set = ClusterSet::new(LoadOptions::default());
        let original = pod("a", json!({"app": "web"}), "n1", "10.0.0.1");
        assert!(set.upsert(&original), "a new object is a change");
        assert!(!set.upsert(&original), "the same object again is not");
        let mut touched = original.clone();
        touched["metadata"]["resourceVersion"] = json!("2");
        touched["metadata"]["managedFields"] = json!([{"manager": "kubectl"}]);
        touched["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
        touched["status"]["phase"] = json!("Unknown");
        touched["spec"]["containers"][0]["image"] = json!("busybox:2");
        assert!(!set.upsert(&touched));
        // A label is read: a change.
        let mut relabelled = touched.clone();
        relabelled["metadata"]["labels"]["app"] = json!("api");
        assert!(set.upsert(&relabelled));
        // So is the node (binding a pending pod).
        let mut moved = relabelled.clone();
        moved["spec"]["nodeName"] = json!("n2");
        assert!(set.upsert(&moved));
        assert_eq!(
            set.inventory().pods[0].node_name.as_deref(),
            Some("n2"),
            "the reduced pod keeps spec.nodeName"
        );
        // Other kinds never are.
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                                "metadata": {"name": "d", "namespace": "ns"}});
        assert!(!set.upsert(&deployment));
        assert_eq!(set.len(), 1);
    }

    /// A directory removed on drop, for the overlay's files.
    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn files_replace_cluster_objects_of_the_same_kind_namespace_and_name() {
        let mut set = ClusterSet::new(LoadOptions::default());
        for o in objects() {
            set.upsert(&o);
        }
        let dir = Dir(std::env::temp_dir().join(format!("nw-overlay-{}", std::process::id())));
        std::fs::create_dir_all(&dir.0).unwrap();
        // `deny` now selects `web` pods instead of `db`; `c` is new; a rejected file object
        // (a service with a port of the wrong type) still hides the cluster's `db`.
        let changed = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "deny", "namespace": "ns"},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]}});
        let new_pod = pod("c", json!({"app": "db"}), "n1", "10.0.0.3");
        let broken_service = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "db", "namespace": "ns"},
            "spec": {"selector": {"app": "db"}, "ports": [{"port": "many"}]}});
        std::fs::write(
            dir.0.join("change.yaml"),
            format!("{changed}\n---\n{new_pod}\n---\n{broken_service}\n"),
        )
        .unwrap();
        let inv = set.overlay(std::slice::from_ref(&dir.0));
        assert_eq!(inv.policies.len(), 1, "replaced, not added: {inv:#?}");
        let deny = &inv.policies[0];
        assert_eq!(
            deny.pod_selector
                .match_labels
                .get("app")
                .map(String::as_str),
            Some("web")
        );
        let names: BTreeSet<_> = inv.pods.iter().map(|p| p.key.name.as_str()).collect();
        assert_eq!(names, BTreeSet::from(["a", "b", "c"]));
        assert!(
            inv.services.is_empty(),
            "the broken file Service hides the cluster's"
        );
        let problem = inv.errors().next().expect("the broken Service is reported");
        assert_eq!(
            (problem.kind.as_str(), problem.object.as_str()),
            ("Service", "ns/db")
        );
        assert!(problem.file.ends_with("change.yaml"), "{problem}");
        // The cluster itself is untouched.
        assert_eq!(set.inventory().services.len(), 1);

        // Two objects of the same name inside the files stay duplicates.
        std::fs::write(dir.0.join("again.yaml"), format!("{changed}\n")).unwrap();
        let inv = set.overlay(std::slice::from_ref(&dir.0));
        assert!(
            inv.errors().any(|p| p.reason.contains("duplicate")),
            "{:#?}",
            inv.problems
        );
    }

    #[test]
    fn removal_and_relist() {
        let mut set = ClusterSet::new(LoadOptions::default());
        for o in objects() {
            set.upsert(&o);
        }
        assert!(set.remove("Pod", "ns", "a"));
        assert!(!set.remove("Pod", "ns", "a"), "already gone");
        assert_eq!(set.inventory().pods.len(), 1);
        // A relist of pods that no longer has `b`; the other kinds are untouched.
        let gone = set.retain_kind("Pod", &BTreeSet::new());
        assert_eq!(gone, [ClusterKey::new("Pod", "ns", "b")]);
        let inv = set.inventory();
        assert!(inv.pods.is_empty());
        assert_eq!(inv.policies.len(), 1);
    }

    /// Issue 20, defect 5: `policyTypes: [Ingress, Sideways]` was enforced in its last good
    /// version by a running agent, then dropped after a restart (its pods open). Now a
    /// restarted agent isolates what it selects, allowing nothing; a running one keeps the
    /// last good version.
    #[test]
    fn an_unreadable_policy_fails_closed_unless_a_good_version_is_held() {
        let good = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                          "metadata": {"name": "p", "namespace": "ns"},
                          "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                                   "policyTypes": ["Ingress"],
                                   "ingress": [{"from": [{"podSelector": {}}]}]}});
        let mut bad = good.clone();
        bad["spec"]["policyTypes"] = json!(["Ingress", "Sideways"]);
        // Running: the good version stays.
        let mut running = ClusterSet::new(LoadOptions::default());
        running.upsert(&good);
        running.upsert(&bad);
        let kept = running.inventory();
        assert_eq!(kept.policies[0].ingress.as_ref().map(Vec::len), Some(1));
        // Restarted: only the bad version is listed; it isolates both directions (one of its
        // policyTypes cannot be read) of the pods it selects, allowing nothing.
        let mut restarted = ClusterSet::new(LoadOptions::default());
        restarted.upsert(&bad);
        let delta = restarted.take_delta();
        assert_eq!(delta.policies.len(), 1);
        let p = &delta.policies[0];
        assert_eq!(
            p.pod_selector,
            netwarden_engine::testing::selector(&[("app", "web")])
        );
        assert_eq!(
            (p.ingress.as_deref(), p.egress.as_deref()),
            (Some(&[][..]), Some(&[][..]))
        );
        assert!(restarted
            .problems()
            .iter()
            .any(|p| p.severity == Severity::Error && p.reason.contains("fail closed")));
        // Fixed: the fixed version replaces the fail-closed one.
        restarted.upsert(&good);
        assert_eq!(restarted.inventory().policies, kept.policies);
    }

    #[test]
    fn problems_name_kind_object_and_field_and_keep_the_last_good_version() {
        let mut set = ClusterSet::new(LoadOptions::default());
        let good = json!({"apiVersion": "danm.k8s.io/v1", "kind": "DanmNetworkPolicy",
                          "metadata": {"name": "p", "namespace": "ns"},
                          "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}});
        assert!(set.upsert(&good));
        let mut bad = good.clone();
        bad["spec"]["podSelector"] = json!([]);
        assert!(set.upsert(&bad), "the problem is news");
        let inv = set.inventory();
        assert_eq!(inv.policies.len(), 1, "the last good version stays");
        let error = inv
            .problems
            .iter()
            .find(|p| p.severity == Severity::Error)
            .expect("the rejection is reported");
        assert_eq!(
            (
                error.file.as_str(),
                error.kind.as_str(),
                error.object.as_str(),
                error.field.as_str()
            ),
            (
                CLUSTER_SOURCE,
                "DanmNetworkPolicy",
                "ns/p",
                "spec.podSelector"
            ),
            "{error}"
        );
        // The same problems as the loader finds for that object alone.
        let alone = as_file(std::slice::from_ref(&bad));
        assert!(alone.problems.contains(error), "{:?}", alone.problems);
        assert!(inv.problems.iter().any(|p| p.severity == Severity::Warning
            && p.reason.contains("keeping its last good version")));
        // A policy never seen good is loaded in its fail-closed form (SPEC 7): its selector
        // cannot be read, so it isolates its whole namespace in the direction it names.
        let mut fresh = bad.clone();
        fresh["metadata"]["name"] = json!("q");
        set.upsert(&fresh);
        let inv = set.inventory();
        assert_eq!(inv.policies.len(), 2);
        let q = inv.policies.iter().find(|p| p.key.name == "q").unwrap();
        assert_eq!(
            q.pod_selector,
            netwarden_engine::LabelSelector::everything()
        );
        assert_eq!(
            (q.ingress.as_deref(), q.egress.as_deref()),
            (Some(&[][..]), None)
        );
    }

    #[test]
    fn a_pod_node_name_of_the_wrong_type_rejects_the_pod() {
        let mut set = ClusterSet::new(LoadOptions::default());
        let mut p = pod("a", json!({}), "n1", "10.0.0.1");
        p["spec"]["nodeName"] = json!(7);
        set.upsert(&p);
        let inv = set.inventory();
        assert!(inv.pods.is_empty());
        assert!(
            inv.problems.iter().any(|p| p.field == "spec.nodeName"),
            "{:?}",
            inv.problems
        );
    }

    /// The uid matches the pod to its CRI sandbox: kept in the reduced pod, and a recreated
    /// pod of the same name (new uid) is a change.
    #[test]
    fn the_reduced_pod_keeps_its_uid() {
        let mut set = ClusterSet::new(LoadOptions::default());
        let mut p = pod("a", json!({}), "n1", "10.0.0.1");
        p["metadata"]["uid"] = json!("u-1");
        set.upsert(&p);
        assert_eq!(set.inventory().pods[0].uid.as_deref(), Some("u-1"));
        p["metadata"]["uid"] = json!("u-2");
        assert!(set.upsert(&p), "a new incarnation is a change");
        assert_eq!(set.inventory().pods[0].uid.as_deref(), Some("u-2"));
        let mut set = ClusterSet::new(LoadOptions::default());
        p["metadata"]["uid"] = json!(7);
        set.upsert(&p);
        let inv = set.inventory();
        assert!(
            inv.pods.is_empty(),
            "a uid of the wrong type rejects the pod"
        );
        assert!(inv.problems.iter().any(|p| p.field == "metadata.uid"));
    }

    /// The engine's view, fed only deltas.
    #[derive(Debug, Default)]
    struct Fed {
        namespaces: BTreeMap<String, Namespace>,
        pods: BTreeMap<netwarden_engine::PodKey, netwarden_engine::Pod>,
        policies: BTreeMap<PolicyRef, netwarden_engine::Policy>,
        services: BTreeMap<ObjectKey, netwarden_engine::Service>,
    }

    impl Fed {
        fn apply(&mut self, d: InventoryDelta) {
            for k in d.pods_removed {
                assert!(self.pods.remove(&k).is_some(), "removed pod {k} was fed");
            }
            for k in d.services_removed {
                assert!(
                    self.services.remove(&k).is_some(),
                    "removed service {k} was fed"
                );
            }
            for r in d.policies_removed {
                assert!(
                    self.policies.remove(&r).is_some(),
                    "removed policy {r} was fed"
                );
            }
            for n in d.namespaces_removed {
                assert!(
                    self.namespaces.remove(&n).is_some(),
                    "removed namespace {n} was fed"
                );
            }
            self.namespaces
                .extend(d.namespaces.into_iter().map(|n| (n.name.clone(), n)));
            self.pods.extend(
                d.pods
                    .into_iter()
                    .map(|p| (p.key.clone(), netwarden_engine::Pod::clone(&p))),
            );
            self.policies.extend(
                d.policies
                    .into_iter()
                    .map(|p| (p.reference(), netwarden_engine::Policy::clone(&p))),
            );
            self.services
                .extend(d.services.into_iter().map(|s| (s.key.clone(), s)));
        }

        /// Fails unless the view equals `inv` (problems compared as sorted texts).
        fn assert_equals(&self, inv: &Inventory, problems: &[Problem]) {
            let by = |v: &[Namespace]| -> BTreeMap<String, Namespace> {
                v.iter().map(|n| (n.name.clone(), n.clone())).collect()
            };
            assert_eq!(self.namespaces, by(&inv.namespaces), "namespaces");
            let pods: BTreeMap<_, _> = inv
                .pods
                .iter()
                .map(|p| (p.key.clone(), p.clone()))
                .collect();
            assert_eq!(self.pods, pods, "pods");
            let policies: BTreeMap<_, _> = inv
                .policies
                .iter()
                .map(|p| (p.reference(), p.clone()))
                .collect();
            assert_eq!(self.policies, policies, "policies");
            let services: BTreeMap<_, _> = inv
                .services
                .iter()
                .map(|s| (s.key.clone(), s.clone()))
                .collect();
            assert_eq!(self.services, services, "services");
            let sorted = |v: &[Problem]| {
                let mut t: Vec<String> = v.iter().map(ToString::to_string).collect();
                t.sort();
                t
            };
            assert_eq!(sorted(problems), sorted(&inv.problems), "problems");
        }
    }

    /// One of a small universe of objects, so that operations collide: two namespaces, pods
    /// sharing addresses, DanmEps and slices with and without their pod or Service, valid and
    /// rejected policies, hostNetwork pods.
    fn universe_object(pick: u8, variant: u8) -> Value {
        let ns = ["a", "b"][(variant % 2) as usize];
        let n = variant % 3;
        let ip = format!("10.0.0.{}", variant % 4);
        match pick % 8 {
            0 => json!({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": ns, "labels": {"team": format!("t{}", variant % 3)}}}),
            1 | 2 => json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": format!("p{n}"), "namespace": ns,
                                     "labels": {"app": format!("app{}", variant % 2)}},
                        "spec": {"hostNetwork": variant % 5 == 4,
                                 "containers": [{"name": "c", "image": "x"}]},
                        "status": {"podIPs": [{"ip": ip}]}}),
            3 => json!({"apiVersion": "danm.k8s.io/v1", "kind": "DanmEp",
                        "metadata": {"name": format!("ep{}", variant % 2), "namespace": ns},
                        "spec": {"Pod": format!("p{n}"), "NetworkName": "net",
                                 "Interface": {"Name": format!("net{}", variant % 2),
                                               "Address": format!("10.9.0.{}/24", variant % 3)}}}),
            4 => {
                let mut svc = json!({"apiVersion": "v1", "kind": "Service",
                        "metadata": {"name": format!("s{}", variant % 2), "namespace": ns},
                        "spec": {"clusterIP": format!("10.96.0.{}", variant % 3),
                                 "ports": [{"port": 80}]}});
                if variant.is_multiple_of(3) {
                    svc["spec"]["selector"] = json!({"app": "app0"});
                }
                svc
            }
            5 => json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                        "metadata": {"name": format!("s{}-x", variant % 2), "namespace": ns,
                                     "labels": {"kubernetes.io/service-name": format!("s{}", n % 2)}},
                        "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}]}),
            6 => {
                let cidr = if variant % 4 == 3 {
                    "10.0.0.0/99"
                } else {
                    "10.0.0.0/8"
                };
                json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                       "metadata": {"name": format!("np{}", variant % 2), "namespace": ns},
                       "spec": {"podSelector": {"matchLabels": {"app": format!("app{}", variant % 2)}},
                                "ingress": [{"from": [{"ipBlock": {"cidr": cidr}}]}]}})
            }
            _ => json!({"apiVersion": "k8s.cni.cncf.io/v1beta1", "kind": "MultiNetworkPolicy",
                        "metadata": {"name": "mnp", "namespace": ns,
                                     "annotations": {"k8s.v1.cni.cncf.io/policy-for": "net"}},
                        "spec": {"podSelector": {}, "policyTypes": ["Egress"]}}),
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Upsert(u8, u8),
        Remove(u8, u8),
        Retain(u8, u8),
        Delta,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            6 => (any::<u8>(), any::<u8>()).prop_map(|(p, v)| Op::Upsert(p, v)),
            2 => (any::<u8>(), any::<u8>()).prop_map(|(p, v)| Op::Remove(p, v)),
            1 => (any::<u8>(), any::<u8>()).prop_map(|(p, v)| Op::Retain(p, v)),
            2 => Just(Op::Delta),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(400))]

        /// Deltas applied in sequence give exactly the whole view, after any operations.
        #[test]
        fn deltas_add_up_to_the_whole_view(ops in proptest::collection::vec(op(), 1..40)) {
            let mut set = ClusterSet::new(LoadOptions::default());
            let mut fed = Fed::default();
            for op in ops {
                match op {
                    Op::Upsert(p, v) => {
                        set.upsert(&universe_object(p, v));
                    }
                    Op::Remove(p, v) => {
                        let key = ClusterKey::of(&universe_object(p, v));
                        set.remove(&key.kind, &key.namespace, &key.name);
                    }
                    Op::Retain(p, v) => {
                        // A relist of one kind that kept only objects of one namespace.
                        let kind = ClusterKey::of(&universe_object(p, v)).kind;
                        let keep: BTreeSet<ClusterKey> = set
                            .objects
                            .keys()
                            .filter(|k| k.kind == kind && k.namespace == ["a", "b"][(v % 2) as usize])
                            .cloned()
                            .collect();
                        set.retain_kind(&kind, &keep);
                    }
                    Op::Delta => {
                        fed.apply(set.take_delta());
                        fed.assert_equals(&set.inventory(), &set.problems());
                    }
                }
                let counted: usize = set.counts().values().sum();
                proptest::prop_assert_eq!(counted, set.len());
            }
            fed.apply(set.take_delta());
            fed.assert_equals(&set.inventory(), &set.problems());
            proptest::prop_assert!(set.take_delta().is_empty(), "nothing changed since");
        }
    }

    /// Found by the `cluster` fuzz target: a version that cannot be identified (here an
    /// apiVersion netwarden does not read) keeps the last good one with a warning that named
    /// no object, since every cluster object's "file" is `cluster`.
    #[test]
    fn keeping_the_last_good_version_names_the_object() {
        let mut set = ClusterSet::new(LoadOptions::default());
        let good = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                          "metadata": {"name": "p", "namespace": "ns"},
                          "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}});
        set.upsert(&good);
        let mut odd = good.clone();
        odd["apiVersion"] = json!("networking.k8s.io/v2");
        assert!(set.upsert(&odd));
        let inv = set.inventory();
        assert_eq!(inv.policies.len(), 1, "the last good version stays");
        let kept = inv
            .problems
            .iter()
            .find(|p| p.reason.contains("last good version"))
            .expect("a warning says the last good version is kept");
        assert_eq!(
            (kept.kind.as_str(), kept.object.as_str()),
            ("NetworkPolicy", "ns/p"),
            "{kept:?}"
        );
        assert!(
            inv.problems.iter().all(|p| !p.object.trim().is_empty()),
            "{:?}",
            inv.problems
        );
    }

    #[test]
    fn keys_missing_a_part_still_name_something() {
        assert_eq!(
            ClusterKey::new("", "", "").to_string(),
            "(no kind) (no name)"
        );
        assert_eq!(
            ClusterKey::new("Pod", "ns", "").to_string(),
            "Pod ns/(no name)"
        );
        assert_eq!(
            ClusterKey::new("Namespace", "", "a").to_string(),
            "Namespace a"
        );
    }

    /// Found by the `cluster` fuzz target: a near miss of our kinds (a wrong apiVersion) with
    /// an empty name gave a problem whose object was empty; the key's label names it now, as
    /// `#N` does in a file.
    #[test]
    fn a_near_miss_without_a_name_is_still_named() {
        let mut set = ClusterSet::new(LoadOptions::default());
        set.upsert(&json!({"apiVersion": "v1", "kind": "EndpointSlice",
                           "metadata": {"name": "", "namespace": "ns"}}));
        let inv = set.inventory();
        let problem = inv
            .problems
            .iter()
            .find(|p| p.field == "apiVersion")
            .expect("the apiVersion is reported");
        assert_eq!(problem.object, "EndpointSlice ns/(no name)", "{problem:?}");
        let inv = parse_str(
            "f.yaml",
            "apiVersion: v1\nkind: EndpointSlice\nmetadata: {name: ''}\n",
            &LoadOptions::default(),
        );
        assert_eq!(inv.problems[0].object, "#1", "{:?}", inv.problems);
    }

    /// Found by the `cluster` fuzz target: the key labels the problems of an object that
    /// cannot be identified, and it quoted a namespace holding a newline as it was (a forged
    /// log line). The API server validates names; the reader must not rely on it.
    #[test]
    fn a_key_label_is_one_escaped_line() {
        let key = ClusterKey::new("Pod\n", "a\nb", "c\u{1b}[2J");
        assert_eq!(key.to_string(), "Pod\\n a\\nb/c\\u{1b}[2J");
        let mut set = ClusterSet::new(LoadOptions::default());
        set.upsert(&json!({"kind": true, "metadata": {"name": "c", "namespace": "a\nb"}}));
        let inv = set.inventory();
        assert!(!inv.problems.is_empty());
        for p in &inv.problems {
            assert!(!p.object.chars().any(char::is_control), "{p:?}");
        }
    }
}
