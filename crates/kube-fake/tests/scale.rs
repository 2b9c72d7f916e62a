//! Scale: 10,000 pods and 2,000 NetworkPolicies listed through kube's paging and watched,
//! with the figures printed (`cargo test -p netwarden-kube-fake --test scale -- --nocapture`).
//! The bounds are loose (debug builds on a shared machine); the figures are what matters.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Config};
use netwarden_kube_fake::{FakeApiServer, ServerOptions};
use serde_json::{json, Value};

const PODS: usize = 10_000;
const POLICIES: usize = 2_000;
const NAMESPACES: usize = 50;

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb / 1024.0
}

/// A pod shaped like a real one (labels, Multus network-status, containers, status) — about
/// 1.5 KiB of JSON.
fn pod(i: usize) -> Value {
    let ns = format!("ns-{}", i % NAMESPACES);
    let ip = format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256);
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("pod-{i}"), "namespace": ns,
            "labels": {"app": format!("app-{}", i % 200), "tier": if i.is_multiple_of(2) { "front" } else { "back" },
                       "pod-template-hash": "5d8f7c9b6"},
            "annotations": {"k8s.v1.cni.cncf.io/network-status":
                format!("[{{\"name\":\"cbr0\",\"interface\":\"eth0\",\"ips\":[\"{ip}\"],\"default\":true}}]")},
        },
        "spec": {
            "nodeName": format!("node-{}", i % 100),
            "containers": [{"name": "app", "image": "registry.example/app:1.2.3",
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}],
        },
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "192.168.0.1"},
    })
}

fn policy(i: usize) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": format!("pol-{i}"), "namespace": format!("ns-{}", i % NAMESPACES)},
        "spec": {
            "podSelector": {"matchLabels": {"app": format!("app-{}", i % 200)}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"tier": "front"}}}],
                         "ports": [{"port": 8080, "protocol": "TCP"}]}],
        },
    })
}

/// Counts InitApply events; `true` at InitDone.
fn count<K>(n: &mut usize, ev: Event<K>) -> bool {
    match ev {
        Event::InitApply(_) => *n += 1,
        Event::InitDone => return true,
        _ => {}
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_pods_and_two_thousand_policies_list_and_watch_without_stall() {
    let rss_start = rss_mib();
    let server = FakeApiServer::start(ServerOptions::default())
        .await
        .unwrap();
    let t = Instant::now();
    for n in 0..NAMESPACES {
        server
            .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("ns-{n}")}}))
            .unwrap();
    }
    for i in 0..PODS {
        server.create(pod(i)).unwrap();
    }
    for i in 0..POLICIES {
        server.create(policy(i)).unwrap();
    }
    let load = t.elapsed();
    let rss_loaded = rss_mib();

    let kubeconfig = Kubeconfig::from_yaml(&server.kubeconfig()).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    let client = Client::try_from(config).unwrap();
    let pods: Api<Pod> = Api::all(client.clone());

    // Api::list, paged by 500 as the watcher pages.
    let t = Instant::now();
    let (mut listed, mut token, mut pages) = (0, None::<String>, 0);
    loop {
        let mut lp = ListParams::default().limit(500);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = pods.list(&lp).await.unwrap();
        listed += page.items.len();
        pages += 1;
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    let list_time = t.elapsed();
    assert_eq!((listed, pages), (PODS, PODS / 500));
    let rss_listed = rss_mib();

    // Two watchers (pods, policies) through their initial list, then one change's latency.
    let t = Instant::now();
    let mut pod_events = watcher::watcher(pods.clone(), watcher::Config::default()).boxed();
    let policies: Api<NetworkPolicy> = Api::all(client);
    let mut policy_events = watcher::watcher(policies, watcher::Config::default()).boxed();
    let (mut np, mut npol) = (0usize, 0usize);
    while let Some(ev) = pod_events.next().await {
        if count(&mut np, ev.unwrap()) {
            break;
        }
    }
    while let Some(ev) = policy_events.next().await {
        if count(&mut npol, ev.unwrap()) {
            break;
        }
    }
    let sync_time = t.elapsed();
    assert_eq!((np, npol), (PODS, POLICIES));

    // The watch is opened lazily: poll once with a change in flight, then time a second one.
    let mut latencies = Vec::new();
    for round in 0..20 {
        let mut p = server.object("v1", "Pod", "ns-3", "pod-3").unwrap();
        p["metadata"]["labels"]["round"] = json!(round.to_string());
        let t = Instant::now();
        server.update(p).unwrap();
        let ev = tokio::time::timeout(Duration::from_secs(10), pod_events.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(matches!(ev, Event::Apply(_)));
        latencies.push(t.elapsed());
    }
    latencies.sort();
    let rss_end = rss_mib();
    let log = server.requests();
    eprintln!(
        "scale: {PODS} pods + {POLICIES} policies in {NAMESPACES} namespaces\n  \
         load via the control API: {load:?}\n  \
         Api::list of {PODS} pods in {pages} pages of 500: {list_time:?}\n  \
         watcher initial sync (pods + policies): {sync_time:?}\n  \
         pod update to watcher event, 20 rounds: median {:?}, max {:?}\n  \
         RSS MiB (server and client in one process): start {rss_start:.0}, loaded {rss_loaded:.0}, after list {rss_listed:.0}, end {rss_end:.0}\n  \
         requests: {} LIST Pod, {} WATCH Pod, {} LIST NetworkPolicy, {} WATCH NetworkPolicy",
        latencies[10],
        latencies[19],
        log.lists("Pod"),
        log.watches("Pod"),
        log.lists("NetworkPolicy"),
        log.watches("NetworkPolicy"),
    );
    // Loose bounds: a stall (a relist, a lock held across a send) would blow through them.
    assert!(latencies[19] < Duration::from_secs(2), "{latencies:?}");
    assert_eq!(log.watches("Pod"), 1);
    assert_eq!(log.lists("Pod"), PODS / 500 * 2);
}
