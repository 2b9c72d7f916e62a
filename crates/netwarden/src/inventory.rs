//! From loaded manifests to a fed engine: the glue between `netwarden-manifest` and the pure
//! engine, shared by every command that reads `-f PATH`.

use std::path::PathBuf;

use netwarden_engine::{Engine, EngineOptions};
use netwarden_manifest::{load_paths, Inventory, LoadOptions, Severity};

/// Loads manifests and feeds an engine with every valid object.
pub fn load_engine(
    paths: &[PathBuf],
    load: &LoadOptions,
    options: EngineOptions,
) -> (Engine, Inventory) {
    let inventory = load_paths(paths, load);
    let engine = engine_from(&inventory, options);
    (engine, inventory)
}

pub fn engine_from(inventory: &Inventory, options: EngineOptions) -> Engine {
    let mut engine = Engine::new(options);
    for ns in &inventory.namespaces {
        engine.set_namespace(ns.clone());
    }
    for pod in &inventory.pods {
        engine.set_pod(pod.clone());
    }
    for policy in &inventory.policies {
        engine.set_policy(policy.clone());
    }
    for service in &inventory.services {
        engine.set_service(service.clone());
    }
    engine
}

/// Prints problems to stderr; returns whether any is an error (or, with `strict`, any at all).
pub fn report_problems(inventory: &Inventory, strict: bool) -> bool {
    let mut fatal = false;
    for problem in &inventory.problems {
        eprintln!("{problem}");
        fatal |= strict || problem.severity == Severity::Error;
    }
    fatal
}
