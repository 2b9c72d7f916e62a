//! `netwarden lab check` and `netwarden demo`: build a real netns topology from manifests,
//! enforce the rules netwarden computes, send real TCP/UDP connections between every pod pair
//! on every network, and set what happened beside what `reach` predicted.
//!
//! A prediction holds only when the connection did exactly what netwarden's rules make it do:
//! an allow connects, a deny is *refused* (TCP reset or ICMP port unreachable: netwarden
//! REJECTs, SPEC 3.1). A deny that times out, is unreachable or could not be probed at all is a
//! [`Mismatch`] like a deny that connects: a silent drop somewhere else must not pass for
//! netwarden's verdict.
//!
//! `lab check --then PATH...` probes several states of one cluster on one topology: the netns
//! are built once (building and removing them is most of a lab's cost), and each further state
//! is enforced in them in turn ([`EnforcedLab::enforce`]), as an agent would apply the change.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use netwarden_dataplane::Backend;
use netwarden_engine::{Engine, EngineOptions, Family, NetworkId, PodKey, Protocol};
use netwarden_lab::{Lab, LabSpec, ProbeDetail, ProbeSpec};
use netwarden_manifest::{Inventory, LoadOptions};
use netwarden_monitor::{
    Collector, EventProcessor, ListenerConfig, MemorySink, Metrics, PodContext,
};
use netwarden_render::RenderOptions;
use serde::Serialize;

use crate::cli_args::{PodSelectorArg, PortProto};
use crate::inventory::engine_from;
use crate::reach::{Probe, Reach, ReachQuery};
use netwarden_agent::sync::{for_backend, Reconciler, SyncReport};

/// How a real connection disagreed with the prediction. A predicted allow must connect; a
/// predicted deny must be refused. `allowed` is the enforced verdict: a would-deny (allowed
/// now, denied by monitored policies) passes traffic, so it must connect too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mismatch {
    DeniedButConnected,
    /// Dropped somewhere: netwarden never drops silently.
    DeniedButTimedOut,
    DeniedButUnreachable,
    DeniedButProbeFailed,
    AllowedButRefused,
    AllowedButTimedOut,
    AllowedButUnreachable,
    AllowedButProbeFailed,
}

impl Mismatch {
    /// `None` when `detail` is what the prediction `allowed` implies.
    pub fn of(allowed: bool, detail: &ProbeDetail) -> Option<Mismatch> {
        use ProbeDetail as D;
        match (allowed, detail) {
            (true, D::Connected) | (false, D::Refused) => None,
            (false, D::Connected) => Some(Mismatch::DeniedButConnected),
            (false, D::Timeout) => Some(Mismatch::DeniedButTimedOut),
            (false, D::Unreachable) => Some(Mismatch::DeniedButUnreachable),
            (false, D::Error(_)) => Some(Mismatch::DeniedButProbeFailed),
            (true, D::Refused) => Some(Mismatch::AllowedButRefused),
            (true, D::Timeout) => Some(Mismatch::AllowedButTimedOut),
            (true, D::Unreachable) => Some(Mismatch::AllowedButUnreachable),
            (true, D::Error(_)) => Some(Mismatch::AllowedButProbeFailed),
        }
    }
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mismatch::DeniedButConnected => "denied but connected",
            Mismatch::DeniedButTimedOut => "denied but timed out (expected a refusal)",
            Mismatch::DeniedButUnreachable => "denied but unreachable (expected a refusal)",
            Mismatch::DeniedButProbeFailed => "denied but the probe failed (expected a refusal)",
            Mismatch::AllowedButRefused => "allowed but refused",
            Mismatch::AllowedButTimedOut => "allowed but timed out",
            Mismatch::AllowedButUnreachable => "allowed but unreachable",
            Mismatch::AllowedButProbeFailed => "allowed but the probe failed",
        })
    }
}

/// One probe: the `reach` prediction plus what the real connection did.
#[derive(Debug, Clone, Serialize)]
pub struct ObservedProbe {
    #[serde(flatten)]
    pub predicted: Probe,
    /// Whether the connection was made; `None` when the protocol cannot be probed here (SCTP).
    pub observed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<ProbeDetail>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<f64>,
    /// Set when the connection disagreed with the prediction; says how.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mismatch: Option<Mismatch>,
}

impl ObservedProbe {
    /// A prediction with the outcome of its real connection.
    pub fn with_outcome(predicted: Probe, detail: ProbeDetail, elapsed: Duration) -> ObservedProbe {
        ObservedProbe {
            observed: Some(detail == ProbeDetail::Connected),
            mismatch: Mismatch::of(predicted.allowed, &detail),
            detail: Some(detail),
            elapsed_ms: Some(elapsed.as_secs_f64() * 1e3),
            predicted,
        }
    }

    /// A prediction that cannot be checked here (SCTP, or a pod outside the lab).
    pub fn not_probed(predicted: Probe) -> ObservedProbe {
        ObservedProbe {
            predicted,
            observed: None,
            detail: None,
            elapsed_ms: None,
            mismatch: None,
        }
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
    /// The pods the topology was built from (no host-network pod): a later state must have
    /// the same ([`EnforcedLab::enforce`]).
    topology: Vec<netwarden_engine::Pod>,
    engine_options: EngineOptions,
}

impl EnforcedLab {
    /// Builds the topology and enforces every pod's rules in its netns.
    pub fn up(inventory: &Inventory, options: &LabCheckOptions) -> Result<EnforcedLab> {
        let pods = lab_pods(inventory);
        let spec = LabSpec {
            pods: pods.clone(),
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
            topology: pods,
            engine_options: options.engine.clone(),
        })
    }

    /// Enforces another state of the cluster in the running lab: its pods must be the lab's
    /// (same keys, interfaces and addresses; labels, ports and every other object may differ).
    /// Every pod is synced from a fresh engine, as an agent applies a change, and live
    /// connections the new rules deny are ended (SPEC 5's revocation), so that nothing a
    /// state allowed survives into the next one; the NFLOG listeners name the new rules.
    pub fn enforce(&mut self, inventory: &Inventory) -> Result<()> {
        let pods = lab_pods(inventory);
        let same = pods.len() == self.topology.len()
            && pods
                .iter()
                .zip(&self.topology)
                .all(|(new, old)| new.key == old.key && new.interfaces == old.interfaces);
        if !same {
            let mut old: Vec<String> = self.topology.iter().map(|p| p.key.to_string()).collect();
            let mut new: Vec<String> = pods.iter().map(|p| p.key.to_string()).collect();
            old.sort();
            new.sort();
            anyhow::bail!(
                "this state changes the lab's topology (pods, interfaces or addresses): the lab has [{}], the state [{}]",
                old.join(", "),
                new.join(", ")
            );
        }
        let mut inventory = inventory.clone();
        for pod in &mut inventory.pods {
            pod.netns = self.netns.get(&pod.key).map(|p| p.display().to_string());
        }
        let mut engine = engine_from(&inventory, self.engine_options.clone());
        let all: std::collections::BTreeSet<PodKey> =
            engine.pods().map(|p| p.key.clone()).collect();
        self.syncer
            .set_established(netwarden_agent::sync::Established::Revoke);
        let sync = self.syncer.sync(&mut engine, all);
        if !sync.errors.is_empty() {
            anyhow::bail!(
                "enforcing a new state in the lab failed: {}",
                sync.errors.join("; ")
            );
        }
        let programmed: Vec<PodKey> = self.syncer.programmed().keys().cloned().collect();
        for key in &programmed {
            if let Some(Err(e)) = self.syncer.revoke_now(key) {
                anyhow::bail!("ending the connections the new state denies in {key}: {e}");
            }
        }
        for (key, rules) in self.syncer.current() {
            let Some(path) = self.netns.get(key) else {
                continue;
            };
            let context = PodContext::new("lab", rules);
            if !self.collector.set_context(path, context.clone()) {
                self.collector
                    .open(path, context)
                    .with_context(|| format!("opening the NFLOG listener of {key}"))?;
            }
        }
        self.engine = engine;
        self.sync = sync;
        Ok(())
    }

    /// Probes every pair the `reach` query names, with real connections, and every pod's
    /// connections to and from the host-network pods the lab stands in for (see [`lab_pods`]).
    pub fn probe(&mut self, ports: &[PortProto]) -> Vec<ObservedProbe> {
        let in_lab: std::collections::BTreeSet<PodKey> = self.netns.keys().cloned().collect();
        let predicted = predict_with(&mut self.engine, ports, &in_lab);
        let unsupported = self.lab.unsupported_ports().to_vec();
        let lab = &self.lab;
        observe(
            predicted,
            |key| lab.pod_netns(key).is_some(),
            &unsupported,
            |specs| lab.probe(specs),
        )
    }

    /// Probes (as [`EnforcedLab::probe`]) and collects the events those probes logged: what
    /// `lab check` prints.
    pub fn report(&mut self, ports: &[PortProto]) -> LabReport {
        let probes = self.probe(ports);
        let events = self.events();
        LabReport::new(self.syncer.backend(), probes, events, self.sync.clone())
    }

    /// The events logged so far (waits until the kernel has been quiet for a moment).
    pub fn events(&self) -> Vec<netwarden_monitor::Event> {
        let sink = Arc::new(MemorySink::new());
        let processor = EventProcessor::new(self.collector.metrics().clone(), sink.clone());
        let by_addr = self.engine.pods_by_address();
        let resolve = |ip: std::net::IpAddr| by_addr.get(&ip).cloned();
        // When no rule in the lab logs, no record can come: take what is queued without
        // waiting for the kernel to go quiet (most of a state's time in `lab check --then`).
        let logs = self.syncer.current().values().any(|r| r.logs());
        let (idle, max_wait) = if logs {
            (Duration::from_millis(400), Duration::from_secs(5))
        } else {
            (Duration::from_millis(1), Duration::from_millis(50))
        };
        processor.drain(&self.records, &resolve, idle, max_wait);
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

/// Probes a lab whose rules someone else enforces (the agent, in `demo --kube`) against the
/// prediction of `inventory`.
pub fn probe_against(
    lab: &Lab,
    inventory: &Inventory,
    ports: &[PortProto],
    engine_options: EngineOptions,
) -> Vec<ObservedProbe> {
    let mut engine = engine_from(inventory, engine_options);
    let predicted = predict(&mut engine, ports);
    let unsupported = lab.unsupported_ports().to_vec();
    observe(
        predicted,
        |key| lab.pod_netns(key).is_some(),
        &unsupported,
        |specs| lab.probe(specs),
    )
}

/// What `reach` predicts for every pod pair on every network of `inventory`, for `ports`.
pub fn prediction(
    inventory: &Inventory,
    ports: &[PortProto],
    engine_options: EngineOptions,
) -> Vec<Probe> {
    predict(&mut engine_from(inventory, engine_options), ports)
}

/// The pods a lab builds a netns for: every pod-network pod, and each host-network pod whose
/// addresses (its node's) no other pod of the lab has. A host-network pod's netns stands for
/// its node: it gets no rules (host-network pods are never subjects, SPEC 8), and traffic to it
/// is decided by the source pod's egress alone — as on a node, where it leaves the pod's netns
/// for the host's. That is how `nodes` peers (a Node's `status.addresses`) are probed for real.
/// Two host-network pods of one node share its address: only the first stands for it.
pub fn lab_pods(inventory: &Inventory) -> Vec<netwarden_engine::Pod> {
    let mut pods: Vec<_> = inventory
        .pods
        .iter()
        .filter(|p| !p.host_network)
        .cloned()
        .collect();
    let mut taken: std::collections::BTreeSet<std::net::IpAddr> = pods
        .iter()
        .flat_map(|p| &p.interfaces)
        .flat_map(|i| i.ips.iter().copied())
        .collect();
    for host in inventory.pods.iter().filter(|p| p.host_network) {
        let ips: Vec<_> = host.interfaces.iter().flat_map(|i| &i.ips).collect();
        if !ips.is_empty() && ips.iter().all(|ip| !taken.contains(ip)) {
            taken.extend(ips.into_iter().copied());
            pods.push(host.clone());
        }
    }
    pods
}

/// [`predict`] plus the probes to and from the host-network pods in `in_lab` (`reach` leaves
/// host-network pods out: they have no policy side; the lab gives them one netns each).
fn predict_with(
    engine: &mut Engine,
    ports: &[PortProto],
    in_lab: &std::collections::BTreeSet<PodKey>,
) -> Vec<Probe> {
    let rules = engine.all_pod_rules();
    let query = ReachQuery {
        ports: ports.to_vec(),
        network: None,
        from: PodSelectorArg::All,
        to: PodSelectorArg::All,
    };
    let taking_part = rules.values().filter(|r| {
        engine
            .pod(&r.pod)
            .is_some_and(|p| !p.host_network || in_lab.contains(&r.pod))
    });
    Reach::over(taking_part, &query).probes().collect()
}

/// What `reach` predicts for every pod pair on every network, for `ports`.
fn predict(engine: &mut Engine, ports: &[PortProto]) -> Vec<Probe> {
    predict_with(engine, ports, &std::collections::BTreeSet::new())
}

/// Sends a real connection for every predicted probe whose pods are in the lab (`in_lab`) and
/// whose port can be served (not in `unsupported`), through `run`; sets what happened beside
/// each prediction.
///
/// A probe that timed out is made once more (and only once): on a loaded machine a SYN or an
/// answer can be late past the probe's timeout, while a real silent drop times out again, so
/// the second try hides no wrong verdict — it only keeps load from passing for a drop.
fn observe(
    predicted: Vec<Probe>,
    in_lab: impl Fn(&PodKey) -> bool,
    unsupported: &[(u16, Protocol)],
    run: impl Fn(&[ProbeSpec]) -> Vec<netwarden_lab::ProbeOutcome>,
) -> Vec<ObservedProbe> {
    let probed: Vec<bool> = predicted
        .iter()
        .map(|p| !unsupported.contains(&(p.port, p.protocol)) && in_lab(&p.from) && in_lab(&p.to))
        .collect();
    let specs: Vec<ProbeSpec> = predicted
        .iter()
        .zip(&probed)
        .filter(|(_, probed)| **probed)
        .map(|(p, _)| ProbeSpec {
            from: p.from.clone(),
            to: p.to.clone(),
            src_ip: Some(p.src),
            dst_ip: p.dst,
            port: p.port,
            protocol: p.protocol,
        })
        .collect();
    let mut outcomes = run(&specs);
    let timed_out: Vec<usize> = (0..outcomes.len().min(specs.len()))
        .filter(|&i| outcomes[i].detail == ProbeDetail::Timeout)
        .collect();
    if !timed_out.is_empty() {
        let again: Vec<ProbeSpec> = timed_out.iter().map(|&i| specs[i].clone()).collect();
        for (i, outcome) in timed_out.into_iter().zip(run(&again)) {
            outcomes[i] = outcome;
        }
    }
    let mut outcomes = outcomes.into_iter();
    predicted
        .into_iter()
        .zip(probed)
        .map(|(p, probed)| {
            if !probed {
                return ObservedProbe::not_probed(p);
            }
            match outcomes.next() {
                Some(o) => ObservedProbe::with_outcome(p, o.detail, o.elapsed),
                // Fail closed: a probe that was asked for and not made is not a pass.
                None => ObservedProbe::with_outcome(
                    p,
                    ProbeDetail::Error("the prober returned no outcome".into()),
                    Duration::ZERO,
                ),
            }
        })
        .collect()
}

impl LabReport {
    pub fn new(
        backend: Backend,
        probes: Vec<ObservedProbe>,
        events: Vec<netwarden_monitor::Event>,
        sync: SyncReport,
    ) -> LabReport {
        LabReport {
            backend: backend.as_str(),
            mismatches: probes.iter().filter(|p| p.mismatch.is_some()).count(),
            probes,
            events,
            sync,
        }
    }
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
    let report = lab.report(&options.ports);
    lab.down()?;
    Ok(report)
}

/// `lab check -f PATH... --then STATE...`: one topology, several states. The first state is
/// `paths`; each `STATE` (file or directory) is laid over `paths` as `diff --with` lays changes
/// (an object replaces the one of the same kind, namespace and name; `netwarden.io/delete:
/// "true"` deletes it). The lab is built from the first state's pods, which every state must
/// keep; each state is enforced in turn and probed. One report per state, in order.
pub fn check_states(
    paths: &[PathBuf],
    then: &[PathBuf],
    load: &LoadOptions,
    options: &LabCheckOptions,
) -> Result<Vec<LabReport>> {
    let first = netwarden_manifest::load_paths(paths, load);
    crate::inventory::report_problems(&first, false);
    let mut options = options.clone();
    if options.ports.is_empty() {
        options.ports = default_ports(&first);
    }
    // Every state is read before anything is built: a bad file fails fast.
    let mut states = Vec::with_capacity(then.len());
    for path in then {
        let layered = netwarden_manifest::layer_paths(paths, std::slice::from_ref(path), load);
        if let Some(problem) = layered.unmatched_deletions.first() {
            anyhow::bail!("state {}: {problem}", path.display());
        }
        crate::inventory::report_problems(&layered.changed, false);
        states.push(layered.changed);
    }
    let mut lab = EnforcedLab::up(&first, &options)?;
    let result = (|| {
        let mut reports = vec![lab.report(&options.ports)];
        for (path, state) in then.iter().zip(&states) {
            lab.enforce(state)
                .with_context(|| format!("state {}", path.display()))?;
            reports.push(lab.report(&options.ports));
        }
        Ok(reports)
    })();
    lab.down()?;
    result
}

/// The readable form of a lab run: one matrix per (network, port, family) where each cell is
/// what really happened (`.` connected, `X` refused, `T` timed out, `U` unreachable, `E` the
/// probe failed, `?` not probed), `!` marking a disagreement with the prediction; then every
/// mismatch, saying how, and the totals.
pub fn render_text(report: &LabReport) -> String {
    use std::fmt::Write;
    type Matrix<'a> = (&'a NetworkId, u16, Protocol, Family);
    let mut groups: BTreeMap<Matrix<'_>, Vec<&ObservedProbe>> = BTreeMap::new();
    for p in &report.probes {
        let q = &p.predicted;
        groups
            .entry((&q.network, q.port, q.protocol, q.family))
            .or_default()
            .push(p);
    }
    let mut out = String::new();
    for ((network, port, protocol, family), probes) in &groups {
        let mut names: Vec<&PodKey> = probes
            .iter()
            .flat_map(|p| [&p.predicted.from, &p.predicted.to])
            .collect();
        names.sort();
        names.dedup();
        let names: Vec<(&PodKey, String)> = names.into_iter().map(|k| (k, k.to_string())).collect();
        let width = names.iter().map(|(_, n)| n.len()).max().unwrap_or(1);
        let cell: BTreeMap<(&PodKey, &PodKey), &ObservedProbe> = probes
            .iter()
            .map(|p| ((&p.predicted.from, &p.predicted.to), *p))
            .collect();
        let family = match family {
            Family::Ipv4 => "ipv4",
            Family::Ipv6 => "ipv6",
        };
        let _ = writeln!(
            out,
            "network {network}, {port}/{protocol}, {family}  (rows: from, columns: to)"
        );
        let _ = write!(out, "{:width$}", "");
        for (_, n) in &names {
            let _ = write!(out, " {n:>width$}");
        }
        out.push('\n');
        for (from, from_name) in &names {
            let _ = write!(out, "{from_name:width$}");
            for (to, _) in &names {
                let mark = match cell.get(&(*from, *to)) {
                    None => "-".to_string(),
                    Some(p) => {
                        let seen = match &p.detail {
                            None => "?",
                            Some(ProbeDetail::Connected) => ".",
                            Some(ProbeDetail::Refused) => "X",
                            Some(ProbeDetail::Timeout) => "T",
                            Some(ProbeDetail::Unreachable) => "U",
                            Some(ProbeDetail::Error(_)) => "E",
                        };
                        match p.mismatch {
                            Some(_) => format!("!{seen}"),
                            None => seen.to_string(),
                        }
                    }
                };
                let _ = write!(out, " {mark:>width$}");
            }
            out.push('\n');
        }
        out.push('\n');
    }
    if !groups.is_empty() {
        let _ = writeln!(
            out,
            ". connected   X refused   T timed out   U unreachable   E probe failed   ? not probed   ! differs from the prediction\n"
        );
    }
    for p in &report.probes {
        let (Some(mismatch), Some(detail)) = (p.mismatch, &p.detail) else {
            continue;
        };
        let q = &p.predicted;
        let _ = writeln!(
            out,
            "MISMATCH {} -> {} {}/{} on {} ({} -> {}): {mismatch} [{detail}]",
            q.from, q.to, q.port, q.protocol, q.network, q.src, q.dst,
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
    /// Pod → netns path; in the file, an object keyed by `ns/name`.
    #[serde(with = "netns_by_pod")]
    pub netns: BTreeMap<PodKey, PathBuf>,
}

/// [`LabSession::netns`] in the state file: keys written and read as `ns/name`.
mod netns_by_pod {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use netwarden_engine::PodKey;
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::cli_args::PodSelectorArg;

    pub fn serialize<S: Serializer>(
        netns: &BTreeMap<PodKey, PathBuf>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_map(netns.iter().map(|(key, path)| (key.to_string(), path)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<PodKey, PathBuf>, D::Error> {
        BTreeMap::<String, PathBuf>::deserialize(d)?
            .into_iter()
            .map(|(key, path)| match key.parse::<PodSelectorArg>() {
                Ok(PodSelectorArg::Pod(pod)) => Ok((pod, path)),
                _ => Err(D::Error::custom(format!(
                    "lab state: pod {key:?} is not ns/name"
                ))),
            })
            .collect()
    }
}

impl EnforcedLab {
    pub fn session(&self) -> LabSession {
        LabSession {
            pid: std::process::id(),
            backend: self.syncer.backend().as_str().to_string(),
            state: self.lab.state().clone(),
            netns: self.netns.clone(),
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
    let sctp: Vec<(u16, Protocol)> = ports
        .iter()
        .filter(|p| p.protocol == Protocol::Sctp)
        .map(|p| (p.port, p.protocol))
        .collect();
    let probes = observe(
        predicted,
        |key| session.netns.contains_key(key),
        &sctp,
        |specs| {
            netwarden_lab::probe_paths(
                &session.netns,
                specs,
                &netwarden_lab::ProbeConfig::default(),
            )
        },
    );
    let backend = if session.backend == "iptables" {
        Backend::Iptables
    } else {
        Backend::Nft
    };
    Ok(LabReport::new(
        backend,
        probes,
        Vec::new(),
        SyncReport::default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::testing::{netpol, pod, selector};
    use netwarden_engine::{Mode, PolicyKind};
    use netwarden_lab::ProbeOutcome;

    #[test]
    fn only_a_connection_confirms_an_allow_and_only_a_refusal_a_deny() {
        use ProbeDetail as D;
        let error = D::Error("bind source address: Cannot assign requested address".into());
        let cases = [
            (true, D::Connected, None),
            (true, D::Refused, Some(Mismatch::AllowedButRefused)),
            (true, D::Timeout, Some(Mismatch::AllowedButTimedOut)),
            (true, D::Unreachable, Some(Mismatch::AllowedButUnreachable)),
            (true, error.clone(), Some(Mismatch::AllowedButProbeFailed)),
            (false, D::Refused, None),
            (false, D::Connected, Some(Mismatch::DeniedButConnected)),
            (false, D::Timeout, Some(Mismatch::DeniedButTimedOut)),
            (false, D::Unreachable, Some(Mismatch::DeniedButUnreachable)),
            (false, error, Some(Mismatch::DeniedButProbeFailed)),
        ];
        for (allowed, detail, want) in cases {
            assert_eq!(Mismatch::of(allowed, &detail), want, "{allowed} {detail}");
        }
        assert_eq!(
            Mismatch::DeniedButTimedOut.to_string(),
            "denied but timed out (expected a refusal)"
        );
        assert_eq!(
            serde_json::to_value(Mismatch::DeniedButTimedOut).unwrap(),
            "denied-but-timed-out"
        );
    }

    /// x/a, x/b on the primary network (IPv4); x/b isolated for ingress: nothing reaches it
    /// but itself. `monitor`: the policy is only monitored, so a -> b is a would-deny.
    fn predicted(monitor: bool, ports: &[PortProto]) -> Vec<Probe> {
        let mut engine = Engine::new(EngineOptions::default());
        engine.set_pod(pod("x", "a", &[("app", "a")], &["10.0.0.1"]));
        engine.set_pod(pod("x", "b", &[("app", "b")], &["10.0.0.2"]));
        let mut policy = netpol(
            "x",
            "b-closed",
            selector(&[("app", "b")]),
            Some(vec![]),
            None,
        );
        if monitor {
            policy.mode = Mode::Monitor;
        }
        assert_eq!(policy.kind, PolicyKind::NetworkPolicy);
        engine.set_policy(policy);
        predict(&mut engine, ports)
    }

    /// Answers each probe as a kernel with netwarden's rules would (`.allowed`: connected, else
    /// refused), except `dropped` pairs, which time out.
    fn kernel<'a>(
        predicted: &'a [Probe],
        dropped: &'a [(&'a str, &'a str)],
    ) -> impl Fn(&[ProbeSpec]) -> Vec<ProbeOutcome> + 'a {
        move |specs| {
            specs
                .iter()
                .map(|spec| {
                    let p = predicted
                        .iter()
                        .find(|p| p.from == spec.from && p.to == spec.to && p.port == spec.port)
                        .expect("a spec of a prediction");
                    let pair = (spec.from.to_string(), spec.to.to_string());
                    let detail = if dropped
                        .iter()
                        .any(|(f, t)| (*f, *t) == (pair.0.as_str(), pair.1.as_str()))
                    {
                        ProbeDetail::Timeout
                    } else if p.allowed {
                        ProbeDetail::Connected
                    } else {
                        ProbeDetail::Refused
                    };
                    ProbeOutcome {
                        spec: spec.clone(),
                        connected: detail == ProbeDetail::Connected,
                        detail,
                        elapsed: Duration::from_millis(1),
                    }
                })
                .collect()
        }
    }

    const TCP_80: PortProto = PortProto {
        port: 80,
        protocol: Protocol::Tcp,
    };

    #[test]
    fn a_refused_deny_matches_and_a_dropped_deny_does_not() {
        let predicted = predicted(false, &[TCP_80]);
        let a_to_b =
            |p: &&ObservedProbe| p.predicted.from.name == "a" && p.predicted.to.name == "b";
        let refused = observe(predicted.clone(), |_| true, &[], kernel(&predicted, &[]));
        assert_eq!(refused.len(), 4);
        assert!(refused.iter().all(|p| p.mismatch.is_none()), "{refused:#?}");
        let a_b = refused.iter().find(a_to_b).unwrap();
        assert!(!a_b.predicted.allowed);
        assert_eq!(a_b.observed, Some(false));

        let dropped = observe(
            predicted.clone(),
            |_| true,
            &[],
            kernel(&predicted, &[("x/a", "x/b")]),
        );
        let flagged: Vec<_> = dropped.iter().filter(|p| p.mismatch.is_some()).collect();
        assert_eq!(flagged.len(), 1, "{dropped:#?}");
        assert!(a_to_b(&flagged[0]));
        assert_eq!(flagged[0].mismatch, Some(Mismatch::DeniedButTimedOut));
        // Still "not connected": `observed` keeps its meaning.
        assert_eq!(flagged[0].observed, Some(false));
    }

    #[test]
    fn a_timeout_is_probed_once_more_and_a_drop_stays_a_mismatch() {
        let predicted = predicted(false, &[TCP_80]);
        let a_to_b = |spec: &ProbeSpec| spec.from.name == "a" && spec.to.name == "b";
        // a -> b is dropped (times out every time); every other probe times out only the first
        // time it is made, as a SYN lost on a loaded machine.
        let asked = std::cell::RefCell::new(Vec::<ProbeSpec>::new());
        let late_once = |specs: &[ProbeSpec]| {
            let kernel = kernel(&predicted, &[]);
            let mut outcomes = kernel(specs);
            for o in &mut outcomes {
                let first = !asked.borrow().contains(&o.spec);
                if a_to_b(&o.spec) || first {
                    o.detail = ProbeDetail::Timeout;
                    o.connected = false;
                }
            }
            asked.borrow_mut().extend(specs.iter().cloned());
            outcomes
        };
        let observed = observe(predicted.clone(), |_| true, &[], late_once);
        let flagged: Vec<_> = observed.iter().filter_map(|p| p.mismatch).collect();
        assert_eq!(flagged, [Mismatch::DeniedButTimedOut], "{observed:#?}");
        // Each probe was made twice (all timed out first), and no more.
        assert_eq!(asked.borrow().len(), 2 * observed.len());
    }

    #[test]
    fn a_would_deny_must_connect() {
        let predicted = predicted(true, &[TCP_80]);
        let a_b = predicted
            .iter()
            .find(|p| p.from.name == "a" && p.to.name == "b")
            .unwrap();
        assert!(a_b.allowed && !a_b.staged_allowed, "{a_b:?}");
        let observed = observe(predicted.clone(), |_| true, &[], kernel(&predicted, &[]));
        assert!(
            observed.iter().all(|p| p.mismatch.is_none()),
            "{observed:#?}"
        );
        // Monitor mode must not change traffic: a refused would-deny is a mismatch.
        let refused_would_deny = |specs: &[ProbeSpec]| {
            specs
                .iter()
                .map(|spec| {
                    let detail = if spec.from.name == "a" && spec.to.name == "b" {
                        ProbeDetail::Refused
                    } else {
                        ProbeDetail::Connected
                    };
                    ProbeOutcome {
                        spec: spec.clone(),
                        connected: detail == ProbeDetail::Connected,
                        detail,
                        elapsed: Duration::ZERO,
                    }
                })
                .collect()
        };
        let observed = observe(predicted, |_| true, &[], refused_would_deny);
        let flagged: Vec<_> = observed.iter().filter_map(|p| p.mismatch).collect();
        assert_eq!(flagged, [Mismatch::AllowedButRefused]);
    }

    #[test]
    fn unprobeable_is_unobserved_and_a_missing_outcome_fails_closed() {
        let sctp = PortProto {
            port: 80,
            protocol: Protocol::Sctp,
        };
        let predicted = predicted(false, &[TCP_80, sctp]);
        let outside = PodKey::new("x", "b");
        // SCTP is unsupported and x/b is not in the lab: only x/a -> x/a over TCP is probed,
        // and the prober answers nothing.
        let observed = observe(
            predicted,
            |key| *key != outside,
            &[(80, Protocol::Sctp)],
            |specs| {
                assert_eq!(specs.len(), 1, "{specs:?}");
                assert_eq!(specs[0].protocol, Protocol::Tcp);
                Vec::new()
            },
        );
        let probed: Vec<_> = observed.iter().filter(|p| p.observed.is_some()).collect();
        assert_eq!(probed.len(), 1);
        assert_eq!(probed[0].mismatch, Some(Mismatch::AllowedButProbeFailed));
        for p in observed.iter().filter(|p| p.observed.is_none()) {
            let json = serde_json::to_value(p).unwrap();
            assert_eq!(json["observed"], serde_json::Value::Null);
            assert!(json.get("mismatch").is_none() && json.get("detail").is_none());
        }
    }

    /// Host-network pods get a netns standing for their node, unless another pod of the lab
    /// has their address (a second host-network pod of the same node): pod-network pods first.
    #[test]
    fn lab_pods_stand_host_network_pods_in_for_their_node_once() {
        let host = |name: &str, ip: &str| {
            let mut p = pod("h", name, &[], &[ip]);
            p.host_network = true;
            p
        };
        let mut no_address = host("no-address", "10.0.0.9");
        no_address.interfaces.clear();
        let inventory = Inventory {
            pods: vec![
                host("node-1-a", "172.18.0.2"),
                pod("x", "a", &[], &["10.0.0.1"]),
                host("node-1-b", "172.18.0.2"),
                host("node-2", "172.18.0.3"),
                host("clashes-with-a", "10.0.0.1"),
                no_address,
            ],
            ..Inventory::default()
        };
        let names: Vec<String> = lab_pods(&inventory)
            .iter()
            .map(|p| p.key.to_string())
            .collect();
        assert_eq!(names, ["x/a", "h/node-1-a", "h/node-2"]);
    }

    #[test]
    fn lab_session_keys_pods_as_ns_name() {
        let session = LabSession {
            pid: 42,
            backend: "nft".into(),
            state: netwarden_lab::LabState {
                instance: "nwlab-abcdef".into(),
                fabric: "nwlab-abcdef-f".into(),
                pods: Vec::new(),
            },
            netns: BTreeMap::from([
                (
                    PodKey::new("x", "a"),
                    PathBuf::from("/run/netns/nwlab-abcdef-0"),
                ),
                (
                    PodKey::new("y", "b-1"),
                    PathBuf::from("/run/netns/nwlab-abcdef-1"),
                ),
            ]),
        };
        let json = serde_json::to_value(&session).unwrap();
        assert_eq!(json["netns"]["x/a"], "/run/netns/nwlab-abcdef-0");
        assert_eq!(json["netns"]["y/b-1"], "/run/netns/nwlab-abcdef-1");
        let back: LabSession = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back.netns, session.netns);
        let mut bad = json;
        bad["netns"] = serde_json::json!({"no-slash": "/run/netns/x"});
        let err = serde_json::from_value::<LabSession>(bad).unwrap_err();
        assert!(err.to_string().contains("no-slash"), "{err}");
    }
}
