//! The conformance case format (documented in `conformance/README.md`) and its loading.
//!
//! Files are YAML; every Kubernetes object inside is kept as a `serde_json::Value` so the runner
//! can hand it to `netwarden` untouched (or rewritten by a variant) without modelling its schema.

use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One conformance case: a sequence of steps over one set of namespaces and pods.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// Short unique name (also the file name without its number).
    pub name: String,
    /// The exact title of the upstream `It(...)` this case transcribes, if any.
    #[serde(default)]
    pub upstream: Option<String>,
    /// The upstream `Describe`/`Context` the title lives in (UDP and SCTP reuse titles).
    #[serde(default)]
    pub upstream_context: Option<String>,
    /// Free text for reviewers.
    #[serde(default)]
    pub notes: Option<String>,
    /// The namespaces, pods and other non-policy objects of the case. Absent: the shared
    /// `conformance/model.yaml` (and then the variants apply).
    #[serde(default)]
    pub objects: Option<Vec<Value>>,
    pub steps: Vec<Step>,
    /// Where the case was loaded from (filled by the loader).
    #[serde(skip)]
    pub file: PathBuf,
}

/// The state of the cluster at one point of a case and what must be observed then.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    #[serde(default)]
    pub description: Option<String>,
    /// Labels added to namespaces or pods from this step on (upstream "updated pod/namespace").
    #[serde(default)]
    pub add_labels: Vec<LabelChange>,
    /// Every policy present during this step (a step does not inherit the previous one's).
    #[serde(default)]
    pub policies: Vec<Value>,
    pub probes: Vec<Probe>,
}

/// Labels merged into one namespace (`namespace: y`) or one pod (`pod: x/b`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelChange {
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub pod: Option<String>,
    pub labels: BTreeMap<String, String>,
}

/// One expected matrix: for a port/protocol, on a network and optionally one address family.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Probe {
    pub port: u16,
    pub protocol: String,
    /// `default` (primary network) or the secondary network's `ns/name`.
    #[serde(default = "default_network")]
    pub network: String,
    /// `ipv4` or `ipv6`; absent: every probe of the network, whatever its family.
    #[serde(default)]
    pub family: Option<String>,
    /// The `allowed` matrix (rows: client, columns: server; `.` allowed, `X` denied).
    pub expect: String,
    /// The `staged_allowed` matrix; absent: equal to `expect` (no monitored policy).
    #[serde(default)]
    pub staged: Option<String>,
}

fn default_network() -> String {
    "default".to_string()
}

/// The repository's `conformance/` directory.
pub fn conformance_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance")
}

/// Parses a multi-document YAML file of Kubernetes objects.
pub fn load_objects(path: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// Loads every `*.yaml` case of a directory, sorted by file name.
pub fn load_cases(dir: &Path) -> Result<Vec<Case>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for file in files {
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let mut case: Case =
            serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        case.file = file;
        cases.push(case);
    }
    Ok(cases)
}

/// Applies label changes to namespaces and pods (by name) in a list of objects.
pub fn apply_labels(objects: &mut [Value], changes: &[LabelChange]) -> Result<(), String> {
    for change in changes {
        let (kind, ns, name) = match (&change.namespace, &change.pod) {
            (Some(ns), None) => ("Namespace", None, ns.as_str()),
            (None, Some(pod)) => {
                let (ns, name) = pod
                    .split_once('/')
                    .ok_or_else(|| format!("add_labels: pod {pod:?} is not ns/name"))?;
                ("Pod", Some(ns), name)
            }
            _ => return Err("add_labels: give exactly one of namespace or pod".to_string()),
        };
        let target = objects
            .iter_mut()
            .find(|o| {
                o["kind"] == kind
                    && o["metadata"]["name"] == name
                    && ns.is_none_or(|ns| o["metadata"]["namespace"] == ns)
            })
            .ok_or_else(|| format!("add_labels: no {kind} {:?}/{name}", ns.unwrap_or("")))?;
        let meta = target["metadata"]
            .as_object_mut()
            .ok_or_else(|| format!("add_labels: {kind} {name} has no metadata"))?;
        let labels = meta
            .entry("labels")
            .or_insert_with(|| Value::Object(Default::default()));
        let labels = labels
            .as_object_mut()
            .ok_or_else(|| format!("add_labels: {kind} {name} labels is not a map"))?;
        for (k, v) in &change.labels {
            labels.insert(k.clone(), Value::String(v.clone()));
        }
    }
    Ok(())
}
