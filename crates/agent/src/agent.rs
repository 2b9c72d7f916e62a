//! `netwarden run -f DIR` (the standalone agent), `netwarden run --kube` (the node agent) and
//! `netwarden apply` (one pass).
//!
//! Both agents are one loop over an [`ObjectSource`] (files or a cluster's watchers, see
//! [`crate::source`]). With a cluster, only the pods scheduled on `--node-name` are programmed
//! and every pod is a peer; nothing is applied before every kind was listed once, and while
//! the API is unreachable the last enforced state stays (not ready) until the watchers catch up.
//!
//! The agent loads the manifests, feeds the engine (which ignores objects that did not change),
//! and syncs only the pods the engine names dirty. The files are watched through a
//! [`ManifestSet`]: only changed files are read again, and a file caught mid-edit (truncated,
//! empty, unparsable, or with an object that no longer reads) keeps its last good objects until
//! it parses again — only a clean removal removes a policy. Rules stay in place when the agent
//! stops; a restarted agent re-applies each isolated pod once (an atomic replacement per netns,
//! so no window opens) and removes rules from pods no longer isolated.
//!
//! What the kernel says wins over what the manifests say about a pod's interfaces (SPEC 2):
//! every tick the agent reads each pod netns's interfaces again, so an interface that appears,
//! is renamed or changes address is covered at once, and a netns deleted and created again at
//! the same path (a pod sandbox restart) is programmed again at once.
//!
//! Fail closed: a pod whose sync fails (e.g. its netns does not exist yet) is retried, backing
//! off; a pod whose interfaces cannot be read keeps the rules it has, and is reported.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use netwarden_dataplane::tamper::VerifyScope;
use netwarden_dataplane::{Backend, InterfaceWatch};
use netwarden_engine::{AddressChanges, Engine, EngineOptions, Pod, PodKey};
use netwarden_manifest::feed::{apply_delta_with, PodChange};
use netwarden_manifest::{InventoryDelta, LoadOptions};
use netwarden_monitor::{
    serve_metrics_in, Collector, EventProcessor, EventSink, JsonLinesSink, ListenerConfig, Metrics,
    PodContext, Timestamp,
};
use netwarden_render::RenderOptions;
use tracing::{debug, info, warn};

use crate::placement::{count_states, place, KernelViews, LocalState, NetnsAnswer};
use crate::policy_events::wanted_events;
use crate::source::{
    CriNetns, DeclaredNetns, Locality, NetnsSource, ObjectSource, Poll, SourceConfig,
};
use crate::status_tracker::{coverage, Counters, StatusTracker};
use crate::sync::{for_backend, Reconciler};

#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Manifest files, or a cluster.
    pub source: SourceConfig,
    pub load: LoadOptions,
    pub engine: EngineOptions,
    pub render: RenderOptions,
    pub backend: Backend,
    pub interval: Duration,
    /// Node name written in every event.
    pub node: String,
    /// Write events as JSON lines to stdout.
    pub events_stdout: bool,
    /// Append events as JSON lines to this file.
    pub events_file: Option<PathBuf>,
    /// Serve Prometheus metrics on this address (`/metrics`).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// How often a `status` record per monitored policy is written to the events (and once
    /// at shutdown).
    pub status_interval: Duration,
    /// How long after SIGTERM/SIGINT the process may run at most (see [`crate::shutdown`]):
    /// below the pod's termination grace period.
    pub shutdown_timeout: Duration,
    /// How often every programmed netns's rules are compared with what was applied, beside
    /// the comparisons the kernel's notifications trigger ([`crate::tamper_guard`]).
    pub verify_interval: Duration,
    /// What happens to live connections an apply denies (`--established`, SPEC 5).
    pub established: crate::sync::Established,
}

/// The default of [`AgentConfig::verify_interval`].
pub const VERIFY_INTERVAL: Duration = Duration::from_secs(10);

/// Log records queued between the NFLOG listeners and the event consumer. The queue is
/// allocated whole (about 180 bytes a record), and the consumer turns ~780,000 records a
/// second into events: 8,192 absorbs a burst of 10 ms at that rate in 1.4 MiB (65,536 took
/// 11.5 MiB of every agent's memory). Beyond it records are dropped and counted.
const NFLOG_QUEUE: usize = 8_192;

/// The monitor side of the agent: one NFLOG listener per managed pod netns that has log rules,
/// a consumer thread turning records into events, and the metrics.
struct Monitor {
    collector: Collector,
    node: String,
    /// Address → pod, refreshed after each sync, for the events' `peer`.
    addresses: Arc<RwLock<HashMap<IpAddr, PodKey>>>,
    metrics: Arc<Metrics>,
    /// Where events go; status records go there too (one stream).
    sink: Arc<dyn EventSink>,
    status: StatusTracker,
    status_interval: Duration,
    status_written: Option<Instant>,
}

impl Monitor {
    fn start(config: &AgentConfig, runtime: &tokio::runtime::Handle) -> Result<Monitor> {
        let metrics = Arc::new(Metrics::new());
        let listener = ListenerConfig {
            group: config.render.nflog_group,
            ..ListenerConfig::default()
        };
        let (collector, records) = Collector::new(listener, NFLOG_QUEUE, metrics.clone());
        let sink: Arc<dyn EventSink> = Arc::new(JsonLinesSink::new(
            config.events_stdout,
            config.events_file.as_deref(),
        )?);
        let addresses: Arc<RwLock<HashMap<IpAddr, PodKey>>> = Arc::default();
        let processor = EventProcessor::new(metrics.clone(), sink.clone());
        let lookup = addresses.clone();
        std::thread::Builder::new()
            .name("events".into())
            .spawn(move || {
                let resolve = |ip: IpAddr| {
                    lookup
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&ip)
                        .cloned()
                };
                processor.run(&records, &resolve);
            })?;
        if let Some(addr) = config.metrics_addr {
            serve_metrics_in(addr, metrics.clone(), runtime)?;
            info!("metrics on http://{addr}/metrics");
        }
        Ok(Monitor {
            collector,
            node: config.node.clone(),
            addresses,
            metrics,
            sink,
            status: StatusTracker::new(),
            status_interval: config.status_interval,
            status_written: None,
        })
    }

    /// A tamper repair: a record in the events stream and the counter.
    /// Every repair is counted; the record is written when the repair is said (at most once
    /// per pod per `SAY_EVERY`, with the count of those between).
    fn report_tamper(&self, repair: &crate::tamper_guard::Repair, backend: Backend) {
        let pod = repair.pod.to_string();
        self.metrics.add_tampered(&pod);
        if !repair.say {
            return;
        }
        let record = netwarden_monitor::TamperRecord {
            time: Timestamp::now(),
            node: self.node.clone(),
            record: netwarden_monitor::RecordType::Tamper,
            action: "tampered".to_string(),
            pod,
            backend: backend.as_str().to_string(),
            differences: repair.differences.iter().map(ToString::to_string).collect(),
            repaired: repair.result.is_ok(),
            error: repair.result.clone().err(),
            repeats: repair.repeats,
        };
        if let Err(e) = self.sink.emit_tamper(&record) {
            warn!("cannot write the tamper record of {}: {e}", record.pod);
        }
    }

    /// Follows the monitored policies and the local pods they cover (see `status_tracker`).
    fn track(&mut self, engine: &Engine, syncer: &dyn Reconciler) {
        let programmed: BTreeSet<String> = syncer
            .programmed()
            .keys()
            .map(ToString::to_string)
            .collect();
        let rules = syncer
            .programmed()
            .keys()
            .filter_map(|key| syncer.current().get(key));
        let cover = coverage(rules);
        let dropped = self.metrics.nflog_dropped_pods();
        let metrics = &self.metrics;
        let counters = Counters {
            would_deny: &|p: &str| metrics.would_deny_count(p),
            dropped: &dropped,
            kernel: &|pods: &[PodKey]| kernel_counters(syncer, pods),
        };
        self.status.observe(
            engine.policies(),
            engine.admin_policies().map(Arc::as_ref),
            &cover,
            &counters,
            Timestamp::now(),
        );
        self.metrics
            .retain_dropped_pods(&|pod| programmed.contains(pod));
    }

    /// Writes one status record per monitored policy, when `--status-interval` has passed
    /// since the last ones, or always (`force`, at shutdown).
    fn write_status(&mut self, syncer: &dyn Reconciler, force: bool) {
        let due = self
            .status_written
            .is_none_or(|at| at.elapsed() >= self.status_interval);
        if !(due || force) {
            return;
        }
        self.status_written = Some(Instant::now());
        let dropped = self.metrics.nflog_dropped_pods();
        let metrics = &self.metrics;
        let counters = Counters {
            would_deny: &|p: &str| metrics.would_deny_count(p),
            dropped: &dropped,
            kernel: &|pods: &[PodKey]| kernel_counters(syncer, pods),
        };
        for record in self.status.records(&self.node, &counters, Timestamp::now()) {
            if let Err(e) = self.sink.emit_status(&record) {
                warn!("cannot write the status of {}: {e}", record.policy);
            }
        }
    }

    /// Listeners follow the programmed pods: opened (or given the new rules) for pods whose
    /// rules log, closed for the others; so do the addresses events name their peers by.
    /// (The status episodes follow them too, in [`Monitor::track`], once readiness is said.)
    fn follow(&mut self, engine: &mut Engine, syncer: &dyn Reconciler) {
        let mut wanted: BTreeMap<PathBuf, &PodKey> = BTreeMap::new();
        for (key, netns) in syncer.programmed() {
            let Some(rules) = syncer.current().get(key) else {
                continue;
            };
            if rules.logs() {
                wanted.insert(netns.clone(), key);
                if let Err(e) = self
                    .collector
                    .open(netns, PodContext::new(self.node.clone(), rules))
                {
                    warn!("{key}: cannot listen for log messages: {e}");
                }
            }
        }
        for path in self.collector.netns_paths() {
            if !wanted.contains_key(&path) {
                self.collector.close(&path);
            }
        }
        for (path, exit) in self.collector.reap() {
            info!("log listener of {} ended: {exit:?}", path.display());
        }
        match engine.take_address_changes() {
            AddressChanges::All => {
                // Built before the lock is taken: the events thread keeps resolving meanwhile.
                let map = engine.pods_by_address();
                *self.addresses.write().unwrap_or_else(|p| p.into_inner()) = map;
            }
            AddressChanges::Listed(ips) if !ips.is_empty() => {
                let mut map = self.addresses.write().unwrap_or_else(|p| p.into_inner());
                for ip in ips {
                    match engine.pod_at(ip) {
                        Some(key) => map.insert(ip, key.clone()),
                        None => map.remove(&ip),
                    };
                }
            }
            AddressChanges::Listed(_) => {}
        }
        self.metrics.set_managed_pods(syncer.programmed().len());
    }

    /// The watchers' counters and the objects held, for `/metrics`.
    fn record_watch(&self, kube: &netwarden_kube::KubeSource) {
        let status = kube.status();
        for (kind, k) in &status.kinds {
            self.metrics.set_watch_counters(kind, k.restarts, k.errors);
        }
        self.metrics.set_objects(kube.counts());
        if let Some(events) = kube.events() {
            self.metrics.set_kube_events(events.counters().snapshot());
        }
    }
}

/// The evidence counters in each pod's netns (read side by side), `None` (and a warning) when
/// they cannot be read: the status records then carry `null` (see `status_tracker`).
fn kernel_counters(
    syncer: &dyn Reconciler,
    pods: &[PodKey],
) -> Vec<Option<netwarden_dataplane::EvidenceCounters>> {
    let read = syncer.read_counters_many(pods);
    pods.iter()
        .zip(read)
        .map(|(pod, read)| match read? {
            Ok(counters) => Some(counters),
            Err(e) => {
                warn!("{pod}: cannot read the evidence counters: {e}");
                None
            }
        })
        .collect()
}

/// Feeds `engine` what `delta` says, except local pods: those are kept in `local` as the
/// objects describe them (the caller joins them with their netns and the kernel's view, then
/// sets them). Remote pods are peers only: set without a netns, whatever they are annotated
/// with. Removals come first. Returns whether `local` changed.
pub fn apply_delta(
    engine: &mut Engine,
    delta: InventoryDelta,
    locality: &Locality,
    local: &mut BTreeMap<PodKey, Arc<Pod>>,
) -> bool {
    let mut local_changed = false;
    apply_delta_with(engine, delta, |engine, change| match change {
        PodChange::Removed(key) => {
            local_changed |= local.remove(key).is_some();
            engine.remove_pod(key);
        }
        PodChange::Set(pod) if locality.is_local(&pod) => {
            local.insert(pod.key.clone(), pod);
            local_changed = true;
        }
        PodChange::Set(mut pod) => {
            // No longer local (deleted and created on another node under the same name): its
            // rules here are removed by the sync (it was programmed).
            local_changed |= local.remove(&pod.key).is_some();
            if pod.netns.is_some() {
                // Copied only then: a remote pod is otherwise shared with the watchers' view.
                Arc::make_mut(&mut pod).netns = None;
            }
            engine.set_pod(pod);
        }
    });
    local_changed
}

/// Of the pods the engine names dirty, those this agent syncs: its local pods, and the pods it
/// programmed that are gone or no longer local (their rules are removed). A remote pod is a
/// peer only: its own rules are its node's job, and its changes cost no kernel work here
/// unless a local pod's rules change.
pub fn to_sync(
    dirty: BTreeSet<PodKey>,
    engine: &Engine,
    locality: &Locality,
    programmed: &BTreeMap<PodKey, PathBuf>,
) -> BTreeSet<PodKey> {
    dirty
        .into_iter()
        .filter(|key| {
            engine.pod(key).is_some_and(|p| locality.is_local(p)) || programmed.contains_key(key)
        })
        .collect()
}

/// How often the objects listed so far are fed to the engine while the first list of every
/// kind is still running (nothing is applied before it completes).
const FEED_WHILE_LISTING: Duration = Duration::from_millis(250);

/// The shortest time between two judgements of the policies for Kubernetes Events.
const EVENTS_EVERY: Duration = Duration::from_secs(1);

/// The shortest time between two trims of the allocator (see [`crate::memory`]).
const TRIM_EVERY: Duration = Duration::from_secs(10);

/// The longest wait before retrying a pod whose sync failed.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);

/// Runs the agent (`once`: a single pass, exit status says whether every pod was applied).
/// See [`Agent`].
pub fn run(config: AgentConfig, once: bool) -> Result<ExitCode> {
    Agent::start(config, once)?.run()
}

/// The local pods: as the objects describe them, and where each stands after the last
/// placement.
#[derive(Debug, Default)]
struct LocalPods {
    /// As the objects describe them (netns and interfaces are joined at each placement: see
    /// [`Agent::place`]).
    objects: BTreeMap<PodKey, Arc<Pod>>,
    /// Refused by the last placement: never synced while refused.
    refused: BTreeSet<PodKey>,
    /// Where every local pod stands (programmed, refused, waiting, locked down...).
    states: BTreeMap<PodKey, LocalState>,
}

/// Pods whose last sync failed (or whose netns is not known yet): when to retry each, backing
/// off from `--interval` to [`MAX_RETRY_DELAY`]. Nothing else marks them dirty again: their
/// netns may not exist yet, or the failure may pass.
#[derive(Debug, Default)]
pub struct RetryQueue {
    due: BTreeMap<PodKey, (Instant, Duration)>,
}

impl RetryQueue {
    /// The pods whose retry is due at `now`.
    pub fn due(&self, now: Instant) -> impl Iterator<Item = &PodKey> {
        self.due
            .iter()
            .filter(move |(_, (at, _))| *at <= now)
            .map(|(key, _)| key)
    }

    /// Forgets pods that are not to be synced at all (refused).
    pub fn forget(&mut self, keys: &BTreeSet<PodKey>) {
        self.due.retain(|key, _| !keys.contains(key));
    }

    /// After a sync of `synced`: the pods of it that did not succeed (`again`) are retried,
    /// each after twice its last delay (the first after `first`); the others are forgotten.
    pub fn after_sync<'a>(
        &mut self,
        synced: &BTreeSet<PodKey>,
        again: impl IntoIterator<Item = &'a PodKey>,
        first: Duration,
        now: Instant,
    ) {
        let again: BTreeSet<&PodKey> = again.into_iter().collect();
        self.due
            .retain(|key, _| !synced.contains(key) || again.contains(key));
        for key in again {
            let delay = self
                .due
                .get(key)
                .map_or(first, |(_, d)| (*d * 2).min(MAX_RETRY_DELAY));
            self.due.insert(key.clone(), (now + delay, delay));
        }
    }

    pub fn len(&self) -> usize {
        self.due.len()
    }

    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }
}

/// Lines said when they appear, not at every pass, and again if they go away and come back.
/// Only current lines are kept (bounded memory).
#[derive(Debug, Default)]
struct Shown(BTreeSet<String>);

impl Shown {
    /// Logs the lines of `now` not shown yet, then remembers `now` only.
    fn warn_new(&mut self, now: BTreeSet<String>) {
        for line in now.difference(&self.0) {
            warn!("{line}");
        }
        self.0 = now;
    }
}

/// When policies are judged for Kubernetes Events: after objects changed, at most once per
/// [`EVENTS_EVERY`] (judging every policy takes milliseconds per thousand policies, and an
/// Event a second later is as good; a burst of changes is judged once).
#[derive(Debug, Default)]
struct EventSchedule {
    /// Objects changed since policies were last judged.
    due: bool,
    judged: Option<Instant>,
}

impl EventSchedule {
    /// Whether to judge now (`fresh`: objects changed in this pass); if so, the judgement is
    /// counted as made.
    fn take(&mut self, fresh: bool) -> bool {
        self.due |= fresh;
        if self.due && self.judged.is_none_or(|at| at.elapsed() >= EVENTS_EVERY) {
            self.due = false;
            self.judged = Some(Instant::now());
            true
        } else {
            false
        }
    }
}

/// What a pass asks of the loop next.
enum Next {
    /// Poll the source again, waiting at most this long.
    Wait(Duration),
    /// The single pass of `apply` ended.
    Exit(ExitCode),
}

/// The node agent: its parts and its named state, and one method per step of a pass.
///
/// One loop for every source: wait for the source (files: `--interval`; a cluster: until a
/// watch event changes something, at most `--interval`, so retries and the kernel's interface
/// rediscovery still happen), then one pass: [`Agent::feed`] the engine what changed,
/// [`Agent::place`] the local pods (netns, kernel interfaces), [`Agent::dirty`] names what to
/// sync, [`Agent::sync`] applies it, [`Agent::observe`] says readiness and writes the monitored
/// policies' status, [`Agent::report_events`] offers Kubernetes Events. With a cluster nothing
/// is applied before every kind was listed once, and an API outage changes nothing: the last
/// view (and so the last enforced state) stays until the watchers catch up.
pub struct Agent {
    config: AgentConfig,
    /// `apply`: one pass, no monitor, no kernel notifications.
    once: bool,
    engine: Engine,
    syncer: Box<dyn Reconciler>,
    /// Events, metrics and status records (not with `once`).
    monitor: Option<Monitor>,
    source: ObjectSource,
    locality: Locality,
    netns_source: Box<dyn NetnsSource>,
    /// Set by SIGTERM/SIGINT ([`crate::shutdown`]).
    stop: Arc<AtomicBool>,
    /// Whether the engine was fed once (the first take of the source is everything).
    fed_once: bool,
    local: LocalPods,
    /// The local pods' netns as the kernel last showed them (followed through its
    /// notifications), and when all were last read.
    kernel: KernelViews,
    kernel_read: Option<Instant>,
    /// Problems of the objects, and refusals of local pods, as last logged.
    problems_shown: Shown,
    refusals_shown: Shown,
    retry: RetryQueue,
    trimmer: crate::memory::Trimmer,
    events: EventSchedule,
    /// The problems of the objects as last taken.
    problems_now: Vec<netwarden_manifest::Problem>,
    /// The oldest change received and not applied yet (cluster only).
    oldest: Option<Instant>,
    /// Why the agent is not ready, as last logged.
    not_ready_said: Option<String>,
    /// Tamper repair (not with `once`).
    tamper: Option<crate::tamper_guard::TamperGuard>,
    /// The one async runtime: the watchers, the Event publisher, the CRI client and the
    /// metrics server are its tasks; the loop runs on its blocking pool ([`Agent::run`]).
    /// Last: dropped after everything that has tasks on it.
    runtime: tokio::runtime::Runtime,
}

impl Agent {
    /// Starts the parts: the source (watchers or files), the backend, the monitor, the
    /// kernel's notifications and the signal handler.
    pub fn start(config: AgentConfig, once: bool) -> Result<Agent> {
        // Two workers: a watcher's stream (fetching and parsing its list pages) runs beside
        // the task reducing what it read (see netwarden_kube's `watch`); the metrics server
        // and the CRI client are light. The kernel work (applies in pod netns, NFLOG
        // listeners) has threads of its own: entering a netns must not move a runtime worker.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("netwarden-rt")
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let engine = Engine::new(config.engine.clone());
        let mut syncer = for_backend(config.backend, config.render);
        syncer.set_established(config.established);
        // A long-running agent coalesces revocation passes; `--once` revokes before it exits.
        if !once {
            syncer.set_revocation_delay(crate::revocations::REVOCATION_DELAY);
        }
        let monitor = if once {
            None
        } else {
            Some(Monitor::start(&config, &handle)?)
        };
        syncer.set_converge_removals(true);
        let source = ObjectSource::start(&config.source, &config.load, &handle)?;
        let locality = Locality::of(&config.source);
        let netns_source = netns_source(&config.source, &handle)?;
        let stop = if once {
            Arc::new(AtomicBool::new(false))
        } else {
            crate::shutdown::install(config.shutdown_timeout, source.waker())?
        };
        // A long sync (many netns, large rulesets) stops between two netns applies.
        syncer.set_stop(stop.clone());
        let kernel = if once {
            KernelViews::default()
        } else {
            KernelViews::watched(InterfaceWatch::start(source.waker())?)
        };
        let tamper = if once {
            None
        } else {
            let wake = source.waker();
            Some(crate::tamper_guard::TamperGuard::start(
                config.backend,
                config.verify_interval,
                wake,
            )?)
        };
        Ok(Agent {
            config,
            once,
            engine,
            syncer,
            monitor,
            source,
            locality,
            netns_source,
            stop,
            fed_once: false,
            local: LocalPods::default(),
            kernel,
            kernel_read: None,
            problems_shown: Shown::default(),
            refusals_shown: Shown::default(),
            retry: RetryQueue::default(),
            trimmer: crate::memory::Trimmer::new(TRIM_EVERY),
            events: EventSchedule::default(),
            problems_now: Vec::new(),
            oldest: None,
            not_ready_said: None,
            tamper,
            runtime,
        })
    }

    /// The loop, on the runtime's blocking pool (it waits on the source and blocks on the
    /// CRI's answers: never on a worker): poll the source, one pass, until stopped (or, with
    /// `once`, after one pass).
    pub fn run(self) -> Result<ExitCode> {
        let handle = self.runtime.handle().clone();
        let (result, agent) = handle.block_on(async move {
            tokio::task::spawn_blocking(move || {
                let mut agent = self;
                let result = agent.run_loop();
                (result, agent)
            })
            .await
            .expect("the agent loop does not panic")
        });
        // The runtime goes last, outside of itself (dropping it inside a task panics).
        drop(agent);
        result
    }

    fn run_loop(&mut self) -> Result<ExitCode> {
        let mut wait = Duration::ZERO;
        loop {
            if self.stop.load(Ordering::Relaxed) {
                // The revocations owed are not left behind.
                self.revoke_due(true);
                info!("stopping; the rules in place stay");
                if let Some(monitor) = self.monitor.as_mut() {
                    monitor.write_status(self.syncer.as_ref(), true);
                }
                return Ok(ExitCode::SUCCESS);
            }
            let poll = self.source.poll(wait);
            match self.pass(poll) {
                Next::Wait(next) => wait = next,
                Next::Exit(code) => return Ok(code),
            }
        }
    }

    /// One pass after a poll of the source.
    fn pass(&mut self, poll: Poll) -> Next {
        if let Some(at) = poll.oldest {
            self.oldest = Some(self.oldest.map_or(at, |o| o.min(at)));
        }
        let reason = self.readiness();
        if let Some(monitor) = self.monitor.as_ref() {
            monitor.metrics.health().tick();
            if let Some(kube) = self.source.kube() {
                monitor.record_watch(kube);
            }
        }
        if !self.source.synced_once() {
            self.feed_partial(poll.changed);
            return Next::Wait(self.config.interval.min(FEED_WHILE_LISTING));
        }
        let fresh = poll.changed || !self.fed_once;
        let mut phases = Phases::start();
        let mut place_local = fresh && self.feed(&mut phases);
        // What the kernel said changed (an interface added, renamed, re-addressed) is read
        // at once: the rules in place reject an interface they do not know, so this is how
        // long a new interface waits to be allowed (SPEC 3.1).
        if self.kernel.read_changed() {
            place_local = true;
            phases.mark("notified");
        }
        // Every `--interval`, whatever the objects do (a busy cluster changes something every
        // few hundred milliseconds), the kernel's side is read again: it changes without the
        // objects, and a notification may have been lost.
        let kernel_due = self.fed_once
            && self
                .kernel_read
                .is_none_or(|at: Instant| at.elapsed() >= self.config.interval);
        if place_local || kernel_due {
            self.place(kernel_due, &mut phases);
        }
        let dirty = self.dirty();
        phases.mark("dirty");
        let mut followed = false;
        if !dirty.is_empty() || self.once {
            let clean = self.sync(dirty, &mut phases);
            followed = self.monitor.is_some();
            if self.once {
                let refused_now = self.local.refused.len();
                if refused_now > 0 {
                    warn!("{refused_now} pod(s) refused: not programmed");
                }
                return Next::Exit(if clean && refused_now == 0 {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                });
            }
        }
        if self.revoke_due(false) {
            phases.mark("revoke");
        }
        self.guard(&mut phases);
        self.observe(fresh, followed, &reason, &mut phases);
        self.report_events(fresh, &mut phases);
        if fresh {
            self.trimmer.worked();
        }
        // What the passes allocated and freed goes back to the kernel (see `memory`).
        if self.trimmer.maybe_trim() {
            phases.mark("trim");
        }
        if phases.any() {
            debug!("pass: {phases}");
        }
        // A repair held back for its pace, or a revocation pass waiting for its delay, is not
        // kept waiting for the whole interval.
        let next = [
            self.tamper.as_ref().and_then(|guard| guard.next_due()),
            self.syncer.next_revocation(),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|at| at.saturating_duration_since(Instant::now()));
        Next::Wait(next.map_or(self.config.interval, |h| h.min(self.config.interval)))
    }

    /// Why the agent is not ready (`None`: ready), logged when it changes. Before the first
    /// full list the reason changes with every kind listed: it is said once.
    fn readiness(&mut self) -> Option<String> {
        let reason = match self.source.synced_once() {
            true => self.source.not_ready_reason(),
            false => Some("waiting for the first full list of every kind".to_string()),
        };
        if reason != self.not_ready_said {
            match &reason {
                Some(why) => warn!("not ready: {why}"),
                None => info!("the cluster view is current"),
            }
            self.not_ready_said = reason.clone();
        }
        reason
    }

    /// Before the first full list: a partial view (some kinds not listed yet) is never
    /// applied. It is fed to the engine as it comes, though (every [`FEED_WHILE_LISTING`]): the
    /// pass after the last kind is listed then takes only the rest. At 100,000 pods, taking and
    /// feeding the whole view after the list held readiness back 1.5–1.8 s. Its problems are
    /// not shown: a partial view has false ones (a DanmEp whose pod is not listed yet); the
    /// first full view shows those that hold.
    fn feed_partial(&mut self, changed: bool) {
        if changed {
            let update = self.source.take_update();
            apply_delta(
                &mut self.engine,
                update.delta,
                &self.locality,
                &mut self.local.objects,
            );
        }
    }

    /// Feeds the engine what changed in the objects; logs new problems. Returns whether the
    /// local pods must be placed again (they changed, or this is the first feed).
    fn feed(&mut self, phases: &mut Phases) -> bool {
        let update = self.source.take_update();
        phases.mark("objects");
        let problems = update.problems.iter().map(ToString::to_string);
        self.problems_shown.warn_new(problems.collect());
        let place_local = apply_delta(
            &mut self.engine,
            update.delta,
            &self.locality,
            &mut self.local.objects,
        ) || !self.fed_once;
        phases.mark("engine");
        self.fed_once = true;
        self.problems_now = update.problems;
        place_local
    }

    /// Local pods: their netns (from the runtime or the objects) and what the kernel shows
    /// there, joined into the pods the engine gets ([`place`]). After an object change only
    /// namespaces not read yet are read (a new pod, a recreated sandbox); when `kernel_due`,
    /// all of them are read again: interfaces appear, are renamed, change address, and a
    /// sandbox recreated by the runtime shows as a new netns path (the pod is set again with
    /// it, so the engine names it dirty and it is applied at once).
    fn place(&mut self, kernel_due: bool, phases: &mut Phases) {
        let local_now: Vec<Pod> = self.local.objects.values().map(|p| Pod::clone(p)).collect();
        self.netns_source.refresh(&local_now);
        let answers: Vec<(Pod, NetnsAnswer)> = local_now
            .into_iter()
            .map(|pod| {
                let answer = self.netns_source.netns(&pod);
                (pod, answer)
            })
            .collect();
        if kernel_due {
            self.kernel.refresh(&answers);
            self.kernel_read = Some(Instant::now());
        } else {
            self.kernel.read_new(&answers);
        }
        let placement = place(answers, &self.kernel);
        phases.mark("netns");
        for pod in placement.pods.iter().cloned() {
            self.engine.set_pod(pod);
        }
        for (key, state) in &placement.states {
            let why = match state {
                LocalState::LockedDown(why) => Some(why.clone()),
                _ => None,
            };
            self.engine.set_lockdown(key, why);
        }
        phases.mark("local");
        let mut lines = state_lines(&placement.states);
        lines.extend(placement.notes.iter().cloned());
        self.refusals_shown.warn_new(lines);
        self.local.refused = placement.refused();
        self.local.states = placement.states;
    }

    /// The pods to sync now: those the engine names dirty that are this agent's
    /// ([`to_sync`]), those whose netns was recreated, and the retries that are due; never a
    /// refused pod (its rules stay as they are until the reason goes: then it is placed, and
    /// dirty).
    fn dirty(&mut self) -> BTreeSet<PodKey> {
        let dirty = self.engine.take_dirty();
        // Remote pods are peers only: their own rules are another node's job. A pod that was
        // programmed here and is now gone (or elsewhere) stays, so its rules are removed.
        let mut dirty = to_sync(
            dirty,
            &self.engine,
            &self.locality,
            self.syncer.programmed(),
        );
        // A netns deleted and created again at the same path holds none of our rules.
        let changed = self.syncer.netns_changed();
        for key in &changed {
            info!("{key}: its network namespace was recreated; programming it again");
        }
        dirty.extend(changed);
        dirty.extend(self.retry.due(Instant::now()).cloned());
        dirty.retain(|key| !self.local.refused.contains(key));
        self.retry.forget(&self.local.refused);
        dirty
    }

    /// Applies the rules of `dirty`; schedules retries of what failed; the monitor follows
    /// the programmed pods. Returns whether every pod was applied without error.
    fn sync(&mut self, dirty: BTreeSet<PodKey>, phases: &mut Phases) -> bool {
        let report = self.syncer.sync(&mut self.engine, dirty.clone());
        phases.mark("sync");
        self.syncer.set_converge_removals(false);
        // A failed pod, or a local pod whose netns is not known yet: retried, backing off,
        // until a sync of it succeeds.
        self.retry.after_sync(
            &dirty,
            report.failed.iter().chain(&report.without_netns),
            self.config.interval,
            Instant::now(),
        );
        info!("{report}");
        self.trimmer.worked();
        if let Some(monitor) = self.monitor.as_mut() {
            monitor
                .metrics
                .observe_sync(report.duration, report.errors.is_empty());
            for (pod, n) in &report.revoked {
                monitor.metrics.add_revoked(&pod.to_string(), *n as u64);
            }
            monitor.follow(&mut self.engine, self.syncer.as_ref());
            phases.mark("follow");
        }
        for error in report.errors.iter().chain(&report.revoke_errors) {
            warn!("{error}");
        }
        report.errors.is_empty()
    }

    /// Runs the revocation passes that are due (all owed when `all`); reports them. Whether
    /// any ran.
    fn revoke_due(&mut self, all: bool) -> bool {
        if self.syncer.next_revocation().is_none() {
            return false;
        }
        let report = self.syncer.revoke_due(Instant::now(), all);
        if let Some(monitor) = self.monitor.as_mut() {
            for (pod, n) in &report.revoked {
                monitor.metrics.add_revoked(&pod.to_string(), *n as u64);
            }
        }
        for error in &report.errors {
            warn!("{error}");
        }
        true
    }

    /// Tamper repair: compares the netns the kernel said changed (and, every
    /// `--verify-interval`, all of them) with what was applied, repairs what differs, and
    /// reports each repair ([`crate::tamper_guard`]).
    fn guard(&mut self, phases: &mut Phases) {
        let Some(guard) = self.tamper.as_mut() else {
            return;
        };
        let due = guard.due(self.syncer.programmed());
        if due.is_empty() {
            return;
        }
        let mut repairs = Vec::new();
        for (pod, netns, scope) in due {
            let Some(differences) =
                crate::tamper_guard::to_repair(self.syncer.verify(&netns, &scope))
            else {
                continue;
            };
            if differences.is_empty() {
                continue;
            }
            let result = self.syncer.repair(&netns).map_err(|e| e.to_string());
            if result.is_ok() {
                // Whether the repair holds paces the next one (never given up: see
                // `tamper_guard`).
                let left = self
                    .syncer
                    .verify(&netns, &VerifyScope::all())
                    .unwrap_or_default();
                if !left.is_empty() {
                    debug!(
                        "{pod}: its rules differ again right after a repair ({})",
                        netwarden_dataplane::tamper::summary(&left, 5)
                    );
                }
                guard.repaired(&pod, &netns, left.is_empty(), Instant::now());
                // While the rules were gone, the pod could open connections they deny:
                // established traffic is accepted before any rule, so they are ended too.
                match self.syncer.revoke_now(&pod) {
                    Some(Ok(0)) | None => {}
                    Some(Ok(n)) => {
                        info!("{pod}: revoked {n} live connection(s) its rules deny, opened while they were tampered with");
                        if let Some(monitor) = self.monitor.as_ref() {
                            monitor.metrics.add_revoked(&pod.to_string(), n as u64);
                        }
                    }
                    Some(Err(e)) => warn!("{e}"),
                }
            } else {
                guard.repaired(&pod, &netns, false, Instant::now());
                // Retried at the next sync of the pod (its netns is forgotten: a full apply).
                self.retry.after_sync(
                    &[pod.clone()].into(),
                    [&pod],
                    self.config.interval,
                    Instant::now(),
                );
            }
            let (say, repeats) = guard.say(&pod, Instant::now());
            repairs.push(crate::tamper_guard::Repair {
                pod,
                differences,
                result,
                say,
                repeats,
            });
        }
        phases.mark("tamper");
        let events = self.source.kube().and_then(|kube| kube.events());
        for repair in repairs {
            if repair.say {
                warn!("{}", crate::tamper_guard::line(&repair));
                // The Pod's Event, as rate-limited as the line.
                if let Some(events) = events {
                    let uid = self.engine.pod(&repair.pod).and_then(|pod| pod.uid.clone());
                    events.send(crate::tamper_guard::pod_event(
                        &repair,
                        uid,
                        SystemTime::now(),
                    ));
                }
            }
            if let Some(monitor) = self.monitor.as_ref() {
                monitor.report_tamper(&repair, self.syncer.backend());
            }
        }
    }

    /// After anything that may change them: every local pod by state (for operators to alert
    /// on: a pod selected by a policy but not programmed, refused, waiting), the
    /// event-to-apply latency, readiness, and the monitored policies' status. Readiness and
    /// the status come before the Events on policies ([`Agent::report_events`]), which take
    /// their time (a second for 20,000 policies): enforcement, done before, never waits.
    fn observe(
        &mut self,
        fresh: bool,
        followed: bool,
        reason: &Option<String>,
        phases: &mut Phases,
    ) {
        let Some(monitor) = self.monitor.as_mut() else {
            return;
        };
        if phases.any() {
            let counts = count_states(&self.local.states, self.syncer.programmed(), |key| {
                self.engine.pod_rules(key).is_some_and(|r| r.needs_rules())
            });
            monitor.metrics.set_local_pods(counts);
        }
        if let Some(at) = self.oldest.take().filter(|_| fresh) {
            monitor.metrics.observe_event_to_apply(at.elapsed());
        }
        // Ready: the view was complete once, is current now, and has been applied. The
        // status records below read every monitored pod's counters (a listing in each netns:
        // about a second for 100 pods) and do not hold readiness back.
        monitor.metrics.health().set_ready(match reason {
            None => Ok(()),
            Some(why) => Err(why.clone()),
        });
        // Only once the state was applied: before, the agent vouches for nothing.
        if self.fed_once {
            if fresh || followed {
                // After a sync (pods join and leave episodes, each joining pod's counters read
                // as its base: at the first sync, every monitored pod's), or policies changed
                // without a pod to sync (e.g. none local).
                monitor.track(&self.engine, self.syncer.as_ref());
            }
            monitor.write_status(self.syncer.as_ref(), false);
        }
        if phases.any() {
            // Only in a pass that did something (an idle wake-up logs nothing).
            phases.mark("status");
        }
    }

    /// Events on bad policies, once local pods are placed (a new local pod is selected before
    /// its policy is judged) and after the sync (enforcement does not wait for them): the
    /// whole current set is offered; the publisher queues only what is new and never waits
    /// (see `netwarden_kube::events`).
    fn report_events(&mut self, fresh: bool, phases: &mut Phases) {
        if !self.events.take(fresh) {
            return;
        }
        let Some(events) = self.source.kube().and_then(|kube| kube.events()) else {
            return;
        };
        let unplaced: Vec<&Pod> = self
            .local
            .refused
            .iter()
            .filter_map(|k| self.local.objects.get(k))
            .map(|p| &**p)
            .collect();
        let identity = |key: &netwarden_manifest::ClusterKey| {
            self.source.kube().and_then(|kube| kube.policy(key))
        };
        events.offer(&wanted_events(
            &self.problems_now,
            &self.engine,
            &unplaced,
            &identity,
        ));
        phases.mark("events");
    }
}

/// Where one pass of the agent loop spent its time, logged at debug level
/// (`RUST_LOG=netwarden_agent=debug`): which step a slow event-to-apply comes from.
struct Phases {
    since: Instant,
    spent: Vec<(&'static str, Duration)>,
}

impl Phases {
    fn start() -> Phases {
        Phases {
            since: Instant::now(),
            spent: Vec::new(),
        }
    }

    /// The time since the last mark was spent on `step`.
    fn mark(&mut self, step: &'static str) {
        let now = Instant::now();
        self.spent.push((step, now - self.since));
        self.since = now;
    }

    fn any(&self) -> bool {
        !self.spent.is_empty()
    }
}

impl std::fmt::Display for Phases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (step, spent)) in self.spent.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{step} {:.1} ms", spent.as_secs_f64() * 1e3)?;
        }
        Ok(())
    }
}

/// Where local pods' netns are found: with a cluster, the CRI runtime when one is configured
/// or found (see `node_paths::default_cri_endpoint`); otherwise (files, or no runtime) what
/// the objects declare.
fn netns_source(
    source: &SourceConfig,
    runtime: &tokio::runtime::Handle,
) -> Result<Box<dyn NetnsSource>> {
    Ok(match source {
        SourceConfig::Kube {
            cri_endpoint: Some(endpoint),
            ..
        } => {
            info!("local pods' network namespaces from the CRI runtime at {endpoint}");
            Box::new(CriNetns::new(endpoint, runtime.clone()))
        }
        SourceConfig::Kube {
            cri_endpoint: None, ..
        } => {
            warn!(
                "no CRI runtime socket found ({}); only the netwarden.io/netns annotation and \
                 DanmEps say where a pod's network namespace is",
                crate::node_paths::DEFAULT_CRI_ENDPOINTS.join(", ")
            );
            Box::new(DeclaredNetns)
        }
        SourceConfig::Files(_) => Box::new(DeclaredNetns),
    })
}

/// One line per local pod that is refused, locked down or in the host network against its
/// runtime (said when it appears, see [`warn_new`]).
fn state_lines(states: &BTreeMap<PodKey, LocalState>) -> BTreeSet<String> {
    states
        .iter()
        .filter_map(|(key, state)| match state {
            LocalState::Refused(why) => Some(format!(
                "{key}: refused, not programmed (the rules of its netns, if any, stay as they \
                 are): {why}"
            )),
            LocalState::LockedDown(why) => Some(format!("{key}: locked down: {why}")),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::testing::pod;

    #[test]
    fn only_local_and_previously_programmed_pods_are_synced() {
        let mut engine = Engine::new(EngineOptions::default());
        for (name, node) in [("a", "n1"), ("b", "n2"), ("c", "n1")] {
            let mut p = pod("ns", name, &[], &["10.0.0.1"]);
            p.node_name = Some(node.into());
            engine.set_pod(p);
        }
        let dirty = engine.take_dirty();
        let key = |n: &str| PodKey::new("ns", n);
        // `c` was programmed here and is gone now; `d` was programmed and is gone too.
        engine.remove_pod(&key("c"));
        let programmed = BTreeMap::from([(key("d"), PathBuf::from("/run/netns/d"))]);
        let node = Locality::Node("n1".into());
        let mut all = dirty.clone();
        all.insert(key("d"));
        assert_eq!(
            to_sync(all, &engine, &node, &programmed),
            BTreeSet::from([key("a"), key("d")])
        );
        assert_eq!(
            to_sync(dirty, &engine, &Locality::All, &programmed),
            BTreeSet::from([key("a"), key("b")])
        );
    }

    #[test]
    fn local_pods_wait_for_their_netns_and_remote_pods_are_peers() {
        let mut engine = Engine::new(EngineOptions::default());
        let on = |name: &str, node: &str| {
            let mut p = pod("ns", name, &[], &["10.0.0.1"]);
            p.node_name = Some(node.into());
            p.netns = Some(format!("/run/netns/{name}"));
            p
        };
        let node = Locality::Node("n1".into());
        let mut local = BTreeMap::new();
        let delta = InventoryDelta {
            pods: vec![on("a", "n1").into(), on("b", "n2").into()],
            ..InventoryDelta::default()
        };
        assert!(apply_delta(&mut engine, delta, &node, &mut local));
        let key = |n: &str| PodKey::new("ns", n);
        assert!(local.contains_key(&key("a")), "kept aside until placed");
        assert!(engine.pod(&key("a")).is_none());
        let remote = engine.pod(&key("b")).expect("a peer");
        assert_eq!(remote.netns, None, "never programmed here");
        // A change of a remote pod leaves the local ones alone.
        let delta = InventoryDelta {
            pods: vec![on("b", "n3").into()],
            ..InventoryDelta::default()
        };
        assert!(!apply_delta(&mut engine, delta, &node, &mut local));
        let delta = InventoryDelta {
            pods_removed: vec![key("a"), key("b")],
            ..InventoryDelta::default()
        };
        assert!(apply_delta(&mut engine, delta, &node, &mut local));
        assert!(local.is_empty());
        assert!(engine.pod(&key("b")).is_none());
    }

    #[test]
    fn retries_back_off_and_end_with_a_clean_sync() {
        let key = |n: &str| PodKey::new("ns", n);
        let (a, b) = (key("a"), key("b"));
        let first = Duration::from_secs(1);
        let t0 = Instant::now();
        let mut queue = RetryQueue::default();
        let synced = BTreeSet::from([a.clone(), b.clone()]);
        // `a` failed: retried after `first`; `b` succeeded: not retried.
        queue.after_sync(&synced, [&a], first, t0);
        assert_eq!(queue.due(t0).count(), 0, "not before its delay");
        assert_eq!(queue.due(t0 + first).collect::<Vec<_>>(), [&a]);
        // Failing again doubles the delay, up to MAX_RETRY_DELAY.
        let mut at = t0 + first;
        let mut delays = Vec::new();
        for _ in 0..8 {
            queue.after_sync(&BTreeSet::from([a.clone()]), [&a], first, at);
            let (next, delay) = queue.due[&a];
            delays.push(delay.as_secs());
            at = next;
        }
        assert_eq!(delays, [2, 4, 8, 16, 30, 30, 30, 30]);
        // A sync that did not include `a` leaves it scheduled; one that did and succeeded
        // forgets it.
        queue.after_sync(&BTreeSet::from([b.clone()]), [], first, at);
        assert_eq!(queue.len(), 1);
        queue.after_sync(&BTreeSet::from([a.clone()]), [], first, at);
        assert!(queue.is_empty());
        // A refused pod is forgotten: it is not synced at all while refused.
        queue.after_sync(&synced, [&a, &b], first, t0);
        queue.forget(&BTreeSet::from([b.clone()]));
        assert_eq!(queue.due(t0 + first).collect::<Vec<_>>(), [&a]);
    }

    #[test]
    fn events_are_judged_after_changes_at_most_once_a_period() {
        let mut schedule = EventSchedule::default();
        assert!(!schedule.take(false), "nothing changed yet");
        assert!(schedule.take(true), "the first change is judged at once");
        assert!(!schedule.take(true), "a burst within the period waits");
        assert!(schedule.due, "and is remembered");
        schedule.judged = Some(Instant::now() - EVENTS_EVERY);
        assert!(
            schedule.take(false),
            "the remembered change is judged after the period"
        );
        schedule.judged = Some(Instant::now() - EVENTS_EVERY);
        assert!(!schedule.take(false), "nothing new: nothing judged");
    }

    #[test]
    fn lines_are_said_when_they_appear_and_again_when_they_come_back() {
        let mut shown = Shown::default();
        let lines = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        shown.warn_new(lines(&["a", "b"]));
        assert_eq!(shown.0, lines(&["a", "b"]));
        shown.warn_new(lines(&["b"]));
        assert_eq!(shown.0, lines(&["b"]), "only current lines are kept");
        shown.warn_new(lines(&["a", "b"]));
        assert_eq!(shown.0, lines(&["a", "b"]));
    }
}
