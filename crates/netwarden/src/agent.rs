//! `netwarden run -f DIR` (the standalone agent) and `netwarden apply` (one pass).
//!
//! The agent loads the manifests, feeds the engine (which ignores objects that did not change),
//! and syncs only the pods the engine names dirty. It polls the files' sizes and modification
//! times; a change reloads them and the same diff-by-object logic applies. Rules stay in place
//! when the agent stops; a restarted agent re-applies each isolated pod once (an atomic
//! replacement per netns, so no window opens) and removes rules from pods no longer isolated.
//! A pod whose sync fails (e.g. its netns does not exist yet) is retried, backing off.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use netwarden_dataplane::Backend;
use netwarden_dataplane::DiscoveredInterface;
use netwarden_engine::{
    Engine, EngineOptions, NetworkId, NetworkType, ObjectKey, Pod, PodInterface, PodKey, PolicyRef,
};
use netwarden_manifest::{load_paths, Inventory, LoadOptions};
use netwarden_render::RenderOptions;
use tracing::{info, warn};

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use netwarden_monitor::{
    serve_metrics, Collector, EventProcessor, EventSink, JsonLinesSink, ListenerConfig, Metrics,
    PodContext,
};

use crate::lab::dataplane;
use crate::sync::Syncer;

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub paths: Vec<PathBuf>,
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
}

/// The monitor side of the agent: one NFLOG listener per managed pod netns that has log rules,
/// a consumer thread turning records into events, and the metrics.
struct Monitor {
    collector: Collector,
    node: String,
    /// Address → pod, refreshed after each sync, for the events' `peer`.
    addresses: Arc<RwLock<HashMap<IpAddr, PodKey>>>,
    metrics: Arc<Metrics>,
}

impl Monitor {
    fn start(config: &AgentConfig) -> Result<Monitor> {
        let metrics = Arc::new(Metrics::new());
        let listener = ListenerConfig {
            group: config.render.nflog_group,
            ..ListenerConfig::default()
        };
        let (collector, records) = Collector::new(listener, 65_536, metrics.clone());
        let sink: Arc<dyn EventSink> = Arc::new(JsonLinesSink::new(
            config.events_stdout,
            config.events_file.as_deref(),
        )?);
        let addresses: Arc<RwLock<HashMap<IpAddr, PodKey>>> = Arc::default();
        let processor = EventProcessor::new(metrics.clone(), sink);
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
        })
    }

    /// Listeners follow the programmed pods: opened (or given the new rules) for pods whose
    /// rules log, closed for the others.
    fn follow(&mut self, engine: &Engine, syncer: &Syncer) {
        let mut wanted: BTreeMap<PathBuf, &PodKey> = BTreeMap::new();
        for (key, netns) in syncer.programmed() {
            let Some(rules) = syncer.current.get(key) else {
                continue;
            };
            let logs = rules.interfaces.iter().any(|i| {
                [&i.ingress, &i.egress]
                    .iter()
                    .any(|d| d.has_monitor() || d.log_denies)
            });
            if logs {
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
        let map = engine.pods_by_address();
        *self.addresses.write().unwrap_or_else(|p| p.into_inner()) = map;
        self.metrics.set_managed_pods(syncer.programmed().len());
    }
}

/// Size and modification time of every manifest file, to notice changes cheaply.
fn fingerprint(paths: &[PathBuf]) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    fn walk(path: &Path, out: &mut Vec<(PathBuf, u64, Option<SystemTime>)>) {
        let Ok(meta) = std::fs::metadata(path) else {
            return;
        };
        if meta.is_dir() {
            let Ok(entries) = std::fs::read_dir(path) else {
                return;
            };
            let mut children: Vec<PathBuf> =
                entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
            children.sort();
            for child in children {
                walk(&child, out);
            }
        } else {
            out.push((path.to_path_buf(), meta.len(), meta.modified().ok()));
        }
    }
    let mut out = Vec::new();
    for p in paths {
        walk(p, &mut out);
    }
    out
}

/// Completes a pod's interfaces with what its netns really has (SPEC 2: a pod interface is any
/// kernel interface with an L3 address, except `lo`). An interface the manifests describe keeps
/// its network and gains any address the kernel shows beyond the manifests'; an interface they
/// do not describe joins with a network of its own (`interface:<name>`), so only policies that
/// isolate every interface (DanmNetworkPolicy) cover it and only peers without a network
/// selector contribute its addresses.
pub fn merge_discovered(pod: &mut Pod, discovered: &[DiscoveredInterface]) {
    for found in discovered {
        if netwarden_manifest::validate::ifname(&found.name).is_err() {
            continue;
        }
        match pod.interfaces.iter_mut().find(|i| i.name == found.name) {
            Some(iface) => {
                for net in &found.addrs {
                    if !iface.ips.contains(&net.addr()) {
                        iface.ips.push(net.addr());
                        iface.prefix_lens.push(net.prefix_len());
                    }
                }
            }
            None => pod.interfaces.push(PodInterface {
                name: found.name.clone(),
                network: NetworkId::Named {
                    kind: NetworkType::NetworkAttachmentDefinition,
                    namespace: None,
                    name: format!("interface:{}", found.name),
                },
                ips: found.addrs.iter().map(|n| n.addr()).collect(),
                prefix_lens: found.addrs.iter().map(|n| n.prefix_len()).collect(),
            }),
        }
    }
}

/// Applies [`merge_discovered`] to every pod whose netns can be read.
fn discover_interfaces(inventory: &mut Inventory) {
    for pod in inventory.pods.iter_mut().filter(|p| !p.host_network) {
        let Some(path) = pod.netns.clone() else {
            continue;
        };
        match netwarden_dataplane::interfaces(Path::new(&path)) {
            Ok(found) => merge_discovered(pod, &found),
            Err(e) => warn!("{}: cannot list the interfaces of {path}: {e}", pod.key),
        }
    }
}

/// Feeds `engine` with `next`, removing what `previous` had and `next` lacks. Unchanged objects
/// are ignored by the engine itself, so only affected pods become dirty.
pub fn apply_inventory(engine: &mut Engine, previous: Option<&Inventory>, next: &Inventory) {
    if let Some(prev) = previous {
        let pods: BTreeSet<&PodKey> = next.pods.iter().map(|p| &p.key).collect();
        for p in prev.pods.iter().filter(|p| !pods.contains(&p.key)) {
            engine.remove_pod(&p.key);
        }
        let policies: BTreeSet<PolicyRef> = next.policies.iter().map(|p| p.reference()).collect();
        for p in prev
            .policies
            .iter()
            .filter(|p| !policies.contains(&p.reference()))
        {
            engine.remove_policy(&p.reference());
        }
        let services: BTreeSet<&ObjectKey> = next.services.iter().map(|s| &s.key).collect();
        for s in prev.services.iter().filter(|s| !services.contains(&s.key)) {
            engine.remove_service(&s.key);
        }
        let namespaces: BTreeSet<&String> = next.namespaces.iter().map(|n| &n.name).collect();
        for n in prev
            .namespaces
            .iter()
            .filter(|n| !namespaces.contains(&n.name))
        {
            engine.remove_namespace(&n.name);
        }
    }
    for ns in &next.namespaces {
        engine.set_namespace(ns.clone());
    }
    for pod in &next.pods {
        engine.set_pod(pod.clone());
    }
    for policy in &next.policies {
        engine.set_policy(policy.clone());
    }
    for service in &next.services {
        engine.set_service(service.clone());
    }
}

/// The longest wait before retrying a pod whose sync failed.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);

/// Runs the agent (`once`: a single pass, exit status says whether every pod was applied).
pub fn run(config: AgentConfig, once: bool) -> Result<ExitCode> {
    let mut engine = Engine::new(config.engine.clone());
    let mut syncer = Syncer::new(dataplane(config.backend), config.backend, config.render);
    let mut monitor = if once {
        None
    } else {
        Some(Monitor::start(&config)?)
    };
    syncer.converge_removals = true;
    let mut previous: Option<Inventory> = None;
    let mut seen = Vec::new();
    let mut reported: BTreeSet<String> = BTreeSet::new();
    // Pods whose last sync failed: when to retry them, and the delay that led there.
    let mut retry: BTreeMap<PodKey, (Instant, Duration)> = BTreeMap::new();
    loop {
        let now = fingerprint(&config.paths);
        if now != seen || previous.is_none() {
            seen = now;
            let mut inventory = load_paths(&config.paths, &config.load);
            discover_interfaces(&mut inventory);
            for problem in &inventory.problems {
                let line = problem.to_string();
                if reported.insert(line.clone()) {
                    warn!("{line}");
                }
            }
            apply_inventory(&mut engine, previous.as_ref(), &inventory);
            previous = Some(inventory);
        }
        let mut dirty = engine.take_dirty();
        let tick = Instant::now();
        dirty.extend(
            retry
                .iter()
                .filter(|(_, (at, _))| *at <= tick)
                .map(|(key, _)| key.clone()),
        );
        if !dirty.is_empty() || once {
            let report = syncer.sync(&mut engine, dirty.iter().cloned());
            syncer.converge_removals = false;
            // Nothing marks a failed pod dirty again (its netns may not exist yet, or the
            // failure may pass): retry it, backing off, until a sync of it succeeds.
            retry.retain(|key, _| !dirty.contains(key) || report.failed.contains(key));
            for key in &report.failed {
                let delay = retry
                    .get(key)
                    .map_or(config.interval, |(_, d)| (*d * 2).min(MAX_RETRY_DELAY));
                retry.insert(key.clone(), (Instant::now() + delay, delay));
            }
            info!("{report}");
            if let Some(monitor) = monitor.as_mut() {
                monitor
                    .metrics
                    .observe_sync(report.duration, report.errors.is_empty());
                monitor.follow(&engine, &syncer);
            }
            for error in &report.errors {
                warn!("{error}");
            }
            if once {
                return Ok(if report.errors.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                });
            }
        }
        std::thread::sleep(config.interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::testing::pod;

    fn found(name: &str, addrs: &[&str]) -> DiscoveredInterface {
        DiscoveredInterface {
            name: name.into(),
            index: 2,
            addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            link_local: Vec::new(),
            up: true,
        }
    }

    #[test]
    fn kernel_interfaces_complete_the_model() {
        let mut p = pod("x", "a", &[], &["10.0.0.1"]);
        merge_discovered(
            &mut p,
            &[
                found("eth0", &["10.0.0.1/24", "10.0.0.9/24"]),
                found("net7", &["192.168.7.1/24"]),
            ],
        );
        assert_eq!(p.interfaces.len(), 2);
        assert_eq!(p.interfaces[0].network, NetworkId::Primary);
        assert_eq!(
            p.interfaces[0].ips.len(),
            2,
            "the kernel's extra address is added"
        );
        assert_eq!(p.interfaces[1].name, "net7");
        assert_eq!(p.interfaces[1].network.to_string(), "interface:net7");
        assert_eq!(p.interfaces[1].prefix_lens, vec![24]);
        // Names Linux itself refuses never make it into the model (any kernel-legal name does:
        // the renderers quote it or match by index).
        merge_discovered(&mut p, &[found("bad name", &["192.168.8.1/24"])]);
        assert_eq!(p.interfaces.len(), 2);
    }
}
