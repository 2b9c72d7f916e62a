//! The watchers against the fake API server (real list/watch over HTTP, no root): objects
//! reduced into the inventory, irrelevant updates waking nothing, optional kinds absent then
//! picked up, MultiNetworkPolicy at the version served, deletes missed during an outage
//! dropped by the relist, readiness following the API, one watch per kind; a CRD deleted while
//! watched.

use std::time::{Duration, Instant};

use netwarden_kube::{KindState, KubeOptions, KubeSource};
use netwarden_kube_fake::{FakeApiServer, ServerOptions};
use netwarden_manifest::LoadOptions;
use serde_json::{json, Value};

fn pod(name: &str, app: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"podIPs": [{"ip": "10.0.0.1"}]},
    })
}

fn until(what: &str, source: &KubeSource, mut cond: impl FnMut(&KubeSource) -> bool) {
    let start = Instant::now();
    while !cond(source) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}; status: {:?}",
            source.status()
        );
        source.wait(Duration::from_millis(50));
    }
}

/// A fake API server serving namespace `ns`, its runtime, a scratch directory
/// (`nw-kube-<tag>-<pid>`) and a kubeconfig for it there.
fn api_with_namespace(
    tag: &str,
) -> (
    tokio::runtime::Runtime,
    FakeApiServer,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let api = runtime
        .block_on(FakeApiServer::start(ServerOptions::default()))
        .unwrap();
    let dir = std::env::temp_dir().join(format!("nw-kube-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}))
        .unwrap();
    (runtime, api, dir, kubeconfig)
}

#[test]
fn watchers_feed_the_cluster_set() {
    let (runtime, api, dir, kubeconfig) = api_with_namespace("watch");
    api.create(pod("a", "web", "n1")).unwrap();
    // Only v1beta1 of MultiNetworkPolicy is served; DanmEp is not installed at all.
    api.install_crd("k8s.cni.cncf.io", "v1beta1", "MultiNetworkPolicy");
    api.install_crd("danm.k8s.io", "v1", "DanmNetworkPolicy");

    let source = KubeSource::start(KubeOptions {
        kubeconfig: Some(kubeconfig),
        load: LoadOptions::default(),
        discovery_interval: Duration::from_millis(200),
        events_as: None,
    })
    .unwrap();
    until("the first full sync", &source, |s| s.status().synced_once());
    let status = source.status();
    assert_eq!(
        status.kinds["MultiNetworkPolicy"].state,
        KindState::Watching { version: "v1beta1" }
    );
    assert_eq!(status.kinds["DanmEp"].state, KindState::Absent);
    assert_eq!(status.not_ready_reason(), None);
    let inventory = source.inventory();
    assert_eq!(inventory.pods.len(), 1);
    assert_eq!(inventory.pods[0].node_name.as_deref(), Some("n1"));
    source.wait(Duration::ZERO);

    // An update of nothing netwarden reads wakes nothing; a relabel does.
    let mut touched = pod("a", "web", "n1");
    touched["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
    api.update(touched).unwrap();
    let pending = source.wait(Duration::from_millis(500));
    assert_eq!(pending.changes, 0, "{pending:?}");
    api.update(pod("a", "api", "n1")).unwrap();
    let pending = source.wait(Duration::from_secs(10));
    assert_eq!(pending.changes, 1, "{pending:?}");
    assert!(pending.oldest.is_some());
    assert_eq!(source.inventory().pods[0].labels["app"], "api");

    // A CRD installed later is picked up (one discovery interval), with its objects.
    api.install_crd("danm.k8s.io", "v1", "DanmEp");
    until("DanmEp watched", &source, |s| {
        matches!(s.status().kinds["DanmEp"].state, KindState::Watching { .. })
            && s.status().kinds["DanmEp"].listed_once
    });

    // An outage during which a pod is deleted and history compacted: not ready, then the
    // relist drops the pod.
    runtime.block_on(api.stop());
    until("not ready", &source, |s| {
        s.status().not_ready_reason().is_some()
    });
    api.delete("v1", "Pod", "ns", "a").unwrap();
    api.create(pod("b", "web", "n2")).unwrap();
    api.compact();
    runtime.block_on(api.restart()).unwrap();
    until("the relist", &source, |s| {
        let pods = s.inventory().pods;
        pods.len() == 1 && pods[0].key.name == "b" && s.status().not_ready_reason().is_none()
    });
    assert!(source.status().kinds["Pod"].restarts >= 1);
    assert_eq!(source.counts()["Pod"], 1);

    // One watch at a time per kind: no periodic relist.
    let requests = api.requests();
    let pod_lists = requests.lists("Pod");
    assert!((1..=3).contains(&pod_lists), "Pod lists: {pod_lists}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A CRD deleted while watched: its objects go (the API server deletes them with it), the kind
/// is absent rather than failing (the agent stays ready), and it is watched again when the CRD
/// returns.
#[test]
fn a_crd_deleted_while_watched_is_absent_then_watched_again() {
    let (_runtime, api, dir, kubeconfig) = api_with_namespace("crd");
    api.install_crd("danm.k8s.io", "v1", "DanmNetworkPolicy");
    let policy = json!({"apiVersion": "danm.k8s.io/v1", "kind": "DanmNetworkPolicy",
                        "metadata": {"name": "p", "namespace": "ns"},
                        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}});
    api.create(policy.clone()).unwrap();
    let source = KubeSource::start(KubeOptions {
        kubeconfig: Some(kubeconfig),
        load: LoadOptions::default(),
        discovery_interval: Duration::from_millis(200),
        events_as: None,
    })
    .unwrap();
    until("the policy", &source, |s| {
        s.status().synced_once() && s.inventory().policies.len() == 1
    });

    api.uninstall_crd("danm.k8s.io", "v1", "DanmNetworkPolicy");
    api.drop_watches();
    until("the kind absent, its policy gone", &source, |s| {
        s.status().kinds["DanmNetworkPolicy"].state == KindState::Absent
            && s.inventory().policies.is_empty()
    });
    assert_eq!(
        source.status().not_ready_reason(),
        None,
        "a CRD that is gone is no outage"
    );

    api.install_crd("danm.k8s.io", "v1", "DanmNetworkPolicy");
    api.create(policy).unwrap();
    until("watched again, with its policy", &source, |s| {
        s.status().kinds["DanmNetworkPolicy"].listed_once && s.inventory().policies.len() == 1
    });
    std::fs::remove_dir_all(&dir).ok();
}
