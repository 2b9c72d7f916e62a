//! `netwarden promote` through the real binary (no root): in a file (only the mode value of
//! that one object changes, `--dry-run` changes nothing, refusals name the object), gated by
//! `--require-ready` on a recorded event stream, and in a cluster (the fake API server of
//! `crates/kube-fake`: one merge PATCH of the annotations). The same for a cluster-scoped admin
//! policy (`Kind/NAME`, SPEC 8): the monitored ClusterNetworkPolicy of `examples/admin`.

mod cli_support;

use std::path::PathBuf;

use cli_support::{example, netwarden};
use netwarden_kube_fake::log::Verb;
use netwarden_kube_fake::manifests::load_dir;
use netwarden_kube_fake::{FakeApiServer, ServerOptions};
use netwarden_monitor::{RecordType, StatusRecord, Timestamp};
use netwarden_testing::TempDir;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `netwarden ARGS`, which must refuse (exit 2) saying `says` on stderr.
fn assert_refused(args: &[&str], says: &str) {
    let out = netwarden(args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(stderr.contains(says), "{args:?}: {stderr}");
}

/// The example's policies: comments, several documents, one monitored policy.
fn policies_file(dir: &TempDir) -> (PathBuf, String) {
    let original = std::fs::read_to_string(example().join("policies.yaml")).unwrap();
    dir.write("policies.yaml", &original);
    (dir.path.join("policies.yaml"), original)
}

#[test]
fn promotes_in_a_file_changing_only_the_mode_value() {
    let dir = TempDir::new("promote-file");
    let (path, original) = policies_file(&dir);
    let file = path.to_str().unwrap();

    let dry = netwarden(&[
        "promote",
        "web/frontend-same-namespace",
        "-f",
        file,
        "--dry-run",
    ]);
    assert!(dry.status.success(), "{}", text(&dry.stderr));
    let out = text(&dry.stdout);
    assert!(out.contains("-     netwarden.io/mode: monitor"), "{out}");
    assert!(out.contains("+     netwarden.io/mode: enforce"), "{out}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), original, "dry run");

    let run = netwarden(&["promote", "web/frontend-same-namespace", "-f", file]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        original.replacen(
            "    netwarden.io/mode: monitor\n    netwarden.io/replaces: frontend-http-only",
            "    netwarden.io/mode: enforce\n    netwarden.io/replaces: frontend-http-only",
            1
        )
    );

    // Now enforced: refused, the object named, nothing written.
    let promoted = std::fs::read_to_string(&path).unwrap();
    assert_refused(
        &["promote", "web/frontend-same-namespace", "-f", file],
        "NetworkPolicy web/frontend-same-namespace: not monitored",
    );
    assert_refused(
        &["promote", "web/nope", "-f", file],
        "policy web/nope: not found in",
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), promoted);
}

/// Whole seconds, so every record of a test names the same `monitored_since` (one episode).
/// A status record `minutes_ago` before `now` (micros), monitored since `since_minutes_ago`:
/// both records of one test share `now`, so they belong to one monitoring episode.
fn status(
    now: i64,
    policy: &str,
    minutes_ago: i64,
    since_minutes_ago: i64,
    connections: u64,
) -> String {
    status_of(
        now,
        (policy, "NetworkPolicy"),
        minutes_ago,
        since_minutes_ago,
        connections,
    )
}

/// [`status`] of a policy of any kind: `(policy, kind)` as the record names them.
fn status_of(
    now: i64,
    (policy, kind): (&str, &str),
    minutes_ago: i64,
    since_minutes_ago: i64,
    connections: u64,
) -> String {
    // `now` is the real time, which the verdict's window ends at (a time rounded down to the
    // hour put the "1 minute ago" record out of the last hour from HH:59 on).
    StatusRecord {
        time: Timestamp(now - minutes_ago * 60_000_000),
        node: "node-a".into(),
        record: RecordType::Status,
        policy: policy.into(),
        kind: kind.into(),
        monitored_since: Timestamp(now - since_minutes_ago * 60_000_000),
        pods: 1,
        would_deny: 0,
        nflog_dropped: 0,
        rate_limited: Some(0),
        connections: Some(connections),
    }
    .to_json_line()
}

#[test]
fn require_ready_follows_the_report_verdict() {
    let dir = TempDir::new("promote-ready");
    let (path, original) = policies_file(&dir);
    let file = path.to_str().unwrap();
    let policy = "web/frontend-same-namespace";
    let now = Timestamp::now().micros();
    // Monitored for 2 hours, but its pods saw no traffic in the last hour.
    dir.write(
        "quiet.jsonl",
        &format!(
            "{}\n{}\n",
            status(now, policy, 61, 120, 9),
            status(now, policy, 1, 120, 9)
        ),
    );
    let quiet = dir.path.join("quiet.jsonl");
    assert_refused(
        &[
            "promote",
            policy,
            "-f",
            file,
            "--require-ready",
            "-e",
            quiet.to_str().unwrap(),
        ],
        "is not ready to promote: no traffic on its pods",
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), original);

    let report = netwarden(&["report", "-e", quiet.to_str().unwrap(), "-o", "json"]);
    assert!(report.status.success(), "{}", text(&report.stderr));
    let json: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    assert_eq!(json["policies"][0]["reason"], "no traffic on its pods");

    dir.write(
        "busy.jsonl",
        &format!(
            "{}\n{}\n",
            status(now, policy, 61, 120, 9),
            status(now, policy, 1, 120, 90)
        ),
    );
    let busy = dir.path.join("busy.jsonl");
    let ok = netwarden(&[
        "promote",
        policy,
        "-f",
        file,
        "--require-ready",
        "-e",
        busy.to_str().unwrap(),
    ]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    assert!(std::fs::read_to_string(&path)
        .unwrap()
        .contains("    netwarden.io/mode: enforce\n    netwarden.io/replaces"));
}

/// The fake API server (and the runtime serving it) holding the manifests of `examples`, with
/// a kubeconfig for it in `dir`.
fn fake_cluster(
    examples: &std::path::Path,
    dir: &TempDir,
) -> (tokio::runtime::Runtime, FakeApiServer, PathBuf) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let api = runtime
        .block_on(FakeApiServer::start(ServerOptions::default()))
        .unwrap();
    let loaded = load_dir(&api, examples).unwrap();
    assert!(loaded.skipped.is_empty(), "{loaded:?}");
    let kubeconfig = dir.path.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    (runtime, api, kubeconfig)
}

#[test]
fn promotes_in_a_cluster_with_one_merge_patch() {
    let dir = TempDir::new("promote-kube");
    let (_runtime, api, kubeconfig) = fake_cluster(&example(), &dir);
    let kc = kubeconfig.to_str().unwrap();
    let policy = "web/frontend-same-namespace";
    let annotations = |api: &FakeApiServer| {
        api.object(
            "networking.k8s.io/v1",
            "NetworkPolicy",
            "web",
            "frontend-same-namespace",
        )
        .unwrap()["metadata"]["annotations"]
            .clone()
    };
    let before = annotations(&api);
    assert_eq!(before["netwarden.io/mode"], "monitor");

    let dry = netwarden(&["promote", policy, "--kube", "--kubeconfig", kc, "--dry-run"]);
    assert!(dry.status.success(), "{}", text(&dry.stderr));
    assert!(
        text(&dry.stdout).contains(r#""netwarden.io/mode":"enforce""#),
        "{}",
        text(&dry.stdout)
    );
    assert_eq!(annotations(&api), before);

    api.clear_requests();
    let run = netwarden(&["promote", policy, "--kube", "--kubeconfig", kc]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let after = annotations(&api);
    assert_eq!(after["netwarden.io/mode"], "enforce");
    assert_eq!(
        after["netwarden.io/replaces"], before["netwarden.io/replaces"],
        "other annotations kept"
    );
    assert_eq!(api.requests().count(Verb::Patch, "NetworkPolicy"), 1);

    assert_refused(
        &["promote", policy, "--kube", "--kubeconfig", kc],
        "not monitored",
    );
    drop(api);
}

/// The monitored ClusterNetworkPolicy of `examples/admin` (on a secondary network).
const ADMIN: &str = "ClusterNetworkPolicy/storage-protect-ops";

fn admin_example() -> PathBuf {
    example().join("../admin")
}

#[test]
fn promotes_an_admin_policy_in_a_file() {
    let dir = TempDir::new("promote-admin-file");
    let original = std::fs::read_to_string(admin_example().join("monitor.yaml")).unwrap();
    dir.write("monitor.yaml", &original);
    let path = dir.path.join("monitor.yaml");
    let file = path.to_str().unwrap();

    let dry = netwarden(&["promote", ADMIN, "-f", file, "--dry-run"]);
    assert!(dry.status.success(), "{}", text(&dry.stderr));
    let out = text(&dry.stdout);
    assert!(
        out.contains(":13: -     netwarden.io/mode: monitor"),
        "{out}"
    );
    assert!(
        out.contains(":13: +     netwarden.io/mode: enforce"),
        "{out}"
    );
    assert!(
        out.contains("dry run: ClusterNetworkPolicy storage-protect-ops left in monitor mode"),
        "{out}"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), original, "dry run");

    // Not ready on this evidence: refused, nothing written.
    let now = Timestamp::now().micros();
    let record = |minutes_ago, connections| {
        status_of(
            now,
            (ADMIN, "ClusterNetworkPolicy"),
            minutes_ago,
            120,
            connections,
        )
    };
    dir.write(
        "quiet.jsonl",
        &format!("{}\n{}\n", record(61, 5), record(1, 5)),
    );
    let quiet = dir.path.join("quiet.jsonl");
    assert_refused(
        &[
            "promote",
            ADMIN,
            "-f",
            file,
            "--require-ready",
            "-e",
            quiet.to_str().unwrap(),
        ],
        "ClusterNetworkPolicy storage-protect-ops is not ready to promote: no traffic on its pods",
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), original);

    // Ready: `--kind` and the bare name say the same.
    dir.write(
        "busy.jsonl",
        &format!("{}\n{}\n", record(61, 5), record(1, 50)),
    );
    let busy = dir.path.join("busy.jsonl");
    // `report -f FILE -o json` on `events`: the first policy row.
    let first_row = |events: &std::path::Path| {
        let out = netwarden(&[
            "report",
            "-e",
            events.to_str().unwrap(),
            "-f",
            file,
            "-o",
            "json",
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        json["policies"][0].clone()
    };
    // With no evidence, `report -f` lists the monitored admin policy of the file all the same.
    dir.write("none.jsonl", "");
    let row = first_row(&dir.path.join("none.jsonl"));
    assert_eq!(row["policy"], ADMIN, "{row}");
    assert_eq!(row["reason"], "no evidence yet", "{row}");
    let row = first_row(&busy);
    assert_eq!(row["policy"], ADMIN, "{row}");
    assert_eq!(row["kind"], "ClusterNetworkPolicy", "{row}");
    assert_eq!(row["status"], "ready-to-promote", "{row}");
    let run = netwarden(&[
        "promote",
        "--kind",
        "ClusterNetworkPolicy",
        "storage-protect-ops",
        "-f",
        file,
        "--require-ready",
        "-e",
        busy.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert!(
        text(&run.stdout)
            .contains("ClusterNetworkPolicy storage-protect-ops promoted to enforce in"),
        "{}",
        text(&run.stdout)
    );
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        original.replacen(
            "    netwarden.io/mode: monitor\n",
            "    netwarden.io/mode: enforce\n",
            1
        )
    );

    assert_refused(
        &["promote", ADMIN, "-f", file],
        "ClusterNetworkPolicy storage-protect-ops: not monitored",
    );
    assert_refused(
        &[
            "promote",
            "AdminNetworkPolicy/storage-protect-ops",
            "-f",
            file,
        ],
        "AdminNetworkPolicy storage-protect-ops: not found in",
    );
}

#[test]
fn promotes_an_admin_policy_in_a_cluster_with_one_merge_patch() {
    let dir = TempDir::new("promote-admin-kube");
    let (_runtime, api, kubeconfig) = fake_cluster(&admin_example(), &dir);
    let kc = kubeconfig.to_str().unwrap();
    let object = |api: &FakeApiServer| {
        api.object(
            "policy.networking.k8s.io/v1alpha2",
            "ClusterNetworkPolicy",
            "",
            "storage-protect-ops",
        )
        .unwrap()
    };
    let before = object(&api);
    assert_eq!(
        before["metadata"]["annotations"]["netwarden.io/mode"],
        "monitor"
    );
    let rv = before["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();

    let dry = netwarden(&["promote", ADMIN, "--kube", "--kubeconfig", kc, "--dry-run"]);
    assert!(dry.status.success(), "{}", text(&dry.stderr));
    assert!(
        text(&dry.stdout).contains(&format!(
            r#"ClusterNetworkPolicy storage-protect-ops: merge patch {{"metadata":{{"annotations":{{"netwarden.io/mode":"enforce"}},"resourceVersion":"{rv}"}}}}"#
        )),
        "{}",
        text(&dry.stdout)
    );
    assert_eq!(object(&api), before);

    // The resourceVersion read is a precondition: a change in between is a conflict.
    let target = netwarden::promote::Target::parse(ADMIN, None).unwrap();
    let opts = netwarden_manifest::LoadOptions::default();
    let timeout = std::time::Duration::from_secs(10);
    let plan =
        netwarden::promote::plan_cluster(Some(&kubeconfig), timeout, &target, &opts).unwrap();
    let mut changed = before.clone();
    changed["metadata"]["labels"] = serde_json::json!({"edited": "meanwhile"});
    api.update(changed).unwrap();
    let conflict =
        netwarden::promote::apply_cluster(Some(&kubeconfig), timeout, &target, &plan, &opts)
            .unwrap_err()
            .to_string();
    assert!(
        conflict.contains("ClusterNetworkPolicy storage-protect-ops"),
        "{conflict}"
    );
    assert_eq!(
        object(&api)["metadata"]["annotations"]["netwarden.io/mode"],
        "monitor"
    );

    api.clear_requests();
    let run = netwarden(&["promote", ADMIN, "--kube", "--kubeconfig", kc]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let after = object(&api);
    assert_eq!(
        after["metadata"]["annotations"]["netwarden.io/mode"],
        "enforce"
    );
    assert_eq!(
        after["metadata"]["annotations"]["k8s.v1.cni.cncf.io/policy-for"], "shop/storage",
        "other annotations kept"
    );
    assert_eq!(api.requests().count(Verb::Patch, "ClusterNetworkPolicy"), 1);
    assert_eq!(api.requests().count(Verb::Patch, "NetworkPolicy"), 0);

    assert_refused(
        &["promote", ADMIN, "--kube", "--kubeconfig", kc],
        "ClusterNetworkPolicy storage-protect-ops: not monitored",
    );
    assert_refused(
        &[
            "promote",
            "AdminNetworkPolicy/storage-protect-ops",
            "--kube",
            "--kubeconfig",
            kc,
        ],
        "AdminNetworkPolicy storage-protect-ops: not found in the cluster",
    );
    drop(api);
}
