//! `netwarden run --kube` with pod network namespaces from a real containerd over CRI (root and
//! the containerd packages; `CI=true` fails loudly without them).
//!
//! The fake API server serves two pods of node n1 with the uids of two real pod sandboxes
//! (no netns annotation: only the runtime says where their netns are). A policy lets `client`
//! reach `web` on TCP 8080 only; real connections over the sandboxes' CNI bridge check it.
//! Then `web`'s sandbox is stopped and removed and a new one is run with the same metadata
//! (a new sandbox id and netns path, as kubelet does): the agent programs the new netns with
//! no API event, and the connections are probed again.
//!
//! Last, containerd is frozen (SIGSTOP: its socket takes connections, nothing answers, the
//! worst a runtime does): the rules stay, the connections behave as before, and a policy
//! change made during the outage is still applied to the netns the agent knows; thawed, the
//! runtime is asked again and a second change applies too.

use std::path::{Path, PathBuf};
use std::time::Duration;

use netwarden_kube_fake::{FakeApiServer, ServerOptions};
use netwarden_testing::{
    assert_connects, assert_refused, heavy_lock, listen, netwarden_bin, netwarden_leftovers,
    rules_snapshot, wait_until, AgentProcess, Containerd, TempDir,
};
use serde_json::{json, Value};

const NS: &str = "cri-e2e";

fn pod(name: &str, app: &str, ip: Option<&str>) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": app}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Pending"},
    });
    if let Some(ip) = ip {
        p["status"] = json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]});
    }
    p
}

/// The sandbox's netns as its pause process has it (the test's own view, not the agent's).
fn netns_of(containerd: &Containerd, id: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{}/ns/net", containerd.sandbox_pid(id)))
}

fn converge(agent: &mut AgentProcess, web: &Path, client: &Path, addr: &str, allowed: bool) {
    let done = wait_until(Duration::from_secs(20), || {
        agent.assert_running();
        netwarden_testing::connect(client, addr).is_ok() == allowed
    });
    assert!(
        done,
        "{addr} still {}; rules of web:\n{}\nagent log:\n{}",
        if allowed { "refused" } else { "connects" },
        rules_snapshot("nft", web),
        agent.log()
    );
}

#[test]
fn netns_from_containerd_and_a_recreated_sandbox() {
    let _heavy = heavy_lock();
    let Some(containerd) = Containerd::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let api = runtime
        .block_on(FakeApiServer::start(ServerOptions::default()))
        .expect("start the fake API server");
    let dir = TempDir::new("nwcri");
    let kubeconfig = dir.path.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}))
        .unwrap();
    // As in a cluster: the pod exists (with its uid) before kubelet runs its sandbox.
    let uid = |created: Value| created["metadata"]["uid"].as_str().unwrap().to_string();
    let web_uid = uid(api.create(pod("web", "web", None)).unwrap());
    let client_uid = uid(api.create(pod("client", "client", None)).unwrap());
    let (web_id, web_ip) = containerd.run_pod_sandbox(NS, "web", &web_uid, &[("app", "web")]);
    let (client_id, client_ip) =
        containerd.run_pod_sandbox(NS, "client", &client_uid, &[("app", "client")]);
    api.update(pod("web", "web", Some(&web_ip))).unwrap();
    api.update(pod("client", "client", Some(&client_ip)))
        .unwrap();
    let web = netns_of(&containerd, &web_id);
    let client = netns_of(&containerd, &client_id);
    let _listeners = [
        listen(&web, &format!("{web_ip}:8080")),
        listen(&web, &format!("{web_ip}:8081")),
    ];
    assert_connects(&client, &format!("{web_ip}:8081"), "no agent yet");

    api.create(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "web-in", "namespace": NS},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                              "ports": [{"protocol": "TCP", "port": 8080}]}]},
    }))
    .unwrap();

    let log = dir.path.join("agent.log");
    let endpoint = containerd.endpoint();
    let args = [
        "run",
        "--kube",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--node-name",
        "n1",
        "--cri-endpoint",
        &endpoint,
        "--interval",
        "200ms",
        "--no-events-stdout",
    ];
    let mut agent = AgentProcess::start(&netwarden_bin!(), &args, &log);
    converge(&mut agent, &web, &client, &format!("{web_ip}:8081"), false);
    assert_connects(&client, &format!("{web_ip}:8080"), "8080 from app=client");
    assert!(!netwarden_leftovers("nft", &web).is_empty());
    assert!(
        netwarden_leftovers("nft", &client).is_empty(),
        "client is selected by no policy"
    );

    // kubelet recreates web's sandbox: same metadata, a new sandbox id and netns. The agent
    // learns it from the runtime alone (no API event) and programs the new netns.
    drop(_listeners);
    containerd.stop_and_remove(&web_id);
    let (web_id2, web_ip2) = containerd.run_pod_sandbox(NS, "web", &web_uid, &[("app", "web")]);
    assert_ne!(web_id2, web_id);
    let web2 = netns_of(&containerd, &web_id2);
    let _listeners = [
        listen(&web2, &format!("{web_ip2}:8080")),
        listen(&web2, &format!("{web_ip2}:8081")),
    ];
    let started = std::time::Instant::now();
    let programmed = wait_until(Duration::from_secs(20), || {
        !netwarden_leftovers("nft", &web2).is_empty()
    });
    assert!(
        programmed,
        "new sandbox not programmed; log:\n{}",
        agent.log()
    );
    eprintln!(
        "recreated sandbox programmed within {:?} of its creation",
        started.elapsed()
    );
    converge(
        &mut agent,
        &web2,
        &client,
        &format!("{web_ip2}:8081"),
        false,
    );
    assert_connects(&client, &format!("{web_ip2}:8080"), "new sandbox: 8080");
    assert_refused(&client, &format!("{web_ip2}:8081"), "new sandbox: 8081");
    agent.assert_running();

    // The runtime hangs: nothing changes by itself, and object changes still apply.
    let rules_before = rules_snapshot("nft", &web2);
    containerd.freeze(true);
    std::thread::sleep(Duration::from_secs(5));
    agent.assert_running();
    assert_eq!(
        rules_snapshot("nft", &web2),
        rules_before,
        "a hung runtime changes no rule; log:\n{}",
        agent.log()
    );
    assert_refused(&client, &format!("{web_ip2}:8081"), "runtime hung: 8081");
    assert_connects(&client, &format!("{web_ip2}:8080"), "runtime hung: 8080");
    let allow = |ports: &[u16]| {
        let ports: Vec<Value> = ports
            .iter()
            .map(|p| json!({"protocol": "TCP", "port": p}))
            .collect();
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "web-in", "namespace": NS},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                                  "ports": ports}]},
        })
    };
    api.update(allow(&[8080, 8081])).unwrap();
    converge(&mut agent, &web2, &client, &format!("{web_ip2}:8081"), true);
    assert!(
        agent.log().contains("the network namespaces known stay"),
        "the outage is reported; log:\n{}",
        agent.log()
    );
    containerd.freeze(false);
    api.update(allow(&[8080])).unwrap();
    converge(
        &mut agent,
        &web2,
        &client,
        &format!("{web_ip2}:8081"),
        false,
    );
    assert_connects(&client, &format!("{web_ip2}:8080"), "runtime back: 8080");
    agent.assert_running();
}
