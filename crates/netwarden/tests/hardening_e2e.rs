//! End-to-end regression tests of the fail-open defects of the hardening issue, through the
//! `netwarden` binary on real network namespaces (root; they fail when `CI=true` without it):
//!
//! - the primary interface is the one holding the pod IP, whatever its name (no `eth0` guess);
//! - interfaces with unusual kernel names are covered (nft), quoted or refused loudly
//!   (iptables);
//! - a netns deleted and created again at the same path is programmed again at once;
//! - switching backend removes what the other backend left.
//!
//! Each test builds its own namespaces (`nwh<pid>-…`), joined by veths, and removes them even
//! when it fails. Traffic only flows between them.

mod common;

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{netwarden_leftovers, root_or_skip, TempDir};
use netwarden_dataplane::netns::{create_named, delete_named, exec_in, named_path, run_in};
use netwarden_dataplane::Backend;
use serde_json::{json, Value};

/// The binary under test; `NETWARDEN_BIN` runs these tests against another build (to show a
/// defect on the build before its fix).
fn bin() -> String {
    std::env::var("NETWARDEN_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_netwarden").into())
}

/// Named namespaces deleted on drop (also when the test panics).
struct Namespaces {
    prefix: String,
    names: Vec<String>,
}

impl Namespaces {
    fn new(tag: &str) -> Namespaces {
        Namespaces {
            prefix: format!("nwh{}-{tag}", std::process::id()),
            names: Vec::new(),
        }
    }

    fn create(&mut self, name: &str) -> PathBuf {
        let full = format!("{}-{name}", self.prefix);
        let _ = delete_named(&full);
        let path = create_named(&full).expect("create netns");
        ip(&path, &["link", "set", "lo", "up"]);
        self.names.push(full);
        path
    }

    fn name(&self, short: &str) -> String {
        format!("{}-{short}", self.prefix)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = delete_named(n);
        }
    }
}

fn ip(ns: &Path, args: &[&str]) {
    exec_in(ns, "ip", args, None)
        .unwrap_or_else(|e| panic!("ip {args:?} in {}: {e}", ns.display()));
}

/// A veth from `pod` (`pod_if`, `net`.1/24) to the client netns named `client_name`
/// (`client_if`, `net`.2/24).
fn veth(pod: &Path, pod_if: &str, client: &Path, client_name: &str, client_if: &str, net: &str) {
    ip(
        pod,
        &[
            "link", "add", pod_if, "type", "veth", "peer", "name", client_if,
        ],
    );
    ip(pod, &["link", "set", client_if, "netns", client_name]);
    ip(pod, &["addr", "add", &format!("{net}.1/24"), "dev", pod_if]);
    ip(pod, &["link", "set", pod_if, "up"]);
    ip(
        client,
        &["addr", "add", &format!("{net}.2/24"), "dev", client_if],
    );
    ip(client, &["link", "set", client_if, "up"]);
}

fn listen(ns: &Path, addr: &str) -> TcpListener {
    let addr: SocketAddr = addr.parse().unwrap();
    run_in(ns, move || TcpListener::bind(addr))
        .unwrap()
        .unwrap()
}

fn connect(ns: &Path, addr: &str) -> std::io::Result<TcpStream> {
    let addr: SocketAddr = addr.parse().unwrap();
    run_in(ns, move || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(3))
    })
    .unwrap()
}

/// Waits until `client` reaches `addr` (a fresh veth takes a moment to pass packets).
fn wait_reachable(client: &Path, addr: &str) {
    let start = Instant::now();
    while connect(client, addr).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{addr} never reachable"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn assert_refused(client: &Path, addr: &str, why: &str) {
    match connect(client, addr) {
        Ok(_) => panic!("{why}: {addr} connected, must be refused"),
        Err(e) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "{why}: {addr}: {e} (a refusal, not a timeout)"
        ),
    }
}

fn assert_connects(client: &Path, addr: &str, why: &str) {
    if let Err(e) = connect(client, addr) {
        panic!("{why}: {addr} must connect: {e}");
    }
}

fn docs_text(docs: &[Value]) -> String {
    docs.iter()
        .map(|d| serde_json::to_string(d).unwrap())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

fn namespace_doc() -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "h"}})
}

/// A pod `web` whose netns is `netns`, with `pod_ips` and no network-status annotation.
fn pod_doc(netns: &Path, pod_ips: &[&str]) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "h", "labels": {"app": "web"},
                     "annotations": {"netwarden.io/netns": netns.display().to_string()}},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"podIPs": pod_ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>()},
    })
}

/// A policy of `kind` on `web` denying all ingress except TCP `port` (no `port`: all ingress
/// denied).
fn deny_ingress(kind: &str, name: &str, port: Option<u16>) -> Value {
    let api = match kind {
        "NetworkPolicy" => "networking.k8s.io/v1",
        _ => "danm.k8s.io/v1",
    };
    let ingress = match port {
        Some(p) => json!([{"ports": [{"protocol": "TCP", "port": p}]}]),
        None => json!([]),
    };
    json!({
        "apiVersion": api, "kind": kind,
        "metadata": {"name": name, "namespace": "h"},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                 "ingress": ingress},
    })
}

fn netwarden(args: &[&str], dir: &Path) -> Output {
    Command::new(bin())
        .args(args)
        .arg("-f")
        .arg(dir)
        .env("NO_COLOR", "1")
        .output()
        .expect("run netwarden")
}

fn apply(dir: &Path, backend: Backend) -> Output {
    netwarden(&["apply", "--backend", backend.as_str()], dir)
}

/// Defects 1 and 2 for one backend: the pod IP sits on `ens5` (no network-status annotation:
/// the manifests would guess `eth0`), and a second interface has an unusual name.
fn primary_and_unusual_names(backend: Backend, unusual: &str, tag: &str) {
    let mut nss = Namespaces::new(tag);
    let pod = nss.create("pod");
    let client = nss.create("client");
    let client_name = nss.name("client");
    veth(&pod, "ens5", &client, &client_name, "c1", "10.231.90");
    veth(&pod, unusual, &client, &client_name, "c2", "10.231.91");
    let _l = [
        listen(&pod, "10.231.90.1:8080"),
        listen(&pod, "10.231.90.1:8081"),
        listen(&pod, "10.231.91.1:8080"),
        listen(&pod, "10.231.91.1:8081"),
    ];
    for a in ["10.231.90.1:8081", "10.231.91.1:8081"] {
        wait_reachable(&client, a);
    }
    let dir = TempDir::new(tag);
    dir.write(
        "pods.yaml",
        &docs_text(&[namespace_doc(), pod_doc(&pod, &["10.231.90.1"])]),
    );

    // A NetworkPolicy isolates the primary interface: the one holding the pod IP.
    dir.write(
        "np.yaml",
        &docs_text(&[deny_ingress("NetworkPolicy", "np", Some(8080))]),
    );
    let out = apply(&dir.path, backend);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_connects(
        &client,
        "10.231.90.1:8080",
        "allowed port on the primary interface",
    );
    assert_refused(
        &client,
        "10.231.90.1:8081",
        "NetworkPolicy on the primary ens5",
    );
    assert_connects(
        &client,
        "10.231.91.1:8081",
        "a NetworkPolicy leaves other interfaces open",
    );

    // A DanmNetworkPolicy isolates every interface, the unusually named one included.
    dir.write(
        "danm.yaml",
        &docs_text(&[deny_ingress("DanmNetworkPolicy", "danm", Some(8080))]),
    );
    let out = apply(&dir.path, backend);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_connects(
        &client,
        "10.231.91.1:8080",
        "allowed port on the unusual interface",
    );
    assert_refused(
        &client,
        "10.231.91.1:8081",
        &format!("DanmNetworkPolicy on {unusual:?}"),
    );
    assert_refused(&client, "10.231.90.1:8081", "still on ens5");
    remove_everything(&pod);
}

/// Removes whatever any backend left in `pod` (the netns goes anyway; this keeps ipsets tidy).
fn remove_everything(pod: &Path) {
    use netwarden_dataplane::{Dataplane, IptablesDataplane, NftDataplane};
    let o = netwarden_render::RenderOptions::default();
    let _ = NftDataplane::new(o).remove(pod);
    let _ = IptablesDataplane::new(o).remove(pod);
}

#[test]
fn primary_interface_and_unusual_names_nft() {
    if !root_or_skip() {
        return;
    }
    primary_and_unusual_names(Backend::Nft, "a\"b;+", "pn");
}

#[test]
fn primary_interface_and_unusual_names_iptables() {
    if !root_or_skip() {
        return;
    }
    // iptables quotes what it can: everything but a trailing '+'.
    primary_and_unusual_names(Backend::Iptables, "a\"b;x", "pi");
}

/// iptables has no way to match a name ending in '+' exactly: the pod is refused loudly (exit
/// status 1, the interface named) and nothing is programmed that would leave it uncovered.
#[test]
fn iptables_refuses_a_name_it_cannot_match() {
    if !root_or_skip() {
        return;
    }
    let mut nss = Namespaces::new("ir");
    let pod = nss.create("pod");
    let client = nss.create("client");
    let client_name = nss.name("client");
    veth(&pod, "ens5", &client, &client_name, "c1", "10.231.92");
    veth(&pod, "a\"b;+", &client, &client_name, "c2", "10.231.93");
    let dir = TempDir::new("ir");
    dir.write(
        "pods.yaml",
        &docs_text(&[namespace_doc(), pod_doc(&pod, &["10.231.92.1"])]),
    );
    dir.write(
        "danm.yaml",
        &docs_text(&[deny_ingress("DanmNetworkPolicy", "danm", None)]),
    );
    let out = apply(&dir.path, Backend::Iptables);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("refused") && stderr.contains("a\\\"b;+"),
        "the error names the interface: {stderr}"
    );
    assert!(netwarden_leftovers(Backend::Iptables, &pod).is_empty());
}

/// The agent as a child process, killed when dropped.
struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    fn start(dir: &Path, backend: Backend, log: PathBuf) -> Agent {
        let stderr = File::create(&log).expect("agent log");
        let child = Command::new(bin())
            .args(["run", "-f"])
            .arg(dir)
            .args(["--interval", "100ms", "--backend", backend.as_str()])
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start the agent");
        Agent { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to 10 s for `cond`; panics with the agent's log otherwise.
    fn wait_for(&mut self, what: &str, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "the agent exited ({status}) waiting for {what}:\n{}",
                    self.log()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "timed out waiting for {what}; agent log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Defect 4: a pod sandbox restart deletes the pod's netns and creates a new one at the same
/// path. The agent notices the new identity and programs it at once, though no manifest
/// changed.
fn recreated_netns_is_reprogrammed(backend: Backend, tag: &str) {
    let mut nss = Namespaces::new(tag);
    let pod = nss.create("pod");
    let client = nss.create("client");
    let (pod_name, client_name) = (nss.name("pod"), nss.name("client"));
    veth(&pod, "eth0", &client, &client_name, "c1", "10.231.94");
    let dir = TempDir::new(tag);
    dir.write(
        "pods.yaml",
        &docs_text(&[namespace_doc(), pod_doc(&pod, &["10.231.94.1"])]),
    );
    dir.write(
        "np.yaml",
        &docs_text(&[deny_ingress("NetworkPolicy", "np", Some(8080))]),
    );
    let mut agent = Agent::start(&dir.path, backend, dir.path.join("agent.log"));
    agent.wait_for("the first rules", || {
        !netwarden_leftovers(backend, &pod).is_empty()
    });

    // The sandbox restarts: same path, new namespace, same addresses.
    delete_named(&pod_name).unwrap();
    let again = create_named(&pod_name).unwrap();
    assert_eq!(again, named_path(&pod_name).unwrap());
    ip(&pod, &["link", "set", "lo", "up"]);
    veth(&pod, "eth0", &client, &client_name, "c2", "10.231.94");
    let _l = [
        listen(&pod, "10.231.94.1:8080"),
        listen(&pod, "10.231.94.1:8081"),
    ];
    agent.wait_for("the rules in the new netns", || {
        !netwarden_leftovers(backend, &pod).is_empty()
    });
    wait_reachable(&client, "10.231.94.1:8080");
    assert_refused(&client, "10.231.94.1:8081", "rules of the recreated netns");
    assert!(agent.log().contains("recreated"), "{}", agent.log());
    drop(agent);
    remove_everything(&pod);
}

#[test]
fn recreated_netns_is_reprogrammed_nft() {
    if !root_or_skip() {
        return;
    }
    recreated_netns_is_reprogrammed(Backend::Nft, "rn");
}

#[test]
fn recreated_netns_is_reprogrammed_iptables() {
    if !root_or_skip() {
        return;
    }
    recreated_netns_is_reprogrammed(Backend::Iptables, "ri");
}

/// Defect 8: moving from one backend to the other removes what the first one left: the
/// iptables chains and ipsets after moving to nft, the nft table after moving to iptables —
/// and the pod stays enforced through the switch.
#[test]
fn switching_backend_removes_the_other_backends_rules() {
    if !root_or_skip() {
        return;
    }
    let mut nss = Namespaces::new("sw");
    let pod = nss.create("pod");
    let client = nss.create("client");
    let client_name = nss.name("client");
    veth(&pod, "eth0", &client, &client_name, "c1", "10.231.95");
    let _l = [
        listen(&pod, "10.231.95.1:8080"),
        listen(&pod, "10.231.95.1:8081"),
    ];
    wait_reachable(&client, "10.231.95.1:8081");
    let dir = TempDir::new("sw");
    dir.write(
        "pods.yaml",
        &docs_text(&[namespace_doc(), pod_doc(&pod, &["10.231.95.1"])]),
    );
    // An ipBlock peer, so the iptables backend has a set to leave behind.
    let mut np = deny_ingress("NetworkPolicy", "np", Some(8080));
    np["spec"]["ingress"][0]["from"] = json!([{"ipBlock": {"cidr": "10.231.95.0/24"}}]);
    dir.write("np.yaml", &docs_text(&[np]));

    for (from, to) in [
        (Backend::Iptables, Backend::Nft),
        (Backend::Nft, Backend::Iptables),
    ] {
        let out = apply(&dir.path, from);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !netwarden_leftovers(from, &pod).is_empty(),
            "{from:?} applied"
        );
        let out = apply(&dir.path, to);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!netwarden_leftovers(to, &pod).is_empty(), "{to:?} applied");
        assert_eq!(
            netwarden_leftovers(from, &pod),
            Vec::<String>::new(),
            "{from:?} left behind after switching to {to:?}"
        );
        assert_connects(&client, "10.231.95.1:8080", "allowed after the switch");
        assert_refused(&client, "10.231.95.1:8081", "denied after the switch");
    }
    remove_everything(&pod);
}
