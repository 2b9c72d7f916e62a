//! The fake driven by kube-rs itself — `Client` from the written kubeconfig, `Api`,
//! `runtime::watcher`, discovery and the event recorder — as the node agent will drive it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, WatchEvent, WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, Config, ResourceExt};
use netwarden_kube_fake::{FakeApiServer, ServerOptions};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(15);

/// A kubeconfig file in a directory of its own, removed on drop.
struct KubeconfigFile(PathBuf);

impl Drop for KubeconfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0.parent().expect("in a directory"));
    }
}

/// A server with bookmarks every 200 ms, and a kube `Client` built from its written kubeconfig.
async fn setup() -> (FakeApiServer, Client, KubeconfigFile) {
    let options = ServerOptions {
        bookmark_interval: Duration::from_millis(200),
        ..ServerOptions::default()
    };
    let server = FakeApiServer::start(options).await.expect("server starts");
    let dir = std::env::temp_dir().join(format!(
        "kube-fake-test-{}-{}",
        std::process::id(),
        server.addr().port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = KubeconfigFile(dir.join("kubeconfig"));
    server.write_kubeconfig(&file.0).unwrap();
    let kubeconfig = Kubeconfig::read_from(&file.0).expect("kubeconfig parses");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kube accepts the kubeconfig");
    let client = Client::try_from(config).expect("client over plain http");
    server
        .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}))
        .unwrap();
    (server, client, file)
}

fn pod(name: &str, node: &str, app: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "a", "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
    })
}

async fn next<S, T>(stream: &mut S) -> T
where
    S: Stream<Item = T> + Unpin,
{
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("an event within the wait")
        .expect("the stream goes on")
}

/// What a watcher's consumer knows: objects by name, rebuilt on every relist, and how many
/// relists (Init..InitDone) it has seen.
#[derive(Default)]
struct Mirror {
    objects: BTreeMap<String, Pod>,
    buffer: BTreeMap<String, Pod>,
    relists: usize,
}

impl Mirror {
    fn apply(&mut self, ev: Event<Pod>) {
        match ev {
            Event::Init => self.buffer.clear(),
            Event::InitApply(p) => {
                self.buffer.insert(p.name_any(), p);
            }
            Event::InitDone => {
                self.objects = std::mem::take(&mut self.buffer);
                self.relists += 1;
            }
            Event::Apply(p) => {
                self.objects.insert(p.name_any(), p);
            }
            Event::Delete(p) => {
                self.objects.remove(&p.name_any());
            }
        }
    }

    fn names(&self) -> Vec<String> {
        self.objects.keys().cloned().collect()
    }
}

/// Feeds the mirror until `done` holds (errors from the watcher — 410s, broken connections —
/// are part of the protocol and are skipped, as a consumer with a backoff does).
async fn feed_until<S>(stream: &mut S, mirror: &mut Mirror, done: impl Fn(&Mirror) -> bool)
where
    S: Stream<Item = Result<Event<Pod>, watcher::Error>> + Unpin,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done(mirror) {
        let item = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("the condition holds within the wait")
            .expect("the watcher goes on");
        if let Ok(ev) = item {
            mirror.apply(ev);
        }
    }
}

fn server_pod_names(server: &FakeApiServer) -> Vec<String> {
    server
        .objects("Pod")
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn list_and_watch_see_create_update_delete_in_order() {
    let (server, client, _kc) = setup().await;
    server.create(pod("before", "n1", "web")).unwrap();
    let api: Api<Pod> = Api::namespaced(client, "a");
    let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
    assert!(matches!(next(&mut stream).await.unwrap(), Event::Init));
    let Event::InitApply(p) = next(&mut stream).await.unwrap() else {
        panic!("the existing pod")
    };
    assert_eq!(p.name_any(), "before");
    assert!(matches!(next(&mut stream).await.unwrap(), Event::InitDone));

    let created = server.create(pod("p", "n1", "web")).unwrap();
    let mut relabelled = created.clone();
    relabelled["metadata"]["labels"]["app"] = json!("db");
    server.update(relabelled).unwrap();
    server.delete("v1", "Pod", "a", "p").unwrap();

    let Event::Apply(p) = next(&mut stream).await.unwrap() else {
        panic!("created")
    };
    assert_eq!(
        (p.name_any(), p.labels()["app"].as_str()),
        ("p".to_string(), "web")
    );
    let rv_created: u64 = p.resource_version().unwrap().parse().unwrap();
    assert!(p.uid().is_some() && p.creation_timestamp().is_some());
    let Event::Apply(p) = next(&mut stream).await.unwrap() else {
        panic!("updated")
    };
    assert_eq!(p.labels()["app"], "db");
    let rv_updated: u64 = p.resource_version().unwrap().parse().unwrap();
    let Event::Delete(p) = next(&mut stream).await.unwrap() else {
        panic!("deleted")
    };
    assert_eq!(p.name_any(), "p");
    let rv_deleted: u64 = p.resource_version().unwrap().parse().unwrap();
    assert!(rv_created < rv_updated && rv_updated < rv_deleted);
    assert_eq!(rv_deleted, server.resource_version());

    // One list and one watch: the watcher did not relist.
    let log = server.requests();
    assert_eq!((log.lists("Pod"), log.watches("Pod")), (1, 1));
}

#[tokio::test]
async fn watch_bookmarks_arrive_at_the_current_version() {
    let (server, client, _kc) = setup().await;
    server.create(pod("p", "n1", "web")).unwrap();
    let api: Api<Pod> = Api::namespaced(client, "a");
    let rv = server.resource_version().to_string();
    // Another kind moves the global version on: the bookmark says the pod watch is current.
    server
        .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "b"}}))
        .unwrap();
    let mut events = api
        .watch(&WatchParams::default().timeout(10), &rv)
        .await
        .unwrap()
        .boxed();
    let event = next(&mut events).await.unwrap();
    let WatchEvent::Bookmark(bm) = event else {
        panic!("a bookmark, got {event:?}")
    };
    assert_eq!(
        bm.metadata.resource_version,
        server.resource_version().to_string()
    );
    assert_eq!(bm.types.kind, "Pod");
}

#[tokio::test]
async fn streaming_list_ends_initial_events_with_a_bookmark() {
    let (server, client, _kc) = setup().await;
    for i in 0..3 {
        server.create(pod(&format!("p{i}"), "n1", "web")).unwrap();
    }
    let api: Api<Pod> = Api::all(client);
    let mut stream = watcher::watcher(api, watcher::Config::default().streaming_lists()).boxed();
    let mut mirror = Mirror::default();
    feed_until(&mut stream, &mut mirror, |m| m.relists == 1).await;
    assert_eq!(mirror.names(), ["p0", "p1", "p2"]);
    server.create(pod("p3", "n1", "web")).unwrap();
    feed_until(&mut stream, &mut mirror, |m| m.objects.len() == 4).await;
    let log = server.requests();
    assert_eq!((log.lists("Pod"), log.watches("Pod")), (0, 1));
}

#[tokio::test]
async fn after_compaction_and_cut_watches_the_watcher_relists_and_converges() {
    let (server, client, _kc) = setup().await;
    for i in 0..3 {
        server.create(pod(&format!("p{i}"), "n1", "web")).unwrap();
    }
    let api: Api<Pod> = Api::namespaced(client, "a");
    // No bookmarks: the watcher's version stays that of its last pod event.
    let mut stream = watcher::watcher(api, watcher::Config::default().disable_bookmarks()).boxed();
    let mut mirror = Mirror::default();
    feed_until(&mut stream, &mut mirror, |m| m.relists == 1).await;
    // The watcher opens its watch only when polled after InitDone: see one event through it.
    server.create(pod("p3", "n1", "web")).unwrap();
    feed_until(&mut stream, &mut mirror, |m| m.objects.contains_key("p3")).await;

    // The world moves on while the history is lost.
    server
        .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "b"}}))
        .unwrap();
    server.compact();
    server.delete("v1", "Pod", "a", "p1").unwrap();
    server.create(pod("p9", "n2", "db")).unwrap();
    // The open watch still delivers (compaction does not touch it)...
    feed_until(&mut stream, &mut mirror, |m| m.objects.contains_key("p9")).await;
    // ...but a reconnection from a version before the compaction is 410: relist.
    server
        .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "c"}}))
        .unwrap();
    server.compact();
    server.drop_watches();
    server.create(pod("p10", "n2", "db")).unwrap();
    feed_until(&mut stream, &mut mirror, |m| m.relists == 2).await;
    assert_eq!(mirror.names(), server_pod_names(&server));
    let log = server.requests();
    assert_eq!(log.lists("Pod"), 2, "one initial list, one relist");
    assert_eq!(
        log.watches("Pod"),
        2,
        "the first watch, and the one answered 410"
    );
}

#[tokio::test]
async fn the_watcher_recovers_from_a_stopped_and_restarted_server() {
    let (server, client, _kc) = setup().await;
    server.create(pod("p0", "n1", "web")).unwrap();
    let api: Api<Pod> = Api::namespaced(client.clone(), "a");
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut mirror = Mirror::default();
    feed_until(&mut stream, &mut mirror, |m| m.relists == 1).await;

    server.stop().await;
    // Connections are refused while stopped.
    let probe: Api<Pod> = Api::namespaced(client.clone(), "a");
    assert!(probe.list(&ListParams::default()).await.is_err());
    server.create(pod("p1", "n1", "web")).unwrap();
    server.delete("v1", "Pod", "a", "p0").unwrap();
    // Let the watcher notice and back off at least once.
    let _ = tokio::time::timeout(Duration::from_millis(500), stream.next()).await;
    server.restart().await.unwrap();
    feed_until(&mut stream, &mut mirror, |m| m.names() == ["p1"]).await;
    assert_eq!(mirror.names(), server_pod_names(&server));

    // 503 to every request: kube's client retries them (15 times, exponential backoff), so
    // the LIST does not come back within a second; the log shows the 503s. The open watch
    // goes on.
    server.clear_requests();
    server.set_unavailable(true);
    assert!(
        tokio::time::timeout(Duration::from_secs(1), probe.list(&ListParams::default()))
            .await
            .is_err()
    );
    let answered: Vec<u16> = server.requests().iter().map(|r| r.code).collect();
    assert!(
        answered.len() >= 2 && answered.iter().all(|&c| c == 503),
        "{answered:?}"
    );
    server.set_unavailable(false);
    server.create(pod("p2", "n1", "web")).unwrap();
    feed_until(&mut stream, &mut mirror, |m| m.objects.contains_key("p2")).await;
}

#[tokio::test]
async fn lists_page_by_500_and_pages_are_consistent() {
    let (server, client, _kc) = setup().await;
    for i in 0..1234 {
        server
            .create(pod(&format!("p{i:04}"), "n1", "web"))
            .unwrap();
    }
    let api: Api<Pod> = Api::all(client);
    let first = api.list(&ListParams::default().limit(500)).await.unwrap();
    assert_eq!(first.items.len(), 500);
    let token = first.metadata.continue_.clone().expect("a continue token");
    // A write between pages is not in the rest of this list.
    server.delete("v1", "Pod", "a", "p0999").unwrap();
    let second = api
        .list(&ListParams::default().limit(500).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );
    assert_eq!(second.items[499].name_any(), "p0999");

    // The watcher pages by 500: three LISTs for 1,233 pods.
    server.clear_requests();
    let mut stream = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    let mut mirror = Mirror::default();
    feed_until(&mut stream, &mut mirror, |m| m.relists == 1).await;
    assert_eq!(mirror.objects.len(), 1233);
    assert_eq!(server.requests().lists("Pod"), 3);

    // An expired continue token is 410 Expired.
    server.compact();
    server.create(pod("late", "n1", "web")).unwrap();
    match api
        .list(&ListParams::default().limit(500).continue_token(&token))
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (410, "Expired")),
        other => panic!("410 expected, got {other:?}"),
    }
}

#[tokio::test]
async fn selectors_filter_lists_and_watches() {
    let (server, client, _kc) = setup().await;
    server.create(pod("a1", "node-1", "web")).unwrap();
    server.create(pod("a2", "node-2", "web")).unwrap();
    server.create(pod("a3", "node-1", "db")).unwrap();
    let api: Api<Pod> = Api::all(client);
    let names =
        |l: kube::core::ObjectList<Pod>| l.items.iter().map(|p| p.name_any()).collect::<Vec<_>>();
    let on_node = api
        .list(&ListParams::default().fields("spec.nodeName=node-1"))
        .await
        .unwrap();
    assert_eq!(names(on_node), ["a1", "a3"]);
    let off_node = api
        .list(&ListParams::default().fields("spec.nodeName!=node-1"))
        .await
        .unwrap();
    assert_eq!(names(off_node), ["a2"]);
    let both = api
        .list(
            &ListParams::default()
                .fields("spec.nodeName==node-1,metadata.name=a1")
                .labels("app in (web,x)"),
        )
        .await
        .unwrap();
    assert_eq!(names(both), ["a1"]);
    match api
        .list(&ListParams::default().fields("spec.bogus=1"))
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 400),
        other => panic!("400 expected, got {other:?}"),
    }

    // A watch on node-1's web pods: a relabel out is DELETED, back in is ADDED.
    let config = watcher::Config::default()
        .fields("spec.nodeName=node-1")
        .labels("app=web");
    let mut stream = watcher::watcher(api, config).boxed();
    let mut mirror = Mirror::default();
    feed_until(&mut stream, &mut mirror, |m| m.relists == 1).await;
    assert_eq!(mirror.names(), ["a1"]);
    let mut a1 = server.object("v1", "Pod", "a", "a1").unwrap();
    a1["metadata"]["labels"]["app"] = json!("db");
    server.update(a1.clone()).unwrap();
    feed_until(&mut stream, &mut mirror, |m| m.objects.is_empty()).await;
    let mut a3 = server.object("v1", "Pod", "a", "a3").unwrap();
    a3["metadata"]["labels"]["app"] = json!("web");
    server.update(a3).unwrap();
    server.create(pod("a4", "node-2", "web")).unwrap();
    feed_until(&mut stream, &mut mirror, |m| m.names() == ["a3"]).await;
}

#[tokio::test]
async fn a_crd_is_404_until_installed_and_then_discovered() {
    let (server, client, _kc) = setup().await;
    let gvk = GroupVersionKind::gvk("danm.k8s.io", "v1", "DanmNetworkPolicy");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "danmnetworkpolicies");
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "a", &ar);
    match api.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 404),
        other => panic!("404 expected, got {other:?}"),
    }
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    assert!(!discovery.has_group("danm.k8s.io"));
    assert!(discovery.has_group("networking.k8s.io"));

    server.install_crd("danm.k8s.io", "v1", "DanmNetworkPolicy");
    let (found, caps) = kube::discovery::pinned_kind(&client, &gvk)
        .await
        .expect("discovered once installed");
    assert_eq!(found.plural, "danmnetworkpolicies");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    server
        .create(
            json!({"apiVersion": "danm.k8s.io/v1", "kind": "DanmNetworkPolicy",
            "metadata": {"name": "d", "namespace": "a"}, "spec": {"podSelector": {}}}),
        )
        .unwrap();
    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    // Every version of MultiNetworkPolicy shows the same objects under its own apiVersion.
    server.install_crd("k8s.cni.cncf.io", "v1beta1", "MultiNetworkPolicy");
    server.install_crd("k8s.cni.cncf.io", "v1beta2", "MultiNetworkPolicy");
    server
        .create(
            json!({"apiVersion": "k8s.cni.cncf.io/v1beta1", "kind": "MultiNetworkPolicy",
            "metadata": {"name": "m", "namespace": "a"}, "spec": {}}),
        )
        .unwrap();
    let v2 = GroupVersionKind::gvk("k8s.cni.cncf.io", "v1beta2", "MultiNetworkPolicy");
    let (v2r, _) = kube::discovery::pinned_kind(&client, &v2).await.unwrap();
    let v2api: Api<DynamicObject> = Api::all_with(client.clone(), &v2r);
    let items = v2api.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(
        items[0].types.as_ref().unwrap().api_version,
        "k8s.cni.cncf.io/v1beta2"
    );

    server.uninstall_crd("danm.k8s.io", "v1", "DanmNetworkPolicy");
    assert!(api.list(&ListParams::default()).await.is_err());
    assert!(server.objects("DanmNetworkPolicy").is_empty());
}

#[tokio::test]
async fn the_event_recorder_publishes_and_patches_an_event() {
    let (server, client, _kc) = setup().await;
    server
        .create(
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "deny", "namespace": "a"}, "spec": {"podSelector": {}}}),
        )
        .unwrap();
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "netwarden".into(),
            instance: Some("node-1".into()),
        },
    );
    let reference = ObjectReference {
        api_version: Some("networking.k8s.io/v1".into()),
        kind: Some("NetworkPolicy".into()),
        name: Some("deny".into()),
        namespace: Some("a".into()),
        ..ObjectReference::default()
    };
    let event = KubeEvent {
        type_: EventType::Warning,
        reason: "SelectsNothing".into(),
        note: Some("the policy selects no pod".into()),
        action: "Validate".into(),
        secondary: None,
    };
    recorder.publish(&event, &reference).await.expect("created");
    recorder.publish(&event, &reference).await.expect("patched");
    let events = server.objects("Event");
    assert_eq!(events.len(), 1, "{events:?}");
    let ev = &events[0];
    assert_eq!(ev["apiVersion"], "events.k8s.io/v1");
    assert_eq!(ev["reason"], "SelectsNothing");
    assert_eq!(ev["regarding"]["name"], "deny");
    assert_eq!(ev["series"]["count"], 2);
    let log = server.requests();
    assert_eq!(
        (
            log.count(netwarden_kube_fake::Verb::Create, "Event"),
            log.count(netwarden_kube_fake::Verb::Patch, "Event")
        ),
        (1, 1)
    );
}

#[tokio::test]
async fn writes_over_http_follow_the_real_status_codes() {
    let (server, client, _kc) = setup().await;
    let api: Api<Pod> = Api::namespaced(client.clone(), "a");
    let p: Pod = serde_json::from_value(pod("w", "n1", "web")).unwrap();
    let created = api.create(&Default::default(), &p).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    match api.create(&Default::default(), &p).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists")),
        other => panic!("409 expected, got {other:?}"),
    }
    let mut stale = created.clone();
    stale.metadata.resource_version = Some("1".into());
    match api.replace("w", &Default::default(), &stale).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (409, "Conflict")),
        other => panic!("409 expected, got {other:?}"),
    }
    let patched = api
        .patch(
            "w",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.labels()["x"], "y");
    api.delete("w", &Default::default()).await.unwrap();
    match api.get("w").await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (404, "NotFound")),
        other => panic!("404 expected, got {other:?}"),
    }
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");
    assert!(server.objects("Pod").is_empty());
}
