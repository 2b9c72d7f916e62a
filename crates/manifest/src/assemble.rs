//! The second pass: from the files' first passes ([`FileRead`], in load order) to an
//! [`Inventory`]. Here objects meet: duplicates are refused (the first definition wins),
//! DanmEps join their pods and EndpointSlices their Services, namespaces that objects refer to
//! but the input does not declare are added, and pods sharing an address are reported.
//!
//! Every step is linear (hash maps keyed by identity), so tens of thousands of objects load in
//! well under a second.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use netwarden_engine::{
    AdminPolicy, Labels, Namespace, NetworkId, Node, Pod, Policy, PolicyKind, Service,
};

use crate::pod::DanmEpRecord;
use crate::read::{FileRead, Object, ObjectId, Outcome, ReadObject, DELETE};
use crate::service::SliceRecord;
use crate::{pod, service, Inventory, LoadOptions, Problem, Severity, NAMESPACE_NAME_LABEL};

/// One step of the input, in load order.
pub(crate) enum Part<'a> {
    /// A problem about the input paths themselves (a missing path, an empty directory).
    Problem(&'a Problem),
    /// A file's first pass, kept by the caller (to reuse while the file does not change): its
    /// objects are copied into the inventory.
    File(&'a FileRead),
}

/// One step of the input that nobody keeps: its objects move into the inventory, so that a
/// large input is not held twice ([`crate::Loader::finish`]).
pub(crate) enum OwnedPart {
    Problem(Problem),
    File(FileRead),
}

/// What the second pass produced, pods and policies still shared with the first passes they
/// come from: a caller that keeps its first passes (the node agent's [`crate::ClusterSet`])
/// hands the same objects on instead of copies; [`Assembly::into_inventory`] unwraps them.
#[derive(Debug, Default)]
pub(crate) struct Assembly {
    pub namespaces: Vec<Namespace>,
    pub pods: Vec<Arc<Pod>>,
    pub policies: Vec<Arc<Policy>>,
    pub admin_policies: Vec<Arc<AdminPolicy>>,
    pub nodes: Vec<Node>,
    pub services: Vec<Service>,
    pub problems: Vec<Problem>,
}

impl Assembly {
    /// The plain inventory: an object nobody else holds is moved, a shared one copied.
    pub fn into_inventory(self) -> Inventory {
        Inventory {
            namespaces: self.namespaces,
            pods: self.pods.into_iter().map(Arc::unwrap_or_clone).collect(),
            policies: self
                .policies
                .into_iter()
                .map(Arc::unwrap_or_clone)
                .collect(),
            admin_policies: self
                .admin_policies
                .into_iter()
                .map(Arc::unwrap_or_clone)
                .collect(),
            nodes: self.nodes,
            services: self.services,
            problems: self.problems,
        }
    }
}

/// The second pass over first passes kept by the caller.
pub(crate) fn assemble<'a>(
    parts: impl IntoIterator<Item = Part<'a>>,
    opts: &LoadOptions,
) -> Inventory {
    assemble_shared(parts, opts).into_inventory()
}

/// [`assemble`], its pods and policies shared with `parts` (see [`Assembly`]).
pub(crate) fn assemble_shared<'a>(
    parts: impl IntoIterator<Item = Part<'a>>,
    opts: &LoadOptions,
) -> Assembly {
    let mut admitted = Admitted::default();
    for part in parts {
        match part {
            Part::Problem(p) => admitted.problems.push(p.clone()),
            Part::File(file) => {
                admitted.problems.extend(file.file_problems.iter().cloned());
                for entry in &file.entries {
                    admitted.problems.extend(entry.problems.iter().cloned());
                    match &entry.outcome {
                        Outcome::Loaded(object) => admitted.admit(Cow::Borrowed(object)),
                        other => admitted.report(other),
                    }
                }
            }
        }
    }
    admitted.finish(opts)
}

/// The second pass over first passes nobody keeps: [`assemble`] without copying objects.
pub(crate) fn assemble_owned(
    parts: impl IntoIterator<Item = OwnedPart>,
    opts: &LoadOptions,
) -> Inventory {
    let mut admitted = Admitted::default();
    for part in parts {
        match part {
            OwnedPart::Problem(p) => admitted.problems.push(p),
            OwnedPart::File(file) => {
                admitted.problems.extend(file.file_problems);
                for entry in file.entries {
                    admitted.problems.extend(entry.problems);
                    match entry.outcome {
                        Outcome::Loaded(object) => admitted.admit(Cow::Owned(*object)),
                        other => admitted.report(&other),
                    }
                }
            }
        }
    }
    admitted.finish(opts).into_inventory()
}

/// The objects admitted so far, in load order (the first definition of each identity), and
/// the problems so far.
#[derive(Default)]
struct Admitted<'a> {
    objects: Vec<Cow<'a, ReadObject>>,
    /// Identity to position in `objects`.
    first: HashMap<ObjectId, usize>,
    problems: Vec<Problem>,
}

impl<'a> Admitted<'a> {
    /// Admits an object, or refuses it as a duplicate of an earlier one.
    fn admit(&mut self, object: Cow<'a, ReadObject>) {
        if let Some(&first) = self.first.get(&object.id) {
            let first = &self.objects[first].file;
            self.problems.push(Problem {
                file: object.file.clone(),
                kind: object.id.kind.to_string(),
                object: object.label.clone(),
                field: "metadata.name".into(),
                reason: format!("duplicate object (first defined in {first}); this one is ignored"),
                severity: Severity::Error,
            });
            return;
        }
        self.first.insert(object.id.clone(), self.objects.len());
        self.objects.push(object);
    }

    /// Reports an outcome other than a loaded object, where it needs to be.
    fn report(&mut self, outcome: &Outcome) {
        if let Outcome::Delete(marker) = outcome {
            // `diff --with` consumes its deletions before assembling ([`crate::overlay`]).
            self.problems.push(Problem {
                file: marker.file.clone(),
                kind: marker.id.kind.to_string(),
                object: marker.label.clone(),
                field: format!("metadata.annotations.{DELETE}"),
                reason: "a deletion means something only in the changes of \
                         `netwarden diff --with`; object ignored"
                    .into(),
                severity: Severity::Warning,
            });
        }
    }

    fn finish(self, opts: &LoadOptions) -> Assembly {
        let mut problems = self.problems;
        let mut inv = Assembly::default();
        let mut pods = Vec::new();
        let mut danmeps: Vec<Cow<'_, DanmEpRecord>> = Vec::new();
        let mut slices: Vec<Cow<'_, SliceRecord>> = Vec::new();
        // Where each admin policy was read, for the warning about equal priorities.
        let mut admin_sources: Vec<(Arc<AdminPolicy>, String, String)> = Vec::new();
        for object in self.objects {
            let (file, label): (String, String);
            // Borrowed DanmEps and slices are only looked at; the rest is moved or copied.
            let object = match object {
                Cow::Borrowed(ReadObject {
                    object: Object::DanmEp(d),
                    ..
                }) => {
                    danmeps.push(Cow::Borrowed(d));
                    continue;
                }
                Cow::Borrowed(ReadObject {
                    object: Object::Slice(s),
                    ..
                }) => {
                    slices.push(Cow::Borrowed(s));
                    continue;
                }
                other => {
                    let owned = other.into_owned();
                    file = owned.file;
                    label = owned.label;
                    owned.object
                }
            };
            match object {
                Object::Namespace(n) => inv.namespaces.push(n),
                Object::Pod(p) => pods.push(p),
                Object::DanmEp(d) => danmeps.push(Cow::Owned(*d)),
                Object::Policy(p) => {
                    // Switched-off NetworkPolicies are read and checked but not returned.
                    if p.kind != PolicyKind::NetworkPolicy || opts.network_policy_enabled {
                        inv.policies.push(p);
                    }
                }
                Object::AdminPolicy(p) => {
                    admin_sources.push((p.clone(), file.clone(), label.clone()));
                    inv.admin_policies.push(p);
                }
                Object::Node(n) => inv.nodes.push(*n),
                Object::Service(s) => inv.services.push(*s),
                Object::Slice(s) => slices.push(Cow::Owned(*s)),
            }
        }
        let danmeps: Vec<&DanmEpRecord> = danmeps.iter().map(AsRef::as_ref).collect();
        let slices: Vec<&SliceRecord> = slices.iter().map(AsRef::as_ref).collect();
        pod::attach_danmeps(&mut pods, &danmeps, &mut problems);
        service::attach_slices(&mut inv.services, &slices, &mut problems);
        report_shared_addresses(&pods, &mut problems);
        report_equal_priorities(&admin_sources, &mut problems);

        let declared: BTreeSet<String> = inv.namespaces.iter().map(|n| n.name.clone()).collect();
        let referenced: BTreeSet<String> = pods
            .iter()
            .map(|p| p.pod.key.namespace.clone())
            .chain(inv.policies.iter().map(|p| p.key.namespace.clone()))
            .chain(inv.services.iter().map(|s| s.key.namespace.clone()))
            .filter(|ns| !declared.contains(ns))
            .collect();
        for name in referenced {
            inv.namespaces.push(Namespace {
                name,
                labels: Labels::new(),
                learn: false,
            });
        }
        for ns in &mut inv.namespaces {
            // Kubernetes sets this label itself and overwrites any other value.
            ns.labels
                .insert(NAMESPACE_NAME_LABEL.to_string(), ns.name.clone());
        }
        inv.pods = pods.into_iter().map(|r| r.pod).collect();
        inv.problems = problems;
        inv
    }
}

/// Reports an address claimed by two pods, on any networks (hostNetwork pods share the node's
/// addresses by design and are left out). Peers are matched by address, so such an address
/// cannot say which pod a packet comes from: the engine keeps it out of every allow set
/// until only one pod claims it (SPEC 7), and this says so. (A DanmEp lending a pod another
/// pod's address made the other pod pass wherever the first was allowed: issue 20, defect 2.)
fn report_shared_addresses(pods: &[crate::PodRecord], problems: &mut Vec<Problem>) {
    let mut owner: HashMap<IpAddr, usize> = HashMap::new();
    for (i, rec) in pods.iter().enumerate() {
        if rec.pod.host_network {
            continue;
        }
        for iface in &rec.pod.interfaces {
            for ip in &iface.ips {
                let first = *owner.entry(*ip).or_insert(i);
                if first == i {
                    continue;
                }
                let other = &pods[first];
                problems.push(Problem {
                    file: rec.source.file.clone(),
                    kind: "Pod".into(),
                    object: rec.source.label.clone(),
                    field: String::new(),
                    reason: ambiguous_address(
                        *ip,
                        &iface.network,
                        &iface.name,
                        &other.pod.key,
                        &other.source.file,
                    ),
                    severity: Severity::Error,
                });
            }
        }
    }
}

/// What is said of an address a pod claims that `first` (read from `file`) claims too.
pub(crate) fn ambiguous_address(
    ip: IpAddr,
    network: &NetworkId,
    iface: &str,
    first: &netwarden_engine::PodKey,
    file: &str,
) -> String {
    format!(
        "address {ip} on network {network} (interface {}) is also claimed by pod {first} (in \
         {file}): it cannot tell the two apart, so it is kept out of every allow set until \
         only one pod claims it",
        iface.escape_debug()
    )
}

/// Warns about admin policies of one tier with one priority whose rules can disagree (one
/// direction has rules of different actions): upstream leaves their order undefined, netwarden
/// evaluates them by kind, then name (SPEC 8). `policies`: each with the file and label it was
/// read from.
pub(crate) fn report_equal_priorities(
    policies: &[(Arc<AdminPolicy>, String, String)],
    problems: &mut Vec<Problem>,
) {
    let mut sorted: Vec<&(Arc<AdminPolicy>, String, String)> = policies.iter().collect();
    sorted.sort_by(|a, b| a.0.order(&b.0));
    for (i, (later, file, label)) in sorted.iter().enumerate() {
        let disagree = sorted[..i]
            .iter()
            .rev()
            .take_while(|(p, _, _)| (p.tier, p.priority) == (later.tier, later.priority))
            .find(|(p, _, _)| admin_rules_can_disagree(p, later));
        if let Some((first, _, _)) = disagree {
            problems.push(Problem {
                file: file.clone(),
                kind: later.kind.to_string(),
                object: label.clone(),
                field: "spec.priority".into(),
                reason: format!(
                    "{} has the same priority ({}) in the {} tier and rules with other                      actions: upstream leaves their order undefined; netwarden evaluates {}                      first (by kind, then name)",
                    first.reference(),
                    later.priority,
                    later.tier,
                    first.reference()
                ),
                severity: Severity::Warning,
            });
        }
    }
}

/// Whether two admin policies have, in one direction, rules of different actions.
fn admin_rules_can_disagree(a: &AdminPolicy, b: &AdminPolicy) -> bool {
    [
        netwarden_engine::Direction::Ingress,
        netwarden_engine::Direction::Egress,
    ]
    .into_iter()
    .any(|d| {
        a.rules(d)
            .iter()
            .any(|x| b.rules(d).iter().any(|y| x.action != y.action))
    })
}
