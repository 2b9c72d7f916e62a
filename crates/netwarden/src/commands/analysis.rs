//! The commands that read manifests (or the cluster) and print what the library computes from
//! them, touching no kernel: `reach`, `explain`, `validate`, `diff`, and `render` (the rules one
//! pod's netns would get).

use std::process::ExitCode;

use anyhow::{bail, Result};
use netwarden::inventory::{load_engine, load_layered, DiffBase};
use netwarden::reach::{Family, ReachQuery};
use netwarden::{diff, explain, output};
use netwarden_dataplane::Backend;

use crate::cli::analysis::{
    pod_key, DiffArgs, ExplainArgs, FamilyArg, ReachArgs, RenderArgs, ValidateArgs,
};
use crate::cli::{Output, PageOutput};

pub fn reach_command(args: ReachArgs) -> Result<ExitCode> {
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

pub fn explain_command(args: ExplainArgs) -> Result<ExitCode> {
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

pub fn validate_command(args: ValidateArgs) -> Result<ExitCode> {
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
            // Admin policies and Nodes are counted only when there are some: the line stays
            // as it was for inputs without them.
            let mut admin = String::new();
            if !inventory.admin_policies.is_empty() || !inventory.nodes.is_empty() {
                admin = format!(
                    ", {} admin policy(ies), {} node(s)",
                    inventory.admin_policies.len(),
                    inventory.nodes.len()
                );
            }
            println!(
                "{} namespace(s), {} pod(s), {} policy(ies){admin}, {} service(s); {} problem(s)",
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

pub fn diff_command(args: DiffArgs) -> Result<ExitCode> {
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

/// `render`: the exact rules of one pod, as the chosen backend writes them.
pub fn render_command(args: RenderArgs) -> Result<ExitCode> {
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
