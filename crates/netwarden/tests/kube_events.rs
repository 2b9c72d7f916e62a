//! Kubernetes Events on bad policies, end to end: the fake API server and two real `netwarden
//! run --kube` agents (nodes n1 and n2, child processes, JSON logs). Each bad policy gets
//! exactly one Event in the whole cluster although both agents see it; fixing a policy writes
//! nothing; a new generation with the same problem writes one new Event.
//!
//! No pod is local to either agent (the only pod runs on node n9), so nothing is programmed
//! into any netns; the agents still need root for their monitor (NFLOG), so this fails when
//! `CI=true` without it.

use std::path::Path;
use std::time::{Duration, Instant};

use netwarden_kube_fake::{FakeApiServer, ServerOptions};
use netwarden_testing::{
    free_port, kube_agent_args, netwarden_bin, root_or_skip, AgentProcess, TempDir,
};
use serde_json::{json, Value};

const NS: &str = "kube-events";

fn network_policy(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": name, "namespace": NS}, "spec": spec})
}

/// Invalid: a prefix length of 99.
fn broken(cidr: &str) -> Value {
    network_policy(
        "broken",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
               "ingress": [{"from": [{"ipBlock": {"cidr": cidr}}]}]}),
    )
}

/// Valid; selects pods labelled `app`=`app`.
fn selecting(name: &str, app: &str) -> Value {
    network_policy(
        name,
        json!({"podSelector": {"matchLabels": {"app": app}}, "policyTypes": ["Ingress"]}),
    )
}

/// `(regarding.name, reason, note)` of every Event, sorted.
fn events(api: &FakeApiServer) -> Vec<(String, String, String)> {
    let mut got: Vec<_> = api
        .objects("Event")
        .iter()
        .map(|e| {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                text(&e["regarding"]["name"]),
                text(&e["reason"]),
                text(&e["note"]),
            )
        })
        .collect();
    got.sort();
    got
}

fn wait_events(api: &FakeApiServer, want: usize, what: &str, agents: &[&AgentProcess]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if events(api).len() >= want {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let logs: Vec<String> = agents.iter().map(|a| a.log()).collect();
    panic!(
        "{what}: {want} Events wanted, got {:#?}\nagent logs:\n{}",
        events(api),
        logs.join("\n---\n")
    );
}

/// Both agents have seen the cluster as it is now: each has logged `needle` (a line it writes
/// once per appearance of a problem) `count` times.
fn wait_logged(agent: &AgentProcess, needle: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while agent.log().matches(needle).count() < count {
        assert!(
            Instant::now() < deadline,
            "`{needle}` ×{count} not logged:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn start_agent(kubeconfig: &Path, node: &str, log: &Path) -> AgentProcess {
    let mut args = kube_agent_args(kubeconfig, node, free_port());
    args.extend(["--log-format", "json"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    AgentProcess::start(&netwarden_bin!(), &args, log)
}

#[test]
fn bad_policies_get_one_event_each_cluster_wide() {
    if !root_or_skip() {
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let api = runtime
        .block_on(FakeApiServer::start(ServerOptions::default()))
        .expect("start the fake API server");
    let dir = TempDir::new("nwev");
    let kubeconfig = dir.path.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}))
        .unwrap();
    api.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": NS, "labels": {"app": "web"}},
        "spec": {"nodeName": "n9", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running", "podIP": "10.232.0.1", "podIPs": [{"ip": "10.232.0.1"}]},
    }))
    .unwrap();
    api.create(broken("10.0.0.0/99")).unwrap();
    api.create(selecting("nobody", "nobody")).unwrap();
    api.create(selecting("web-in", "web")).unwrap();

    let n1 = start_agent(&kubeconfig, "n1", &dir.path.join("n1.log"));
    let n2 = start_agent(&kubeconfig, "n2", &dir.path.join("n2.log"));
    wait_events(&api, 2, "first view", &[&n1, &n2]);
    // Both agents have taken the problem in (and so offered its Event) before counting.
    wait_logged(&n1, "10.0.0.0/99", 1);
    wait_logged(&n2, "10.0.0.0/99", 1);
    std::thread::sleep(Duration::from_secs(1));
    let first = events(&api);
    assert_eq!(
        first
            .iter()
            .map(|(n, r, _)| (n.as_str(), r.as_str()))
            .collect::<Vec<_>>(),
        [("broken", "InvalidPolicy"), ("nobody", "SelectsNoPods")],
        "one Event per bad policy, whichever agent wrote it: {first:#?}"
    );
    assert!(
        first[0].2.contains("spec.ingress[0].from[0].ipBlock.cidr"),
        "{first:#?}"
    );
    // Each agent tried each Event once: one create won (201), the other got 409.
    let creates = |api: &FakeApiServer, code: u16| {
        api.requests()
            .iter()
            .filter(|r| r.method == "POST" && r.kind.as_deref() == Some("Event") && r.code == code)
            .count()
    };
    assert_eq!(creates(&api, 201), 2);
    assert_eq!(
        creates(&api, 409),
        2,
        "the other agent's creates were refused"
    );

    // Fixed: no new Event.
    api.update(broken("10.0.0.0/8")).unwrap();
    // Nothing to wait for (no Event should come): give both agents ten of their intervals.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(events(&api), first, "a fixed policy writes nothing");

    // A new generation with the same problem (another bad prefix): one new Event.
    api.update(broken("10.0.0.0/77")).unwrap();
    wait_logged(&n1, "10.0.0.0/77", 1);
    wait_logged(&n2, "10.0.0.0/77", 1);
    wait_events(&api, 3, "new generation", &[&n1, &n2]);
    std::thread::sleep(Duration::from_secs(1));
    let after = events(&api);
    assert_eq!(after.len(), 3, "exactly one new Event: {after:#?}");
    assert_eq!(
        after
            .iter()
            .filter(|(n, r, _)| n == "broken" && r == "InvalidPolicy")
            .count(),
        2
    );

    // The agents' logs are JSON, one object per line.
    for agent in [&n1, &n2] {
        let log = agent.log();
        assert!(!log.trim().is_empty());
        for line in log.lines().filter(|l| !l.trim().is_empty()) {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
            assert!(v["level"].is_string() && v["message"].is_string(), "{line}");
        }
    }
}

/// An admin policy (cluster-scoped, SPEC 8) with a load error gets its `InvalidPolicy` Event
/// too: written in `default` (where `kubectl describe` looks for a cluster-scoped object's
/// Events), regarding the policy without a namespace.
#[test]
fn an_invalid_admin_policy_gets_its_event_in_default() {
    if !root_or_skip() {
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let api = runtime
        .block_on(FakeApiServer::start(ServerOptions::default()))
        .expect("start the fake API server");
    api.install_crd(
        "policy.networking.k8s.io",
        "v1alpha1",
        "BaselineAdminNetworkPolicy",
    );
    let dir = TempDir::new("nwevadm");
    let kubeconfig = dir.path.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}))
        .unwrap();
    // Pass is not a Baseline action: the rule fails closed, and the policy is reported.
    api.create(json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha1",
        "kind": "BaselineAdminNetworkPolicy",
        "metadata": {"name": "default"},
        "spec": {"subject": {"namespaces": {}},
                 "egress": [{"name": "pass", "action": "Pass",
                             "to": [{"networks": ["10.0.0.0/8"]}]}]},
    }))
    .unwrap();
    let n1 = start_agent(&kubeconfig, "n1", &dir.path.join("n1.log"));
    wait_events(&api, 1, "the admin policy's Event", &[&n1]);
    let written = api.objects("Event");
    assert_eq!(written.len(), 1, "{written:#?}");
    let event = &written[0];
    assert_eq!(event["metadata"]["namespace"], "default", "{event:#}");
    assert_eq!(event["reason"], "InvalidPolicy");
    assert_eq!(event["regarding"]["kind"], "BaselineAdminNetworkPolicy");
    assert_eq!(event["regarding"]["name"], "default");
    assert!(event["regarding"].get("namespace").is_none(), "{event:#}");
    assert!(
        event["note"]
            .as_str()
            .unwrap_or_default()
            .contains("spec.egress[0]"),
        "{event:#}"
    );
}
