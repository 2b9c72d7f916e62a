//! The `netwarden` command line: analysis (`reach`, `explain`, `diff`, `validate`), `crd`, and the commands
//! that touch the kernel (`render`, `apply`, `run`, `lab`, `demo`), each a thin edge over the
//! library crates.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, bail, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use netwarden::cli_args::{
    parse_crd_grace, parse_interval, parse_window, PodSelectorArg, PortProto,
};
use netwarden::inventory::{
    engine_from_owned, load_analysis, load_engine, load_layered, report_problems, AnalysisInput,
    DiffBase,
};
use netwarden::reach::{Family, ReachQuery};
use netwarden::{diff, explain, output};
use netwarden_agent::source::SourceConfig;
use netwarden_dataplane::Backend;
use netwarden_engine::{DnsMode, EngineOptions, PodKey};
use netwarden_manifest::LoadOptions;
use netwarden_render::RenderOptions;

#[derive(Parser)]
#[command(
    name = "netwarden",
    version,
    about = "Kubernetes network policy on every pod interface, with a monitor phase"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines are written to stderr: `text` for people, `json` (one object per line)
    /// for log collectors (the DaemonSet's choice).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
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

#[derive(Args)]
struct ReportArgs {
    /// Event files (JSON lines, as `run --events-file` writes them); `-` for stdin.
    #[arg(short = 'e', long = "events", required = true, num_args = 1..)]
    events: Vec<PathBuf>,
    /// The evidence window: a monitored policy is ready to promote when it was monitored for
    /// this long, saw traffic, logged no would-deny and lost no event within it (e.g. 30m, 1h,
    /// 1.5h, 2d).
    #[arg(long, default_value = "1h", value_parser = parse_window)]
    clean_for: std::time::Duration,
    /// Manifests: list the monitored policies that appear in no event or status, too.
    #[arg(short = 'f', long = "filename", num_args = 1..)]
    paths: Vec<PathBuf>,
    /// `table`, `json`, or `html`: one self-contained page (no external fetches) with the
    /// would-deny counts over time per policy, the statuses and the flows.
    #[arg(short = 'o', long, value_enum, default_value_t = PageOutput::Table)]
    output: PageOutput,
}

#[derive(Args)]
struct PromoteArgs {
    /// The policy to switch to enforce, `NS/NAME`.
    policy: String,
    /// Its kind, when several kinds have a policy of that name.
    #[arg(long, value_parser = parse_policy_kind)]
    kind: Option<netwarden_engine::PolicyKind>,
    /// The manifest files holding the policy (exactly one of them must).
    #[arg(short = 'f', long = "filename", num_args = 1.., required_unless_present = "kube", conflicts_with = "kube")]
    paths: Vec<PathBuf>,
    /// Patch the policy in the cluster (a JSON merge patch of its annotations), with the
    /// user's kubeconfig as kubectl finds it (the agent's own permissions are read-only).
    #[arg(long)]
    kube: bool,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Print what would change; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Refuse unless `report` (on these events) says the policy is ready to promote.
    #[arg(long, requires = "events")]
    require_ready: bool,
    /// Event files for --require-ready (JSON lines with status records); `-` for stdin.
    #[arg(short = 'e', long = "events", num_args = 1..)]
    events: Vec<PathBuf>,
    /// The evidence window for --require-ready, as `report --clean-for`.
    #[arg(long, default_value = "1h", value_parser = parse_window)]
    clean_for: std::time::Duration,
}

fn parse_policy_kind(s: &str) -> Result<netwarden_engine::PolicyKind, String> {
    use netwarden_engine::PolicyKind::*;
    [NetworkPolicy, MultiNetworkPolicy, DanmNetworkPolicy]
        .into_iter()
        .find(|k| k.as_str() == s)
        .ok_or_else(|| {
            format!("unknown kind {s:?}: NetworkPolicy, MultiNetworkPolicy or DanmNetworkPolicy")
        })
}

#[derive(Args)]
struct SuggestArgs {
    /// Event files (JSON lines, as `run --events-file` writes them); `-` for stdin. Lines that
    /// are not events are counted and skipped.
    #[arg(short = 'e', long = "events", required = true, num_args = 1..)]
    events: Vec<PathBuf>,
    /// The cluster state the events were seen in: pods give the workloads, their labels and
    /// port names.
    #[command(flatten)]
    input: AnalysisArgs,
    /// The kind to write. NetworkPolicy covers the primary network only; MultiNetworkPolicy
    /// writes one policy per workload and NetworkAttachmentDefinition (`policy-for`);
    /// DanmNetworkPolicy covers every network (`networkSelector` in peers). Flows the kind
    /// cannot express are listed at the top of the output.
    #[arg(long, value_enum, default_value_t = KindArg::Standard)]
    kind: KindArg,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum KindArg {
    #[value(name = "NetworkPolicy")]
    Standard,
    #[value(name = "MultiNetworkPolicy")]
    Multi,
    #[value(name = "DanmNetworkPolicy")]
    Danm,
}

impl KindArg {
    fn kind(self) -> netwarden_engine::PolicyKind {
        match self {
            KindArg::Standard => netwarden_engine::PolicyKind::NetworkPolicy,
            KindArg::Multi => netwarden_engine::PolicyKind::MultiNetworkPolicy,
            KindArg::Danm => netwarden_engine::PolicyKind::DanmNetworkPolicy,
        }
    }
}

#[derive(Clone, Copy, ValueEnum, Default, PartialEq, Eq)]
enum BackendArg {
    #[default]
    Nft,
    Iptables,
}

impl BackendArg {
    fn backend(self) -> Backend {
        match self {
            BackendArg::Nft => Backend::Nft,
            BackendArg::Iptables => Backend::Iptables,
        }
    }
}

#[derive(Args, Clone)]
struct DataplaneArgs {
    /// Rule backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Nft)]
    backend: BackendArg,
    /// NFLOG group for would-deny/deny log messages.
    #[arg(long, default_value_t = 100)]
    nflog_group: u16,
    /// Mark bit set when the staged (monitor) view allows a packet.
    #[arg(long, default_value = "0x40000", value_parser = parse_mark)]
    staged_mark: u32,
    /// Mark bit set when the enforced view allows a packet (monitor bookkeeping).
    #[arg(long, default_value = "0x20000", value_parser = parse_mark)]
    allow_mark: u32,
    /// Log messages per minute per pod and direction.
    #[arg(long, default_value_t = 10)]
    log_rate: u32,
    /// Do not reject packets forwarded through an isolated pod (pods that route).
    #[arg(long)]
    allow_forward: bool,
    /// Log every enforced deny (as if every policy had `netwarden.io/log: "true"`).
    #[arg(long)]
    log_denies: bool,
    /// Learn mode for these pods (`NS/POD` or `NS/*`, repeatable), as if annotated
    /// `netwarden.io/learn: "true"`: each distinct new flow (direction, interface, peer
    /// address, port, protocol) is logged once per --learn-window as an `observed` event,
    /// deduplicated in the kernel; verdicts are unchanged. Needs the nft backend.
    #[arg(long = "learn", value_name = "NS/POD|NS/*")]
    learn: Vec<netwarden_engine::LearnSelector>,
    /// How long learn mode remembers a flow: it is logged again after this long (1s to 10y,
    /// e.g. 30s, 1h, 1d).
    #[arg(long, default_value = "1h", value_parser = parse_learn_window)]
    learn_window: std::time::Duration,
    /// Flows each learn set remembers (one set per family and direction); flows that find
    /// their set full are not logged and are counted in the table's counter `lrn_full`.
    #[arg(long, default_value_t = 65_536)]
    learn_set_size: u32,
}

/// `--learn-window`: whole seconds (the kernel's set timeouts are kept in seconds here), at
/// least 1s.
fn parse_learn_window(s: &str) -> Result<std::time::Duration, String> {
    let d = netwarden::cli_args::parse_window(s)?;
    if d.subsec_nanos() != 0 {
        return Err(format!("--learn-window {s:?}: whole seconds only"));
    }
    Ok(d)
}

fn parse_mark(s: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("invalid mark {s:?}: {e}"))?;
    if v == 0 || !v.is_power_of_two() {
        return Err(format!("mark {s:?} must be a single bit"));
    }
    Ok(v)
}

impl DataplaneArgs {
    fn render_options(&self) -> Result<RenderOptions> {
        let options = RenderOptions {
            nflog_group: self.nflog_group,
            staged_mark: self.staged_mark,
            allow_mark: self.allow_mark,
            log_rate_per_minute: self.log_rate,
            log_burst: self.log_rate.max(1),
            reject_forward: !self.allow_forward,
            learn_window_secs: self.learn_window.as_secs(),
            learn_set_size: self.learn_set_size,
        };
        options.validate().map_err(anyhow::Error::msg)?;
        Ok(options)
    }

    /// The engine's options: the input's, with --log-denies and --learn.
    fn engine_options(&self, input: &Input) -> EngineOptions {
        EngineOptions {
            learn: self.learn.clone(),
            ..input.engine_options(self.log_denies)
        }
    }
}

#[derive(Args)]
struct RenderArgs {
    #[command(flatten)]
    input: Input,
    /// The pod, `ns/name`.
    #[arg(long)]
    pod: String,
    #[command(flatten)]
    dataplane: DataplaneArgs,
}

#[derive(Args)]
struct RunArgs {
    /// Manifest files or directories (YAML, multi-document, `kind: List`, or JSON).
    #[arg(short = 'f', long = "filename", num_args = 1.., required_unless_present = "kube", conflicts_with = "kube")]
    paths: Vec<PathBuf>,
    /// Accepted as by the other commands; `run` and `apply` report every problem and go on.
    #[arg(long)]
    strict: bool,
    /// Ignore `networking.k8s.io/v1` NetworkPolicy objects (not even watched with --kube).
    #[arg(long)]
    no_network_policy: bool,
    /// Where outgoing DNS (TCP/UDP 53) is allowed without a rule (see `reach --help`).
    #[arg(long, value_enum, default_value_t = DnsArg::Danm)]
    dns: DnsArg,
    /// Watch a Kubernetes cluster instead of reading files (`run` only): every pod is a peer,
    /// only the pods of --node-name are programmed.
    #[arg(long)]
    kube: bool,
    /// The kubeconfig to use with --kube (default: KUBECONFIG, ~/.kube/config, then the
    /// in-cluster service account, as kubectl).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// This node's name with --kube (default: $NODE_NAME): pods with this spec.nodeName are
    /// programmed.
    #[arg(long)]
    node_name: Option<String>,
    /// The CRI runtime's socket with --kube, asked where each local pod's network namespace is
    /// (default: containerd's, then CRI-O's socket, whichever exists; with none, only the
    /// netwarden.io/netns annotation and DanmEps say where a netns is).
    #[arg(long, value_name = "unix:///PATH")]
    cri_endpoint: Option<String>,
    #[command(flatten)]
    dataplane: DataplaneArgs,
    /// How often to look for changed manifests and interfaces (run only): 10ms to 1h, e.g.
    /// 500ms, 2s, 1m30s.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    interval: std::time::Duration,
    /// Node name in events (default: the host name).
    #[arg(long)]
    node: Option<String>,
    /// Do not write events to stdout.
    #[arg(long)]
    no_events_stdout: bool,
    /// Also append events (JSON lines) to this file.
    #[arg(long)]
    events_file: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// How often a `status` record per monitored policy (monitored since, pods, would-deny,
    /// events lost, and from the kernel's counters: connections judged and would-denies the
    /// rate limit suppressed; the evidence `report` and `promote --require-ready` judge) is
    /// written to the events, besides one at shutdown.
    #[arg(long, default_value = "60s", value_parser = parse_interval)]
    status_interval: std::time::Duration,
    /// With --kube: how long a watched CRD must stay unserved (discovery asked again and
    /// again) before its objects are dropped. A restarting API server answers 404 for CRDs
    /// for a while; meanwhile the last objects stay enforced and /readyz says why.
    #[arg(long, default_value = "60s", value_parser = parse_crd_grace)]
    crd_grace: std::time::Duration,
    /// After SIGTERM or SIGINT, the longest the agent runs on: a sync under way stops between
    /// two pod netns, and past this the process exits whatever it is doing (the rules in place
    /// stay). Keep it below the pod's termination grace period (30 s in deploy/).
    #[arg(long, default_value = "10s", value_parser = parse_interval)]
    shutdown_timeout: std::time::Duration,
    /// How often every programmed pod netns's rules are compared with what netwarden applied
    /// and repaired if someone changed them, beside the comparison the kernel's change
    /// notifications trigger at once (tamper repair).
    #[arg(long, default_value = "10s", value_parser = parse_interval)]
    verify_interval: std::time::Duration,
    /// Accept a pod netns that is netwarden's own network namespace (refused by default:
    /// programming it would firewall the node itself). For test beds only.
    #[arg(long)]
    allow_host_netns: bool,
}

#[derive(Subcommand)]
enum LabCommand {
    /// Up, enforce, probe every pair on every network, down; print the result.
    Check(LabCheckArgs),
    /// Build the topology and enforce; keeps serving the listeners until interrupted or
    /// `lab down`.
    Up(LabUpArgs),
    /// Probe a lab that `lab up` serves, beside the prediction for the same manifests.
    Probe(LabProbeArgs),
    /// Remove a lab that `lab up` built (stops it, deletes every netns of it).
    Down(LabDownArgs),
}

const DEFAULT_LAB_STATE: &str = "/run/netwarden/lab.json";

#[derive(Args)]
struct LabUpArgs {
    #[command(flatten)]
    input: Input,
    #[command(flatten)]
    dataplane: DataplaneArgs,
    /// Ports to serve (default: every container port the pods declare).
    #[arg(long = "port", num_args = 1..)]
    ports: Vec<PortProto>,
    /// Where to record the lab for `lab probe` / `lab down`.
    #[arg(long, default_value = DEFAULT_LAB_STATE)]
    state: PathBuf,
}

#[derive(Args)]
struct LabProbeArgs {
    #[command(flatten)]
    input: Input,
    /// Ports to probe (default: every container port the pods declare).
    #[arg(long = "port", num_args = 1..)]
    ports: Vec<PortProto>,
    #[arg(long, default_value = DEFAULT_LAB_STATE)]
    state: PathBuf,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct LabDownArgs {
    #[arg(long, default_value = DEFAULT_LAB_STATE)]
    state: PathBuf,
}

#[derive(Args)]
struct LabCheckArgs {
    #[command(flatten)]
    input: Input,
    #[command(flatten)]
    dataplane: DataplaneArgs,
    /// Ports to probe (default: every container port the pods declare).
    #[arg(long = "port", num_args = 1..)]
    ports: Vec<PortProto>,
    /// Print JSON (`{"probes": [...], "events": [...]}`).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct DemoArgs {
    /// Manifests to build the demo from.
    #[arg(short = 'f', long = "filename", default_value = "examples/multinet")]
    paths: Vec<PathBuf>,
    #[arg(long, value_enum, default_value_t = BackendArg::Nft)]
    backend: BackendArg,
    /// The workloads' traffic for the loop observe → suggest → monitor → report → promote:
    /// lines `FROM -> TO PORT/PROTO [on NETWORK]` (pods and networks as namespace/name).
    /// Default: `<first -f path>.traffic` when it exists (examples/multinet.traffic).
    #[arg(long, value_name = "FILE")]
    traffic: Option<PathBuf>,
    /// The node agent's path instead: the manifests served by a local fake API server, the
    /// pods scheduled on this node in the lab's netns, `run --kube` programming them; probes,
    /// then a policy created through the API, and probes again.
    #[arg(long, conflicts_with = "traffic")]
    kube: bool,
}

#[derive(Args, Clone)]
struct Input {
    /// Manifest files or directories (YAML, multi-document, `kind: List`, or JSON).
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    paths: Vec<PathBuf>,
    #[command(flatten)]
    options: InputOptions,
}

/// The input of `reach`, `explain` and `validate`: manifests, the live cluster, or both.
#[derive(Args, Clone)]
struct AnalysisArgs {
    /// Manifest files or directories (YAML, multi-document, `kind: List`, or JSON). With
    /// --kube they are laid over the cluster ("the cluster plus these changes"): each object in
    /// them replaces the cluster's object of the same kind, namespace and name, and one the
    /// cluster does not have is added. Two objects of the same name in the files are still
    /// duplicates (an error).
    #[arg(short = 'f', long = "filename", required_unless_present = "kube", num_args = 1..)]
    paths: Vec<PathBuf>,
    /// Read the live cluster's objects: one LIST of every kind `run --kube` watches, no watch.
    /// A CRD that is not installed is skipped with a note on stderr; problems of cluster
    /// objects name the source `cluster`.
    #[arg(long)]
    kube: bool,
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    options: InputOptions,
}

/// How a user command reaches the cluster with --kube (every command that has --kube).
#[derive(Args, Clone)]
struct ClusterArgs {
    /// The kubeconfig to use with --kube (default: KUBECONFIG, ~/.kube/config, then the
    /// in-cluster service account, as kubectl). Its `exec:` credential plugin, if any, runs.
    #[arg(long, requires = "kube")]
    kubeconfig: Option<PathBuf>,
    /// With --kube: how long to wait for each answer of the API server (at most 10s to
    /// connect) before failing, as kubectl's --request-timeout.
    #[arg(long, default_value = "30s", value_parser = parse_interval, requires = "kube")]
    request_timeout: std::time::Duration,
}

/// The switches every reader of objects takes.
#[derive(Args, Clone)]
struct InputOptions {
    /// Make any problem in the input fatal.
    #[arg(long)]
    strict: bool,
    /// Ignore `networking.k8s.io/v1` NetworkPolicy objects (with --kube: not even listed).
    #[arg(long)]
    no_network_policy: bool,
    /// Where outgoing DNS (TCP/UDP 53) is allowed without a rule: where a DanmNetworkPolicy
    /// isolates egress (seed 004's rule; NetworkPolicy and MultiNetworkPolicy keep the exact
    /// Kubernetes semantics), on every egress-isolated interface, or nowhere.
    #[arg(long, value_enum, default_value_t = DnsArg::Danm)]
    dns: DnsArg,
}

impl AnalysisArgs {
    /// The objects, from the files or the cluster (plus files); notes go to stderr.
    fn inventory(&self) -> Result<netwarden_manifest::Inventory> {
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
    fn load(&self) -> Result<netwarden_engine::Engine> {
        let inventory = self.inventory()?;
        self.options.check(&inventory)?;
        Ok(engine_from_owned(
            inventory,
            self.options.engine_options(false),
        ))
    }
}

#[derive(Clone, Copy, ValueEnum, Default, PartialEq, Eq)]
enum DnsArg {
    #[default]
    Danm,
    All,
    None,
}

impl DnsArg {
    fn mode(self) -> DnsMode {
        match self {
            DnsArg::Danm => DnsMode::Danm,
            DnsArg::All => DnsMode::All,
            DnsArg::None => DnsMode::None,
        }
    }
}

impl InputOptions {
    fn load_options(&self) -> LoadOptions {
        LoadOptions {
            network_policy_enabled: !self.no_network_policy,
        }
    }

    fn engine_options(&self, log_all_denies: bool) -> EngineOptions {
        EngineOptions {
            dns: self.dns.mode(),
            log_all_denies,
            learn: Vec::new(),
        }
    }

    /// Prints the problems; with --strict, any problem is fatal.
    fn check(&self, inventory: &netwarden_manifest::Inventory) -> Result<()> {
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
    fn load_options(&self) -> LoadOptions {
        self.options.load_options()
    }

    fn engine_options(&self, log_all_denies: bool) -> EngineOptions {
        self.options.engine_options(log_all_denies)
    }
}

#[derive(Clone, Copy, ValueEnum, Default)]
enum Output {
    #[default]
    Table,
    Json,
}

/// The outputs of the commands that also draw a page (`reach`, `report`).
#[derive(Clone, Copy, ValueEnum, Default, PartialEq, Eq)]
enum PageOutput {
    #[default]
    Table,
    Json,
    Html,
}

#[derive(Args)]
struct ReachArgs {
    #[command(flatten)]
    input: AnalysisArgs,
    /// Ports to probe, as PORT/PROTO (TCP, UDP, SCTP); repeatable.
    #[arg(long = "port", required = true, num_args = 1..)]
    ports: Vec<PortProto>,
    /// Only this network (`default` or `ns/name`), or `all`.
    #[arg(long, default_value = "all")]
    network: String,
    /// Sources: `ns/pod`, `ns/*` or `*`.
    #[arg(long, default_value = "*")]
    from: PodSelectorArg,
    /// Destinations: `ns/pod`, `ns/*` or `*`.
    #[arg(long, default_value = "*")]
    to: PodSelectorArg,
    /// `json` (SPEC 6), `table` (one matrix per network, port and family), or `html`: one
    /// self-contained page (no external fetches) with the matrices coloured allowed / denied /
    /// would-deny / would-allow, grouped by namespace, filters by network and namespace, and
    /// each cell's explanation on hover or click.
    #[arg(short = 'o', long, value_enum, default_value_t = PageOutput::Json)]
    output: PageOutput,
}

#[derive(Args)]
struct ExplainArgs {
    #[command(flatten)]
    input: AnalysisArgs,
    /// Source pod, `ns/name`.
    #[arg(long)]
    from: String,
    /// Destination pod, `ns/name`.
    #[arg(long)]
    to: String,
    /// PORT/PROTO.
    #[arg(long)]
    port: PortProto,
    /// Only this network (`default` or `ns/name`).
    #[arg(long)]
    network: Option<String>,
    /// Only this family.
    #[arg(long, value_enum)]
    family: Option<FamilyArg>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// `netwarden diff -f BASE... --with CHANGED...` or `diff --kube --with CHANGED...`.
#[derive(Args)]
#[command(after_help = "\
Each object in the --with files replaces the base's object of the same kind, namespace and \
name (one the base does not have is added); an object annotated \
`netwarden.io/delete: \"true\"` (alone or in a List) deletes the base's object instead, and is \
an error when the base has none. A change is a probe of `reach` (same pairs, networks, ports \
and families) that exists in both views and whose `allowed` or `staged_allowed` differs; its \
`kind` is newly-denied, newly-allowed or staged-view, and `policies` names the policies whose \
contribution (isolating the side, matching the flow) changed on a side whose verdict changed. \
Exit status: 0, or 1 with --fail-on-deny when a flow goes from allowed to denied; 2 on errors \
(a deletion that names nothing included).")]
struct DiffArgs {
    /// The base: manifest files or directories (YAML, multi-document, `kind: List`, or JSON).
    #[arg(short = 'f', long = "filename", required_unless_present = "kube", conflicts_with = "kube", num_args = 1..)]
    paths: Vec<PathBuf>,
    /// The base is the live cluster's objects: one LIST of every kind `run --kube` watches.
    #[arg(long)]
    kube: bool,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The changes: files or directories laid over the base.
    #[arg(long = "with", required = true, num_args = 1..)]
    with: Vec<PathBuf>,
    /// Ports to probe, as PORT/PROTO; repeatable. Default: every port a rule of either view
    /// names by number and every container port a pod declares.
    #[arg(long = "port", num_args = 1..)]
    ports: Vec<PortProto>,
    /// Only this network (`default` or `ns/name`), or `all`.
    #[arg(long, default_value = "all")]
    network: String,
    /// `json` (SPEC 6), `table`, or `html`: one self-contained page of the changed cells.
    #[arg(short = 'o', long, value_enum, default_value_t = PageOutput::Json)]
    output: PageOutput,
    /// Exit with status 1 when any flow goes from allowed to denied (a pull-request gate).
    #[arg(long)]
    fail_on_deny: bool,
    #[command(flatten)]
    options: InputOptions,
}

#[derive(Clone, Copy, ValueEnum)]
enum FamilyArg {
    Ipv4,
    Ipv6,
}

#[derive(Args)]
struct ValidateArgs {
    #[command(flatten)]
    input: AnalysisArgs,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

fn pod_key(s: &str) -> Result<PodKey> {
    match s.parse::<PodSelectorArg>() {
        Ok(PodSelectorArg::Pod(key)) => Ok(key),
        _ => bail!("expected a pod as ns/name, got {s:?}"),
    }
}

/// Prints a lab run (JSON or the matrices); fails when a real connection disagreed with the
/// prediction.
fn print_lab_report(report: &netwarden::lab::LabReport, json: bool) -> Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{}", netwarden::lab::render_text(report));
    }
    Ok(if report.mismatches == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn lab_options(
    input: &Input,
    dataplane: &DataplaneArgs,
    ports: Vec<PortProto>,
) -> Result<netwarden::lab::LabCheckOptions> {
    Ok(netwarden::lab::LabCheckOptions {
        backend: dataplane.backend.backend(),
        ports,
        engine: dataplane.engine_options(input),
        render: dataplane.render_options()?,
    })
}

impl RunArgs {
    /// The input options as the analyses take them.
    fn input(&self) -> Input {
        Input {
            paths: self.paths.clone(),
            options: InputOptions {
                strict: self.strict,
                no_network_policy: self.no_network_policy,
                dns: self.dns,
            },
        }
    }

    fn source(&self, once: bool) -> Result<SourceConfig> {
        if !self.kube {
            // (clap's `requires` cannot say this: a flag is always "present" as false.)
            if self.kubeconfig.is_some() || self.node_name.is_some() || self.cri_endpoint.is_some()
            {
                bail!("--kubeconfig, --node-name and --cri-endpoint go with --kube");
            }
            return Ok(SourceConfig::Files(self.paths.clone()));
        }
        if once {
            bail!("--kube is for `run` (the node agent), not `apply`");
        }
        let node_name = match &self.node_name {
            Some(name) => name.clone(),
            None => std::env::var("NODE_NAME").map_err(|_| {
                anyhow!("--kube needs this node's name: --node-name NAME or NODE_NAME")
            })?,
        };
        if node_name.is_empty() {
            bail!("--node-name (or NODE_NAME) is empty");
        }
        if let Some(endpoint) = &self.cri_endpoint {
            if netwarden_agent::node_paths::unix_socket_path(endpoint).is_none() {
                bail!("--cri-endpoint {endpoint:?}: expected unix:///absolute/path");
            }
        }
        let cri_endpoint = self.cri_endpoint.clone().or_else(|| {
            netwarden_agent::node_paths::default_cri_endpoint(|p| p.exists()).map(str::to_string)
        });
        Ok(SourceConfig::Kube {
            kubeconfig: self.kubeconfig.clone(),
            node_name,
            cri_endpoint,
            discovery_interval: KUBE_DISCOVERY_INTERVAL,
            crd_grace: self.crd_grace,
        })
    }
}

/// How often `run --kube` asks whether a CRD it does not see yet was installed.
const KUBE_DISCOVERY_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

fn agent_config(args: &RunArgs, once: bool) -> Result<netwarden_agent::agent::AgentConfig> {
    let input = args.input();
    let source = args.source(once)?;
    let node = match (&args.node, &source) {
        (Some(node), _) => node.clone(),
        (None, SourceConfig::Kube { node_name, .. }) => node_name.clone(),
        (None, SourceConfig::Files(_)) => std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into()),
    };
    Ok(netwarden_agent::agent::AgentConfig {
        source,
        load: input.load_options(),
        engine: args.dataplane.engine_options(&input),
        render: args.dataplane.render_options()?,
        backend: args.dataplane.backend.backend(),
        interval: args.interval,
        node,
        events_stdout: !args.no_events_stdout,
        events_file: args.events_file.clone(),
        metrics_addr: args.metrics_addr,
        status_interval: args.status_interval,
        shutdown_timeout: args.shutdown_timeout,
        verify_interval: args.verify_interval,
    })
}

/// Fixes, before any netns is opened, whether pod netns paths may name netwarden's own.
fn fix_netns_access(args: &RunArgs) -> Result<()> {
    let access = netwarden_dataplane::NetnsAccess {
        allow_own: args.allow_host_netns,
    };
    netwarden_dataplane::netns::set_process_access(access)?;
    Ok(())
}

/// `apply` (one pass) and `run` (the agent).
fn agent_command(args: RunArgs, once: bool) -> Result<ExitCode> {
    fix_netns_access(&args)?;
    netwarden_agent::agent::run(agent_config(&args, once)?, once)
}

fn reach_command(args: ReachArgs) -> Result<ExitCode> {
    output::reach_command(
        args.input.load()?,
        &ReachQuery {
            ports: args.ports,
            network: Some(args.network),
            from: args.from,
            to: args.to,
        },
        match args.output {
            PageOutput::Json => output::ReachFormat::Json,
            PageOutput::Table => output::ReachFormat::Table,
            PageOutput::Html => output::ReachFormat::Html,
        },
        std::io::stdout().lock(),
    )
}

fn diff_command(args: DiffArgs) -> Result<ExitCode> {
    let base = if args.kube {
        DiffBase::Cluster {
            kubeconfig: args.cluster.kubeconfig.clone(),
            request_timeout: args.cluster.request_timeout,
        }
    } else {
        DiffBase::Files(args.paths.clone())
    };
    let (layered, notes) = load_layered(&base, &args.with, &args.options.load_options())?;
    for note in &notes {
        eprintln!("netwarden: note: {note}");
    }
    // Each problem once: the base's, then those only the changed view has.
    let mut problems = layered.base.problems.clone();
    problems.extend(
        layered
            .changed
            .problems
            .iter()
            .filter(|p| !layered.base.problems.contains(p))
            .cloned(),
    );
    args.options.check(&netwarden_manifest::Inventory {
        problems,
        ..Default::default()
    })?;
    if !layered.unmatched_deletions.is_empty() {
        bail!(
            "{} deletion(s) in --with name nothing in the base",
            layered.unmatched_deletions.len()
        );
    }
    let ports = if args.ports.is_empty() {
        diff::default_ports(&layered.base, &layered.changed)
    } else {
        args.ports
    };
    output::diff_command(
        &layered.base,
        &layered.changed,
        &args.options.engine_options(false),
        &ReachQuery {
            ports,
            network: Some(args.network),
            ..ReachQuery::default()
        },
        match args.output {
            PageOutput::Json => output::DiffFormat::Json,
            PageOutput::Table => output::DiffFormat::Table,
            PageOutput::Html => output::DiffFormat::Html,
        },
        args.fail_on_deny,
        std::io::stdout().lock(),
    )
}

fn explain_command(args: ExplainArgs) -> Result<ExitCode> {
    let mut engine = args.input.load()?;
    let rules = engine.all_pod_rules();
    let family = args.family.map(|f| match f {
        FamilyArg::Ipv4 => Family::Ipv4,
        FamilyArg::Ipv6 => Family::Ipv6,
    });
    let explanations = explain::explain(
        &rules,
        &pod_key(&args.from)?,
        &pod_key(&args.to)?,
        args.port,
        args.network.as_deref(),
        family,
    )
    .map_err(anyhow::Error::msg)?;
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&explanations)?),
        Output::Table => print!("{}", explain::render_text(&explanations)),
    }
    Ok(ExitCode::SUCCESS)
}

/// `render`: the exact rules of one pod, as the chosen backend writes them.
fn render_command(args: RenderArgs) -> Result<ExitCode> {
    let (mut engine, inventory) = load_engine(
        &args.input.paths,
        &args.input.load_options(),
        args.dataplane.engine_options(&args.input),
    );
    args.input.options.check(&inventory)?;
    let key = pod_key(&args.pod)?;
    let rules = engine
        .pod_rules(&key)
        .ok_or_else(|| anyhow::anyhow!("pod {key} not found"))?;
    let options = args.dataplane.render_options()?;
    match args.dataplane.backend.backend() {
        Backend::Nft => {
            let text = netwarden_render::render_nft(&rules, &options)?;
            println!("# nft -f (applied as one libnftables transaction)\n{text}");
        }
        Backend::Iptables => {
            let r = netwarden_render::render_iptables(&rules, &options)?;
            for (title, text) in [
                ("ipset restore", r.ipset_script()),
                ("iptables-restore", r.v4),
                ("ip6tables-restore", r.v6),
            ] {
                if !text.is_empty() {
                    println!("# {title}\n{text}");
                }
            }
        }
    }
    if !rules.needs_rules() {
        eprintln!("{key} is not isolated: netwarden programs nothing in its netns");
    } else if !rules.is_isolated() {
        eprintln!("{key} is not isolated: only learn mode's logging rules are programmed");
    }
    Ok(ExitCode::SUCCESS)
}

fn lab_command(command: LabCommand) -> Result<ExitCode> {
    match command {
        LabCommand::Check(args) => lab_check(args),
        LabCommand::Up(args) => lab_up(args),
        LabCommand::Probe(args) => lab_probe(args),
        LabCommand::Down(args) => lab_down(args),
    }
}

fn lab_check(args: LabCheckArgs) -> Result<ExitCode> {
    netwarden_lab::install_signal_cleanup()?;
    let options = lab_options(&args.input, &args.dataplane, args.ports)?;
    let report = netwarden::lab::check(&args.input.paths, &args.input.load_options(), &options)?;
    print_lab_report(&report, args.json)
}

fn lab_up(args: LabUpArgs) -> Result<ExitCode> {
    netwarden_lab::install_signal_cleanup()?;
    let inventory = netwarden_manifest::load_paths(&args.input.paths, &args.input.load_options());
    report_problems(&inventory, false);
    let mut ports = args.ports.clone();
    if ports.is_empty() {
        ports = netwarden::lab::default_ports(&inventory);
    }
    let options = lab_options(&args.input, &args.dataplane, ports)?;
    let mut lab = netwarden::lab::EnforcedLab::up(&inventory, &options)?;
    // `lab up` prints no events: leave the pods' NFLOG group free for an agent under test.
    lab.collector.close_all();
    if let Some(dir) = args.state.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.state, serde_json::to_vec_pretty(&lab.session())?)?;
    eprintln!("{}", lab.sync);
    for (key, path) in &lab.netns {
        println!("{key}\t{}", path.display());
    }
    eprintln!(
        "lab up: serving; `netwarden lab probe -f ...` to probe, `netwarden lab down` (or Ctrl-C) to remove it"
    );
    // Serve until `lab down` removes the state file (or a signal ends the process, whose
    // handler removes the lab).
    while args.state.exists() {
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    lab.down()?;
    Ok(ExitCode::SUCCESS)
}

fn lab_probe(args: LabProbeArgs) -> Result<ExitCode> {
    let session: netwarden::lab::LabSession =
        serde_json::from_slice(&std::fs::read(&args.state).map_err(|e| {
            anyhow::anyhow!("reading {}: {e} (is a lab up?)", args.state.display())
        })?)?;
    let load = args.input.load_options();
    let mut ports = args.ports.clone();
    if ports.is_empty() {
        ports = netwarden::lab::default_ports(&netwarden_manifest::load_paths(
            &args.input.paths,
            &load,
        ));
    }
    let engine = args.input.engine_options(false);
    let report = netwarden::lab::probe_session(&session, &args.input.paths, &load, &ports, engine)?;
    print_lab_report(&report, args.json)
}

fn lab_down(args: LabDownArgs) -> Result<ExitCode> {
    let bytes = match std::fs::read(&args.state) {
        Ok(b) => b,
        Err(e) => bail!("reading {}: {e} (no lab up?)", args.state.display()),
    };
    let session: netwarden::lab::LabSession = serde_json::from_slice(&bytes)?;
    // The `lab up` process notices its state file is gone and removes the lab itself.
    std::fs::remove_file(&args.state)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{}", session.pid)).exists()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Whatever is left (the up process died without cleaning): remove it from the state.
    netwarden_lab::teardown_from_state(&session.state)?;
    println!("lab {} removed", session.state.instance);
    Ok(ExitCode::SUCCESS)
}

/// Reads event streams (events and status records); bad lines are reported and skipped.
fn read_streams(paths: &[PathBuf]) -> Result<netwarden_monitor::Stream> {
    let mut all = netwarden_monitor::Stream::default();
    for path in paths {
        let stream = if path.as_os_str() == "-" {
            netwarden_monitor::read_stream(std::io::stdin().lock())?
        } else {
            netwarden_monitor::read_stream_file(path)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?
        };
        for b in &stream.bad {
            eprintln!("{}: {b}", path.display());
        }
        all.events.extend(stream.events);
        all.statuses.extend(stream.statuses);
    }
    Ok(all)
}

/// The report over `events` files as of now, with the stream it was made from.
fn evidence_report(
    events: &[PathBuf],
    monitored: &[String],
    clean_for: std::time::Duration,
) -> Result<(netwarden_monitor::Report, netwarden_monitor::Stream)> {
    let stream = read_streams(events)?;
    let report = netwarden_monitor::aggregate_with(
        &stream.events,
        &stream.statuses,
        monitored,
        netwarden_monitor::Timestamp::now(),
        clean_for,
    );
    Ok((report, stream))
}

fn report_command(args: ReportArgs) -> Result<ExitCode> {
    let monitored: Vec<String> = if args.paths.is_empty() {
        Vec::new()
    } else {
        netwarden_manifest::load_paths(&args.paths, &LoadOptions::default())
            .policies
            .iter()
            .filter(|p| p.mode == netwarden_engine::Mode::Monitor)
            .map(|p| p.key.to_string())
            .collect()
    };
    let (report, stream) = evidence_report(&args.events, &monitored, args.clean_for)?;
    match args.output {
        PageOutput::Json => println!("{}", report.render_json()),
        PageOutput::Table => print!("{}", report.render_text()),
        PageOutput::Html => {
            let page =
                netwarden::html::report::report_page(&report, &stream.events, "netwarden report");
            print!("{}", netwarden::html::report::render(&page));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn promote_command(args: PromoteArgs) -> Result<ExitCode> {
    use netwarden::promote::{self, Target};
    let (ns, name) = args
        .policy
        .split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
        .ok_or_else(|| anyhow!("{:?}: give the policy as NS/NAME", args.policy))?;
    let target = Target {
        key: netwarden_engine::ObjectKey::new(ns, name),
        kind: args.kind,
    };
    if args.require_ready {
        let (report, _) = evidence_report(
            &args.events,
            std::slice::from_ref(&args.policy),
            args.clean_for,
        )?;
        let row = report
            .policies
            .iter()
            .find(|p| p.policy == args.policy)
            .ok_or_else(|| anyhow!("{target}: the events name no such policy"))?;
        if row.status != netwarden_monitor::PolicyStatus::ReadyToPromote {
            bail!("{target} is not ready to promote: {}", row.reason);
        }
        eprintln!("{target}: ready to promote ({})", row.reason);
    }
    let opts = LoadOptions::default();
    if args.kube {
        return promote_in_cluster(&args, &target, &opts);
    }
    let found = promote::files_holding(&args.paths, &target, &opts)?;
    let (path, text) = match found.as_slice() {
        [] => bail!(
            "{}",
            promote::PromoteError::NotFound {
                target: target.to_string(),
                place: args
                    .paths
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            }
        ),
        [one] => one,
        many => bail!(
            "{target} is in several files: {} (give only the one to edit)",
            many.iter()
                .map(|(p, _)| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let label = path.display().to_string();
    let edit = promote::plan_text(&label, text, &target, &opts)?;
    print!("{}", promote::describe(&label, text, &edit));
    if args.dry_run {
        println!("dry run: {} {} left in monitor mode", edit.kind, edit.key);
    } else {
        promote::write_atomically(path, &edit.text).map_err(|e| anyhow!("writing {label}: {e}"))?;
        println!("{} {} promoted to enforce in {label}", edit.kind, edit.key);
    }
    Ok(ExitCode::SUCCESS)
}

fn promote_in_cluster(
    args: &PromoteArgs,
    target: &netwarden::promote::Target,
    opts: &LoadOptions,
) -> Result<ExitCode> {
    use netwarden::promote;
    let kubeconfig = args.cluster.kubeconfig.as_deref();
    let timeout = args.cluster.request_timeout;
    let kinds: Vec<&'static netwarden_kube::WatchedKind> = netwarden_kube::WATCHED_KINDS
        .iter()
        .filter(|k| parse_policy_kind(k.kind).is_ok())
        .filter(|k| target.kind.is_none_or(|want| want.as_str() == k.kind))
        .collect();
    let mut found = Vec::new();
    for kind in kinds {
        match netwarden_kube::get_object(
            kubeconfig,
            timeout,
            kind,
            &target.key.namespace,
            &target.key.name,
        ) {
            Ok(Some(object)) => found.push((kind, object)),
            Ok(None) => {}
            // A kind the cluster does not serve holds no such policy.
            Err(netwarden_kube::KubeError::NotServed { .. }) if target.kind.is_none() => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (kind, object) = match found.as_slice() {
        [] => bail!(
            "{}",
            promote::PromoteError::NotFound {
                target: target.to_string(),
                place: "the cluster".into(),
            }
        ),
        [one] => one,
        many => bail!(
            "{target} is ambiguous: {} (name it with --kind)",
            many.iter()
                .map(|(k, _)| k.kind)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let policy = promote::check_served(object, target, opts)?;
    let patch = promote::annotation_patch(object);
    println!(
        "{} {}: merge patch {}",
        policy.kind,
        policy.key,
        serde_json::to_string(&patch)?
    );
    if args.dry_run {
        println!(
            "dry run: {} {} left in monitor mode",
            policy.kind, policy.key
        );
        return Ok(ExitCode::SUCCESS);
    }
    let after = netwarden_kube::merge_patch(
        kubeconfig,
        timeout,
        kind,
        &target.key.namespace,
        &target.key.name,
        &patch,
    )?;
    // What the cluster holds now must read as enforced, as the agent will read it.
    match promote::check_served(&after, target, opts) {
        Err(promote::PromoteError::NotMonitored { .. }) => {}
        Ok(_) => bail!(
            "{} {}: still monitored after the patch",
            policy.kind,
            policy.key
        ),
        Err(e) => return Err(e.into()),
    }
    println!(
        "{} {} promoted to enforce in the cluster",
        policy.kind, policy.key
    );
    Ok(ExitCode::SUCCESS)
}

fn suggest_command(args: SuggestArgs) -> Result<ExitCode> {
    let inventory = args.input.inventory()?;
    args.input.options.check(&inventory)?;
    netwarden::suggest::command(
        &inventory.pods,
        &args.events,
        args.kind.kind(),
        std::io::stdout().lock(),
    )
}

/// `crd`: the CRDs, generated from netwarden's types.
fn crd_command() -> Result<ExitCode> {
    print!("{}", netwarden::crd::render_yaml()?);
    Ok(ExitCode::SUCCESS)
}

fn validate_command(args: ValidateArgs) -> Result<ExitCode> {
    let inventory = args.input.inventory()?;
    let fatal = inventory
        .problems
        .iter()
        .any(|p| args.input.options.strict || p.severity == netwarden_manifest::Severity::Error);
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&inventory.problems)?),
        Output::Table => {
            for p in &inventory.problems {
                println!("{p}");
            }
            println!(
                "{} namespace(s), {} pod(s), {} policy(ies), {} service(s); {} problem(s)",
                inventory.namespaces.len(),
                inventory.pods.len(),
                inventory.policies.len(),
                inventory.services.len(),
                inventory.problems.len()
            );
        }
    }
    Ok(if fatal {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Reach(args) => reach_command(args),
        Command::Explain(args) => explain_command(args),
        Command::Validate(args) => validate_command(args),
        Command::Diff(args) => diff_command(args),
        Command::Render(args) => render_command(args),
        Command::Apply(args) => agent_command(args, true),
        Command::Run(args) => agent_command(args, false),
        Command::Lab(command) => lab_command(command),
        Command::Report(args) => report_command(args),
        Command::Promote(args) => promote_command(args),
        Command::Suggest(args) => suggest_command(args),
        Command::Crd => crd_command(),
        Command::Demo(args) if args.kube => {
            netwarden::demo_kube::run(&args.paths, args.backend.backend())
        }
        Command::Demo(args) => {
            netwarden_lab::install_signal_cleanup()?;
            netwarden::demo::run(&args.paths, args.traffic, args.backend.backend())
        }
    }
}

/// Log lines to stderr, filtered by `RUST_LOG` (default `info`), in `format`.
fn init_logging(format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        // One JSON object per line; the event's fields at the top level (`message`, ...),
        // so collectors need no nested lookups.
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// mimalloc hands freed pages back to the kernel by itself (see `Cargo.toml`); glibc's malloc,
/// still used by libnftables, is trimmed by the agent (`netwarden_agent::memory`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    // After the logger, so that a failure is reported; the setting covers memory mapped before.
    netwarden_agent::memory::no_transparent_huge_pages();
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("netwarden: {err:#}");
            ExitCode::from(2)
        }
    }
}
