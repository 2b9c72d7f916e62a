//! The second pass: from the files' first passes ([`FileRead`], in load order) to an
//! [`Inventory`]. Here objects meet: duplicates are refused (the first definition wins),
//! DanmEps join their pods and EndpointSlices their Services, namespaces that objects refer to
//! but the input does not declare are added, and pods sharing an address are reported.
//!
//! Every step is linear (hash maps keyed by identity), so tens of thousands of objects load in
//! well under a second.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use netwarden_engine::{Namespace, NetworkId, PolicyKind};

use crate::read::{FileRead, Object, ObjectId, Outcome, ReadObject, DELETE};
use crate::{pod, service, Inventory, LoadOptions, Problem, Severity, NAMESPACE_NAME_LABEL};

/// One step of the input, in load order.
pub(crate) enum Part<'a> {
    /// A problem about the input paths themselves (a missing path, an empty directory).
    Problem(&'a Problem),
    File(&'a FileRead),
}

pub(crate) fn assemble<'a>(
    parts: impl IntoIterator<Item = Part<'a>>,
    opts: &LoadOptions,
) -> Inventory {
    let mut problems: Vec<Problem> = Vec::new();
    let mut first_seen: HashMap<&ObjectId, &str> = HashMap::new();
    let mut objects: Vec<&ReadObject> = Vec::new();
    for part in parts {
        let file = match part {
            Part::Problem(p) => {
                problems.push(p.clone());
                continue;
            }
            Part::File(file) => file,
        };
        problems.extend(file.file_problems.iter().cloned());
        for entry in &file.entries {
            problems.extend(entry.problems.iter().cloned());
            let object = match &entry.outcome {
                Outcome::Loaded(object) => object,
                Outcome::Delete(marker) => {
                    // `diff --with` consumes its deletions before assembling ([`crate::overlay`]).
                    problems.push(Problem {
                        file: marker.file.clone(),
                        kind: marker.id.kind.to_string(),
                        object: marker.label.clone(),
                        field: format!("metadata.annotations.{DELETE}"),
                        reason: "a deletion means something only in the changes of \
                                 `netwarden diff --with`; object ignored"
                            .into(),
                        severity: Severity::Warning,
                    });
                    continue;
                }
                _ => continue,
            };
            match first_seen.get(&object.id) {
                Some(first) => problems.push(Problem {
                    file: object.file.clone(),
                    kind: object.id.kind.to_string(),
                    object: object.label.clone(),
                    field: "metadata.name".into(),
                    reason: format!(
                        "duplicate object (first defined in {first}); this one is ignored"
                    ),
                    severity: Severity::Error,
                }),
                None => {
                    first_seen.insert(&object.id, &object.file);
                    objects.push(object);
                }
            }
        }
    }

    let mut inv = Inventory::default();
    let mut pods = Vec::new();
    let mut danmeps = Vec::new();
    let mut slices = Vec::new();
    for object in objects {
        match &object.object {
            Object::Namespace(n) => inv.namespaces.push(n.clone()),
            Object::Pod(p) => pods.push(p.clone()),
            Object::DanmEp(d) => danmeps.push(d),
            Object::Policy(p) => {
                // Switched-off NetworkPolicies are read and checked (above) but not returned.
                if p.kind != PolicyKind::NetworkPolicy || opts.network_policy_enabled {
                    inv.policies.push(p.clone());
                }
            }
            Object::Service(s) => inv.services.push(s.clone()),
            Object::Slice(s) => slices.push(s),
        }
    }
    pod::attach_danmeps(&mut pods, &danmeps, &mut problems);
    service::attach_slices(&mut inv.services, &slices, &mut problems);
    report_shared_addresses(&pods, &mut problems);

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
            labels: BTreeMap::new(),
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

/// Warns about an address held by two pods on one network (hostNetwork pods share the node's
/// addresses by design and are left out): peers are matched by address, so a rule that allows
/// one of them allows the other too.
fn report_shared_addresses(pods: &[crate::PodRecord], problems: &mut Vec<Problem>) {
    let mut owner: HashMap<(&NetworkId, IpAddr), usize> = HashMap::new();
    for (i, rec) in pods.iter().enumerate() {
        if rec.pod.host_network {
            continue;
        }
        for iface in &rec.pod.interfaces {
            for ip in &iface.ips {
                let first = *owner.entry((&iface.network, *ip)).or_insert(i);
                if first == i {
                    continue;
                }
                let other = &pods[first];
                problems.push(Problem {
                    file: rec.source.file.clone(),
                    kind: "Pod".into(),
                    object: rec.source.label.clone(),
                    field: String::new(),
                    reason: format!(
                        "address {ip} on network {} (interface {}) is also pod {}'s (in {}): \
                         a rule that allows one of them allows both",
                        iface.network,
                        iface.name.escape_debug(),
                        other.pod.key,
                        other.source.file
                    ),
                    severity: Severity::Warning,
                });
            }
        }
    }
}
