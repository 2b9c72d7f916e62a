//! Reconciliation: from the engine's rules to the kernel, one pod netns at a time.
//!
//! Only the pods the engine names dirty are rendered; a ruleset identical to the last one
//! applied is skipped by the dataplane; a pod no longer isolated (or gone) has everything
//! netwarden owns removed from its netns. A failed apply makes the dataplane forget that netns,
//! so the next sync re-applies it in full.
//!
//! Fail closed: a pod whose rules cannot be rendered exactly (an interface the backend cannot
//! match) is refused — reported as an error, retried, and its netns keeps what it had.
//!
//! Revocation (SPEC 5, `--established`): with [`Established::Revoke`], every netns whose
//! rules an apply changed has its live connections judged against the new rules, and those
//! they deny are ended ([`Dataplane::revoke_connections`]), all such netns side by side: right
//! after the applies, or (the agent) a short delay after a netns's first change, coalescing
//! the changes meanwhile, and only as widely as the change can deny
//! ([`crate::revocations`]). A revocation that fails is logged and reported; it never undoes
//! or holds back the apply. A removal (the pod no longer isolated) and an unchanged ruleset
//! revoke nothing.
//!
//! [`Syncer`] is generic over the [`Dataplane`], so a ruleset is always the backend's own type;
//! the commands hold it as a [`Reconciler`] chosen once from `--backend` ([`for_backend`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use netwarden_dataplane::apply::{run_parallel, APPLY_WORKERS};
use netwarden_dataplane::conntrack::Revoked;
use netwarden_dataplane::tamper::{Difference, VerifyScope};
use netwarden_dataplane::{
    ApplyError, ApplyOutcome, Backend, Dataplane, EvidenceCounters, IptablesDataplane, NftDataplane,
};
use netwarden_engine::revocation::RevocationScope;
use netwarden_engine::{Engine, PodKey, PodRules};
use netwarden_render::RenderOptions;

use crate::revocations::{Pass, Revocations};

/// What happens to live connections that an apply denies (`--established`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Established {
    /// They are ended (SPEC 5, the default of the agent).
    #[default]
    Revoke,
    /// They go on: established traffic is accepted before any rule (what other
    /// implementations do).
    Keep,
}

/// What one sync did.
#[derive(Debug, Default, Clone)]
pub struct SyncReport {
    pub pods_considered: usize,
    pub applied: usize,
    pub unchanged: usize,
    pub removed: usize,
    pub skipped_no_netns: usize,
    /// The isolated pods behind `skipped_no_netns`: their netns may become known later (the
    /// caller retries them, backing off).
    pub without_netns: BTreeSet<PodKey>,
    pub errors: Vec<String>,
    /// The pods behind `errors`: nothing marks them dirty again, so the caller retries them
    /// (their netns may appear later, or the failure may pass).
    pub failed: BTreeSet<PodKey>,
    /// Connections revoked, per pod whose netns had any (`--established=revoke`).
    pub revoked: BTreeMap<PodKey, usize>,
    /// Revocations that failed (the applies stand; logged, never retried on their own).
    pub revoke_errors: Vec<String>,
    pub duration: Duration,
}

/// What revocation passes did.
#[derive(Debug, Default)]
pub struct RevocationReport {
    /// Connections revoked, per pod whose netns had any.
    pub revoked: BTreeMap<PodKey, usize>,
    /// Passes that failed (the applies stand; logged, the next pass judges everything).
    pub errors: Vec<String>,
}

impl std::fmt::Display for SyncReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sync: {} pod(s) considered, {} applied, {} unchanged, {} removed, {} without netns, {} error(s) in {:.1} ms",
            self.pods_considered,
            self.applied,
            self.unchanged,
            self.removed,
            self.skipped_no_netns,
            self.errors.len(),
            self.duration.as_secs_f64() * 1e3
        )
    }
}

/// Keeps pod netns in step with the engine, whatever the backend.
pub trait Reconciler: Send {
    fn backend(&self) -> Backend;

    /// Recomputes and applies `pods` (typically `engine.take_dirty()`).
    fn sync(&mut self, engine: &mut Engine, pods: BTreeSet<PodKey>) -> SyncReport;

    /// Pods whose rules are programmed, with their netns.
    fn programmed(&self) -> &BTreeMap<PodKey, PathBuf>;

    /// The rules in force per pod (the monitor resolves log prefixes through them).
    fn current(&self) -> &BTreeMap<PodKey, PodRules>;

    /// Also remove netwarden's rules from pods found not isolated that this process never
    /// programmed: for the first sync after a restart, so stale rules go.
    fn set_converge_removals(&mut self, on: bool);

    /// The programmed pods whose netns path now names another namespace (a sandbox restart)
    /// or none: their next sync applies everything again.
    fn netns_changed(&mut self) -> BTreeSet<PodKey>;

    /// The agent's stop flag: a sync under way applies to no further netns once it is set.
    fn set_stop(&mut self, stop: Arc<AtomicBool>);

    /// What happens to live connections an apply denies (off, i.e. `Keep`, until set).
    fn set_established(&mut self, established: Established);

    /// With [`Established::Revoke`], ends the live connections of programmed pod `pod` that
    /// its rules in force deny: after a tamper repair, for what was opened while the rules
    /// were gone. `None`: nothing to do (keep, or not programmed); else the number revoked.
    fn revoke_now(&mut self, pod: &PodKey) -> Option<Result<usize, String>>;

    /// Revocation passes run this long after a netns's first unjudged change, coalescing the
    /// changes meanwhile ([`crate::revocations`]); zero (until set): right after each sync.
    fn set_revocation_delay(&mut self, delay: Duration);

    /// Runs the revocation passes due at `now` (every one owed when `all`: the agent stops),
    /// side by side; what they revoked and what failed.
    fn revoke_due(&mut self, now: Instant, all: bool) -> RevocationReport;

    /// When the next revocation pass is due.
    fn next_revocation(&self) -> Option<Instant>;

    /// Removes netwarden's rules from every netns it programmed (used by the lab and tests).
    fn remove_all(&mut self) -> Vec<String>;

    /// What netwarden owns in `netns` as the kernel lists it.
    fn read_back(&self, netns: &Path) -> Result<Option<String>, ApplyError>;

    /// Compares what was applied to `netns` with the kernel (see `Dataplane::verify`).
    fn verify(&self, netns: &Path, scope: &VerifyScope) -> Result<Vec<Difference>, ApplyError>;

    /// Puts back what was applied to `netns` (see `Dataplane::repair`).
    fn repair(&mut self, netns: &Path) -> Result<(), ApplyError>;

    /// The evidence counters of programmed pods (see `Dataplane::read_counters`), in their
    /// order, side by side where the dataplane can; `None` for a pod not programmed.
    fn read_counters_many(
        &self,
        pods: &[PodKey],
    ) -> Vec<Option<Result<EvidenceCounters, ApplyError>>>;
}

/// The reconciler of `backend`, with its dataplane.
pub fn for_backend(backend: Backend, options: RenderOptions) -> Box<dyn Reconciler> {
    match backend {
        Backend::Nft => Box::new(Syncer::new(NftDataplane::new(options))),
        Backend::Iptables => Box::new(Syncer::new(IptablesDataplane::new(options))),
    }
}

/// The reconciler over one dataplane.
pub struct Syncer<D: Dataplane> {
    pub dataplane: D,
    /// Where each pod's rules went last time (to remove them when the pod goes).
    programmed: BTreeMap<PodKey, PathBuf>,
    /// The rules in force per pod: updated only when they reached the kernel.
    current: BTreeMap<PodKey, PodRules>,
    converge_removals: bool,
    established: Established,
    /// The revocation passes owed and what each netns was last judged by.
    revocations: Revocations,
}

impl<D: Dataplane> Syncer<D> {
    pub fn new(dataplane: D) -> Self {
        Syncer {
            dataplane,
            programmed: BTreeMap::new(),
            current: BTreeMap::new(),
            converge_removals: false,
            // Revocation enters connection tables: only an agent asks for it.
            established: Established::Keep,
            revocations: Revocations::new(Duration::ZERO),
        }
    }

    /// Runs `passes` side by side (see [`crate::revocations`] for what each judges); the
    /// outcome goes to the log and the report.
    fn run_passes(&mut self, passes: Vec<Pass>) -> RevocationReport {
        let mut report = RevocationReport::default();
        if passes.is_empty() {
            return report;
        }
        let results = run_parallel(&passes, APPLY_WORKERS, |pass| {
            D::revoke_connections(&pass.netns, &pass.rules, &pass.scope)
        });
        for (pass, result) in passes.into_iter().zip(results) {
            self.revocations
                .done(&pass.netns, &pass.rules, result.is_ok());
            let key = pass.pod;
            match result {
                Ok(Revoked { flows, deleted, .. }) if !flows.is_empty() => {
                    tracing::info!(
                        "{key}: revoked {} live connection(s) the new rules deny in {} ({deleted} entries deleted)",
                        flows.len(),
                        pass.netns.display()
                    );
                    for flow in &flows {
                        tracing::debug!("{key}: revoked {flow}");
                    }
                    report.revoked.insert(key, flows.len());
                }
                Ok(_) => {}
                // The pod is gone, its connections with it.
                Err(e) if e.netns_gone() => {}
                Err(e) => report
                    .errors
                    .push(format!("{key}: revoking denied connections: {e}")),
            }
        }
        report
    }

    /// Removes what is ours from `netns`; a netns that is gone counts as clean.
    fn remove_from(&mut self, key: &PodKey, netns: &Path, report: &mut SyncReport) -> bool {
        // Open from now on: connections may start that no rule judged.
        self.revocations.forget(netns);
        match self.dataplane.remove(netns) {
            Ok(()) => true,
            Err(e) if e.netns_gone() => true,
            Err(e) => {
                report.errors.push(format!("{key}: {e}"));
                report.failed.insert(key.clone());
                false
            }
        }
    }
}

impl<D: Dataplane> Reconciler for Syncer<D> {
    fn backend(&self) -> Backend {
        D::BACKEND
    }

    fn sync(&mut self, engine: &mut Engine, pods: BTreeSet<PodKey>) -> SyncReport {
        let start = Instant::now();
        let mut report = SyncReport::default();
        let mut batch: Vec<(PodKey, PathBuf, PodRules, D::Ruleset)> = Vec::new();
        let computed: Vec<(PodKey, Option<PodRules>)> = pods
            .into_iter()
            .map(|key| {
                let rules = engine.pod_rules(&key);
                (key, rules)
            })
            .collect();
        // The netns that keep rules after this sync: those of the pods synced now that need
        // them, and those of the programmed pods not synced now. A pod leaving a netns another
        // pod holds from now on (a locked-down netns handed to its owner, say) must not
        // remove the table the other's apply replaces: that would open it in between.
        let mut held: BTreeSet<PathBuf> = computed
            .iter()
            .filter_map(|(_, rules)| rules.as_ref().filter(|r| r.needs_rules()))
            .filter_map(|r| r.netns.as_ref().map(PathBuf::from))
            .collect();
        held.extend(
            self.programmed
                .iter()
                .filter(|(key, _)| !computed.iter().any(|(k, _)| k == *key))
                .map(|(_, netns)| netns.clone()),
        );
        for (key, rules) in computed {
            report.pods_considered += 1;
            let netns = rules
                .as_ref()
                .and_then(|r| r.netns.clone())
                .map(PathBuf::from);
            // The pod left its old netns (deleted, or recreated elsewhere): clean the old one.
            if let Some(old) = self.programmed.get(&key).cloned() {
                let left =
                    netns.as_ref() != Some(&old) || rules.as_ref().is_none_or(|r| !r.needs_rules());
                let handed_over = netns.as_ref() != Some(&old) && held.contains(&old);
                if left && (handed_over || self.remove_from(&key, &old, &mut report)) {
                    report.removed += 1;
                    self.programmed.remove(&key);
                }
            }
            let Some(rules) = rules else {
                self.current.remove(&key);
                continue;
            };
            // Isolation or learn mode gives a pod rules; otherwise its netns holds none.
            if !rules.needs_rules() {
                if let (true, Some(netns)) = (self.converge_removals, &netns) {
                    if !held.contains(netns) {
                        self.remove_from(&key, netns, &mut report);
                    }
                }
                self.current.insert(key, rules);
                continue;
            }
            let Some(netns) = netns else {
                report.skipped_no_netns += 1;
                report.without_netns.insert(key);
                continue;
            };
            match self.dataplane.render(&rules) {
                Ok(ruleset) => batch.push((key, netns, rules, ruleset)),
                // Refused: nothing is applied, the netns keeps what it had.
                Err(e) => {
                    report.errors.push(format!("refused: {e}"));
                    report.failed.insert(key);
                }
            }
        }
        // Render first, then apply everything at once: the backends overlap the applies'
        // waits on the kernel.
        let items: Vec<(PathBuf, D::Ruleset)> = batch
            .iter()
            .map(|(_, netns, _, r)| (netns.clone(), r.clone()))
            .collect();
        if !items.is_empty() {
            tracing::debug!("applying {} pod netns", items.len());
        }
        let results = self.dataplane.apply_many(&items);
        for ((key, netns, rules, _), result) in batch.into_iter().zip(results) {
            match result {
                Ok(outcome) => {
                    match outcome {
                        ApplyOutcome::Applied => {
                            report.applied += 1;
                            if self.established == Established::Revoke {
                                self.revocations.changed(
                                    key.clone(),
                                    netns.clone(),
                                    rules.clone(),
                                    Instant::now(),
                                );
                            }
                        }
                        ApplyOutcome::Unchanged => report.unchanged += 1,
                        ApplyOutcome::Removed => report.removed += 1,
                    }
                    self.programmed.insert(key.clone(), netns);
                    self.current.insert(key, rules);
                }
                Err(e) => {
                    self.revocations.forget(&netns);
                    self.dataplane.forget(&netns);
                    report.errors.push(format!("{key}: {e}"));
                    report.failed.insert(key);
                }
            }
        }
        // Without a delay (the lab, tests), the passes run now and report here.
        if self.revocations.delay().is_zero() {
            let revoked = self.revoke_due(Instant::now(), false);
            report.revoked = revoked.revoked;
            report.revoke_errors = revoked.errors;
        }
        report.duration = start.elapsed();
        report
    }

    fn programmed(&self) -> &BTreeMap<PodKey, PathBuf> {
        &self.programmed
    }

    fn current(&self) -> &BTreeMap<PodKey, PodRules> {
        &self.current
    }

    fn set_converge_removals(&mut self, on: bool) {
        self.converge_removals = on;
    }

    fn set_stop(&mut self, stop: Arc<AtomicBool>) {
        self.dataplane.set_stop(stop);
    }

    fn set_established(&mut self, established: Established) {
        self.established = established;
    }

    fn revoke_now(&mut self, pod: &PodKey) -> Option<Result<usize, String>> {
        if self.established != Established::Revoke {
            return None;
        }
        let netns = self.programmed.get(pod)?.clone();
        let rules = self.current.get(pod)?.clone();
        // Whatever opened meanwhile (a tamper) was judged by nothing: everything.
        let result = D::revoke_connections(&netns, &rules, &RevocationScope::Everything);
        self.revocations.done(&netns, &rules, result.is_ok());
        match result {
            Ok(revoked) => Some(Ok(revoked.flows.len())),
            Err(e) => {
                if e.netns_gone() {
                    return None;
                }
                Some(Err(format!("{pod}: revoking denied connections: {e}")))
            }
        }
    }

    fn set_revocation_delay(&mut self, delay: Duration) {
        self.revocations = Revocations::new(delay);
    }

    fn revoke_due(&mut self, now: Instant, all: bool) -> RevocationReport {
        let passes = self.revocations.due(now, all);
        self.run_passes(passes)
    }

    fn next_revocation(&self) -> Option<Instant> {
        self.revocations.next_due()
    }

    fn netns_changed(&mut self) -> BTreeSet<PodKey> {
        let changed: BTreeSet<PathBuf> = self.dataplane.changed_netns().into_iter().collect();
        // Another namespace at the same path: its connections were judged by nothing.
        for netns in &changed {
            self.revocations.forget(netns);
        }
        self.programmed
            .iter()
            .filter(|(_, netns)| changed.contains(*netns))
            .map(|(key, _)| key.clone())
            .collect()
    }

    fn remove_all(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        for (key, netns) in std::mem::take(&mut self.programmed) {
            if let Err(e) = self.dataplane.remove(&netns) {
                if !e.netns_gone() {
                    errors.push(format!("{key}: {e}"));
                }
            }
        }
        errors
    }

    fn read_back(&self, netns: &Path) -> Result<Option<String>, ApplyError> {
        self.dataplane.read_back(netns)
    }

    fn verify(&self, netns: &Path, scope: &VerifyScope) -> Result<Vec<Difference>, ApplyError> {
        self.dataplane.verify(netns, scope)
    }

    fn repair(&mut self, netns: &Path) -> Result<(), ApplyError> {
        self.dataplane.repair(netns)
    }

    fn read_counters_many(
        &self,
        pods: &[PodKey],
    ) -> Vec<Option<Result<EvidenceCounters, ApplyError>>> {
        let programmed: Vec<&Path> = pods
            .iter()
            .filter_map(|pod| self.programmed.get(pod).map(PathBuf::as_path))
            .collect();
        let mut read = self.dataplane.read_counters_many(&programmed).into_iter();
        pods.iter()
            .map(|pod| {
                self.programmed
                    .contains_key(pod)
                    .then(|| read.next())
                    .flatten()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_dataplane::FakeDataplane;
    use netwarden_engine::testing::{netpol, pod, selector};
    use netwarden_engine::EngineOptions;

    fn engine_with(ifname: &str) -> Engine {
        let mut e = Engine::new(EngineOptions::default());
        let mut p = pod("ns", "web", &[("app", "web")], &["10.0.0.1"]);
        p.interfaces[0].name = ifname.into();
        p.netns = Some("/run/netns/web".into());
        e.set_pod(p);
        e.set_policy(netpol(
            "ns",
            "deny",
            selector(&[("app", "web")]),
            Some(vec![]),
            None,
        ));
        e
    }

    fn all(e: &Engine) -> BTreeSet<PodKey> {
        e.pods().map(|p| p.key.clone()).collect()
    }

    #[test]
    fn refused_pods_keep_their_rules_and_are_reported() {
        let mut syncer = Syncer::new(FakeDataplane::new(RenderOptions::default()));
        let mut e = engine_with("eth0");
        let keys = all(&e);
        let report = syncer.sync(&mut e, keys.clone());
        assert_eq!(report.applied, 1, "{report}");
        let netns = PathBuf::from("/run/netns/web");
        let before = syncer.dataplane.tables[&netns].clone();
        // The interface is renamed to something nft cannot spell exactly: the pod is refused,
        // loudly, and the rules in force stay (never replaced by rules matching nothing).
        let mut e = engine_with("a\\b*");
        let report = syncer.sync(&mut e, keys);
        assert_eq!(report.applied, 0);
        assert_eq!(report.failed.len(), 1);
        assert!(report.errors[0].contains("refused"), "{:?}", report.errors);
        assert_eq!(syncer.dataplane.tables[&netns], before);
        assert_eq!(
            syncer.current()[&PodKey::new("ns", "web")].interfaces[0].name,
            "eth0"
        );
    }

    #[test]
    fn counters_read_together_keep_the_pods_order_and_skip_unprogrammed_pods() {
        let mut syncer = Syncer::new(FakeDataplane::new(RenderOptions::default()));
        let mut e = engine_with("eth0");
        let keys = all(&e);
        assert_eq!(syncer.sync(&mut e, keys).applied, 1);
        let web = PodKey::new("ns", "web");
        let elsewhere = PodKey::new("ns", "elsewhere");
        let read = syncer.read_counters_many(&[elsewhere.clone(), web.clone(), elsewhere]);
        let shape: Vec<Option<bool>> = read.iter().map(|r| r.as_ref().map(Result::is_ok)).collect();
        assert_eq!(shape, [None, Some(true), None]);
        assert_eq!(
            read[1].as_ref().unwrap().as_ref().unwrap(),
            &syncer
                .dataplane
                .read_counters(Path::new("/run/netns/web"))
                .unwrap()
        );
    }

    #[test]
    fn a_pod_named_dirty_with_unchanged_rules_sends_nothing_to_the_kernel() {
        // The syncer renders every pod it is given; the dataplane compares the ruleset with
        // the last one applied to the same netns and sends nothing when they are equal. So
        // whatever the engine names dirty, a pod whose rules did not change costs no
        // transaction.
        use netwarden_engine::{ObjectKey, PortRef, Protocol, Service, ServicePort};
        let mut syncer = Syncer::new(FakeDataplane::new(RenderOptions::default()));
        let mut e = engine_with("eth0");
        let keys = all(&e);
        assert_eq!(syncer.sync(&mut e, keys.clone()).applied, 1);
        let ops = syncer.dataplane.op_count();
        let before = syncer.dataplane.tables.clone();
        // A Service now selects the pod: its own rules (ingress denied) stay the same.
        e.set_service(Service {
            key: ObjectKey::new("ns", "web"),
            cluster_ips: vec!["10.96.0.1".parse().unwrap()],
            selector: Some([("app".to_string(), "web".to_string())].into()),
            endpoint_addrs: Vec::new(),
            ports: vec![ServicePort {
                protocol: Protocol::Tcp,
                port: 80,
                target: PortRef::Named("http".into()),
            }],
        });
        let mut dirty = e.take_dirty();
        dirty.extend(keys.clone());
        let report = syncer.sync(&mut e, dirty);
        assert_eq!((report.applied, report.unchanged), (0, 1), "{report}");
        assert_eq!(
            syncer.dataplane.op_count(),
            ops,
            "{:?}",
            syncer.dataplane.ops
        );
        assert_eq!(syncer.dataplane.tables, before);
        // A change of the pod's rules still goes through.
        e.set_policy(netpol(
            "ns",
            "deny",
            selector(&[("app", "web")]),
            Some(vec![netwarden_engine::testing::rule(
                vec![],
                vec![netwarden_engine::testing::tcp(80)],
            )]),
            None,
        ));
        let dirty = e.take_dirty();
        let report = syncer.sync(&mut e, dirty);
        assert_eq!(report.applied, 1, "{report}");
        assert_eq!(syncer.dataplane.op_count(), ops + 1);
    }

    /// `--established=revoke`: an apply that changed a netns's rules revokes there; an
    /// unchanged ruleset, a removal and `keep` do not.
    #[test]
    fn revocation_follows_changed_applies_only() {
        use netwarden_dataplane::fake::FAKE_REVOCATIONS;
        let netns = PathBuf::from("/run/netns/revoking-web");
        let scopes = || -> Vec<RevocationScope> {
            FAKE_REVOCATIONS
                .lock()
                .unwrap()
                .iter()
                .filter(|(p, _)| *p == netns)
                .map(|(_, scope)| scope.clone())
                .collect()
        };
        let calls = || scopes().len();
        let engine = |ingress| {
            let mut e = Engine::new(EngineOptions::default());
            let mut p = pod("ns", "web", &[("app", "web")], &["10.0.0.1"]);
            p.netns = Some(netns.to_string_lossy().into());
            e.set_pod(p);
            if let Some(ingress) = ingress {
                e.set_policy(netpol(
                    "ns",
                    "p",
                    selector(&[("app", "web")]),
                    Some(ingress),
                    None,
                ));
            }
            e
        };
        let mut syncer = Syncer::new(FakeDataplane::new(RenderOptions::default()));
        // Off until asked: the reconciler of the lab and of tests does not revoke.
        let mut e = engine(Some(vec![]));
        let keys = all(&e);
        let report = syncer.sync(&mut e, keys);
        assert_eq!((report.applied, calls()), (1, 0), "{report}");
        syncer.set_established(Established::Revoke);
        let allow_80 = vec![netwarden_engine::testing::rule(
            vec![],
            vec![netwarden_engine::testing::tcp(80)],
        )];
        let mut e = engine(Some(allow_80.clone()));
        let keys = all(&e);
        let report = syncer.sync(&mut e, keys);
        assert_eq!((report.applied, calls()), (1, 1), "{report}");
        assert!(
            report.revoke_errors.is_empty(),
            "{:?}",
            report.revoke_errors
        );
        // Nothing judged before: everything.
        assert_eq!(scopes()[0], RevocationScope::Everything);
        // Unchanged: nothing applied, nothing revoked.
        let keys = all(&e);
        let report = syncer.sync(&mut e, keys);
        assert_eq!((report.unchanged, calls()), (1, 1), "{report}");
        // Every port allowed now: wider, a pass with nothing to look at.
        let any_port = vec![netwarden_engine::testing::rule(vec![], vec![])];
        let mut e = engine(Some(any_port));
        let keys = all(&e);
        let report = syncer.sync(&mut e, keys);
        assert_eq!((report.applied, calls()), (1, 2), "{report}");
        assert_eq!(scopes()[1], RevocationScope::Nothing);
        // Back to port 80: narrower, judged against the last pass's rules: everything.
        let mut e = engine(Some(allow_80.clone()));
        let keys = all(&e);
        syncer.sync(&mut e, keys);
        assert_eq!(scopes()[2], RevocationScope::Everything);
        // No longer isolated: the rules are removed, nothing revoked.
        let mut e = engine(None);
        let keys = all(&e);
        let report = syncer.sync(&mut e, keys);
        assert_eq!((report.removed, calls()), (1, 3), "{report}");
        // Isolated again after an open spell: whatever started meanwhile was judged by
        // nothing, so everything, even for rules the netns had before.
        let mut e = engine(Some(allow_80.clone()));
        let keys = all(&e);
        syncer.sync(&mut e, keys);
        assert_eq!(scopes()[3], RevocationScope::Everything);
        // Keep: a change revokes nothing.
        syncer.set_established(Established::Keep);
        let mut e = engine(Some(vec![]));
        let keys = all(&e);
        let report = syncer.sync(&mut e, keys);
        assert_eq!((report.applied, calls()), (1, 4), "{report}");
    }

    #[test]
    fn a_recreated_netns_is_synced_again_in_full() {
        let mut syncer = Syncer::new(FakeDataplane::new(RenderOptions::default()));
        let mut e = engine_with("eth0");
        let keys = all(&e);
        syncer.sync(&mut e, keys.clone());
        let netns = PathBuf::from("/run/netns/web");
        syncer.dataplane.recreate(&netns);
        assert!(!syncer.dataplane.tables.contains_key(&netns));
        let changed = syncer.netns_changed();
        assert_eq!(changed, keys);
        // Nothing in the engine changed; the pod is re-applied because its netns did.
        let report = syncer.sync(&mut e, changed);
        assert_eq!(report.applied, 1, "{report}");
        assert!(syncer.dataplane.tables.contains_key(&netns));
    }

    /// A netns handed from one pod to another in one sync (a locked-down netns given to its
    /// owner once the other claim went) is never left without a table in between.
    #[test]
    fn a_netns_handed_over_is_never_emptied() {
        use netwarden_dataplane::fake::FakeOp;
        let mut syncer = Syncer::new(FakeDataplane::new(RenderOptions::default()));
        let mut e = engine_with("eth0");
        let web = PodKey::new("ns", "web");
        let netns = PathBuf::from("/run/netns/web");
        // `intruder` held web's netns, locked down.
        let mut intruder = pod("ns", "intruder", &[], &["10.0.0.9"]);
        intruder.netns = Some("/run/netns/web".into());
        e.set_pod(intruder);
        let intruder = PodKey::new("ns", "intruder");
        e.set_lockdown(&intruder, Some("contested".into()));
        let mut only = e.pod(&web).unwrap().clone();
        only.netns = None;
        e.set_pod(only);
        let report = syncer.sync(&mut e, BTreeSet::from([intruder.clone(), web.clone()]));
        assert_eq!(syncer.programmed()[&intruder], netns, "{report}");
        // The intruder goes; web takes its netns back.
        e.remove_pod(&intruder);
        let mut back = e.pod(&web).unwrap().clone();
        back.netns = Some("/run/netns/web".into());
        e.set_pod(back);
        let ops = syncer.dataplane.op_count();
        let report = syncer.sync(&mut e, BTreeSet::from([intruder.clone(), web.clone()]));
        assert!(report.errors.is_empty(), "{report}");
        assert_eq!(
            syncer.dataplane.ops[ops..],
            [FakeOp::Apply(netns.clone())],
            "no removal of the netns web now holds"
        );
        assert!(!syncer.programmed().contains_key(&intruder));
        assert_eq!(syncer.programmed()[&web], netns);
    }
}
