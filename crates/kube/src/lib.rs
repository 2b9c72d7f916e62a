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
//! the first of its versions the cluster serves. A kind watched that discovery stops listing
//! keeps its objects (not ready, saying why) until it has stayed unserved for
//! [`KubeOptions::crd_grace`]: a restarting API server answers 404 for CRDs for a moment, and
//! dropping their policies at once opened every pod they isolate. A watch request the API
//! server accepts clears its kind's failure ([`client`]): a quiet kind has no event to show.
//! A list naming an object twice, or holding an item of another kind, is reported
//! (`list::ListScreen`) and the extra item ignored.
//!
//! The watchers run on a small tokio runtime owned by the [`KubeSource`]; the agent loop stays
//! synchronous and blocks in [`KubeSource::wait`].
//!
//! [`list_once`] is the other way in: one LIST per kind and no watch, for the analysis
//! commands (`reach`, `explain`, `validate --kube`); [`get_object`] and [`merge_patch`] the
//! one write a user command makes (`promote --kube`).
#![forbid(unsafe_code)]

pub mod client;
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
use tokio::sync::Notify;
use tracing::{debug, info, warn};

pub use crate::client::ClientTimeouts;
use crate::client::{client, WatchAccepted};

pub use crate::events::{EventPublisher, EventReason, PolicyEvent, PolicyObject};
pub use crate::kinds::{watched, WatchedKind, WATCHED_KINDS};
pub use crate::list::{list_once, ListOptions, Listed};
pub use crate::patch::{get_object, merge_patch};
pub use crate::raw::RawObject;
pub use crate::status::{KindState, KindStatus, Unserved, WatchStatus};

/// How to reach the cluster and what to watch.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// A kubeconfig file; `None`: `KUBECONFIG`, `~/.kube/config`, then in-cluster (as kubectl).
    pub kubeconfig: Option<PathBuf>,
    pub load: LoadOptions,
    /// How often discovery is asked again for optional kinds not served yet.
    pub discovery_interval: Duration,
    /// How long an optional kind watched must stay unserved (discovery asked again and again
    /// over that time) before its objects are dropped: a 404 is also what an API server
    /// answers for a while when it restarts, and dropping a kind's policies at once opened
    /// every pod they isolate. Meanwhile its last objects stay enforced (not ready).
    pub crd_grace: Duration,
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
    #[error(
        "the API server at {server} did not answer within {}s ({what}): is it up, and is this \
         the right server?",
        timeout.as_secs_f64()
    )]
    Timeout {
        server: String,
        timeout: Duration,
        what: String,
        #[source]
        source: Box<kube::Error>,
    },
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
    #[error(
        "{kind} is {}: its objects are named {}",
        if *namespaced { "namespaced" } else { "cluster-scoped" },
        if *namespaced { "with a namespace" } else { "without one" }
    )]
    Scope {
        kind: &'static str,
        namespaced: bool,
    },
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
    /// Watch requests the API server accepted, by path ([`client`]).
    accepted: Arc<WatchAccepted>,
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
    /// The runtime [`KubeSource::start`] made for the watch tasks (dropping the source stops
    /// them); `None` when they run on the caller's ([`KubeSource::start_on`]).
    _runtime: Option<tokio::runtime::Runtime>,
}

impl KubeSource {
    /// Connects (reading the client configuration now, so a bad kubeconfig fails at start) and
    /// starts one watcher per kind of [`watched`]`(load.network_policy_enabled)`.
    /// The watch tasks run on a runtime of their own.
    pub fn start(options: KubeOptions) -> Result<KubeSource, KubeError> {
        // Two workers: a watcher's stream (fetching and parsing its list pages) runs beside
        // the task reducing what it read (see `watch`).
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kube-watch")
            .enable_all()
            .build()
            .map_err(KubeError::Runtime)?;
        let mut source = KubeSource::start_on(options, runtime.handle())?;
        source._runtime = Some(runtime);
        Ok(source)
    }

    /// [`KubeSource::start`] with the watch tasks (and the Event publisher) on `runtime`, the
    /// caller's (the node agent's one runtime). Call it outside that runtime's tasks: it waits
    /// for the client configuration.
    pub fn start_on(
        options: KubeOptions,
        runtime: &tokio::runtime::Handle,
    ) -> Result<KubeSource, KubeError> {
        let accepted = Arc::new(WatchAccepted::default());
        let (client, _) = runtime.block_on(client(
            options.kubeconfig.as_deref(),
            ClientTimeouts::watching(),
            Some(accepted.clone()),
        ))?;
        let shared = Arc::new(Shared {
            cluster: Mutex::new(ClusterSet::new(options.load.clone())),
            policies: Mutex::new(BTreeMap::new()),
            status: Mutex::new(WatchStatus::default()),
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            accepted,
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
            .map(|node| EventPublisher::start(runtime, client.clone(), node));
        for kind in watched(options.load.network_policy_enabled) {
            let (client, shared) = (client.clone(), shared.clone());
            if kind.optional {
                runtime.spawn(discover_then_watch(
                    client,
                    shared,
                    kind,
                    options.discovery_interval,
                    options.crd_grace,
                ));
            } else {
                runtime.spawn(watch(
                    client,
                    shared,
                    kind,
                    kind.versions[0],
                    options.crd_grace,
                ));
            }
        }
        Ok(KubeSource {
            shared,
            events,
            _runtime: None,
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
const POLICY_KINDS: [&str; 6] = [
    "NetworkPolicy",
    "DanmNetworkPolicy",
    "MultiNetworkPolicy",
    "AdminNetworkPolicy",
    "BaselineAdminNetworkPolicy",
    "ClusterNetworkPolicy",
];

/// Asks discovery, every `interval`, for the first served version of an optional kind; then
/// watches it, until it is no longer served (its CRD deleted: see [`watch`]), and asks again.
/// Says once that the kind is absent.
async fn discover_then_watch(
    client: Client,
    shared: Arc<Shared>,
    kind: &'static WatchedKind,
    interval: Duration,
    grace: Duration,
) {
    let mut warned = false;
    loop {
        match served_version(&client, kind).await {
            Ok(Some(version)) => {
                if warned {
                    info!("{} is now served ({version}): watching it", kind.kind);
                }
                shared.status(|s| s.set_state(kind.kind, KindState::Watching { version }));
                watch(client.clone(), shared.clone(), kind, version, grace).await;
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
                // Discovery answered: a failed discovery before says nothing any more.
                shared.status(|s| {
                    s.set_state(kind.kind, KindState::Absent);
                    s.progressed(kind.kind);
                });
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

/// What discovery says of an optional kind watched at `version`: `Some(true)` no longer
/// served there (its CRD deleted, that version removed — or an API server answering 404 for
/// a while as it restarts), `Some(false)` still served, `None` discovery failed (that says
/// nothing: the watcher keeps retrying).
async fn unserved_now(client: &Client, kind: &WatchedKind, version: &str) -> Option<bool> {
    match served_version(client, kind).await {
        Ok(v) => Some(v != Some(version)),
        Err(_) => None,
    }
}

/// The request path of a cluster-wide list or watch of `resource` (what kube requests).
fn collection_path(resource: &ApiResource) -> String {
    if resource.group.is_empty() {
        format!("/api/{}/{}", resource.version, resource.plural)
    } else {
        format!(
            "/apis/{}/{}/{}",
            resource.group, resource.version, resource.plural
        )
    }
}

/// How often discovery is asked again while a watched kind is not served: four times over
/// the grace period, at least, so that dropping it rests on several answers.
fn recheck_interval(grace: Duration) -> Duration {
    (grace / 4).clamp(Duration::from_millis(50), Duration::from_secs(15))
}

/// Now, as RFC 3339 (UTC, whole seconds), for the readiness reason.
fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map_or_else(|_| jiff::Timestamp::now().to_string(), |t| t.to_string())
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

/// What the stream's task hands the reducer, in order. Unboxed: the items were this size
/// before (the watcher's own), and one allocation per object of a 100,000-pod list is not.
#[allow(clippy::large_enum_variant)]
enum Item {
    /// What the watcher yielded, and when.
    Stream(Result<Event<RawObject>, watcher::Error>, Instant),
    /// The API server accepted a watch request of this kind (HTTP 200): it answers again,
    /// although a quiet kind has no event to show for it.
    Accepted,
}

/// Watches one kind cluster-wide: forever (the watcher retries with backoff), or, for an
/// optional kind, until it has not been served for `grace`.
///
/// An optional kind that discovery says is not served any more is not dropped at once: a
/// restarting API server answers 404 for CRDs for a while. Its objects stay as they were
/// (still enforced; readiness says why) while discovery is asked again every
/// [`recheck_interval`]; only when it still is not served after `grace` are its objects
/// dropped — the API server deletes a CRD's objects with it — and the watch ends (the kind
/// is absent, not failing); [`discover_then_watch`] looks for it again.
async fn watch(
    client: Client,
    shared: Arc<Shared>,
    kind: &'static WatchedKind,
    version: &'static str,
    grace: Duration,
) {
    let resource = api_resource(kind, version);
    let accepted: Arc<Notify> = shared.accepted.register(&collection_path(&resource));
    let api: Api<RawObject> = Api::all_with(client.clone(), &resource);
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    // The stream is polled by a task of its own, which hands each item over as it comes: kube
    // fetches the next list page only once every item of the last one was taken, so reducing
    // them here, on the same task, left the list waiting for the reducer and the reducer
    // waiting for the next page (at 100,000 pods the watch thread was a fifth idle during the
    // initial list, with a second core free). In order, through one channel: what this task
    // does is what it would have done polling the stream itself. A watch request accepted
    // is noticed while the stream is polled, after every item it yielded before was sent, so
    // `Item::Accepted` never overtakes the error it clears.
    let (items, mut taken) = tokio::sync::mpsc::channel(WATCH_PIPELINE);
    let forwarder = tokio::spawn(async move {
        futures::pin_mut!(stream);
        loop {
            let item = tokio::select! {
                biased;
                item = stream.next() => match item {
                    Some(item) => Item::Stream(item, Instant::now()),
                    None => return,
                },
                () = accepted.notified() => Item::Accepted,
            };
            if items.send(item).await.is_err() {
                return;
            }
        }
    });
    // Returning (the kind no longer served) stops the stream with it.
    let _forwarder = AbortOnDrop(forwarder);
    // Objects seen by the list in progress, to drop those deleted while the watch was down.
    let mut listed: Option<BTreeSet<ClusterKey>> = None;
    // Duplicates and strays of the list in progress, reported when it is done.
    let mut screen = crate::list::ListScreen::default();
    let mut list_problems: Vec<Problem> = Vec::new();
    // Since when discovery has said the kind is not served (an optional kind only).
    let mut unserved: Option<Instant> = None;
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
    loop {
        // While the kind is not served, discovery is asked again even when the watcher, in
        // its backoff, yields nothing (`None` here: time to ask).
        let next = match unserved {
            Some(_) => match tokio::time::timeout(recheck_interval(grace), taken.recv()).await {
                Ok(Some(item)) => Some(item),
                Ok(None) => return,
                Err(_) => None,
            },
            None => match taken.recv().await {
                Some(item) => Some(item),
                None => return,
            },
        };
        let (event, received) = match next {
            Some(Item::Accepted) => {
                // The server answers this kind again: it is served, and the watch is up.
                unserved = None;
                shared.status(|s| s.progressed(kind.kind));
                continue;
            }
            None | Some(Item::Stream(Err(_), _)) => {
                let error = match next {
                    Some(Item::Stream(Err(e), _)) => Some(e),
                    _ => None,
                };
                if kind.optional {
                    match unserved_now(&client, kind, version).await {
                        Some(true) => {
                            let since = *unserved.get_or_insert_with(|| {
                                let n = lock(&shared.cluster).counts().get(kind.kind).copied();
                                warn!(
                                    "{} is not served at {version} (its CRD deleted, or an API \
                                     server answering 404 while it restarts): its last {} \
                                     objects stay enforced until it is served again, or for \
                                     {:?} at most",
                                    kind.kind,
                                    n.unwrap_or(0),
                                    grace
                                );
                                let api_version = kind.api_version(version);
                                let at = now_rfc3339();
                                shared.status(|s| s.unserved(kind.kind, api_version, at));
                                Instant::now()
                            });
                            if since.elapsed() >= grace {
                                info!(
                                    "{} has not been served at {version} for {:?} (CRD \
                                     deleted): its objects are gone; watching for it to return",
                                    kind.kind, grace
                                );
                                let gone = {
                                    let mut cluster = lock(&shared.cluster);
                                    cluster.clear_list_problems(kind.kind);
                                    cluster.retain_kind(kind.kind, &BTreeSet::new())
                                };
                                lock(&shared.policies).retain(|k, _| k.kind != kind.kind);
                                shared.status(|s| s.gone(kind.kind));
                                if !gone.is_empty() {
                                    shared.changed(Instant::now());
                                }
                                return;
                            }
                        }
                        Some(false) if unserved.is_some() => {
                            unserved = None;
                            info!("{} is served at {version} again", kind.kind);
                            shared.status(|s| s.served_again(kind.kind));
                        }
                        Some(false) | None => {}
                    }
                }
                if let Some(e) = error {
                    warn!("watch of {}: {e} (retrying)", kind.kind);
                    shared.status(|s| s.failed(kind.kind, e.to_string()));
                }
                continue;
            }
            Some(Item::Stream(Ok(event), received)) => (event, received),
        };
        // Anything the watcher yields but an error: the kind is served.
        unserved = None;
        match event {
            Event::Init => {
                listed = Some(BTreeSet::new());
                screen = crate::list::ListScreen::default();
                list_problems.clear();
                shared.status(|s| s.list_started(kind.kind));
            }
            Event::InitApply(object) => {
                if let Err(problem) = screen.screen(&object, &resource) {
                    warn!("list of {}: {problem}", kind.kind);
                    list_problems.push(*problem);
                    continue;
                }
                let key = upsert(object, received);
                if let Some(listed) = listed.as_mut() {
                    listed.insert(key);
                }
            }
            Event::InitDone => {
                {
                    // The problems of this list replace those of the last one.
                    let mut cluster = lock(&shared.cluster);
                    let mut changed = cluster.clear_list_problems(kind.kind);
                    for problem in list_problems.drain(..) {
                        changed |= cluster.report_list_problem(kind.kind, problem);
                    }
                    drop(cluster);
                    if changed {
                        shared.changed(received);
                    }
                }
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
            accepted: Arc::default(),
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
