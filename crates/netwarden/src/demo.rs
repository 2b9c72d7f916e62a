//! `netwarden demo`: one command that shows what netwarden does — the prediction, the real
//! lab with rules enforced in each pod's netns, real connections agreeing with the prediction,
//! and (for monitored policies) traffic that still flows while it is reported. Then, when a
//! traffic file describes the workloads' flows, the loop from observed traffic to an enforced
//! policy ([`crate::demo_loop`]): observe → suggest → monitor → report → promote.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use netwarden_dataplane::Backend;
use netwarden_engine::{EngineOptions, Mode, PolicyScope};
use netwarden_manifest::LoadOptions;
use netwarden_render::RenderOptions;

use crate::lab::{default_ports, render_text, EnforcedLab, LabCheckOptions};

pub fn run(paths: &[PathBuf], traffic: Option<PathBuf>, backend: Backend) -> Result<ExitCode> {
    let inventory = netwarden_manifest::load_paths(paths, &LoadOptions::default());
    crate::inventory::report_problems(&inventory, false);
    let options = LabCheckOptions {
        backend,
        ports: default_ports(&inventory),
        engine: EngineOptions::default(),
        render: RenderOptions::default(),
    };
    println!(
        "== netwarden demo: {} pod(s), {} polic(ies) from {}",
        inventory.pods.len(),
        inventory.policies.len(),
        paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    for p in &inventory.policies {
        let scope = match &p.scope {
            PolicyScope::Primary => "the cluster network".to_string(),
            PolicyScope::AllInterfaces => "every interface".to_string(),
            PolicyScope::Networks(nets) => nets
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        };
        let mode = match (p.mode, &p.replaces) {
            (Mode::Enforce, _) => "enforced".to_string(),
            (Mode::Monitor, None) => "MONITORED".to_string(),
            (Mode::Monitor, Some(r)) => {
                format!("MONITORED, previews replacing {}/{r}", p.key.namespace)
            }
        };
        println!(
            "   {:18} {:28} on {scope} ({mode})",
            p.kind.as_str(),
            p.key.to_string()
        );
    }
    println!("\n== building the lab: a netns per pod, a bridge per network, veths with the pods' addresses");
    let mut lab = EnforcedLab::up(&inventory, &options)?;
    println!("   {}", lab.sync);
    println!(
        "\n== the rules netwarden programmed ({} backend), e.g. for each isolated pod:",
        backend.as_str()
    );
    for (key, netns) in lab.syncer.programmed().clone() {
        match lab.syncer.read_back(&netns) {
            Ok(Some(text)) => println!(
                "   {key}: {} lines in its netns ({})",
                text.lines().count(),
                netns.display()
            ),
            Ok(None) => println!("   {key}: nothing"),
            Err(e) => println!("   {key}: cannot read back: {e}"),
        }
    }
    println!("\n== probing every pod pair on every network with real TCP/UDP connections");
    let report = lab.report(&options.ports);
    let would_deny: Vec<_> = report
        .probes
        .iter()
        .filter(|p| p.predicted.allowed && !p.predicted.staged_allowed)
        .collect();
    print!("{}", render_text(&report));
    if !would_deny.is_empty() {
        println!(
            "\n== monitor phase: {} connection(s) flowed that monitored policies would deny, e.g.:",
            would_deny.len()
        );
        for p in would_deny.iter().take(5) {
            println!(
                "   {} -> {} {}/{} on {}: observed {}, would be denied by {}",
                p.predicted.from,
                p.predicted.to,
                p.predicted.port,
                p.predicted.protocol,
                p.predicted.network,
                p.detail
                    .as_ref()
                    .map_or("not probed".to_string(), |d| d.to_string()),
                p.predicted
                    .monitored_policies
                    .iter()
                    .map(|m| m.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    println!(
        "\n== events the kernel logged (NFLOG, collected per pod netns), {} in all:",
        report.events.len()
    );
    for e in report.events.iter().take(6) {
        println!("   {}", e.to_json_line());
    }
    lab.down()?;
    let mut ok = report.mismatches == 0;
    match traffic.or_else(|| crate::demo_loop::default_traffic(paths)) {
        Some(traffic) => {
            let workdir = std::env::temp_dir().join(format!("netwarden-demo-{}", std::process::id()));
            std::fs::create_dir_all(&workdir)?;
            ok &= crate::demo_loop::run(&inventory, &traffic, backend, &workdir)?;
        }
        None => println!(
            "\n(no traffic file beside {}: the loop observe → suggest → monitor → report → promote is skipped; give one with --traffic)",
            paths.first().map_or(String::new(), |p| p.display().to_string())
        ),
    }
    println!("\n== cleaning up");
    println!("   labs removed: no netns, link or rule of the demo is left");
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
