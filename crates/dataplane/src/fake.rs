//! An in-memory nft [`Dataplane`] for tests of the reconcile loop: no kernel, no root.
//!
//! Like knftables' fake, an apply either commits completely or (with an injected failure)
//! changes nothing, and the same skip-if-unchanged / forget-on-failure bookkeeping as the real
//! dataplane applies, so tests can assert how many transactions a sync sends.
//!
//! It models the table by name, as [`NftDataplane`](crate::nft_apply::NftDataplane) drives it:
//! the same [`plan`] (stale chains and sets deleted in the transaction), run against a
//! names-only kernel ([`NftObjects::apply`]) that refuses what the kernel refuses, with the
//! applier's knowledge kept apart from the "kernel" so that `forget` makes it re-read the table
//! like the real one does. Netns are plain names here: none is opened.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use netwarden_engine::revocation::RevocationScope;
use netwarden_engine::PodRules;
use netwarden_render::nft::Table;
use netwarden_render::{RenderError, RenderOptions};

use crate::apply::{ApplyError, ApplyOutcome, Backend, Dataplane, EvidenceCounters};
use crate::nft_apply::NftRuleset;
use crate::nft_plan::{plan, NftNetnsState, NftObjects};
use crate::tamper::{Difference, Part, VerifyScope};

/// The netns [`FakeDataplane`]'s `revoke_connections` was called for, with the scope it was
/// given, in order, process-wide (an associated function has no `self` to record in). Tests
/// that read it use netns paths of their own.
pub static FAKE_REVOCATIONS: std::sync::Mutex<Vec<(PathBuf, RevocationScope)>> =
    std::sync::Mutex::new(Vec::new());

/// One call that reached the (fake) kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeOp {
    Apply(PathBuf),
    Remove(PathBuf),
    Repair(PathBuf),
}

#[derive(Debug, Default)]
pub struct FakeDataplane {
    options: RenderOptions,
    /// The table each netns holds; absent = netwarden owns nothing there.
    pub tables: HashMap<PathBuf, Arc<Table>>,
    /// Netns whose next apply/remove fails (and stays failing until removed from the set).
    pub fail: HashSet<PathBuf>,
    /// Every operation that was sent (unchanged applies are not).
    pub ops: Vec<FakeOp>,
    /// The table of each netns as the (fake) kernel holds it, by name.
    pub kernel: HashMap<PathBuf, NftObjects>,
    /// The last transactions sent to each netns, as nft text.
    pub transactions: HashMap<PathBuf, String>,
    /// Netns "recreated" since (see [`FakeDataplane::recreate`]).
    recreated: HashSet<PathBuf>,
    last_applied: HashMap<PathBuf, u64>,
    /// The table last applied to each netns: what [`Dataplane::verify`] compares
    /// [`FakeDataplane::tables`] with (a test tampers by changing `tables`).
    applied_tables: HashMap<PathBuf, Arc<Table>>,
    /// What the applier believes the kernel holds (dropped by `forget` and failures).
    state: HashMap<PathBuf, NftNetnsState>,
}

impl FakeDataplane {
    pub fn new(options: RenderOptions) -> Self {
        FakeDataplane {
            options,
            ..Default::default()
        }
    }

    /// Number of operations sent (applies and removals).
    pub fn op_count(&self) -> usize {
        self.ops.len()
    }

    /// Simulates a pod sandbox restart: the netns at `netns` is a new, empty one.
    pub fn recreate(&mut self, netns: &Path) {
        self.kernel.remove(netns);
        self.tables.remove(netns);
        self.recreated.insert(netns.to_owned());
    }

    fn commit(&mut self, netns: &Path, desired: Option<&Table>) -> Result<(), ApplyError> {
        let kernel = self.kernel.get(netns).cloned().unwrap_or_default();
        let state = self
            .state
            .remove(netns)
            .unwrap_or_else(|| NftNetnsState::from_kernel(kernel.clone()));
        let p = plan(desired, &state);
        let mut next = kernel;
        let mut text = String::new();
        for tx in p.transactions() {
            // A transaction the kernel would refuse is a bug of the planner: fail loudly.
            next.apply(tx)
                .unwrap_or_else(|e| panic!("{}: refused: {e}\n{}", netns.display(), tx.to_text()));
            text.push_str(&tx.to_text());
        }
        self.transactions.insert(netns.to_owned(), text);
        self.kernel.insert(netns.to_owned(), next);
        self.state.insert(netns.to_owned(), p.after);
        Ok(())
    }
}

impl Dataplane for FakeDataplane {
    type Ruleset = NftRuleset;
    const BACKEND: Backend = Backend::Nft;

    fn render(&self, rules: &PodRules) -> Result<NftRuleset, RenderError> {
        crate::nft_apply::render_ruleset(rules, &self.options)
    }

    fn apply(&mut self, netns: &Path, ruleset: &NftRuleset) -> Result<ApplyOutcome, ApplyError> {
        let hash = netwarden_engine::hash::content_hash(ruleset);
        if self.last_applied.get(netns) == Some(&hash) {
            return Ok(ApplyOutcome::Unchanged);
        }
        self.last_applied.remove(netns);
        if self.fail.contains(netns) {
            self.state.remove(netns);
            return Err(ApplyError::Injected {
                netns: netns.to_owned(),
            });
        }
        self.ops.push(FakeOp::Apply(netns.to_owned()));
        self.commit(netns, ruleset.as_deref())?;
        match ruleset {
            Some(table) => {
                self.applied_tables.insert(netns.to_owned(), table.clone());
                self.tables.insert(netns.to_owned(), table.clone())
            }
            None => {
                self.applied_tables.remove(netns);
                self.tables.remove(netns)
            }
        };
        self.last_applied.insert(netns.to_owned(), hash);
        Ok(if ruleset.is_some() {
            ApplyOutcome::Applied
        } else {
            ApplyOutcome::Removed
        })
    }

    fn remove(&mut self, netns: &Path) -> Result<(), ApplyError> {
        self.last_applied.remove(netns);
        if self.fail.contains(netns) {
            self.state.remove(netns);
            return Err(ApplyError::Injected {
                netns: netns.to_owned(),
            });
        }
        self.ops.push(FakeOp::Remove(netns.to_owned()));
        self.commit(netns, None)?;
        self.tables.remove(netns);
        self.applied_tables.remove(netns);
        Ok(())
    }

    /// The whole table compared: any change is one difference.
    fn verify(&self, netns: &Path, _scope: &VerifyScope) -> Result<Vec<Difference>, ApplyError> {
        let Some(applied) = self.applied_tables.get(netns) else {
            return Ok(Vec::new());
        };
        Ok(match self.tables.get(netns) {
            None => vec![Difference::Missing(Part::Table)],
            Some(kernel) if kernel != applied => vec![Difference::Changed(Part::Table)],
            Some(_) => Vec::new(),
        })
    }

    fn repair(&mut self, netns: &Path) -> Result<(), ApplyError> {
        let Some(applied) = self.applied_tables.get(netns).cloned() else {
            return Ok(());
        };
        if self.fail.contains(netns) {
            return Err(ApplyError::Injected {
                netns: netns.to_owned(),
            });
        }
        self.ops.push(FakeOp::Repair(netns.to_owned()));
        self.kernel
            .insert(netns.to_owned(), NftObjects::of(&applied));
        self.tables.insert(netns.to_owned(), applied);
        Ok(())
    }

    fn read_back(&self, netns: &Path) -> Result<Option<String>, ApplyError> {
        Ok(self
            .tables
            .get(netns)
            .map(|t| netwarden_render::nft::Transaction::create(t).to_text()))
    }

    /// No kernel counts anything here.
    fn read_counters(&self, _netns: &Path) -> Result<EvidenceCounters, ApplyError> {
        Ok(EvidenceCounters::new())
    }

    /// No kernel, no connections: the fake's netns hold none. Each call is counted in
    /// [`FAKE_REVOCATIONS`] (the tests of the reconcile loop check when it revokes).
    fn revoke_connections(
        netns: &Path,
        _rules: &PodRules,
        scope: &RevocationScope,
    ) -> Result<crate::conntrack::Revoked, crate::conntrack::ConntrackError> {
        FAKE_REVOCATIONS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((netns.to_owned(), scope.clone()));
        Ok(crate::conntrack::Revoked::default())
    }

    fn forget(&mut self, netns: &Path) {
        self.last_applied.remove(netns);
        self.state.remove(netns);
        self.applied_tables.remove(netns);
    }

    fn forget_all(&mut self) {
        self.last_applied.clear();
        self.state.clear();
        self.applied_tables.clear();
    }

    fn changed_netns(&mut self) -> Vec<PathBuf> {
        let changed: Vec<PathBuf> = self
            .recreated
            .drain()
            .filter(|p| self.last_applied.contains_key(p))
            .collect();
        for p in &changed {
            self.last_applied.remove(p);
            self.state.remove(p);
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::testing::{ip_block, netpol, pod, rule, selector, with_interface};
    use netwarden_engine::{Engine, EngineOptions, NetworkId, PodKey};

    fn table_for(peers: &str, extra_iface: bool) -> NftRuleset {
        let mut engine = Engine::new(EngineOptions::default());
        let mut p = pod("ns", "web", &[("app", "web")], &["10.0.0.1"]);
        if extra_iface {
            p = with_interface(p, "net1", NetworkId::nad("ns", "data"), &["10.1.0.1"]);
        }
        engine.set_pod(p);
        let mut policy = netpol(
            "ns",
            "in",
            selector(&[("app", "web")]),
            Some(vec![rule(vec![ip_block(peers, &[])], vec![])]),
            None,
        );
        if extra_iface {
            policy.kind = netwarden_engine::PolicyKind::DanmNetworkPolicy;
            policy.scope = netwarden_engine::PolicyScope::AllInterfaces;
        }
        engine.set_policy(policy);
        let rules = engine.pod_rules(&PodKey::new("ns", "web")).unwrap();
        FakeDataplane::new(RenderOptions::default())
            .render(&rules)
            .unwrap()
    }

    #[test]
    fn skips_unchanged_and_resyncs_after_failure() {
        let mut dp = FakeDataplane::new(RenderOptions::default());
        let a = PathBuf::from("/run/netns/a");
        let rules = table_for("10.0.0.0/24", false);
        assert_eq!(dp.apply(&a, &rules).unwrap(), ApplyOutcome::Applied);
        assert_eq!(dp.apply(&a, &rules).unwrap(), ApplyOutcome::Unchanged);
        assert_eq!(dp.op_count(), 1);
        dp.fail.insert(a.clone());
        let other = table_for("10.9.0.0/24", false);
        assert!(dp.apply(&a, &other).is_err());
        dp.fail.clear();
        // The failure forgot the hash: even the old rules are applied again in full.
        assert_eq!(dp.apply(&a, &rules).unwrap(), ApplyOutcome::Applied);
        assert_eq!(dp.apply(&a, &None).unwrap(), ApplyOutcome::Removed);
        assert!(!dp.tables.contains_key(&a));
        assert_eq!(dp.kernel[&a], NftObjects::default());
    }

    #[test]
    fn stale_sets_and_chains_are_collected_like_the_real_dataplane() {
        let mut dp = FakeDataplane::new(RenderOptions::default());
        let a = PathBuf::from("/run/netns/a");
        dp.apply(&a, &table_for("10.0.0.0/24", true)).unwrap();
        let first_sets = dp.kernel[&a].sets.clone();
        let chains_two = dp.kernel[&a].chains.len();
        // net1 leaves and the peers change: its chains go at once, the old set one apply later.
        dp.apply(&a, &table_for("10.0.1.0/24", false)).unwrap();
        assert!(dp.kernel[&a].chains.len() < chains_two);
        assert!(first_sets.is_subset(&dp.kernel[&a].sets));
        dp.apply(&a, &table_for("10.0.2.0/24", false)).unwrap();
        assert!(first_sets.is_disjoint(&dp.kernel[&a].sets));
    }

    #[test]
    fn recreated_netns_is_reported_and_applied_in_full() {
        let mut dp = FakeDataplane::new(RenderOptions::default());
        let a = PathBuf::from("/run/netns/a");
        let rules = table_for("10.0.0.0/24", false);
        dp.apply(&a, &rules).unwrap();
        dp.recreate(&a);
        assert_eq!(dp.changed_netns(), vec![a.clone()]);
        assert_eq!(dp.apply(&a, &rules).unwrap(), ApplyOutcome::Applied);
        assert!(dp.tables.contains_key(&a));
    }
}
