//! `netwarden suggest`: least-privilege policies, in monitor mode, from the flows learn mode
//! observed (issue 9, item 2).
//!
//! The pipeline, each step in its own module:
//! 1. [`workloads`]: the cluster state's pods grouped by stable labels, each group with a
//!    selector that selects exactly its pods;
//! 2. [`flows`]: event streams folded, line by line, into distinct flows between workloads and
//!    addresses (memory bounded by distinct flows), noting which workloads logged in which
//!    direction;
//! 3. [`policies`]: one policy per workload and kind isolating the directions that logged,
//!    a rule per peer with the ports seen (pure);
//! 4. [`yaml`]: the policies as YAML, a comment above each rule naming its flows.
//!
//! The property that holds (tested by `tests/suggest.rs` over random clusters and traffic):
//! with the suggested policies loaded back through the manifest loader, every observed flow
//! the kind can express is allowed in the staged view, and where a suggestion isolates a
//! workload, a flow no event showed from another workload or address is denied.

pub mod flows;
pub mod policies;
pub mod workloads;
pub mod yaml;

use std::fs::File;
use std::io::{self, BufReader, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use netwarden_engine::{Pod, PolicyKind};

pub use flows::{End, Flow, Observations, Seen, Skipped};
pub use policies::{suggest, SuggestedPolicy, Suggestion, Unexpressible};
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

/// `netwarden suggest`: the YAML to `out`, one warning on stderr for lines that were not
/// events and one for flows the kind cannot express.
pub fn command(
    pods: &[Pod],
    events: &[PathBuf],
    kind: PolicyKind,
    mut out: impl Write,
) -> anyhow::Result<ExitCode> {
    let workloads = Workloads::new(pods);
    let observations = read_streams(&workloads, events)?;
    if let Some(first) = &observations.skipped.first_not_event {
        eprintln!(
            "netwarden: warning: skipped {} line(s) that are not events (first: {first})",
            observations.skipped.not_events
        );
    }
    let suggestion = suggest(&workloads, &observations, kind);
    if !suggestion.unexpressible.is_empty() {
        eprintln!(
            "netwarden: warning: {} observed flow(s) cannot be expressed as {kind}; they are listed at the top of the output",
            suggestion.unexpressible.len()
        );
    }
    out.write_all(yaml::render(&suggestion, &workloads, &observations).as_bytes())?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
