//! `list_once` against the fake API server (no root): every served kind listed in pages and
//! never watched, optional kinds absent skipped, NetworkPolicies left out on request, and the
//! result equal to what the watchers would hold.

use netwarden_kube::list::DEFAULT_PAGE_SIZE;
use netwarden_kube::{list_once, watched, ListOptions};
use netwarden_kube_fake::{FakeApiServer, ServerOptions};
use netwarden_manifest::LoadOptions;
use serde_json::{json, Value};

fn pod(name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "labels": {"app": "web"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"podIPs": [{"ip": ip}]},
    })
}

struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn one_paged_list_per_served_kind_and_no_watch() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let api = runtime
        .block_on(FakeApiServer::start(ServerOptions::default()))
        .unwrap();
    let dir = Dir(std::env::temp_dir().join(format!("nw-kube-list-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let kubeconfig = dir.0.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}))
        .unwrap();
    for i in 0..5 {
        api.create(pod(&format!("p{i}"), &format!("10.0.0.{}", i + 1)))
            .unwrap();
    }
    api.create(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "deny", "namespace": "ns"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}),
    )
    .unwrap();
    // MultiNetworkPolicy only at v1beta1; DanmNetworkPolicy, DanmEp and the admin policy
    // kinds not installed.
    api.install_crd("k8s.cni.cncf.io", "v1beta1", "MultiNetworkPolicy");

    let options = |page_size, network_policy_enabled| ListOptions {
        kubeconfig: Some(kubeconfig.clone()),
        load: LoadOptions {
            network_policy_enabled,
        },
        page_size,
        request_timeout: netwarden_kube::list::DEFAULT_REQUEST_TIMEOUT,
    };
    let listed = list_once(&options(DEFAULT_PAGE_SIZE, true)).unwrap();
    let inventory = listed.cluster.inventory();
    assert_eq!(inventory.pods.len(), 5);
    assert_eq!(inventory.policies.len(), 1);
    assert!(inventory.problems.is_empty(), "{:?}", inventory.problems);
    let skipped: Vec<_> = listed.skipped.iter().map(|k| k.kind).collect();
    assert_eq!(
        skipped,
        [
            "DanmNetworkPolicy",
            "DanmEp",
            "ClusterNetworkPolicy",
            "AdminNetworkPolicy",
            "BaselineAdminNetworkPolicy"
        ]
    );
    assert!(listed.notes()[0].contains("danm.k8s.io/v1"));
    assert!(listed
        .listed
        .iter()
        .any(|(k, v)| k.kind == "MultiNetworkPolicy" && *v == "v1beta1"));
    let log = api.requests();
    for kind in watched(true) {
        let want = usize::from(!skipped.contains(&kind.kind));
        assert_eq!(log.lists(kind.kind), want, "LISTs of {}", kind.kind);
        assert_eq!(log.watches(kind.kind), 0, "WATCHes of {}", kind.kind);
    }

    // Pages of two: three LISTs of pods, the same objects.
    api.clear_requests();
    let paged = list_once(&options(2, true)).unwrap();
    assert_eq!(paged.cluster.inventory(), inventory);
    assert_eq!(api.requests().lists("Pod"), 3);

    // --no-network-policy: not even listed.
    api.clear_requests();
    let without = list_once(&options(DEFAULT_PAGE_SIZE, false)).unwrap();
    assert!(without.cluster.inventory().policies.is_empty());
    assert_eq!(api.requests().lists("NetworkPolicy"), 0);

    // An API server that cannot be reached is an error, not an empty cluster.
    runtime.block_on(api.stop());
    let err = list_once(&options(DEFAULT_PAGE_SIZE, true)).unwrap_err();
    assert!(err.to_string().contains("Namespace"), "{err}");
}

/// Issue 20, defect 15: an API server that accepts connections and never answers fails the
/// listing within its request timeout, with a message naming the server and the timeout.
#[test]
fn a_server_that_never_answers_fails_within_the_timeout() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // Accepts and holds every connection, reading nothing, answering nothing.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
    let dir = Dir(std::env::temp_dir().join(format!("nw-kube-mute-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let kubeconfig = dir.0.join("kubeconfig");
    std::fs::write(&kubeconfig, netwarden_kube_fake::kubeconfig_for(&url)).unwrap();
    let options = ListOptions {
        kubeconfig: Some(kubeconfig),
        load: LoadOptions::default(),
        page_size: DEFAULT_PAGE_SIZE,
        request_timeout: std::time::Duration::from_secs(1),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let start = std::time::Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(list_once(&options).map(|_| ()));
    });
    let result = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("list_once still waiting after 20 s on a server that never answers");
    let elapsed = start.elapsed();
    let error = result.expect_err("nothing was listed").to_string();
    assert!(elapsed < std::time::Duration::from_secs(5), "{elapsed:?}");
    assert!(error.contains(&url), "{error}");
    assert!(error.contains("did not answer within 1s"), "{error}");
}

/// Issue 20, defect 14 (one-shot listing): a duplicate and a stray in a list are reported
/// and ignored, as by the watchers.
#[test]
fn duplicates_and_strays_in_a_list_are_reported() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let api = runtime
        .block_on(FakeApiServer::start(ServerOptions::default()))
        .unwrap();
    let dir = Dir(std::env::temp_dir().join(format!("nw-kube-dups-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let kubeconfig = dir.0.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}))
        .unwrap();
    api.create(pod("web", "10.0.0.1")).unwrap();
    let mut twin = pod("web", "10.0.0.9");
    twin["metadata"]["uid"] = json!("another-uid");
    let stray = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                       "metadata": {"name": "stray", "namespace": "ns"},
                       "spec": {"podSelector": {}}});
    api.inject_in_lists("Pod", vec![twin, stray]);
    let listed = list_once(&ListOptions {
        kubeconfig: Some(kubeconfig),
        load: LoadOptions::default(),
        page_size: 1,
        request_timeout: netwarden_kube::list::DEFAULT_REQUEST_TIMEOUT,
    })
    .unwrap();
    let inventory = listed.cluster.inventory();
    assert_eq!(inventory.pods.len(), 1);
    assert!(inventory.policies.is_empty(), "the stray is not read");
    let named: Vec<_> = inventory
        .errors()
        .map(|p| (p.kind.as_str(), p.object.as_str(), p.field.as_str()))
        .collect();
    assert!(
        named.contains(&("Pod", "ns/web", "metadata.name")),
        "{named:?}"
    );
    assert!(
        named.contains(&("NetworkPolicy", "ns/stray", "kind")),
        "{named:?}"
    );
}
