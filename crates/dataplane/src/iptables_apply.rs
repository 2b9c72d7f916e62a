//! Applying the iptables compatibility ruleset ([`netwarden_render::iptables`]) to a pod netns.
//!
//! Order, so that no packet ever meets half-applied rules:
//! 1. `ipset restore`: every set the new rules reference is created (if missing), filled through
//!    a temporary and swapped in. Set names are derived from their content, so a live set keeps
//!    meaning the same addresses and the old rules, still in force, are unaffected.
//! 2. `iptables-restore -w` then `ip6tables-restore -w`: each replaces the whole filter table of
//!    its family in one kernel transaction (both the nf_tables and the legacy variants commit a
//!    table atomically). In iptables mode netwarden owns the filter table of the pod netns, as
//!    DANM Policer did; nat, mangle and raw are never touched. The two families are two
//!    transactions, but a packet belongs to one family and always sees one consistent table.
//! 3. Sets of ours that the new rules no longer reference are destroyed.
//!
//! A failure at any step leaves the old rules in force (steps 1 and 3 never change what the
//! live rules mean) except when the v6 restore fails after the v4 one succeeded; in every
//! failure case the netns is forgotten by the "unchanged" cache, so the next sync re-applies
//! everything.
//!
//! The iptables binary may be the nf_tables variant (`iptables v1.8.9 (nf_tables)`, the default
//! on current distributions, whose filter table shows up in `nft list ruleset` as
//! `table ip filter`) or the legacy one; [`iptables_variant`] tells which. The rules must be
//! read back with the same variant that wrote them, and a pod whose own tools use the other
//! variant would have two filter tables that both apply.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use netwarden_render::iptables::{empty_filter_table, is_owned_set, set_names, IptablesRuleset};

use crate::apply::{
    netns_gone, run_parallel, ApplyError, ApplyOutcome, Backend, Dataplane, RenderedRuleset,
    APPLY_WORKERS,
};
use crate::netns::{self, exec_in, NetnsError};

#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    #[error("ipset restore failed: {0}")]
    Ipset(#[source] NetnsError),
    #[error("iptables-restore (IPv4) failed: {0}")]
    RestoreV4(#[source] NetnsError),
    #[error("ip6tables-restore (IPv6) failed: {0}")]
    RestoreV6(#[source] NetnsError),
    #[error("reading back the rules failed: {0}")]
    ReadBack(#[source] NetnsError),
    #[error("cannot destroy stale ipset {name}: {source}")]
    Destroy { name: String, source: NetnsError },
    #[error("cannot determine the iptables variant: {0}")]
    Version(String),
}

impl IptablesError {
    /// The failed command (every stage but [`Version`](Self::Version) is one), whose program
    /// and arguments name the stage.
    fn into_netns_error(self) -> NetnsError {
        match self {
            IptablesError::Ipset(e)
            | IptablesError::RestoreV4(e)
            | IptablesError::RestoreV6(e)
            | IptablesError::ReadBack(e)
            | IptablesError::Destroy { source: e, .. } => e,
            IptablesError::Version(v) => NetnsError::Spawn {
                program: "iptables".into(),
                source: std::io::Error::other(v),
            },
        }
    }
}

/// Which kernel interface the `iptables` binaries drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IptablesVariant {
    /// `iptables-nft`: rules live in nf_tables tables (`table ip filter`).
    NfTables,
    /// `iptables-legacy`: the x_tables interface.
    Legacy,
}

/// `iptables --version` → variant (`iptables v1.8.9 (nf_tables)` / `(legacy)`; very old
/// versions print no variant and are legacy).
pub fn parse_variant(version_output: &str) -> Result<IptablesVariant, IptablesError> {
    let line = version_output.trim();
    if !line.starts_with("iptables v") {
        return Err(IptablesError::Version(line.to_string()));
    }
    Ok(if line.contains("(nf_tables)") {
        IptablesVariant::NfTables
    } else {
        IptablesVariant::Legacy
    })
}

/// The variant of the `iptables` on `PATH` (the binary does not depend on the netns).
pub fn iptables_variant() -> Result<IptablesVariant, IptablesError> {
    let out = netns::exec("iptables", &["--version"], None)
        .map_err(|e| IptablesError::Version(e.to_string()))?;
    parse_variant(&String::from_utf8_lossy(&out.stdout))
}

/// What happened on an apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IptablesApplyOutcome {
    /// The same texts were applied to this netns last time: nothing was run.
    Unchanged,
    /// Sets and both filter tables were (re)written.
    Applied,
}

/// What the kernel holds in a pod netns, as the tools print it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IptablesState {
    /// `iptables-save -t filter` (comment lines dropped).
    pub v4: String,
    /// `ip6tables-save -t filter` (comment lines dropped).
    pub v6: String,
    /// `ipset save` lines of the sets netwarden owns (create + add lines), sorted by set.
    pub ipset: String,
    /// Names of the sets netwarden owns.
    pub sets: BTreeSet<String>,
}

impl IptablesState {
    /// Whether nothing of netwarden is left: no set of ours and no rule or user chain in
    /// either filter table.
    pub fn is_clean(&self) -> bool {
        let clean = |t: &str| {
            !t.lines()
                .any(|l| l.starts_with("-A ") || l.starts_with(":DANM"))
        };
        self.sets.is_empty() && clean(&self.v4) && clean(&self.v6)
    }
}

/// The iptables backend: applies [`IptablesRuleset`]s into pod network namespaces, skipping
/// netns whose ruleset did not change since the last successful apply.
#[derive(Debug, Default)]
pub struct IptablesDataplane {
    /// [`RenderedRuleset::content_hash`] of the last ruleset applied successfully, per netns
    /// path. In memory only: after an agent restart everything is re-applied once, which is
    /// atomic and idempotent.
    applied: HashMap<PathBuf, u64>,
}

/// The [`RenderedRuleset`] of a rendered [`IptablesRuleset`]: a pod nothing isolates (the empty
/// ruleset) becomes the removal (no text at all); otherwise both families, and the ipset script
/// when there are sets.
pub fn rendered(ruleset: IptablesRuleset) -> RenderedRuleset {
    if ruleset == IptablesRuleset::empty() {
        return RenderedRuleset::iptables(None, None, None);
    }
    let ipset = (!ruleset.ipset.is_empty()).then_some(ruleset.ipset);
    RenderedRuleset::iptables(Some(ruleset.v4), Some(ruleset.v6), ipset)
}

impl IptablesDataplane {
    pub fn new() -> Self {
        Self::default()
    }

    fn cached(&self, netns: &Path) -> Option<u64> {
        self.applied.get(netns).copied()
    }

    fn remember(&mut self, netns: &Path, hash: Option<u64>) {
        match hash {
            Some(h) => self.applied.insert(netns.to_owned(), h),
            None => self.applied.remove(netns),
        };
    }

    /// Applies the three texts of [`netwarden_render::iptables::render_iptables`] to the netns
    /// at `netns`, unless they are what was last applied there. Empty `v4`/`v6` texts stand for
    /// the empty filter table.
    pub fn apply_texts(
        &mut self,
        netns: &Path,
        ipset: &str,
        v4: &str,
        v6: &str,
    ) -> Result<IptablesApplyOutcome, IptablesError> {
        let hash = RenderedRuleset::iptables(Some(v4.into()), Some(v6.into()), Some(ipset.into()))
            .content_hash();
        if self.cached(netns) == Some(hash) {
            return Ok(IptablesApplyOutcome::Unchanged);
        }
        // Forget first: if anything below fails, the next sync must re-apply in full.
        self.remember(netns, None);
        apply_uncached(netns, ipset, v4, v6)?;
        self.remember(netns, Some(hash));
        Ok(IptablesApplyOutcome::Applied)
    }

    /// [`apply_texts`](Self::apply_texts) of a rendered [`IptablesRuleset`].
    pub fn apply_ruleset(
        &mut self,
        netns: &Path,
        ruleset: &IptablesRuleset,
    ) -> Result<IptablesApplyOutcome, IptablesError> {
        self.apply_texts(netns, &ruleset.ipset, &ruleset.v4, &ruleset.v6)
    }

    /// Removes everything netwarden programmed: empty filter tables for both families and no
    /// set of ours. A netns that no longer exists has nothing left to clean.
    pub fn remove_from(&mut self, netns: &Path) -> Result<(), IptablesError> {
        self.remember(netns, None);
        if !netns.exists() {
            return Ok(());
        }
        let empty = empty_filter_table();
        exec_in(netns, "iptables-restore", &["-w"], Some(empty.as_bytes()))
            .map_err(IptablesError::RestoreV4)?;
        exec_in(netns, "ip6tables-restore", &["-w"], Some(empty.as_bytes()))
            .map_err(IptablesError::RestoreV6)?;
        destroy_stale_sets(netns, &BTreeSet::new())
    }

    /// What the kernel holds in the netns: both filter tables and the sets of ours.
    pub fn read_state(&self, netns: &Path) -> Result<IptablesState, IptablesError> {
        let save = |program: &str| -> Result<String, IptablesError> {
            let out = exec_in(netns, program, &["-t", "filter"], None)
                .map_err(IptablesError::ReadBack)?;
            Ok(String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| !l.starts_with('#'))
                .map(|l| format!("{l}\n"))
                .collect())
        };
        let v4 = save("iptables-save")?;
        let v6 = save("ip6tables-save")?;
        let sets = owned_sets(netns)?;
        let out = exec_in(netns, "ipset", &["save"], None).map_err(IptablesError::ReadBack)?;
        let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.split_whitespace().nth(1).is_some_and(is_owned_set))
            .map(str::to_string)
            .collect();
        // `create` sorts before `add` for the same set name once keyed by (name, verb).
        lines.sort_by(|a, b| {
            let key = |l: &str| {
                let mut w = l.split_whitespace();
                let verb = w.next().unwrap_or_default() != "create";
                (
                    w.next().unwrap_or_default().to_string(),
                    verb,
                    l.to_string(),
                )
            };
            key(a).cmp(&key(b))
        });
        let ipset = lines.into_iter().map(|l| l + "\n").collect();
        Ok(IptablesState {
            v4,
            v6,
            ipset,
            sets,
        })
    }
}

impl Dataplane for IptablesDataplane {
    fn apply(
        &mut self,
        netns: &Path,
        ruleset: &RenderedRuleset,
    ) -> Result<ApplyOutcome, ApplyError> {
        if ruleset.backend != Backend::Iptables {
            return Err(ApplyError::WrongBackend {
                backend: Backend::Iptables.as_str(),
                got: ruleset.backend.as_str(),
            });
        }
        let hash = ruleset.content_hash();
        if ruleset.is_removal() {
            if self.cached(netns) == Some(hash) {
                return Ok(ApplyOutcome::Unchanged);
            }
            self.remove(netns)?;
            self.remember(netns, Some(hash));
            return Ok(ApplyOutcome::Removed);
        }
        if self.cached(netns) == Some(hash) {
            return Ok(ApplyOutcome::Unchanged);
        }
        self.remember(netns, None);
        fn text(t: &Option<String>) -> &str {
            t.as_deref().unwrap_or_default()
        }
        apply_uncached(
            netns,
            text(&ruleset.ipset),
            text(&ruleset.iptables_v4),
            text(&ruleset.iptables_v6),
        )
        .map_err(|e| ApplyError::Apply {
            netns: netns.to_owned(),
            source: e.into_netns_error(),
        })?;
        self.remember(netns, Some(hash));
        Ok(ApplyOutcome::Applied)
    }

    /// Applies the changed rulesets of a batch to several netns at once (each restore mostly
    /// waits on the kernel); removals and unchanged rulesets are handled in order first.
    fn apply_many(
        &mut self,
        batch: &[(PathBuf, RenderedRuleset)],
    ) -> Vec<Result<ApplyOutcome, ApplyError>> {
        let mut results: Vec<Option<Result<ApplyOutcome, ApplyError>>> =
            Vec::with_capacity(batch.len());
        let mut todo: Vec<usize> = Vec::new();
        for (i, (netns, ruleset)) in batch.iter().enumerate() {
            let direct = ruleset.backend != Backend::Iptables
                || ruleset.is_removal()
                || self.cached(netns) == Some(ruleset.content_hash());
            if direct {
                results.push(Some(self.apply(netns, ruleset)));
            } else {
                // Forget first: if the apply fails, the next sync must re-apply in full.
                self.remember(netns, None);
                results.push(None);
                todo.push(i);
            }
        }
        fn text(t: &Option<String>) -> &str {
            t.as_deref().unwrap_or_default()
        }
        let outcomes = run_parallel(&todo, APPLY_WORKERS, |&i| {
            let (netns, r) = &batch[i];
            apply_uncached(
                netns,
                text(&r.ipset),
                text(&r.iptables_v4),
                text(&r.iptables_v6),
            )
        });
        for (i, outcome) in todo.into_iter().zip(outcomes) {
            let (netns, ruleset) = &batch[i];
            results[i] = Some(match outcome {
                Ok(_) => {
                    self.remember(netns, Some(ruleset.content_hash()));
                    Ok(ApplyOutcome::Applied)
                }
                Err(e) => Err(ApplyError::Apply {
                    netns: netns.to_owned(),
                    source: e.into_netns_error(),
                }),
            });
        }
        results
            .into_iter()
            .map(|r| r.expect("every item has a result"))
            .collect()
    }

    fn remove(&mut self, netns: &Path) -> Result<(), ApplyError> {
        match self.remove_from(netns) {
            Ok(()) => Ok(()),
            Err(e) => {
                let source = e.into_netns_error();
                if netns_gone(&source) {
                    Ok(())
                } else {
                    Err(ApplyError::Remove {
                        netns: netns.to_owned(),
                        source,
                    })
                }
            }
        }
    }

    /// Both filter tables and our sets, as `### ipset` / `### v4` / `### v6` sections; `None`
    /// when no rule, user chain or set of ours is left.
    fn read_back(&self, netns: &Path) -> Result<Option<String>, ApplyError> {
        let state = self.read_state(netns).map_err(|e| ApplyError::ReadBack {
            netns: netns.to_owned(),
            source: e.into_netns_error(),
        })?;
        if state.is_clean() {
            return Ok(None);
        }
        Ok(Some(format!(
            "### ipset\n{}### v4\n{}### v6\n{}",
            state.ipset, state.v4, state.v6
        )))
    }

    fn forget(&mut self, netns: &Path) {
        self.remember(netns, None);
    }

    fn forget_all(&mut self) {
        self.applied.clear();
    }
}

/// Sets, then both tables, then stale sets (see the module doc for why in this order).
fn apply_uncached(netns: &Path, ipset: &str, v4: &str, v6: &str) -> Result<(), IptablesError> {
    if !ipset.trim().is_empty() {
        exec_in(netns, "ipset", &["restore"], Some(ipset.as_bytes()))
            .map_err(IptablesError::Ipset)?;
    }
    let empty = empty_filter_table();
    let v4 = if v4.trim().is_empty() { &empty } else { v4 };
    let v6 = if v6.trim().is_empty() { &empty } else { v6 };
    exec_in(netns, "iptables-restore", &["-w"], Some(v4.as_bytes()))
        .map_err(IptablesError::RestoreV4)?;
    exec_in(netns, "ip6tables-restore", &["-w"], Some(v6.as_bytes()))
        .map_err(IptablesError::RestoreV6)?;
    destroy_stale_sets(netns, &set_names(ipset))
}

/// Names of the sets of ours present in the netns.
fn owned_sets(netns: &Path) -> Result<BTreeSet<String>, IptablesError> {
    let out = exec_in(netns, "ipset", &["list", "-n"], None).map_err(IptablesError::ReadBack)?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|n| is_owned_set(n))
        .map(str::to_string)
        .collect())
}

/// Destroys every set of ours not in `keep`. With the nf_tables variant a set's last
/// reference can be dropped asynchronously after the restore commits, so "in use" is retried
/// briefly before giving up.
fn destroy_stale_sets(netns: &Path, keep: &BTreeSet<String>) -> Result<(), IptablesError> {
    for name in owned_sets(netns)?.difference(keep) {
        let mut attempt = 0;
        loop {
            match exec_in(netns, "ipset", &["destroy", name], None) {
                Ok(_) => break,
                Err(NetnsError::Command { ref stderr, .. })
                    if stderr.contains("does not exist") =>
                {
                    break
                }
                Err(NetnsError::Command { ref stderr, .. })
                    if stderr.contains("in use") && attempt < 20 =>
                {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(25));
                }
                Err(source) => {
                    return Err(IptablesError::Destroy {
                        name: name.clone(),
                        source,
                    })
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_is_parsed() {
        assert_eq!(
            parse_variant("iptables v1.8.9 (nf_tables)\n").unwrap(),
            IptablesVariant::NfTables
        );
        assert_eq!(
            parse_variant("iptables v1.8.7 (legacy)").unwrap(),
            IptablesVariant::Legacy
        );
        assert_eq!(
            parse_variant("iptables v1.6.1").unwrap(),
            IptablesVariant::Legacy
        );
        assert!(parse_variant("nft v1.0").is_err());
    }

    #[test]
    fn clean_state_is_recognised() {
        let empty = IptablesState {
            v4: empty_filter_table(),
            v6: empty_filter_table(),
            ..Default::default()
        };
        assert!(empty.is_clean());
        let with_rule = IptablesState {
            v4: format!("{}-A INPUT -j ACCEPT\n", empty.v4),
            ..empty.clone()
        };
        assert!(!with_rule.is_clean());
        let with_set = IptablesState {
            sets: BTreeSet::from(["nw4-0".to_string()]),
            ..empty
        };
        assert!(!with_set.is_clean());
    }
}
