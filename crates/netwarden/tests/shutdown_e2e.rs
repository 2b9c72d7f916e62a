//! SIGTERM stops the agent within its grace period whatever it is doing (issue 20, defect 6):
//!
//! - in the middle of a long sync (40 pod netns, each apply held up 2 s by the dataplane's
//!   test hook, eight at a time: ten seconds of sync), the agent stops between two netns
//!   applies and exits cleanly, long before the sync would have ended;
//! - stuck in an apply that does not return (held up a minute), the watchdog ends the process
//!   once `--shutdown-timeout` passed.
//!
//! Every netns touched keeps whole rules or none: nothing is half applied either way (each
//! netns apply is one atomic transaction). Needs root (network namespaces); skips without it,
//! fails with `CI=true`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use netwarden_dataplane::nft_apply::SLOW_APPLY_ENV;
use netwarden_testing::{
    docs_text, root_or_skip, run_in_with_input, AgentProcess, Namespaces, TempDir,
};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_netwarden");

/// `n` pod netns, each with an interface `eth0` holding `10.231.98.<i+1>` (the other end of
/// its veth stays inside without an address), and the manifests: the pods and a policy
/// isolating all of them.
fn cluster(tag: &str, n: usize, dir: &TempDir) -> (Namespaces, Vec<PathBuf>) {
    let mut nss = Namespaces::new(tag);
    let mut docs =
        vec![json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "s"}})];
    let mut paths = Vec::new();
    for i in 0..n {
        let path = nss.create(&format!("p{i}"));
        let ip = format!("10.231.98.{}", i + 1);
        let batch = format!(
            "link add eth0 type veth peer name eth0p\naddr add {ip}/24 dev eth0\n\
             link set eth0p up\nlink set eth0 up\n"
        );
        let out = run_in_with_input(&path, "ip", &["-batch", "-"], batch.as_bytes());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        docs.push(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("p{i}"), "namespace": "s",
                         "annotations": {"netwarden.io/netns": path.display().to_string()}},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"podIPs": [{"ip": ip}]},
        }));
        paths.push(path);
    }
    docs.push(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "in", "namespace": "s"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"ipBlock": {"cidr": "10.231.99.0/24"}}],
                              "ports": [{"port": 8080}]}]},
    }));
    dir.write("cluster.yaml", &docs_text(&docs));
    (nss, paths)
}

fn has_table(netns: &Path) -> bool {
    let out = netwarden_testing::run_in(netns, "nft", &["list", "tables"]);
    String::from_utf8_lossy(&out.stdout).contains("inet netwarden")
}

/// Starts the agent with every netns apply held up `slow`, and `--shutdown-timeout timeout`.
fn start(dir: &TempDir, slow: Duration, timeout: &str) -> AgentProcess {
    let slow_ms = slow.as_millis().to_string();
    let path = dir.path.display().to_string();
    AgentProcess::start_with_env(
        BIN,
        &[
            "run",
            "-f",
            &path,
            "--interval",
            "200ms",
            "--no-events-stdout",
            "--shutdown-timeout",
            timeout,
        ],
        &[
            ("RUST_LOG", "info,netwarden_agent::sync=debug"),
            (SLOW_APPLY_ENV, slow_ms.as_str()),
        ],
        &dir.path.join("agent.log"),
    )
}

/// Sends SIGTERM to the agent; waits at most `limit` for it to exit: (how long it took, its
/// exit code).
fn terminate(agent: &mut AgentProcess, limit: Duration) -> (Duration, Option<i32>) {
    let sent = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    loop {
        if let Some(status) = agent.child.try_wait().expect("try_wait") {
            return (sent.elapsed(), status.code());
        }
        assert!(
            sent.elapsed() < limit,
            "the agent still runs {limit:?} after SIGTERM; log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_stops_a_long_sync_between_two_netns() {
    if !root_or_skip() {
        return;
    }
    let dir = TempDir::new("nwsd-long");
    let (_nss, netns) = cluster("nwsdl", 40, &dir);
    let slow = Duration::from_secs(2);
    // A watchdog far away: what stops the agent here is the sync giving up between netns.
    let mut agent = start(&dir, slow, "60s");
    agent.wait_for("the first netns applied", Duration::from_secs(30), || {
        netns.iter().any(|n| has_table(n))
    });
    // Ten seconds of sync (5 rounds of 8 netns, 2 s each), one round done: stopping between
    // two netns takes at most the round under way.
    let (took, code) = terminate(&mut agent, Duration::from_secs(20));
    let log = agent.log();
    assert_eq!(code, Some(0), "a clean stop; log:\n{log}");
    assert!(
        took < slow + Duration::from_secs(2),
        "stopped {took:?} after SIGTERM: a sync must stop between two netns; log:\n{log}"
    );
    let programmed = netns.iter().filter(|n| has_table(n)).count();
    assert!(
        programmed < netns.len(),
        "the sync was cut short ({programmed} of {} netns programmed); log:\n{log}",
        netns.len()
    );
    assert!(log.contains("stopping"), "{log}");
}

#[test]
fn sigterm_ends_an_agent_stuck_in_an_apply_at_the_deadline() {
    if !root_or_skip() {
        return;
    }
    let dir = TempDir::new("nwsd-stuck");
    let (_nss, netns) = cluster("nwsds", 2, &dir);
    // Each apply "hangs" a minute; the watchdog ends the process 2 s after SIGTERM.
    let mut agent = start(&dir, Duration::from_secs(60), "2s");
    agent.wait_for("the sync under way", Duration::from_secs(30), || {
        agent_log(&dir).contains("applying")
    });
    let (took, code) = terminate(&mut agent, Duration::from_secs(20));
    let log = agent.log();
    assert_eq!(
        code,
        Some(netwarden_agent::shutdown::FORCED_EXIT),
        "ended by the watchdog; log:\n{log}"
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(6),
        "ended {took:?} after SIGTERM (deadline 2 s); log:\n{log}"
    );
    assert!(log.contains("exiting"), "{log}");
    // Nothing was half applied: no netns got a table (each apply was still held up).
    assert!(netns.iter().all(|n| !has_table(n)), "{log}");
}

fn agent_log(dir: &TempDir) -> String {
    std::fs::read_to_string(dir.path.join("agent.log")).unwrap_or_default()
}
