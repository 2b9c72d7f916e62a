//! Revocation by the agent end to end (`netwarden run -f DIR`, SPEC 5), both backends, on a
//! real lab: live connections that a change denies stop passing packets within a second of the
//! apply (TCP: a reset), while the ones still allowed keep their data flowing.
//!
//! `revoked_by_the_agent_*`: live TCP connections to the server (IPv4 and IPv6) from
//! `client-ok` and `client-no`, both allowed at first; a policy edit that no longer allows
//! `client-no` ends its connections (reset) while `client-ok`'s keep passing; then a label
//! change that takes `client-ok` out of the allowed peers ends its connections too; then a
//! tamper (a rule that lets everything in) and the connection opened meanwhile, ended after the
//! repair. The log and `netwarden_connections_revoked_total{pod="e2e/server"}` say so. With
//! `--established keep` the same edit ends nothing.
//!
//! `revoked_on_every_change_kind_*`: one agent run, one step per change kind, each starting
//! from a state that allows every live flow of the step (TCP and UDP, IPv4 and IPv6):
//!
//! 1. **monitor → enforce**: a policy annotated `netwarden.io/mode: monitor` that allows only
//!    `client-ok`; an edit of the monitored policy applies without revoking anything (monitor
//!    never denies), then the promotion (the annotation removed) ends `client-no`'s TCP and
//!    UDP flows while `client-ok`'s go on;
//! 2. **namespace label**: a policy allowing the namespaces whose `team` is `e2e` or `b`;
//!    namespace `e2e-b`'s label changes, `client-b` (in it) is reset, `client-ok` goes on;
//! 3. **peer IP, ipBlock**: a policy allowing the lab's subnets by ipBlock; an `except` now
//!    covers `client-no`'s addresses;
//! 4. **peer IP, pod selector**: a policy allowing `client-ok` and `client-no` by label;
//!    `client-no`'s Pod object now records other addresses (`status.podIPs`) while the kernel
//!    keeps the old ones on its veth, and connections from the old addresses are ended. What
//!    is real here is the agent's side: it knows a peer on another node only by the addresses
//!    its Pod object records (for a pod of its own node it takes only addresses the kernel
//!    shows on the pod's interface, and ignores the others: so `client-no`'s object carries no
//!    netns annotation in this step, making it such a peer), and an address that live
//!    connections come from stops being an allowed pod's. A running pod's IP does not change
//!    in Kubernetes; this is what the agent sees when the object of a pod that still runs is
//!    replaced (a force-deleted pod on a partitioned node, recreated elsewhere under the same
//!    name) or its address is recycled to a pod the policy does not allow;
//! 5. **egress**: `client-ok` itself isolated in egress, allowed to the server on two ports;
//!    the edit keeps one: its flows (TCP and UDP) to the other port end, those to the kept
//!    port go on (the revocation happens in the client's netns).
//!
//! They need root (network namespaces); without it they skip, or fail when `CI=true`.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use netwarden_dataplane::Backend;
use netwarden_engine::PodKey;
use netwarden_testing::{
    connect, docs_text, free_port, heavy_lock, http_get, in_netns, listen, netwarden_leftovers,
    root_or_skip, sync_lines_in, udp_server, unique_prefix, AgentProcess, TempDir, UdpFlow,
};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_netwarden");
const TIMEOUT: Duration = Duration::from_secs(10);
/// The port of the live connections (the lab's own listeners are on `PORT`).
const LIVE_PORT: u16 = 9191;

/// Ingress to `app=server`: TCP `LIVE_PORT` from pods whose `role` is in `roles`.
fn policy(roles: &[&str]) -> String {
    docs_text(&[json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "server-in", "namespace": NS},
        "spec": {
            "podSelector": {"matchLabels": {"app": "server"}},
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [{"podSelector": {"matchExpressions": [
                    {"key": "role", "operator": "In", "values": roles}
                ]}}],
                "ports": [{"protocol": "TCP", "port": LIVE_PORT}],
            }],
        },
    })])
}

/// A live connection from a client netns to the server, echoed by a thread on the server side.
struct Live {
    what: String,
    stream: TcpStream,
}

impl Live {
    fn open(what: &str, client: &Path, listener: &std::net::TcpListener, to: String) -> Live {
        let stream = in_netns(client, move || TcpStream::connect(to.as_str()))
            .unwrap_or_else(|e| panic!("{what}: connect: {e}"));
        let (mut echo, _) = listener.accept().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while let Ok(n) = echo.read(&mut buf) {
                if n == 0 || echo.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
        stream
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        Live {
            what: what.into(),
            stream,
        }
    }

    /// One echo: `Ok(true)` it came back, `Ok(false)` not yet, `Err` the connection failed.
    fn echo(&mut self) -> std::io::Result<bool> {
        self.stream.write_all(b"ping")?;
        let mut buf = [0u8; 4];
        match self.stream.read_exact(&mut buf) {
            Ok(()) => Ok(true),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn assert_alive(&mut self, when: &str) {
        match self.echo() {
            Ok(true) => {}
            other => panic!("{} {when}: should pass: {other:?}", self.what),
        }
    }

    fn is_reset(&mut self) -> bool {
        matches!(self.echo(), Err(e) if e.kind() == ErrorKind::ConnectionReset || e.kind() == ErrorKind::BrokenPipe)
    }
}

/// `netwarden_connections_revoked_total` of `pod` (`ns/name`).
fn revoked_of(metrics: std::net::SocketAddr, pod: &str) -> f64 {
    let text = http_get(metrics, "/metrics").unwrap_or_default();
    let prefix = format!("netwarden_connections_revoked_total{{pod=\"{pod}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str())?.trim().parse().ok())
        .unwrap_or(0.0)
}

fn revoked_total(metrics: std::net::SocketAddr) -> f64 {
    revoked_of(metrics, "e2e/server")
}

fn pods_text(lab: &netwarden_lab::Lab, ok_role: &str) -> String {
    let mut docs: Vec<Value> = vec![namespace_doc()];
    docs.extend(PODS.iter().map(|d| {
        let mut doc = pod_doc(d, Some(&netns_of(lab, d.name)));
        if d.name == "client-ok" {
            doc["metadata"]["labels"]["role"] = json!(ok_role);
        }
        doc
    }));
    docs_text(&docs)
}

/// `netwarden run -f DIR` polling every 200 ms, its log in `logs/agent.log`.
fn start_agent(
    backend: Backend,
    dir: &TempDir,
    logs: &TempDir,
    metrics: std::net::SocketAddr,
    keep: bool,
) -> AgentProcess {
    let (dir_arg, metrics_arg) = (dir.path.display().to_string(), metrics.to_string());
    let mut args = vec![
        "run",
        "-f",
        &dir_arg,
        "--interval",
        "200ms",
        "--backend",
        backend.as_str(),
        "--no-events-stdout",
        "--metrics-addr",
        &metrics_arg,
    ];
    if keep {
        args.extend(["--established", "keep"]);
    }
    AgentProcess::start_with_env(
        BIN,
        &args,
        &[("RUST_LOG", "info")],
        &logs.path.join("agent.log"),
    )
}

fn revoke_e2e(backend: Backend, keep: bool) {
    if !root_or_skip() {
        return;
    }
    let _lock = heavy_lock();
    let tag = format!(
        "nwrv{}{}",
        &backend.as_str()[..1],
        if keep { "k" } else { "" }
    );
    let prefix = unique_prefix(&tag);
    let mut lab_docs = vec![namespace_doc()];
    lab_docs.extend(PODS.iter().map(|d| pod_doc(d, None)));
    let (lab, _) = lab_up(&prefix, &lab_docs);
    let server = netns_of(&lab, "server");
    let dir = TempDir::new(&format!("revoke-{tag}"));
    let logs = TempDir::new(&format!("revoke-logs-{tag}"));
    dir.write("pods.yaml", &pods_text(&lab, "ok"));
    dir.write("server.yaml", &policy(&["ok", "no"]));

    let metrics = free_port();
    let mut agent = start_agent(backend, &dir, &logs, metrics, keep);
    // The sync's end, not the first rules seen: the iptables backend restores IPv4 then IPv6,
    // and a connection opened in between would not be tracked in IPv6 (conntrack starts with
    // the first rule of a family that uses it), so it would have no entry to revoke.
    let log_path = logs.path.join("agent.log");
    agent.wait_for("the server programmed", TIMEOUT, || {
        !netwarden_leftovers(backend.as_str(), &server).is_empty()
            && std::fs::read_to_string(&log_path).is_ok_and(|t| t.contains(" 1 applied,"))
    });
    let (v4, v6) = (pod_def("server").v4, pod_def("server").v6);
    let listeners = [
        listen(&server, &format!("{v4}:{LIVE_PORT}")),
        listen(&server, &format!("[{v6}]:{LIVE_PORT}")),
    ];
    let targets = [format!("{v4}:{LIVE_PORT}"), format!("[{v6}]:{LIVE_PORT}")];
    let open = |client: &str| -> Vec<Live> {
        listeners
            .iter()
            .zip(&targets)
            .map(|(l, t)| {
                Live::open(
                    &format!("{client} → {t}"),
                    &netns_of(&lab, client),
                    l,
                    t.clone(),
                )
            })
            .collect()
    };
    let mut ok = open("client-ok");
    let mut no = open("client-no");
    for l in ok.iter_mut().chain(no.iter_mut()) {
        l.assert_alive("before");
    }

    // 1. The policy no longer allows client-no.
    let edit = Instant::now();
    dir.write("server.yaml", &policy(&["ok"]));
    if keep {
        let client_no = netns_of(&lab, "client-no");
        let target = targets[0].clone();
        agent.wait_for(
            "the edit applied (a new connection refused)",
            TIMEOUT,
            || connect(&client_no, &target).is_err(),
        );
        std::thread::sleep(Duration::from_millis(500));
        for l in ok.iter_mut().chain(no.iter_mut()) {
            l.assert_alive("after the edit, kept");
        }
        assert_eq!(revoked_total(metrics), 0.0);
        assert!(!agent.log().contains("revoked"), "{}", agent.log());
        return;
    }
    let mut reset_after = Vec::new();
    for l in &mut no {
        agent.wait_for(&format!("{} reset", l.what), TIMEOUT, || l.is_reset());
        reset_after.push(edit.elapsed());
    }
    for l in &mut ok {
        l.assert_alive("after the edit");
    }
    agent.wait_for("the revocations counted", TIMEOUT, || {
        revoked_total(metrics) >= 2.0
    });
    assert!(
        agent
            .log()
            .contains("e2e/server: revoked 2 live connection(s)"),
        "{}",
        agent.log()
    );

    // 2. client-ok's label changes: it is no longer among the allowed peers.
    let edit = Instant::now();
    dir.write("pods.yaml", &pods_text(&lab, "gone"));
    for l in &mut ok {
        agent.wait_for(&format!("{} reset", l.what), TIMEOUT, || l.is_reset());
        reset_after.push(edit.elapsed());
    }
    agent.wait_for("the revocations counted", TIMEOUT, || {
        revoked_total(metrics) >= 4.0
    });

    // 3. The pod (NET_ADMIN in its netns) lets everything in ahead of netwarden's rules;
    // client-no connects before the repair; the repair puts the rules back and the revocation
    // after it ends that connection. (Deleting the whole table would not do: conntrack stops
    // tracking in a netns where no rule uses it, so a connection opened then has no entry and
    // the repaired rules judge its next packet anyway.)
    let wipe = match backend {
        Backend::Nft => "nft insert rule inet netwarden input accept",
        Backend::Iptables => "iptables -I INPUT -j ACCEPT",
    };
    let client_no = netns_of(&lab, "client-no");
    let out = netwarden_testing::run_in(&server, "sh", &["-c", wipe]);
    assert!(out.status.success(), "{out:?}");
    let target = targets[0].clone();
    let sneaked = in_netns(&client_no, move || {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(2) {
            if let Ok(s) = TcpStream::connect(target.as_str()) {
                return Some(s);
            }
        }
        None
    });
    let stream = sneaked.expect("a connection while the rules were gone (the repair came first)");
    let (mut echo, _) = listeners[0].accept().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while let Ok(n) = echo.read(&mut buf) {
            if n == 0 || echo.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut sneaked = Live {
        what: "client-no, connected while the rules were gone".into(),
        stream,
    };
    agent.wait_for(
        "the sneaked connection reset after the repair",
        TIMEOUT,
        || sneaked.is_reset(),
    );
    agent.wait_for("the log says why", TIMEOUT, || {
        std::fs::read_to_string(&log_path)
            .is_ok_and(|t| t.contains("opened while they were tampered with"))
    });
    agent.assert_running();
    println!(
        "{}: edit → reset seen by the client (the agent polls files every 200 ms): {reset_after:?}",
        backend.as_str()
    );
}

#[test]
fn revoked_by_the_agent_nft() {
    revoke_e2e(Backend::Nft, false);
}

#[test]
fn revoked_by_the_agent_iptables() {
    revoke_e2e(Backend::Iptables, false);
}

#[test]
fn kept_by_the_agent_with_established_keep() {
    revoke_e2e(Backend::Nft, true);
}

// ---------------------------------------------------------------------------------------------
// Every change kind, one agent run

/// The second namespace: its `team` label is what step 2's namespaceSelector looks at.
const NS_B: &str = "e2e-b";
/// A client in `NS_B`.
const CLIENT_B: PodDef = PodDef {
    name: "client-b",
    labels: &[("role", "b")],
    v4: "10.77.0.14",
    v6: "fd77::14",
};
/// The second port of live connections (step 5 keeps `LIVE_PORT` and revokes this one).
const LIVE_PORT2: u16 = 9192;
/// What `client-no`'s Pod object records in step 4: addresses no lab pod has.
const MOVED: (&str, &str) = ("10.77.0.22", "fd77::22");

/// The objects the agent reads, all in one file written at once (one change, one sync).
struct World {
    policies: Vec<Value>,
    /// `NS_B`'s `team` label.
    team_b: &'static str,
    /// `Some`: `client-no`'s Pod object has no netns annotation (to the agent, a pod on
    /// another node, known by its object only) and records these addresses.
    no_remote: Option<(&'static str, &'static str)>,
}

impl World {
    fn with(policies: Vec<Value>) -> World {
        World {
            policies,
            team_b: "b",
            no_remote: None,
        }
    }

    fn text(&self, lab: &netwarden_lab::Lab) -> String {
        let mut docs = vec![
            namespace_doc(),
            namespace_doc_with(NS_B, "team", self.team_b),
        ];
        for d in &PODS {
            let doc = match self.no_remote {
                Some((v4, v6)) if d.name == "client-no" => {
                    let mut doc = pod_doc(d, None);
                    doc["status"]["podIPs"] = json!([{"ip": v4}, {"ip": v6}]);
                    doc
                }
                _ => pod_doc(d, Some(&netns_of(lab, d.name))),
            };
            docs.push(doc);
        }
        docs.push(pod_doc_in(NS_B, &CLIENT_B, Some(&client_b_netns(lab))));
        docs.extend(self.policies.iter().cloned());
        docs_text(&docs)
    }
}

fn client_b_netns(lab: &netwarden_lab::Lab) -> std::path::PathBuf {
    lab.pod_netns(&PodKey::new(NS_B, CLIENT_B.name))
        .expect("client-b's netns")
        .to_path_buf()
}

/// `ports` as a policy's `ports`: TCP, and UDP too when `udp`.
fn ports_json(ports: &[u16], udp: bool) -> Value {
    let protocols: &[&str] = if udp { &["TCP", "UDP"] } else { &["TCP"] };
    ports
        .iter()
        .flat_map(|p| {
            protocols
                .iter()
                .map(move |proto| json!({"protocol": proto, "port": p}))
        })
        .collect()
}

/// `server-in`: ingress to `app=server` on `LIVE_PORT` (TCP and UDP) from `from`; monitored
/// when `monitor`.
fn server_in(from: Value, monitor: bool) -> Value {
    let mut metadata = json!({"name": "server-in", "namespace": NS});
    if monitor {
        metadata["annotations"] = json!({"netwarden.io/mode": "monitor"});
    }
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {
            "podSelector": {"matchLabels": {"app": "server"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": from, "ports": ports_json(&[LIVE_PORT], true)}],
        },
    })
}

/// Peers whose `role` is in `roles` (in the policy's namespace).
fn roles(roles: &[&str]) -> Value {
    json!([{"podSelector": {"matchExpressions": [
        {"key": "role", "operator": "In", "values": roles}
    ]}}])
}

/// `client-ok-out`: egress of `role=ok` to `app=server` on `ports` (TCP and UDP).
fn client_out(ports: &[u16]) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "client-ok-out", "namespace": NS},
        "spec": {
            "podSelector": {"matchLabels": {"role": "ok"}},
            "policyTypes": ["Egress"],
            "egress": [{
                "to": [{"podSelector": {"matchLabels": {"app": "server"}}}],
                "ports": ports_json(ports, true),
            }],
        },
    })
}

/// Syncs that changed a netns (applied or removed rules), so far.
fn changing_syncs(log: &Path) -> usize {
    sync_lines_in(log)
        .iter()
        .filter(|s| s.applied + s.removed > 0)
        .count()
}

/// One agent run on one lab, and the server's listeners of live connections.
struct Stage {
    lab: netwarden_lab::Lab,
    dir: TempDir,
    agent: AgentProcess,
    log: std::path::PathBuf,
    metrics: std::net::SocketAddr,
    /// TCP listeners of the server: (`LIVE_PORT`, `LIVE_PORT2`) × (IPv4, IPv6).
    tcp: Vec<((u16, bool), std::net::TcpListener)>,
    /// UDP sockets of the server, the same.
    udp: Vec<((u16, bool), std::sync::Arc<std::net::UdpSocket>)>,
    /// Change → first reset seen, per revoked TCP connection.
    reset_after: Vec<Duration>,
}

impl Stage {
    /// Writes `world` and waits for the sync that applied it (without errors).
    fn set(&mut self, what: &str, world: &World) {
        let before = changing_syncs(&self.log);
        self.dir.write("world.yaml", &world.text(&self.lab));
        let log = self.log.clone();
        self.agent
            .wait_for(what, TIMEOUT, || changing_syncs(&log) > before);
        let last = *sync_lines_in(&self.log).last().unwrap();
        assert_eq!(last.errors, 0, "{what}: {}", self.agent.log());
    }

    fn netns(&self, client: &str) -> std::path::PathBuf {
        if client == CLIENT_B.name {
            client_b_netns(&self.lab)
        } else {
            netns_of(&self.lab, client)
        }
    }

    fn def(client: &str) -> &'static PodDef {
        if client == CLIENT_B.name {
            &CLIENT_B
        } else {
            pod_def(client)
        }
    }

    /// Live TCP connections from `client` to the server's `port`, IPv4 and IPv6.
    fn tcp(&self, client: &str, port: u16) -> Vec<Live> {
        let server = pod_def("server");
        [false, true]
            .into_iter()
            .map(|v6| {
                let to = if v6 {
                    format!("[{}]:{port}", server.v6)
                } else {
                    format!("{}:{port}", server.v4)
                };
                let (_, listener) = self.tcp.iter().find(|(k, _)| *k == (port, v6)).unwrap();
                Live::open(
                    &format!("TCP {client} → {to}"),
                    &self.netns(client),
                    listener,
                    to,
                )
            })
            .collect()
    }

    /// UDP flows from `client` to the server's `port`, IPv4 and IPv6.
    fn udp(&self, client: &str, port: u16) -> Vec<UdpFlow> {
        let def = Self::def(client);
        [false, true]
            .into_iter()
            .map(|v6| {
                let from = if v6 {
                    format!("[{}]:0", def.v6)
                } else {
                    format!("{}:0", def.v4)
                };
                let (_, server) = self.udp.iter().find(|(k, _)| *k == (port, v6)).unwrap();
                UdpFlow::open(
                    &format!("UDP {client} → {}", server.local_addr().unwrap()),
                    &self.netns(client),
                    &from,
                    server,
                )
            })
            .collect()
    }

    /// Every connection of `tcp` and flow of `udp` passes data both ways.
    fn assert_flowing(&self, tcp: &mut [Live], udp: &[UdpFlow], when: &str) {
        for l in tcp {
            l.assert_alive(when);
        }
        for f in udp {
            assert!(f.passes(), "{} {when}: should pass", f.what);
        }
    }

    /// Every connection of `tcp` is reset and every flow of `udp` stops passing, after the
    /// change made at `since`; each stays so.
    fn wait_ended(&mut self, tcp: &mut [Live], udp: &[UdpFlow], since: Instant) {
        for l in tcp {
            self.agent
                .wait_for(&format!("{} reset", l.what), TIMEOUT, || l.is_reset());
            self.reset_after.push(since.elapsed());
            assert!(
                l.echo().is_err(),
                "{}: passes again after its reset",
                l.what
            );
        }
        for f in udp {
            self.agent
                .wait_for(&format!("{} stopped", f.what), TIMEOUT, || !f.passes());
            assert!(!f.passes(), "{}: passes again after it stopped", f.what);
        }
    }

    /// Waits for `pod`'s revocation counter to reach `at_least`.
    fn wait_revoked(&mut self, pod: &str, at_least: f64) {
        let metrics = self.metrics;
        self.agent.wait_for(
            &format!("{at_least} revocations counted for {pod}"),
            TIMEOUT,
            || revoked_of(metrics, pod) >= at_least,
        );
    }
}

fn change_kinds(backend: Backend) {
    if !root_or_skip() {
        return;
    }
    let _lock = heavy_lock();
    let tag = format!("nwrk{}", &backend.as_str()[..1]);
    let prefix = unique_prefix(&tag);
    let mut lab_docs = vec![namespace_doc(), namespace_doc_with(NS_B, "team", "b")];
    lab_docs.extend(PODS.iter().map(|d| pod_doc(d, None)));
    lab_docs.push(pod_doc_in(NS_B, &CLIENT_B, None));
    let (lab, _) = lab_up(&prefix, &lab_docs);
    let server = netns_of(&lab, "server");
    let (v4, v6) = (pod_def("server").v4, pod_def("server").v6);
    let mut tcp = Vec::new();
    let mut udp = Vec::new();
    for port in [LIVE_PORT, LIVE_PORT2] {
        for (is_v6, addr) in [
            (false, format!("{v4}:{port}")),
            (true, format!("[{v6}]:{port}")),
        ] {
            tcp.push(((port, is_v6), listen(&server, &addr)));
            udp.push(((port, is_v6), udp_server(&server, &addr)));
        }
    }
    let dir = TempDir::new(&format!("revoke-{tag}"));
    let logs = TempDir::new(&format!("revoke-logs-{tag}"));
    let metrics = free_port();

    // 1. Monitor → enforce. The monitored policy allows client-ok and client-no at first.
    let monitored = |r: &[&str]| World::with(vec![server_in(roles(r), true)]);
    dir.write("world.yaml", &monitored(&["ok", "no"]).text(&lab));
    let agent = start_agent(backend, &dir, &logs, metrics, false);
    let log = logs.path.join("agent.log");
    let mut stage = Stage {
        lab,
        dir,
        agent,
        log,
        metrics,
        tcp,
        udp,
        reset_after: Vec::new(),
    };
    let log = stage.log.clone();
    stage
        .agent
        .wait_for("the monitored server programmed", TIMEOUT, || {
            !netwarden_leftovers(backend.as_str(), &server).is_empty() && changing_syncs(&log) > 0
        });
    let (mut ok, mut no) = (
        stage.tcp("client-ok", LIVE_PORT),
        stage.tcp("client-no", LIVE_PORT),
    );
    let (ok_udp, no_udp) = (
        stage.udp("client-ok", LIVE_PORT),
        stage.udp("client-no", LIVE_PORT),
    );
    stage.assert_flowing(&mut ok, &ok_udp, "before");
    stage.assert_flowing(&mut no, &no_udp, "before");
    // The monitored policy no longer allows client-no: an apply (the staged rules change) whose
    // revocation pass must end nothing, monitoring never denies.
    stage.set("the monitored edit applied", &monitored(&["ok"]));
    stage.assert_flowing(&mut no, &no_udp, "while monitored");
    stage.assert_flowing(&mut ok, &ok_udp, "while monitored");
    assert_eq!(
        revoked_of(metrics, "e2e/server"),
        0.0,
        "{}",
        stage.agent.log()
    );
    let promoted = Instant::now();
    stage.set(
        "the promotion applied",
        &World::with(vec![server_in(roles(&["ok"]), false)]),
    );
    stage.wait_ended(&mut no, &no_udp, promoted);
    stage.assert_flowing(&mut ok, &ok_udp, "after the promotion");
    // Two TCP connections and two UDP flows (entries of connections closed earlier may count
    // too).
    stage.wait_revoked("e2e/server", 4.0);
    let mut revoked = revoked_of(metrics, "e2e/server");
    drop((ok, no, ok_udp, no_udp));

    // 2. Namespace labels: the namespaces whose team is e2e or b; e2e-b's becomes c.
    let teams = json!([{"namespaceSelector": {"matchExpressions": [
        {"key": "team", "operator": "In", "values": ["e2e", "b"]}
    ]}}]);
    let mut world = World::with(vec![server_in(teams, false)]);
    stage.set("the namespace policy applied", &world);
    let (mut ok, mut b) = (
        stage.tcp("client-ok", LIVE_PORT),
        stage.tcp("client-b", LIVE_PORT),
    );
    stage.assert_flowing(&mut ok, &[], "before the namespace label change");
    stage.assert_flowing(&mut b, &[], "before the namespace label change");
    world.team_b = "c";
    let changed = Instant::now();
    stage.set("the namespace label change applied", &world);
    stage.wait_ended(&mut b, &[], changed);
    stage.assert_flowing(&mut ok, &[], "after the namespace label change");
    stage.wait_revoked("e2e/server", revoked + 2.0);
    revoked = revoked_of(metrics, "e2e/server");
    drop((ok, b));

    // 3. Peer IP, ipBlock: the lab's subnets, then client-no's addresses excepted.
    let no_def = pod_def("client-no");
    let blocks = |except: bool| {
        let (e4, e6) = if except {
            (
                json!([format!("{}/32", no_def.v4)]),
                json!([format!("{}/128", no_def.v6)]),
            )
        } else {
            (json!([]), json!([]))
        };
        World::with(vec![server_in(
            json!([
                {"ipBlock": {"cidr": "10.77.0.0/24", "except": e4}},
                {"ipBlock": {"cidr": "fd77::/64", "except": e6}},
            ]),
            false,
        )])
    };
    stage.set("the ipBlock policy applied", &blocks(false));
    let (mut ok, mut no) = (
        stage.tcp("client-ok", LIVE_PORT),
        stage.tcp("client-no", LIVE_PORT),
    );
    stage.assert_flowing(&mut ok, &[], "before the except");
    stage.assert_flowing(&mut no, &[], "before the except");
    let changed = Instant::now();
    stage.set("the except applied", &blocks(true));
    stage.wait_ended(&mut no, &[], changed);
    stage.assert_flowing(&mut ok, &[], "after the except");
    stage.wait_revoked("e2e/server", revoked + 2.0);
    revoked = revoked_of(metrics, "e2e/server");
    drop((ok, no));

    // 4. Peer IP, pod selector: client-no, known by its Pod object only, records other
    // addresses.
    let mut world = World::with(vec![server_in(roles(&["ok", "no"]), false)]);
    world.no_remote = Some((no_def.v4, no_def.v6));
    stage.set("the label policy applied", &world);
    let (mut ok, mut no) = (
        stage.tcp("client-ok", LIVE_PORT),
        stage.tcp("client-no", LIVE_PORT),
    );
    stage.assert_flowing(&mut ok, &[], "before the IP change");
    stage.assert_flowing(&mut no, &[], "before the IP change");
    world.no_remote = Some(MOVED);
    let changed = Instant::now();
    stage.set("the IP change applied", &world);
    stage.wait_ended(&mut no, &[], changed);
    stage.assert_flowing(&mut ok, &[], "after the IP change");
    stage.wait_revoked("e2e/server", revoked + 2.0);
    drop((ok, no));

    // 5. Egress: client-ok may reach the server on both ports, then on LIVE_PORT only. The
    // server has no policy left (its rules are removed: nothing revoked there).
    stage.set(
        "the egress policy applied",
        &World::with(vec![client_out(&[LIVE_PORT, LIVE_PORT2])]),
    );
    let (mut kept, mut ended) = (
        stage.tcp("client-ok", LIVE_PORT),
        stage.tcp("client-ok", LIVE_PORT2),
    );
    let (kept_udp, ended_udp) = (
        stage.udp("client-ok", LIVE_PORT),
        stage.udp("client-ok", LIVE_PORT2),
    );
    stage.assert_flowing(&mut kept, &kept_udp, "before the egress edit");
    stage.assert_flowing(&mut ended, &ended_udp, "before the egress edit");
    let changed = Instant::now();
    stage.set(
        "the egress edit applied",
        &World::with(vec![client_out(&[LIVE_PORT])]),
    );
    stage.wait_ended(&mut ended, &ended_udp, changed);
    stage.assert_flowing(&mut kept, &kept_udp, "after the egress edit");
    stage.wait_revoked("e2e/client-ok", 4.0);

    stage.agent.assert_running();
    println!(
        "{}: change → reset seen by the client (the agent polls files every 200 ms): {:?}",
        backend.as_str(),
        stage.reset_after
    );
}

#[test]
fn revoked_on_every_change_kind_nft() {
    change_kinds(Backend::Nft);
}

#[test]
fn revoked_on_every_change_kind_iptables() {
    change_kinds(Backend::Iptables);
}
