//! `netwarden run -f DIR` (the standalone agent) and `netwarden apply` (one pass).
//!
//! The agent loads the manifests, feeds the engine (which ignores objects that did not change),
//! and syncs only the pods the engine names dirty. It polls the files' sizes and modification
//! times; a change reloads them and the same diff-by-object logic applies. Rules stay in place
//! when the agent stops; a restarted agent re-applies each isolated pod once (an atomic
//! replacement per netns, so no window opens) and removes rules from pods no longer isolated.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Result;
use netwarden_dataplane::Backend;
use netwarden_engine::{Engine, EngineOptions, ObjectKey, PodKey, PolicyRef};
use netwarden_manifest::{load_paths, Inventory, LoadOptions};
use netwarden_render::RenderOptions;
use tracing::{info, warn};

use crate::lab::dataplane;
use crate::sync::Syncer;

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub paths: Vec<PathBuf>,
    pub load: LoadOptions,
    pub engine: EngineOptions,
    pub render: RenderOptions,
    pub backend: Backend,
    pub interval: Duration,
}

/// Size and modification time of every manifest file, to notice changes cheaply.
fn fingerprint(paths: &[PathBuf]) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    fn walk(path: &Path, out: &mut Vec<(PathBuf, u64, Option<SystemTime>)>) {
        let Ok(meta) = std::fs::metadata(path) else {
            return;
        };
        if meta.is_dir() {
            let Ok(entries) = std::fs::read_dir(path) else {
                return;
            };
            let mut children: Vec<PathBuf> =
                entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
            children.sort();
            for child in children {
                walk(&child, out);
            }
        } else {
            out.push((path.to_path_buf(), meta.len(), meta.modified().ok()));
        }
    }
    let mut out = Vec::new();
    for p in paths {
        walk(p, &mut out);
    }
    out
}

/// Feeds `engine` with `next`, removing what `previous` had and `next` lacks. Unchanged objects
/// are ignored by the engine itself, so only affected pods become dirty.
pub fn apply_inventory(engine: &mut Engine, previous: Option<&Inventory>, next: &Inventory) {
    if let Some(prev) = previous {
        let pods: BTreeSet<&PodKey> = next.pods.iter().map(|p| &p.key).collect();
        for p in prev.pods.iter().filter(|p| !pods.contains(&p.key)) {
            engine.remove_pod(&p.key);
        }
        let policies: BTreeSet<PolicyRef> = next.policies.iter().map(|p| p.reference()).collect();
        for p in prev
            .policies
            .iter()
            .filter(|p| !policies.contains(&p.reference()))
        {
            engine.remove_policy(&p.reference());
        }
        let services: BTreeSet<&ObjectKey> = next.services.iter().map(|s| &s.key).collect();
        for s in prev.services.iter().filter(|s| !services.contains(&s.key)) {
            engine.remove_service(&s.key);
        }
        let namespaces: BTreeSet<&String> = next.namespaces.iter().map(|n| &n.name).collect();
        for n in prev
            .namespaces
            .iter()
            .filter(|n| !namespaces.contains(&n.name))
        {
            engine.remove_namespace(&n.name);
        }
    }
    for ns in &next.namespaces {
        engine.set_namespace(ns.clone());
    }
    for pod in &next.pods {
        engine.set_pod(pod.clone());
    }
    for policy in &next.policies {
        engine.set_policy(policy.clone());
    }
    for service in &next.services {
        engine.set_service(service.clone());
    }
}

/// Runs the agent (`once`: a single pass, exit status says whether every pod was applied).
pub fn run(config: AgentConfig, once: bool) -> Result<ExitCode> {
    let mut engine = Engine::new(config.engine.clone());
    let mut syncer = Syncer::new(dataplane(config.backend), config.backend, config.render);
    syncer.converge_removals = true;
    let mut previous: Option<Inventory> = None;
    let mut seen = Vec::new();
    let mut reported: BTreeSet<String> = BTreeSet::new();
    loop {
        let now = fingerprint(&config.paths);
        if now != seen || previous.is_none() {
            seen = now;
            let inventory = load_paths(&config.paths, &config.load);
            for problem in &inventory.problems {
                let line = problem.to_string();
                if reported.insert(line.clone()) {
                    warn!("{line}");
                }
            }
            apply_inventory(&mut engine, previous.as_ref(), &inventory);
            previous = Some(inventory);
        }
        let dirty = engine.take_dirty();
        if !dirty.is_empty() || once {
            let report = syncer.sync(&mut engine, dirty);
            syncer.converge_removals = false;
            info!("{report}");
            for error in &report.errors {
                warn!("{error}");
            }
            if once {
                return Ok(if report.errors.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                });
            }
        }
        std::thread::sleep(config.interval);
    }
}
