//! The Kubernetes side of `netwarden run --kube`: one `kube::runtime::watcher` per watched
//! kind, each event reduced at the edge into a [`ClusterSet`], and a wake-up for the agent
//! loop when something it reads changed.
//!
//! ```text
//!  API server ──watch──▶ task per kind ──upsert/remove──▶ ClusterSet (reduced objects only)
//!                          │                                     │
//!                          └─ WatchStatus (listed, failing)      └─ Pending (oldest receipt)
//!                                                                         │ Condvar
//!  agent loop (sync thread) ◀── KubeSource::wait(interval) ───────────────┘
//!        └── KubeSource::inventory() → engine → kernel
//! ```
//!
//! The agent never sees raw objects: an event that does not change the reduced object
//! ([`ClusterSet::upsert`] returns false) wakes nothing. There is no periodic relist: the
//! watchers list again only when they must (410 Gone, a lost connection); objects deleted while
//! a watch was down are dropped when its relist completes (`InitDone`). An optional kind (a
//! CRD) the cluster does not serve is skipped with one warning and picked up when discovery,
//! polled every [`KubeOptions::discovery_interval`], finds it; MultiNetworkPolicy is watched at
//! the first of its versions the cluster serves.
//!
//! The watchers run on a small tokio runtime owned by the [`KubeSource`]; the agent loop stays
//! synchronous and blocks in [`KubeSource::wait`].
//!
//! [`list_once`] is the other way in: one LIST per kind and no watch, for the analysis
//! commands (`reach`, `explain`, `validate --kube`); [`get_object`] and [`merge_patch`] the
//! one write a user command makes (`promote --kube`).
#![forbid(unsafe_code)]

pub mod events;
pub mod kinds;
pub mod list;
pub mod patch;
pub mod raw;
pub mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::ApiResource;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use netwarden_manifest::{ClusterKey, ClusterSet, Inventory, InventoryDelta, LoadOptions, Problem};
use tracing::{debug, info, warn};

pub use crate::events::{EventPublisher, EventReason, PolicyEvent, PolicyObject};
pub use crate::kinds::{watched, WatchedKind, WATCHED_KINDS};
pub use crate::list::{list_once, ListOptions, Listed};
pub use crate::patch::{get_object, merge_patch};
pub use crate::raw::RawObject;
pub use crate::status::{KindState, KindStatus, WatchStatus};

/// How to reach the cluster and what to watch.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// A kubeconfig file; `None`: `KUBECONFIG`, `~/.kube/config`, then in-cluster (as kubectl).
    pub kubeconfig: Option<PathBuf>,
    pub load: LoadOptions,
    /// How often discovery is asked again for optional kinds not served yet.
    pub discovery_interval: Duration,
    /// Write Kubernetes Events on bad policies ([`events`]), reported as this instance (the
    /// node's name); `None`: write none.
    pub events_as: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("cannot start the watchers' runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot read kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("no Kubernetes client configuration (KUBECONFIG, ~/.kube/config or in-cluster): {0}")]
    Infer(#[source] kube::config::InferConfigError),
    #[error("cannot create the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error("cannot ask the cluster whether it serves {kind}: {source}")]
    Discovery {
        kind: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("cannot list {kind} ({api_version}): {source}")]
    List {
        kind: &'static str,
        api_version: String,
        #[source]
        source: kube::Error,
    },
    #[error("{kind} is not served by the cluster (CRD not installed?)")]
    NotServed { kind: &'static str },
    #[error("{kind} {name}: {source}")]
    Object {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// What happened since the agent last took the inventory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    /// Reduced objects that changed (0: only the status changed, or nothing).
    pub changes: u64,
    /// When the oldest of those changes was received from the API (for event-to-apply
    /// latency).
    pub oldest: Option<Instant>,
    /// A watcher's status changed (listed, failing, recovered).
    pub status_changed: bool,
    /// Someone else woke the waiter ([`KubeSource::waker`]): the kernel changed, say.
    pub woken: bool,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.changes == 0 && !self.status_changed && !self.woken
    }
}

/// State shared by the watch tasks and the agent loop.
#[derive(Debug)]
struct Shared {
    cluster: Mutex<ClusterSet>,
    /// uid, generation and apiVersion of each policy held (the reduced form has none of them):
    /// what Events name and reference.
    policies: Mutex<BTreeMap<ClusterKey, PolicyObject>>,
    status: Mutex<WatchStatus>,
    pending: Mutex<Pending>,
    wake: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn changed(&self, received: Instant) {
        let mut p = lock(&self.pending);
        p.changes += 1;
        p.oldest.get_or_insert(received);
        // Only the first change since the waiter took them can end its wait (and before the
        // first full list none does): a wake-up for each of a list's 100,000 objects cost the
        // waiting thread a context switch apiece (8% of the agent's time while listing).
        if p.changes == 1 {
            self.wake.notify_all();
        }
    }

    /// [`KubeSource::wait`].
    fn wait(&self, timeout: Duration) -> Pending {
        let pending = lock(&self.pending);
        let (mut pending, _) = self
            .wake
            .wait_timeout_while(pending, timeout, |p| {
                p.is_empty() || (!p.status_changed && !p.woken && !lock(&self.status).synced_once())
            })
            .unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *pending)
    }

    fn status(&self, update: impl FnOnce(&mut WatchStatus)) {
        let before = lock(&self.status).clone();
        let mut status = lock(&self.status);
        update(&mut status);
        if *status != before {
            drop(status);
            lock(&self.pending).status_changed = true;
            self.wake.notify_all();
        }
    }
}

/// The watchers of one cluster, feeding one [`ClusterSet`].
pub struct KubeSource {
    shared: Arc<Shared>,
    events: Option<EventPublisher>,
    /// Owns the watch tasks: dropping the source stops them.
    _runtime: tokio::runtime::Runtime,
}

impl KubeSource {
    /// Connects (reading the client configuration now, so a bad kubeconfig fails at start) and
    /// starts one watcher per kind of [`watched`]`(load.network_policy_enabled)`.
    pub fn start(options: KubeOptions) -> Result<KubeSource, KubeError> {
        // Two workers: a watcher's stream (fetching and parsing its list pages) runs beside
        // the task reducing what it read (see `watch`).
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kube-watch")
            .enable_all()
            .build()
            .map_err(KubeError::Runtime)?;
        let client = runtime.block_on(client(options.kubeconfig.as_deref()))?;
        let shared = Arc::new(Shared {
            cluster: Mutex::new(ClusterSet::new(options.load.clone())),
            policies: Mutex::new(BTreeMap::new()),
            status: Mutex::new(WatchStatus::default()),
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
        });
        for kind in watched(options.load.network_policy_enabled) {
            let state = if kind.optional {
                KindState::Discovering
            } else {
                KindState::Watching {
                    version: kind.versions[0],
                }
            };
            lock(&shared.status).track(kind.kind, state);
        }
        let events = options
            .events_as
            .map(|node| EventPublisher::start(runtime.handle(), client.clone(), node));
        for kind in watched(options.load.network_policy_enabled) {
            let (client, shared) = (client.clone(), shared.clone());
            if kind.optional {
                runtime.spawn(discover_then_watch(
                    client,
                    shared,
                    kind,
                    options.discovery_interval,
                ));
            } else {
                runtime.spawn(watch(client, shared, kind, kind.versions[0]));
            }
        }
        Ok(KubeSource {
            shared,
            events,
            _runtime: runtime,
        })
    }

    /// Waits until something is pending or `timeout` passes, then takes what is pending.
    ///
    /// Until every kind has been listed once, a change alone does not end the wait: the view
    /// is not complete, so there is nothing the agent could do with it, and waking it for
    /// each of the first list's objects (100,000 at the largest clusters) only made it
    /// contend for the [`ClusterSet`] with the watcher filling it. The changes stay pending.
    pub fn wait(&self, timeout: Duration) -> Pending {
        self.shared.wait(timeout)
    }

    /// Something that ends the agent's [`KubeSource::wait`] at once when called (from any
    /// thread), for news that does not come from the API: a pod's interfaces changed.
    pub fn waker(&self) -> impl Fn() + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || {
            lock(&shared.pending).woken = true;
            shared.wake.notify_all();
        }
    }

    /// The cluster as reduced now, assembled whole (for analysis; the agent takes deltas).
    pub fn inventory(&self) -> Inventory {
        lock(&self.shared.cluster).inventory()
    }

    /// What changed since the last call (the first call: everything), with every current
    /// problem: only the objects touched since are assembled again
    /// ([`ClusterSet::take_delta`]).
    pub fn take_delta(&self) -> (InventoryDelta, Vec<Problem>) {
        let mut cluster = lock(&self.shared.cluster);
        let delta = cluster.take_delta();
        (delta, cluster.problems())
    }

    /// Objects held per kind.
    pub fn counts(&self) -> BTreeMap<String, usize> {
        lock(&self.shared.cluster).counts()
    }

    pub fn status(&self) -> WatchStatus {
        lock(&self.shared.status).clone()
    }

    /// The identity (uid, generation, apiVersion) of each policy object held.
    pub fn policies(&self) -> BTreeMap<ClusterKey, PolicyObject> {
        lock(&self.shared.policies).clone()
    }

    /// The identity of one policy object, if it is held.
    pub fn policy(&self, key: &ClusterKey) -> Option<PolicyObject> {
        lock(&self.shared.policies).get(key).cloned()
    }

    /// The Event publisher (`None` without [`KubeOptions::events_as`]).
    pub fn events(&self) -> Option<&EventPublisher> {
        self.events.as_ref()
    }
}

/// The kinds whose objects Events are written about.
const POLICY_KINDS: [&str; 3] = ["NetworkPolicy", "DanmNetworkPolicy", "MultiNetworkPolicy"];

async fn client(kubeconfig: Option<&std::path::Path>) -> Result<Client, KubeError> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                KubeError::Kubeconfig {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|source| KubeError::Kubeconfig {
                    path: path.to_path_buf(),
                    source,
                })?
        }
        None => kube::Config::infer().await.map_err(KubeError::Infer)?,
    };
    Client::try_from(config).map_err(KubeError::Client)
}

/// Asks discovery, every `interval`, for the first served version of an optional kind; then
/// watches it, until it is no longer served (its CRD deleted: see [`watch`]), and asks again.
/// Says once that the kind is absent.
async fn discover_then_watch(
    client: Client,
    shared: Arc<Shared>,
    kind: &'static WatchedKind,
    interval: Duration,
) {
    let mut warned = false;
    loop {
        match served_version(&client, kind).await {
            Ok(Some(version)) => {
                if warned {
                    info!("{} is now served ({version}): watching it", kind.kind);
                }
                shared.status(|s| s.set_state(kind.kind, KindState::Watching { version }));
                watch(client.clone(), shared.clone(), kind, version).await;
                // The watch ended: the kind is no longer served at `version`.
                warned = true;
            }
            Ok(None) => {
                if !warned {
                    warn!(
                        "{} ({}) is not served by the cluster (CRD not installed?): skipped until it is",
                        kind.kind,
                        kind.versions
                            .iter()
                            .map(|v| kind.api_version(v))
                            .collect::<Vec<_>>()
                            .join(" or ")
                    );
                    warned = true;
                }
                shared.status(|s| s.set_state(kind.kind, KindState::Absent));
            }
            Err(e) => {
                debug!("discovery of {} failed: {e}", kind.kind);
                shared.status(|s| s.failed(kind.kind, format!("discovery: {e}")));
            }
        }
        tokio::time::sleep(interval).await;
    }
}

/// The first of `kind.versions` whose discovery document lists `kind.plural`.
async fn served_version(
    client: &Client,
    kind: &WatchedKind,
) -> Result<Option<&'static str>, kube::Error> {
    for version in kind.versions {
        let api_version = kind.api_version(version);
        let listed = if kind.group.is_empty() {
            client.list_core_api_resources(version).await
        } else {
            client.list_api_group_resources(&api_version).await
        };
        match listed {
            Ok(list) if list.resources.iter().any(|r| r.name == kind.plural) => {
                return Ok(Some(version))
            }
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

fn api_resource(kind: &WatchedKind, version: &str) -> ApiResource {
    ApiResource {
        group: kind.group.to_string(),
        version: version.to_string(),
        api_version: kind.api_version(version),
        kind: kind.kind.to_string(),
        plural: kind.plural.to_string(),
    }
}

/// Whether an optional kind watched at `version` is no longer served there: its CRD was
/// deleted (or that version removed). Then it holds no object any more — the API server
/// deletes a CRD's objects with it — and the watch ends (its objects are dropped, the kind is
/// absent, not failing); [`discover_then_watch`] looks for it again. A discovery that fails
/// says nothing: the watcher keeps retrying.
async fn no_longer_served(client: &Client, kind: &WatchedKind, version: &str) -> bool {
    kind.optional && matches!(served_version(client, kind).await, Ok(v) if v != Some(version))
}

/// How many items of a watch stream may wait for the reducer: two list pages of kube's
/// default size (500), so the next page is fetched and parsed while the last is reduced, and
/// no more than that is held parsed.
const WATCH_PIPELINE: usize = 1000;

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Watches one kind cluster-wide: forever (the watcher retries with backoff), or, for an
/// optional kind, until it is no longer served.
async fn watch(
    client: Client,
    shared: Arc<Shared>,
    kind: &'static WatchedKind,
    version: &'static str,
) {
    let resource = api_resource(kind, version);
    let api: Api<RawObject> = Api::all_with(client.clone(), &resource);
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    // The stream is polled by a task of its own, which hands each item over as it comes: kube
    // fetches the next list page only once every item of the last one was taken, so reducing
    // them here, on the same task, left the list waiting for the reducer and the reducer
    // waiting for the next page (at 100,000 pods the watch thread was a fifth idle during the
    // initial list, with a second core free). In order, through one channel: what this task
    // does is what it would have done polling the stream itself.
    let (items, mut taken) = tokio::sync::mpsc::channel(WATCH_PIPELINE);
    let forwarder = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            if items.send((item, Instant::now())).await.is_err() {
                return;
            }
        }
    });
    // Returning (the kind no longer served) stops the stream with it.
    let _forwarder = AbortOnDrop(forwarder);
    // Objects seen by the list in progress, to drop those deleted while the watch was down.
    let mut listed: Option<BTreeSet<ClusterKey>> = None;
    let upsert = |object: RawObject, received: Instant| -> ClusterKey {
        let value = object.into_typed_value(&resource);
        let key = ClusterKey::of(&value);
        let mut changed = lock(&shared.cluster).upsert(&value);
        if POLICY_KINDS.contains(&kind.kind) {
            // A new generation may leave the reduced policy as it was and still deserves its
            // own Event: the agent must look again.
            let identity = PolicyObject::of(&value);
            changed |=
                lock(&shared.policies).insert(key.clone(), identity.clone()) != Some(identity);
        }
        if changed {
            shared.changed(received);
        }
        key
    };
    while let Some((item, received)) = taken.recv().await {
        let event = match item {
            Ok(event) => event,
            Err(e) => {
                if no_longer_served(&client, kind, version).await {
                    info!(
                        "{} is no longer served at {version} (CRD deleted?): its objects are \
                         gone; watching for it to return",
                        kind.kind
                    );
                    let gone = lock(&shared.cluster).retain_kind(kind.kind, &BTreeSet::new());
                    lock(&shared.policies).retain(|k, _| k.kind != kind.kind);
                    shared.status(|s| s.gone(kind.kind));
                    if !gone.is_empty() {
                        shared.changed(received);
                    }
                    return;
                }
                warn!("watch of {}: {e} (retrying)", kind.kind);
                shared.status(|s| s.failed(kind.kind, e.to_string()));
                continue;
            }
        };
        match event {
            Event::Init => {
                listed = Some(BTreeSet::new());
                shared.status(|s| s.list_started(kind.kind));
            }
            Event::InitApply(object) => {
                let key = upsert(object, received);
                if let Some(listed) = listed.as_mut() {
                    listed.insert(key);
                }
            }
            Event::InitDone => {
                if let Some(present) = listed.take() {
                    let gone = lock(&shared.cluster).retain_kind(kind.kind, &present);
                    lock(&shared.policies)
                        .retain(|k, _| k.kind != kind.kind || present.contains(k));
                    if !gone.is_empty() {
                        debug!("{}: {} deleted while not watched", kind.kind, gone.len());
                        shared.changed(received);
                    }
                }
                shared.status(|s| s.list_done(kind.kind));
            }
            Event::Apply(object) => {
                upsert(object, received);
                shared.status(|s| s.progressed(kind.kind));
            }
            Event::Delete(object) => {
                let (namespace, name) = object.namespace_and_name();
                lock(&shared.policies).remove(&ClusterKey::new(kind.kind, namespace, name));
                if lock(&shared.cluster).remove(kind.kind, namespace, name) {
                    shared.changed(received);
                }
                shared.status(|s| s.progressed(kind.kind));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_typed_by_the_resource_they_were_watched_as() {
        let kind = WATCHED_KINDS
            .iter()
            .find(|k| k.kind == "MultiNetworkPolicy")
            .unwrap();
        let resource = api_resource(kind, "v1beta1");
        let object: RawObject = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "p", "namespace": "ns"}}),
        )
        .unwrap();
        let value = object.into_typed_value(&resource);
        assert_eq!(value["apiVersion"], "k8s.cni.cncf.io/v1beta1");
        assert_eq!(value["kind"], "MultiNetworkPolicy");
        assert_eq!(
            ClusterKey::of(&value),
            ClusterKey::new("MultiNetworkPolicy", "ns", "p")
        );
    }

    fn shared() -> Shared {
        Shared {
            cluster: Mutex::new(ClusterSet::new(LoadOptions::default())),
            policies: Mutex::new(BTreeMap::new()),
            status: Mutex::new(WatchStatus::default()),
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
        }
    }

    /// One wake-up per batch of changes, not per change: the first change after the waiter
    /// took the last batch wakes it, and so does the next batch's first one.
    #[test]
    fn a_waiter_wakes_for_the_first_change_of_each_batch() {
        let shared = Arc::new(shared());
        shared.status(|s| {
            s.track("Pod", KindState::Watching { version: "v1" });
            s.list_started("Pod");
            s.list_done("Pod");
        });
        assert!(shared.wait(Duration::ZERO).status_changed);
        for batch in 0..3 {
            let waiter = {
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let start = Instant::now();
                    (shared.wait(Duration::from_secs(30)), start.elapsed())
                })
            };
            std::thread::sleep(Duration::from_millis(50));
            for _ in 0..=batch {
                shared.changed(Instant::now());
            }
            let (pending, waited) = waiter.join().unwrap();
            assert!(pending.changes >= 1, "batch {batch}: {pending:?}");
            assert!(
                waited < Duration::from_secs(10),
                "batch {batch}: woken late"
            );
        }
    }

    /// Before every kind was listed once, changes stay pending and end no wait.
    #[test]
    fn before_the_first_list_a_change_ends_no_wait() {
        let shared = shared();
        shared.status(|s| s.track("Pod", KindState::Watching { version: "v1" }));
        shared.wait(Duration::ZERO);
        shared.changed(Instant::now());
        let start = Instant::now();
        let pending = shared.wait(Duration::from_millis(200));
        assert!(start.elapsed() >= Duration::from_millis(200));
        assert_eq!(pending.changes, 1, "taken at the timeout, not lost");
    }

    #[test]
    fn waiting_returns_what_is_pending_once() {
        let shared = shared();
        let t0 = Instant::now();
        shared.changed(t0);
        shared.changed(Instant::now());
        let p = std::mem::take(&mut *lock(&shared.pending));
        assert_eq!(p.changes, 2);
        assert_eq!(p.oldest, Some(t0), "latency counts from the oldest change");
        shared.status(|s| s.track("Pod", KindState::Absent));
        assert!(lock(&shared.pending).status_changed);
    }
}
