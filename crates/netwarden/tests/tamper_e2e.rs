//! Tamper repair by the agent end to end (`netwarden run -f DIR`), both backends, on a real
//! lab: a pod with NET_ADMIN in its own netns deletes or empties netwarden's rules; the agent
//! notices through the kernel's change notifications (the periodic comparison is set to an
//! hour, so it cannot be what repairs), puts the rules back, and reports it (a `tamper`
//! record in the events, `netwarden_rules_tampered_total{pod=…}`); the denied flow is refused
//! again. Then a tamper loop from inside the pod: every tamper is repaired, the agent stays
//! responsive (a policy edit for another pod still applies) and its CPU stays bounded.
//!
//! They need root (network namespaces); without it they skip, or fail when `CI=true`.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use netwarden_dataplane::Backend;
use netwarden_testing::{
    docs_text, free_port, heavy_lock, http_get, netwarden_leftovers, root_or_skip, run_in,
    sync_lines_in, unique_prefix, AgentProcess, TempDir,
};

const BIN: &str = env!("CARGO_BIN_EXE_netwarden");
const TIMEOUT: Duration = Duration::from_secs(10);

/// The tamper that removes everything netwarden programmed, as the pod would type it.
fn wipe(backend: Backend) -> &'static str {
    match backend {
        Backend::Nft => "nft delete table inet netwarden",
        Backend::Iptables => "iptables -F && iptables -X && ip6tables -F && ip6tables -X",
    }
}

fn has_rules(backend: Backend, netns: &Path) -> bool {
    !netwarden_leftovers(backend.as_str(), netns).is_empty()
}

/// The agent's CPU time so far (user + system), from `/proc/PID/stat`.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) ends with ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as u64;
    Duration::from_millis(ticks * 1000 / per_second)
}

fn tampered_total(metrics: std::net::SocketAddr, pod: &str) -> f64 {
    let text = http_get(metrics, "/metrics").unwrap_or_default();
    let prefix = format!("netwarden_rules_tampered_total{{pod=\"{pod}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
        .unwrap_or(0.0)
}

fn tamper_e2e(backend: Backend) {
    if !root_or_skip() {
        return;
    }
    let _lock = heavy_lock();
    let prefix = unique_prefix(&format!("nwtm{}", &backend.as_str()[..1]));
    let mut lab_docs = vec![namespace_doc()];
    lab_docs.extend(PODS.iter().map(|d| pod_doc(d, None)));
    let (lab, _) = lab_up(&prefix, &lab_docs);
    let (server, other) = (netns_of(&lab, "server"), netns_of(&lab, "other"));
    let dir = TempDir::new(&format!("tamper-{}", backend.as_str()));
    let logs = TempDir::new(&format!("tamper-logs-{}", backend.as_str()));
    let mut docs = vec![namespace_doc()];
    docs.extend(
        PODS.iter()
            .map(|d| pod_doc(d, Some(&netns_of(&lab, d.name)))),
    );
    dir.write("pods.yaml", &docs_text(&docs));
    let policy = |name: &str, target: &str, roles: &[&str]| {
        docs_text(&[ingress_policy(name, target, roles, false)])
    };
    dir.write("server.yaml", &policy("server-in", "server", &["ok"]));
    dir.write("other.yaml", &policy("other-in", "other", &["ok"]));

    let events = logs.path.join("events.jsonl");
    let metrics = free_port();
    let (dir_arg, events_arg, metrics_arg) = (
        dir.path.display().to_string(),
        events.display().to_string(),
        metrics.to_string(),
    );
    let args = [
        "run",
        "-f",
        &dir_arg,
        "--interval",
        "200ms",
        "--backend",
        backend.as_str(),
        "--no-events-stdout",
        "--events-file",
        &events_arg,
        "--metrics-addr",
        &metrics_arg,
        // Only the kernel's notifications can repair within this test.
        "--verify-interval",
        "1h",
    ];
    let log = logs.path.join("agent.log");
    let mut agent = AgentProcess::start_with_env(BIN, &args, &[("RUST_LOG", "info")], &log);
    agent.wait_for("both pods programmed", TIMEOUT, || {
        has_rules(backend, &server) && has_rules(backend, &other)
    });
    // Both families are in once the first sync is logged (iptables: one restore each).
    agent.wait_for("the first sync is logged", TIMEOUT, || {
        !sync_lines_in(&log).is_empty()
    });
    assert_probes(&lab, &probes("client-no", "server"), false, "denied");
    let programmed = netwarden_leftovers(backend.as_str(), &server);

    // 1. One tamper: repaired, reported, the flow refused again.
    let start = Instant::now();
    let out = run_in(&server, "sh", &["-c", wipe(backend)]);
    assert!(out.status.success(), "{out:?}");
    agent.wait_for("the rules are put back", TIMEOUT, || {
        netwarden_leftovers(backend.as_str(), &server) == programmed
    });
    println!(
        "{}: wipe → rules back (polled every 10 ms by the test): {:?}",
        backend.as_str(),
        start.elapsed()
    );
    assert_probes(&lab, &probes("client-no", "server"), false, "denied again");
    assert_probes(&lab, &probes("client-ok", "server"), true, "allowed again");
    agent.wait_for("a tamper record in the events", TIMEOUT, || {
        std::fs::read_to_string(&events).is_ok_and(|t| {
            t.lines().any(|l| {
                l.contains("\"record\":\"tamper\"")
                    && l.contains("\"pod\":\"e2e/server\"")
                    && l.contains("\"repaired\":true")
            })
        })
    });
    agent.wait_for("the tamper counted", TIMEOUT, || {
        tampered_total(metrics, "e2e/server") >= 1.0
    });
    assert!(
        agent.log().contains("changed by someone else"),
        "a log line says so:\n{}",
        agent.log()
    );

    // 2. A tamper loop (1,000 tampers) from inside the pod while the agent serves the other pod.
    let cpu_before = cpu_time(agent.pid());
    let loop_start = Instant::now();
    let script = format!(
        "for i in $(seq 1 1000); do {{ {}; }} 2>/dev/null; done; true",
        wipe(backend)
    );
    let tamperer = std::process::Command::new("ip")
        .args(["netns", "exec"])
        .arg(server.file_name().unwrap())
        .args(["sh", "-c", &script])
        .spawn()
        .unwrap();
    // Meanwhile a policy change for the other pod takes effect as usual.
    let edit = Instant::now();
    dir.write("other.yaml", &policy("other-in", "other", &["ok", "no"]));
    agent.wait_for(
        "the other pod's edit applies during the loop",
        TIMEOUT,
        || {
            lab.probe(&probes("client-no", "other"))
                .iter()
                .all(|o| o.connected)
        },
    );
    let edit_latency = edit.elapsed();
    let status = tamperer.wait_with_output().unwrap().status;
    assert!(status.success());
    let loop_time = loop_start.elapsed();
    agent.wait_for("the rules are back after the loop", TIMEOUT, || {
        netwarden_leftovers(backend.as_str(), &server) == programmed
    });
    assert_probes(
        &lab,
        &probes("client-no", "server"),
        false,
        "denied after the loop",
    );
    agent.assert_running();
    let cpu = cpu_time(agent.pid()) - cpu_before;
    let wall = loop_start.elapsed();
    let repairs = tampered_total(metrics, "e2e/server");
    println!(
        "{}: 1,000 tampers in {loop_time:?}; other pod's edit applied after {edit_latency:?}; \
         agent CPU {cpu:?} over {wall:?}; repairs counted {repairs}",
        backend.as_str()
    );
    // Bounded: the agent never spins a core for the whole loop (it has two threads doing
    // work at most; one whole core for the loop's length would be `wall`).
    assert!(
        cpu < wall.mul_f64(0.9) + Duration::from_secs(1),
        "agent CPU {cpu:?} over {wall:?}"
    );
    assert!(
        repairs >= 2.0,
        "the loop's tampers were repaired: {repairs}"
    );
    // The records are rate-limited like the log line (one per pod per 10 s, with the count of
    // the others), the counter counts every repair.
    let records: Vec<serde_json::Value> = std::fs::read_to_string(&events)
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"record\":\"tamper\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let bound = 2 + (wall.as_secs() / 10) as usize;
    assert!(
        records.len() <= bound,
        "{} tamper records for {repairs} repairs in {wall:?}",
        records.len()
    );
    let recorded: u64 = records
        .iter()
        .map(|r| 1 + r["repeats"].as_u64().unwrap())
        .sum();
    assert!(recorded as f64 <= repairs, "{recorded} > {repairs}");
}

#[test]
fn tamper_repaired_by_the_agent_nft() {
    tamper_e2e(Backend::Nft);
}

#[test]
fn tamper_repaired_by_the_agent_iptables() {
    tamper_e2e(Backend::Iptables);
}
