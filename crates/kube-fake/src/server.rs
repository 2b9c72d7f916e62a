//! [`FakeApiServer`]: the listener, the connections, and the control surface tests use — write
//! objects, install CRDs, forget history, cut watches, stop and restart, fail every request,
//! read the request log and the state back.
//!
//! The accept loop owns every connection task, so stopping it closes the listener (new
//! connections are refused) and drops every open connection at once, as a crashed or
//! restarted kube-apiserver would.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::Value;
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::{JoinHandle, JoinSet};

use crate::log::RequestLog;
// Re-exported: the server's options are part of its control surface.
use crate::resources::{known_crds, Catalogue, ResourceType};
pub use crate::shared::ServerOptions;
use crate::shared::{Shared, WatchEnd};
use crate::status::ApiError;
use crate::store::{Stamp, StatusRule, Store};

/// A fake kube-apiserver on 127.0.0.1. See the crate documentation for what is faithful.
pub struct FakeApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: Mutex<Option<JoinHandle<()>>>,
}

fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // The port is reused by `restart` while closed connections may still be in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    // Dropped with this future when the server stops: every connection task is aborted.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let shared = shared.clone();
                connections.spawn(async move {
                    let service = service_fn(move |req| crate::http::handle(shared.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

impl FakeApiServer {
    /// The server's state, for the crate's own tests.
    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Starts serving (on `options.listen`), with no objects and no CRD installed.
    pub async fn start(options: ServerOptions) -> io::Result<FakeApiServer> {
        let listener = bind(options.listen)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(options.history_limit)),
            catalogue: Mutex::new(Catalogue::default()),
            log: Mutex::new(Vec::new()),
            unavailable: AtomicBool::new(false),
            unavailable_kinds: Mutex::default(),
            hidden_groups: Mutex::default(),
            injected: Mutex::default(),
            cut: tokio::sync::watch::channel((0, WatchEnd::Abort)).0,
            options,
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(FakeApiServer {
            shared,
            addr,
            accept: Mutex::new(Some(accept)),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig naming this server over plain HTTP, with no credentials (the fake does not
    /// authenticate), context `netwarden-kube-fake`, namespace `default`.
    pub fn kubeconfig(&self) -> String {
        kubeconfig_for(&self.url())
    }

    pub fn write_kubeconfig(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.kubeconfig())
    }

    fn stamp() -> Stamp {
        Stamp {
            now: crate::http::now_rfc3339(),
        }
    }

    /// The served type of an object's `apiVersion` + `kind`; a CRD that is not installed is
    /// the real server's 404.
    fn resource_of(&self, obj: &Value) -> Result<ResourceType, ApiError> {
        let api_version = obj["apiVersion"].as_str().unwrap_or("");
        let kind = obj["kind"].as_str().unwrap_or("");
        self.resource(api_version, kind)
    }

    fn resource(&self, api_version: &str, kind: &str) -> Result<ResourceType, ApiError> {
        self.shared
            .catalogue
            .lock()
            .expect("catalogue lock")
            .by_kind(api_version, kind)
            .cloned()
            .ok_or_else(|| {
                ApiError::bad_request(format!("no kind {kind:?} is served in {api_version:?}"))
            })
    }

    /// Creates an object (its `apiVersion`, `kind`, `metadata.name` and, for a namespaced
    /// kind, `metadata.namespace` say what and where), as a POST would. Returns it as stored.
    pub fn create(&self, obj: Value) -> Result<Value, ApiError> {
        let resource = self.resource_of(&obj)?;
        let created =
            self.shared
                .store
                .lock()
                .expect("store lock")
                .create(&resource, obj, &Self::stamp())?;
        Ok((*created).clone())
    }

    /// Replaces an object whole — status included, whatever resourceVersion it carries (the
    /// test is the controller here). An unchanged object causes no event.
    pub fn update(&self, obj: Value) -> Result<Value, ApiError> {
        let resource = self.resource_of(&obj)?;
        let ns = if resource.namespaced {
            obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string()
        } else {
            String::new()
        };
        let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
        let updated = self.shared.store.lock().expect("store lock").replace(
            &resource,
            &ns,
            &name,
            obj,
            None,
            StatusRule::Whole,
        )?;
        Ok((*updated).clone())
    }

    /// Creates the object, or replaces it when it exists.
    pub fn apply(&self, obj: Value) -> Result<Value, ApiError> {
        match self.create(obj.clone()) {
            Err(e) if e.reason == "AlreadyExists" => self.update(obj),
            other => other,
        }
    }

    /// Deletes an object (`namespace` is ignored for a cluster-scoped kind). A Namespace
    /// takes its objects along.
    pub fn delete(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        let resource = self.resource(api_version, kind)?;
        let ns = if resource.namespaced { namespace } else { "" };
        let gone = self
            .shared
            .store
            .lock()
            .expect("store lock")
            .delete(&resource, ns, name)?;
        Ok((*gone).clone())
    }

    /// Serves one version of a CRD. The node agent's CRDs (DanmNetworkPolicy, DanmEp,
    /// MultiNetworkPolicy v1beta1/v1beta2) are known by group, version and kind; any other
    /// kind is served under its lower-cased plural (`Widget` → `widgets`).
    pub fn install_crd(&self, group: &str, version: &str, kind: &str) {
        let resource = known_crds()
            .into_iter()
            .find(|r| r.group == group && r.version == version && r.kind == kind)
            .unwrap_or_else(|| ResourceType {
                group: group.into(),
                version: version.into(),
                kind: kind.into(),
                plural: format!("{}s", kind.to_ascii_lowercase()),
                namespaced: true,
                short_names: Vec::new(),
            });
        self.shared
            .catalogue
            .lock()
            .expect("catalogue lock")
            .install(resource);
    }

    /// Stops serving one version of a CRD: its paths answer 404 and it leaves discovery. When
    /// no version is left, its objects are deleted and its watches end (as the real server
    /// does when a CRD is deleted).
    pub fn uninstall_crd(&self, group: &str, version: &str, kind: &str) {
        let mut catalogue = self.shared.catalogue.lock().expect("catalogue lock");
        if let Some(removed) = catalogue.uninstall(group, version, kind) {
            let key = removed.storage_key();
            if !catalogue.serves_storage(&key) {
                self.shared
                    .store
                    .lock()
                    .expect("store lock")
                    .drop_storage(&key);
            }
        }
    }

    /// Deletes a CRD — every served version of `kind` in `group` — as kube-apiserver does: its
    /// finalizer first deletes the objects one by one (a DELETED event each on the open
    /// watches), then the CRD goes: its paths answer 404, discovery drops its group/version,
    /// its watches end. ([`FakeApiServer::uninstall_crd`] takes one version away abruptly: the
    /// objects vanish without an event, as a client whose watch was down meanwhile sees it.)
    /// Returns how many objects were deleted.
    pub fn delete_crd(&self, group: &str, kind: &str) -> usize {
        // Held throughout, so that no request resolves the kind (to create in it, say) between
        // the deletions and the end.
        let mut catalogue = self.shared.catalogue.lock().expect("catalogue lock");
        let versions: Vec<ResourceType> = catalogue
            .served()
            .iter()
            .filter(|r| r.group == group && r.kind == kind)
            .cloned()
            .collect();
        let Some(served) = versions.first() else {
            return 0;
        };
        let key = served.storage_key();
        let mut store = self.shared.store.lock().expect("store lock");
        let objects = store.all(&key);
        for obj in &objects {
            let meta = |field: &str| obj["metadata"][field].as_str().unwrap_or("").to_string();
            store
                .delete(served, &meta("namespace"), &meta("name"))
                .expect("a stored object can be deleted");
        }
        for r in &versions {
            catalogue.uninstall(group, &r.version, kind);
        }
        if !catalogue.serves_storage(&key) {
            store.drop_storage(&key);
        }
        objects.len()
    }

    /// Forgets the history: a watch or LIST from any older resourceVersion is now 410 Expired
    /// (open watches go on; cut them with [`FakeApiServer::drop_watches`]).
    pub fn compact(&self) {
        self.shared.store.lock().expect("store lock").compact();
    }

    /// Cuts every open watch connection mid-stream (no final chunk): the client sees a broken
    /// connection, not a clean end.
    pub fn drop_watches(&self) {
        self.shared
            .cut
            .send_modify(|(n, end)| (*n, *end) = (*n + 1, WatchEnd::Abort));
    }

    /// Ends every open watch with an ERROR event carrying a 500 `InternalError` Status, then a
    /// clean end of the response — what kube-apiserver sends when the storage under a watch
    /// fails. The client must watch again; nothing about the objects changed.
    pub fn fail_watches(&self) {
        self.shared
            .cut
            .send_modify(|(n, end)| (*n, *end) = (*n + 1, WatchEnd::InternalError));
    }

    /// Stops listening and drops every connection: new connections are refused until
    /// [`FakeApiServer::restart`]. The state is kept.
    pub async fn stop(&self) {
        let accept = self.accept.lock().expect("accept lock").take();
        if let Some(accept) = accept {
            accept.abort();
            // Returns once the loop is dropped: the listener is closed and the connections
            // are aborted.
            let _ = accept.await;
        }
    }

    /// Serves again on the same address with the same state.
    pub async fn restart(&self) -> io::Result<()> {
        self.stop().await;
        let listener = bind(self.addr)?;
        let accept = tokio::spawn(accept_loop(listener, self.shared.clone()));
        *self.accept.lock().expect("accept lock") = Some(accept);
        Ok(())
    }

    /// While set, every request is answered 503 ServiceUnavailable (open watches go on).
    pub fn set_unavailable(&self, unavailable: bool) {
        self.shared.unavailable.store(unavailable, Ordering::SeqCst);
    }

    /// While set, every request about objects of `kind` (list, watch, get, writes) is
    /// answered 503 ServiceUnavailable; other kinds are served (open watches go on). One kind
    /// failing is what keeps a watcher's view partial.
    pub fn set_kind_unavailable(&self, kind: &str, unavailable: bool) {
        let mut kinds = self.shared.unavailable_kinds.lock().expect("kinds lock");
        if unavailable {
            kinds.insert(kind.to_string());
        } else {
            kinds.remove(kind);
        }
    }

    /// While set, the API group `group` is hidden as a restarting kube-apiserver hides CRDs
    /// for a moment: absent from discovery (`/apis` and below), and every request about its
    /// objects (list, watch, get, writes) answered 404 as for a CRD not installed. Unlike
    /// [`FakeApiServer::uninstall_crd`], its objects stay and come back with it. Open watches
    /// go on; cut them with [`FakeApiServer::drop_watches`].
    pub fn hide_group(&self, group: &str, hidden: bool) {
        let mut groups = self.shared.hidden_groups.lock().expect("groups lock");
        if hidden {
            groups.insert(group.to_string());
        } else {
            groups.remove(group);
        }
    }

    /// Adds `items` (raw JSON, written as given) at the end of every LIST response of `kind`
    /// (by kind name, every page), after the stored objects — what a buggy or hostile
    /// aggregated API server might answer: a second object of the same name, an object of
    /// another kind. Watches are not affected. An empty `items` stops it.
    pub fn inject_in_lists(&self, kind: &str, items: Vec<Value>) {
        let mut injected = self.shared.injected.lock().expect("injected lock");
        if items.is_empty() {
            injected.remove(kind);
        } else {
            injected.insert(kind.to_string(), items);
        }
    }

    /// Every request so far.
    pub fn requests(&self) -> RequestLog {
        RequestLog(self.shared.log.lock().expect("log lock").clone())
    }

    pub fn clear_requests(&self) {
        self.shared.log.lock().expect("log lock").clear();
    }

    /// Every stored object of a kind name (`Pod`; all groups that serve that name, e.g. both
    /// Event APIs), sorted by namespace and name within each storage.
    pub fn objects(&self, kind: &str) -> Vec<Value> {
        let keys: Vec<_> = {
            let catalogue = self.shared.catalogue.lock().expect("catalogue lock");
            let mut keys: Vec<_> = catalogue
                .by_kind_name(kind)
                .map(|r| r.storage_key())
                .collect();
            keys.dedup();
            keys
        };
        let store = self.shared.store.lock().expect("store lock");
        keys.iter()
            .flat_map(|k| store.all(k))
            .map(|o| (*o).clone())
            .collect()
    }

    /// One stored object, if it exists.
    pub fn object(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Value> {
        let resource = self.resource(api_version, kind).ok()?;
        let ns = if resource.namespaced { namespace } else { "" };
        let obj =
            self.shared
                .store
                .lock()
                .expect("store lock")
                .get(&resource.storage_key(), ns, name)?;
        Some((*obj).clone())
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.lock().expect("store lock").current_rv()
    }
}

/// A kubeconfig for a server URL, no credentials.
pub fn kubeconfig_for(url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: netwarden-kube-fake
  cluster:
    server: {url}
users:
- name: netwarden-kube-fake
  user: {{}}
contexts:
- name: netwarden-kube-fake
  context:
    cluster: netwarden-kube-fake
    user: netwarden-kube-fake
    namespace: default
current-context: netwarden-kube-fake
"
    )
}
