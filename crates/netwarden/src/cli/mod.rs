//! The command line, declared: [`Cli`] and its [`Command`]s, the inputs several commands share
//! (manifests, the cluster, the switches of every reader of objects) and the output formats.
//! Each command's own arguments are in the submodule of its group, beside the small parsers
//! and conversions to the library's options that only the command line needs; what each
//! command does is in `commands`. The values the library's own queries take (`PORT/PROTO`,
//! pod selectors) are [`netwarden::cli_args`].

pub mod agent;
pub mod analysis;
pub mod lab;
pub mod promote;
pub mod report;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use netwarden::inventory::{engine_from_owned, load_analysis, report_problems, AnalysisInput};
use netwarden_engine::{DnsMode, EngineOptions};
use netwarden_manifest::LoadOptions;

use self::agent::RunArgs;
use self::analysis::{DiffArgs, ExplainArgs, ReachArgs, RenderArgs, ValidateArgs};
use self::lab::{DemoArgs, LabCommand};
use self::promote::PromoteArgs;
use self::report::{ReportArgs, SuggestArgs};

#[derive(Parser)]
#[command(
    name = "netwarden",
    version,
    about = "Kubernetes network policy on every pod interface, with a monitor phase"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// How log lines are written to stderr: `text` for people, `json` (one object per line)
    /// for log collectors (the DaemonSet's choice).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
pub enum Command {
    /// Every ordered pod pair on every network: allowed now, and allowed once monitored
    /// policies are enforced.
    Reach(ReachArgs),
    /// Why one flow is allowed or denied: the policies isolating each side and the rules
    /// that match.
    Explain(ExplainArgs),
    /// Report every problem in the manifests (file, kind, object, field, reason).
    Validate(ValidateArgs),
    /// Preview a change: every flow whose verdict changes when the files of --with are laid
    /// over the base (newly denied, newly allowed, staged-view changes), with the policies
    /// responsible.
    Diff(DiffArgs),
    /// Print the exact rules netwarden programs into one pod's netns.
    Render(RenderArgs),
    /// Enforce the manifests once: program every pod netns (`netwarden.io/netns`), then exit.
    Apply(RunArgs),
    /// The agent: enforce, then watch the manifests and re-apply only what a change affects.
    Run(RunArgs),
    /// A real netns topology from manifests, with probes of real traffic.
    #[command(subcommand)]
    Lab(LabCommand),
    /// Build the lab from examples/, enforce, probe, show what happened, clean up.
    Demo(DemoArgs),
    /// Aggregate events (JSON lines) per policy, source and destination workload and port,
    /// and give each monitored policy a promotion verdict from the agents' status records:
    /// ready only when monitored for --clean-for, with traffic, no would-deny and no events lost.
    Report(ReportArgs),
    /// Switch one monitored policy to enforce: edit its mode annotation in the manifest file
    /// (nothing else in the file changes), or patch it in the cluster with your kubeconfig.
    Promote(PromoteArgs),
    /// Least-privilege policies (monitor mode, YAML) from observed flows: learn mode's
    /// `observed` events and the `would-deny` ones, per workload (pods grouped by stable
    /// labels), a comment on each rule naming the flows that justify it.
    Suggest(SuggestArgs),
    /// Print the CustomResourceDefinitions netwarden serves (DanmNetworkPolicy,
    /// MultiNetworkPolicy) as YAML, for `kubectl apply -f -` (deploy/crds.yaml is this output).
    Crd,
}

#[derive(Args, Clone)]
pub struct Input {
    /// Manifest files or directories (YAML, multi-document, `kind: List`, or JSON).
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    pub paths: Vec<PathBuf>,
    #[command(flatten)]
    pub options: InputOptions,
}

/// The input of `reach`, `explain` and `validate`: manifests, the live cluster, or both.
#[derive(Args, Clone)]
pub struct AnalysisArgs {
    /// Manifest files or directories (YAML, multi-document, `kind: List`, or JSON). With
    /// --kube they are laid over the cluster ("the cluster plus these changes"): each object in
    /// them replaces the cluster's object of the same kind, namespace and name, and one the
    /// cluster does not have is added. Two objects of the same name in the files are still
    /// duplicates (an error).
    #[arg(short = 'f', long = "filename", required_unless_present = "kube", num_args = 1..)]
    pub paths: Vec<PathBuf>,
    /// Read the live cluster's objects: one LIST of every kind `run --kube` watches, no watch.
    /// A CRD that is not installed is skipped with a note on stderr; problems of cluster
    /// objects name the source `cluster`.
    #[arg(long)]
    pub kube: bool,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub options: InputOptions,
}

/// How a user command reaches the cluster with --kube (every command that has --kube).
#[derive(Args, Clone)]
pub struct ClusterArgs {
    /// The kubeconfig to use with --kube (default: KUBECONFIG, ~/.kube/config, then the
    /// in-cluster service account, as kubectl). Its `exec:` credential plugin, if any, runs.
    #[arg(long, requires = "kube")]
    pub kubeconfig: Option<PathBuf>,
    /// With --kube: how long to wait for each answer of the API server (at most 10s to
    /// connect) before failing, as kubectl's --request-timeout.
    #[arg(long, default_value = "30s", value_parser = parse_interval, requires = "kube")]
    pub request_timeout: std::time::Duration,
}

/// The switches every reader of objects takes.
#[derive(Args, Clone)]
pub struct InputOptions {
    /// Make any problem in the input fatal.
    #[arg(long)]
    pub strict: bool,
    /// Ignore `networking.k8s.io/v1` NetworkPolicy objects (with --kube: not even listed).
    #[arg(long)]
    pub no_network_policy: bool,
    /// Where outgoing DNS (TCP/UDP 53) is allowed without a rule: where a DanmNetworkPolicy
    /// isolates egress (seed 004's rule; NetworkPolicy and MultiNetworkPolicy keep the exact
    /// Kubernetes semantics), on every egress-isolated interface, or nowhere.
    #[arg(long, value_enum, default_value_t = DnsArg::Danm)]
    pub dns: DnsArg,
}

impl AnalysisArgs {
    /// The objects, from the files or the cluster (plus files); notes go to stderr.
    pub fn inventory(&self) -> Result<netwarden_manifest::Inventory> {
        let input = if self.kube {
            AnalysisInput::Cluster {
                kubeconfig: self.cluster.kubeconfig.clone(),
                overlay: self.paths.clone(),
                request_timeout: self.cluster.request_timeout,
            }
        } else {
            AnalysisInput::Files(self.paths.clone())
        };
        let analysed = load_analysis(&input, &self.options.load_options())?;
        for note in &analysed.notes {
            eprintln!("netwarden: note: {note}");
        }
        Ok(analysed.inventory)
    }

    /// The engine fed with every valid object; problems are printed (and fatal with
    /// --strict), as `Input::load` does for files.
    pub fn load(&self) -> Result<netwarden_engine::Engine> {
        let inventory = self.inventory()?;
        self.options.check(&inventory)?;
        Ok(engine_from_owned(
            inventory,
            self.options.engine_options(false),
        ))
    }
}

#[derive(Clone, Copy, ValueEnum, Default, PartialEq, Eq)]
pub enum DnsArg {
    #[default]
    Danm,
    All,
    None,
}

impl DnsArg {
    pub fn mode(self) -> DnsMode {
        match self {
            DnsArg::Danm => DnsMode::Danm,
            DnsArg::All => DnsMode::All,
            DnsArg::None => DnsMode::None,
        }
    }
}

impl InputOptions {
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            network_policy_enabled: !self.no_network_policy,
        }
    }

    pub fn engine_options(&self, log_all_denies: bool) -> EngineOptions {
        EngineOptions {
            dns: self.dns.mode(),
            log_all_denies,
            learn: Vec::new(),
        }
    }

    /// Prints the problems; with --strict, any problem is fatal.
    pub fn check(&self, inventory: &netwarden_manifest::Inventory) -> Result<()> {
        report_problems(inventory, self.strict);
        if self.strict && !inventory.problems.is_empty() {
            bail!(
                "{} problem(s) in the input (--strict)",
                inventory.problems.len()
            );
        }
        Ok(())
    }
}

impl Input {
    pub fn load_options(&self) -> LoadOptions {
        self.options.load_options()
    }

    pub fn engine_options(&self, log_all_denies: bool) -> EngineOptions {
        self.options.engine_options(log_all_denies)
    }
}

#[derive(Clone, Copy, ValueEnum, Default)]
pub enum Output {
    #[default]
    Table,
    Json,
}

/// The outputs of the commands that also draw a page (`reach`, `report`).
#[derive(Clone, Copy, ValueEnum, Default, PartialEq, Eq)]
pub enum PageOutput {
    #[default]
    Table,
    Json,
    Html,
}

/// Parses a duration the same way for every option: jiff's friendly format (`1h30m`, `1.5h`,
/// `90s`, `250ms`, `2d`, `1w`, `1h 30m`; days are 24 hours, weeks 7 days; months and years are
/// refused as ambiguous), then checks it lies within `min..=max`, so that neither a huge value
/// (an overflow, a wait of centuries) nor zero (a loop spinning a core) gets through.
fn parse_duration_within(s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let span: jiff::Span = s.trim().parse().map_err(|e| {
        format!("invalid duration {s:?}: {e} (examples: 500ms, 30s, 1h30m, 1.5h, 2d)")
    })?;
    let relative = jiff::SpanRelativeTo::days_are_24_hours();
    let signed = span
        .to_duration(relative)
        .map_err(|e| format!("invalid duration {s:?}: {e}"))?;
    let d = Duration::try_from(signed)
        .map_err(|_| format!("invalid duration {s:?}: must not be negative"))?;
    if d < min || d > max {
        return Err(format!(
            "duration {s:?} out of range: between {} and {}",
            show_duration(min),
            show_duration(max)
        ));
    }
    Ok(d)
}

/// `run --crd-grace`: 0 (a kind not served is dropped at the first answer saying so) up to a
/// day.
fn parse_crd_grace(s: &str) -> Result<Duration, String> {
    parse_duration_within(s, Duration::ZERO, Duration::from_secs(86_400))
}

/// `run --discovery-interval`: 100 ms (a discovery request every tick of a busy agent is
/// wasted on the API server) up to an hour.
fn parse_discovery_interval(s: &str) -> Result<Duration, String> {
    parse_duration_within(s, Duration::from_millis(100), Duration::from_secs(3600))
}

/// A duration the way people write it (`250ms`, `1s`, `1h`).
fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        _ if ms.is_multiple_of(3_600_000) && ms > 0 => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) && ms > 0 => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1_000) && ms > 0 => format!("{}s", ms / 1_000),
        _ => format!("{ms}ms"),
    }
}

/// `--interval`: 10 ms to 1 hour.
fn parse_interval(s: &str) -> Result<Duration, String> {
    parse_duration_within(s, Duration::from_millis(10), Duration::from_secs(3600))
}

/// `--clean-for` and other evidence windows: 1 second to 10 years.
fn parse_window(s: &str) -> Result<Duration, String> {
    parse_duration_within(
        s,
        Duration::from_secs(1),
        Duration::from_secs(3650 * 86_400),
    )
}

#[cfg(test)]
mod duration_tests {
    use super::*;

    #[test]
    fn durations_are_parsed_one_way_and_bounded() {
        let s = Duration::from_secs;
        for (text, want) in [
            ("1h30m", s(5400)),
            ("1.5h", s(5400)),
            ("1h 30m", s(5400)),
            ("90s", s(90)),
            ("250ms", Duration::from_millis(250)),
            ("2d", s(2 * 86_400)),
            ("1w", s(7 * 86_400)),
            ("1s", s(1)),
        ] {
            assert_eq!(
                parse_window(text).or_else(|_| parse_interval(text)),
                Ok(want),
                "{text}"
            );
        }
        assert_eq!(parse_interval("250ms"), Ok(Duration::from_millis(250)));
        // Zero would spin a core; a huge value would overflow or never come.
        assert!(parse_interval("0s").unwrap_err().contains("out of range"));
        assert!(parse_interval("0").is_err());
        assert!(parse_interval("5ms").is_err());
        assert!(parse_interval("2h")
            .unwrap_err()
            .contains("between 10ms and 1h"));
        assert!(parse_interval("99999999999999999999h").is_err());
        assert!(parse_interval("1e300s").is_err());
        assert!(parse_window("100000d").is_err());
        // Ambiguous or malformed.
        assert!(parse_window("1mo").is_err());
        assert!(parse_window("1y").is_err());
        assert!(parse_window("-5s").is_err());
        assert!(parse_window("").is_err());
        assert!(parse_window("abc").is_err());
        // Discovery: no request storm, no wait of days for a CRD installed.
        assert_eq!(
            parse_discovery_interval("250ms"),
            Ok(Duration::from_millis(250))
        );
        assert!(parse_discovery_interval("50ms")
            .unwrap_err()
            .contains("between 100ms and 1h"));
        assert!(parse_discovery_interval("2h").is_err());
        assert_eq!(parse_crd_grace("0s"), Ok(Duration::ZERO));
    }
}
