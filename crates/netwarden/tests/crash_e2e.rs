//! Crash safety of the agent, end to end: `netwarden run` is killed with SIGKILL at random
//! points of its syncs — of small and of large rulesets, both backends — and restarted, many
//! times, while a prober connects without pause to a port the policy allows and to one it
//! denies. Every allowed connection must succeed and every denied one be refused, before,
//! during and after each kill (rules stay in the kernel while no agent runs, and a restarted
//! agent replaces them atomically); after each restart the agent must converge (a sync without
//! error).
//!
//! The policy file flips between two variants every 150 ms, so the agent is nearly always in
//! the middle of a sync when it is killed: each variant allows TCP 8080 from the client and
//! denies 8081, with a different list of other peers (ipBlocks), so every sync replaces the
//! peer sets. `NW_CRASH_KILLS` sets the kills per configuration (default 4; the figures in the
//! notes come from `NW_CRASH_KILLS=100`).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use netwarden_testing::{
    docs_text, listen, netwarden_bin, probe, root_or_skip, successful_syncs, successful_syncs_in,
    veth, wait_reachable, AgentProcess, Lcg, Namespaces, TempDir,
};
use serde_json::{json, Value};

/// Variant `v` of the policy: TCP 8080 from the client and `peers` other addresses (different
/// per variant, spread so they do not merge into ranges).
fn policy(v: u32, peers: u32) -> Value {
    let mut from = vec![json!({"ipBlock": {"cidr": "10.231.97.2/32"}})];
    let base = u32::from(std::net::Ipv4Addr::new(10, 96, 0, 0)) + v;
    from.extend((0..peers).map(|i| {
        let a = std::net::Ipv4Addr::from(base + 4 * i);
        json!({"ipBlock": {"cidr": format!("{a}/32")}})
    }));
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "web", "namespace": "c"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": from, "ports": [{"port": 8080}]}]},
    })
}

#[derive(Default)]
struct Tally {
    allowed_ok: usize,
    denied_ok: usize,
    violations: Vec<String>,
}

fn crash_safety(backend: &str, peers: u32, tag: &str) {
    let kills: u64 = std::env::var("NW_CRASH_KILLS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(4);
    let mut nss = Namespaces::new(tag);
    let pod = nss.create("pod");
    let client = nss.create("client");
    veth(
        &pod,
        "eth0",
        &["10.231.97.1/24"],
        &client,
        "c1",
        &["10.231.97.2/24"],
    );
    let listeners = [
        listen(&pod, "10.231.97.1:8080"),
        listen(&pod, "10.231.97.1:8081"),
    ];
    wait_reachable(&client, "10.231.97.1:8080");

    let dir = TempDir::new(tag);
    let pod_doc = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "c",
                     "annotations": {"netwarden.io/netns": pod.display().to_string()}},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"podIPs": [{"ip": "10.231.97.1"}]},
    });
    let ns_doc = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "c"}});
    dir.write("pods.yaml", &docs_text(&[ns_doc, pod_doc]));
    let variants = [
        docs_text(&[policy(0, peers)]),
        docs_text(&[policy(1, peers)]),
    ];
    dir.write("policy.yaml", &variants[0]);
    let log = dir.path.join("agent.log");
    let args = [
        "run",
        "-f",
        &dir.path.display().to_string(),
        "--interval",
        "50ms",
        "--backend",
        backend,
        "--no-events-stdout",
    ];
    let bin = netwarden_bin!();
    let start_agent = || AgentProcess::start(&bin, &args, &log);
    let mut agent = start_agent();
    let within = Duration::from_secs(60);
    agent.wait_for("the first sync", within, || successful_syncs_in(&log) > 0);
    // Probes close with a reset: no TIME_WAIT, so tens of thousands of them neither run out of
    // ports nor meet a stale connection's reset (see `probe`).
    let denied = |c: &Path| probe(c, "10.231.97.1:8081");
    assert!(
        denied(&client).is_err(),
        "enforced before the prober starts"
    );

    let stop = AtomicBool::new(false);
    let tally = Mutex::new(Tally::default());
    let mut converge = Vec::new();
    let mut rng = Lcg::new(u64::from(peers) << 8 | u64::from(backend.len() as u8));
    std::thread::scope(|scope| {
        for l in &listeners {
            scope.spawn(|| {
                l.set_nonblocking(true).unwrap();
                while !stop.load(Ordering::SeqCst) {
                    if l.accept().is_err() {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
            });
        }
        scope.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let ok = probe(&client, "10.231.97.1:8080");
                let no = denied(&client);
                let mut t = tally.lock().unwrap();
                match ok {
                    Ok(_) => t.allowed_ok += 1,
                    Err(e) => t.violations.push(format!("allowed 8080 failed: {e}")),
                }
                match no {
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => t.denied_ok += 1,
                    Err(e) => t.violations.push(format!("denied 8081 not refused: {e}")),
                    Ok(_) => t.violations.push("denied 8081 connected".into()),
                }
            }
        });
        scope.spawn(|| {
            let mut v = 0;
            while !stop.load(Ordering::SeqCst) {
                v = 1 - v;
                dir.write("policy.yaml", &variants[v]);
                std::thread::sleep(Duration::from_millis(150));
            }
        });
        for _ in 0..kills {
            std::thread::sleep(Duration::from_millis(50 + rng.below(1500) as u64));
            agent.kill();
            // Down for a while: the rules in the kernel keep enforcing.
            std::thread::sleep(Duration::from_millis(rng.below(300) as u64));
            let before = successful_syncs(&agent.log());
            let restarted = Instant::now();
            agent = start_agent();
            agent.wait_for("a sync after the restart", within, || {
                successful_syncs_in(&log) > before
            });
            converge.push(restarted.elapsed());
        }
        stop.store(true, Ordering::SeqCst);
    });
    let t = tally.into_inner().unwrap();
    converge.sort();
    eprintln!(
        "{backend}, {} peers: {kills} kills; {} allowed and {} denied connections as expected, {} violations; convergence after restart min {:?} median {:?} max {:?}",
        peers + 1,
        t.allowed_ok,
        t.denied_ok,
        t.violations.len(),
        converge.first().unwrap(),
        converge[converge.len() / 2],
        converge.last().unwrap(),
    );
    assert!(
        t.allowed_ok > 0 && t.denied_ok > 0,
        "the prober ran: {} / {}",
        t.allowed_ok,
        t.denied_ok
    );
    assert!(t.violations.is_empty(), "{:?}", t.violations);
}

#[test]
fn agent_killed_during_small_syncs_nft() {
    if root_or_skip() {
        crash_safety("nft", 10, "nwcsn");
    }
}

#[test]
fn agent_killed_during_large_syncs_nft() {
    if root_or_skip() {
        crash_safety("nft", 20_000, "nwcln");
    }
}

#[test]
fn agent_killed_during_small_syncs_iptables() {
    if root_or_skip() {
        crash_safety("iptables", 10, "nwcsi");
    }
}

#[test]
fn agent_killed_during_large_syncs_iptables() {
    if root_or_skip() {
        crash_safety("iptables", 20_000, "nwcli");
    }
}
