//! The arguments of `lab` (its subcommands `check`, `up`, `probe`, `down`) and `demo`: real
//! network namespaces built from manifests.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use netwarden::cli_args::PortProto;

use super::agent::{BackendArg, DataplaneArgs};
use super::Input;

#[derive(Subcommand)]
pub enum LabCommand {
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
pub struct LabUpArgs {
    #[command(flatten)]
    pub input: Input,
    #[command(flatten)]
    pub dataplane: DataplaneArgs,
    /// Ports to serve (default: every container port the pods declare).
    #[arg(long = "port", num_args = 1..)]
    pub ports: Vec<PortProto>,
    /// Where to record the lab for `lab probe` / `lab down`.
    #[arg(long, default_value = DEFAULT_LAB_STATE)]
    pub state: PathBuf,
}

#[derive(Args)]
pub struct LabProbeArgs {
    #[command(flatten)]
    pub input: Input,
    /// Ports to probe (default: every container port the pods declare).
    #[arg(long = "port", num_args = 1..)]
    pub ports: Vec<PortProto>,
    #[arg(long, default_value = DEFAULT_LAB_STATE)]
    pub state: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct LabDownArgs {
    #[arg(long, default_value = DEFAULT_LAB_STATE)]
    pub state: PathBuf,
}

#[derive(Args)]
pub struct LabCheckArgs {
    #[command(flatten)]
    pub input: Input,
    #[command(flatten)]
    pub dataplane: DataplaneArgs,
    /// Ports to probe (default: every container port the pods declare).
    #[arg(long = "port", num_args = 1..)]
    pub ports: Vec<PortProto>,
    /// Print JSON (`{"probes": [...], "events": [...]}`; with `--then`, `{"steps": [...]}`,
    /// one such object per state).
    #[arg(long)]
    pub json: bool,
    /// Further states of the cluster to enforce and probe in the same lab, in order: each
    /// file or directory is laid over the `-f` manifests as `diff --with` lays changes
    /// (replacing objects of the same kind, namespace and name; `netwarden.io/delete: "true"`
    /// deletes one). The pods must stay the same.
    #[arg(long, value_name = "PATH")]
    pub then: Vec<PathBuf>,
}

#[derive(Args)]
pub struct DemoArgs {
    /// Manifests to build the demo from.
    #[arg(short = 'f', long = "filename", default_value = "examples/multinet")]
    pub paths: Vec<PathBuf>,
    #[arg(long, value_enum, default_value_t = BackendArg::Nft)]
    pub backend: BackendArg,
    /// The workloads' traffic for the loop observe → suggest → monitor → report → promote:
    /// lines `FROM -> TO PORT/PROTO [on NETWORK]` (pods and networks as namespace/name).
    /// Default: `<first -f path>.traffic` when it exists (examples/multinet.traffic).
    #[arg(long, value_name = "FILE")]
    pub traffic: Option<PathBuf>,
    /// The node agent's path instead: the manifests served by a local fake API server, the
    /// pods scheduled on this node in the lab's netns, `run --kube` programming them; probes,
    /// then a policy created through the API, and probes again.
    #[arg(long, conflicts_with = "traffic")]
    pub kube: bool,
}
