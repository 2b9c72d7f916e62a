//! The arguments of the commands that read manifests (or the cluster) and print what they
//! compute, touching no kernel: `reach`, `explain`, `validate`, `diff` and `render`.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use netwarden::cli_args::{PodSelectorArg, PortProto};
use netwarden_engine::PodKey;

use super::agent::DataplaneArgs;
use super::{AnalysisArgs, ClusterArgs, Input, InputOptions, Output, PageOutput};

#[derive(Args)]
pub struct RenderArgs {
    #[command(flatten)]
    pub input: Input,
    /// The pod, `ns/name`.
    #[arg(long)]
    pub pod: String,
    #[command(flatten)]
    pub dataplane: DataplaneArgs,
}

#[derive(Args)]
pub struct ReachArgs {
    #[command(flatten)]
    pub input: AnalysisArgs,
    /// Ports to probe, as PORT/PROTO (TCP, UDP, SCTP); repeatable.
    #[arg(long = "port", required = true, num_args = 1..)]
    pub ports: Vec<PortProto>,
    /// Only this network (`default` or `ns/name`), or `all`.
    #[arg(long, default_value = "all")]
    pub network: String,
    /// Sources: `ns/pod`, `ns/*` or `*`.
    #[arg(long, default_value = "*")]
    pub from: PodSelectorArg,
    /// Destinations: `ns/pod`, `ns/*` or `*`.
    #[arg(long, default_value = "*")]
    pub to: PodSelectorArg,
    /// `json` (SPEC 6), `table` (one matrix per network, port and family), or `html`: one
    /// self-contained page (no external fetches) with the matrices coloured allowed / denied /
    /// would-deny / would-allow, grouped by namespace, filters by network and namespace, and
    /// each cell's explanation on hover or click.
    #[arg(short = 'o', long, value_enum, default_value_t = PageOutput::Json)]
    pub output: PageOutput,
}

#[derive(Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub input: AnalysisArgs,
    /// Source pod, `ns/name`.
    #[arg(long)]
    pub from: String,
    /// Destination pod, `ns/name`.
    #[arg(long)]
    pub to: String,
    /// PORT/PROTO.
    #[arg(long)]
    pub port: PortProto,
    /// Only this network (`default` or `ns/name`).
    #[arg(long)]
    pub network: Option<String>,
    /// Only this family.
    #[arg(long, value_enum)]
    pub family: Option<FamilyArg>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
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
pub struct DiffArgs {
    /// The base: manifest files or directories (YAML, multi-document, `kind: List`, or JSON).
    #[arg(short = 'f', long = "filename", required_unless_present = "kube", conflicts_with = "kube", num_args = 1..)]
    pub paths: Vec<PathBuf>,
    /// The base is the live cluster's objects: one LIST of every kind `run --kube` watches.
    #[arg(long)]
    pub kube: bool,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// The changes: files or directories laid over the base.
    #[arg(long = "with", required = true, num_args = 1..)]
    pub with: Vec<PathBuf>,
    /// Ports to probe, as PORT/PROTO; repeatable. Default: every port a rule of either view
    /// names by number and every container port a pod declares.
    #[arg(long = "port", num_args = 1..)]
    pub ports: Vec<PortProto>,
    /// Only this network (`default` or `ns/name`), or `all`.
    #[arg(long, default_value = "all")]
    pub network: String,
    /// `json` (SPEC 6), `table`, or `html`: one self-contained page of the changed cells.
    #[arg(short = 'o', long, value_enum, default_value_t = PageOutput::Json)]
    pub output: PageOutput,
    /// Exit with status 1 when any flow goes from allowed to denied (a pull-request gate).
    #[arg(long)]
    pub fail_on_deny: bool,
    #[command(flatten)]
    pub options: InputOptions,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum FamilyArg {
    Ipv4,
    Ipv6,
}

#[derive(Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub input: AnalysisArgs,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

pub fn pod_key(s: &str) -> Result<PodKey> {
    match s.parse::<PodSelectorArg>() {
        Ok(PodSelectorArg::Pod(key)) => Ok(key),
        _ => bail!("expected a pod as ns/name, got {s:?}"),
    }
}
