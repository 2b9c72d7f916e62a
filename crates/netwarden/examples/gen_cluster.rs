//! Writes the engine bench's synthetic cluster (`netwarden_engine::generate::cluster`) as
//! manifests that `netwarden -f DIR` reads, to measure the CLI on large clusters without
//! committing large generated files:
//!
//! ```text
//! cargo run --release -p netwarden --example gen_cluster -- DIR PODS [POLICIES] [SEED]
//! /usr/bin/time -v target/release/netwarden reach -f DIR --port 80/TCP > /dev/null
//! ```
//!
//! One JSON file per kind (`Namespace.json`, `Pod.json`, `NetworkPolicy.json`, ...), each one
//! `kind: List`, written by [`netwarden::synthetic`] (the agent benchmark serves the same objects
//! from the fake API server).

use std::path::PathBuf;

use netwarden::synthetic::write_files;
use netwarden_engine::generate::cluster;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: gen_cluster DIR PODS [POLICIES (default PODS/10)] [SEED (default 1)]";
    let (Some(dir), Some(pods)) = (args.first(), args.get(1).and_then(|n| n.parse().ok())) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let pods: usize = pods;
    let policies = args
        .get(2)
        .and_then(|n| n.parse().ok())
        .unwrap_or(pods / 10);
    let seed = args.get(3).and_then(|n| n.parse().ok()).unwrap_or(1);
    let generated = cluster(pods, policies, seed);
    let dir = PathBuf::from(dir);
    write_files(&dir, &generated).expect("write the manifest files");
    eprintln!(
        "{}: {} namespaces, {} pods, {} policies, {} services",
        dir.display(),
        generated.namespaces.len(),
        generated.pods.len(),
        generated.policies.len(),
        generated.services.len()
    );
}
