//! The arguments of the commands that read the agents' event streams: `report` and `suggest`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::{parse_window, AnalysisArgs, PageOutput};

#[derive(Args)]
pub struct ReportArgs {
    /// Event files (JSON lines, as `run --events-file` writes them); `-` for stdin.
    #[arg(short = 'e', long = "events", required = true, num_args = 1..)]
    pub events: Vec<PathBuf>,
    /// The evidence window: a monitored policy is ready to promote when it was monitored for
    /// this long, saw traffic, logged no would-deny and lost no event within it (e.g. 30m, 1h,
    /// 1.5h, 2d).
    #[arg(long, default_value = "1h", value_parser = parse_window)]
    pub clean_for: std::time::Duration,
    /// Manifests: list the monitored policies that appear in no event or status, too.
    #[arg(short = 'f', long = "filename", num_args = 1..)]
    pub paths: Vec<PathBuf>,
    /// `table`, `json`, or `html`: one self-contained page (no external fetches) with the
    /// would-deny counts over time per policy, the statuses and the flows.
    #[arg(short = 'o', long, value_enum, default_value_t = PageOutput::Table)]
    pub output: PageOutput,
}

#[derive(Args)]
pub struct SuggestArgs {
    /// Event files (JSON lines, as `run --events-file` writes them); `-` for stdin. Lines that
    /// are not events are counted and skipped.
    #[arg(short = 'e', long = "events", required = true, num_args = 1..)]
    pub events: Vec<PathBuf>,
    /// The cluster state the events were seen in: pods give the workloads, their labels and
    /// port names.
    #[command(flatten)]
    pub input: AnalysisArgs,
    /// The kind to write. NetworkPolicy covers the primary network only; MultiNetworkPolicy
    /// writes one policy per workload and NetworkAttachmentDefinition (`policy-for`);
    /// DanmNetworkPolicy covers every network (`networkSelector` in peers). Flows the kind
    /// cannot express are listed at the top of the output.
    #[arg(long, value_enum, default_value_t = KindArg::Standard)]
    pub kind: KindArg,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum KindArg {
    #[value(name = "NetworkPolicy")]
    Standard,
    #[value(name = "MultiNetworkPolicy")]
    Multi,
    #[value(name = "DanmNetworkPolicy")]
    Danm,
}

impl KindArg {
    pub fn kind(self) -> netwarden_engine::PolicyKind {
        match self {
            KindArg::Standard => netwarden_engine::PolicyKind::NetworkPolicy,
            KindArg::Multi => netwarden_engine::PolicyKind::MultiNetworkPolicy,
            KindArg::Danm => netwarden_engine::PolicyKind::DanmNetworkPolicy,
        }
    }
}
