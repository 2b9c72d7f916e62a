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

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use netwarden_dataplane::Backend;
use netwarden_lab::Lab;

const BIN: &str = env!("CARGO_BIN_EXE_netwarden");
const TIMEOUT: Duration = Duration::from_secs(10);

/// The agent as a child process, killed when dropped (also when the test fails).
struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    fn start(dir: &Path, backend: Backend, log: PathBuf) -> Agent {
        let stderr = File::create(&log).expect("agent log file");
        let child = Command::new(BIN)
            .args(["run", "-f"])
            .arg(dir)
            .args(["--interval", "200ms", "--backend", backend.as_str()])
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start netwarden run");
        Agent { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The agent's `sync:` reports so far.
    fn syncs(&self) -> Vec<SyncLine> {
        sync_lines(&self.log())
    }

    /// Fails if the agent exited (it must run until killed).
    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().expect("try_wait") {
            panic!("the agent exited ({status}); its log:\n{}", self.log());
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One `sync: N pod(s) considered, A applied, U unchanged, R removed, ..., E error(s)` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SyncLine {
    considered: usize,
    applied: usize,
    removed: usize,
    errors: usize,
}

fn sync_lines(log: &str) -> Vec<SyncLine> {
    log.lines()
        .filter_map(|line| {
            let rest = &line[line.find("sync: ")? + "sync: ".len()..];
            // "4 pod(s) considered, 2 applied, 0 unchanged, 0 removed, 0 without netns, ..."
            let number_before = |label: &str| -> Option<usize> {
                let end = rest.find(label)?;
                rest[..end].split_whitespace().last()?.parse().ok()
            };
            Some(SyncLine {
                considered: number_before(" pod(s) considered")?,
                applied: number_before(" applied")?,
                removed: number_before(" removed")?,
                errors: number_before(" error(s)")?,
            })
        })
        .collect()
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

fn wait_for(what: &str, agent: &mut Agent, cond: impl FnMut() -> bool) {
    if !wait_until(TIMEOUT, cond) {
        agent.assert_running();
        panic!(
            "timed out waiting until {what}; agent log:\n{}",
            agent.log()
        );
    }
}

fn has_rules(backend: Backend, netns: &Path) -> bool {
    !netwarden_leftovers(backend, netns).is_empty()
}

fn agent_e2e(backend: Backend) {
    if !root_or_skip() {
        return;
    }
    let _lock = lab_lock();
    let prefix = prefix(&format!("nwag{}", &backend.as_str()[..1]));
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
    let mut agent = Agent::start(&dir.path, backend, logs.path.join("run1.log"));
    wait_for("the first sync programs both pods", &mut agent, || {
        has_rules(backend, &server) && has_rules(backend, &other)
    });
    wait_for("the first sync is logged", &mut agent, || {
        !agent_syncs_quick(&logs.path.join("run1.log")).is_empty()
    });
    let first = agent.syncs()[0];
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
    let server_rules = rules_snapshot(backend, &server);
    let other_rules = rules_snapshot(backend, &other);

    // 2. Edit the server's policy: the denied client becomes allowed; only the server is
    // re-applied.
    write_policy(
        &dir,
        "server-policy.yaml",
        "server-in",
        "server",
        &["ok", "no"],
    );
    wait_for("the edited policy lets client-no in", &mut agent, || {
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
        rules_snapshot(backend, &other),
        other_rules,
        "other's rules were touched"
    );
    // The rules are in before the agent logs its report: wait for the line too.
    let run1 = logs.path.join("run1.log");
    wait_for("the second sync is logged", &mut agent, || {
        agent_syncs_quick(&run1).len() >= 2
    });
    let syncs = agent.syncs();
    assert_eq!(syncs.len(), 2, "one edit, one sync: {syncs:?}");
    let second = syncs[1];
    assert!(
        second.considered < total && second.applied == 1 && second.errors == 0,
        "the edit should re-apply the server only: {second:?}; log:\n{}",
        agent.log()
    );

    // 3. Delete the server's policy: its rules go, the other pod keeps its own.
    dir.remove("server-policy.yaml");
    wait_for("the server's rules are removed", &mut agent, || {
        !has_rules(backend, &server)
    });
    assert_eq!(netwarden_leftovers(backend, &server), Vec::<String>::new());
    assert!(has_rules(backend, &other));
    wait_for("the third sync is logged", &mut agent, || {
        agent_syncs_quick(&run1).len() >= 3
    });
    let syncs = agent.syncs();
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
    let mut agent = Agent::start(&dir.path, backend, logs.path.join("run2.log"));
    wait_for("the restarted agent syncs", &mut agent, || {
        !agent_syncs_quick(&logs.path.join("run2.log")).is_empty()
    });
    let restart = agent.syncs()[0];
    assert!(
        restart.considered == total && restart.applied == 1 && restart.errors == 0,
        "restart sync {restart:?}; log:\n{}",
        agent.log()
    );
    assert_eq!(
        rules_snapshot(backend, &server),
        server_rules,
        "server rules after restart"
    );
    assert_eq!(
        netwarden_leftovers(backend, &other),
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
        agent.syncs().len(),
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
        rules_snapshot(backend, &server),
        server_rules,
        "server rules after apply"
    );
    assert_eq!(
        rules_snapshot(backend, &other),
        other_rules,
        "other rules after apply"
    );
    assert_probes(&lab, &probes("client-no", "server"), false, "after apply");
    assert_probes(&lab, &probes("client-no", "other"), false, "after apply");

    lab.down().expect("lab down");
    assert_eq!(named_netns_with_prefix(&prefix), Vec::<String>::new());
}

/// A named netns this test creates, deleted when dropped.
struct NamedNetns(String);

impl Drop for NamedNetns {
    fn drop(&mut self) {
        let _ = netwarden_dataplane::netns::delete_named(&self.0);
    }
}

/// A pod whose netns does not exist yet when the agent starts (its sync fails) is programmed
/// once the netns appears, without any manifest change: failed pods are retried.
fn agent_retries_failed_pods(backend: Backend) {
    if !root_or_skip() {
        return;
    }
    let _lock = lab_lock();
    let prefix = prefix(&format!("nwrt{}", &backend.as_str()[..1]));
    let name = format!("{prefix}-late");
    let path = netwarden_dataplane::netns::named_path(&name).expect("netns name");
    assert!(!path.exists(), "{} already exists", path.display());
    let dir = TempDir::new(&format!("retry-{}", backend.as_str()));
    let logs = TempDir::new(&format!("retry-logs-{}", backend.as_str()));
    let docs = vec![namespace_doc(), pod_doc(pod_def("server"), Some(&path))];
    dir.write("pods.yaml", &docs_text(&docs));
    write_policy(&dir, "server-policy.yaml", "server-in", "server", &["ok"]);

    let log = logs.path.join("run.log");
    let mut agent = Agent::start(&dir.path, backend, log.clone());
    wait_for("the first sync is logged", &mut agent, || {
        !agent_syncs_quick(&log).is_empty()
    });
    let first = agent.syncs()[0];
    assert_eq!((first.considered, first.errors), (1, 1), "{}", agent.log());

    // The pod's netns appears (as when a CNI finishes after the pod object was written).
    netwarden_dataplane::netns::create_named(&name).expect("create the late netns");
    let _guard = NamedNetns(name.clone());
    wait_for("the late netns is programmed", &mut agent, || {
        has_rules(backend, &path)
    });
    // The rules are in before the agent logs its report: wait for the line too.
    wait_for("the successful retry is logged", &mut agent, || {
        agent_syncs_quick(&log)
            .last()
            .is_some_and(|s| (s.applied, s.errors) == (1, 0))
    });
    agent.assert_running();
    agent.kill();
    drop(_guard);
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

/// The sync lines of a log file (for polling without borrowing the agent).
fn agent_syncs_quick(log: &Path) -> Vec<SyncLine> {
    sync_lines(&std::fs::read_to_string(log).unwrap_or_default())
}

#[test]
fn agent_run_and_apply_nft() {
    agent_e2e(Backend::Nft);
}

#[test]
fn agent_run_and_apply_iptables() {
    agent_e2e(Backend::Iptables);
}

#[test]
fn sync_lines_are_parsed() {
    let log = "2024-01-01T00:00:00Z  INFO netwarden::agent: sync: 4 pod(s) considered, 2 applied, \
               1 unchanged, 3 removed, 0 without netns, 5 error(s) in 12.3 ms\nother line\n";
    assert_eq!(
        sync_lines(log),
        vec![SyncLine {
            considered: 4,
            applied: 2,
            removed: 3,
            errors: 5
        }]
    );
}
