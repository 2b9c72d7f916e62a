//! An in-memory [`Dataplane`] for tests of the reconcile loop: no kernel, no root.
//!
//! Like knftables' fake, an apply either commits completely or (with an injected failure)
//! changes nothing, and the same skip-if-unchanged / forget-on-failure bookkeeping as the real
//! dataplanes applies, so tests can assert how many transactions a sync sends.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::apply::{ApplyError, ApplyOutcome, Dataplane, RenderedRuleset};

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
    last_applied: HashMap<PathBuf, u64>,
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
            return Err(ApplyError::Injected {
                netns: netns.to_owned(),
            });
        }
        let outcome = if ruleset.is_removal() {
            self.ops.push(FakeOp::Remove(netns.to_owned()));
            self.tables.remove(netns);
            self.rulesets.remove(netns);
            ApplyOutcome::Removed
        } else {
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
        if self.fail.contains(netns) {
            return Err(ApplyError::Injected {
                netns: netns.to_owned(),
            });
        }
        self.ops.push(FakeOp::Remove(netns.to_owned()));
        self.tables.remove(netns);
        self.rulesets.remove(netns);
        Ok(())
    }

    fn read_back(&self, netns: &Path) -> Result<Option<String>, ApplyError> {
        Ok(self.tables.get(netns).cloned())
    }

    fn forget(&mut self, netns: &Path) {
        self.last_applied.remove(netns);
    }

    fn forget_all(&mut self) {
        self.last_applied.clear();
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
