//! The standalone agent end to end (`netwarden run -f DIR`, `netwarden apply -f DIR`), on a
//! real lab, for both backends:
//!
//! - pods carry `netwarden.io/netns: <lab netns>`; the agent programs them and a denied flow is
//!   refused;
//! - editing a policy file re-applies only the pods the change affects, and the flow opens;
//! - deleting the policy file removes the rules from the pod netns;
//! - rules survive the agent being killed; a restarted agent converges (changes made while it
//!   was down included, stale rules removed) without error, to the same rules as before;
//! - `netwarden apply -f DIR` programs everything in one pass and exits 0.
//!
//! They need root (network namespaces); without it they skip, or fail when `CI=true`.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use netwarden_dataplane::Backend;
use netwarden_lab::Lab;
use netwarden_testing::{
    docs_text, heavy_lock, named_netns_with_prefix, netwarden_leftovers, root_or_skip,
    rules_snapshot, sync_lines, sync_lines_in, unique_prefix, AgentProcess, Namespaces, SyncLine,
    TempDir,
};

const BIN: &str = env!("CARGO_BIN_EXE_netwarden");
const TIMEOUT: Duration = Duration::from_secs(10);

/// `netwarden run -f <dir>` with a short interval, its log in `log`.
fn start_agent(dir: &Path, backend: Backend, log: &Path) -> AgentProcess {
    let dir = dir.display().to_string();
    let args = [
        "run",
        "-f",
        &dir,
        "--interval",
        "200ms",
        "--backend",
        backend.as_str(),
    ];
    AgentProcess::start_with_env(BIN, &args, &[("RUST_LOG", "info")], log)
}

/// The manifest directory: namespace and pods (annotated with their lab netns) in `pods.yaml`,
/// one file per policy.
fn write_pods(dir: &TempDir, lab: &Lab) {
    let mut docs = vec![namespace_doc()];
    docs.extend(
        PODS.iter()
            .map(|d| pod_doc(d, Some(&netns_of(lab, d.name)))),
    );
    dir.write("pods.yaml", &docs_text(&docs));
}

fn write_policy(dir: &TempDir, file: &str, name: &str, target: &str, roles: &[&str]) {
    dir.write(
        file,
        &docs_text(&[ingress_policy(name, target, roles, false)]),
    );
}

fn has_rules(backend: Backend, netns: &Path) -> bool {
    !netwarden_leftovers(backend.as_str(), netns).is_empty()
}

fn agent_e2e(backend: Backend) {
    if !root_or_skip() {
        return;
    }
    let _lock = heavy_lock();
    let prefix = unique_prefix(&format!("nwag{}", &backend.as_str()[..1]));
    let mut lab_docs = vec![namespace_doc()];
    lab_docs.extend(PODS.iter().map(|d| pod_doc(d, None)));
    let (lab, _) = lab_up(&prefix, &lab_docs);
    let (server, other) = (netns_of(&lab, "server"), netns_of(&lab, "other"));
    let total = PODS.len();
    let dir = TempDir::new(&format!("agent-{}", backend.as_str()));
    let logs = TempDir::new(&format!("agent-logs-{}", backend.as_str()));
    write_pods(&dir, &lab);
    write_policy(&dir, "server-policy.yaml", "server-in", "server", &["ok"]);
    write_policy(&dir, "other-policy.yaml", "other-in", "other", &["ok"]);

    // 1. Start: every pod considered, the two isolated ones programmed.
    let mut agent = start_agent(&dir.path, backend, &logs.path.join("run1.log"));
    agent.wait_for("the first sync programs both pods", TIMEOUT, || {
        has_rules(backend, &server) && has_rules(backend, &other)
    });
    agent.wait_for("the first sync is logged", TIMEOUT, || {
        !sync_lines_in(&logs.path.join("run1.log")).is_empty()
    });
    let first = sync_lines(&agent.log())[0];
    assert_eq!(
        first,
        SyncLine {
            considered: total,
            applied: 2,
            removed: 0,
            errors: 0
        },
        "first sync; log:\n{}",
        agent.log()
    );
    assert_probes(
        &lab,
        &probes("client-no", "server"),
        false,
        "denied by the agent's rules",
    );
    assert_probes(
        &lab,
        &probes("client-ok", "server"),
        true,
        "allowed by the agent's rules",
    );
    let server_rules = rules_snapshot(backend.as_str(), &server);
    let other_rules = rules_snapshot(backend.as_str(), &other);

    // 2. Edit the server's policy: the denied client becomes allowed; only the server is
    // re-applied.
    write_policy(
        &dir,
        "server-policy.yaml",
        "server-in",
        "server",
        &["ok", "no"],
    );
    agent.wait_for("the edited policy lets client-no in", TIMEOUT, || {
        lab.probe(&probes("client-no", "server"))
            .iter()
            .all(|o| o.connected)
    });
    assert_probes(&lab, &probes("client-ok", "server"), true, "still allowed");
    assert_probes(
        &lab,
        &probes("client-no", "other"),
        false,
        "other unchanged",
    );
    assert_eq!(
        rules_snapshot(backend.as_str(), &other),
        other_rules,
        "other's rules were touched"
    );
    // The rules are in before the agent logs its report: wait for the line too.
    let run1 = logs.path.join("run1.log");
    agent.wait_for("the second sync is logged", TIMEOUT, || {
        sync_lines_in(&run1).len() >= 2
    });
    let syncs = sync_lines(&agent.log());
    assert_eq!(syncs.len(), 2, "one edit, one sync: {syncs:?}");
    let second = syncs[1];
    assert!(
        second.considered < total && second.applied == 1 && second.errors == 0,
        "the edit should re-apply the server only: {second:?}; log:\n{}",
        agent.log()
    );

    // 3. Delete the server's policy: its rules go, the other pod keeps its own.
    dir.remove("server-policy.yaml");
    agent.wait_for("the server's rules are removed", TIMEOUT, || {
        !has_rules(backend, &server)
    });
    assert_eq!(
        netwarden_leftovers(backend.as_str(), &server),
        Vec::<String>::new()
    );
    assert!(has_rules(backend, &other));
    agent.wait_for("the third sync is logged", TIMEOUT, || {
        sync_lines_in(&run1).len() >= 3
    });
    let syncs = sync_lines(&agent.log());
    assert_eq!(syncs.len(), 3, "one deletion, one sync: {syncs:?}");
    let third = syncs[2];
    assert!(
        third.considered < total && third.removed == 1 && third.errors == 0,
        "the deletion should remove the server's rules only: {third:?}; log:\n{}",
        agent.log()
    );
    assert_probes(
        &lab,
        &probes("client-no", "server"),
        true,
        "server open again",
    );
    agent.assert_running();
    println!(
        "{} agent: syncs of the first run: {syncs:?}",
        backend.as_str()
    );

    // 4. Kill the agent: the rules stay. Change the manifests while it is down (the server's
    // policy back, the other's policy gone), restart: it converges without error.
    agent.kill();
    assert!(has_rules(backend, &other), "rules must survive the agent");
    assert_probes(
        &lab,
        &probes("client-no", "other"),
        false,
        "enforced with the agent down",
    );
    write_policy(&dir, "server-policy.yaml", "server-in", "server", &["ok"]);
    dir.remove("other-policy.yaml");
    let mut agent = start_agent(&dir.path, backend, &logs.path.join("run2.log"));
    agent.wait_for("the restarted agent syncs", TIMEOUT, || {
        !sync_lines_in(&logs.path.join("run2.log")).is_empty()
    });
    let restart = sync_lines(&agent.log())[0];
    assert!(
        restart.considered == total && restart.applied == 1 && restart.errors == 0,
        "restart sync {restart:?}; log:\n{}",
        agent.log()
    );
    assert_eq!(
        rules_snapshot(backend.as_str(), &server),
        server_rules,
        "server rules after restart"
    );
    assert_eq!(
        netwarden_leftovers(backend.as_str(), &other),
        Vec::<String>::new(),
        "stale rules of other"
    );
    assert_probes(&lab, &probes("client-no", "server"), false, "after restart");
    assert_probes(&lab, &probes("client-ok", "server"), true, "after restart");
    assert_probes(
        &lab,
        &probes("client-no", "other"),
        true,
        "other open after restart",
    );
    // Nothing changes: no further sync happens.
    std::thread::sleep(Duration::from_millis(600));
    agent.assert_running();
    assert_eq!(
        sync_lines(&agent.log()).len(),
        1,
        "idle agent synced again:\n{}",
        agent.log()
    );
    agent.kill();
    drop(agent);

    // 5. `netwarden apply` (one pass): programs every pod and exits 0.
    write_policy(&dir, "other-policy.yaml", "other-in", "other", &["ok"]);
    {
        use netwarden_dataplane::{Dataplane, IptablesDataplane, NftDataplane};
        let options = netwarden_render::RenderOptions::default();
        match backend {
            Backend::Nft => NftDataplane::new(options).remove(&server),
            Backend::Iptables => IptablesDataplane::new(options).remove(&server),
        }
        .expect("clear the server's rules");
    }
    assert!(!has_rules(backend, &server));
    let out = Command::new(BIN)
        .args(["apply", "-f"])
        .arg(&dir.path)
        .args(["--backend", backend.as_str()])
        .env("NO_COLOR", "1")
        .output()
        .expect("run netwarden apply");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "netwarden apply failed: {}\n{stderr}",
        out.status
    );
    assert_eq!(
        sync_lines(&stderr),
        vec![SyncLine {
            considered: total,
            applied: 2,
            removed: 0,
            errors: 0
        }],
        "{stderr}"
    );
    assert_eq!(
        rules_snapshot(backend.as_str(), &server),
        server_rules,
        "server rules after apply"
    );
    assert_eq!(
        rules_snapshot(backend.as_str(), &other),
        other_rules,
        "other rules after apply"
    );
    assert_probes(&lab, &probes("client-no", "server"), false, "after apply");
    assert_probes(&lab, &probes("client-no", "other"), false, "after apply");

    lab.down().expect("lab down");
    assert_eq!(named_netns_with_prefix(&prefix), Vec::<String>::new());
}

/// A pod whose netns does not exist yet when the agent starts (its sync fails) is programmed
/// once the netns appears, without any manifest change: failed pods are retried.
fn agent_retries_failed_pods(backend: Backend) {
    if !root_or_skip() {
        return;
    }
    let _lock = heavy_lock();
    let mut namespaces = Namespaces::new(&format!("nwrt{}", &backend.as_str()[..1]));
    let prefix = namespaces.prefix().to_string();
    let path = namespaces.path("late");
    assert!(!path.exists(), "{} already exists", path.display());
    let dir = TempDir::new(&format!("retry-{}", backend.as_str()));
    let logs = TempDir::new(&format!("retry-logs-{}", backend.as_str()));
    let docs = vec![namespace_doc(), pod_doc(pod_def("server"), Some(&path))];
    dir.write("pods.yaml", &docs_text(&docs));
    write_policy(&dir, "server-policy.yaml", "server-in", "server", &["ok"]);

    let log = logs.path.join("run.log");
    let mut agent = start_agent(&dir.path, backend, &log);
    agent.wait_for("the first sync is logged", TIMEOUT, || {
        !sync_lines_in(&log).is_empty()
    });
    let first = sync_lines(&agent.log())[0];
    assert_eq!((first.considered, first.errors), (1, 1), "{}", agent.log());

    // The pod's netns appears (as when a CNI finishes after the pod object was written).
    namespaces.create("late");
    agent.wait_for("the late netns is programmed", TIMEOUT, || {
        has_rules(backend, &path)
    });
    // The rules are in before the agent logs its report: wait for the line too.
    agent.wait_for("the successful retry is logged", TIMEOUT, || {
        sync_lines_in(&log)
            .last()
            .is_some_and(|s| (s.applied, s.errors) == (1, 0))
    });
    agent.assert_running();
    agent.kill();
    drop(namespaces);
    assert_eq!(named_netns_with_prefix(&prefix), Vec::<String>::new());
}

#[test]
fn agent_retries_failed_pods_nft() {
    agent_retries_failed_pods(Backend::Nft);
}

#[test]
fn agent_retries_failed_pods_iptables() {
    agent_retries_failed_pods(Backend::Iptables);
}

#[test]
fn agent_run_and_apply_nft() {
    agent_e2e(Backend::Nft);
}

#[test]
fn agent_run_and_apply_iptables() {
    agent_e2e(Backend::Iptables);
}
