//! What the node agent holds for a cluster, stage by stage, in heap bytes live (issue 10):
//! the watched objects reduced ([`ClusterSet`], as the kube watchers fill it), the engine fed
//! from its delta, and the rules of the agent's own pods. A counting allocator gives exact
//! figures (resident size also counts what an allocator keeps after frees).
//!
//! `cargo run --release -p netwarden --example agent_state -- 100000` (pods; policies at a
//! fifth of them, the generated cluster of the benchmarks; 110 local pods).

use std::time::Instant;

use netwarden::synthetic::api_objects;
use netwarden_engine::generate::cluster;
use netwarden_engine::{Engine, EngineOptions};
use netwarden_manifest::{ClusterSet, LoadOptions};
use netwarden_testing::heap::{live_mib, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn main() {
    let pods: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let generated = cluster(pods, pods / 5, 1);
    let objects = api_objects(&generated);
    drop(generated);
    let base = live_mib();
    println!(
        "{pods} pods: {} API objects as JSON values: {base:.1} MiB (not the agent's: the API server's)",
        objects.len()
    );

    let start = Instant::now();
    let mut cluster_set = ClusterSet::new(LoadOptions::default());
    for object in &objects {
        cluster_set.upsert(object);
    }
    let held = live_mib() - base;
    println!(
        "watched objects reduced (ClusterSet): {held:.1} MiB live, {:.2} s",
        start.elapsed().as_secs_f64()
    );

    let start = Instant::now();
    let delta = cluster_set.take_delta();
    let with_delta = live_mib() - base;
    println!(
        "  + its first delta (the whole inventory): {with_delta:.1} MiB live, {:.2} s",
        start.elapsed().as_secs_f64()
    );

    let start = Instant::now();
    let mut engine = Engine::new(EngineOptions::default());
    netwarden::inventory::apply_delta(&mut engine, delta);
    let fed = live_mib() - base;
    println!(
        "  + the engine fed (the delta consumed): {fed:.1} MiB live, {:.2} s",
        start.elapsed().as_secs_f64()
    );

    let start = Instant::now();
    let keys: Vec<_> = engine.pods().map(|p| p.key.clone()).collect();
    let stride = (keys.len() / 110).max(1);
    let rules: Vec<_> = keys
        .iter()
        .step_by(stride)
        .take(110)
        .filter_map(|k| engine.pod_rules(k))
        .collect();
    println!(
        "  + the rules of {} local pods: {:.1} MiB live, {:.2} s",
        rules.len(),
        live_mib() - base,
        start.elapsed().as_secs_f64()
    );
    drop(rules);
    drop(cluster_set);
    println!(
        "engine alone (its rule cache included): {:.1} MiB live",
        live_mib() - base
    );
}
