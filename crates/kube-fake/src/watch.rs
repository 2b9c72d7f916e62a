//! One WATCH: the events a watch request gets, written as the real server writes them — one
//! JSON object per line, `{"type": ..., "object": ...}`, in a chunked response that stays open.
//!
//! What decides which event a change becomes ([`event_for`]) is pure; the task around it
//! ([`run`]) starts the watch under the store's lock (so no change is missed or repeated), then
//! forwards changes, sends periodic BOOKMARKs, and ends the response: cleanly when
//! `timeoutSeconds` expires or the resource is uninstalled, abruptly (the connection is cut
//! mid-body) when the test calls `drop_watches`, with an ERROR event when it calls
//! `fail_watches`.

use std::borrow::Cow;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::resources::ResourceType;
use crate::selector::Selectors;
use crate::shared::{Shared, WatchEnd};
use crate::status::ApiError;
use crate::store::{Change, ChangeType};

/// The annotation of the BOOKMARK that ends the initial events of a streaming list.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// `resourceVersion` unset or `"0"`: every current object as ADDED, then the changes.
    Now,
    /// `sendInitialEvents=true`: every current object as ADDED, a BOOKMARK annotated
    /// [`INITIAL_EVENTS_END`], then the changes (kube's streaming list).
    InitialEvents,
    /// After a resourceVersion: the retained changes after it, then the new ones; 410 Expired
    /// (as an ERROR event) when changes after it were forgotten.
    After(u64),
}

/// A parsed watch request.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    pub resource: ResourceType,
    pub namespace: Option<String>,
    pub selectors: Selectors,
    pub bookmarks: bool,
    pub timeout: Duration,
    pub start: Start,
}

/// The object as the requested version shows it: the storage is shared by every version of a
/// resource, converted by `apiVersion` alone (a CRD's "None" conversion).
pub fn as_version<'a>(obj: &'a Value, resource: &ResourceType) -> Cow<'a, Value> {
    let want = resource.api_version();
    if obj["apiVersion"].as_str() == Some(want.as_str()) {
        Cow::Borrowed(obj)
    } else {
        let mut v = obj.clone();
        v["apiVersion"] = json!(want);
        Cow::Owned(v)
    }
}

fn in_namespace(obj: &Value, namespace: Option<&str>) -> bool {
    namespace.is_none_or(|ns| obj["metadata"]["namespace"].as_str() == Some(ns))
}

/// The event a change becomes for a watch with these filters, as the real server's watch cache
/// decides it: a modification that makes an object start matching is ADDED; one that makes it
/// stop matching is DELETED, carrying the previous content stamped with the change's
/// resourceVersion; a change that never matched is not sent.
pub fn event_for<'a>(
    change: &'a Change,
    namespace: Option<&str>,
    selectors: &Selectors,
) -> Option<(ChangeType, Cow<'a, Value>)> {
    if !in_namespace(&change.object, namespace) {
        return None;
    }
    let now = selectors.matches(&change.object);
    let before = change
        .previous
        .as_deref()
        .is_some_and(|p| selectors.matches(p));
    match change.change {
        ChangeType::Added => now.then_some((ChangeType::Added, Cow::Borrowed(&*change.object))),
        ChangeType::Deleted => {
            (now || before).then_some((ChangeType::Deleted, Cow::Borrowed(&*change.object)))
        }
        ChangeType::Modified => match (before, now) {
            (true, true) => Some((ChangeType::Modified, Cow::Borrowed(&*change.object))),
            (false, true) => Some((ChangeType::Added, Cow::Borrowed(&*change.object))),
            (true, false) => {
                let mut gone = (**change.previous.as_ref().expect("matched above")).clone();
                gone["metadata"]["resourceVersion"] = json!(change.rv.to_string());
                Some((ChangeType::Deleted, Cow::Owned(gone)))
            }
            (false, false) => None,
        },
    }
}

/// One line of the stream: `{"type":"ADDED","object":{...}}\n`.
pub fn event_line(event_type: &str, object: &Value) -> Bytes {
    let mut buf = Vec::with_capacity(256);
    buf.extend_from_slice(b"{\"type\":\"");
    buf.extend_from_slice(event_type.as_bytes());
    buf.extend_from_slice(b"\",\"object\":");
    serde_json::to_writer(&mut buf, object).expect("a JSON value serializes");
    buf.extend_from_slice(b"}\n");
    Bytes::from(buf)
}

/// A BOOKMARK's object: only kind, apiVersion and metadata.resourceVersion (plus the
/// initial-events-end annotation when it ends a streaming list's initial events).
pub fn bookmark_object(resource: &ResourceType, rv: u64, initial_events_end: bool) -> Value {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({INITIAL_EVENTS_END: "true"});
    }
    json!({"kind": resource.kind, "apiVersion": resource.api_version(), "metadata": metadata})
}

/// The ERROR event a watch from a forgotten version gets (the real server answers 200 and
/// sends this, rather than failing the request).
pub fn error_line(err: &ApiError) -> Bytes {
    event_line("ERROR", &err.to_status())
}

type Sink = mpsc::Sender<Result<Bytes, io::Error>>;

/// Sends a change if the watch's filters let it through. `false` when the client is gone.
async fn forward(tx: &Sink, req: &WatchRequest, change: &Change) -> bool {
    match event_for(change, req.namespace.as_deref(), &req.selectors) {
        Some((t, obj)) => tx
            .send(Ok(event_line(t.wire(), &as_version(&obj, &req.resource))))
            .await
            .is_ok(),
        None => true,
    }
}

/// Runs one watch until it times out, its resource goes, the client leaves, or the test cuts
/// every watch. Lines go to `tx`; an `Err` sent there makes the server abort the response.
pub async fn run(shared: Arc<Shared>, req: WatchRequest, tx: Sink) {
    let mut cut = shared.cut.subscribe();
    cut.borrow_and_update();
    let key = req.resource.storage_key();
    let ns = req.namespace.as_deref();
    let deadline = tokio::time::sleep(req.timeout);
    tokio::pin!(deadline);

    // Start under the locks; write after them (the client may be slow). The catalogue is
    // asked again here, in the order `uninstall_crd` takes the locks: the request's path was
    // resolved before, and a CRD deleted in between would otherwise leave this watch
    // subscribed to a storage that is gone, open and silent until its timeout.
    let started = {
        let catalogue = shared.catalogue.lock().expect("catalogue lock");
        if !catalogue.serves_storage(&key) {
            // The real server closes a deleted CRD's watches; the client's next request
            // gets its 404.
            return;
        }
        let mut store = shared.store.lock().expect("store lock");
        drop(catalogue);
        match req.start {
            Start::Now | Start::InitialEvents => {
                let snap = store.subscribe_now(&key);
                let mut lines: Vec<Bytes> = snap
                    .objects
                    .iter()
                    .filter(|o| in_namespace(o, ns) && req.selectors.matches(o))
                    .map(|o| event_line("ADDED", &as_version(o, &req.resource)))
                    .collect();
                if req.start == Start::InitialEvents {
                    lines.push(event_line(
                        "BOOKMARK",
                        &bookmark_object(&req.resource, snap.rv, true),
                    ));
                }
                Ok((lines, Vec::new(), snap.rx, snap.rv))
            }
            Start::After(rv) => store
                .subscribe_from(&key, rv)
                .map(|sub| (Vec::new(), sub.replay, sub.rx, rv)),
        }
    };
    let (mut first_lines, replay, mut rx, mut last_rv) = match started {
        Ok(s) => s,
        Err(e) => {
            let _ = tx.send(Ok(error_line(&e))).await;
            return;
        }
    };
    for line in first_lines.drain(..) {
        if tx.send(Ok(line)).await.is_err() {
            return;
        }
    }
    for change in &replay {
        last_rv = change.rv;
        if !forward(&tx, &req, change).await {
            return;
        }
    }
    drop(replay);

    let period = shared.options.bookmark_interval;
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            _ = &mut deadline => return,
            _ = tx.closed() => return,
            _ = cut.changed() => {
                let end = cut.borrow_and_update().1;
                let _ = match end {
                    WatchEnd::Abort => tx.send(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "watch cut by drop_watches"))).await,
                    WatchEnd::InternalError => tx.send(Ok(error_line(&ApiError::internal_error("etcdserver: request timed out")))).await,
                };
                return;
            }
            change = rx.recv() => match change {
                Some(change) => {
                    last_rv = change.rv;
                    if !forward(&tx, &req, &change).await {
                        return;
                    }
                }
                // The resource was uninstalled: the real server closes its watches.
                None => return,
            },
            _ = ticks.tick(), if req.bookmarks => {
                // The bookmark may claim the current version only once every change up to it
                // has been sent: take both under the lock, send the changes first.
                let (pending, rv) = {
                    let store = shared.store.lock().expect("store lock");
                    let mut pending = Vec::new();
                    while let Ok(c) = rx.try_recv() {
                        pending.push(c);
                    }
                    (pending, store.current_rv())
                };
                for change in &pending {
                    if !forward(&tx, &req, change).await {
                        return;
                    }
                }
                last_rv = last_rv.max(rv);
                if tx.send(Ok(event_line("BOOKMARK", &bookmark_object(&req.resource, last_rv, false)))).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin;
    use crate::selector::LabelSelector;

    fn pod_type() -> ResourceType {
        builtin().into_iter().find(|r| r.kind == "Pod").unwrap()
    }

    fn pod(app: &str, rv: u64) -> Arc<Value> {
        Arc::new(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "a", "labels": {"app": app}, "resourceVersion": rv.to_string()}}))
    }

    fn modified(from: &str, to: &str) -> Change {
        Change {
            rv: 7,
            key: pod_type().storage_key(),
            change: ChangeType::Modified,
            object: pod(to, 7),
            previous: Some(pod(from, 6)),
        }
    }

    #[test]
    fn selectors_turn_modifications_into_additions_and_deletions() {
        let web = Selectors {
            labels: LabelSelector::parse("app=web").unwrap(),
            ..Selectors::default()
        };
        let (t, _) = event_for(&modified("web", "web"), None, &web).unwrap();
        assert_eq!(t, ChangeType::Modified);
        let (t, _) = event_for(&modified("db", "web"), None, &web).unwrap();
        assert_eq!(t, ChangeType::Added);
        let out = modified("web", "db");
        let (t, obj) = event_for(&out, None, &web).unwrap();
        // The previous content, at the change's version.
        assert_eq!(
            (t, obj["metadata"]["labels"]["app"].as_str()),
            (ChangeType::Deleted, Some("web"))
        );
        assert_eq!(obj["metadata"]["resourceVersion"], "7");
        assert!(event_for(&modified("db", "db"), None, &web).is_none());
        assert!(event_for(&modified("web", "web"), Some("b"), &Selectors::default()).is_none());
    }

    #[test]
    fn lines_and_bookmarks_have_the_wire_shape() {
        let line = event_line("ADDED", &json!({"a": 1}));
        assert_eq!(&line[..], b"{\"type\":\"ADDED\",\"object\":{\"a\":1}}\n");
        let bm = bookmark_object(&pod_type(), 42, true);
        assert_eq!(
            bm,
            json!({"kind": "Pod", "apiVersion": "v1",
                   "metadata": {"resourceVersion": "42", "annotations": {"k8s.io/initial-events-end": "true"}}})
        );
        let err: Value = serde_json::from_slice(&error_line(&ApiError::too_old(3, 9))).unwrap();
        assert_eq!(err["type"], "ERROR");
        assert_eq!(err["object"]["code"], 410);
    }

    /// A watch whose path was resolved just before its CRD was deleted must not subscribe to
    /// the storage that is gone: it would stay open and silent (no cut, no end) until its
    /// timeout, and the client would never learn the kind went.
    #[tokio::test]
    async fn a_watch_of_a_crd_deleted_since_its_path_was_resolved_ends_at_once() {
        let server = crate::FakeApiServer::start(crate::ServerOptions::default())
            .await
            .unwrap();
        server.install_crd("danm.k8s.io", "v1", "DanmNetworkPolicy");
        let resource = crate::resources::known_crds()
            .into_iter()
            .find(|r| r.kind == "DanmNetworkPolicy" && r.version == "v1")
            .unwrap();
        let rv = server.shared().store.lock().unwrap().current_rv();
        server.uninstall_crd("danm.k8s.io", "v1", "DanmNetworkPolicy");
        let request = WatchRequest {
            resource,
            namespace: None,
            selectors: Selectors::default(),
            bookmarks: false,
            timeout: Duration::from_secs(300),
            start: Start::After(rv),
        };
        let (tx, mut rx) = mpsc::channel(8);
        tokio::time::timeout(
            Duration::from_secs(5),
            run(server.shared().clone(), request, tx),
        )
        .await
        .expect("the watch ended rather than waiting for its timeout");
        assert!(rx.recv().await.is_none(), "nothing was sent");
    }
}
