//! `apply` and `run`: the node agent's configuration from the arguments, then the agent
//! (`netwarden-agent`), once or for good.

use std::process::ExitCode;

use anyhow::Result;
use netwarden_agent::source::SourceConfig;

use crate::cli::agent::RunArgs;

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
        established: args.established.established(),
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
pub fn agent_command(args: RunArgs, once: bool) -> Result<ExitCode> {
    fix_netns_access(&args)?;
    netwarden_agent::agent::run(agent_config(&args, once)?, once)
}
