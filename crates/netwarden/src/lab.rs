//! `netwarden lab check` and `netwarden demo`: build a real netns topology from manifests,
//! enforce the rules netwarden computes, send real TCP/UDP connections between every pod pair
//! on every network, and set what happened beside what `reach` predicted.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use netwarden_dataplane::Backend;
use netwarden_engine::{Engine, EngineOptions, PodKey, Protocol};
use netwarden_lab::{Lab, LabSpec, ProbeDetail, ProbeSpec};
use netwarden_manifest::{Inventory, LoadOptions};
use netwarden_monitor::{
    Collector, EventProcessor, ListenerConfig, MemorySink, Metrics, PodContext,
};
use netwarden_render::RenderOptions;
use serde::Serialize;

use crate::cli_args::{PodSelectorArg, PortProto};
use crate::inventory::engine_from;
use crate::reach::{reach, Probe, ReachQuery};
use crate::sync::{for_backend, Reconciler, SyncReport};

/// One probe: the `reach` prediction plus what the real connection did.
#[derive(Debug, Clone, Serialize)]
pub struct ObservedProbe {
    #[serde(flatten)]
    pub predicted: Probe,
    /// `None` when the protocol cannot be probed here (SCTP).
    pub observed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<ProbeDetail>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<f64>,
}

impl ObservedProbe {
    pub fn mismatch(&self) -> bool {
        self.observed.is_some_and(|o| o != self.predicted.allowed)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct LabReport {
    pub backend: &'static str,
    pub probes: Vec<ObservedProbe>,
    pub events: Vec<netwarden_monitor::Event>,
    pub mismatches: usize,
    #[serde(skip)]
    pub sync: SyncReport,
}

#[derive(Debug, Clone)]
pub struct LabCheckOptions {
    pub backend: Backend,
    pub ports: Vec<PortProto>,
    pub engine: EngineOptions,
    pub render: RenderOptions,
}

/// Ports to probe when none are given: every port a pod declares (TCP/UDP/SCTP), or 80/TCP.
pub fn default_ports(inventory: &Inventory) -> Vec<PortProto> {
    let mut ports: Vec<PortProto> = inventory
        .pods
        .iter()
        .flat_map(|p| p.container_ports.iter())
        .map(|c| PortProto {
            port: c.port,
            protocol: c.protocol,
        })
        .collect();
    ports.sort_by_key(|p| (p.port, p.protocol));
    ports.dedup();
    if ports.is_empty() {
        ports.push(PortProto {
            port: 80,
            protocol: Protocol::Tcp,
        });
    }
    ports
}

/// A running lab with rules enforced: the pieces `check` and `demo` share.
pub struct EnforcedLab {
    pub lab: Lab,
    /// One NFLOG listener per pod netns, collecting would-deny/deny events.
    pub collector: Collector,
    records: std::sync::mpsc::Receiver<netwarden_monitor::RawRecord>,
    pub engine: Engine,
    pub syncer: Box<dyn Reconciler>,
    pub netns: BTreeMap<PodKey, PathBuf>,
    pub sync: SyncReport,
}

impl EnforcedLab {
    /// Builds the topology and enforces every pod's rules in its netns.
    pub fn up(inventory: &Inventory, options: &LabCheckOptions) -> Result<EnforcedLab> {
        let pods: Vec<_> = inventory
            .pods
            .iter()
            .filter(|p| !p.host_network)
            .cloned()
            .collect();
        let spec = LabSpec {
            pods,
            ports: options.ports.iter().map(|p| (p.port, p.protocol)).collect(),
        };
        let lab = Lab::up(&spec).context("building the lab")?;
        let mut inventory = inventory.clone();
        let mut netns = BTreeMap::new();
        for pod in &mut inventory.pods {
            pod.netns = lab.pod_netns(&pod.key).map(|p| p.display().to_string());
            if let Some(path) = lab.pod_netns(&pod.key) {
                netns.insert(pod.key.clone(), path.to_path_buf());
            }
        }
        let mut engine = engine_from(&inventory, options.engine.clone());
        let mut syncer = for_backend(options.backend, options.render);
        let all: std::collections::BTreeSet<PodKey> =
            engine.pods().map(|p| p.key.clone()).collect();
        let sync = syncer.sync(&mut engine, all);
        if !sync.errors.is_empty() {
            anyhow::bail!(
                "enforcing rules in the lab failed: {}",
                sync.errors.join("; ")
            );
        }
        let config = ListenerConfig {
            group: options.render.nflog_group,
            ..ListenerConfig::default()
        };
        let (mut collector, records) = Collector::new(config, 65_536, Arc::new(Metrics::new()));
        for (key, rules) in syncer.current() {
            if let Some(path) = netns.get(key) {
                collector
                    .open(path, PodContext::new("lab", rules))
                    .with_context(|| format!("opening the NFLOG listener of {key}"))?;
            }
        }
        Ok(EnforcedLab {
            lab,
            collector,
            records,
            engine,
            syncer,
            netns,
            sync,
        })
    }

    /// Probes every pair the `reach` query names, with real connections.
    pub fn probe(&mut self, ports: &[PortProto]) -> Vec<ObservedProbe> {
        let predicted = predict(&mut self.engine, ports);
        let unsupported = self.lab.unsupported_ports().to_vec();
        let lab = &self.lab;
        observe(
            predicted,
            |key| lab.pod_netns(key).is_some(),
            &unsupported,
            |specs| lab.probe(specs),
        )
    }

    /// The events logged so far (waits until the kernel has been quiet for a moment).
    pub fn events(&self) -> Vec<netwarden_monitor::Event> {
        let sink = Arc::new(MemorySink::new());
        let processor = EventProcessor::new(self.collector.metrics().clone(), sink.clone());
        let by_addr = self.engine.pods_by_address();
        let resolve = |ip: std::net::IpAddr| by_addr.get(&ip).cloned();
        processor.drain(
            &self.records,
            &resolve,
            Duration::from_millis(400),
            Duration::from_secs(5),
        );
        sink.take()
    }

    /// Removes the rules and the topology.
    pub fn down(mut self) -> Result<()> {
        self.collector.close_all();
        let errors = self.syncer.remove_all();
        self.lab.down().context("tearing the lab down")?;
        if !errors.is_empty() {
            anyhow::bail!("removing rules: {}", errors.join("; "));
        }
        Ok(())
    }
}

/// What `reach` predicts for every pod pair on every network, for `ports`.
fn predict(engine: &mut Engine, ports: &[PortProto]) -> Vec<Probe> {
    let rules = engine.all_pod_rules();
    let query = ReachQuery {
        ports: ports.to_vec(),
        network: None,
        from: PodSelectorArg::All,
        to: PodSelectorArg::All,
    };
    reach(engine, &rules, &query).probes
}

/// Sends a real connection for every predicted probe whose pods are in the lab (`in_lab`) and
/// whose port can be served (not in `unsupported`), through `run`; sets what happened beside
/// each prediction.
fn observe(
    predicted: Vec<Probe>,
    in_lab: impl Fn(&PodKey) -> bool,
    unsupported: &[(u16, Protocol)],
    run: impl FnOnce(&[ProbeSpec]) -> Vec<netwarden_lab::ProbeOutcome>,
) -> Vec<ObservedProbe> {
    let mut specs = Vec::new();
    let mut index = Vec::new();
    for (i, p) in predicted.iter().enumerate() {
        let Some(protocol) = Protocol::parse(&p.protocol) else {
            continue;
        };
        let (Some(from), Some(to)) = (parse_key(&p.from), parse_key(&p.to)) else {
            continue;
        };
        if unsupported.contains(&(p.port, protocol)) || !in_lab(&from) || !in_lab(&to) {
            continue;
        }
        index.push(i);
        specs.push(ProbeSpec {
            from,
            to,
            src_ip: Some(p.src),
            dst_ip: p.dst,
            port: p.port,
            protocol,
        });
    }
    let outcomes = run(&specs);
    let mut observed: Vec<ObservedProbe> = predicted
        .into_iter()
        .map(|predicted| ObservedProbe {
            predicted,
            observed: None,
            detail: None,
            elapsed_ms: None,
        })
        .collect();
    for (i, outcome) in index.into_iter().zip(outcomes) {
        observed[i].observed = Some(outcome.connected);
        observed[i].elapsed_ms = Some(outcome.elapsed.as_secs_f64() * 1e3);
        observed[i].detail = Some(outcome.detail);
    }
    observed
}

fn parse_key(s: &str) -> Option<PodKey> {
    s.split_once('/').map(|(ns, name)| PodKey::new(ns, name))
}

/// `lab check`: up, enforce, probe, down.
pub fn check(
    paths: &[PathBuf],
    load: &LoadOptions,
    options: &LabCheckOptions,
) -> Result<LabReport> {
    let inventory = netwarden_manifest::load_paths(paths, load);
    crate::inventory::report_problems(&inventory, false);
    let mut options = options.clone();
    if options.ports.is_empty() {
        options.ports = default_ports(&inventory);
    }
    let mut lab = EnforcedLab::up(&inventory, &options)?;
    let probes = lab.probe(&options.ports);
    let events = lab.events();
    let sync = lab.sync.clone();
    lab.down()?;
    let mismatches = probes.iter().filter(|p| p.mismatch()).count();
    Ok(LabReport {
        backend: options.backend.as_str(),
        probes,
        events,
        mismatches,
        sync,
    })
}

/// The readable form of a lab run: one matrix per (network, port, family) where each cell is
/// what really happened (`.` connected, `X` refused/timed out, `?` not probed), `!` marking a
/// disagreement with the prediction; then every mismatch and the totals.
pub fn render_text(report: &LabReport) -> String {
    use std::fmt::Write;
    let mut groups: BTreeMap<(String, u16, String, String), Vec<&ObservedProbe>> = BTreeMap::new();
    for p in &report.probes {
        let family = format!("{:?}", p.predicted.family).to_lowercase();
        groups
            .entry((
                p.predicted.network.clone(),
                p.predicted.port,
                p.predicted.protocol.clone(),
                family,
            ))
            .or_default()
            .push(p);
    }
    let mut out = String::new();
    for ((network, port, protocol, family), probes) in &groups {
        let mut names: Vec<&str> = probes
            .iter()
            .flat_map(|p| [p.predicted.from.as_str(), p.predicted.to.as_str()])
            .collect();
        names.sort();
        names.dedup();
        let width = names.iter().map(|n| n.len()).max().unwrap_or(1);
        let cell: BTreeMap<(&str, &str), &ObservedProbe> = probes
            .iter()
            .map(|p| ((p.predicted.from.as_str(), p.predicted.to.as_str()), *p))
            .collect();
        let _ = writeln!(
            out,
            "network {network}, {port}/{protocol}, {family}  (rows: from, columns: to)"
        );
        let _ = write!(out, "{:width$}", "");
        for n in &names {
            let _ = write!(out, " {n:>width$}");
        }
        out.push('\n');
        for from in &names {
            let _ = write!(out, "{from:width$}");
            for to in &names {
                let mark = match cell.get(&(*from, *to)) {
                    None => "-".to_string(),
                    Some(p) => match p.observed {
                        None => "?".to_string(),
                        Some(o) => {
                            let m = if o { "." } else { "X" };
                            if p.mismatch() {
                                format!("!{m}")
                            } else {
                                m.to_string()
                            }
                        }
                    },
                };
                let _ = write!(out, " {mark:>width$}");
            }
            out.push('\n');
        }
        out.push('\n');
    }
    for p in report.probes.iter().filter(|p| p.mismatch()) {
        let _ = writeln!(
            out,
            "MISMATCH {} -> {} {}/{} on {} ({} -> {}): predicted {}, observed {} ({:?})",
            p.predicted.from,
            p.predicted.to,
            p.predicted.port,
            p.predicted.protocol,
            p.predicted.network,
            p.predicted.src,
            p.predicted.dst,
            if p.predicted.allowed {
                "allowed"
            } else {
                "denied"
            },
            if p.observed == Some(true) {
                "connected"
            } else {
                "blocked"
            },
            p.detail
        );
    }
    let probed = report
        .probes
        .iter()
        .filter(|p| p.observed.is_some())
        .count();
    let _ = writeln!(
        out,
        "{} backend: {probed} real connections probed, {} not probeable here, {} mismatch(es) with the prediction.",
        report.backend,
        report.probes.len() - probed,
        report.mismatches
    );
    out
}

/// What `lab up` leaves for `lab probe` and `lab down` (written to the `--state` file).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct LabSession {
    /// The `lab up` process that serves the listeners.
    pub pid: u32,
    pub backend: String,
    pub state: netwarden_lab::LabState,
    /// Pod `ns/name` → netns path.
    pub netns: BTreeMap<String, PathBuf>,
}

impl EnforcedLab {
    pub fn session(&self) -> LabSession {
        LabSession {
            pid: std::process::id(),
            backend: self.syncer.backend().as_str().to_string(),
            state: self.lab.state().clone(),
            netns: self
                .netns
                .iter()
                .map(|(k, p)| (k.to_string(), p.clone()))
                .collect(),
        }
    }
}

/// `lab probe`: probes a lab that a `lab up` process keeps serving, against the prediction of
/// the same manifests.
pub fn probe_session(
    session: &LabSession,
    paths: &[PathBuf],
    load: &LoadOptions,
    ports: &[PortProto],
    engine_options: EngineOptions,
) -> Result<LabReport> {
    let inventory = netwarden_manifest::load_paths(paths, load);
    let mut engine = engine_from(&inventory, engine_options);
    let predicted = predict(&mut engine, ports);
    let sources: BTreeMap<PodKey, PathBuf> = session
        .netns
        .iter()
        .filter_map(|(k, p)| parse_key(k).map(|k| (k, p.clone())))
        .collect();
    let sctp: Vec<(u16, Protocol)> = ports
        .iter()
        .filter(|p| p.protocol == Protocol::Sctp)
        .map(|p| (p.port, p.protocol))
        .collect();
    let probes = observe(
        predicted,
        |key| sources.contains_key(key),
        &sctp,
        |specs| netwarden_lab::probe_paths(&sources, specs, &netwarden_lab::ProbeConfig::default()),
    );
    let mismatches = probes.iter().filter(|p| p.mismatch()).count();
    let backend = if session.backend == "iptables" {
        "iptables"
    } else {
        "nft"
    };
    Ok(LabReport {
        backend,
        probes,
        events: Vec::new(),
        mismatches,
        sync: SyncReport::default(),
    })
}
