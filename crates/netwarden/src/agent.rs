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
use std::time::{Duration, Instant};

use crate::inventory::PodChange;
use anyhow::Result;
use netwarden_dataplane::{Backend, InterfaceWatch};
use netwarden_engine::{AddressChanges, Engine, EngineOptions, Pod, PodKey};
use netwarden_manifest::{InventoryDelta, LoadOptions};
use netwarden_monitor::{
    serve_metrics, Collector, EventProcessor, EventSink, JsonLinesSink, ListenerConfig, Metrics,
    PodContext, Timestamp,
};
use netwarden_render::RenderOptions;
use tracing::{debug, info, warn};

use crate::placement::{count_states, place, KernelViews, LocalState, NetnsAnswer};
use crate::policy_events::wanted_events;
use crate::source::{CriNetns, DeclaredNetns, Locality, NetnsSource, ObjectSource, SourceConfig};
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
}

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
    fn start(config: &AgentConfig) -> Result<Monitor> {
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
            serve_metrics(addr, metrics.clone())?;
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
        self.status
            .observe(engine.policies(), &cover, &counters, Timestamp::now());
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
    crate::inventory::apply_delta_with(engine, delta, |engine, change| match change {
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
///
/// One loop for every source: wait for the source (files: `--interval`; a cluster: until a
/// watch event changes something, at most `--interval`, so retries and the kernel's interface
/// rediscovery still happen), feed the engine what changed, sync the dirty local pods. With a
/// cluster nothing is applied before every kind was listed once, and an API outage changes
/// nothing: the last view (and so the last enforced state) stays until the watchers catch up.
pub fn run(config: AgentConfig, once: bool) -> Result<ExitCode> {
    let mut engine = Engine::new(config.engine.clone());
    let mut syncer = for_backend(config.backend, config.render);
    let mut monitor = if once {
        None
    } else {
        Some(Monitor::start(&config)?)
    };
    syncer.set_converge_removals(true);
    let mut source = ObjectSource::start(&config.source, &config.load)?;
    let locality = Locality::of(&config.source);
    let mut netns_source = netns_source(&config.source)?;
    let stop = if once {
        Arc::new(AtomicBool::new(false))
    } else {
        crate::shutdown::install(config.shutdown_timeout, source.waker())?
    };
    // A long sync (many netns, large rulesets) stops between two netns applies.
    syncer.set_stop(stop.clone());
    // Whether the engine was fed once (the first take of the source is everything).
    let mut fed_once = false;
    // The local pods as the objects describe them (netns and interfaces are joined at each
    // placement: see `discover`).
    let mut local: BTreeMap<PodKey, Arc<Pod>> = BTreeMap::new();
    // The local pods' netns as the kernel last showed them (followed through its
    // notifications), and when all were last read.
    let mut kernel = if once {
        KernelViews::default()
    } else {
        KernelViews::watched(InterfaceWatch::start(source.waker())?)
    };
    let mut kernel_read: Option<Instant> = None;
    // What was last reported: a line is logged when it appears, not at every tick, and
    // again if it goes away and comes back. Only current lines are kept (bounded memory).
    let mut problems_shown: BTreeSet<String> = BTreeSet::new();
    let mut refusals_shown: BTreeSet<String> = BTreeSet::new();
    // Pods whose last sync failed: when to retry them, and the delay that led there.
    let mut retry: BTreeMap<PodKey, (Instant, Duration)> = BTreeMap::new();
    // Pods refused by the last placement (never synced while refused), and where every local
    // pod stands.
    let mut refused_keys: BTreeSet<PodKey> = BTreeSet::new();
    let mut local_states: BTreeMap<PodKey, LocalState> = BTreeMap::new();
    let mut trimmer = crate::memory::Trimmer::new(TRIM_EVERY);
    // Whether objects changed since policies were last judged for Events, and when that was.
    let mut events_due = false;
    let mut events_judged: Option<Instant> = None;
    // The problems of the objects as last taken.
    let mut problems_now: Vec<netwarden_manifest::Problem> = Vec::new();
    // The oldest change received and not applied yet (cluster only).
    let mut oldest: Option<Instant> = None;
    let mut wait = Duration::ZERO;
    let mut last_reason: Option<String> = None;
    loop {
        if stop.load(Ordering::Relaxed) {
            info!("stopping; the rules in place stay");
            if let Some(monitor) = monitor.as_mut() {
                monitor.write_status(syncer.as_ref(), true);
            }
            return Ok(ExitCode::SUCCESS);
        }
        let poll = source.poll(wait);
        wait = config.interval;
        if let Some(at) = poll.oldest {
            oldest = Some(oldest.map_or(at, |o| o.min(at)));
        }
        // Before the first full list the reason changes with every kind listed: say it once.
        let reason = match source.synced_once() {
            true => source.not_ready_reason(),
            false => Some("waiting for the first full list of every kind".to_string()),
        };
        if reason != last_reason {
            match &reason {
                Some(why) => warn!("not ready: {why}"),
                None => info!("the cluster view is current"),
            }
            last_reason = reason.clone();
        }
        if let Some(monitor) = monitor.as_ref() {
            monitor.metrics.health().tick();
            if let Some(kube) = source.kube() {
                monitor.record_watch(kube);
            }
        }
        if !source.synced_once() {
            // A partial view (some kinds not listed yet) is never applied. It is fed to the
            // engine as it comes, though (every FEED_WHILE_LISTING): the pass after the last
            // kind is listed then takes only the rest. At 100,000 pods, taking and feeding the
            // whole view after the list held readiness back 1.5–1.8 s. Its problems are not
            // shown: a partial view has false ones (a DanmEp whose pod is not listed yet); the
            // first full view shows those that hold.
            if poll.changed {
                let update = source.take_update();
                apply_delta(&mut engine, update.delta, &locality, &mut local);
            }
            wait = config.interval.min(FEED_WHILE_LISTING);
            continue;
        }
        let fresh = poll.changed || !fed_once;
        let mut phases = Phases::start();
        // Whether this pass synced, and the listeners and addresses followed.
        let mut followed = false;
        let mut place_local = false;
        if fresh {
            let update = source.take_update();
            phases.mark("objects");
            let problems = update.problems.iter().map(ToString::to_string);
            warn_new(problems.collect(), &mut problems_shown);
            place_local =
                apply_delta(&mut engine, update.delta, &locality, &mut local) || !fed_once;
            phases.mark("engine");
            fed_once = true;
            problems_now = update.problems;
        }
        // What the kernel said changed (an interface added, renamed, re-addressed) is read
        // at once: the rules in place reject an interface they do not know, so this is how
        // long a new interface waits to be allowed (SPEC 3.1).
        if kernel.read_changed() {
            place_local = true;
            phases.mark("notified");
        }
        // Every `--interval`, whatever the objects do (a busy cluster changes something every
        // few hundred milliseconds), the kernel's side is read again: it changes without the
        // objects, and a notification may have been lost.
        let kernel_due =
            fed_once && kernel_read.is_none_or(|at: Instant| at.elapsed() >= config.interval);
        if place_local || kernel_due {
            // Local pods: their netns (from the runtime or the objects) and what the kernel
            // shows there. After an object change only namespaces not read yet are read (a new
            // pod, a recreated sandbox); when due, all of them are read again: interfaces
            // appear, are renamed, change address, and a sandbox recreated by the runtime shows
            // as a new netns path (the pod is set again with it, so the engine names it dirty
            // and it is applied at once).
            let local_now: Vec<Pod> = local.values().map(|p| Pod::clone(p)).collect();
            netns_source.refresh(&local_now);
            let answers: Vec<(Pod, NetnsAnswer)> = local_now
                .into_iter()
                .map(|pod| {
                    let answer = netns_source.netns(&pod);
                    (pod, answer)
                })
                .collect();
            if kernel_due {
                kernel.refresh(&answers);
                kernel_read = Some(Instant::now());
            } else {
                kernel.read_new(&answers);
            }
            let placement = place(answers, &kernel);
            phases.mark("netns");
            for pod in placement.pods.iter().cloned() {
                engine.set_pod(pod);
            }
            for (key, state) in &placement.states {
                let why = match state {
                    LocalState::LockedDown(why) => Some(why.clone()),
                    _ => None,
                };
                engine.set_lockdown(key, why);
            }
            phases.mark("local");
            let mut lines = state_lines(&placement.states);
            lines.extend(placement.notes.iter().cloned());
            warn_new(lines, &mut refusals_shown);
            refused_keys = placement.refused();
            local_states = placement.states;
        }
        let mut dirty = engine.take_dirty();
        // Remote pods are peers only: their own rules are another node's job. A pod that was
        // programmed here and is now gone (or elsewhere) stays, so its rules are removed.
        dirty = to_sync(dirty, &engine, &locality, syncer.programmed());
        // A netns deleted and created again at the same path holds none of our rules.
        let changed = syncer.netns_changed();
        for key in &changed {
            info!("{key}: its network namespace was recreated; programming it again");
        }
        dirty.extend(changed);
        let tick = Instant::now();
        dirty.extend(
            retry
                .iter()
                .filter(|(_, (at, _))| *at <= tick)
                .map(|(key, _)| key.clone()),
        );
        // A refused pod is not programmed and its netns not touched, whatever changes (its
        // rules stay as they are until the reason goes: then it is placed, and dirty).
        dirty.retain(|key| !refused_keys.contains(key));
        retry.retain(|key, _| !refused_keys.contains(key));
        phases.mark("dirty");
        if !dirty.is_empty() || once {
            let report = syncer.sync(&mut engine, dirty.clone());
            phases.mark("sync");
            syncer.set_converge_removals(false);
            // Nothing marks a failed pod dirty again (its netns may not exist yet, or the
            // failure may pass), nor a local pod whose netns is not known yet: retry them,
            // backing off, until a sync of them succeeds.
            let again: BTreeSet<&PodKey> =
                report.failed.iter().chain(&report.without_netns).collect();
            retry.retain(|key, _| !dirty.contains(key) || again.contains(key));
            for key in again {
                let delay = retry
                    .get(key)
                    .map_or(config.interval, |(_, d)| (*d * 2).min(MAX_RETRY_DELAY));
                retry.insert(key.clone(), (Instant::now() + delay, delay));
            }
            info!("{report}");
            trimmer.worked();
            if let Some(monitor) = monitor.as_mut() {
                monitor
                    .metrics
                    .observe_sync(report.duration, report.errors.is_empty());
                monitor.follow(&mut engine, syncer.as_ref());
                followed = true;
                phases.mark("follow");
            }
            for error in &report.errors {
                warn!("{error}");
            }
            if once {
                let refused_now = refused_keys.len();
                if refused_now > 0 {
                    warn!("{refused_now} pod(s) refused: not programmed");
                }
                return Ok(if report.errors.is_empty() && refused_now == 0 {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                });
            }
        }
        // Every local pod by state, for operators to alert on (a pod selected by a policy
        // but not programmed, refused, waiting): after anything that may change them.
        if let (Some(monitor), true) = (monitor.as_ref(), phases.any()) {
            let counts = count_states(&local_states, syncer.programmed(), |key| {
                engine.pod_rules(key).is_some_and(|r| r.needs_rules())
            });
            monitor.metrics.set_local_pods(counts);
        }
        // Readiness and the status first: the events on policies below take their time
        // (a second for 20,000 policies) and enforcement, done above, never waits for them.
        if let Some(monitor) = monitor.as_mut() {
            if let Some(at) = oldest.take().filter(|_| fresh) {
                monitor.metrics.observe_event_to_apply(at.elapsed());
            }
            // Ready: the view was complete once, is current now, and has been applied. The
            // status records below read every monitored pod's counters (a listing in each
            // netns: about a second for 100 pods) and do not hold readiness back.
            monitor.metrics.health().set_ready(match &reason {
                None => Ok(()),
                Some(why) => Err(why.clone()),
            });
            // Only once the state was applied: before, the agent vouches for nothing.
            if fed_once {
                if fresh || followed {
                    // After a sync (pods join and leave episodes, each joining pod's counters
                    // read as its base: at the first sync, every monitored pod's), or policies
                    // changed without a pod to sync (e.g. none local).
                    monitor.track(&engine, syncer.as_ref());
                }
                monitor.write_status(syncer.as_ref(), false);
            }
            if phases.any() {
                // Only in a pass that did something (an idle wake-up logs nothing).
                phases.mark("status");
            }
        }
        // Events on bad policies, once local pods are placed (a new local pod is selected
        // before its policy is judged) and after the sync (enforcement does not wait for
        // them): the whole current set is offered; the publisher queues only what is new and
        // never waits (see netwarden_kube::events).
        // At most once per EVENTS_EVERY: judging every policy takes milliseconds per thousand
        // policies, and an Event a second later is as good; a burst of changes is judged once.
        events_due |= fresh;
        if events_due && events_judged.is_none_or(|at| at.elapsed() >= EVENTS_EVERY) {
            events_due = false;
            events_judged = Some(Instant::now());
            if let Some(events) = source.kube().and_then(|kube| kube.events()) {
                let unplaced: Vec<&Pod> = refused_keys
                    .iter()
                    .filter_map(|k| local.get(k))
                    .map(|p| &**p)
                    .collect();
                let identity = |key: &netwarden_manifest::ClusterKey| {
                    source.kube().and_then(|kube| kube.policy(key))
                };
                events.offer(&wanted_events(&problems_now, &engine, &unplaced, &identity));
                phases.mark("events");
            }
        }
        if fresh {
            trimmer.worked();
        }
        // What the passes allocated and freed goes back to the kernel (see `memory`).
        if trimmer.maybe_trim() {
            phases.mark("trim");
        }
        if phases.any() {
            debug!("pass: {phases}");
        }
    }
}

/// Where one pass of the agent loop spent its time, logged at debug level
/// (`RUST_LOG=netwarden=debug`): which step a slow event-to-apply comes from.
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
fn netns_source(source: &SourceConfig) -> Result<Box<dyn NetnsSource>> {
    Ok(match source {
        SourceConfig::Kube {
            cri_endpoint: Some(endpoint),
            ..
        } => {
            info!("local pods' network namespaces from the CRI runtime at {endpoint}");
            Box::new(CriNetns::new(endpoint)?)
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

/// Logs the lines of `now` that `shown` lacks, then remembers `now` only.
fn warn_new(now: BTreeSet<String>, shown: &mut BTreeSet<String>) {
    for line in now.difference(shown) {
        warn!("{line}");
    }
    *shown = now;
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
}
