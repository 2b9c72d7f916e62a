//! Helpers shared by the privileged end-to-end tests (`dataplane_e2e`, `agent_e2e`): the root
//! check, a small dual-stack lab built from manifests, what netwarden left in a pod netns (read
//! with the system tools, not through the dataplane under test), probes and temp dirs.
//!
//! Every lab here uses a name prefix of its own (`<tag><pid>`), so leftovers can be checked
//! without being confused by labs of other test suites running at the same time.

#![allow(dead_code)] // each test binary uses a part of these helpers

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use netwarden_dataplane::netns::{exec, exec_in, is_root};
use netwarden_dataplane::Backend;
use netwarden_engine::{PodKey, Protocol};
use netwarden_lab::{Lab, LabOptions, LabSpec, ProbeOutcome, ProbeSpec};
use netwarden_manifest::{parse_str, Inventory, LoadOptions};
use serde_json::{json, Value};

/// One lab at a time within a test binary: a lab is a whole netns topology with listeners,
/// and the atomicity test needs the CPU for its probes.
static LAB_LOCK: Mutex<()> = Mutex::new(());

/// Takes the lab lock (a test that failed while holding it does not block the others).
pub fn lab_lock() -> MutexGuard<'static, ()> {
    LAB_LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether the test can run: root builds network namespaces. In CI a missing root is a failure.
pub fn root_or_skip() -> bool {
    if is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("this end-to-end test needs root, and CI=true: refusing to skip");
    }
    println!("skipped: needs root");
    false
}

/// The namespace of every test object.
pub const NS: &str = "e2e";
/// The port every lab pod listens on and the policies talk about.
pub const PORT: u16 = 8080;

/// A test pod: name, labels, IPv4 and IPv6 address (on-link /24 and /64).
pub struct PodDef {
    pub name: &'static str,
    pub labels: &'static [(&'static str, &'static str)],
    pub v4: &'static str,
    pub v6: &'static str,
}

/// `server` (the pod the policies isolate), `client-ok` (allowed), `client-no` (denied) and
/// `other` (isolated by a policy of its own), all on the primary network.
pub const PODS: [PodDef; 4] = [
    PodDef {
        name: "server",
        labels: &[("app", "server")],
        v4: "10.77.0.10",
        v6: "fd77::10",
    },
    PodDef {
        name: "client-ok",
        labels: &[("role", "ok")],
        v4: "10.77.0.11",
        v6: "fd77::11",
    },
    PodDef {
        name: "client-no",
        labels: &[("role", "no")],
        v4: "10.77.0.12",
        v6: "fd77::12",
    },
    PodDef {
        name: "other",
        labels: &[("app", "other")],
        v4: "10.77.0.13",
        v6: "fd77::13",
    },
];

pub fn pod_def(name: &str) -> &'static PodDef {
    PODS.iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no test pod {name}"))
}

pub fn key(name: &str) -> PodKey {
    PodKey::new(NS, name)
}

/// The Namespace object.
pub fn namespace_doc() -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": {"team": "e2e"}}})
}

/// A Pod object; `netns` becomes the standalone annotation `netwarden.io/netns`.
pub fn pod_doc(def: &PodDef, netns: Option<&Path>) -> Value {
    let labels: serde_json::Map<String, Value> = def
        .labels
        .iter()
        .map(|(k, v)| ((*k).to_string(), Value::from(*v)))
        .collect();
    let mut metadata = json!({"name": def.name, "namespace": NS, "labels": labels});
    if let Some(path) = netns {
        metadata["annotations"] = json!({"netwarden.io/netns": path.display().to_string()});
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": PORT}]}]},
        "status": {"podIPs": [{"ip": def.v4}, {"ip": def.v6}]},
    })
}

/// A NetworkPolicy isolating pods `app=<target>` for ingress, allowing TCP and UDP `PORT` from
/// pods whose `role` is in `roles` (no role: nothing is allowed). `extra` adds what no probe
/// uses (ipBlock peers of both families no pod is in, and port 9090), so the ruleset differs
/// while every probed verdict stays the same.
pub fn ingress_policy(name: &str, target: &str, roles: &[&str], extra: bool) -> Value {
    let mut ingress = Vec::new();
    if !roles.is_empty() {
        let mut from = vec![json!({"podSelector": {"matchExpressions": [
            {"key": "role", "operator": "In", "values": roles}
        ]}})];
        let mut ports = vec![
            json!({"protocol": "TCP", "port": PORT}),
            json!({"protocol": "UDP", "port": PORT}),
        ];
        if extra {
            from.push(json!({"ipBlock": {"cidr": "198.51.100.0/24"}}));
            from.push(json!({"ipBlock": {"cidr": "2001:db8:77::/48"}}));
            ports.push(json!({"protocol": "TCP", "port": 9090}));
        }
        ingress.push(json!({"from": from, "ports": ports}));
    }
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "podSelector": {"matchLabels": {"app": target}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    })
}

/// Documents as one multi-document YAML text (each document JSON, which YAML reads as is).
pub fn docs_text(docs: &[Value]) -> String {
    docs.iter()
        .map(|d| serde_json::to_string(d).expect("JSON"))
        .collect::<Vec<_>>()
        .join("\n---\n")
        + "\n"
}

/// Parses documents with the manifest loader; any problem fails the test.
pub fn inventory(docs: &[Value]) -> Inventory {
    let inv = parse_str("e2e.yaml", &docs_text(docs), &LoadOptions::default());
    assert!(
        inv.problems.is_empty(),
        "test manifests have problems: {:?}",
        inv.problems
    );
    inv
}

/// A lab name prefix unique to this process and test (`[a-z0-9-]`, at most 32 characters).
pub fn prefix(tag: &str) -> String {
    format!("{tag}{}", std::process::id())
}

/// Builds a lab of `pods` (listening on TCP and UDP `PORT`) under `prefix`, and returns the
/// inventory with every pod's netns set to its lab netns.
pub fn lab_up(prefix: &str, docs: &[Value]) -> (Lab, Inventory) {
    let mut inv = inventory(docs);
    let spec = LabSpec {
        pods: inv.pods.clone(),
        ports: vec![(PORT, Protocol::Tcp), (PORT, Protocol::Udp)],
    };
    let options = LabOptions {
        prefix: prefix.to_owned(),
        ..LabOptions::default()
    };
    let lab = Lab::up_with(&spec, &options).expect("building the lab");
    for pod in &mut inv.pods {
        let path = lab
            .pod_netns(&pod.key)
            .unwrap_or_else(|| panic!("{} got no netns", pod.key));
        pod.netns = Some(path.display().to_string());
    }
    (lab, inv)
}

/// The netns of a lab pod.
pub fn netns_of(lab: &Lab, name: &str) -> PathBuf {
    lab.pod_netns(&key(name))
        .unwrap_or_else(|| panic!("no netns for {name}"))
        .to_path_buf()
}

/// Named netns (`ip netns list`) whose name starts with `<prefix>-`.
pub fn named_netns_with_prefix(prefix: &str) -> Vec<String> {
    let out = exec("ip", &["netns", "list"], None).expect("ip netns list");
    let dash = format!("{prefix}-");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&dash))
        .map(str::to_string)
        .collect()
}

fn run_in(netns: &Path, program: &str, args: &[&str]) -> String {
    let out = exec_in(netns, program, args, None)
        .unwrap_or_else(|e| panic!("{program} {args:?} in {}: {e}", netns.display()));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Everything of netwarden's that the system tools show in `netns`, one line per finding
/// (empty: nothing left). nft: table `inet netwarden` in `nft list tables`. iptables: any
/// `DANM_` line of `iptables-save`/`ip6tables-save`, and any set named `nw4-`/`nw6-`/`nwt4-`/
/// `nwt6-` in `ipset list -n`.
pub fn netwarden_leftovers(backend: Backend, netns: &Path) -> Vec<String> {
    let mut found = Vec::new();
    match backend {
        Backend::Nft => {
            for line in run_in(netns, "nft", &["list", "tables"]).lines() {
                if line.trim() == "table inet netwarden" {
                    found.push(format!("nft: {}", line.trim()));
                }
            }
        }
        Backend::Iptables => {
            for (tag, program) in [("v4", "iptables-save"), ("v6", "ip6tables-save")] {
                for line in run_in(netns, program, &[]).lines() {
                    if line.contains("DANM_") {
                        found.push(format!("{tag}: {line}"));
                    }
                }
            }
            for name in run_in(netns, "ipset", &["list", "-n"]).lines() {
                let name = name.trim();
                if ["nw4-", "nw6-", "nwt4-", "nwt6-"]
                    .iter()
                    .any(|p| name.starts_with(p))
                {
                    found.push(format!("ipset: {name}"));
                }
            }
        }
    }
    found
}

/// Netwarden's rules in `netns` as the tools print them, with the packet/byte counters
/// zeroed (so two listings of the same rules compare equal).
pub fn rules_snapshot(backend: Backend, netns: &Path) -> String {
    let text = match backend {
        Backend::Nft => {
            let out = exec_in(netns, "nft", &["list", "table", "inet", "netwarden"], None);
            match out {
                Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
                Err(_) => String::new(),
            }
        }
        Backend::Iptables => {
            let mut text = String::new();
            for program in ["iptables-save", "ip6tables-save"] {
                for line in run_in(netns, program, &["-t", "filter"]).lines() {
                    if !line.starts_with('#') {
                        text.push_str(line);
                        text.push('\n');
                    }
                }
            }
            let mut sets: Vec<String> = run_in(netns, "ipset", &["save"])
                .lines()
                .filter(|l| l.contains(" nw"))
                .map(str::to_string)
                .collect();
            sets.sort();
            text + &sets.join("\n")
        }
    };
    zero_counters(&text)
}

/// `packets N bytes M` → `packets 0 bytes 0`, `[N:M]` → `[0:0]`, `initval X` → `initval 0`.
fn zero_counters(text: &str) -> String {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut words: Vec<String> = line.split(' ').map(str::to_string).collect();
        for i in 1..words.len() {
            if (words[i - 1] == "packets" || words[i - 1] == "bytes")
                && words[i].chars().all(|c| c.is_ascii_digit())
            {
                words[i] = "0".into();
            }
            if words[i].starts_with('[') && words[i].ends_with(']') && words[i].contains(':') {
                words[i] = "[0:0]".into();
            }
            // ipset's random hash seed, chosen anew each time a set is created.
            if words[i - 1] == "initval" {
                words[i] = "0".into();
            }
        }
        out.push(words.join(" "));
    }
    out.join("\n")
}

/// A probe from pod `from` to pod `to`'s address of the family of `v6`.
pub fn probe(from: &str, to: &str, protocol: Protocol, v6: bool) -> ProbeSpec {
    let (src, dst) = (pod_def(from), pod_def(to));
    let pick = |d: &PodDef| -> IpAddr { if v6 { d.v6 } else { d.v4 }.parse().expect("address") };
    ProbeSpec {
        from: key(from),
        to: key(to),
        src_ip: Some(pick(src)),
        dst_ip: pick(dst),
        port: PORT,
        protocol,
    }
}

/// TCP and UDP probes `from` → `to`, IPv4 and IPv6.
pub fn probes(from: &str, to: &str) -> Vec<ProbeSpec> {
    let mut out = Vec::new();
    for protocol in [Protocol::Tcp, Protocol::Udp] {
        for v6 in [false, true] {
            out.push(probe(from, to, protocol, v6));
        }
    }
    out
}

/// A short description of an outcome for failure messages.
pub fn describe(o: &ProbeOutcome) -> String {
    format!(
        "{} -> {} {}:{}/{:?}: {} in {:.0} ms",
        o.spec.from,
        o.spec.to,
        o.spec.dst_ip,
        o.spec.port,
        o.spec.protocol,
        o.detail,
        o.elapsed.as_secs_f64() * 1e3
    )
}

/// Asserts every probe connected (`allowed`) or none did.
pub fn assert_probes(lab: &Lab, specs: &[ProbeSpec], allowed: bool, what: &str) {
    let outcomes = lab.probe(specs);
    let wrong: Vec<String> = outcomes
        .iter()
        .filter(|o| o.connected != allowed)
        .map(describe)
        .collect();
    assert!(
        wrong.is_empty(),
        "{what}: expected {}, but: {wrong:#?}",
        if allowed { "connected" } else { "refused" }
    );
}

/// Polls `cond` every 50 ms until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A temporary directory, removed when dropped (also when the test panics).
pub struct TempDir {
    pub path: PathBuf,
}

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("netwarden-e2e-{}-{n}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path }
    }

    /// Writes `name` atomically (temp file + rename), so a reader never sees half a file.
    pub fn write(&self, name: &str, text: &str) {
        let tmp = self.path.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).expect("write temp file");
        std::fs::rename(&tmp, self.path.join(name)).expect("rename temp file");
    }

    pub fn remove(&self, name: &str) {
        std::fs::remove_file(self.path.join(name)).expect("remove file");
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
