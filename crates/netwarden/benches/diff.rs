//! `netwarden diff` benchmark (issue 9: "diff on the 10,000-pod / 2,000-policy cluster with one
//! changed policy: under 1 s"). Run: `cargo bench -p netwarden --bench diff`. Under
//! `cargo test --all-targets` (no `--bench` argument) it runs a quick mode on a small cluster.
//!
//! The cluster is the engine benchmark's synthetic one ([`netwarden_engine::generate`]). The
//! time measured is [`netwarden::diff::diff`], the pure core, from two inventories to the list
//! of changes: the engine fed the base, every pod's rules computed once, the change fed, the
//! dirty pods recomputed, and the pairs with a touched end evaluated. Each case is timed
//! `NETWARDEN_BENCH_STEPS` times (5 by default), on one port (8080/TCP) and on the default
//! ports (every port the policies and pods name: 5 on this cluster):
//! - one policy edited: its ingress rules removed (its pods accept nothing any more);
//! - one policy deleted;
//! - one policy switched to monitor mode (a staged-view change).
//!
//! Loading the manifests is not part of it (`reach` and `diff` share the loader; the file
//! reading is the loader's benchmark's).

use std::time::{Duration, Instant};

use netwarden::diff::{default_ports, diff};
use netwarden::reach::ReachQuery;
use netwarden_engine::generate::cluster;
use netwarden_engine::{EngineOptions, Mode, Policy};
use netwarden_manifest::Inventory;

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// `base` with the policy at `index` changed by `edit` (`None`: deleted).
fn with_policy(
    base: &Inventory,
    index: usize,
    edit: impl Fn(&Policy) -> Option<Policy>,
) -> Inventory {
    let mut changed = base.clone();
    changed.policies = base
        .policies
        .iter()
        .enumerate()
        .filter_map(|(i, p)| if i == index { edit(p) } else { Some(p.clone()) })
        .collect();
    changed
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (pods, policies) = if full { (10_000, 2_000) } else { (500, 100) };
    let steps: usize = std::env::var("NETWARDEN_BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if full { 5 } else { 1 });
    let c = cluster(pods, policies, 42);
    let base = Inventory {
        namespaces: c.namespaces,
        pods: c.pods,
        policies: c.policies,
        services: c.services,
        ..Inventory::default()
    };
    // A policy with ingress rules, in the middle of the list.
    let index = (base.policies.len() / 2..base.policies.len())
        .find(|i| {
            base.policies[*i]
                .ingress
                .as_ref()
                .is_some_and(|r| !r.is_empty())
        })
        .expect("a policy with ingress rules");
    let target = base.policies[index].reference();
    let cases: Vec<(&str, Inventory)> = vec![
        (
            "one policy edited (ingress closed)",
            with_policy(&base, index, |p| {
                Some(Policy {
                    ingress: Some(Vec::new()),
                    ..p.clone()
                })
            }),
        ),
        ("one policy deleted", with_policy(&base, index, |_| None)),
        (
            "one policy switched to monitor",
            with_policy(&base, index, |p| {
                Some(Policy {
                    mode: Mode::Monitor,
                    ..p.clone()
                })
            }),
        ),
    ];
    println!(
        "diff benchmark: {pods} pods, {policies} policies, changing {target} ({}), {steps} run(s) each",
        if full { "full" } else { "quick mode" }
    );
    let options = EngineOptions::default();
    for (name, changed) in &cases {
        let port_sets = [
            ("8080/TCP", vec!["8080/TCP".parse().unwrap()]),
            ("default ports", default_ports(&base, changed)),
        ];
        for (ports_name, ports) in port_sets {
            let query = ReachQuery {
                ports: ports.clone(),
                ..ReachQuery::default()
            };
            let mut times = Vec::new();
            let mut found = 0;
            for _ in 0..steps {
                let start = Instant::now();
                let changes = diff(&base, changed, &options, &query);
                times.push(start.elapsed());
                found = changes.len();
                assert!(changes.iter().all(|c| !c.policies.is_empty()));
            }
            // Every case changes some flow on this cluster (the policy selects pods that
            // others reach).
            assert!(found > 0, "{name}: no change found");
            println!(
                "  {name:36} {ports_name:14} ({} port(s)): median {:8.1} ms, {found} changes",
                ports.len(),
                median(times).as_secs_f64() * 1e3,
            );
        }
    }
    println!("  peak RSS {:.0} MiB", peak_rss_mib());
}
