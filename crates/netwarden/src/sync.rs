//! Reconciliation: from the engine's rules to the kernel, one pod netns at a time.
//!
//! Only the pods the engine names dirty are rendered; a ruleset identical to the last one
//! applied is skipped by the dataplane; a pod no longer isolated (or gone) has everything
//! netwarden owns removed from its netns. A failed apply makes the dataplane forget that netns,
//! so the next sync re-applies it in full.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use netwarden_dataplane::{ApplyOutcome, Backend, Dataplane, RenderedRuleset};
use netwarden_engine::{Engine, PodKey, PodRules};
use netwarden_render::iptables::render_iptables;
use netwarden_render::{render_nft, RenderOptions};

/// Renders one pod's rules for `backend`; a pod nothing isolates renders as a removal.
pub fn render_ruleset(
    backend: Backend,
    rules: &PodRules,
    options: &RenderOptions,
) -> RenderedRuleset {
    match backend {
        Backend::Nft => RenderedRuleset::nft(render_nft(rules, options)),
        Backend::Iptables if !rules.is_isolated() => RenderedRuleset::iptables(None, None, None),
        Backend::Iptables => {
            let r = render_iptables(rules, options);
            RenderedRuleset::iptables(
                Some(r.v4),
                Some(r.v6),
                (!r.ipset.is_empty()).then_some(r.ipset),
            )
        }
    }
}

/// What one sync did.
#[derive(Debug, Default, Clone)]
pub struct SyncReport {
    pub pods_considered: usize,
    pub applied: usize,
    pub unchanged: usize,
    pub removed: usize,
    pub skipped_no_netns: usize,
    pub errors: Vec<String>,
    /// The pods behind `errors`: nothing marks them dirty again, so the caller retries them
    /// (their netns may appear later, or the failure may pass).
    pub failed: BTreeSet<PodKey>,
    pub duration: Duration,
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

/// Keeps pod netns in step with the engine through a [`Dataplane`].
pub struct Syncer {
    pub dataplane: Box<dyn Dataplane>,
    pub backend: Backend,
    pub options: RenderOptions,
    /// Where each pod's rules went last time (to remove them when the pod goes).
    programmed: BTreeMap<PodKey, PathBuf>,
    /// The rules last computed per pod (the monitor resolves log prefixes through them).
    pub current: BTreeMap<PodKey, PodRules>,
    /// Also remove netwarden's rules from pods found not isolated that this process never
    /// programmed: set for the first sync after a restart, so stale rules go.
    pub converge_removals: bool,
}

impl Syncer {
    pub fn new(dataplane: Box<dyn Dataplane>, backend: Backend, options: RenderOptions) -> Self {
        Syncer {
            dataplane,
            backend,
            options,
            programmed: BTreeMap::new(),
            current: BTreeMap::new(),
            converge_removals: false,
        }
    }

    /// Pods whose rules are programmed, with their netns.
    pub fn programmed(&self) -> &BTreeMap<PodKey, PathBuf> {
        &self.programmed
    }

    /// Recomputes and applies `pods` (typically `engine.take_dirty()`).
    pub fn sync(
        &mut self,
        engine: &mut Engine,
        pods: impl IntoIterator<Item = PodKey>,
    ) -> SyncReport {
        let start = Instant::now();
        let mut report = SyncReport::default();
        let pods: BTreeSet<PodKey> = pods.into_iter().collect();
        let mut batch: Vec<(PodKey, PathBuf, RenderedRuleset)> = Vec::new();
        for key in pods {
            report.pods_considered += 1;
            let rules = engine.pod_rules(&key);
            let netns = rules
                .as_ref()
                .and_then(|r| r.netns.clone())
                .map(PathBuf::from);
            // The pod left its old netns (deleted, or recreated elsewhere): clean the old one.
            if let Some(old) = self.programmed.get(&key).cloned() {
                if netns.as_ref() != Some(&old) || rules.as_ref().is_none_or(|r| !r.is_isolated()) {
                    match self.dataplane.remove(&old) {
                        Ok(()) => {
                            report.removed += 1;
                            self.programmed.remove(&key);
                        }
                        Err(e) if e.netns_gone() => {
                            self.programmed.remove(&key);
                        }
                        Err(e) => {
                            report.errors.push(format!("{key}: {e}"));
                            report.failed.insert(key.clone());
                        }
                    }
                }
            }
            let Some(rules) = rules else {
                self.current.remove(&key);
                continue;
            };
            let isolated = rules.is_isolated();
            self.current.insert(key.clone(), rules.clone());
            if !isolated {
                if let (true, Some(netns)) = (self.converge_removals, &netns) {
                    match self.dataplane.remove(netns) {
                        Ok(()) => {}
                        Err(e) if e.netns_gone() => {}
                        Err(e) => {
                            report.errors.push(format!("{key}: {e}"));
                            report.failed.insert(key.clone());
                        }
                    }
                }
                continue;
            }
            let Some(netns) = netns else {
                report.skipped_no_netns += 1;
                continue;
            };
            let ruleset = render_ruleset(self.backend, &rules, &self.options);
            batch.push((key, netns, ruleset));
        }
        // Render first, then apply everything at once: the backends can overlap the applies'
        // waits (each `nft`/`iptables-restore` run mostly waits on the kernel).
        let items: Vec<(PathBuf, RenderedRuleset)> = batch
            .iter()
            .map(|(_, netns, r)| (netns.clone(), r.clone()))
            .collect();
        let results = self.dataplane.apply_many(&items);
        for ((key, netns, _), result) in batch.into_iter().zip(results) {
            match result {
                Ok(ApplyOutcome::Applied) => {
                    report.applied += 1;
                    self.programmed.insert(key, netns);
                }
                Ok(ApplyOutcome::Unchanged) => {
                    report.unchanged += 1;
                    self.programmed.insert(key, netns);
                }
                Ok(ApplyOutcome::Removed) => report.removed += 1,
                Err(e) => {
                    self.dataplane.forget(&netns);
                    report.errors.push(format!("{key}: {e}"));
                    report.failed.insert(key);
                }
            }
        }
        report.duration = start.elapsed();
        report
    }

    /// Removes netwarden's rules from every netns it programmed (used by the lab and tests).
    pub fn remove_all(&mut self) -> Vec<String> {
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
}
