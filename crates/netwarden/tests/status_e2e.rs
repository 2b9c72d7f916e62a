//! Promotion evidence end to end (issue 9, "promotion with evidence"): the standalone agent
//! (`netwarden run -f DIR`) on a real dual-stack lab, for both backends, writes `status`
//! records whose kernel counters follow real connections, and `netwarden report` turns them
//! into the verdict:
//!
//! - a monitored policy on `server` (allowing `role=ok`): before any traffic the records say
//!   0 connections (counted, not `null`) and the report says "no traffic";
//! - `client-ok` connects (TCP and UDP, IPv4 and IPv6): the records count exactly those 4 new
//!   connections, no would-deny, nothing rate-limited, and the report says ready to promote;
//! - `client-no` connects the same way: 4 would-denies, which the kernel counts whether or not
//!   the rate limit (1 message a minute here) let them reach the log: would-deny events plus
//!   rate-limit suppressions make 4, the connections 8, and the report says not ready, naming
//!   the would-denies and the lost events.
//!
//! `promote --require-ready --dry-run` follows the report: accepted when ready, refused after.
//! The same runs with a monitored admin policy instead (SPEC 8): a ClusterNetworkPolicy whose
//! Admin-tier Deny names `role=no`, counted in the kernel's tier chains, its records and report
//! row named `ClusterNetworkPolicy/server-in`.
//!
//! They need root (network namespaces); without it they skip, or fail when `CI=true`.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use netwarden_dataplane::Backend;
use netwarden_testing::{
    docs_text, heavy_lock, root_or_skip, unique_prefix, AgentProcess, TempDir,
};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_netwarden");
const TIMEOUT: Duration = Duration::from_secs(15);
/// The evidence window given to `report`: the policy must be watched this long first.
const CLEAN_FOR_SECS: u64 = 3;

/// Which monitored policy the run watches.
#[derive(Clone, Copy)]
enum Monitored {
    /// A NetworkPolicy of `server`: `role=ok` may connect on `PORT`.
    Namespaced,
    /// A ClusterNetworkPolicy (Admin tier) of `server`: `role=no` denied.
    Admin,
}

impl Monitored {
    fn policy(self) -> Value {
        let mut policy = match self {
            Monitored::Namespaced => ingress_policy("server-in", "server", &["ok"], false),
            Monitored::Admin => json!({
                "apiVersion": "policy.networking.k8s.io/v1alpha2",
                "kind": "ClusterNetworkPolicy",
                "metadata": {"name": "server-in"},
                "spec": {
                    "tier": "Admin",
                    "priority": 10,
                    "subject": {"pods": {
                        "namespaceSelector": {"matchLabels": {"team": "e2e"}},
                        "podSelector": {"matchLabels": {"app": "server"}},
                    }},
                    "ingress": [{
                        "name": "no-role-no",
                        "action": "Deny",
                        "from": [{"pods": {
                            "namespaceSelector": {},
                            "podSelector": {"matchLabels": {"role": "no"}},
                        }}],
                    }],
                },
            }),
        };
        policy["metadata"]["annotations"] = json!({"netwarden.io/mode": "monitor"});
        policy
    }

    /// How events, status records and `report` name it (and `promote` takes it).
    fn name(self) -> String {
        match self {
            Monitored::Namespaced => format!("{NS}/server-in"),
            Monitored::Admin => "ClusterNetworkPolicy/server-in".into(),
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Monitored::Namespaced => "NetworkPolicy",
            Monitored::Admin => "ClusterNetworkPolicy",
        }
    }
}

/// The status records of `policy` in the events file, in order.
fn status_records(events: &Path, policy: &str) -> Vec<Value> {
    std::fs::read_to_string(events)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["record"] == "status" && v["policy"] == policy)
        .collect()
}

/// Would-deny events in the events file.
fn would_deny_events(events: &Path) -> usize {
    std::fs::read_to_string(events)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["action"] == "would-deny")
        .count()
}

fn count(record: &Value, field: &str) -> Option<u64> {
    record[field].as_u64()
}

/// `netwarden report -e EVENTS --clean-for 3s -o json`: the row of `policy`.
fn report_row(events: &Path, policy: &str) -> Value {
    let out = Command::new(BIN)
        .args(["report", "-e"])
        .arg(events)
        .args(["--clean-for", &format!("{CLEAN_FOR_SECS}s"), "-o", "json"])
        .output()
        .expect("run netwarden report");
    assert!(
        out.status.success(),
        "report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("report JSON");
    report["policies"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["policy"] == policy).cloned())
        .unwrap_or_else(|| panic!("no row for {policy} in {report}"))
}

/// `netwarden promote POLICY -f OBJECTS --require-ready -e EVENTS --clean-for 3s --dry-run`:
/// whether it accepted, and what it said.
fn promote_ready(policy: &str, objects: &Path, events: &Path) -> (bool, String) {
    let out = Command::new(BIN)
        .args(["promote", policy, "-f"])
        .arg(objects)
        .args(["--require-ready", "-e"])
        .arg(events)
        .args(["--clean-for", &format!("{CLEAN_FOR_SECS}s"), "--dry-run"])
        .output()
        .expect("run netwarden promote");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

fn failing_kinds(row: &Value) -> Vec<String> {
    row["failing"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|f| f["condition"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn status_evidence(backend: Backend, monitored: Monitored) {
    if !root_or_skip() {
        return;
    }
    let _lock = heavy_lock();
    let prefix = unique_prefix(&format!("nwst{}", &backend.as_str()[..1]));
    let mut lab_docs = vec![namespace_doc()];
    lab_docs.extend(PODS.iter().map(|d| pod_doc(d, None)));
    let (lab, _) = lab_up(&prefix, &lab_docs);
    let dir = TempDir::new(&format!("status-{}", backend.as_str()));
    let logs = TempDir::new(&format!("status-logs-{}", backend.as_str()));
    let mut docs = vec![namespace_doc()];
    docs.extend(
        PODS.iter()
            .map(|d| pod_doc(d, Some(&netns_of(&lab, d.name)))),
    );
    docs.push(monitored.policy());
    let policy = monitored.name();
    let objects = dir.path.join("objects.yaml");
    dir.write("objects.yaml", &docs_text(&docs));
    let events = logs.path.join("events.jsonl");
    let events_arg = events.display().to_string();
    let dir_arg = dir.path.display().to_string();
    let mut agent = AgentProcess::start_with_env(
        BIN,
        &[
            "run",
            "-f",
            &dir_arg,
            "--interval",
            "200ms",
            "--backend",
            backend.as_str(),
            "--events-file",
            &events_arg,
            "--status-interval",
            "500ms",
            "--log-rate",
            "1",
            "--node",
            "node-e2e",
        ],
        &[("RUST_LOG", "info")],
        &logs.path.join("agent.log"),
    );
    let what = format!("{} backend, {policy}", backend.as_str());
    let status_records = |events: &Path| status_records(events, &policy);
    let report_row = |events: &Path| report_row(events, &policy);

    // 1. Watched, no traffic yet: counted zero, and the verdict says so.
    agent.wait_for("a status record watched for the window", TIMEOUT, || {
        status_records(&events).last().is_some_and(|r| {
            let (Some(t), Some(since)) = (r["time"].as_str(), r["monitored_since"].as_str()) else {
                return false;
            };
            seconds_between(since, t) > CLEAN_FOR_SECS as f64 + 0.5
        })
    });
    let last = status_records(&events).pop().expect("a record");
    assert_eq!(
        (
            count(&last, "connections"),
            count(&last, "rate_limited"),
            count(&last, "would_deny"),
            count(&last, "pods")
        ),
        (Some(0), Some(0), Some(0), Some(1)),
        "{what}: before any traffic: {last}"
    );
    assert_eq!(last["kind"], monitored.kind(), "{what}: {last}");
    let row = report_row(&events);
    assert_eq!(row["status"], "not-ready", "{what}: {row}");
    assert_eq!(failing_kinds(&row), ["no-traffic"], "{what}: {row}");

    // 2. Allowed traffic: 4 connections counted by the kernel, nothing else; ready.
    assert_probes(&lab, &probes("client-ok", "server"), true, "allowed client");
    agent.wait_for("the 4 allowed connections counted", TIMEOUT, || {
        status_records(&events)
            .last()
            .is_some_and(|r| count(r, "connections") == Some(4))
    });
    let last = status_records(&events).pop().expect("a record");
    assert_eq!(
        (count(&last, "rate_limited"), count(&last, "would_deny")),
        (Some(0), Some(0)),
        "{what}: after allowed traffic: {last}"
    );
    let row = report_row(&events);
    assert_eq!(row["status"], "ready-to-promote", "{what}: {row}");
    assert_eq!(row["evidence"]["connections"], 4, "{what}: {row}");
    let (accepted, said) = promote_ready(&policy, &objects, &events);
    assert!(accepted, "{what}: promote --require-ready: {said}");
    assert!(said.contains("ready to promote"), "{what}: {said}");

    // 3. Traffic the policy would deny (monitored: it flows): every would-deny counted in
    // the kernel, logged or suppressed by the 1-a-minute limit.
    assert_probes(
        &lab,
        &probes("client-no", "server"),
        true,
        "monitored: would-denied traffic still flows",
    );
    agent.wait_for("the 8 connections counted", TIMEOUT, || {
        status_records(&events)
            .last()
            .is_some_and(|r| count(r, "connections") == Some(8))
    });
    agent.wait_for("the logged would-denies counted as events", TIMEOUT, || {
        let last = status_records(&events).pop();
        last.is_some_and(|r| {
            let logged = count(&r, "would_deny").unwrap_or(0);
            let limited = count(&r, "rate_limited").unwrap_or(0);
            logged + limited == 4 && logged as usize == would_deny_events(&events)
        })
    });
    let last = status_records(&events).pop().expect("a record");
    let limited = count(&last, "rate_limited").unwrap_or(0);
    // nft: one limit per pod and direction (burst 1: 1 logged, 3 suppressed); iptables: one
    // per rule and family (1 logged per family).
    let expected_limited = match backend {
        Backend::Nft => 3,
        Backend::Iptables => 2,
    };
    assert_eq!(limited, expected_limited, "{what}: {last}");
    let row = report_row(&events);
    assert_eq!(row["status"], "not-ready", "{what}: {row}");
    let failing = failing_kinds(&row);
    assert!(
        failing.contains(&"would-deny".to_string()) && failing.contains(&"events-lost".to_string()),
        "{what}: {row}"
    );
    let (accepted, said) = promote_ready(&policy, &objects, &events);
    assert!(!accepted, "{what}: promote --require-ready: {said}");
    assert!(said.contains("is not ready to promote"), "{what}: {said}");
    agent.assert_running();
}

/// Seconds from RFC 3339 timestamp `a` to `b`.
fn seconds_between(a: &str, b: &str) -> f64 {
    let parse = |s: &str| {
        netwarden_monitor::Timestamp::parse_rfc3339(s).unwrap_or_else(|| panic!("timestamp {s}"))
    };
    parse(b).since(parse(a)).as_secs_f64()
}

#[test]
fn status_evidence_nft() {
    status_evidence(Backend::Nft, Monitored::Namespaced);
}

#[test]
fn status_evidence_iptables() {
    status_evidence(Backend::Iptables, Monitored::Namespaced);
}

#[test]
fn status_evidence_admin_nft() {
    status_evidence(Backend::Nft, Monitored::Admin);
}

#[test]
fn status_evidence_admin_iptables() {
    status_evidence(Backend::Iptables, Monitored::Admin);
}
