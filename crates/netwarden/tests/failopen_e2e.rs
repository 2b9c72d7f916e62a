//! The node agent against hostile objects (issue 20): `run --kube` with the fake API server and
//! a real containerd (root and the containerd packages; `CI=true` fails loudly without them).
//! One lab, one agent, the attacks one after the other; each one is a regression test of a
//! path that left a selected pod open:
//!
//! - **a new pod without `status.podIP`** is programmed from its sandbox's addresses (defect 7);
//! - **a terminal pod** whose address is reused is no peer (defect 9);
//! - **a DanmEp naming web's eth0 with another address** leaves web's rules alone (defect 1);
//! - **a DanmEp lending cli another pod's address** lets that pod in nowhere (defect 2);
//! - **a pod annotated with web's runtime netns** is refused, web stays programmed and keeps
//!   receiving changes (defect 8);
//! - **a sandbox in the node's netns for a pod whose spec says otherwise** is a loud refusal,
//!   counted (defect 11);
//! - **an unreadable policy** isolates what it selects, before and after a kill -9 restart
//!   (defect 5);
//! - the local pods are counted by state in `netwarden_local_pods` (defect 13).
//!
//! Pods web (app=web), cli (app=cli) and other (app=other) are sandboxes of node n1; web
//! allows cli on TCP 8080 only (and 8081 later). Connections are real, over the sandboxes'
//! CNI bridge.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use netwarden_kube_fake::{FakeApiServer, ServerOptions};
use netwarden_testing::{
    connect, free_port, heavy_lock, http_get, kube_agent_args, listen, metric, netwarden_bin,
    netwarden_leftovers, ready, rules_snapshot, wait_until, AgentProcess, Containerd, SandboxSpec,
    TempDir,
};
use serde_json::{json, Value};

const NS: &str = "failopen";

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

fn web_policy(ports: &[u16]) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .map(|p| json!({"protocol": "TCP", "port": p}))
        .collect();
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "web-in", "namespace": NS},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "cli"}}}],
                              "ports": ports}]},
    })
}

fn danm_ep(name: &str, pod: &str, interface: &str, address: &str) -> Value {
    json!({
        "apiVersion": "danm.k8s.io/v1", "kind": "DanmEp",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"Pod": pod, "NetworkName": "attack", "NetworkType": "ipvlan",
                 "Interface": {"Name": interface, "Address": address}},
    })
}

/// The sandbox's netns as its pause process has it (the test's own view, not the agent's).
fn netns_of(containerd: &Containerd, id: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{}/ns/net", containerd.sandbox_pid(id)))
}

struct Probe<'a> {
    from: &'a Path,
    to: String,
    name: &'static str,
}

fn probe<'a>(from: &'a Path, ip: &str, port: u16, name: &'static str) -> Probe<'a> {
    Probe {
        from,
        to: format!("{ip}:{port}"),
        name,
    }
}

/// Waits until every probe gives its expected answer, then checks they still do after a few
/// of the agent's ticks (an attack that opens a pod one sync later is caught too).
fn holds(agent: &mut AgentProcess, web: &Path, step: &str, expect: &[(&Probe<'_>, bool)]) {
    let agree = |agent: &mut AgentProcess| {
        agent.assert_running();
        expect
            .iter()
            .all(|(p, allowed)| connect(p.from, &p.to).is_ok() == *allowed)
    };
    let report = |agent: &AgentProcess| {
        let got: Vec<String> = expect
            .iter()
            .map(|(p, allowed)| {
                let ok = connect(p.from, &p.to).is_ok();
                format!(
                    "{} {}: {} (expected {})",
                    p.name,
                    p.to,
                    if ok { "connects" } else { "refused" },
                    if *allowed { "connects" } else { "refused" }
                )
            })
            .collect();
        format!(
            "{step}:\n{}\nrules of web:\n{}\nagent log:\n{}",
            got.join("\n"),
            rules_snapshot("nft", web),
            agent.log()
        )
    };
    let done = wait_until(Duration::from_secs(20), || agree(agent));
    assert!(done, "{}", report(agent));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(agree(agent), "after a few ticks: {}", report(agent));
}

fn local_pods(metrics: SocketAddr, state: &str) -> Option<f64> {
    metric(
        metrics,
        &format!("netwarden_local_pods{{state=\"{state}\"}}"),
    )
}

fn agent_args(kubeconfig: &Path, endpoint: &str, metrics: SocketAddr) -> Vec<String> {
    let mut args = kube_agent_args(kubeconfig, "n1", metrics);
    args.extend(["--cri-endpoint".to_string(), endpoint.to_string()]);
    args
}

#[test]
fn hostile_objects_never_open_a_selected_pod() {
    let _heavy = heavy_lock();
    let Some(containerd) = Containerd::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let api = runtime
        .block_on(FakeApiServer::start(ServerOptions::default()))
        .expect("start the fake API server");
    api.install_crd("danm.k8s.io", "v1", "DanmEp");
    let dir = TempDir::new("nwfo");
    let kubeconfig = dir.path.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}))
        .unwrap();
    let uid = |created: Value| created["metadata"]["uid"].as_str().unwrap().to_string();
    let web_uid = uid(api.create(pod("web", "web", None)).unwrap());
    let cli_uid = uid(api.create(pod("cli", "cli", None)).unwrap());
    let other_uid = uid(api.create(pod("other", "other", None)).unwrap());
    let (web_id, web_ip) = containerd.run_pod_sandbox(NS, "web", &web_uid, &[("app", "web")]);
    let (cli_id, cli_ip) = containerd.run_pod_sandbox(NS, "cli", &cli_uid, &[("app", "cli")]);
    let (other_id, other_ip) =
        containerd.run_pod_sandbox(NS, "other", &other_uid, &[("app", "other")]);
    // web stays without status.podIP for now: the kubelet has not reported it yet.
    api.update(pod("cli", "cli", Some(&cli_ip))).unwrap();
    api.update(pod("other", "other", Some(&other_ip))).unwrap();
    let web = netns_of(&containerd, &web_id);
    let cli = netns_of(&containerd, &cli_id);
    let other = netns_of(&containerd, &other_id);
    let _listeners = [
        listen(&web, &format!("{web_ip}:8080")),
        listen(&web, &format!("{web_ip}:8081")),
        listen(&other, &format!("{other_ip}:8080")),
    ];
    let cli_web = probe(&cli, &web_ip, 8080, "cli → web");
    let cli_web_8081 = probe(&cli, &web_ip, 8081, "cli → web");
    let other_web = probe(&other, &web_ip, 8080, "other → web");
    let cli_other = probe(&cli, &other_ip, 8080, "cli → other");
    assert!(connect(&other, &other_web.to).is_ok(), "no agent yet");
    api.create(web_policy(&[8080])).unwrap();

    let metrics = free_port();
    let args = agent_args(&kubeconfig, &containerd.endpoint(), metrics);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let log = dir.path.join("agent.log");
    let mut agent = AgentProcess::start(&netwarden_bin!(), &args, &log);
    agent.wait_for("ready", Duration::from_secs(60), || ready(metrics));

    // Defect 7: web has no status.podIP; its sandbox's address makes its primary interface.
    holds(
        &mut agent,
        &web,
        "web without status.podIP",
        &[
            (&cli_web, true),
            (&other_web, false),
            (&cli_web_8081, false),
        ],
    );
    api.update(pod("web", "web", Some(&web_ip))).unwrap();

    // Defect 9: a finished Job of app=cli on another node held the address `other` has now.
    api.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "job", "namespace": NS, "labels": {"app": "cli"}},
        "spec": {"nodeName": "n2", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Succeeded", "podIP": other_ip, "podIPs": [{"ip": other_ip}]},
    }))
    .unwrap();
    holds(
        &mut agent,
        &web,
        "a Succeeded pod's reused address",
        &[(&cli_web, true), (&other_web, false)],
    );
    api.delete("v1", "Pod", NS, "job").unwrap();

    // Defect 1: a DanmEp gives web's eth0 an address web does not have.
    api.create(danm_ep("web-eth0", "web", "eth0", "10.250.0.9/24"))
        .unwrap();
    holds(
        &mut agent,
        &web,
        "a DanmEp contradicting web's eth0",
        &[(&cli_web, true), (&other_web, false)],
    );
    assert!(!netwarden_leftovers("nft", &web).is_empty());

    // Defect 2: a DanmEp lends cli the address of `other`.
    api.create(danm_ep(
        "cli-net5",
        "cli",
        "net5",
        &format!("{other_ip}/32"),
    ))
    .unwrap();
    holds(
        &mut agent,
        &web,
        "a DanmEp lending cli other's address",
        &[(&cli_web, true), (&other_web, false)],
    );
    api.delete("danm.k8s.io/v1", "DanmEp", NS, "cli-net5")
        .unwrap();
    api.delete("danm.k8s.io/v1", "DanmEp", NS, "web-eth0")
        .unwrap();

    // Defect 8: a pod with no sandbox claims web's netns (as the runtime made it) by annotation.
    let web_netns = containerd.sandbox_netns(&web_id);
    let mut intruder = pod("intruder", "web", None);
    intruder["metadata"]["annotations"] =
        json!({"netwarden.io/netns": web_netns.display().to_string()});
    api.create(intruder).unwrap();
    let refused = wait_until(Duration::from_secs(20), || {
        local_pods(metrics, "refused") == Some(1.0)
    });
    assert!(
        refused,
        "intruder not refused:\n{}\nagent log:\n{}",
        http_get(metrics, "/metrics").unwrap_or_default(),
        agent.log()
    );
    // web stays programmed and still receives changes.
    api.update(web_policy(&[8080, 8081])).unwrap();
    holds(
        &mut agent,
        &web,
        "an intruder annotated with web's netns",
        &[(&cli_web, true), (&cli_web_8081, true), (&other_web, false)],
    );
    assert!(
        agent.log().contains("intruder"),
        "the refusal is logged, naming the pod:\n{}",
        agent.log()
    );
    api.delete("v1", "Pod", NS, "intruder").unwrap();

    // Defect 11: the runtime runs a sandbox in the node's netns; the API says it has its own.
    let host_uid = uid(api.create(pod("hostnet", "web", None)).unwrap());
    let mut spec = SandboxSpec::pod(NS, "hostnet", &host_uid);
    spec.host_network = true;
    containerd.run(&spec);
    let refused = wait_until(Duration::from_secs(20), || {
        local_pods(metrics, "refused") == Some(1.0)
    });
    assert!(
        refused,
        "a runtime host-network answer for a pod with hostNetwork false is refused:\n{}\n{}",
        http_get(metrics, "/metrics").unwrap_or_default(),
        agent.log()
    );
    assert!(
        agent.log().contains("spec.hostNetwork is false"),
        "{}",
        agent.log()
    );

    // Defect 13: web programmed, cli and other selected by nothing, hostnet refused.
    let counted = wait_until(Duration::from_secs(10), || {
        local_pods(metrics, "programmed") == Some(1.0)
            && local_pods(metrics, "not_selected") == Some(2.0)
            && local_pods(metrics, "refused") == Some(1.0)
            && local_pods(metrics, "waiting_for_netns") == Some(0.0)
    });
    assert!(
        counted,
        "local pods by state:\n{}",
        http_get(metrics, "/metrics").unwrap_or_default()
    );

    // Defect 5: a policy that cannot be read isolates what it selects, with no allows, and
    // the same after a kill -9 restart (no "last good version" to fall back on).
    api.create(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "other-bad", "namespace": NS},
        "spec": {"podSelector": {"matchLabels": {"app": "other"}},
                 "policyTypes": ["Ingress", "Sideways"],
                 "ingress": [{"from": [{"podSelector": {}}]}]},
    }))
    .unwrap();
    holds(
        &mut agent,
        &web,
        "an unreadable policy selecting other",
        &[(&cli_other, false), (&cli_web, true)],
    );
    agent.kill();
    let log2 = dir.path.join("agent2.log");
    let mut agent = AgentProcess::start(&netwarden_bin!(), &args, &log2);
    agent.wait_for("ready after restart", Duration::from_secs(60), || {
        ready(metrics)
    });
    holds(
        &mut agent,
        &web,
        "the unreadable policy after a restart",
        &[(&cli_other, false), (&cli_web, true), (&other_web, false)],
    );
    assert!(
        agent.log().contains("other-bad"),
        "the unreadable policy is reported:\n{}",
        agent.log()
    );
}
