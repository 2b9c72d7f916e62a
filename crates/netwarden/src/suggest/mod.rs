//! `netwarden suggest`: least-privilege policies, in monitor mode, from the flows learn mode
//! observed (issue 9, item 2).
//!
//! The pipeline, each step in its own module:
//! 1. [`workloads`]: the cluster state's pods grouped by stable labels, each group with a
//!    selector that selects exactly its pods;
//! 2. [`flows`]: event streams folded, line by line, into distinct flows between workloads and
//!    addresses (memory bounded by distinct flows), noting which workloads logged in which
//!    direction;
//! 3. [`tiers`]: what the cluster's admin policies decide for those flows (SPEC 8), from the
//!    engine's evaluation;
//! 4. [`policies`]: one policy per workload and kind isolating the directions that logged,
//!    a rule per peer with the ports seen, none where the Admin tier decides (pure);
//! 5. [`yaml`]: the policies as YAML, a comment above each rule naming its flows, the flows
//!    the Admin tier decides in the header.
//!
//! The property that holds (tested by `tests/suggest.rs` over random clusters with admin
//! policies and random traffic): with the suggested policies loaded back through the manifest
//! loader, every observed flow the kind can express and the Admin tier does not deny (in the
//! staged view) is allowed in the staged view on every side a suggestion isolates (a side no
//! suggestion isolates keeps its verdict); and where a suggestion isolates a workload, its
//! rules allow no flow no event showed from another workload or address.

pub mod flows;
pub mod policies;
pub mod tiers;
pub mod workloads;
pub mod yaml;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, BufReader, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use netwarden_engine::{EngineOptions, PolicyKind};
use netwarden_manifest::feed::engine_from;
use netwarden_manifest::Inventory;

pub use flows::{End, Flow, Observations, Seen, Skipped};
pub use policies::{suggest, AdminDecided, SuggestedPolicy, Suggestion, Unexpressible};
pub use tiers::{AdminTiers, FlowTiers};
pub use workloads::{stable_labels, Workload, WorkloadId, Workloads, PER_INSTANCE_LABELS};

/// Reads every event stream (`-` is stdin) into observations over `workloads`.
pub fn read_streams(workloads: &Workloads, paths: &[PathBuf]) -> anyhow::Result<Observations> {
    let mut observations = Observations::default();
    for path in paths {
        let name = path.display().to_string();
        if path.as_os_str() == "-" {
            observations
                .read(workloads, "stdin", io::stdin().lock())
                .context("reading events from stdin")?;
        } else {
            let file = File::open(path).with_context(|| format!("opening events file {name}"))?;
            observations
                .read(workloads, &name, BufReader::new(file))
                .with_context(|| format!("reading events file {name}"))?;
        }
    }
    Ok(observations)
}

/// What the cluster's admin policies decide for `observations` (see [`tiers`]): the engine
/// is fed with the cluster and asked for the rules of the pods that took part only.
pub fn admin_tiers(
    inventory: &Inventory,
    options: EngineOptions,
    workloads: &Workloads,
    observations: &Observations,
) -> AdminTiers {
    if inventory.admin_policies.is_empty() {
        return AdminTiers::default();
    }
    let mut engine = engine_from(inventory, options);
    let mut involved = BTreeSet::new();
    for flow in observations.flows.keys() {
        for end in [flow.src, flow.dst] {
            if let End::Workload(id) = end {
                involved.insert(id);
            }
        }
    }
    for (id, _, _) in &observations.watched {
        involved.insert(*id);
    }
    let rules: BTreeMap<_, _> = involved
        .into_iter()
        .flat_map(|id| workloads.get(id).pods.iter())
        .filter_map(|key| engine.pod_rules(key).map(|r| (key.clone(), r)))
        .collect();
    AdminTiers::of(workloads, observations, &rules)
}

/// `netwarden suggest`: the YAML to `out`, one warning on stderr for lines that were not
/// events, one for flows the kind cannot express and one for flows the Admin tier decides.
pub fn command(
    inventory: &Inventory,
    options: EngineOptions,
    events: &[PathBuf],
    kind: PolicyKind,
    mut out: impl Write,
) -> anyhow::Result<ExitCode> {
    let workloads = Workloads::new(&inventory.pods);
    let observations = read_streams(&workloads, events)?;
    if let Some(first) = &observations.skipped.first_not_event {
        eprintln!(
            "netwarden: warning: skipped {} line(s) that are not events (first: {first})",
            observations.skipped.not_events
        );
    }
    let tiers = admin_tiers(inventory, options, &workloads, &observations);
    let suggestion = suggest(&workloads, &observations, &tiers, kind);
    if !suggestion.unexpressible.is_empty() {
        eprintln!(
            "netwarden: warning: {} observed flow(s) cannot be expressed as {kind}; they are listed at the top of the output",
            suggestion.unexpressible.len()
        );
    }
    if !suggestion.admin.is_empty() {
        eprintln!(
            "netwarden: warning: the Admin tier decides {} observed flow(s) ({} denied); they are listed at the top of the output",
            suggestion.admin.len(),
            suggestion.admin.iter().filter(|a| a.tiers.denied).count()
        );
    }
    out.write_all(yaml::render(&suggestion, &workloads, &observations).as_bytes())?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
