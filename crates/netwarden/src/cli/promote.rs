//! The arguments of `promote`, and the parser of its `--kind`.

use std::path::PathBuf;

use clap::Args;

use super::{parse_window, ClusterArgs};

#[derive(Args)]
pub struct PromoteArgs {
    /// The policy to switch to enforce: `NS/NAME`, or `Kind/NAME` for a cluster-scoped admin
    /// policy (`ClusterNetworkPolicy/NAME`, `AdminNetworkPolicy/NAME`,
    /// `BaselineAdminNetworkPolicy/default`).
    pub policy: String,
    /// Its kind, when several kinds have a policy of that name (an admin kind: then the policy
    /// may be given as `NAME`).
    #[arg(long, value_parser = parse_policy_kind)]
    pub kind: Option<netwarden::promote::TargetKind>,
    /// The manifest files holding the policy (exactly one of them must).
    #[arg(short = 'f', long = "filename", num_args = 1.., required_unless_present = "kube", conflicts_with = "kube")]
    pub paths: Vec<PathBuf>,
    /// Patch the policy in the cluster (a JSON merge patch of its annotations), with the
    /// user's kubeconfig as kubectl finds it (the agent's own permissions are read-only).
    #[arg(long)]
    pub kube: bool,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Print what would change; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Refuse unless `report` (on these events) says the policy is ready to promote.
    #[arg(long, requires = "events")]
    pub require_ready: bool,
    /// Event files for --require-ready (JSON lines with status records); `-` for stdin.
    #[arg(short = 'e', long = "events", num_args = 1..)]
    pub events: Vec<PathBuf>,
    /// The evidence window for --require-ready, as `report --clean-for`.
    #[arg(long, default_value = "1h", value_parser = parse_window)]
    pub clean_for: std::time::Duration,
}

/// `--kind`: a policy kind as `kind:` names it.
fn parse_policy_kind(s: &str) -> Result<netwarden::promote::TargetKind, String> {
    netwarden::promote::TargetKind::parse(s).ok_or_else(|| {
        format!(
            "unknown kind {s:?}: NetworkPolicy, MultiNetworkPolicy, DanmNetworkPolicy, \
             ClusterNetworkPolicy, AdminNetworkPolicy or BaselineAdminNetworkPolicy"
        )
    })
}
