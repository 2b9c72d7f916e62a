//! Workloads: the pods a suggested policy is written for, grouped by their stable labels.
//!
//! A policy must keep applying when a Deployment rolls or a StatefulSet is rescaled, so pods are
//! grouped by the labels their controller gives every replica — never by pod name, and without
//! the labels that differ per instance or per revision ([`PER_INSTANCE_LABELS`]). Pods of one
//! namespace with the same stable labels are one workload.
//!
//! Each workload gets an **exact** selector: its stable labels as `matchLabels`, plus
//! `DoesNotExist` for every key that tells it apart from another workload of its namespace whose
//! labels include all of its own (`{app: web}` would otherwise also select `{app: web, tier:
//! canary}`). So in the state the suggestion was made for, a workload's selector selects its
//! pods and no other: a rule written for one workload never admits another.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use netwarden_engine::hash::hash_bytes;
use netwarden_engine::{
    LabelSelector, Labels, NetworkId, Operator, Pod, PodKey, Protocol, Requirement,
};

/// Labels that differ between the pods of one workload, or between its revisions: a selector
/// on them would follow one pod or one rollout, not the workload.
pub const PER_INSTANCE_LABELS: &[&str] = &[
    "pod-template-hash",
    "controller-revision-hash",
    "pod-template-generation",
    "statefulset.kubernetes.io/pod-name",
    "apps.kubernetes.io/pod-index",
    "job-name",
    "controller-uid",
    "batch.kubernetes.io/job-name",
    "batch.kubernetes.io/controller-uid",
    "batch.kubernetes.io/job-completion-index",
];

/// Labels whose value names the application, preferred (in this order) for policy names.
const NAME_LABELS: &[&str] = &["app.kubernetes.io/name", "app", "k8s-app", "name"];

/// The labels of `labels` a workload's replicas share.
pub fn stable_labels(labels: &Labels) -> Labels {
    labels
        .iter()
        .filter(|(k, _)| !PER_INSTANCE_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Index of a workload in [`Workloads::list`].
pub type WorkloadId = usize;

/// Pods of one namespace with the same stable labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub namespace: String,
    /// A readable name, unique in the namespace: the application label's value, or the pod
    /// name without its controller suffix (DNS-1123 characters only, not length-limited).
    pub name: String,
    pub labels: Labels,
    /// Selects exactly this workload's pods among the namespace's pods (see the module doc).
    pub selector: LabelSelector,
    /// Sorted.
    pub pods: Vec<PodKey>,
    /// Container ports every pod of the workload declares under the same name, so that a
    /// named port in a rule means this number on each of them.
    pub named_ports: BTreeMap<(Protocol, u16), String>,
}

impl Workload {
    /// `ns/name`, as comments and messages write it.
    pub fn display(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Every workload of a cluster state, with the lookups the flow reader needs.
#[derive(Debug, Clone, Default)]
pub struct Workloads {
    /// Sorted by (namespace, name).
    pub list: Vec<Workload>,
    by_pod: HashMap<PodKey, WorkloadId>,
    /// The interfaces of every pod that is in a workload, by name.
    interfaces: HashMap<(PodKey, String), NetworkId>,
    /// Per workload, the networks its pods have interfaces on.
    networks: HashMap<WorkloadId, BTreeSet<NetworkId>>,
    /// (network, address) → workload of the pod holding it. Host-network pods hold the node's
    /// addresses: they are in no workload, and their addresses stay addresses.
    by_address: HashMap<(NetworkId, IpAddr), WorkloadId>,
}

impl Workloads {
    /// Groups `pods` (host-network pods are left out: no policy isolates them).
    pub fn new(pods: &[Pod]) -> Workloads {
        let mut groups: BTreeMap<(String, Labels), Vec<&Pod>> = BTreeMap::new();
        for pod in pods.iter().filter(|p| !p.host_network) {
            groups
                .entry((pod.key.namespace.clone(), stable_labels(&pod.labels)))
                .or_default()
                .push(pod);
        }
        let mut list: Vec<Workload> = groups
            .iter()
            .map(|((namespace, labels), members)| {
                let mut keys: Vec<PodKey> = members.iter().map(|p| p.key.clone()).collect();
                keys.sort();
                Workload {
                    namespace: namespace.clone(),
                    name: base_name(labels, &keys[0].name),
                    labels: labels.clone(),
                    selector: exact_selector(namespace, labels, groups.keys()),
                    pods: keys,
                    named_ports: shared_named_ports(members),
                }
            })
            .collect();
        make_names_unique(&mut list);
        list.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));

        let mut out = Workloads {
            list,
            ..Workloads::default()
        };
        let pods_by_key: HashMap<&PodKey, &Pod> = pods.iter().map(|p| (&p.key, p)).collect();
        for (id, workload) in out.list.iter().enumerate() {
            for key in &workload.pods {
                out.by_pod.insert(key.clone(), id);
                for iface in &pods_by_key[key].interfaces {
                    out.interfaces
                        .insert((key.clone(), iface.name.clone()), iface.network.clone());
                    out.networks
                        .entry(id)
                        .or_default()
                        .insert(iface.network.clone());
                    for ip in &iface.ips {
                        out.by_address
                            .entry((iface.network.clone(), *ip))
                            .or_insert(id);
                    }
                }
            }
        }
        out
    }

    pub fn of_pod(&self, pod: &PodKey) -> Option<WorkloadId> {
        self.by_pod.get(pod).copied()
    }

    /// The network of `pod`'s interface `interface`.
    pub fn network_of(&self, pod: &PodKey, interface: &str) -> Option<&NetworkId> {
        self.interfaces.get(&(pod.clone(), interface.to_owned()))
    }

    /// The workload of the pod holding `ip` on `network`.
    pub fn at_address(&self, network: &NetworkId, ip: IpAddr) -> Option<WorkloadId> {
        self.by_address.get(&(network.clone(), ip)).copied()
    }

    /// The networks `workload`'s pods have interfaces on, sorted.
    pub fn networks_of(&self, workload: WorkloadId) -> Vec<NetworkId> {
        self.networks
            .get(&workload)
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn get(&self, id: WorkloadId) -> &Workload {
        &self.list[id]
    }
}

/// The workload's readable name: an application label's value, else the first pod's name
/// without its controller suffix; reduced to DNS-1123 label characters.
fn base_name(labels: &Labels, first_pod: &str) -> String {
    let raw = NAME_LABELS.iter().find_map(|k| labels.get(*k)).map_or_else(
        || netwarden_monitor::workload_name(first_pod).to_owned(),
        Clone::clone,
    );
    dns_label_chars(&raw)
}

/// Lower-case letters, digits and `-`, no leading/trailing `-`; `w` when nothing is left.
pub fn dns_label_chars(raw: &str) -> String {
    let mapped: String = raw
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '-',
        })
        .collect();
    let trimmed = mapped.trim_matches('-');
    if trimmed.is_empty() {
        "w".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// Workloads of one namespace sharing a name get the hash of their labels appended, so that no
/// two suggested policies collide.
fn make_names_unique(list: &mut [Workload]) {
    let mut count: HashMap<(String, String), usize> = HashMap::new();
    for w in list.iter() {
        *count
            .entry((w.namespace.clone(), w.name.clone()))
            .or_default() += 1;
    }
    for w in list.iter_mut() {
        if count[&(w.namespace.clone(), w.name.clone())] > 1 {
            let text: String = w.labels.iter().map(|(k, v)| format!("{k}={v},")).collect();
            w.name = format!("{}-{:08x}", w.name, hash_bytes(text.as_bytes()) as u32);
        }
    }
}

/// `labels` as matchLabels, plus `DoesNotExist` for each key that another group of the
/// namespace has beyond `labels` while having all of `labels` (see the module doc).
fn exact_selector<'a>(
    namespace: &str,
    labels: &Labels,
    groups: impl Iterator<Item = &'a (String, Labels)>,
) -> LabelSelector {
    let mut excluded: BTreeSet<&str> = BTreeSet::new();
    for (ns, other) in groups {
        let selected = ns == namespace
            && other != labels
            && labels.iter().all(|(k, v)| other.get(k) == Some(v));
        if selected {
            excluded.extend(
                other
                    .keys()
                    .filter(|k| !labels.contains_key(*k))
                    .map(String::as_str),
            );
        }
    }
    LabelSelector {
        match_labels: labels.clone(),
        match_expressions: excluded
            .into_iter()
            .map(|key| Requirement {
                key: key.to_owned(),
                operator: Operator::DoesNotExist,
                values: Vec::new(),
            })
            .collect(),
    }
}

/// (protocol, port) → name, for the ports every member declares under one name, and whose
/// name resolves to that port on every member (a name used twice resolves to the first).
fn shared_named_ports(members: &[&Pod]) -> BTreeMap<(Protocol, u16), String> {
    let mut shared: Option<BTreeMap<(Protocol, u16), String>> = None;
    for pod in members {
        let own: BTreeMap<(Protocol, u16), String> = pod
            .container_ports
            .iter()
            .filter_map(|p| {
                let name = p.name.as_ref()?;
                (pod.named_port(name, p.protocol) == Some(p.port))
                    .then(|| ((p.protocol, p.port), name.clone()))
            })
            .collect();
        shared = Some(match shared {
            None => own,
            Some(mut acc) => {
                acc.retain(|k, v| own.get(k) == Some(v));
                acc
            }
        });
    }
    shared.unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::testing::{labels, pod, with_port};

    #[test]
    fn replicas_group_by_stable_labels_and_selectors_are_exact() {
        let pods = vec![
            pod(
                "shop",
                "web-7d4b9c-xk2p9",
                &[("app", "web"), ("pod-template-hash", "7d4b9c")],
                &["10.0.0.1"],
            ),
            pod(
                "shop",
                "web-5f8c7b-ab2cd",
                &[("app", "web"), ("pod-template-hash", "5f8c7b")],
                &["10.0.0.2"],
            ),
            pod(
                "shop",
                "web-canary-0",
                &[("app", "web"), ("track", "canary")],
                &["10.0.0.3"],
            ),
            pod("shop", "lonely", &[], &["10.0.0.4"]),
            pod("other", "web-0", &[("app", "web")], &["10.0.1.1"]),
        ];
        let w = Workloads::new(&pods);
        let names: Vec<String> = w.list.iter().map(Workload::display).collect();
        assert_eq!(names.len(), 4, "{names:?}");
        let web = w.of_pod(&PodKey::new("shop", "web-7d4b9c-xk2p9")).unwrap();
        assert_eq!(
            w.of_pod(&PodKey::new("shop", "web-5f8c7b-ab2cd")),
            Some(web)
        );
        let canary = w.of_pod(&PodKey::new("shop", "web-canary-0")).unwrap();
        assert_ne!(web, canary);
        // Both are "web" by their app label: told apart by a hash of their labels.
        assert_ne!(w.get(web).name, w.get(canary).name);
        assert!(w.get(web).name.starts_with("web-"));
        // Each selector selects exactly its own pods in its namespace.
        for (id, workload) in w.list.iter().enumerate() {
            for p in pods
                .iter()
                .filter(|p| p.key.namespace == workload.namespace)
            {
                assert_eq!(
                    workload.selector.matches(&p.labels),
                    w.of_pod(&p.key) == Some(id),
                    "{} selecting {}",
                    workload.display(),
                    p.key
                );
            }
        }
        let lonely = w.get(w.of_pod(&PodKey::new("shop", "lonely")).unwrap());
        assert_eq!(lonely.name, "lonely");
        assert!(lonely.selector.match_labels.is_empty());
        assert_eq!(lonely.selector.match_expressions.len(), 2, "app and track");
        assert_eq!(
            w.at_address(&NetworkId::Primary, "10.0.0.3".parse().unwrap()),
            Some(canary)
        );
        assert_eq!(stable_labels(&labels(&[("job-name", "x")])), Labels::new());
    }

    #[test]
    fn named_ports_only_where_every_replica_agrees() {
        let a = with_port(
            with_port(
                pod("x", "a-0", &[("app", "a")], &["10.0.0.1"]),
                "http",
                80,
                Protocol::Tcp,
            ),
            "dns",
            53,
            Protocol::Udp,
        );
        let b = with_port(
            with_port(
                pod("x", "a-1", &[("app", "a")], &["10.0.0.2"]),
                "http",
                80,
                Protocol::Tcp,
            ),
            "dns",
            5353,
            Protocol::Udp,
        );
        let w = Workloads::new(&[a, b]);
        let ports = &w.list[0].named_ports;
        assert_eq!(
            ports.get(&(Protocol::Tcp, 80)).map(String::as_str),
            Some("http")
        );
        assert_eq!(ports.len(), 1, "{ports:?}");
    }
}
