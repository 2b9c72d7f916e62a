//! A directory of manifests (YAML, multi-document, or JSON; `kind: List` too) loaded into a
//! server: what the binary serves so that `netwarden run --kube` can be tried locally and the
//! benchmarks can serve a large cluster.
//!
//! Strict where the manifest loader of the agent is lenient: a file that does not parse fails
//! the load (a fake cluster silently missing objects would make a benchmark lie). Kinds the
//! fake does not serve (Deployments, ...) are skipped and counted.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::resources::known_crds;
use crate::server::FakeApiServer;

/// Every file under `dir` (recursively) ending in `.yaml`, `.yml` or `.json`, sorted.
pub fn manifest_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in
            std::fs::read_dir(&d).with_context(|| format!("reading directory {}", d.display()))?
        {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
            {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn yaml_options() -> serde_saphyr::Options {
    let mut o = serde_saphyr::Options::default();
    // A benchmark cluster is one large file: raise the parser's size budget, not its depth.
    let mut budget = serde_saphyr::Budget::default();
    budget.max_events = budget.max_events.max(50_000_000);
    budget.max_nodes = budget.max_nodes.max(20_000_000);
    o.budget = Some(budget);
    o
}

/// The objects of one file's text, `kind: List` flattened.
pub fn parse_objects(file: &str, text: &str) -> Result<Vec<Value>> {
    let docs: Vec<Value> = if file.ends_with(".json") {
        vec![serde_json::from_str(text).with_context(|| format!("{file}: not valid JSON"))?]
    } else {
        serde_saphyr::from_multiple_with_options(text, yaml_options())
            .with_context(|| format!("{file}: not valid YAML"))?
    };
    let mut out = Vec::new();
    for doc in docs.into_iter().filter(|d| !d.is_null()) {
        if doc["kind"] == "List"
            || doc["kind"]
                .as_str()
                .is_some_and(|k| k.ends_with("List") && doc["items"].is_array())
        {
            out.extend(doc["items"].as_array().into_iter().flatten().cloned());
        } else {
            out.push(doc);
        }
    }
    for (i, obj) in out.iter().enumerate() {
        if !obj.is_object() || !obj["kind"].is_string() || !obj["apiVersion"].is_string() {
            bail!("{file}: object #{} has no apiVersion or kind", i + 1);
        }
    }
    Ok(out)
}

/// What a load did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Loaded {
    pub created: usize,
    /// Namespaces that objects use but no manifest declares, created empty.
    pub implied_namespaces: Vec<String>,
    /// `apiVersion kind` of objects whose kind the fake does not serve.
    pub skipped: Vec<String>,
    /// CRDs installed because manifests hold their objects.
    pub installed_crds: Vec<String>,
}

/// Loads every manifest under `dir` into the server: CRDs whose objects appear are installed,
/// Namespaces come first (plus those only implied by objects), then everything else.
pub fn load_dir(server: &FakeApiServer, dir: &Path) -> Result<Loaded> {
    let mut objects = Vec::new();
    for file in manifest_files(dir)? {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        objects.extend(parse_objects(&file.display().to_string(), &text)?);
    }
    let mut loaded = Loaded::default();
    for crd in known_crds() {
        let used = objects
            .iter()
            .any(|o| o["apiVersion"] == crd.api_version() && o["kind"] == crd.kind.as_str());
        if used {
            server.install_crd(&crd.group, &crd.version, &crd.kind);
            loaded
                .installed_crds
                .push(format!("{} {}", crd.api_version(), crd.kind));
        }
    }
    let is_namespace = |o: &Value| o["kind"] == "Namespace" && o["apiVersion"] == "v1";
    let declared: std::collections::BTreeSet<String> = objects
        .iter()
        .filter(|o| is_namespace(o))
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    let mut implied: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    for o in &objects {
        if let Some(ns) = o["metadata"]["namespace"].as_str() {
            if !declared.contains(ns) {
                implied.insert(ns.to_string());
            }
        }
    }
    let (namespaces, rest): (Vec<Value>, Vec<Value>) = objects.into_iter().partition(is_namespace);
    let implied_objects = implied
        .iter()
        .map(|ns| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    for obj in namespaces.into_iter().chain(implied_objects).chain(rest) {
        let what = format!(
            "{} {} {}/{}",
            obj["apiVersion"].as_str().unwrap_or(""),
            obj["kind"].as_str().unwrap_or(""),
            obj["metadata"]["namespace"].as_str().unwrap_or(""),
            obj["metadata"]["name"].as_str().unwrap_or("")
        );
        match server.create(obj) {
            Ok(_) => loaded.created += 1,
            Err(e) if e.code == 400 && e.message.starts_with("no kind") => {
                loaded.skipped.push(what)
            }
            Err(e) => bail!("creating {what}: {e}"),
        }
    }
    loaded.implied_namespaces = implied.into_iter().collect();
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_documents_are_flattened() {
        let text = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: a}}\n- {apiVersion: v1, kind: Pod, metadata: {name: b}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n";
        let objs = parse_objects("x.yaml", text).unwrap();
        assert_eq!(objs.len(), 3);
        assert!(parse_objects("x.yaml", "kind: Pod\n").is_err());
        assert!(parse_objects("x.json", "{").is_err());
    }
}
