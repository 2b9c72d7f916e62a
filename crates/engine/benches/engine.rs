//! Engine benchmark (issue: foundation; Services: issue 8). Run:
//! `cargo bench -p netwarden-engine --bench engine`.
//!
//! Measures, on a generated cluster (every app behind a Service), the full computation (feed
//! every object, compute every pod's rules) and peak memory; then two incremental steps, each
//! timed from the change until every dirty pod's rules are recomputed, with how many pods the
//! engine named dirty:
//! - one pod behind a Service relabelled (it leaves one app, and its Service, for another);
//! - one Service endpoint change (an EndpointSlice address of a selector-less Service goes,
//!   then comes back);
//! - one Service's endpoints all moved (to the pods of the next app, then back);
//!
//! Each step is also timed without the recomputation ("the change alone": what every node agent
//! pays for a change to a pod of another node, since it recomputes only its own pods).
//!
//! And the same on clusters of 20,000, 50,000 and 100,000 pods to show how it grows (issue 10's targets
//! at 100,000 pods / 20,000 policies: one relabel p50 under 1 ms, p99 under 10 ms). `NETWARDEN_BENCH_STEPS`
//! sets how many steps of each kind are timed (200 by default); `NETWARDEN_BENCH_MAX_PODS`
//! skips the sizes above it, `NETWARDEN_BENCH_MIN_PODS` those below it.

use std::time::{Duration, Instant};

use netwarden_engine::generate::{admin_policies, cluster, pod_ip, Cluster};
use netwarden_engine::{AdminAction, AdminPolicy, Engine, EngineOptions, Service};
use netwarden_testing::heap::{live_mib, CountingAllocator};

/// A size line of `/proc/self/status` (`VmHWM`, `VmRSS`), in MiB.
fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

fn peak_rss_mib() -> f64 {
    status_mib("VmHWM")
}

/// Resident size now, in MiB (an upper bound of what is live: freed memory the allocator
/// keeps counts too).
fn rss_mib() -> f64 {
    status_mib("VmRSS")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Timings of one kind of incremental step.
#[derive(Default)]
struct Steps {
    times: Vec<Duration>,
    /// The change alone, before any dirty pod is recomputed: what every node agent pays for
    /// a change elsewhere in the cluster (it recomputes only its own dirty pods).
    changes: Vec<Duration>,
    dirty: usize,
}

impl Steps {
    /// Applies `change`, then recomputes every pod the engine names dirty.
    fn measure(&mut self, engine: &mut Engine, change: impl FnOnce(&mut Engine)) {
        let start = Instant::now();
        change(engine);
        self.changes.push(start.elapsed());
        let dirty = engine.take_dirty();
        self.dirty += dirty.len();
        for key in &dirty {
            std::hint::black_box(engine.pod_rules(key));
        }
        self.times.push(start.elapsed());
    }

    fn summary(mut self) -> String {
        self.times.sort();
        self.changes.sort();
        let ms = |times: &[Duration], p| percentile(times, p).as_secs_f64() * 1e3;
        format!(
            "p50 {:8.3} ms p99 {:8.3} ms, avg {:7.1} pods dirty recomputed | the change alone p50 {:7.3} ms p99 {:7.3} ms",
            ms(&self.times, 0.5),
            ms(&self.times, 0.99),
            self.dirty as f64 / self.times.len() as f64,
            ms(&self.changes, 0.5),
            ms(&self.changes, 0.99),
        )
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn run(pods: usize, policies: usize, steps: usize) {
    let c = cluster(pods, policies, 42);
    let before_engine = live_mib();
    let mut full = Vec::new();
    let mut engine = Engine::new(EngineOptions::default());
    let mut rule_count = 0;
    for _ in 0..3 {
        let (fed, took, rules) = full_computation(&c, &[]);
        engine = fed;
        full.push(took);
        rule_count = rules;
    }
    full.sort();
    // The engine alone is left (the generated objects are still held; the rules are dropped).
    let engine_rss = rss_mib();
    let engine_heap = live_mib() - before_engine;
    println!(
        "pods={pods:6} policies={policies:5} services={:4} full: median {:8.1} ms (min {:8.1}) | rules {rule_count:6}",
        c.services.len(),
        full[full.len() / 2].as_secs_f64() * 1e3,
        full[0].as_secs_f64() * 1e3,
    );

    let mut relabel = Steps::default();
    for i in 0..steps {
        let mut pod = c.pods[(i * 7919) % c.pods.len()].clone();
        let app = format!("app{}", (i * 31) % (pods / 20).max(1));
        pod.labels.insert("app".into(), app);
        relabel.measure(&mut engine, |e| e.set_pod(pod));
    }
    println!(
        "  one pod behind a Service relabelled: {}",
        relabel.summary()
    );

    let sliced: Vec<&Service> = c.services.iter().filter(|s| s.selector.is_none()).collect();
    let mut endpoint = Steps::default();
    for i in 0..steps {
        // Each step takes one address out of a Service, the next puts it back.
        let mut service = sliced[(i / 2 * 7) % sliced.len()].clone();
        if i.is_multiple_of(2) {
            service.endpoint_addrs.remove(0);
        }
        endpoint.measure(&mut engine, |e| e.set_service(service));
    }
    println!(
        "  one Service endpoint change:         {}",
        endpoint.summary()
    );

    let mut moved = Steps::default();
    for i in 0..steps {
        // Each step moves every endpoint of a Service to the next app's pods, the next step
        // moves them back (what changes which egress rules reach the Service's VIP).
        let mut service = sliced[(i / 2 * 7) % sliced.len()].clone();
        if i.is_multiple_of(2) {
            let app: usize = service.key.name["svc".len()..].parse().expect("svc<N>");
            let next = (app + 1) % c.services.len();
            service.endpoint_addrs = (next * 20..(next * 20 + 20).min(pods))
                .map(pod_ip)
                .collect();
        }
        moved.measure(&mut engine, |e| e.set_service(service));
    }
    println!("  one Service's endpoints all moved:   {}", moved.summary());
    println!(
        "  engine state {engine_heap:6.1} MiB (heap bytes live, its rule cache included) | RSS with the engine after the full computation {engine_rss:6.1} MiB (the generated objects included); peak RSS so far {:6.1} MiB",
        peak_rss_mib()
    );
}

/// An engine fed `c` (and `admins`), every pod's rules computed: the time it took, and how
/// many allow rules the enforced views hold.
fn full_computation(c: &Cluster, admins: &[AdminPolicy]) -> (Engine, Duration, usize) {
    let start = Instant::now();
    let mut engine = Engine::new(EngineOptions::default());
    for ns in &c.namespaces {
        engine.set_namespace(ns.clone());
    }
    for p in &c.pods {
        engine.set_pod(p.clone());
    }
    for p in &c.policies {
        engine.set_policy(p.clone());
    }
    for s in &c.services {
        engine.set_service(s.clone());
    }
    for a in admins {
        engine.set_admin_policy(a.clone());
    }
    let rules = engine.all_pod_rules();
    let took = start.elapsed();
    let count = rules
        .values()
        .flat_map(|r| &r.interfaces)
        .map(|i| i.ingress.enforced.rules().len() + i.egress.enforced.rules().len())
        .sum();
    (engine, took, count)
}

/// Admin policies (issue 23): the full computation with `admins` admin policies beside the
/// same cluster without them, alternated (median of 3 each); then one admin policy changed
/// (action or priority) and the dirty pods of one node (110) recomputed, p50/p99.
fn run_admin(pods: usize, policies: usize, admins: usize, steps: usize) {
    let c = cluster(pods, policies, 42);
    let generated = admin_policies(admins, 7);
    let (mut without, mut with) = (Vec::new(), Vec::new());
    let mut engine = None;
    for _ in 0..3 {
        without.push(full_computation(&c, &[]).1);
        let (e, t, _) = full_computation(&c, &generated);
        with.push(t);
        engine = Some(e);
    }
    without.sort();
    with.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "pods={pods:6} policies={policies:5} admin policies={admins:4} full: without {:8.1} ms, with {:8.1} ms (median of 3), ratio {:.3}",
        ms(without[1]),
        ms(with[1]),
        with[1].as_secs_f64() / without[1].as_secs_f64()
    );
    let mut engine = engine.expect("three rounds");
    let mut times = Vec::new();
    let mut dirty_total = 0;
    for i in 0..steps {
        let mut changed = generated[(i * 13) % (generated.len() - 1)].clone();
        if i.is_multiple_of(2) {
            changed.priority = (changed.priority + 500) % 1000;
        } else if let Some(rule) = changed.ingress.first_mut() {
            rule.action = match rule.action {
                AdminAction::Deny => AdminAction::Allow,
                _ => AdminAction::Deny,
            };
        }
        let start = Instant::now();
        engine.set_admin_policy(changed);
        let dirty = engine.take_dirty();
        dirty_total += dirty.len();
        // One node's share: its 110 pods among those named dirty.
        for key in dirty.iter().step_by((dirty.len() / 110).max(1)).take(110) {
            std::hint::black_box(engine.pod_rules(key));
        }
        times.push(start.elapsed());
    }
    times.sort();
    println!(
        "  one admin policy changed, a node's 110 dirty pods recomputed: p50 {:8.3} ms p99 {:8.3} ms (avg {:.0} pods dirty cluster-wide)",
        ms(percentile(&times, 0.5)),
        ms(percentile(&times, 0.99)),
        dirty_total as f64 / steps as f64
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it once small.
    let quick = std::env::args().all(|a| a != "--bench");
    let steps = std::env::var("NETWARDEN_BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    if quick {
        run(1_000, 200, 20);
        run_admin(1_000, 200, 20, 10);
        return;
    }
    // `NETWARDEN_BENCH_ADMIN=<pods>`: only the admin policy benchmark, at that size (policies
    // at a fifth of the pods, 200 admin policies).
    if let Some(pods) = std::env::var("NETWARDEN_BENCH_ADMIN")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        run_admin(pods, pods / 5, 200, steps);
        return;
    }
    // `NETWARDEN_BENCH_MAX_PODS` / `_MIN_PODS` skip the larger / smaller sizes (default: every
    // size).
    let pods_bound = |name: &str, default: usize| -> usize {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let max_pods = pods_bound("NETWARDEN_BENCH_MAX_PODS", usize::MAX);
    let min_pods = pods_bound("NETWARDEN_BENCH_MIN_PODS", 0);
    // Issue 10: up to the largest clusters (policies at a fifth of the pods from 100,000).
    for (pods, policies) in [
        (10_000, 2_000),
        (20_000, 4_000),
        (50_000, 10_000),
        (100_000, 20_000),
    ] {
        if (min_pods..=max_pods).contains(&pods) {
            run(pods, policies, steps);
        }
    }
    // Issue 23's target size: 100,000 pods, 20,000 policies, 200 admin policies.
    if (min_pods..=max_pods).contains(&100_000) {
        run_admin(100_000, 20_000, 200, steps);
    }
}
