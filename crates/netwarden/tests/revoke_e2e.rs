//! Revocation by the agent end to end (`netwarden run -f DIR`, SPEC 5), both backends, on a
//! real lab: live TCP connections to the server (IPv4 and IPv6) from `client-ok` and
//! `client-no`, both allowed at first; a policy edit that no longer allows `client-no` ends its
//! connections (reset) within a second of the apply while `client-ok`'s keep passing; then a
//! label change that takes `client-ok` out of the allowed peers ends its connections too. The
//! log and `netwarden_connections_revoked_total{pod="e2e/server"}` say so. With
//! `--established keep` the same edit ends nothing.
//!
//! They need root (network namespaces); without it they skip, or fail when `CI=true`.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use netwarden_dataplane::Backend;
use netwarden_testing::{
    connect, docs_text, free_port, heavy_lock, http_get, in_netns, listen, netwarden_leftovers,
    root_or_skip, unique_prefix, AgentProcess, TempDir,
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

fn revoked_total(metrics: std::net::SocketAddr) -> f64 {
    let text = http_get(metrics, "/metrics").unwrap_or_default();
    let prefix = "netwarden_connections_revoked_total{pod=\"e2e/server\"} ";
    text.lines()
        .find_map(|l| l.strip_prefix(prefix)?.trim().parse().ok())
        .unwrap_or(0.0)
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
    let mut agent = AgentProcess::start_with_env(
        BIN,
        &args,
        &[("RUST_LOG", "info")],
        &logs.path.join("agent.log"),
    );
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
