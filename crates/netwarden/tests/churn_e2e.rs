//! Churn soak of the agent, end to end: while `netwarden run` runs, pods (each a netns on a
//! shared bridge) are created, relabelled and deleted, and policies (enforced and monitored)
//! are created, changed and deleted, cycle after cycle. Then:
//!
//! - nothing leaks: the agent holds no more netns handles, sockets and threads than the live
//!   pods need, runs no child process, and its memory is flat after the warm-up; every deleted
//!   pod's netns is really gone (its veth leaves the bridge), and no live pod carries a table it
//!   should not;
//! - the final state equals `reach`: for every ordered pair of live pods, a real connection to
//!   TCP 8080 connects exactly when `netwarden reach` says it is allowed, and is refused
//!   otherwise.
//!
//! `NW_CHURN_CYCLES` sets the number of cycles (default 120; the figures in the notes come from
//! `NW_CHURN_CYCLES=1000`).

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use netwarden_testing::{
    heavy_lock, ip, listen, netwarden_bin, probe, root_or_skip, run_in, successful_syncs,
    successful_syncs_in, veth, AgentProcess, Lcg, Namespaces, ProcessStats, TempDir,
};
use serde_json::{json, Value};

fn yaml(doc: &Value) -> String {
    serde_json::to_string(doc).unwrap()
}

const NS: &str = "churn";

/// A live pod: its netns, address and role label.
struct PodState {
    netns: PathBuf,
    addr: String,
    role: &'static str,
}

struct Churn {
    nss: Namespaces,
    fabric: PathBuf,
    dir: TempDir,
    pods: BTreeMap<usize, PodState>,
    next_pod: usize,
    policies: BTreeMap<usize, Value>,
    next_policy: usize,
}

const ROLES: [&str; 3] = ["web", "db", "ops"];

impl Churn {
    fn pod_doc(&self, id: usize) -> Value {
        let p = &self.pods[&id];
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("p{id}"), "namespace": NS, "labels": {"role": p.role},
                         "annotations": {"netwarden.io/netns": p.netns.display().to_string()}},
            "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"podIPs": [{"ip": p.addr}]},
        })
    }

    fn write_pod(&self, id: usize) {
        self.dir
            .write(&format!("pod-{id}.yaml"), &yaml(&self.pod_doc(id)));
    }

    fn create_pod(&mut self, role: &'static str) {
        let id = self.next_pod;
        self.next_pod += 1;
        let short = format!("p{id}");
        let netns = self.nss.create(&short);
        let addr = format!("10.233.{}.{}", id / 250, id % 250 + 1);
        let fabric_if = format!("v{id}");
        // The veth is made in the pod netns; its peer goes to the fabric's bridge.
        veth(
            &netns,
            "eth0",
            &[&format!("{addr}/16")],
            &self.fabric,
            &fabric_if,
            &[],
        );
        ip(&self.fabric, &["link", "set", &fabric_if, "master", "br0"]);
        self.pods.insert(id, PodState { netns, addr, role });
        self.write_pod(id);
    }

    fn delete_pod(&mut self, id: usize, netns_first: bool) {
        if netns_first {
            self.nss.delete(&format!("p{id}"));
            self.dir.remove(&format!("pod-{id}.yaml"));
        } else {
            self.dir.remove(&format!("pod-{id}.yaml"));
            self.nss.delete(&format!("p{id}"));
        }
        self.pods.remove(&id);
    }

    /// A policy: ingress to `target` from `from` on 8080 (the named port), enforced or
    /// monitored; or a default deny of egress for `target`.
    fn policy_doc(id: usize, rng: &mut Lcg) -> Value {
        let target = ROLES[rng.below(3)];
        let from = ROLES[rng.below(3)];
        let monitored = rng.below(4) == 0;
        let mut annotations = json!({});
        if monitored {
            annotations["netwarden.io/mode"] = json!("monitor");
        }
        let spec = if rng.below(5) == 0 {
            json!({"podSelector": {"matchLabels": {"role": target}}, "policyTypes": ["Egress"],
                   "egress": [{"to": [{"podSelector": {"matchLabels": {"role": from}}}]}]})
        } else {
            json!({"podSelector": {"matchLabels": {"role": target}}, "policyTypes": ["Ingress"],
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": from}}}],
                                "ports": [{"port": "http"}]}]})
        };
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": format!("np{id}"), "namespace": NS, "annotations": annotations},
            "spec": spec,
        })
    }

    fn one_cycle(&mut self, rng: &mut Lcg) {
        match rng.below(10) {
            // Pods come and go, keeping between 4 and 24 of them.
            0..=2 if self.pods.len() < 24 => self.create_pod(ROLES[rng.below(3)]),
            3..=4 if self.pods.len() > 4 => {
                let ids: Vec<usize> = self.pods.keys().copied().collect();
                let id = ids[rng.below(ids.len())];
                self.delete_pod(id, rng.below(2) == 0);
            }
            5..=6 if !self.pods.is_empty() => {
                let ids: Vec<usize> = self.pods.keys().copied().collect();
                let id = ids[rng.below(ids.len())];
                self.pods.get_mut(&id).unwrap().role = ROLES[rng.below(3)];
                self.write_pod(id);
            }
            7 if self.policies.len() < 6 => {
                let id = self.next_policy;
                self.next_policy += 1;
                let doc = Self::policy_doc(id, rng);
                self.dir.write(&format!("policy-{id}.yaml"), &yaml(&doc));
                self.policies.insert(id, doc);
            }
            8 if !self.policies.is_empty() => {
                let ids: Vec<usize> = self.policies.keys().copied().collect();
                let id = ids[rng.below(ids.len())];
                let doc = Self::policy_doc(id, rng);
                self.dir.write(&format!("policy-{id}.yaml"), &yaml(&doc));
                self.policies.insert(id, doc);
            }
            // Policies come and go too, keeping at least two.
            _ if self.policies.len() > 2 => {
                let ids: Vec<usize> = self.policies.keys().copied().collect();
                let id = ids[rng.below(ids.len())];
                self.dir.remove(&format!("policy-{id}.yaml"));
                self.policies.remove(&id);
            }
            _ if self.policies.len() < 6 => {
                let id = self.next_policy;
                self.next_policy += 1;
                let doc = Self::policy_doc(id, rng);
                self.dir.write(&format!("policy-{id}.yaml"), &yaml(&doc));
                self.policies.insert(id, doc);
            }
            _ => {
                let ids: Vec<usize> = self.pods.keys().copied().collect();
                let id = ids[rng.below(ids.len())];
                self.pods.get_mut(&id).unwrap().role = ROLES[rng.below(3)];
                self.write_pod(id);
            }
        }
    }
}

/// Links of the fabric netns (the bridge and one veth end per live pod).
fn fabric_links(fabric: &Path) -> Vec<String> {
    let out = run_in(fabric, "ip", &["-o", "link", "show"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap_or("").to_string())
        .filter(|n| n.starts_with('v'))
        .collect()
}

fn churn(backend: &str, tag: &str) {
    let cycles: usize = std::env::var("NW_CHURN_CYCLES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(120);
    let _lock = heavy_lock();
    let mut nss = Namespaces::new(tag);
    let fabric = nss.create("fabric");
    ip(&fabric, &["link", "add", "br0", "type", "bridge"]);
    ip(&fabric, &["link", "set", "br0", "up"]);
    let dir = TempDir::new(tag);
    dir.write(
        "namespace.yaml",
        &yaml(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})),
    );
    let mut c = Churn {
        nss,
        fabric,
        dir,
        pods: BTreeMap::new(),
        next_pod: 0,
        policies: BTreeMap::new(),
        next_policy: 0,
    };
    for role in ROLES {
        c.create_pod(role);
    }
    let log = c.dir.path.join("agent.log");
    let dir_arg = c.dir.path.display().to_string();
    let bin = netwarden_bin!();
    let mut agent = AgentProcess::start(
        &bin,
        &[
            "run",
            "-f",
            &dir_arg,
            "--interval",
            "50ms",
            "--backend",
            backend,
            "--no-events-stdout",
        ],
        &log,
    );
    let within = Duration::from_secs(60);
    agent.wait_for("the first sync", within, || successful_syncs_in(&log) > 0);

    let mut rng = Lcg::new(0x0063_6875_726e);
    let started = Instant::now();
    let mut warm: Option<ProcessStats> = None;
    let mut peak_rss = 0;
    // RSS (KiB) at every tenth of the run, to see it level off.
    let mut rss_trace = Vec::new();
    for cycle in 0..cycles {
        c.one_cycle(&mut rng);
        std::thread::sleep(Duration::from_millis(10 + rng.below(40) as u64));
        let stats = ProcessStats::of(agent.pid());
        peak_rss = peak_rss.max(stats.rss_kib);
        if (cycle + 1) % (cycles / 10).max(1) == 0 {
            rss_trace.push(stats.rss_kib);
        }
        if cycle == cycles / 5 {
            warm = Some(stats);
        }
    }
    let churn_time = started.elapsed();

    // Settle: no change for a while, and the agent has synced after the last one.
    let settled_from = successful_syncs(&agent.log());
    std::thread::sleep(Duration::from_millis(500));
    agent.wait_for("a sync after the last change", within, || {
        successful_syncs_in(&log) > settled_from || !agent_busy(&log)
    });
    std::thread::sleep(Duration::from_millis(300));

    // No leak.
    let end = ProcessStats::of(agent.pid());
    // Every thread of the agent is where it started (a thread left in a pod netns pins it).
    // Short-lived workers enter pod netns by design (reading a pod's interfaces every
    // `--interval`, applying): a thread counts as left only if it is still in a pod netns a
    // second later.
    let own = std::fs::read_link("/proc/self/ns/net").unwrap();
    let elsewhere = || -> BTreeMap<String, String> {
        std::fs::read_dir(format!("/proc/{}/task", agent.pid()))
            .unwrap()
            .flatten()
            .filter_map(|task| {
                // A thread that ended meanwhile has no ns link any more.
                let ns = std::fs::read_link(task.path().join("ns/net")).ok()?;
                let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
                let id = task.file_name().to_string_lossy().into_owned();
                (ns != own).then(|| (id, comm.trim().to_string()))
            })
            .collect()
    };
    let first = elsewhere();
    std::thread::sleep(Duration::from_secs(1));
    let still: Vec<String> = elsewhere()
        .into_iter()
        .filter(|(id, _)| first.contains_key(id))
        .map(|(id, comm)| format!("{comm} ({id})"))
        .collect();
    assert!(
        still.is_empty(),
        "agent threads left in a pod netns: {still:?}"
    );
    let warm = warm.expect("warm-up stats");
    let live = c.pods.len();
    eprintln!(
        "{backend}: {cycles} cycles in {churn_time:.1?}; {live} pods and {} policies live; agent at warm-up {warm:?}, at the end {end:?}, peak RSS {peak_rss} KiB; RSS by tenths {rss_trace:?}",
        c.policies.len()
    );
    assert!(
        end.netns_fds <= live,
        "netns handles held: {} for {live} live pods",
        end.netns_fds
    );
    assert!(
        end.sockets <= 3 * live + 8,
        "sockets: {} for {live} live pods",
        end.sockets
    );
    assert!(
        end.threads <= live + 8,
        "threads: {} for {live} live pods",
        end.threads
    );
    assert_eq!(end.children, 0, "child processes left running");
    assert!(
        end.rss_kib <= warm.rss_kib + warm.rss_kib / 2 + 8 * 1024,
        "memory grew from {} KiB to {} KiB",
        warm.rss_kib,
        end.rss_kib
    );
    let mut links = fabric_links(&c.fabric);
    links.sort();
    let mut want: Vec<String> = c.pods.keys().map(|id| format!("v{id}")).collect();
    want.sort();
    if links != want {
        // Kept for the post-mortem: the temp dir goes with the test.
        let kept = std::env::temp_dir().join(format!("churn-{backend}-agent.log"));
        let _ = std::fs::copy(&log, &kept);
        eprintln!("agent log kept at {}", kept.display());
    }
    assert_eq!(
        links, want,
        "deleted pods' netns kept alive (their veth stayed)"
    );

    // The final state equals `reach`.
    let out = std::process::Command::new(&bin)
        .args(["reach", "-f", &dir_arg, "--port", "8080/TCP", "-o", "json"])
        .output()
        .expect("netwarden reach");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reach: Value = serde_json::from_slice(&out.stdout).unwrap();
    let _listeners: Vec<TcpListener> = c
        .pods
        .values()
        .map(|p| listen(&p.netns, &format!("{}:8080", p.addr)))
        .collect();
    let by_name: BTreeMap<String, &PodState> = c
        .pods
        .iter()
        .map(|(id, p)| (format!("{NS}/p{id}"), p))
        .collect();
    let mut wrong = Vec::new();
    let mut probes = 0;
    for p in reach["probes"].as_array().unwrap() {
        let (from, to) = (p["from"].as_str().unwrap(), p["to"].as_str().unwrap());
        let (src, dst) = (by_name[from], by_name[to]);
        let allowed = p["allowed"].as_bool().unwrap();
        let observed = probe(&src.netns, &format!("{}:8080", dst.addr));
        let ok = match (&observed, allowed) {
            (Ok(()), true) => true,
            (Err(e), false) => e.kind() == std::io::ErrorKind::ConnectionRefused,
            _ => false,
        };
        probes += 1;
        if !ok {
            wrong.push(format!(
                "{from} -> {to}: reach says {allowed}, observed {observed:?}"
            ));
        }
    }
    eprintln!(
        "{backend}: {probes} probes of the final state, {} disagree with reach",
        wrong.len()
    );
    assert_eq!(probes, live * live, "every ordered pair probed");
    assert!(wrong.is_empty(), "{wrong:#?}");
    drop(agent);
}

/// Whether the agent logged a sync in the last half second.
fn agent_busy(log: &Path) -> bool {
    std::fs::metadata(log)
        .and_then(|m| m.modified())
        .map(|t| t.elapsed().unwrap_or_default() < Duration::from_millis(500))
        .unwrap_or(false)
}

#[test]
fn churn_soak_nft() {
    if root_or_skip() {
        churn("nft", "nwcn");
    }
}

#[test]
fn churn_soak_iptables() {
    if root_or_skip() {
        churn("iptables", "nwci");
    }
}
