//! Multi-node end to end: one fake API server (real list/watch over HTTP), three
//! `netwarden run --kube` child processes with `--node-name n1|n2|n3`, nine pods of one cluster
//! (two namespaces) spread three per node, each pod a network namespace of this test on one
//! bridge, so connections cross nodes as they would over a cluster network (root; fails when
//! `CI=true` without it).
//!
//! What it proves, as issue 8 asks:
//! - each agent programs only its own node's pods: a pod has netwarden's table exactly when a
//!   policy selects it, each agent's `netwarden_managed_pods` counts its node's isolated pods
//!   only, and no agent ever considers more pods than its node holds;
//! - every (from, to, port) verdict of a real TCP probe equals `netwarden reach` run on the
//!   same objects written as files;
//! - a relabel of a pod on n2, which the policy of a pod on n1 depends on, is applied by n1's
//!   agent only (n2 and n3 apply nothing), and the probes agree with `reach` again;
//! - the API load: one LIST and one WATCH per watched kind per agent, no relist (printed).
//!
//! Namespaces are `nwmn<pid>-…`, removed even when the test fails; traffic only flows between
//! them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use netwarden_kube::WATCHED_KINDS;
use netwarden_kube_fake::{FakeApiServer, ServerOptions};
use netwarden_testing::{
    free_port, ip, kube_agent_args, listen, metric, netwarden_bin, netwarden_leftovers, probe,
    ready, root_or_skip, sync_lines, sync_lines_in, veth, wait_reachable, wait_until, AgentProcess,
    Namespaces, TempDir,
};
use serde_json::{json, Value};

const NODES: [&str; 3] = ["n1", "n2", "n3"];
/// The ports every pod listens on: policies allow 8080 only, so 8081 shows isolation.
const PORTS: [u16; 2] = [8080, 8081];

/// A pod of the test cluster.
struct PodDef {
    ns: &'static str,
    name: &'static str,
    node: &'static str,
    app: &'static str,
    /// The label the relabel step flips (`front` / `back`), when the pod has it.
    tier: Option<&'static str>,
    /// The last byte of its address in 10.232.0.0/24.
    host: u8,
}

impl PodDef {
    fn ip(&self) -> String {
        format!("10.232.0.{}", self.host)
    }
    fn key(&self) -> String {
        format!("{}/{}", self.ns, self.name)
    }
}

/// Three pods per node, in two namespaces. `mn-a/a2` (n2) is the pod relabelled: only the
/// policy of `mn-a/a1` (n1) depends on its `tier`.
const PODS: [PodDef; 9] = [
    pod("mn-a", "a1", "n1", "api", None, 1),
    pod("mn-a", "a2", "n2", "web", Some("front"), 2),
    pod("mn-a", "a3", "n3", "db", None, 3),
    pod("mn-a", "a4", "n1", "web", Some("front"), 4),
    pod("mn-a", "a5", "n2", "db", None, 5),
    pod("mn-b", "b1", "n3", "web", Some("front"), 6),
    pod("mn-b", "b2", "n1", "db", None, 7),
    pod("mn-b", "b3", "n2", "tool", None, 8),
    pod("mn-b", "b4", "n3", "api", None, 9),
];

const fn pod(
    ns: &'static str,
    name: &'static str,
    node: &'static str,
    app: &'static str,
    tier: Option<&'static str>,
    host: u8,
) -> PodDef {
    PodDef {
        ns,
        name,
        node,
        app,
        tier,
        host,
    }
}

fn namespace_doc(name: &str, team: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": name, "labels": {"team": team}}})
}

fn pod_doc(p: &PodDef, tier: Option<&str>, netns: &Path) -> Value {
    let mut labels = json!({"app": p.app});
    if let Some(tier) = tier {
        labels["tier"] = json!(tier);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": p.name, "namespace": p.ns, "uid": format!("uid-{}", p.name),
                     "labels": labels,
                     "annotations": {"netwarden.io/netns": netns.display().to_string()}},
        "spec": {"nodeName": p.node, "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running", "podIP": p.ip(), "podIPs": [{"ip": p.ip()}]},
    })
}

/// A NetworkPolicy of the test: the pods it selects are `app=target` in `ns`.
struct PolicyDef {
    ns: &'static str,
    name: &'static str,
    target: &'static str,
    doc: Value,
}

impl PolicyDef {
    fn selects(&self, p: &PodDef) -> bool {
        p.ns == self.ns && p.app == self.target
    }
}

fn network_policy(
    ns: &'static str,
    name: &'static str,
    target: &'static str,
    monitor: bool,
    spec: Value,
) -> PolicyDef {
    let mut spec = spec;
    spec["podSelector"] = json!({"matchLabels": {"app": target}});
    let mut doc = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    });
    if monitor {
        doc["metadata"]["annotations"] = json!({"netwarden.io/mode": "monitor"});
    }
    PolicyDef {
        ns,
        name,
        target,
        doc,
    }
}

/// Every peer kind of NetworkPolicy, ingress and egress, one in monitor mode.
fn policies() -> Vec<PolicyDef> {
    let tcp8080 = json!([{"protocol": "TCP", "port": 8080}]);
    vec![
        // a1 (n1): from tier=front pods of its namespace (a2 on n2, a4 on n1).
        network_policy(
            "mn-a",
            "api-in",
            "api",
            false,
            json!({"policyTypes": ["Ingress"], "ingress": [{
                "from": [{"podSelector": {"matchLabels": {"tier": "front"}}}],
                "ports": tcp8080}]}),
        ),
        // a3 (n3), a5 (n2): from every pod of a team=b namespace.
        network_policy(
            "mn-a",
            "db-in",
            "db",
            false,
            json!({"policyTypes": ["Ingress"], "ingress": [{
                "from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}],
                "ports": tcp8080}]}),
        ),
        // b1 (n3): from 10.232.0.0/29 but .4 and .5.
        network_policy(
            "mn-b",
            "web-in",
            "web",
            false,
            json!({"policyTypes": ["Ingress"], "ingress": [{
                "from": [{"ipBlock": {"cidr": "10.232.0.0/29", "except": ["10.232.0.4/31"]}}],
                "ports": tcp8080}]}),
        ),
        // b3 (n2): egress only to app=db pods of any namespace.
        network_policy(
            "mn-b",
            "tool-out",
            "tool",
            false,
            json!({"policyTypes": ["Egress"], "egress": [{
                "to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "db"}}}],
                "ports": tcp8080}]}),
        ),
        // b2 (n1): deny all ingress, monitored only (everything still passes).
        network_policy(
            "mn-b",
            "db-deny",
            "db",
            true,
            json!({"policyTypes": ["Ingress"], "ingress": []}),
        ),
    ]
}

/// One agent: its node, process, log and metrics address.
struct Agent {
    node: &'static str,
    process: AgentProcess,
    log: PathBuf,
    metrics: SocketAddr,
}

impl Agent {
    /// The sum of `applied` over its sync lines so far.
    fn applied(&self) -> usize {
        sync_lines_in(&self.log).iter().map(|s| s.applied).sum()
    }
}

/// `netwarden reach` on the objects written in `dir`: `(from, to, port)` → allowed.
fn reach(dir: &Path) -> BTreeMap<(String, String, u16), bool> {
    let mut args = vec!["reach".to_string(), "-f".into(), dir.display().to_string()];
    for port in PORTS {
        args.extend(["--port".into(), format!("{port}/TCP")]);
    }
    args.extend(["-o".into(), "json".into()]);
    let out = std::process::Command::new(netwarden_bin!())
        .args(&args)
        .output()
        .expect("netwarden reach");
    assert!(
        out.status.success(),
        "netwarden reach: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("reach JSON");
    report["probes"]
        .as_array()
        .expect("reach: probes")
        .iter()
        .map(|p| {
            let field = |k: &str| p[k].as_str().unwrap_or_else(|| panic!("{k} in {p}"));
            let port = p["port"].as_u64().expect("port") as u16;
            let allowed = p["allowed"].as_bool().expect("allowed");
            ((field("from").into(), field("to").into(), port), allowed)
        })
        .collect()
}

/// Probes every (from, to, port) with a real TCP connection; returns the ones whose outcome
/// differs from `want` (a denial must be a refusal, not a timeout).
fn disagreements(
    netns: &BTreeMap<String, PathBuf>,
    want: &BTreeMap<(String, String, u16), bool>,
) -> Vec<String> {
    let ip_of: BTreeMap<String, String> = PODS.iter().map(|p| (p.key(), p.ip())).collect();
    want.iter()
        .filter_map(|((from, to, port), &allowed)| {
            let observed = probe(&netns[from], &format!("{}:{port}", ip_of[to]));
            let agrees = match &observed {
                Ok(()) => allowed,
                Err(e) => !allowed && e.kind() == std::io::ErrorKind::ConnectionRefused,
            };
            (!agrees).then(|| {
                format!("{from} -> {to}:{port}: reach says {allowed}, observed {observed:?}")
            })
        })
        .collect()
}

/// Waits until every probe agrees with `reach` on the files in `dir` (the agents apply
/// asynchronously); fails with the disagreements and the agents' logs otherwise.
fn converge(
    agents: &mut [Agent],
    netns: &BTreeMap<String, PathBuf>,
    dir: &Path,
    why: &str,
) -> usize {
    let want = reach(dir);
    assert_eq!(
        want.len(),
        PODS.len() * PODS.len() * PORTS.len(),
        "{why}: every ordered pair, every port"
    );
    let mut wrong = Vec::new();
    let done = wait_until(Duration::from_secs(30), || {
        for a in agents.iter_mut() {
            a.process.assert_running();
        }
        wrong = disagreements(netns, &want);
        wrong.is_empty()
    });
    if !done {
        let logs: Vec<String> = agents
            .iter()
            .map(|a| format!("--- agent {}:\n{}", a.node, a.process.log()))
            .collect();
        panic!(
            "{why}: probes disagree with reach: {wrong:#?}\n{}",
            logs.join("\n")
        );
    }
    want.values().filter(|&&a| a).count()
}

#[test]
fn three_agents_one_cluster() {
    if !root_or_skip() {
        return;
    }
    // The cluster network: one bridge in a fabric netns, one veth per pod.
    let mut nss = Namespaces::new("nwmn");
    let fabric = nss.create("fabric");
    ip(&fabric, &["link", "add", "br0", "type", "bridge"]);
    ip(&fabric, &["link", "set", "br0", "up"]);
    let mut netns: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut listeners = Vec::new();
    for p in &PODS {
        let path = nss.create(p.name);
        let port_if = format!("v{}", p.name);
        veth(
            &path,
            "eth0",
            &[&format!("{}/24", p.ip())],
            &fabric,
            &port_if,
            &[],
        );
        ip(&fabric, &["link", "set", &port_if, "master", "br0"]);
        for port in PORTS {
            listeners.push(listen(&path, &format!("{}:{port}", p.ip())));
        }
        netns.insert(p.key(), path);
    }
    for p in &PODS[1..] {
        wait_reachable(&netns[&PODS[0].key()], &format!("{}:8081", p.ip()));
    }

    // The same objects in the API server and as files for `reach`.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let api = runtime
        .block_on(FakeApiServer::start(ServerOptions::default()))
        .expect("start the fake API server");
    // Every optional kind served, so that every watched kind is listed and watched.
    api.install_crd("danm.k8s.io", "v1", "DanmNetworkPolicy");
    api.install_crd("danm.k8s.io", "v1", "DanmEp");
    api.install_crd("k8s.cni.cncf.io", "v1beta2", "MultiNetworkPolicy");
    // The admin policy kinds (SPEC 8) and Nodes are watched like the rest.
    api.install_crd(
        "policy.networking.k8s.io",
        "v1alpha2",
        "ClusterNetworkPolicy",
    );
    api.install_crd("policy.networking.k8s.io", "v1alpha1", "AdminNetworkPolicy");
    api.install_crd(
        "policy.networking.k8s.io",
        "v1alpha1",
        "BaselineAdminNetworkPolicy",
    );
    let dir = TempDir::new("nwmn");
    let files = TempDir::new("nwmn-files");
    let kubeconfig = dir.path.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let put = |file: &str, doc: Value, create: bool| {
        files.write(
            &format!("{file}.json"),
            &serde_json::to_string(&doc).unwrap(),
        );
        if create {
            api.create(doc).unwrap();
        } else {
            api.update(doc).unwrap();
        }
    };
    put("ns-a", namespace_doc("mn-a", "a"), true);
    put("ns-b", namespace_doc("mn-b", "b"), true);
    for p in &PODS {
        put(
            &format!("pod-{}", p.name),
            pod_doc(p, p.tier, &netns[&p.key()]),
            true,
        );
    }
    let policies = policies();
    for np in &policies {
        put(&format!("np-{}-{}", np.ns, np.name), np.doc.clone(), true);
    }

    let mut agents: Vec<Agent> = NODES
        .iter()
        .map(|&node| {
            let metrics = free_port();
            let log = dir.path.join(format!("agent-{node}.log"));
            let args = kube_agent_args(&kubeconfig, node, metrics);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let process = AgentProcess::start(&netwarden_bin!(), &args, &log);
            Agent {
                node,
                process,
                log,
                metrics,
            }
        })
        .collect();
    for a in &mut agents {
        let metrics = a.metrics;
        a.process
            .wait_for("ready", Duration::from_secs(60), || ready(metrics));
    }

    let allowed = converge(&mut agents, &netns, &files.path, "initial state");
    eprintln!(
        "initial state: {} probes agree with reach ({allowed} allowed)",
        PODS.len() * PODS.len() * PORTS.len()
    );

    // Each agent programmed exactly its node's pods that a policy selects.
    let isolated: BTreeSet<String> = PODS
        .iter()
        .filter(|p| policies.iter().any(|np| np.selects(p)))
        .map(PodDef::key)
        .collect();
    for p in &PODS {
        let tables = netwarden_leftovers("nft", &netns[&p.key()]);
        assert_eq!(
            !tables.is_empty(),
            isolated.contains(&p.key()),
            "{} on {}: netwarden's tables {tables:?}",
            p.key(),
            p.node
        );
    }
    for a in &mut agents {
        let local = PODS.iter().filter(|p| p.node == a.node);
        let want = local.filter(|p| isolated.contains(&p.key())).count();
        let metrics = a.metrics;
        let managed = || metric(metrics, "netwarden_managed_pods");
        a.process
            .wait_for("managed pods reported", Duration::from_secs(10), || {
                managed() == Some(want as f64)
            });
        let on_node = PODS.iter().filter(|p| p.node == a.node).count();
        for line in sync_lines(&a.process.log()) {
            assert!(
                line.considered <= on_node,
                "agent {} considered {} pods, its node has {on_node}: {line:?}",
                a.node,
                line.considered
            );
        }
    }

    // A pod on n2 relabelled: only the policy of a1 on n1 depends on its tier.
    let before: Vec<usize> = agents.iter().map(Agent::applied).collect();
    let a2 = &PODS[1];
    assert_eq!((a2.name, a2.node), ("a2", "n2"));
    put(
        "pod-a2",
        pod_doc(a2, Some("back"), &netns[&a2.key()]),
        false,
    );
    converge(&mut agents, &netns, &files.path, "a2 relabelled tier=back");
    let a1 = PODS[0].key();
    assert_eq!(
        probe(&netns[&a2.key()], &format!("{}:8080", PODS[0].ip())).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionRefused),
        "a2 -> {a1}:8080 denied after the relabel"
    );
    // Give n2 and n3 the time to react if they would (they are polled every 200 ms).
    std::thread::sleep(Duration::from_secs(1));
    let after: Vec<usize> = agents.iter().map(Agent::applied).collect();
    let re_applied: Vec<usize> = before.iter().zip(&after).map(|(b, a)| a - b).collect();
    eprintln!("pods applied per agent after the relabel (n1, n2, n3): {re_applied:?}");
    assert!(re_applied[0] >= 1, "n1 re-applies a1: {re_applied:?}");
    assert_eq!(&re_applied[1..], [0, 0], "n2 and n3 apply nothing");

    // API load: one LIST and one WATCH per kind per agent, no relist.
    let requests = api.requests();
    let mut figures = Vec::new();
    for kind in WATCHED_KINDS {
        let (lists, watches) = (requests.lists(kind.kind), requests.watches(kind.kind));
        figures.push(format!("{}: {lists} LIST, {watches} WATCH", kind.kind));
        assert_eq!(
            (lists, watches),
            (NODES.len(), NODES.len()),
            "{}: one LIST and one WATCH per agent",
            kind.kind
        );
    }
    eprintln!(
        "API requests of {} agents ({} in all): {}",
        NODES.len(),
        requests.len(),
        figures.join("; ")
    );
    for a in &mut agents {
        a.process.assert_running();
    }
    drop(listeners);
}
