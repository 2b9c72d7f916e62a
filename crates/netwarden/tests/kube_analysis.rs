//! `reach`, `explain` and `validate` with `--kube` (SPEC 6, issue 8 item 5), through the real
//! binary against the fake API server in this process (no root): the cluster listed once (one
//! LIST per served kind, no WATCH) answers as the same objects given as files do; `-f` lays
//! files over the cluster (a file policy replaces the served one of the same name); invalid
//! served objects are reported as `cluster: Kind ns/name: field: reason`; a CRD that is not
//! installed is skipped with a note.

mod cli_support;

use cli_support::{example, netwarden, stdout_json};
use netwarden_kube_fake::manifests::{load_dir, parse_objects};
use netwarden_kube_fake::{FakeApiServer, ServerOptions};
use netwarden_testing::TempDir;
use serde_json::{json, Value};

/// A fake API server serving examples/multinet, and a kubeconfig for it.
struct Cluster {
    api: FakeApiServer,
    kubeconfig: String,
    _dir: TempDir,
    // Last: the server's tasks run on it.
    runtime: tokio::runtime::Runtime,
}

fn serve_example() -> Cluster {
    serve(&example())
}

/// A fake API server serving the manifests under `dir` (their CRDs installed).
fn serve(dir: &std::path::Path) -> Cluster {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let api = runtime
        .block_on(FakeApiServer::start(ServerOptions::default()))
        .unwrap();
    let loaded = load_dir(&api, dir).unwrap();
    assert!(loaded.skipped.is_empty(), "{loaded:?}");
    let dir = TempDir::new("kube-analysis");
    let kubeconfig = dir.path.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    Cluster {
        api,
        kubeconfig: kubeconfig.display().to_string(),
        _dir: dir,
        runtime,
    }
}

/// A NetworkPolicy replacing the example's `web/api-from-frontend`: api accepts nothing.
const API_CLOSED: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: api-from-frontend, namespace: web}
spec:
  podSelector: {matchLabels: {app: api}}
  policyTypes: [Ingress]
";

fn verdict(reach: &Value, from: &str, to: &str) -> Vec<bool> {
    reach["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["from"] == from && p["to"] == to)
        .map(|p| p["allowed"].as_bool().unwrap())
        .collect()
}

#[test]
fn reach_on_the_cluster_equals_reach_on_the_same_files() {
    let cluster = serve_example();
    let kc = cluster.kubeconfig.as_str();
    let files = example().display().to_string();
    cluster.api.clear_requests();
    let out = netwarden(&["reach", "--kube", "--kubeconfig", kc, "--port", "8080/TCP"]);
    let from_cluster = stdout_json(&out);
    let from_files = stdout_json(&netwarden(&["reach", "-f", &files, "--port", "8080/TCP"]));
    assert_eq!(from_cluster, from_files);
    assert!(!from_cluster["probes"].as_array().unwrap().is_empty());

    // One LIST per served kind, no WATCH; DanmEp is not installed: skipped with a note.
    let log = cluster.api.requests();
    for kind in netwarden_kube::WATCHED_KINDS {
        // The example has no admin policies: their CRDs are not installed either.
        let served = !matches!(
            kind.kind,
            "DanmEp" | "ClusterNetworkPolicy" | "AdminNetworkPolicy" | "BaselineAdminNetworkPolicy"
        );
        assert_eq!(
            log.lists(kind.kind),
            usize::from(served),
            "LISTs of {}",
            kind.kind
        );
        assert_eq!(log.watches(kind.kind), 0, "WATCHes of {}", kind.kind);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("DanmEp (danm.k8s.io/v1) is not served"),
        "{stderr}"
    );

    // explain agrees with the files too.
    let explain = |input: &[&str]| {
        let mut args = vec!["explain"];
        args.extend_from_slice(input);
        args.extend([
            "--from",
            "web/frontend",
            "--to",
            "web/api",
            "--port",
            "8080/TCP",
            "-o",
            "json",
        ]);
        stdout_json(&netwarden(&args))
    };
    assert_eq!(
        explain(&["--kube", "--kubeconfig", kc]),
        explain(&["-f", &files])
    );

    // --no-network-policy: NetworkPolicies are not even listed.
    cluster.api.clear_requests();
    let without = stdout_json(&netwarden(&[
        "reach",
        "--kube",
        "--kubeconfig",
        kc,
        "--no-network-policy",
        "--port",
        "8080/TCP",
    ]));
    assert_eq!(cluster.api.requests().lists("NetworkPolicy"), 0);
    assert_eq!(
        without,
        stdout_json(&netwarden(&[
            "reach",
            "-f",
            &files,
            "--no-network-policy",
            "--port",
            "8080/TCP"
        ]))
    );
}

/// Admin policies and the Nodes' kind are listed from the cluster like the other kinds, and
/// answer as the same objects given as files do (SPEC 8).
#[test]
fn admin_policies_on_the_cluster_equal_the_same_files() {
    let dir = example().join("../admin");
    let cluster = serve(&dir);
    let kc = cluster.kubeconfig.as_str();
    let files = dir.display().to_string();
    cluster.api.clear_requests();
    let query = [
        "--port",
        "8080/TCP",
        "--port",
        "9090/TCP",
        "--network",
        "all",
    ];
    let mut args = vec!["reach", "--kube", "--kubeconfig", kc];
    args.extend(query);
    let from_cluster = stdout_json(&netwarden(&args));
    let mut args = vec!["reach", "-f", &files];
    args.extend(query);
    assert_eq!(from_cluster, stdout_json(&netwarden(&args)));
    let log = cluster.api.requests();
    for kind in [
        "ClusterNetworkPolicy",
        "AdminNetworkPolicy",
        "BaselineAdminNetworkPolicy",
        "Node",
    ] {
        assert_eq!(log.lists(kind), 1, "LISTs of {kind}");
    }
    // The admin decisions are there: lab is denied by the Admin tier.
    let denied = from_cluster["probes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["from"] == "lab/x" && p["to"] == "shop/web")
        .expect("a probe lab/x -> shop/web");
    assert_eq!(
        denied["ingress_tier"]["origin"]["policy"],
        "AdminNetworkPolicy/guard"
    );
    let out = netwarden(&["validate", "--kube", "--kubeconfig", kc]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn files_given_with_kube_replace_the_cluster_objects_of_the_same_name() {
    let cluster = serve_example();
    let kc = cluster.kubeconfig.as_str();
    let change = TempDir::new("kube-analysis-change");
    change.write_in_place("api-closed.yaml", API_CLOSED);
    let change_path = change.path.join("api-closed.yaml").display().to_string();

    let before = stdout_json(&netwarden(&[
        "reach",
        "--kube",
        "--kubeconfig",
        kc,
        "--port",
        "8080/TCP",
    ]));
    let after = stdout_json(&netwarden(&[
        "reach",
        "--kube",
        "--kubeconfig",
        kc,
        "-f",
        &change_path,
        "--port",
        "8080/TCP",
    ]));
    assert!(verdict(&before, "web/frontend", "web/api")
        .iter()
        .all(|a| *a));
    let changed = verdict(&after, "web/frontend", "web/api");
    assert!(!changed.is_empty() && changed.iter().all(|a| !a), "{after}");
    // Nothing else changed: the same verdicts as files holding the example with the policy
    // replaced (not added: a second policy of that name would be a duplicate).
    let mut objects = Vec::new();
    for file in ["namespaces.yaml", "pods.yaml", "policies.yaml"] {
        let path = example().join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        objects.extend(parse_objects(&path.display().to_string(), &text).unwrap());
    }
    objects.retain(|o| o["metadata"]["name"] != "api-from-frontend");
    let expected = TempDir::new("kube-analysis-expected");
    expected.write_in_place(
        "rest.json",
        &json!({"apiVersion": "v1", "kind": "List", "items": objects}).to_string(),
    );
    expected.write_in_place("api-closed.yaml", API_CLOSED);
    let from_files = stdout_json(&netwarden(&[
        "reach",
        "-f",
        &expected.path.display().to_string(),
        "--port",
        "8080/TCP",
    ]));
    assert_eq!(after, from_files);

    // A duplicate inside the files is still an error (validate fails), the cluster untouched.
    change.write_in_place("again.yaml", API_CLOSED);
    let out = netwarden(&[
        "validate",
        "--kube",
        "--kubeconfig",
        kc,
        "-f",
        &change.path.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("duplicate object"));
}

#[test]
fn validate_on_the_cluster_names_the_invalid_object_and_field() {
    let cluster = serve_example();
    let kc = cluster.kubeconfig.as_str();
    let out = netwarden(&["validate", "--kube", "--kubeconfig", kc]);
    assert!(
        out.status.success(),
        "the example is clean: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    cluster
        .api
        .create(json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "bad-cidr", "namespace": "web"},
            "spec": {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}]}}))
        .unwrap();
    let out = netwarden(&["validate", "--kube", "--kubeconfig", kc, "-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "an invalid served object fails");
    let problems: Value = serde_json::from_slice(&out.stdout).unwrap();
    let bad = problems
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["object"] == "web/bad-cidr")
        .unwrap_or_else(|| panic!("{problems}"));
    assert_eq!(bad["file"], "cluster");
    assert_eq!(bad["kind"], "NetworkPolicy");
    assert_eq!(bad["severity"], "error");
    assert!(
        bad["field"].as_str().unwrap().ends_with("ipBlock.cidr"),
        "{bad}"
    );

    // A cluster that cannot be reached is an error (exit 2), not an empty cluster.
    cluster.runtime.block_on(cluster.api.stop());
    let out = netwarden(&["validate", "--kube", "--kubeconfig", kc]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot list Namespace"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn kube_options_are_checked() {
    // --kubeconfig without --kube, and neither -f nor --kube, are usage errors.
    let out = netwarden(&["validate", "--kubeconfig", "/nonexistent"]);
    assert_eq!(out.status.code(), Some(2));
    let out = netwarden(&["reach", "--port", "80/TCP"]);
    assert_eq!(out.status.code(), Some(2));
    let help = netwarden(&["reach", "--help"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("replaces the cluster's object"));
}

/// Issue 20, defect 15: an API server that accepts TCP and never answers made every `--kube`
/// command hang. Now each one (`validate`, `reach`, `diff`, `promote`) fails within
/// `--request-timeout`, naming the server.
#[test]
fn a_server_that_never_answers_fails_the_command_within_its_timeout() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        // Accepted, held, never read nor answered.
        let held: Vec<_> = listener.incoming().collect();
        drop(held);
    });
    let dir = TempDir::new("kube-mute");
    let kubeconfig = dir.path.join("kubeconfig");
    std::fs::write(&kubeconfig, netwarden_kube_fake::kubeconfig_for(&url)).unwrap();
    let changes = dir.path.join("changes.yaml");
    std::fs::write(
        &changes,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: ns}\nspec: {podSelector: {}}\n",
    )
    .unwrap();
    let kubeconfig = kubeconfig.display().to_string();
    let changes = changes.display().to_string();
    let commands: [&[&str]; 4] = [
        &["validate"],
        &["reach", "--port", "80/TCP"],
        &["diff", "--with", &changes],
        &["promote", "ns/p", "--dry-run"],
    ];
    for command in commands {
        let mut argv = command.to_vec();
        argv.extend([
            "--kube",
            "--kubeconfig",
            &kubeconfig,
            "--request-timeout",
            "2s",
        ]);
        let start = std::time::Instant::now();
        let out = netwarden(&argv);
        let took = start.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command:?}: {stderr}");
        assert!(
            took < std::time::Duration::from_secs(8),
            "{command:?} failed after {took:?}"
        );
        assert!(stderr.contains(&url), "{command:?}: {stderr}");
        assert!(
            stderr.contains("did not answer within 2s"),
            "{command:?}: {stderr}"
        );
    }
}
