//! `netwarden run --kube` end to end: the fake API server (real list/watch over HTTP), the
//! real `netwarden` binary as a child process with `--node-name n1`, real network namespaces,
//! real TCP connections (root; fails when `CI=true` without it).
//!
//! One pod `web` on node n1 (programmed here) serves TCP 8080 and 8081; a pod `client` on node
//! n2 (a peer only: this agent never programs it, although its netns annotation names a netns
//! of this test) connects to it over a veth. Every step changes the cluster through the API and
//! checks a real connection against what the policies say:
//! policy added, changed, remote peer relabelled, namespace relabelled, monitor → enforce;
//! the API server stopped (rules stay, `/readyz` 503), compacted (410 on the relist) and
//! restarted (converges); the agent killed with SIGKILL mid-stream and restarted (the rules
//! stay in place meanwhile and it converges); policy deleted; pod deleted. Also: a partial view
//! is never applied; a CRD's group hidden for a moment keeps its policies enforced.
//!
//! Namespaces are `nwk<pid>-…`, removed even when the test fails; traffic only flows between
//! them.

use std::path::Path;
use std::time::Duration;

use netwarden_kube_fake::{FakeApiServer, ServerOptions};
use netwarden_testing::{
    assert_connects, assert_refused, free_port, http_get, kube_agent_args, listen, netwarden_bin,
    netwarden_leftovers, ready, root_or_skip, rules_snapshot, veth, wait_reachable, wait_until,
    AgentProcess, Namespaces, TempDir,
};
use serde_json::{json, Value};

const NS: &str = "kube-e2e";
const WEB: &str = "10.231.0.1";
const CLIENT: &str = "10.231.0.2";

fn namespace(labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": NS, "labels": labels}})
}

fn pod(name: &str, node: &str, ip: &str, labels: Value, netns: &Path) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels,
                     "annotations": {"netwarden.io/netns": netns.display().to_string()}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    })
}

/// Ingress to `app=web` on TCP 8080 only, from the peers `from` (a NetworkPolicy peer list).
fn policy(from: Value, mode: Option<&str>) -> Value {
    let mut p = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "web-in", "namespace": NS},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": from, "ports": [{"protocol": "TCP", "port": 8080}]}]},
    });
    if let Some(mode) = mode {
        p["metadata"]["annotations"] = json!({"netwarden.io/mode": mode});
    }
    p
}

/// The pod `web` and the client that connects to it.
struct Pair<'a> {
    web: &'a Path,
    client: &'a Path,
}

/// Waits until connecting from the client to `addr` does what `allowed` says (the agent
/// applies asynchronously); fails with the agent's log and the pod's rules otherwise.
fn converge(agent: &mut AgentProcess, pair: &Pair<'_>, addr: &str, allowed: bool, why: &str) {
    let done = wait_until(Duration::from_secs(20), || {
        agent.assert_running();
        netwarden_testing::connect(pair.client, addr).is_ok() == allowed
    });
    assert!(
        done,
        "{why}: {addr} still {}; rules of web:\n{}\nagent log:\n{}",
        if allowed { "refused" } else { "connects" },
        rules_snapshot("nft", pair.web),
        agent.log()
    );
    if allowed {
        assert_connects(pair.client, addr, why);
    } else {
        assert_refused(pair.client, addr, why);
    }
}

/// The two pods' netns joined by a veth (`web` listening on 8080 and 8081), and the fake API
/// server holding the namespace and both pods: `web` on node n1 (this agent's), `client` on
/// n2. Fields drop in order: listeners, then the server, then the namespaces.
struct Lab {
    _listeners: [std::net::TcpListener; 2],
    api: FakeApiServer,
    runtime: tokio::runtime::Runtime,
    dir: TempDir,
    web: std::path::PathBuf,
    client: std::path::PathBuf,
    _nss: Namespaces,
}

impl Lab {
    fn new(prefix: &str) -> Lab {
        let mut nss = Namespaces::new(prefix);
        let web = nss.create("web");
        let client = nss.create("client");
        veth(
            &web,
            "eth0",
            &[&format!("{WEB}/24")],
            &client,
            "eth0",
            &[&format!("{CLIENT}/24")],
        );
        let listeners = [
            listen(&web, &format!("{WEB}:8080")),
            listen(&web, &format!("{WEB}:8081")),
        ];
        wait_reachable(&client, &format!("{WEB}:8081"));
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let api = runtime
            .block_on(FakeApiServer::start(ServerOptions::default()))
            .expect("start the fake API server");
        let dir = TempDir::new(prefix);
        api.write_kubeconfig(&dir.path.join("kubeconfig")).unwrap();
        api.create(namespace(json!({"team": "a"}))).unwrap();
        api.create(pod("web", "n1", WEB, json!({"app": "web"}), &web))
            .unwrap();
        api.create(pod(
            "client",
            "n2",
            CLIENT,
            json!({"app": "client"}),
            &client,
        ))
        .unwrap();
        Lab {
            _listeners: listeners,
            api,
            runtime,
            dir,
            web,
            client,
            _nss: nss,
        }
    }

    /// `run --kube` as node n1, polling every 200 ms, serving `/metrics` and `/readyz` on
    /// `metrics`.
    fn agent_args(&self, metrics: std::net::SocketAddr) -> Vec<String> {
        kube_agent_args(&self.dir.path.join("kubeconfig"), "n1", metrics)
    }
}

#[test]
fn kube_agent_end_to_end() {
    if !root_or_skip() {
        return;
    }
    let lab = Lab::new("nwk");
    let (web, client, api) = (lab.web.clone(), lab.client.clone(), &lab.api);
    let (open, closed) = (format!("{WEB}:8080"), format!("{WEB}:8081"));
    let pair = Pair {
        web: &web,
        client: &client,
    };
    let metrics = free_port();
    let log = lab.dir.path.join("agent.log");
    let args = lab.agent_args(metrics);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let start = |log: &Path| AgentProcess::start(&netwarden_bin!(), &args, log);
    let mut agent = start(&log);
    agent.wait_for("ready", Duration::from_secs(30), || ready(metrics));

    // One async runtime: the watchers, the metrics server and the loop are on its threads;
    // none of the runtimes each part once built for itself is left.
    let threads: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", agent.pid()))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_string())
        .collect();
    assert!(threads.iter().any(|t| t == "netwarden-rt"), "{threads:?}");
    for theirs in ["kube-watch", "metrics-http", "cri"] {
        assert!(
            !threads.iter().any(|t| t == theirs),
            "{theirs}: {threads:?}"
        );
    }

    // No policy: everything connects; nothing programmed anywhere.
    assert_connects(&client, &closed, "no policy yet");
    assert!(netwarden_leftovers("nft", &web).is_empty());

    // Policy added: 8080 from app=client only.
    api.create(policy(
        json!([{"podSelector": {"matchLabels": {"app": "client"}}}]),
        None,
    ))
    .unwrap();
    converge(
        &mut agent,
        &pair,
        &closed,
        false,
        "policy added: 8081 denied",
    );
    assert_connects(&client, &open, "policy added: 8080 from app=client");
    assert!(
        netwarden_leftovers("nft", &client).is_empty(),
        "the pod on node n2 is never programmed by n1's agent"
    );

    // The local pod relabelled: the policy no longer selects it, then again.
    api.update(pod("web", "n1", WEB, json!({"app": "webx"}), &web))
        .unwrap();
    converge(
        &mut agent,
        &pair,
        &closed,
        true,
        "local pod relabelled away",
    );
    api.update(pod("web", "n1", WEB, json!({"app": "web"}), &web))
        .unwrap();
    converge(
        &mut agent,
        &pair,
        &closed,
        false,
        "local pod relabelled back",
    );

    // The remote peer relabelled: it no longer matches.
    api.update(pod(
        "client",
        "n2",
        CLIENT,
        json!({"app": "other"}),
        &client,
    ))
    .unwrap();
    converge(&mut agent, &pair, &open, false, "peer relabelled away");
    api.update(pod(
        "client",
        "n2",
        CLIENT,
        json!({"app": "client"}),
        &client,
    ))
    .unwrap();
    converge(&mut agent, &pair, &open, true, "peer relabelled back");

    // Policy changed to a namespaceSelector; then the namespace relabelled.
    api.update(policy(
        json!([{"namespaceSelector": {"matchLabels": {"team": "a"}}}]),
        None,
    ))
    .unwrap();
    converge(&mut agent, &pair, &open, true, "namespace team=a allowed");
    api.update(namespace(json!({"team": "b"}))).unwrap();
    converge(
        &mut agent,
        &pair,
        &open,
        false,
        "namespace relabelled to team=b",
    );
    api.update(namespace(json!({"team": "a"}))).unwrap();
    converge(&mut agent, &pair, &open, true, "namespace relabelled back");

    // Monitor, then enforce.
    api.update(policy(
        json!([{"podSelector": {"matchLabels": {"app": "client"}}}]),
        Some("monitor"),
    ))
    .unwrap();
    converge(&mut agent, &pair, &closed, true, "monitor: 8081 passes");
    api.update(policy(
        json!([{"podSelector": {"matchLabels": {"app": "client"}}}]),
        Some("enforce"),
    ))
    .unwrap();
    converge(&mut agent, &pair, &closed, false, "enforce: 8081 denied");

    // API outage: rules stay, not ready; meanwhile the policy changes and history is compacted
    // (the watchers' resume is 410 Gone: they relist).
    lab.runtime.block_on(api.stop());
    agent.wait_for(
        "not ready while the API is down",
        Duration::from_secs(30),
        || !ready(metrics),
    );
    assert_refused(&client, &closed, "API down: the rules stay");
    assert_connects(&client, &open, "API down: the rules stay");
    api.update(policy(
        json!([{"podSelector": {"matchLabels": {"app": "nobody"}}}]),
        None,
    ))
    .unwrap();
    api.compact();
    lab.runtime.block_on(api.restart()).unwrap();
    converge(
        &mut agent,
        &pair,
        &open,
        false,
        "caught up after the outage",
    );
    agent.wait_for("ready again", Duration::from_secs(30), || ready(metrics));
    let text = http_get(metrics, "/metrics").unwrap();
    assert!(text.contains("netwarden_objects{kind=\"Pod\"} 2"), "{text}");
    assert!(text.contains("netwarden_event_to_apply_seconds_count"));

    // SIGKILL mid-stream; the rules stay while no agent runs; the restarted agent converges
    // on what changed meanwhile, and never removes the rules in place first.
    agent.kill();
    api.update(policy(
        json!([{"podSelector": {"matchLabels": {"app": "client"}}}]),
        None,
    ))
    .unwrap();
    assert_refused(&client, &closed, "no agent: the rules stay");
    let mut agent = start(&log);
    for _ in 0..10 {
        assert_refused(&client, &closed, "restarting agent: no window");
        std::thread::sleep(Duration::from_millis(50));
    }
    converge(&mut agent, &pair, &open, true, "restarted agent converged");
    assert_refused(&client, &closed, "restarted agent converged");

    // Policy deleted: open again, nothing left in the pod's netns.
    api.delete("networking.k8s.io/v1", "NetworkPolicy", NS, "web-in")
        .unwrap();
    converge(&mut agent, &pair, &closed, true, "policy deleted");
    assert!(wait_until(Duration::from_secs(10), || netwarden_leftovers(
        "nft", &web
    )
    .is_empty()));

    // Pod deleted (with a policy that selects it): its rules go. Before that, SIGTERM: the
    // agent stops cleanly and leaves the rules in place.
    api.create(policy(json!([]), None)).unwrap();
    converge(&mut agent, &pair, &closed, false, "deny again");
    let text = http_get(metrics, "/metrics").unwrap();
    for line in text
        .lines()
        .filter(|l| l.starts_with("netwarden_event_to_apply_seconds_"))
    {
        eprintln!("{line}");
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let stopped = wait_until(Duration::from_secs(10), || {
        agent.child.try_wait().unwrap().is_some()
    });
    assert!(stopped, "SIGTERM: the agent stops; log:\n{}", agent.log());
    assert!(agent.child.wait().unwrap().success(), "{}", agent.log());
    assert!(agent.log().contains("stopping; the rules in place stay"));
    assert_refused(&client, &closed, "stopped agent: the rules stay");
    let mut agent = start(&log);
    agent.wait_for("ready after SIGTERM", Duration::from_secs(30), || {
        ready(metrics)
    });
    api.delete("v1", "Pod", NS, "web").unwrap();
    converge(
        &mut agent,
        &pair,
        &closed,
        true,
        "pod deleted: its rules removed",
    );
    assert!(netwarden_leftovers("nft", &client).is_empty());
    assert!(wait_until(Duration::from_secs(10), || netwarden_leftovers(
        "nft", &web
    )
    .is_empty()));

    // Pod created while the agent runs: programmed at once.
    api.create(pod("web", "n1", WEB, json!({"app": "web"}), &web))
        .unwrap();
    converge(&mut agent, &pair, &closed, false, "pod created: isolated");
    assert_connects(&client, &open, "pod created: 8080 allowed");

    // One watch per kind at a time, and relists only after the outage and the restart.
    let requests = api.requests();
    let pod_lists = requests.lists("Pod");
    assert!(
        (2..=6).contains(&pod_lists),
        "pod lists: {pod_lists} (start, outage relist, restart)"
    );
    agent.assert_running();
}

/// Fail closed while the view is partial: one kind (Service) cannot be listed, so the agent
/// holds every other kind — and feeds them to its engine as they come — but applies nothing
/// and is not ready; a pod its policy would isolate stays as it was. Once the kind lists, the
/// policy is enforced.
#[test]
fn a_partial_view_is_never_applied() {
    if !root_or_skip() {
        return;
    }
    let lab = Lab::new("nwkp");
    let (web, client, api) = (lab.web.clone(), lab.client.clone(), &lab.api);
    let (open, closed) = (format!("{WEB}:8080"), format!("{WEB}:8081"));
    let pair = Pair {
        web: &web,
        client: &client,
    };
    api.create(policy(
        json!([{"podSelector": {"matchLabels": {"app": "client"}}}]),
        None,
    ))
    .unwrap();
    api.set_kind_unavailable("Service", true);
    let metrics = free_port();
    let log = lab.dir.path.join("agent.log");
    let args = lab.agent_args(metrics);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent = AgentProcess::start(&netwarden_bin!(), &args, &log);
    // Many feeds of the partial view (every 250 ms) and many failed lists of Services.
    let served = wait_until(Duration::from_secs(20), || {
        agent.assert_running();
        http_get(metrics, "/readyz").is_some()
    });
    assert!(served, "the agent serves /readyz; log:\n{}", agent.log());
    std::thread::sleep(Duration::from_secs(3));
    agent.assert_running();
    assert!(
        !ready(metrics),
        "not ready while Services cannot be listed; log:\n{}",
        agent.log()
    );
    assert!(
        netwarden_leftovers("nft", &web).is_empty(),
        "nothing applied from a partial view; rules of web:\n{}\nlog:\n{}",
        rules_snapshot("nft", &web),
        agent.log()
    );
    assert_connects(&client, &closed, "partial view: nothing enforced yet");
    assert!(
        api.requests()
            .0
            .iter()
            .any(|r| r.kind.as_deref() == Some("Service") && r.code == 503),
        "the Service list was refused"
    );

    // The kind lists: the complete view is applied.
    api.set_kind_unavailable("Service", false);
    converge(
        &mut agent,
        &pair,
        &closed,
        false,
        "complete view: 8081 denied",
    );
    assert_connects(&client, &open, "complete view: 8080 from app=client");
    let became_ready = wait_until(Duration::from_secs(20), || ready(metrics));
    assert!(became_ready, "ready once every kind is listed");
}

/// Issue 20, defect 4: the API server hides the `danm.k8s.io` group for a moment (a restarting
/// kube-apiserver answers 404 for CRDs): the DanmNetworkPolicy stays enforced (8081 still
/// refused, no window), `/readyz` is 503 naming the kind, and the agent recovers when the group
/// returns. Hidden beyond `--crd-grace`, the CRD counts as deleted: its policy is dropped.
#[test]
fn a_crd_answering_404_for_a_moment_keeps_its_policies() {
    if !root_or_skip() {
        return;
    }
    let lab = Lab::new("nwkc");
    let (web, client, api) = (lab.web.clone(), lab.client.clone(), &lab.api);
    let (open, closed) = (format!("{WEB}:8080"), format!("{WEB}:8081"));
    let pair = Pair {
        web: &web,
        client: &client,
    };
    api.install_crd("danm.k8s.io", "v1", "DanmNetworkPolicy");
    let mut danm = policy(
        json!([{"podSelector": {"matchLabels": {"app": "client"}}}]),
        None,
    );
    danm["apiVersion"] = json!("danm.k8s.io/v1");
    danm["kind"] = json!("DanmNetworkPolicy");
    api.create(danm).unwrap();
    let metrics = free_port();
    let log = lab.dir.path.join("agent.log");
    let mut args = lab.agent_args(metrics);
    args.extend(["--crd-grace".to_string(), "10s".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent = AgentProcess::start(&netwarden_bin!(), &args, &log);
    agent.wait_for("ready", Duration::from_secs(30), || ready(metrics));
    converge(
        &mut agent,
        &pair,
        &closed,
        false,
        "DanmNetworkPolicy enforced",
    );
    assert_connects(&client, &open, "8080 from app=client");

    // Hidden for 3 s, connections cut: nothing opens.
    api.hide_group("danm.k8s.io", true);
    api.drop_watches();
    let hidden = std::time::Instant::now();
    agent.wait_for(
        "not ready, naming the kind",
        Duration::from_secs(10),
        || {
            // Cut again until seen: a watch whose request raced the hiding may have missed
            // a single cut (a restarting server drops every connection anyway).
            api.drop_watches();
            http_get(metrics, "/readyz").is_some_and(|r| {
                r.starts_with("HTTP/1.1 503")
                    && r.contains("DanmNetworkPolicy: danm.k8s.io/v1 not served since")
                    && r.contains("keeping last state")
            })
        },
    );
    while hidden.elapsed() < Duration::from_secs(3) {
        assert_refused(&client, &closed, "group hidden: the policy stays enforced");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        !netwarden_leftovers("nft", &web).is_empty(),
        "the rules of web stay"
    );
    api.hide_group("danm.k8s.io", false);
    agent.wait_for("ready again", Duration::from_secs(30), || ready(metrics));
    assert_refused(&client, &closed, "group back: still enforced");
    // One "not ready" line for the whole episode: the reason does not change every tick.
    let lines = agent
        .log()
        .lines()
        .filter(|l| l.contains("not ready: DanmNetworkPolicy"))
        .count();
    assert_eq!(lines, 1, "log:\n{}", agent.log());

    // Hidden beyond the grace period: the CRD is taken as deleted, its policy dropped.
    api.hide_group("danm.k8s.io", true);
    let hidden = std::time::Instant::now();
    agent.wait_for("not ready again", Duration::from_secs(10), || {
        api.drop_watches();
        !ready(metrics)
    });
    converge(
        &mut agent,
        &pair,
        &closed,
        true,
        "CRD gone: its policy dropped",
    );
    assert!(
        hidden.elapsed() >= Duration::from_secs(10),
        "dropped after {:?}",
        hidden.elapsed()
    );
    agent.wait_for(
        "ready: an absent kind is no outage",
        Duration::from_secs(30),
        || ready(metrics),
    );
}

/// Tamper repair with `--kube` (SPEC 5): the pod deletes netwarden's table from inside its
/// netns; the agent puts it back and writes a `RulesTampered` Event on the Pod (once for a
/// burst of tampers: the Event is as rate-limited as the log line).
#[test]
fn a_tampered_pod_is_repaired_and_gets_a_rules_tampered_event() {
    if !root_or_skip() {
        return;
    }
    let lab = Lab::new("nwkt");
    let (web, client, api) = (lab.web.clone(), lab.client.clone(), &lab.api);
    let pair = Pair {
        web: &web,
        client: &client,
    };
    let closed = format!("{WEB}:8081");
    let metrics = free_port();
    let args = lab.agent_args(metrics);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent = AgentProcess::start(&netwarden_bin!(), &args, &lab.dir.path.join("agent.log"));
    agent.wait_for("ready", Duration::from_secs(30), || ready(metrics));
    api.create(policy(
        json!([{"podSelector": {"matchLabels": {"app": "client"}}}]),
        None,
    ))
    .unwrap();
    converge(&mut agent, &pair, &closed, false, "policy applied");

    for _ in 0..3 {
        let out = netwarden_testing::run_in(&web, "nft", &["delete", "table", "inet", "netwarden"]);
        assert!(out.status.success(), "{out:?}");
        converge(&mut agent, &pair, &closed, false, "repaired");
    }
    let tampered = |api: &FakeApiServer| -> Vec<Value> {
        api.objects("Event")
            .into_iter()
            .filter(|e| e["reason"] == "RulesTampered")
            .collect()
    };
    agent.wait_for("a RulesTampered Event", Duration::from_secs(10), || {
        !tampered(api).is_empty()
    });
    let events = tampered(api);
    assert_eq!(events.len(), 1, "rate-limited to one: {events:#?}");
    let event = &events[0];
    assert_eq!(event["regarding"]["kind"], "Pod");
    assert_eq!(event["regarding"]["name"], "web");
    assert_eq!(event["regarding"]["namespace"], NS);
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["action"], "Repair");
    assert!(
        event["note"]
            .as_str()
            .is_some_and(|n| n.contains("table missing") && n.contains("put back")),
        "{event:#}"
    );
}
