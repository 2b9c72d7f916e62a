//! Engine benchmark (issue: foundation). Run: `cargo bench -p netwarden-engine --bench engine`.
//!
//! Measures, on a generated cluster, the full computation (feed every object, compute every
//! pod's rules), peak memory, and the recomputation after one pod's labels change; then the
//! same on a cluster twice the size to show how it grows.

use std::time::{Duration, Instant};

use netwarden_engine::generate::cluster;
use netwarden_engine::{Engine, EngineOptions};

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn run(pods: usize, policies: usize) {
    let c = cluster(pods, policies, 42);
    let mut full = Vec::new();
    let mut engine = Engine::new(EngineOptions::default());
    let mut rule_count = 0;
    for _ in 0..3 {
        let start = Instant::now();
        engine = Engine::new(EngineOptions::default());
        for ns in &c.namespaces {
            engine.set_namespace(ns.clone());
        }
        for p in &c.pods {
            engine.set_pod(p.clone());
        }
        for p in &c.policies {
            engine.set_policy(p.clone());
        }
        let rules = engine.all_pod_rules();
        full.push(start.elapsed());
        rule_count = rules
            .values()
            .flat_map(|r| &r.interfaces)
            .map(|i| i.ingress.enforced.rules().len() + i.egress.enforced.rules().len())
            .sum();
    }
    full.sort();
    // One pod's labels change → recompute only the dirty pods.
    let mut incr = Vec::new();
    let mut touched = 0usize;
    for i in 0..200 {
        let mut pod = c.pods[(i * 7919) % c.pods.len()].clone();
        let app = format!("app{}", (i * 31) % (pods / 20).max(1));
        pod.labels.insert("app".into(), app);
        let start = Instant::now();
        engine.set_pod(pod);
        let dirty = engine.take_dirty();
        touched += dirty.len();
        for key in &dirty {
            std::hint::black_box(engine.pod_rules(key));
        }
        incr.push(start.elapsed());
    }
    incr.sort();
    println!(
        "pods={pods:6} policies={policies:5} full: median {:8.1} ms (min {:8.1}) | rules {rule_count:6} | one label change: p50 {:7.3} ms p99 {:7.3} ms, avg {:.1} pods recomputed | peak RSS {:6.1} MiB",
        full[full.len() / 2].as_secs_f64() * 1e3,
        full[0].as_secs_f64() * 1e3,
        percentile(&incr, 0.5).as_secs_f64() * 1e3,
        percentile(&incr, 0.99).as_secs_f64() * 1e3,
        touched as f64 / incr.len() as f64,
        peak_rss_mib(),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it once small.
    let quick = std::env::args().all(|a| a != "--bench");
    if quick {
        run(1_000, 200);
        return;
    }
    run(10_000, 2_000);
    run(20_000, 4_000);
}
