//! An in-memory [`Dataplane`] for tests of the reconcile loop: no kernel, no root.
//!
//! Like knftables' fake, an apply either commits completely or (with an injected failure)
//! changes nothing, and the same skip-if-unchanged / forget-on-failure bookkeeping as the real
//! dataplanes applies, so tests can assert how many transactions a sync sends.
//!
//! For nft rulesets it also models the table by name, as [`NftDataplane`] drives it: the same
//! [`plan_update`] (stale chains and sets deleted in the transaction), run against a names-only
//! kernel ([`NftObjects::apply_transaction`]), with the applier's knowledge kept apart from the
//! "kernel" so that `forget` makes it re-read the table like the real one does.
//!
//! [`NftDataplane`]: crate::nft_apply::NftDataplane

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::apply::{ApplyError, ApplyOutcome, Backend, Dataplane, RenderedRuleset};
use crate::nft_apply::{plan_update, NftNetnsState, NftObjects};

/// One call that reached the (fake) kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeOp {
    Apply(PathBuf),
    Remove(PathBuf),
}

#[derive(Debug, Default)]
pub struct FakeDataplane {
    /// What each netns holds: the nft text, or the iptables texts concatenated (see
    /// [`FakeDataplane::stored_text`]). Absent = netwarden owns nothing there.
    pub tables: HashMap<PathBuf, String>,
    /// The full rulesets, for assertions on the iptables parts.
    pub rulesets: HashMap<PathBuf, RenderedRuleset>,
    /// Netns whose next apply/remove fails (and stays failing until removed from the set).
    pub fail: HashSet<PathBuf>,
    /// Every operation that was sent (unchanged applies are not).
    pub ops: Vec<FakeOp>,
    /// The nft table of each netns as the (fake) kernel holds it, by name.
    pub nft_kernel: HashMap<PathBuf, NftObjects>,
    /// The last nft transaction sent to each netns (the rendered text plus the deletions).
    pub nft_transactions: HashMap<PathBuf, String>,
    last_applied: HashMap<PathBuf, u64>,
    /// What the applier believes the kernel holds (dropped by `forget` and failures).
    nft_state: HashMap<PathBuf, NftNetnsState>,
}

impl FakeDataplane {
    pub fn new() -> Self {
        Self::default()
    }

    /// The text stored for a ruleset: the nft text, or for iptables each part under a header.
    pub fn stored_text(ruleset: &RenderedRuleset) -> String {
        if let Some(nft) = &ruleset.nft {
            return nft.clone();
        }
        let mut out = String::new();
        for (name, part) in [
            ("ipset", &ruleset.ipset),
            ("iptables", &ruleset.iptables_v4),
            ("ip6tables", &ruleset.iptables_v6),
        ] {
            if let Some(text) = part {
                out.push_str(&format!("# {name}\n{text}"));
                if !text.ends_with('\n') {
                    out.push('\n');
                }
            }
        }
        out
    }

    /// Number of operations sent (applies and removals).
    pub fn op_count(&self) -> usize {
        self.ops.len()
    }

    /// The nft part of an apply, as [`NftDataplane`](crate::nft_apply::NftDataplane) does it.
    fn nft_update(&mut self, netns: &Path, desired: &str) -> Result<(), ApplyError> {
        let kernel = self.nft_kernel.get(netns).cloned().unwrap_or_default();
        let state = self
            .nft_state
            .remove(netns)
            .unwrap_or_else(|| NftNetnsState::from_kernel(kernel.clone()));
        let plan = plan_update(desired, &state);
        let mut next = kernel;
        // A transaction the kernel would refuse is a bug of the planner: fail loudly.
        next.apply_transaction(&plan.text)
            .unwrap_or_else(|e| panic!("{}: refused: {e}\n{}", netns.display(), plan.text));
        self.nft_kernel.insert(netns.to_owned(), next);
        self.nft_transactions.insert(netns.to_owned(), plan.text);
        self.nft_state.insert(netns.to_owned(), plan.after);
        Ok(())
    }

    fn clear(&mut self, netns: &Path) {
        self.tables.remove(netns);
        self.rulesets.remove(netns);
        self.nft_kernel.remove(netns);
        self.nft_state.remove(netns);
    }
}

impl Dataplane for FakeDataplane {
    fn apply(
        &mut self,
        netns: &Path,
        ruleset: &RenderedRuleset,
    ) -> Result<ApplyOutcome, ApplyError> {
        let hash = ruleset.content_hash();
        if self.last_applied.get(netns) == Some(&hash) {
            return Ok(ApplyOutcome::Unchanged);
        }
        self.last_applied.remove(netns);
        if self.fail.contains(netns) {
            self.nft_state.remove(netns);
            return Err(ApplyError::Injected {
                netns: netns.to_owned(),
            });
        }
        let outcome = if ruleset.is_removal() {
            self.ops.push(FakeOp::Remove(netns.to_owned()));
            self.clear(netns);
            ApplyOutcome::Removed
        } else {
            if ruleset.backend == Backend::Nft {
                self.nft_update(netns, ruleset.nft.as_deref().unwrap_or_default())?;
            }
            self.ops.push(FakeOp::Apply(netns.to_owned()));
            self.tables
                .insert(netns.to_owned(), Self::stored_text(ruleset));
            self.rulesets.insert(netns.to_owned(), ruleset.clone());
            ApplyOutcome::Applied
        };
        self.last_applied.insert(netns.to_owned(), hash);
        Ok(outcome)
    }

    fn remove(&mut self, netns: &Path) -> Result<(), ApplyError> {
        self.last_applied.remove(netns);
        self.nft_state.remove(netns);
        if self.fail.contains(netns) {
            return Err(ApplyError::Injected {
                netns: netns.to_owned(),
            });
        }
        self.ops.push(FakeOp::Remove(netns.to_owned()));
        self.clear(netns);
        Ok(())
    }

    fn read_back(&self, netns: &Path) -> Result<Option<String>, ApplyError> {
        Ok(self.tables.get(netns).cloned())
    }

    fn forget(&mut self, netns: &Path) {
        self.last_applied.remove(netns);
        self.nft_state.remove(netns);
    }

    fn forget_all(&mut self) {
        self.last_applied.clear();
        self.nft_state.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nft(text: &str) -> RenderedRuleset {
        RenderedRuleset::nft(text.to_string())
    }

    #[test]
    fn skips_unchanged_and_resyncs_after_failure() {
        let mut dp = FakeDataplane::new();
        let ns = Path::new("/run/netns/a");
        let r1 =
            nft("table inet netwarden {}\ndelete table inet netwarden\ntable inet netwarden { }\n");
        assert_eq!(dp.apply(ns, &r1).unwrap(), ApplyOutcome::Applied);
        assert_eq!(dp.apply(ns, &r1).unwrap(), ApplyOutcome::Unchanged);
        assert_eq!(dp.op_count(), 1);
        assert_eq!(dp.read_back(ns).unwrap().as_deref(), r1.nft.as_deref());

        // A failing apply changes nothing and forgets the hash.
        let r2 = nft("table inet netwarden {}\ndelete table inet netwarden\ntable inet netwarden { chain x { } }\n");
        dp.fail.insert(ns.to_owned());
        assert!(matches!(
            dp.apply(ns, &r2),
            Err(ApplyError::Injected { .. })
        ));
        assert_eq!(dp.read_back(ns).unwrap().as_deref(), r1.nft.as_deref());
        dp.fail.clear();
        // r1 again is re-sent: after a failure the next sync is full.
        assert_eq!(dp.apply(ns, &r1).unwrap(), ApplyOutcome::Applied);
        assert_eq!(dp.op_count(), 2);

        // Removal ruleset.
        let removal = nft(&netwarden_render::nft::render_removal());
        assert_eq!(dp.apply(ns, &removal).unwrap(), ApplyOutcome::Removed);
        assert_eq!(dp.read_back(ns).unwrap(), None);
        assert_eq!(dp.apply(ns, &removal).unwrap(), ApplyOutcome::Unchanged);
        assert_eq!(dp.ops.last(), Some(&FakeOp::Remove(ns.to_owned())));
    }

    /// Rules of a pod whose ingress on each of `ifaces` allows TCP 80 from `peers`.
    fn pod_rules(ifaces: &[&str], peers: &[&str]) -> netwarden_engine::PodRules {
        use netwarden_engine::*;
        let policy = PolicyRef {
            kind: PolicyKind::NetworkPolicy,
            key: ObjectKey::new("t", "p"),
        };
        let iso = Isolation::Isolated(vec![AllowRule {
            origin: RuleOrigin {
                policy: policy.clone(),
                direction: Direction::Ingress,
                index: 0,
                mode: Mode::Enforce,
            },
            clauses: vec![Clause {
                peers: PeerMatch::Addrs(std::sync::Arc::new(AddrSet::from_addrs(
                    peers.iter().map(|p| p.parse().unwrap()),
                ))),
                ports: PortMatch::Only(vec![PortRange {
                    protocol: Protocol::Tcp,
                    ports: Some((80, 80)),
                }]),
            }],
        }]);
        PodRules {
            pod: ObjectKey::new("t", "pod"),
            netns: None,
            interfaces: ifaces
                .iter()
                .map(|name| InterfaceRules {
                    name: name.to_string(),
                    network: NetworkId::Primary,
                    ips: vec![],
                    ingress: DirectionRules {
                        enforced: iso.clone(),
                        staged: iso.clone(),
                        enforced_policies: vec![policy.clone()],
                        monitored_policies: vec![],
                        replaced_policies: vec![],
                        log_denies: false,
                    },
                    egress: DirectionRules::open(),
                })
                .collect(),
        }
    }

    fn rendered(ifaces: &[&str], peers: &[&str]) -> RenderedRuleset {
        let opts = netwarden_render::RenderOptions::default();
        nft(&netwarden_render::render_nft(
            &pod_rules(ifaces, peers),
            &opts,
        ))
    }

    #[test]
    fn nft_sets_and_chains_are_collected_like_the_real_dataplane() {
        let mut dp = FakeDataplane::new();
        let ns = Path::new("/run/netns/gc");
        let sets = |dp: &FakeDataplane| dp.nft_kernel[ns].sets.len();
        let a = rendered(&["eth0", "net1"], &["10.0.0.2"]);
        let b = rendered(&["eth0"], &["10.0.0.3"]);
        let c = rendered(&["eth0"], &["10.0.0.4"]);
        dp.apply(ns, &a).unwrap();
        assert_eq!(sets(&dp), 1);
        assert!(dp.nft_kernel[ns].chains.contains("in_1"));
        // B: net1's chain goes at once; A's set stays (the rules being replaced use it).
        dp.apply(ns, &b).unwrap();
        assert_eq!(sets(&dp), 2);
        assert!(!dp.nft_kernel[ns].chains.contains("in_1"));
        assert!(!dp.nft_transactions[ns].contains("delete set"));
        // C: A's set is two applies stale.
        dp.apply(ns, &c).unwrap();
        assert_eq!(sets(&dp), 2);
        assert_eq!(dp.nft_transactions[ns].matches("delete set").count(), 1);
        // Alternating forever keeps at most three sets.
        for i in 0..10 {
            dp.apply(ns, if i % 2 == 0 { &b } else { &c }).unwrap();
            assert!(sets(&dp) <= 3);
        }
        // After forget, what the table holds is re-read and every set kept once.
        dp.forget(ns);
        dp.apply(ns, &a).unwrap();
        assert!(!dp.nft_transactions[ns].contains("delete set"));
        assert_eq!(sets(&dp), 3);
        dp.apply(ns, &b).unwrap();
        assert_eq!(sets(&dp), 2);
        // Removal empties the table.
        dp.remove(ns).unwrap();
        assert!(!dp.nft_kernel.contains_key(ns));
    }

    #[test]
    fn iptables_parts_are_stored() {
        let mut dp = FakeDataplane::new();
        let ns = Path::new("/run/netns/b");
        let r = RenderedRuleset::iptables(
            Some("*filter\nCOMMIT".into()),
            None,
            Some("create x".into()),
        );
        assert_eq!(dp.apply(ns, &r).unwrap(), ApplyOutcome::Applied);
        let text = dp.read_back(ns).unwrap().unwrap();
        assert_eq!(text, "# ipset\ncreate x\n# iptables\n*filter\nCOMMIT\n");
        dp.remove(ns).unwrap();
        assert!(dp.tables.is_empty() && dp.rulesets.is_empty());
    }
}
