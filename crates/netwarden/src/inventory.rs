//! From loaded manifests to a fed engine ([`netwarden_manifest::feed`]), shared by every
//! command that reads `-f PATH`; and, for the analysis commands
//! (`reach`, `explain`, `validate`), the same from the live cluster (`--kube`), optionally with
//! files laid over it ([`AnalysisInput`]).

use std::path::PathBuf;

use netwarden_engine::{Engine, EngineOptions};
pub use netwarden_manifest::feed::{apply_delta, engine_from, engine_from_owned};
use netwarden_manifest::{layer_paths, load_paths, Inventory, Layered, LoadOptions, Severity};

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

/// Prints problems to stderr; returns whether any is an error (or, with `strict`, any at all).
pub fn report_problems(inventory: &Inventory, strict: bool) -> bool {
    let mut fatal = false;
    for problem in &inventory.problems {
        eprintln!("{problem}");
        fatal |= strict || problem.severity == Severity::Error;
    }
    fatal
}
