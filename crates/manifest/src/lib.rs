//! Loads Kubernetes manifests (YAML, multi-document, or JSON; `kind: List` too) into the
//! engine's model types, validating as it goes and reporting **every** problem with file, kind,
//! object, field and reason, while the rest of the input is still loaded (SPEC sections 1, 2, 7).
//!
//! What is read (unknown kinds, e.g. Deployments, and unknown fields are ignored):
//!
//! | kind | fields |
//! | --- | --- |
//! | `Namespace` (v1) | name, labels (`kubernetes.io/metadata.name` is always added) |
//! | `Pod` (v1) | namespace, name, labels, `spec.hostNetwork`, `spec.{initC,c}ontainers[].ports[]`, `status.podIPs` / `status.podIP`, annotations `k8s.v1.cni.cncf.io/network-status` (or `networks-status`) and `netwarden.io/netns` |
//! | `DanmEp` (danm.k8s.io) | `spec.Pod`, `spec.NetworkName` (or `NetworkID`), `spec.apiType`, `spec.Interface.{Name,Address,AddressIPv6}`, `spec.netns`: adds an interface to its pod |
//! | `NetworkPolicy` (networking.k8s.io) | the whole spec; scope = primary interface |
//! | `DanmNetworkPolicy` (danm.k8s.io) | the spec plus `networkSelector` in peers; scope = all interfaces |
//! | `MultiNetworkPolicy` (k8s.cni.cncf.io) | the spec; scope = networks of annotation `k8s.v1.cni.cncf.io/policy-for` |
//! | `Service` (v1) | `spec.clusterIPs` / `clusterIP`, `spec.selector`, `spec.ports[]` |
//! | `EndpointSlice` (discovery.k8s.io) | label `kubernetes.io/service-name`, `endpoints[].addresses` |
//!
//! Policy annotations: `netwarden.io/mode`, `kube-router.io/network-policy.monitor`,
//! `kube-router.io/network-policy.staged` (monitor phase; bad or conflicting values fail closed to
//! enforce), `netwarden.io/replaces`, `netwarden.io/log`.
//!
//! Invalid input never widens a policy: an invalid peer or port is dropped, and a rule whose
//! peers (or ports) were all invalid is dropped as a whole rather than read as "all peers". An
//! object with an invalid name is dropped, because names reach rule comments and log prefixes.
//!
//! Loading happens in two passes: [`Loader::add_str`] reduces each document on its own, then
//! [`Loader::finish`] pairs DanmEps with pods and EndpointSlices with Services, and adds the
//! namespaces that objects refer to but the input does not declare.
#![forbid(unsafe_code)]

mod ctx;
mod files;
mod pod;
mod policy;
mod service;
pub mod validate;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::PathBuf;

use netwarden_engine::{Namespace, Pod, Policy, Service};
use serde_json::Value;

use crate::ctx::{get, Ctx};

/// Annotation and label keys the loader reads.
pub use crate::pod::{NETNS, NETWORKS_STATUS_OLD, NETWORK_STATUS};
pub use crate::policy::{KUBE_ROUTER_MONITOR, KUBE_ROUTER_STAGED, LOG, MODE, POLICY_FOR, REPLACES};
pub use crate::service::SERVICE_NAME_LABEL;

/// The label Kubernetes puts on every namespace (used by namespaceSelectors on its name).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// How bad a problem is. Errors mean something in the input was dropped or not applied as
/// written; warnings mean it was loaded but probably does not do what its author expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        })
    }
}

/// One problem found in the input.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// The file (as given, or as found under a directory), or the label passed to [`parse_str`].
    pub file: String,
    /// The object's kind (`Pod`, `NetworkPolicy`, ...); empty for file-level problems.
    pub kind: String,
    /// `ns/name`, `name` (Namespace), or `#N` (1-based document index) if the object is unnamed.
    pub object: String,
    /// Path of the offending field, e.g. `spec.ingress[0].from[1].ipBlock.cidr`; may be empty.
    pub field: String,
    pub reason: String,
    pub severity: Severity,
}

impl fmt::Display for Problem {
    /// `file: Kind ns/name: field: reason`, leaving out the parts that are empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.file)?;
        let what = match (self.kind.is_empty(), self.object.is_empty()) {
            (false, false) => format!("{} {}", self.kind, self.object),
            (false, true) => self.kind.clone(),
            (true, false) => self.object.clone(),
            (true, true) => String::new(),
        };
        if !what.is_empty() {
            write!(f, " {what}:")?;
        }
        if !self.field.is_empty() {
            write!(f, " {}:", self.field)?;
        }
        if self.severity == Severity::Warning {
            write!(f, " warning:")?;
        }
        write!(f, " {}", self.reason)
    }
}

/// Everything loaded, plus every problem found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    pub namespaces: Vec<Namespace>,
    pub pods: Vec<Pod>,
    pub policies: Vec<Policy>,
    pub services: Vec<Service>,
    pub problems: Vec<Problem>,
}

impl Inventory {
    /// The problems of severity [`Severity::Error`].
    pub fn errors(&self) -> impl Iterator<Item = &Problem> {
        self.problems
            .iter()
            .filter(|p| p.severity == Severity::Error)
    }

    pub fn has_errors(&self) -> bool {
        self.errors().next().is_some()
    }
}

/// Loader switches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOptions {
    /// When false, `NetworkPolicy` objects are read (and checked) but not returned: for clusters
    /// where another component already enforces the standard API.
    pub network_policy_enabled: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            network_policy_enabled: true,
        }
    }
}

/// Errors of the file stage, turned into [`Problem`]s (the loader itself never fails).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid YAML: {0}")]
    Yaml(String),
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Loads files and directories (recursively: `*.yaml`, `*.yml`, `*.json`, in sorted order; a
/// file named explicitly is read whatever its extension). IO errors become problems.
pub fn load_paths(paths: &[PathBuf], opts: &LoadOptions) -> Inventory {
    let mut loader = Loader::new(opts.clone());
    for path in paths {
        loader.add_path(path);
    }
    loader.finish()
}

/// Loads one file's text (YAML, possibly multi-document, or JSON); `file_label` names it in
/// problems. Pure: no I/O.
pub fn parse_str(file_label: &str, text: &str, opts: &LoadOptions) -> Inventory {
    let mut loader = Loader::new(opts.clone());
    loader.add_str(file_label, text);
    loader.finish()
}

/// A pod as read, plus what the second pass needs to know about where its interfaces came from.
#[derive(Debug)]
pub(crate) struct PodRecord {
    pub pod: Pod,
    pub pod_ips: Vec<std::net::IpAddr>,
    /// Parallel to `pod.interfaces`: whether the interface came from a DanmEp.
    pub from_danmep: Vec<bool>,
}

/// Incremental loader: add documents, then [`Loader::finish`].
#[derive(Debug)]
pub struct Loader {
    opts: LoadOptions,
    namespaces: Vec<Namespace>,
    pods: Vec<PodRecord>,
    danmeps: Vec<pod::DanmEpRecord>,
    policies: Vec<Policy>,
    services: Vec<Service>,
    slices: Vec<service::SliceRecord>,
    /// (kind, object) -> file of the first definition, for duplicate detection.
    seen: HashMap<(String, String), String>,
    problems: Vec<Problem>,
}

/// The kinds read; `<kind>List` (as the API returns lists) is read as a List of them.
const KINDS: [&str; 8] = [
    "Namespace",
    "Pod",
    "DanmEp",
    "NetworkPolicy",
    "DanmNetworkPolicy",
    "MultiNetworkPolicy",
    "Service",
    "EndpointSlice",
];

/// Lists nest at most this deep (a List of Lists of ...): bounds recursion on hostile input.
const MAX_LIST_DEPTH: usize = 8;

impl Loader {
    pub fn new(opts: LoadOptions) -> Self {
        Self {
            opts,
            namespaces: Vec::new(),
            pods: Vec::new(),
            danmeps: Vec::new(),
            policies: Vec::new(),
            services: Vec::new(),
            slices: Vec::new(),
            seen: HashMap::new(),
            problems: Vec::new(),
        }
    }

    /// Reads a file, or every manifest under a directory.
    pub fn add_path(&mut self, path: &std::path::Path) {
        files::add_path(self, path);
    }

    /// Reads one file's text.
    pub fn add_str(&mut self, file: &str, text: &str) {
        let docs = files::parse_documents(file, text, &mut self.problems);
        for (i, doc) in docs {
            self.add_value(file, &format!("#{i}"), &doc);
        }
    }

    /// Reads one already parsed document (an object or a List); `label` names it while it has
    /// no name (e.g. `#3`).
    pub fn add_value(&mut self, file: &str, label: &str, doc: &Value) {
        self.add_value_at(file, label, doc, 0, None);
    }

    fn file_problem(&mut self, file: &str, object: &str, field: &str, reason: String) {
        self.problems.push(Problem {
            file: file.to_string(),
            kind: String::new(),
            object: object.to_string(),
            field: field.to_string(),
            reason,
            severity: Severity::Error,
        });
    }

    /// `inherited`: (apiVersion, kind) of items of a typed list (`PodList` items carry neither).
    fn add_value_at(
        &mut self,
        file: &str,
        label: &str,
        doc: &Value,
        depth: usize,
        inherited: Option<(&str, &str)>,
    ) {
        if !doc.is_object() {
            let reason = format!("expected an object, found {}", ctx::type_name(doc));
            self.file_problem(file, label, "", reason);
            return;
        }
        let kind = match (doc.get("kind"), inherited) {
            (Some(Value::String(k)), _) if !k.is_empty() => k.as_str(),
            (None | Some(Value::Null), Some((_, k))) => k,
            (None | Some(Value::Null), None) => {
                self.file_problem(file, label, "kind", "missing kind".into());
                return;
            }
            (Some(other), _) => {
                let reason = format!("expected a non-empty string, found {}", show(other));
                self.file_problem(file, label, "kind", reason);
                return;
            }
        };
        let api_version = match doc.get("apiVersion") {
            Some(Value::String(s)) => s.as_str(),
            _ => inherited.map(|(a, _)| a).unwrap_or(""),
        };
        // "" for the core group and for a missing apiVersion (hand-written input is accepted).
        let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
        let version = api_version
            .rsplit_once('/')
            .map(|(_, v)| v)
            .unwrap_or(api_version);

        let typed_list = kind
            .strip_suffix("List")
            .is_some_and(|k| KINDS.contains(&k));
        if kind == "List" || typed_list {
            self.add_list(file, label, doc, kind, api_version, depth);
            return;
        }
        let mut problems = std::mem::take(&mut self.problems);
        let mut cx = Ctx {
            file,
            kind,
            object: label.to_string(),
            problems: &mut problems,
        };
        match (group, kind) {
            ("", "Namespace") => {
                if let Some(ns) = read_namespace(&mut cx, doc) {
                    if self.first_definition(&mut cx) {
                        self.namespaces.push(ns);
                    }
                }
            }
            ("", "Pod") => {
                if let Some(rec) = pod::read_pod(&mut cx, doc) {
                    if self.first_definition(&mut cx) {
                        self.pods.push(rec);
                    }
                }
            }
            ("danm.k8s.io" | "", "DanmEp") => {
                if let Some(rec) = pod::read_danmep(&mut cx, doc) {
                    if self.first_definition(&mut cx) {
                        self.danmeps.push(rec);
                    }
                }
            }
            ("networking.k8s.io" | "", "NetworkPolicy")
            | ("danm.k8s.io" | "", "DanmNetworkPolicy")
            | ("k8s.cni.cncf.io" | "", "MultiNetworkPolicy") => {
                if kind == "MultiNetworkPolicy"
                    && !group.is_empty()
                    && !matches!(version, "v1beta1" | "v1beta2")
                {
                    cx.warn(
                        "apiVersion",
                        format!(
                            "MultiNetworkPolicy version {:?} is not v1beta1 or v1beta2; read as v1beta2",
                            validate::shorten(version)
                        ),
                    );
                }
                if let Some(p) = policy::read_policy(&mut cx, doc) {
                    if self.first_definition(&mut cx)
                        && (p.kind != netwarden_engine::PolicyKind::NetworkPolicy
                            || self.opts.network_policy_enabled)
                    {
                        self.policies.push(p);
                    }
                }
            }
            ("", "Service") => {
                if let Some(s) = service::read_service(&mut cx, doc) {
                    if self.first_definition(&mut cx) {
                        self.services.push(s);
                    }
                }
            }
            ("discovery.k8s.io" | "", "EndpointSlice") => {
                if let Some(s) = service::read_slice(&mut cx, doc) {
                    if self.first_definition(&mut cx) {
                        self.slices.push(s);
                    }
                }
            }
            // Everything else (Deployments, Calico's NetworkPolicy, ...) is not ours.
            _ => {}
        }
        self.problems = problems;
    }

    fn add_list(
        &mut self,
        file: &str,
        label: &str,
        doc: &Value,
        kind: &str,
        api_version: &str,
        depth: usize,
    ) {
        if depth >= MAX_LIST_DEPTH {
            self.file_problem(file, label, "items", "Lists nested too deep".into());
            return;
        }
        let items = match doc.get("items") {
            None | Some(Value::Null) => return,
            Some(Value::Array(items)) => items,
            Some(other) => {
                let reason = format!("expected a list, found {}", ctx::type_name(other));
                self.file_problem(file, label, "items", reason);
                return;
            }
        };
        // Items of a typed list (`PodList`, as the API returns it) carry no kind of their own.
        let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
        let inherited = item_kind.map(|k| (api_version, k));
        for (i, item) in items.iter().enumerate() {
            let item_label = format!("{label}.items[{i}]");
            self.add_value_at(file, &item_label, item, depth + 1, inherited);
        }
    }

    /// Records the object's identity; false (with a problem) if it was defined before.
    fn first_definition(&mut self, cx: &mut Ctx<'_>) -> bool {
        let key = (cx.kind.to_string(), cx.object.clone());
        if let Some(first) = self.seen.get(&key) {
            cx.error(
                "metadata.name",
                format!("duplicate object (first defined in {first}); this one is ignored"),
            );
            return false;
        }
        self.seen.insert(key, cx.file.to_string());
        true
    }

    /// The second pass: pairs DanmEps with pods and EndpointSlices with Services, completes the
    /// namespaces, and returns everything.
    pub fn finish(mut self) -> Inventory {
        pod::attach_danmeps(&mut self.pods, &self.danmeps, &mut self.problems);
        service::attach_slices(&mut self.services, &self.slices, &mut self.problems);

        let declared: BTreeSet<String> = self.namespaces.iter().map(|n| n.name.clone()).collect();
        let referenced: BTreeSet<String> = self
            .pods
            .iter()
            .map(|p| p.pod.key.namespace.clone())
            .chain(self.policies.iter().map(|p| p.key.namespace.clone()))
            .chain(self.services.iter().map(|s| s.key.namespace.clone()))
            .filter(|ns| !declared.contains(ns))
            .collect();
        for name in referenced {
            self.namespaces.push(Namespace {
                name,
                labels: BTreeMap::new(),
            });
        }
        for ns in &mut self.namespaces {
            // Kubernetes sets this label itself and overwrites any other value.
            ns.labels
                .insert(NAMESPACE_NAME_LABEL.to_string(), ns.name.clone());
        }
        Inventory {
            namespaces: self.namespaces,
            pods: self.pods.into_iter().map(|r| r.pod).collect(),
            policies: self.policies,
            services: self.services,
            problems: self.problems,
        }
    }
}

/// A short rendering of a value for a reason.
pub(crate) fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{}\"", validate::shorten(s)),
        Value::Array(_) | Value::Object(_) | Value::Null => ctx::type_name(v).to_string(),
        other => validate::shorten(&other.to_string()),
    }
}

/// The metadata every object has. `ctx.object` is set to the object's name as soon as known.
pub(crate) struct Meta {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// Reads `metadata`; `None` (with problems) when the name or namespace is missing or invalid,
/// since such an object cannot be referred to safely.
pub(crate) fn read_meta(cx: &mut Ctx<'_>, doc: &Value, namespaced: bool) -> Option<Meta> {
    let empty = Value::Null;
    let meta = match get(doc, "metadata") {
        Some(m @ Value::Object(_)) => m,
        Some(other) => {
            cx.error(
                "metadata",
                format!("expected an object, found {}", ctx::type_name(other)),
            );
            &empty
        }
        None => &empty,
    };
    let name = cx
        .required_str(meta, "metadata", "name", "name; object ignored")
        .map(str::to_string);
    let namespace = if namespaced {
        cx.str(meta, "metadata", "namespace")
            .filter(|s| !s.is_empty())
            .unwrap_or("default")
    } else {
        ""
    }
    .to_string();
    let mut ok = true;
    if let Some(name) = &name {
        cx.object = if namespaced {
            format!(
                "{}/{}",
                validate::shorten(&namespace),
                validate::shorten(name)
            )
        } else {
            validate::shorten(name)
        };
        let check = if namespaced {
            validate::dns1123_subdomain(name)
        } else {
            validate::dns1123_label(name)
        };
        if let Err(e) = check {
            cx.error(
                "metadata.name",
                format!("invalid name: {e}; object ignored"),
            );
            ok = false;
        }
    } else {
        ok = false;
    }
    if namespaced {
        if let Err(e) = validate::dns1123_label(&namespace) {
            cx.error(
                "metadata.namespace",
                format!("invalid namespace: {e}; object ignored"),
            );
            ok = false;
        }
    }
    let (labels, _) = cx.string_map(meta, "metadata", "labels", true);
    let (annotations, _) = cx.string_map(meta, "metadata", "annotations", false);
    if !ok {
        return None;
    }
    Some(Meta {
        namespace,
        name: name.unwrap_or_default(),
        labels,
        annotations,
    })
}

fn read_namespace(cx: &mut Ctx<'_>, doc: &Value) -> Option<Namespace> {
    let meta = read_meta(cx, doc, false)?;
    Some(Namespace {
        name: meta.name,
        labels: meta.labels,
    })
}
