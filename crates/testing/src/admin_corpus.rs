//! The admin-policy conformance corpus (`crates/netwarden/tests/admin_conformance/`), read into
//! typed cases: upstream's AdminNetworkPolicy / BaselineAdminNetworkPolicy (v0.1.7) and
//! ClusterNetworkPolicy (main) conformance tests, every asserted connectivity state a probe.
//!
//! It is a loader only, with no opinion on who decides a probe: the reference evaluator
//! ([`crate::admin_reference`]), the engine and the lab all replay the same [`Corpus`] through
//! [`Case::states`], so they are checked against exactly the same data.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// Transport protocol of a probe, as upstream's tests name it (`tcp`/`udp`/`sctp`, written in
/// capitals in the corpus as in Kubernetes objects).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
pub enum Protocol {
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
    #[serde(rename = "SCTP")]
    Sctp,
}

impl Protocol {
    /// The Kubernetes spelling (`TCP`, `UDP`, `SCTP`).
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One asserted connectivity state: `from` (a pod, `ns/name`) connects to `to` (a pod, whose
/// `status.podIP` is dialled, or an IP literal) on `port`/`protocol`, and upstream expects the
/// connection to succeed iff `allowed`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Probe {
    pub from: String,
    pub to: String,
    pub port: u16,
    pub protocol: Protocol,
    pub allowed: bool,
    /// Where upstream asserts it: `file.go:line` (the file of the case's source, at its tag).
    pub upstream: String,
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} -> {} {}/{} expected {} ({})",
            self.from,
            self.to,
            self.port,
            self.protocol,
            if self.allowed { "allowed" } else { "denied" },
            self.upstream
        )
    }
}

/// An object to delete, named as Kubernetes names it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ObjectRef {
    pub kind: String,
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
}

/// One state of a test: objects created or replaced (whole objects), objects deleted, then the
/// probes that must hold in the resulting state.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub name: String,
    #[serde(default)]
    pub apply: Vec<Value>,
    #[serde(default)]
    pub delete: Vec<ObjectRef>,
    pub expect: Vec<Probe>,
}

/// Where a case was transcribed from.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    pub repo: String,
    /// `v0.1.7` or `main`.
    pub tag: String,
    pub commit: String,
    pub file: String,
    /// The upstream `ConformanceTest` short name.
    pub test: String,
    pub line: u32,
    pub manifest: String,
}

/// One upstream conformance test: steps run in order, each on the state the previous left
/// (upstream's subtests share their policies), starting from the cluster with no policy.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub source: Source,
    pub steps: Vec<Step>,
    /// The file the case was read from (set by [`load`]).
    #[serde(skip)]
    pub path: PathBuf,
}

impl Case {
    /// `tag/test`, unique in the corpus.
    pub fn name(&self) -> String {
        format!("{}/{}", self.source.tag, self.source.test)
    }

    /// The objects in force at each step (cluster objects first, then policies in the order they
    /// were first applied), paired with the step. An apply replaces the object of the same kind,
    /// namespace and name; deleting an object that is not there is an error (a transcription
    /// mistake, not a state to test).
    pub fn states(&self, cluster: &[Value]) -> Result<Vec<(&Step, Vec<Value>)>, String> {
        let mut objects = cluster.to_vec();
        let mut out = Vec::new();
        for step in &self.steps {
            for obj in &step.apply {
                let key = object_key(obj)?;
                match objects
                    .iter()
                    .position(|o| object_key(o).ok() == Some(key.clone()))
                {
                    Some(i) => objects[i] = obj.clone(),
                    None => objects.push(obj.clone()),
                }
            }
            for gone in &step.delete {
                let key = (
                    gone.kind.clone(),
                    gone.namespace.clone().unwrap_or_default(),
                    gone.name.clone(),
                );
                let before = objects.len();
                objects.retain(|o| object_key(o).ok() != Some(key.clone()));
                if objects.len() == before {
                    return Err(format!(
                        "{}: step {:?} deletes {key:?}, which does not exist",
                        self.name(),
                        step.name
                    ));
                }
            }
            out.push((step, objects.clone()));
        }
        Ok(out)
    }
}

/// `(kind, namespace or "", name)` of a Kubernetes object.
pub fn object_key(obj: &Value) -> Result<(String, String, String), String> {
    let kind = obj["kind"].as_str();
    let name = obj["metadata"]["name"].as_str();
    match (kind, name) {
        (Some(kind), Some(name)) => Ok((
            kind.to_string(),
            obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            name.to_string(),
        )),
        _ => Err(format!("object without kind or metadata.name: {obj}")),
    }
}

/// The corpus: the cluster every case starts from and the cases, sorted by file name.
#[derive(Clone, Debug)]
pub struct Corpus {
    pub cluster: Vec<Value>,
    pub cases: Vec<Case>,
}

impl Corpus {
    /// Cases of one tag (`v0.1.7`, `main`).
    pub fn of_tag<'a>(&'a self, tag: &'a str) -> impl Iterator<Item = &'a Case> + 'a {
        self.cases.iter().filter(move |c| c.source.tag == tag)
    }
}

/// The corpus directory of this repository.
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../netwarden/tests/admin_conformance")
}

/// Reads `dir/cluster.yaml` (multi-document) and every `dir/cases/**/*.yaml`.
pub fn load(dir: &Path) -> Result<Corpus, String> {
    let cluster_path = dir.join("cluster.yaml");
    let text = std::fs::read_to_string(&cluster_path)
        .map_err(|e| format!("{}: {e}", cluster_path.display()))?;
    let cluster: Vec<Value> = serde_saphyr::from_multiple(&text)
        .map_err(|e| format!("{}: {e}", cluster_path.display()))?;
    let mut files = Vec::new();
    collect_yaml(&dir.join("cases"), &mut files)?;
    files.sort();
    let mut cases = Vec::new();
    for file in files {
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let mut case: Case =
            serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        case.path = file;
        cases.push(case);
    }
    if cases.is_empty() {
        return Err(format!("no cases under {}", dir.join("cases").display()));
    }
    Ok(Corpus { cluster, cases })
}

fn collect_yaml(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        if path.is_dir() {
            collect_yaml(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "yaml") {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn case(steps: &str) -> Case {
        let text = format!(
            "source: {{repo: r, tag: main, commit: c, file: conformance/tests/t.go, test: T, line: 1, manifest: m}}\nsteps:\n{steps}"
        );
        serde_saphyr::from_str(&text).unwrap()
    }

    #[test]
    fn steps_replace_by_kind_namespace_and_name_and_accumulate() {
        let c = case(
            "- name: one\n  apply: [{kind: ClusterNetworkPolicy, metadata: {name: p}, spec: {priority: 1}}]\n  expect: []\n\
             - name: two\n  apply: [{kind: ClusterNetworkPolicy, metadata: {name: p}, spec: {priority: 2}}]\n  expect: []\n\
             - name: three\n  delete: [{kind: Namespace, name: ns}]\n  expect: []\n",
        );
        let cluster = vec![json!({"kind": "Namespace", "metadata": {"name": "ns"}})];
        let states = c.states(&cluster).unwrap();
        assert_eq!(states[0].1.len(), 2);
        assert_eq!(states[1].1.len(), 2, "the policy is replaced, not added");
        assert_eq!(states[1].1[1]["spec"]["priority"], 2);
        assert_eq!(
            states[2].1.len(),
            1,
            "the namespace is gone, the policy stays"
        );
        assert_eq!(states[2].1[0]["kind"], "ClusterNetworkPolicy");
    }

    #[test]
    fn deleting_what_is_not_there_is_an_error() {
        let c = case(
            "- name: one\n  delete: [{kind: NetworkPolicy, name: x, namespace: y}]\n  expect: []\n",
        );
        let err = c.states(&[]).unwrap_err();
        assert!(err.contains("does not exist"), "{err}");
    }

    #[test]
    fn probes_read_their_protocol_and_reject_unknown_fields() {
        let c = case("- name: one\n  expect:\n  - {from: a/b, to: c/d, port: 53, protocol: UDP, allowed: false, upstream: 't.go:9'}\n");
        let p = &c.steps[0].expect[0];
        assert_eq!((p.port, p.protocol, p.allowed), (53, Protocol::Udp, false));
        assert_eq!(p.to_string(), "a/b -> c/d 53/UDP expected denied (t.go:9)");
        let text = "source: {repo: r, tag: main, commit: c, file: f, test: T, line: 1, manifest: m}\nsteps:\n- name: one\n  expect:\n  - {from: a/b, to: c/d, port: 53, protocol: UDP, allowed: false, upstream: x, family: ipv6}\n";
        assert!(serde_saphyr::from_str::<Case>(text).is_err());
    }
}
