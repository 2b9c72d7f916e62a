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
//! [`ClusterSet::upsert`] says whether the reduced object changed, so an update that touches
//! nothing netwarden reads (`status.conditions`, `resourceVersion`, `managedFields`, a
//! container image) causes no work downstream.
//!
//! An update the reader rejects (a field of the wrong type in a policy CRD, say) keeps the last
//! good version of that object, with a warning, exactly as a manifest file being edited does
//! ([`crate::ManifestSet`]); only a delete (or a relist that no longer has it) removes an
//! object.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;

use serde_json::Value;

use crate::assemble::{assemble, Part};
use crate::files;
use crate::read::{FileRead, Outcome};
use crate::set::merge;
use crate::{validate, Inventory, LoadOptions, Problem};

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

/// The cluster's objects, reduced; see the [module documentation](self).
#[derive(Debug)]
pub struct ClusterSet {
    opts: LoadOptions,
    /// One first pass per object; only objects of the kinds netwarden reads (and those of its
    /// kinds that could not be read, with their problems) are held.
    objects: BTreeMap<ClusterKey, FileRead>,
}

impl ClusterSet {
    pub fn new(opts: LoadOptions) -> Self {
        ClusterSet {
            opts,
            objects: BTreeMap::new(),
        }
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
        if next.entries.is_empty() && next.file_problems.is_empty() {
            // Not one of our kinds (or nothing of it to keep).
            return self.objects.remove(&key).is_some();
        }
        if previous == Some(&next) {
            return false;
        }
        self.objects.insert(key, next);
        true
    }

    /// Removes one object; returns whether it was held.
    pub fn remove(&mut self, kind: &str, namespace: &str, name: &str) -> bool {
        self.objects
            .remove(&ClusterKey::new(kind, namespace, name))
            .is_some()
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
            self.objects.remove(key);
        }
        gone
    }

    /// How many objects of each kind are held.
    pub fn counts(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for key in self.objects.keys() {
            *counts.entry(key.kind.clone()).or_insert(0) += 1;
        }
        counts
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
        assemble(self.objects.values().map(Part::File), &self.opts)
    }

    /// "The cluster plus these files" (`reach`/`explain`/`validate --kube -f`): the manifests
    /// under `paths` are read as `-f` reads them, and each object they hold replaces the
    /// cluster's object of the same kind, namespace and name; a file object the cluster does
    /// not have is added. An object a file names but cannot load (rejected by an error)
    /// still hides the cluster's version: the user meant to replace it, and analysing the old
    /// one instead would answer a question nobody asked. Two objects with the same name inside
    /// the files stay duplicates (an error), exactly as without `--kube`.
    pub fn overlay(&self, paths: &[PathBuf]) -> Inventory {
        let steps: Vec<Step> = files::list(paths)
            .into_iter()
            .map(|listed| match listed {
                files::Listed::File(p) => Step::File(files::read_file(&p)),
                files::Listed::Missing { problem, .. }
                | files::Listed::Unlistable { problem, .. }
                | files::Listed::Note(problem) => Step::Problem(problem),
            })
            .collect();
        let replaced: BTreeSet<ClusterKey> = steps
            .iter()
            .filter_map(|step| match step {
                Step::File(read) => Some(read),
                Step::Problem(_) => None,
            })
            .flat_map(replaced_keys)
            .collect();
        let files = steps.iter().map(|step| match step {
            Step::File(read) => Part::File(read),
            Step::Problem(problem) => Part::Problem(problem),
        });
        let cluster = self
            .objects
            .iter()
            .filter(|(key, _)| !replaced.contains(*key))
            .map(|(_, read)| Part::File(read));
        assemble(cluster.chain(files), &self.opts)
    }
}

/// One input of [`ClusterSet::overlay`]'s files, kept until the cluster's objects are filtered.
enum Step {
    Problem(Problem),
    File(FileRead),
}

/// The keys of the objects a file names (loaded or rejected): those it replaces.
fn replaced_keys(read: &FileRead) -> impl Iterator<Item = ClusterKey> + '_ {
    read.entries.iter().filter_map(|entry| {
        let id = match &entry.outcome {
            Outcome::Loaded(object) => &object.id,
            Outcome::Rejected(id) => id,
            Outcome::Skipped | Outcome::Unidentified => return None,
        };
        Some(ClusterKey::new(
            id.kind,
            id.namespace.clone(),
            id.name.clone(),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_str, Severity};
    use serde_json::json;

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
        touched["status"]["phase"] = json!("Succeeded");
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
        // A policy never seen good is not loaded.
        let mut fresh = bad.clone();
        fresh["metadata"]["name"] = json!("q");
        set.upsert(&fresh);
        assert_eq!(set.inventory().policies.len(), 1);
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
