//! `netwarden diff` through the real binary (SPEC 6, issue 9 item 3), on examples/multinet:
//! the JSON document's shape, the table, `--fail-on-deny`'s exit statuses, a deletion that
//! names nothing (exit 2, the object named), and `--kube` against the fake API server in this
//! process answering as the same files do.

mod cli_support;

use std::path::Path;

use cli_support::{example, netwarden, stdout_json};
use netwarden_kube_fake::manifests::load_dir;
use netwarden_kube_fake::{FakeApiServer, ServerOptions};
use netwarden_testing::TempDir;
use serde_json::{json, Value};

/// Replaces the example's `web/api-from-frontend`: api accepts nothing.
const API_CLOSED: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: api-from-frontend, namespace: web}
spec:
  podSelector: {matchLabels: {app: api}}
  policyTypes: [Ingress]
";

/// Deletes the example's `data/backup-lockdown` (a DanmNetworkPolicy): only opens flows.
const DELETE_LOCKDOWN: &str = "apiVersion: danm.k8s.io/v1
kind: DanmNetworkPolicy
metadata:
  name: backup-lockdown
  namespace: data
  annotations: {netwarden.io/delete: \"true\"}
";

/// The changes as files: `closed.yaml`, `delete.yaml`, and `typo.yaml` (a deletion of a
/// policy the example does not have).
fn change_files() -> TempDir {
    let dir = TempDir::new("diff-cli");
    dir.write("closed.yaml", API_CLOSED);
    dir.write("delete.yaml", DELETE_LOCKDOWN);
    dir.write(
        "typo.yaml",
        &DELETE_LOCKDOWN.replace("backup-lockdown", "backup-lokdown"),
    );
    dir
}

fn path(dir: &TempDir, name: &str) -> String {
    dir.path.join(name).display().to_string()
}

#[test]
fn json_document_and_exit_statuses() {
    let dir = change_files();
    let base = example().display().to_string();
    let closed = path(&dir, "closed.yaml");
    let args = ["diff", "-f", &base, "--with", &closed, "--port", "8080/TCP"];
    let out = netwarden(&args);
    let doc = stdout_json(&out);
    // frontend → api, dual-stack: one change per family; nothing else changes on 8080.
    assert_eq!(
        doc,
        json!({"changes": [
            {"from": "web/frontend", "to": "web/api", "network": "default", "port": 8080,
             "protocol": "TCP", "family": "ipv4", "before": true, "after": false,
             "staged_before": true, "staged_after": false, "kind": "newly-denied",
             "policies": ["web/api-from-frontend"], "from_interface": "eth0",
             "to_interface": "eth0", "src": "10.244.1.10", "dst": "10.244.1.11"},
            {"from": "web/frontend", "to": "web/api", "network": "default", "port": 8080,
             "protocol": "TCP", "family": "ipv6", "before": true, "after": false,
             "staged_before": true, "staged_after": false, "kind": "newly-denied",
             "policies": ["web/api-from-frontend"], "from_interface": "eth0",
             "to_interface": "eth0", "src": "fd00:244::1:10", "dst": "fd00:244::1:11"}
        ]})
    );

    // --fail-on-deny: 1 when a flow becomes denied, with the same output.
    let mut gated = args.to_vec();
    gated.push("--fail-on-deny");
    let out = netwarden(&gated);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(serde_json::from_slice::<Value>(&out.stdout).unwrap(), doc);

    // A deletion that only opens flows passes the gate (default ports: every port named).
    let delete = path(&dir, "delete.yaml");
    let out = netwarden(&["diff", "-f", &base, "--with", &delete, "--fail-on-deny"]);
    let opened = stdout_json(&out);
    let changes = opened["changes"].as_array().unwrap();
    assert!(!changes.is_empty());
    for change in changes {
        assert_eq!(change["to"], "data/backup", "{change}");
        assert_eq!(change["kind"], "newly-allowed", "{change}");
        assert_eq!(
            change["policies"],
            json!(["data/backup-lockdown"]),
            "{change}"
        );
    }

    // A deletion that names nothing: exit 2, the object named on stderr.
    let typo = path(&dir, "typo.yaml");
    let out = netwarden(&["diff", "-f", &base, "--with", &typo]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "DanmNetworkPolicy data/backup-lokdown: metadata.annotations.netwarden.io/delete: \
             deletes nothing: the base has no such object"
        ),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn table_groups_per_network_and_port() {
    let dir = change_files();
    let base = example().display().to_string();
    let closed = path(&dir, "closed.yaml");
    let out = netwarden(&[
        "diff", "-f", &base, "--with", &closed, "--port", "8080/TCP", "--port", "80/TCP", "-o",
        "table",
    ]);
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8(out.stdout).unwrap();
    // 80 is no container port of api: the narrowed policy denied it already.
    assert_eq!(
        table,
        "\
network default, 8080/TCP
  newly-denied  web/frontend -> web/api  ipv4  enforced allow -> deny   staged allow -> deny   web/api-from-frontend
  newly-denied  web/frontend -> web/api  ipv6  enforced allow -> deny   staged allow -> deny   web/api-from-frontend

2 change(s): 2 newly denied, 0 newly allowed, 0 in the staged view only
"
    );
    // No change at all.
    let out = netwarden(&[
        "diff", "-f", &base, "--with", &base, "--port", "8080/TCP", "-o", "table",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "no flow changes its verdict\n"
    );
}

#[test]
fn kube_base_answers_as_the_same_files() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let api = runtime
        .block_on(FakeApiServer::start(ServerOptions::default()))
        .unwrap();
    let loaded = load_dir(&api, &example()).unwrap();
    assert!(loaded.skipped.is_empty(), "{loaded:?}");
    let dir = change_files();
    let kubeconfig = path(&dir, "kubeconfig");
    api.write_kubeconfig(Path::new(&kubeconfig)).unwrap();
    let base = example().display().to_string();
    for change in ["closed.yaml", "delete.yaml"] {
        let with = path(&dir, change);
        api.clear_requests();
        let from_cluster = stdout_json(&netwarden(&[
            "diff",
            "--kube",
            "--kubeconfig",
            &kubeconfig,
            "--with",
            &with,
        ]));
        let from_files = stdout_json(&netwarden(&["diff", "-f", &base, "--with", &with]));
        assert_eq!(from_cluster, from_files, "{change}");
        assert!(!from_cluster["changes"].as_array().unwrap().is_empty());
        // The cluster is listed once: no watch.
        let log = api.requests();
        assert_eq!(log.lists("NetworkPolicy"), 1);
        assert_eq!(log.watches("NetworkPolicy"), 0);
    }
    // A deletion naming nothing in the cluster.
    let typo = path(&dir, "typo.yaml");
    let out = netwarden(&[
        "diff",
        "--kube",
        "--kubeconfig",
        &kubeconfig,
        "--with",
        &typo,
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("DanmNetworkPolicy data/backup-lokdown"));
    drop(api);
    drop(runtime);
}

/// Deleting the admin example's Baseline opens what it denied, and names it; tightening the
/// Admin tier names the admin policy that now denies (SPEC 8).
#[test]
fn admin_policy_changes_are_named() {
    let base = example().join("../admin").display().to_string();
    let dir = TempDir::new("diff-admin");
    dir.write(
        "delete.yaml",
        "apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata:
  name: default
  annotations: {netwarden.io/delete: \"true\"}
",
    );
    let out = netwarden(&[
        "diff",
        "-f",
        &base,
        "--with",
        &path(&dir, "delete.yaml"),
        "--port",
        "8080/TCP",
        "-o",
        "json",
    ]);
    let v = stdout_json(&out);
    let changes = v["changes"].as_array().unwrap();
    let opened = changes
        .iter()
        .find(|c| c["from"] == "shop/web" && c["to"] == "shop/db")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(
        (opened["before"].clone(), opened["after"].clone()),
        (json!(false), json!(true))
    );
    assert_eq!(
        opened["admin_policies"],
        json!(["BaselineAdminNetworkPolicy/default"])
    );
    assert_eq!(opened["policies"], json!([]));
    assert!(changes.iter().all(|c| c["after"] == true), "{v}");
    // An Admin Deny of ops: ops/mon -> shop/web closes, named with the policy.
    dir.write(
        "deny-ops.yaml",
        "apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: deny-ops}
spec:
  priority: 1
  subject: {namespaces: {matchLabels: {team: shop}}}
  ingress: [{action: Deny, from: [{namespaces: {matchLabels: {team: ops}}}]}]
",
    );
    let out = netwarden(&[
        "diff",
        "-f",
        &base,
        "--with",
        &path(&dir, "deny-ops.yaml"),
        "--port",
        "8080/TCP",
        "-o",
        "json",
    ]);
    let v = stdout_json(&out);
    let closed = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["from"] == "ops/mon" && c["to"] == "shop/web" && c["network"] == "default")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(closed["after"], false);
    assert_eq!(
        closed["admin_policies"],
        // Sorted as the engine orders admin policies: by kind, then name.
        json!([
            "ClusterNetworkPolicy/allow-mon",
            "AdminNetworkPolicy/deny-ops"
        ])
    );
    // The table and the page name them too.
    let args = |format: &'static str| {
        [
            "diff".to_owned(),
            "-f".to_owned(),
            base.clone(),
            "--with".to_owned(),
            path(&dir, "deny-ops.yaml"),
            "--port".to_owned(),
            "8080/TCP".to_owned(),
            "-o".to_owned(),
            format.to_owned(),
        ]
    };
    let run = |format: &'static str| {
        let args = args(format);
        let out = netwarden(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let table = run("table");
    let line = table
        .lines()
        .find(|l| l.contains("ops/mon -> shop/web") && l.contains("newly-denied"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        line.ends_with("ClusterNetworkPolicy/allow-mon, AdminNetworkPolicy/deny-ops"),
        "{line}"
    );
    let html = run("html");
    assert!(
        html.contains("\"admin_policies\":[\"ClusterNetworkPolicy/allow-mon\",\"AdminNetworkPolicy/deny-ops\"]"),
        "{html}"
    );
}
