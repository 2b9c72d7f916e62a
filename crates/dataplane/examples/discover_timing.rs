//! Measures how long one interface discovery takes (needs root):
//! `cargo run --release -p netwarden-dataplane --example discover_timing [ROUNDS]` (default 1000).
//!
//! Builds a throwaway netns with three interfaces (`eth0`, `net1`, `a"b;+`: veth pairs whose
//! both ends stay in the netns), each with an IPv4, an IPv6 and a link-local address, then calls
//! [`netwarden_dataplane::interfaces`] ROUNDS times and prints the mean and percentiles. It asserts
//! nothing about the timings; the netns is deleted on exit, panics included.

use std::time::{Duration, Instant};

use netwarden_testing::{root_or_skip, Namespaces};

fn main() {
    if !root_or_skip() {
        return;
    }
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("ROUNDS must be a number"))
        .unwrap_or(1000);
    let mut namespaces = Namespaces::new("nwdp-timing");
    let path = namespaces.create("ns");
    let ip = |args: &[&str]| netwarden_testing::ip(&path, args);
    for (i, dev) in ["eth0", "net1", "a\"b;+"].into_iter().enumerate() {
        let peer = format!("peer{i}");
        ip(&["link", "add", dev, "type", "veth", "peer", "name", &peer]);
        ip(&["addr", "add", &format!("10.9.{i}.1/24"), "dev", dev]);
        ip(&[
            "addr",
            "add",
            &format!("fd09:{i}::1/64"),
            "dev",
            dev,
            "nodad",
        ]);
        ip(&["link", "set", dev, "up"]);
        ip(&["link", "set", &peer, "up"]);
    }
    let found = netwarden_dataplane::interfaces(&path).expect("discover");
    assert_eq!(found.len(), 3, "{found:?}");

    let mut times: Vec<Duration> = Vec::with_capacity(rounds);
    let start = Instant::now();
    for _ in 0..rounds {
        let t = Instant::now();
        let found = netwarden_dataplane::interfaces(&path).expect("discover");
        times.push(t.elapsed());
        std::hint::black_box(found);
    }
    let total = start.elapsed();
    times.sort();
    let pct = |p: usize| times[(times.len() * p / 100).min(times.len() - 1)];
    println!(
        "{rounds} discoveries of a netns with 3 interfaces: total {total:?}, mean {:?}, \
         p50 {:?}, p90 {:?}, p99 {:?}, max {:?}",
        total / rounds as u32,
        pct(50),
        pct(90),
        pct(99),
        times[times.len() - 1]
    );
}
