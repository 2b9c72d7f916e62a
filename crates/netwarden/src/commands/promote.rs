//! `promote`: the arguments read into a [`Target`], then what is printed and the one write. What
//! decides the promotion and builds it — the readiness check, the file and its edit, the object in
//! the cluster and its patch — is the library's [`netwarden::promote`].

use std::process::ExitCode;

use anyhow::{anyhow, Result};
use netwarden::promote::{self, Target};
use netwarden_manifest::LoadOptions;

use super::report::evidence_report;
use crate::cli::promote::PromoteArgs;

pub fn promote_command(args: PromoteArgs) -> Result<ExitCode> {
    let target = Target::parse(&args.policy, args.kind)?;
    if args.require_ready {
        let (report, _) = evidence_report(&args.events, &[target.event_name()], args.clean_for)?;
        let reason = promote::check_ready(&report, &target)?;
        eprintln!("{target}: ready to promote ({reason})");
    }
    let opts = LoadOptions::default();
    if args.kube {
        return promote_in_cluster(&args, &target, &opts);
    }
    let plan = promote::plan_files(&args.paths, &target, &opts)?;
    let label = plan.path.display().to_string();
    let edit = &plan.edit;
    print!("{}", promote::describe(&label, &plan.original, edit));
    if args.dry_run {
        println!("dry run: {} left in monitor mode", edit.policy.object());
    } else {
        promote::write_atomically(&plan.path, &edit.text)
            .map_err(|e| anyhow!("writing {label}: {e}"))?;
        println!("{} promoted to enforce in {label}", edit.policy.object());
    }
    Ok(ExitCode::SUCCESS)
}

fn promote_in_cluster(args: &PromoteArgs, target: &Target, opts: &LoadOptions) -> Result<ExitCode> {
    let kubeconfig = args.cluster.kubeconfig.as_deref();
    let timeout = args.cluster.request_timeout;
    let plan = promote::plan_cluster(kubeconfig, timeout, target, opts)?;
    let policy = plan.policy.object();
    println!(
        "{policy}: merge patch {}",
        serde_json::to_string(&plan.patch)?
    );
    if args.dry_run {
        println!("dry run: {policy} left in monitor mode");
        return Ok(ExitCode::SUCCESS);
    }
    promote::apply_cluster(kubeconfig, timeout, target, &plan, opts)?;
    println!("{policy} promoted to enforce in the cluster");
    Ok(ExitCode::SUCCESS)
}
