//! `netwarden suggest` benchmark (issue 9: "1,000,000 observed-flow events under 10 s, memory
//! bounded by distinct flows").
//!
//! Full run: `cargo bench -p netwarden --bench suggest`. Under `cargo test --all-targets` (no
//! `--bench` argument) it runs a quick mode on a small cluster and 20,000 events.
//!
//! The cluster is the benchmarks' synthetic one ([`netwarden_engine::generate`]: 10,000 pods).
//! Events are `observed` JSON lines, generated on the fly by a reader (never held in memory or
//! written to disk): a fixed set of distinct pod-to-pod flows (and some to outside addresses),
//! each logged once per learn window by its source, its destination or both, so the stream
//! repeats every flow many times, as learn mode's would over days. Measured: the whole
//! `suggest` pipeline (reading and parsing every line, folding into flows, building the
//! policies, writing the YAML), and the process's peak RSS (VmHWM). The stream is read twice,
//! a fifth of it then all of it: with the same distinct flows, the peak must not grow with the
//! number of events. Then once more with 50 admin policies in the cluster (SPEC 8: the
//! generator's, whole-namespace subjects): the time of the Admin tier's decisions is printed
//! apart (it feeds an engine with the cluster and evaluates every replica pair of each flow).

use std::io::{self, BufReader, Read};
use std::time::Instant;

use netwarden::suggest::{self, Observations, Workloads};
use netwarden_engine::generate::{admin_policies, cluster};
use netwarden_engine::{Direction, EngineOptions, Pod, PolicyKind};
use netwarden_manifest::Inventory;
use netwarden_monitor::{Event, EventAction, Timestamp};

struct Sizes {
    pods: usize,
    events: usize,
    flows: usize,
}

const FULL: Sizes = Sizes {
    pods: 10_000,
    events: 1_000_000,
    flows: 50_000,
};
const QUICK: Sizes = Sizes {
    pods: 600,
    events: 20_000,
    flows: 2_000,
};

/// The events of `flows` distinct flows, `events` lines in all, as a byte stream.
struct EventStream<'a> {
    pods: &'a [Pod],
    flows: usize,
    next: usize,
    total: usize,
    line: Vec<u8>,
    at: usize,
}

impl EventStream<'_> {
    /// Event number `i`: flow `i % flows`, logged in window `i / flows`.
    fn event(&self, i: usize) -> Event {
        let flow = i % self.flows;
        let window = (i / self.flows) as i64;
        let n = self.pods.len();
        // A spread of sources and destinations; one flow in ten goes outside the cluster.
        let src = &self.pods[(flow * 7919) % n];
        let outside = flow % 10 == 9;
        let dst = &self.pods[(flow * 104_729 + 13) % n];
        let port = [80u16, 5432, 8080, 9090][flow % 4];
        let src_ip = src.interfaces[0].ips[0];
        let dst_ip = if outside {
            format!("203.0.{}.{}", (flow >> 8) & 255, flow & 255)
                .parse()
                .expect("address")
        } else {
            dst.interfaces[0].ips[0]
        };
        // Windows alternate between the source's and the destination's log.
        let egress = outside || window % 2 == 0;
        let (pod, direction) = if egress {
            (src, Direction::Egress)
        } else {
            (dst, Direction::Ingress)
        };
        Event {
            time: Timestamp::from_secs(1_780_000_000 + window * 3600 + (flow % 3600) as i64),
            node: "node-1".into(),
            action: EventAction::Observed,
            direction,
            pod: pod.key.to_string(),
            interface: "eth0".into(),
            network: "default".into(),
            peer: None,
            src: src_ip,
            dst: dst_ip,
            sport: Some(40_000 + (i % 20_000) as u16),
            dport: Some(port),
            protocol: "TCP".into(),
            policies: Vec::new(),
            enforced_policies: Vec::new(),
            cause: None,
        }
    }
}

impl Read for EventStream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at == self.line.len() {
            if self.next == self.total {
                return Ok(0);
            }
            self.line = self.event(self.next).to_json_line().into_bytes();
            self.line.push(b'\n');
            self.at = 0;
            self.next += 1;
        }
        let n = buf.len().min(self.line.len() - self.at);
        buf[..n].copy_from_slice(&self.line[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// `(VmRSS, VmHWM)` of this process, MiB.
fn memory_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(f64::NAN, |kib| kib / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// What one `suggest` run measured.
struct Run {
    secs: f64,
    /// Of `secs`: what the Admin tier decides (engine fed, pairs evaluated).
    admin_secs: f64,
    flows: usize,
    yaml: usize,
    /// Flows the Admin tier decides for some pair or view.
    admin_flows: usize,
}

/// One `suggest` over `events` lines of `cluster`.
fn run(cluster: &Inventory, workloads: &Workloads, events: usize, flows: usize) -> Run {
    let started = Instant::now();
    let stream = EventStream {
        pods: &cluster.pods,
        flows,
        next: 0,
        total: events,
        line: Vec::new(),
        at: 0,
    };
    let mut observations = Observations::default();
    observations
        .read(workloads, "generated", BufReader::new(stream))
        .expect("reading the generated stream");
    assert_eq!(observations.events, events as u64);
    assert_eq!(observations.skipped.unknown_pod, 0);
    let admin_started = Instant::now();
    let tiers = suggest::admin_tiers(cluster, EngineOptions::default(), workloads, &observations);
    let admin_secs = admin_started.elapsed().as_secs_f64();
    let suggestion = suggest::suggest(workloads, &observations, &tiers, PolicyKind::NetworkPolicy);
    let yaml = suggest::yaml::render(&suggestion, workloads, &observations);
    assert!(!suggestion.policies.is_empty());
    Run {
        secs: started.elapsed().as_secs_f64(),
        admin_secs,
        flows: observations.flows.len(),
        yaml: yaml.len(),
        admin_flows: suggestion.admin.len(),
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let sizes = if full { FULL } else { QUICK };
    let c = cluster(sizes.pods, 0, 42);
    let workloads = Workloads::new(&c.pods);
    let mut inventory = Inventory {
        namespaces: c.namespaces.clone(),
        pods: c.pods.clone(),
        ..Inventory::default()
    };
    let (_, hwm_before) = memory_mib();
    println!(
        "suggest: {} pods in {} workloads, {} distinct flows",
        c.pods.len(),
        workloads.list.len(),
        sizes.flows
    );
    let mut peaks = Vec::new();
    for events in [sizes.events / 5, sizes.events] {
        let Run {
            secs, flows, yaml, ..
        } = run(&inventory, &workloads, events, sizes.flows);
        let (rss, hwm) = memory_mib();
        println!(
            "suggest: {events} events -> {flows} flows, {yaml} bytes of YAML in {secs:.2} s ({:.0} events/s); VmRSS {rss:.1} MiB, VmHWM {hwm:.1} MiB (before reading: {hwm_before:.1} MiB)",
            events as f64 / secs
        );
        peaks.push(hwm);
        if full && events == sizes.events && secs > 10.0 {
            eprintln!("suggest: {secs:.2} s for {events} events, over the 10 s budget");
            std::process::exit(1);
        }
    }
    // Same distinct flows, five times the events: the peak may not follow the events.
    let growth = peaks[1] - peaks[0];
    println!("suggest: peak growth from 1/5 to all events: {growth:.1} MiB");
    if growth > 0.5 * (peaks[0] - hwm_before).max(8.0) {
        eprintln!("suggest: memory grew with the number of events");
        std::process::exit(1);
    }
    // With admin policies: the same stream, the Admin tier's decisions timed apart.
    inventory.admin_policies = admin_policies(50, 42);
    let r = run(&inventory, &workloads, sizes.events, sizes.flows);
    println!(
        "suggest with 50 admin policies: {} events -> {} flows ({} decided by the Admin tier), {} bytes of YAML in {:.2} s, of which the Admin tier {:.2} s",
        sizes.events, r.flows, r.admin_flows, r.yaml, r.secs, r.admin_secs
    );
}
