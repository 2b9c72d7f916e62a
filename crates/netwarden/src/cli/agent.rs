//! The arguments of `apply` and `run` (the node agent), and the data-plane switches they share
//! with `render` and `lab`: rule backend, marks, logging, learn mode.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};
use clap::{Args, ValueEnum};
use netwarden_agent::source::SourceConfig;
use netwarden_dataplane::Backend;
use netwarden_engine::EngineOptions;
use netwarden_render::RenderOptions;

use super::{
    parse_crd_grace, parse_discovery_interval, parse_interval, parse_window, DnsArg, Input,
    InputOptions,
};

#[derive(Clone, Copy, ValueEnum, Default, PartialEq, Eq)]
pub enum BackendArg {
    #[default]
    Nft,
    Iptables,
}

impl BackendArg {
    pub fn backend(self) -> Backend {
        match self {
            BackendArg::Nft => Backend::Nft,
            BackendArg::Iptables => Backend::Iptables,
        }
    }
}

/// `--established`: what happens to live connections an apply denies.
#[derive(Clone, Copy, ValueEnum, Default, PartialEq, Eq)]
pub enum EstablishedArg {
    /// End them (their conntrack entries are deleted; the next packet is judged and refused).
    #[default]
    Revoke,
    /// Let them go on: established traffic is accepted before any policy rule.
    Keep,
}

impl EstablishedArg {
    pub fn established(self) -> netwarden_agent::sync::Established {
        match self {
            EstablishedArg::Revoke => netwarden_agent::sync::Established::Revoke,
            EstablishedArg::Keep => netwarden_agent::sync::Established::Keep,
        }
    }
}

#[derive(Args, Clone)]
pub struct DataplaneArgs {
    /// Rule backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Nft)]
    pub backend: BackendArg,
    /// NFLOG group for would-deny/deny log messages.
    #[arg(long, default_value_t = 100)]
    pub nflog_group: u16,
    /// Mark bit set when the staged (monitor) view allows a packet.
    #[arg(long, default_value = "0x40000", value_parser = parse_mark)]
    pub staged_mark: u32,
    /// Mark bit set when the enforced view allows a packet (monitor bookkeeping).
    #[arg(long, default_value = "0x20000", value_parser = parse_mark)]
    pub allow_mark: u32,
    /// Log messages per minute per pod and direction.
    #[arg(long, default_value_t = 10)]
    pub log_rate: u32,
    /// Do not reject packets forwarded through an isolated pod (pods that route).
    #[arg(long)]
    pub allow_forward: bool,
    /// Log every enforced deny (as if every policy had `netwarden.io/log: "true"`).
    #[arg(long)]
    pub log_denies: bool,
    /// Learn mode for these pods (`NS/POD` or `NS/*`, repeatable), as if annotated
    /// `netwarden.io/learn: "true"`: each distinct new flow (direction, interface, peer
    /// address, port, protocol) is logged once per --learn-window as an `observed` event,
    /// deduplicated in the kernel; verdicts are unchanged. Needs the nft backend.
    #[arg(long = "learn", value_name = "NS/POD|NS/*")]
    pub learn: Vec<netwarden_engine::LearnSelector>,
    /// How long learn mode remembers a flow: it is logged again after this long (1s to 10y,
    /// e.g. 30s, 1h, 1d).
    #[arg(long, default_value = "1h", value_parser = parse_learn_window)]
    pub learn_window: std::time::Duration,
    /// Flows each learn set remembers (one set per family and direction); flows that find
    /// their set full are not logged and are counted in the table's counter `lrn_full`.
    #[arg(long, default_value_t = 65_536)]
    pub learn_set_size: u32,
}

/// `--learn-window`: whole seconds (the kernel's set timeouts are kept in seconds here), at
/// least 1s.
fn parse_learn_window(s: &str) -> Result<std::time::Duration, String> {
    let d = parse_window(s)?;
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
    pub fn render_options(&self) -> Result<RenderOptions> {
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
    pub fn engine_options(&self, input: &Input) -> EngineOptions {
        EngineOptions {
            learn: self.learn.clone(),
            ..input.engine_options(self.log_denies)
        }
    }
}

#[derive(Args)]
pub struct RunArgs {
    /// Manifest files or directories (YAML, multi-document, `kind: List`, or JSON).
    #[arg(short = 'f', long = "filename", num_args = 1.., required_unless_present = "kube", conflicts_with = "kube")]
    pub paths: Vec<PathBuf>,
    /// Accepted as by the other commands; `run` and `apply` report every problem and go on.
    #[arg(long)]
    pub strict: bool,
    /// Ignore `networking.k8s.io/v1` NetworkPolicy objects (not even watched with --kube).
    #[arg(long)]
    pub no_network_policy: bool,
    /// Where outgoing DNS (TCP/UDP 53) is allowed without a rule (see `reach --help`).
    #[arg(long, value_enum, default_value_t = DnsArg::Danm)]
    pub dns: DnsArg,
    /// Watch a Kubernetes cluster instead of reading files (`run` only): every pod is a peer,
    /// only the pods of --node-name are programmed.
    #[arg(long)]
    pub kube: bool,
    /// The kubeconfig to use with --kube (default: KUBECONFIG, ~/.kube/config, then the
    /// in-cluster service account, as kubectl).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name with --kube (default: $NODE_NAME): pods with this spec.nodeName are
    /// programmed.
    #[arg(long)]
    pub node_name: Option<String>,
    /// The CRI runtime's socket with --kube, asked where each local pod's network namespace is
    /// (default: containerd's, then CRI-O's socket, whichever exists; with none, only the
    /// netwarden.io/netns annotation and DanmEps say where a netns is).
    #[arg(long, value_name = "unix:///PATH")]
    pub cri_endpoint: Option<String>,
    #[command(flatten)]
    pub dataplane: DataplaneArgs,
    /// How often to look for changed manifests and interfaces (run only): 10ms to 1h, e.g.
    /// 500ms, 2s, 1m30s.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: std::time::Duration,
    /// Node name in events (default: the host name).
    #[arg(long)]
    pub node: Option<String>,
    /// Do not write events to stdout.
    #[arg(long)]
    pub no_events_stdout: bool,
    /// Also append events (JSON lines) to this file.
    #[arg(long)]
    pub events_file: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// How often a `status` record per monitored policy (monitored since, pods, would-deny,
    /// events lost, and from the kernel's counters: connections judged and would-denies the
    /// rate limit suppressed; the evidence `report` and `promote --require-ready` judge) is
    /// written to the events, besides one at shutdown.
    #[arg(long, default_value = "60s", value_parser = parse_interval)]
    pub status_interval: std::time::Duration,
    /// With --kube: how long a watched CRD must stay unserved (discovery asked again and
    /// again) before its objects are dropped. A restarting API server answers 404 for CRDs
    /// for a while; meanwhile the last objects stay enforced and /readyz says why.
    #[arg(long, default_value = "60s", value_parser = parse_crd_grace)]
    pub crd_grace: std::time::Duration,
    /// With --kube: how often discovery is asked whether an optional CRD that is not served
    /// (DanmNetworkPolicy, MultiNetworkPolicy, the admin policy kinds...) was installed since:
    /// 100ms to 1h.
    #[arg(long, default_value = "30s", value_parser = parse_discovery_interval)]
    pub discovery_interval: std::time::Duration,
    /// After SIGTERM or SIGINT, the longest the agent runs on: a sync under way stops between
    /// two pod netns, and past this the process exits whatever it is doing (the rules in place
    /// stay). Keep it below the pod's termination grace period (30 s in deploy/).
    #[arg(long, default_value = "10s", value_parser = parse_interval)]
    pub shutdown_timeout: std::time::Duration,
    /// How often every programmed pod netns's rules are compared with what netwarden applied
    /// and repaired if someone changed them, beside the comparison the kernel's change
    /// notifications trigger at once (tamper repair).
    #[arg(long, default_value = "10s", value_parser = parse_interval)]
    pub verify_interval: std::time::Duration,
    /// Live connections that a change of the rules denies (a policy, labels, a promotion
    /// from monitor to enforce): `revoke` ends them within a second of the apply (a reset
    /// for TCP), `keep` lets them go on (established traffic is accepted before any rule).
    #[arg(long, value_enum, default_value_t = EstablishedArg::Revoke)]
    pub established: EstablishedArg,
    /// Accept a pod netns that is netwarden's own network namespace (refused by default:
    /// programming it would firewall the node itself). For test beds only.
    #[arg(long)]
    pub allow_host_netns: bool,
}

impl RunArgs {
    /// The input options as the analyses take them.
    pub fn input(&self) -> Input {
        Input {
            paths: self.paths.clone(),
            options: InputOptions {
                strict: self.strict,
                no_network_policy: self.no_network_policy,
                dns: self.dns,
            },
        }
    }

    pub fn source(&self, once: bool) -> Result<SourceConfig> {
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
            discovery_interval: self.discovery_interval,
            crd_grace: self.crd_grace,
        })
    }
}
