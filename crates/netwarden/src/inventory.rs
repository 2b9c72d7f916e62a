//! From loaded manifests to a fed engine: the glue between `netwarden-manifest` and the pure
//! engine, shared by every command that reads `-f PATH`; and, for the analysis commands
//! (`reach`, `explain`, `validate`), the same from the live cluster (`--kube`), optionally with
//! files laid over it ([`AnalysisInput`]).

use std::path::PathBuf;
use std::sync::Arc;

use netwarden_engine::{Engine, EngineOptions, Namespace, Pod, PodKey, Policy, Service};
use netwarden_manifest::{
    layer_paths, load_paths, Inventory, InventoryDelta, Layered, LoadOptions, Severity,
};

/// Where the analysis commands read their objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnalysisInput {
    /// `-f PATH...`: manifests only.
    Files(Vec<PathBuf>),
    /// `--kube [-f PATH...]`: the cluster listed once, each object of `overlay` replacing the
    /// cluster's object of the same kind, namespace and name (a new one is added).
    Cluster {
        kubeconfig: Option<PathBuf>,
        overlay: Vec<PathBuf>,
        /// How long to wait for each answer of the API server.
        request_timeout: std::time::Duration,
    },
}

/// What [`load_analysis`] read, and what the user should know about how.
#[derive(Debug)]
pub struct Analysed {
    pub inventory: Inventory,
    /// Optional kinds the cluster does not serve, skipped (one line each).
    pub notes: Vec<String>,
}

/// Reads the input of an analysis command. Files alone never fail (their problems are in the
/// inventory); the cluster fails as a whole when any kind it must serve cannot be listed.
pub fn load_analysis(
    input: &AnalysisInput,
    load: &LoadOptions,
) -> Result<Analysed, netwarden_kube::KubeError> {
    match input {
        AnalysisInput::Files(paths) => Ok(Analysed {
            inventory: load_paths(paths, load),
            notes: Vec::new(),
        }),
        AnalysisInput::Cluster {
            kubeconfig,
            overlay,
            request_timeout,
        } => {
            let listed = netwarden_kube::list_once(&netwarden_kube::ListOptions {
                kubeconfig: kubeconfig.clone(),
                load: load.clone(),
                page_size: netwarden_kube::list::DEFAULT_PAGE_SIZE,
                request_timeout: *request_timeout,
            })?;
            let inventory = if overlay.is_empty() {
                listed.cluster.inventory()
            } else {
                listed.cluster.overlay(overlay)
            };
            Ok(Analysed {
                inventory,
                notes: listed.notes(),
            })
        }
    }
}

/// The base of `netwarden diff`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiffBase {
    /// `-f BASE...`.
    Files(Vec<PathBuf>),
    /// `--kube`: the live cluster, listed once.
    Cluster {
        kubeconfig: Option<PathBuf>,
        /// How long to wait for each answer of the API server.
        request_timeout: std::time::Duration,
    },
}

/// Reads the two views of `netwarden diff`: the base as it is, and with `changes` laid over
/// it (replacements, additions and `netwarden.io/delete` markers:
/// [`netwarden_manifest::overlay`]); with the notes on kinds the cluster does not serve.
pub fn load_layered(
    base: &DiffBase,
    changes: &[PathBuf],
    load: &LoadOptions,
) -> Result<(Layered, Vec<String>), netwarden_kube::KubeError> {
    match base {
        DiffBase::Files(paths) => Ok((layer_paths(paths, changes, load), Vec::new())),
        DiffBase::Cluster {
            kubeconfig,
            request_timeout,
        } => {
            let listed = netwarden_kube::list_once(&netwarden_kube::ListOptions {
                kubeconfig: kubeconfig.clone(),
                load: load.clone(),
                page_size: netwarden_kube::list::DEFAULT_PAGE_SIZE,
                request_timeout: *request_timeout,
            })?;
            Ok((listed.cluster.layer(changes), listed.notes()))
        }
    }
}

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
    feed(
        Engine::new(options),
        inventory.namespaces.iter().cloned(),
        inventory.pods.iter().cloned(),
        inventory.policies.iter().cloned(),
        inventory.services.iter().cloned(),
    )
}

/// [`engine_from`], consuming the inventory: each object moves into the engine, so a large
/// cluster is not held twice while it is fed (what set the peak of `reach` at 100,000 pods).
pub fn engine_from_owned(inventory: Inventory, options: EngineOptions) -> Engine {
    feed(
        Engine::new(options),
        inventory.namespaces,
        inventory.pods,
        inventory.policies,
        inventory.services,
    )
}

/// Feeds `engine` every object, in the order that lets each find what it refers to.
fn feed(
    mut engine: Engine,
    namespaces: impl IntoIterator<Item = Namespace>,
    pods: impl IntoIterator<Item = Pod>,
    policies: impl IntoIterator<Item = Policy>,
    services: impl IntoIterator<Item = Service>,
) -> Engine {
    namespaces.into_iter().for_each(|n| engine.set_namespace(n));
    pods.into_iter().for_each(|p| engine.set_pod(p));
    policies.into_iter().for_each(|p| engine.set_policy(p));
    services.into_iter().for_each(|s| engine.set_service(s));
    engine
}

/// Feeds `engine` what `delta` says, removals first.
pub fn apply_delta(engine: &mut Engine, delta: InventoryDelta) {
    apply_delta_with(engine, delta, |engine, change| match change {
        PodChange::Removed(key) => engine.remove_pod(key),
        PodChange::Set(pod) => engine.set_pod(pod),
    });
}

/// A pod of a delta, handed to the caller of [`apply_delta_with`].
pub enum PodChange<'a> {
    Removed(&'a PodKey),
    Set(Arc<Pod>),
}

/// [`apply_delta`] with the pods handed to `pods` (in the delta's order: removals first) instead
/// of fed to the engine: the agent keeps its local pods apart (`agent::apply_delta`).
pub fn apply_delta_with(
    engine: &mut Engine,
    delta: InventoryDelta,
    mut pods: impl FnMut(&mut Engine, PodChange),
) {
    for key in &delta.pods_removed {
        pods(engine, PodChange::Removed(key));
    }
    for reference in &delta.policies_removed {
        engine.remove_policy(reference);
    }
    for key in &delta.services_removed {
        engine.remove_service(key);
    }
    for name in &delta.namespaces_removed {
        engine.remove_namespace(name);
    }
    for namespace in delta.namespaces {
        engine.set_namespace(namespace);
    }
    for pod in delta.pods {
        pods(engine, PodChange::Set(pod));
    }
    for policy in delta.policies {
        engine.set_policy(policy);
    }
    for service in delta.services {
        engine.set_service(service);
    }
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
