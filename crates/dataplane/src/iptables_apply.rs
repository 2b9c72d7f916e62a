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
use std::sync::Arc;
use std::time::Duration;

use netwarden_engine::PodRules;
use netwarden_render::iptables::{
    empty_filter_table, is_owned_set, render_iptables, IptablesRuleset,
};
use netwarden_render::{RenderError, RenderOptions};

use crate::apply::{
    run_parallel, AppliedLog, ApplyError, ApplyOutcome, Backend, Dataplane, EvidenceCounters,
    SwitchCleanup, APPLY_WORKERS,
};
// Defined below `apply`, whose `ApplyError` carries it; re-exported where it has always been.
pub use crate::iptables_error::IptablesError;
use crate::netns::{self, exec_in, netns_gone, Netns, NetnsError};
use crate::tamper::{Difference, Part, VerifyScope};

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
    /// Whether the iptables backend left something here: one of its chains or sets (its
    /// rules in INPUT/OUTPUT always come with its chains).
    pub fn has_ours(&self) -> bool {
        let chains = |t: &str| {
            t.lines().any(|l| {
                l.strip_prefix(':')
                    .is_some_and(|c| c.starts_with(netwarden_render::iptables::CHAIN_PREFIX))
            })
        };
        !self.sets.is_empty() || chains(&self.v4) || chains(&self.v6)
    }

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

/// The iptables ruleset of one pod: `None` when nothing is isolated.
pub type IptablesRulesetRef = Option<Arc<IptablesRuleset>>;

/// The iptables backend: applies [`IptablesRuleset`]s into pod network namespaces, skipping
/// netns whose ruleset did not change since the last successful apply.
#[derive(Debug)]
pub struct IptablesDataplane {
    options: RenderOptions,
    /// In memory only: after an agent restart everything is re-applied once, which is atomic
    /// per table and idempotent.
    applied: AppliedLog,
    /// Netns found changed by a sweep, not yet reported by `changed_netns`.
    changed: Vec<PathBuf>,
    /// Per netns whose applied rules hold evidence counters: what earlier rule generations
    /// counted (a restore starts every rule counter at zero), or why that is unknown.
    carried: HashMap<PathBuf, Result<EvidenceCounters, String>>,
    /// Removes what the nft backend left in a netns (moving from nft to iptables): run on the
    /// first contact with a netns in this process, after the iptables rules are in place, and
    /// by `remove`. Given by [`switch`](crate::switch), where `new` is.
    switch_cleanup: SwitchCleanup,
    /// What the kernel showed right after each netns's last apply or repair, with the
    /// ruleset applied: what verification compares the kernel with, what a repair restores.
    applied_state: HashMap<PathBuf, (Arc<IptablesRuleset>, Fingerprint)>,
}

/// The filter tables and our sets as the kernel shows them, without what changes by itself
/// (packet and byte counters): taken right after an apply, compared at each verification.
///
/// Why the kernel's own listing and not the rendered text: `iptables-save` prints rules in
/// its own normal form (`-m tcp` added, options reordered), and the two only meet through
/// iptables' parser. Between the apply and this reading (the same worker, a few
/// milliseconds) a change would be taken as applied: the periodic check then sees nothing
/// wrong either — a race the nft backend, which compares with the rendered table, does not
/// have.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    v4: String,
    v6: String,
    ipset: String,
}

impl Fingerprint {
    fn of(state: &IptablesState) -> Fingerprint {
        // `:INPUT ACCEPT [12:3456]`: the policy is ours to keep, the counts are not.
        let table = |t: &str| -> String {
            t.lines()
                .map(|l| match (l.starts_with(':'), l.rfind(" [")) {
                    (true, Some(at)) => format!("{}\n", &l[..at]),
                    _ => format!("{l}\n"),
                })
                .collect()
        };
        // `create NAME ... initval 0x…`: the hash seed is drawn again whenever a set is
        // created again (a repair's restore), it is not ours to keep either.
        let ipset = state
            .ipset
            .lines()
            .map(|l| format!("{}\n", l.split(" initval ").next().unwrap_or(l)))
            .collect();
        Fingerprint {
            v4: table(&state.v4),
            v6: table(&state.v6),
            ipset,
        }
    }

    /// What differs, by table: the filter table of a family (its chains, rules and the jumps
    /// from INPUT/OUTPUT) or the sets.
    fn differences(&self, now: &Fingerprint) -> Vec<Difference> {
        let mut out = Vec::new();
        if self.v4 != now.v4 {
            out.push(Difference::Changed(Part::Rules("filter (IPv4)".into())));
        }
        if self.v6 != now.v6 {
            out.push(Difference::Changed(Part::Rules("filter (IPv6)".into())));
        }
        if self.ipset != now.ipset {
            out.push(Difference::Changed(Part::Elements("ipset".into())));
        }
        out
    }
}

/// Applies `ruleset` to `netns` and reads back what the kernel then holds.
fn apply_and_read(
    netns: &Path,
    ruleset: &IptablesRulesetRef,
) -> Result<Option<Fingerprint>, IptablesError> {
    apply_to(netns, ruleset)?;
    match ruleset {
        Some(_) => Ok(Some(Fingerprint::of(&read_state(netns)?))),
        None => Ok(None),
    }
}

impl IptablesDataplane {
    /// A dataplane that runs `switch_cleanup` to remove the other backend's rules (see the
    /// field). [`IptablesDataplane::new`] gives it the nft backend's.
    pub(crate) fn with_switch_cleanup(
        options: RenderOptions,
        switch_cleanup: SwitchCleanup,
    ) -> Self {
        IptablesDataplane {
            options,
            applied: AppliedLog::default(),
            changed: Vec::new(),
            carried: HashMap::new(),
            switch_cleanup,
            applied_state: HashMap::new(),
        }
    }

    /// Before `netns`'s rules are replaced: adds what their counters hold to the carry, when
    /// they hold any. A failed read taints the netns's figures (they would be too low) rather
    /// than stop the apply: enforcement never waits on evidence.
    fn carry_counters(&mut self, netns: &Path) {
        let Some(carried) = self.carried.get_mut(netns) else {
            return;
        };
        let Ok(sum) = carried else { return };
        match read_saved_counters(netns) {
            Ok(now) => add_counters(sum, &now),
            Err(e) => *carried = Err(e.to_string()),
        }
    }

    /// What the kernel holds in the netns: both filter tables and the sets of ours.
    pub fn read_state(&self, netns: &Path) -> Result<IptablesState, IptablesError> {
        read_state(netns)
    }

    /// Books the outcome of an apply to `handle` (the netns opened for it; `first`: the first
    /// contact with it in this process).
    fn finish(
        &mut self,
        netns: &Path,
        handle: Netns,
        first: bool,
        ruleset: &IptablesRulesetRef,
        result: Result<Option<Fingerprint>, IptablesError>,
    ) -> Result<ApplyOutcome, ApplyError> {
        self.applied_state.remove(netns);
        let fingerprint = match (result, ruleset) {
            (Err(e), None) if e.netns_gone() => return Ok(ApplyOutcome::Removed),
            (Err(e), _) => return Err(ApplyError::iptables(netns, e)),
            (Ok(fingerprint), _) => fingerprint,
        };
        if let (Some(ruleset), Some(fingerprint)) = (ruleset, fingerprint) {
            self.applied_state
                .insert(netns.to_owned(), (ruleset.clone(), fingerprint));
        }
        if first {
            (self.switch_cleanup)(netns)?;
        }
        if ruleset.as_ref().is_some_and(|r| r.counted) {
            self.carried
                .entry(netns.to_owned())
                .or_insert_with(|| Ok(EvidenceCounters::new()));
        } else {
            self.carried.remove(netns);
        }
        self.applied
            .record(netns, handle, netwarden_engine::hash::content_hash(ruleset));
        Ok(if ruleset.is_some() {
            ApplyOutcome::Applied
        } else {
            ApplyOutcome::Removed
        })
    }
}

/// Applies `ruleset` (`None`: removes what is ours) to `netns`.
fn apply_to(netns: &Path, ruleset: &IptablesRulesetRef) -> Result<(), IptablesError> {
    match ruleset {
        Some(r) => apply_uncached(netns, r),
        None => remove_from(netns),
    }
}

impl Dataplane for IptablesDataplane {
    type Ruleset = IptablesRulesetRef;
    const BACKEND: Backend = Backend::Iptables;

    fn render(&self, rules: &PodRules) -> Result<IptablesRulesetRef, RenderError> {
        // A learning pod is refused by the renderer (learn mode needs nft).
        if !rules.needs_rules() {
            return Ok(None);
        }
        Ok(Some(Arc::new(render_iptables(rules, &self.options)?)))
    }

    fn apply(
        &mut self,
        netns: &Path,
        ruleset: &IptablesRulesetRef,
    ) -> Result<ApplyOutcome, ApplyError> {
        if self
            .applied
            .is_current(netns, netwarden_engine::hash::content_hash(ruleset))
        {
            return Ok(ApplyOutcome::Unchanged);
        }
        let first = !self.applied.knows(netns);
        // Forget first: if anything below fails, the next sync must re-apply in full.
        self.applied.forget(netns);
        self.carry_counters(netns);
        // Opened before the apply: what was applied is recorded against this namespace.
        let handle = match Netns::open(netns) {
            Ok(handle) => handle,
            Err(e) if ruleset.is_none() && netns_gone(&e) => return Ok(ApplyOutcome::Removed),
            Err(source) => {
                return Err(ApplyError::Netns {
                    netns: netns.to_owned(),
                    source,
                })
            }
        };
        let result = apply_and_read(netns, ruleset);
        self.finish(netns, handle, first, ruleset, result)
    }

    /// Applies the changed rulesets of a batch to several netns at once (each restore mostly
    /// waits on the kernel).
    fn apply_many(
        &mut self,
        batch: &[(PathBuf, IptablesRulesetRef)],
    ) -> Vec<Result<ApplyOutcome, ApplyError>> {
        // Records of pods deleted since the last batch go now (each holds a netns alive); the
        // caller still hears of them from `changed_netns`.
        let changed = self.applied.take_changed();
        for netns in &changed {
            self.applied_state.remove(netns);
        }
        self.changed.extend(changed);
        let mut results: Vec<Option<Result<ApplyOutcome, ApplyError>>> =
            Vec::with_capacity(batch.len());
        let mut todo: Vec<(usize, Netns, bool)> = Vec::new();
        for (i, (netns, ruleset)) in batch.iter().enumerate() {
            if self
                .applied
                .is_current(netns, netwarden_engine::hash::content_hash(ruleset))
            {
                results.push(Some(Ok(ApplyOutcome::Unchanged)));
                continue;
            }
            let first = !self.applied.knows(netns);
            self.applied.forget(netns);
            self.carry_counters(netns);
            match Netns::open(netns) {
                Ok(handle) => {
                    results.push(None);
                    todo.push((i, handle, first));
                }
                Err(e) if ruleset.is_none() && netns_gone(&e) => {
                    results.push(Some(Ok(ApplyOutcome::Removed)))
                }
                Err(source) => results.push(Some(Err(ApplyError::Netns {
                    netns: netns.clone(),
                    source,
                }))),
            }
        }
        let outcomes = run_parallel(&todo, APPLY_WORKERS, |(i, _, _)| {
            let (netns, ruleset) = &batch[*i];
            apply_and_read(netns, ruleset)
        });
        for ((i, handle, first), outcome) in todo.into_iter().zip(outcomes) {
            let (netns, ruleset) = &batch[i];
            results[i] = Some(self.finish(netns, handle, first, ruleset, outcome));
        }
        results
            .into_iter()
            .map(|r| r.expect("every item has a result"))
            .collect()
    }

    fn remove(&mut self, netns: &Path) -> Result<(), ApplyError> {
        self.applied.forget(netns);
        self.carried.remove(netns);
        self.applied_state.remove(netns);
        match remove_from(netns) {
            Ok(()) => {}
            Err(e) if e.netns_gone() => return Ok(()),
            Err(source) => return Err(ApplyError::iptables(netns, source)),
        }
        // The nft backend's table too, if a switch left one (a netns gone by now is clean).
        (self.switch_cleanup)(netns)
    }

    /// Both filter tables and our sets, as `### ipset` / `### v4` / `### v6` sections; `None`
    /// when no rule, user chain or set of ours is left.
    fn read_back(&self, netns: &Path) -> Result<Option<String>, ApplyError> {
        let state = read_state(netns).map_err(|source| ApplyError::iptables(netns, source))?;
        if state.is_clean() {
            return Ok(None);
        }
        Ok(Some(format!(
            "### ipset\n{}### v4\n{}### v6\n{}",
            state.ipset, state.v4, state.v6
        )))
    }

    /// The rule counters now plus what earlier generations of the rules counted.
    fn read_counters(&self, netns: &Path) -> Result<EvidenceCounters, ApplyError> {
        let mut total = match self.carried.get(netns) {
            None => return Ok(EvidenceCounters::new()),
            Some(Err(why)) => {
                return Err(ApplyError::iptables(
                    netns,
                    IptablesError::CountersLost(why.clone()),
                ))
            }
            Some(Ok(carried)) => carried.clone(),
        };
        let now = read_saved_counters(netns).map_err(|e| ApplyError::iptables(netns, e))?;
        add_counters(&mut total, &now);
        Ok(total)
    }

    /// Both filter tables and our sets read again and compared with what the kernel showed
    /// after the last apply (see [`Fingerprint`]): the scope does not narrow it (one reading
    /// covers everything).
    fn verify(&self, netns: &Path, _scope: &VerifyScope) -> Result<Vec<Difference>, ApplyError> {
        let Some((_, applied)) = self.applied_state.get(netns) else {
            return Ok(Vec::new());
        };
        let now = read_state(netns).map_err(|e| ApplyError::iptables(netns, e))?;
        Ok(applied.differences(&Fingerprint::of(&now)))
    }

    /// The ruleset applied again: `ipset restore` refills every set through a swap, each
    /// restore replaces its whole filter table, and sets not ours to keep are destroyed.
    ///
    /// The fingerprint stays the apply's: read again here, a change made between the restore
    /// and the reading would be taken for the rules (a pod tampering in a loop wins that race
    /// now and then), and verification would not see it again.
    fn repair(&mut self, netns: &Path) -> Result<(), ApplyError> {
        let Some((ruleset, _)) = self.applied_state.get(netns).cloned() else {
            return Ok(());
        };
        self.carry_counters(netns);
        match apply_to(netns, &Some(ruleset)) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.forget(netns);
                Err(ApplyError::iptables(netns, e))
            }
        }
    }

    fn forget(&mut self, netns: &Path) {
        self.applied.forget(netns);
        self.applied_state.remove(netns);
    }

    fn forget_all(&mut self) {
        self.applied.forget_all();
        self.applied_state.clear();
    }

    fn changed_netns(&mut self) -> Vec<PathBuf> {
        let changed = self.applied.take_changed();
        for netns in &changed {
            self.applied_state.remove(netns);
        }
        self.changed.extend(changed);
        std::mem::take(&mut self.changed)
    }
}

/// Removes everything of the iptables backend from `netns` — empty filter tables for both
/// families and no set of ours — when something of it is there (a netns holding nothing of
/// ours is not touched: its filter table may be another tool's). Also what a switch to the nft
/// backend runs to clean up ([`switch`](crate::switch)). A netns that no longer exists has
/// nothing to clean.
pub fn remove_from(netns: &Path) -> Result<(), IptablesError> {
    if !netns.exists() {
        return Ok(());
    }
    if !read_state(netns)?.has_ours() {
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
pub fn read_state(netns: &Path) -> Result<IptablesState, IptablesError> {
    let save = |program: &str| -> Result<String, IptablesError> {
        let out =
            exec_in(netns, program, &["-t", "filter"], None).map_err(IptablesError::ReadBack)?;
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

/// Adds `more` into `sum`, counter by counter.
fn add_counters(sum: &mut EvidenceCounters, more: &EvidenceCounters) {
    for (k, v) in more {
        *sum.entry(*k).or_default() += v;
    }
}

/// The evidence counters of both families' filter tables (`iptables-save -c`), summed.
fn read_saved_counters(netns: &Path) -> Result<EvidenceCounters, IptablesError> {
    let mut total = EvidenceCounters::new();
    for program in ["iptables-save", "ip6tables-save"] {
        let out = exec_in(netns, program, &["-c", "-t", "filter"], None)
            .map_err(IptablesError::ReadBack)?;
        add_counters(
            &mut total,
            &parse_saved_counters(&String::from_utf8_lossy(&out.stdout)),
        );
    }
    Ok(total)
}

/// The evidence counters in `iptables-save -c` output: rules `[packets:bytes] -A … -m comment
/// --comment nw_cn_<key> …` (the comment possibly quoted), summed per name.
pub fn parse_saved_counters(saved: &str) -> EvidenceCounters {
    let mut out = EvidenceCounters::new();
    for line in saved.lines() {
        let Some(rest) = line.strip_prefix('[') else {
            continue;
        };
        let Some((packets, rule)) = rest.split_once(':') else {
            continue;
        };
        let Ok(packets) = packets.parse::<u64>() else {
            continue;
        };
        let Some((_, after)) = rule.split_once("--comment ") else {
            continue;
        };
        let name = after
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .trim_matches('"');
        if let Some((kind, key)) = netwarden_render::parse_counter_name(name) {
            *out.entry((key, kind)).or_default() += packets;
        }
    }
    out
}

/// Sets, then both tables, then stale sets (see the module doc for why in this order).
fn apply_uncached(netns: &Path, ruleset: &IptablesRuleset) -> Result<(), IptablesError> {
    let ipset = ruleset.ipset_script();
    if !ipset.is_empty() {
        exec_in(netns, "ipset", &["restore"], Some(ipset.as_bytes()))
            .map_err(IptablesError::Ipset)?;
    }
    exec_in(
        netns,
        "iptables-restore",
        &["-w"],
        Some(ruleset.v4.as_bytes()),
    )
    .map_err(IptablesError::RestoreV4)?;
    exec_in(
        netns,
        "ip6tables-restore",
        &["-w"],
        Some(ruleset.v6.as_bytes()),
    )
    .map_err(IptablesError::RestoreV6)?;
    destroy_stale_sets(netns, &ruleset.set_names())
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
    fn evidence_counters_are_read_from_saved_rules() {
        use netwarden_render::{CounterKind, LogKey};
        let saved = "*filter\n:INPUT ACCEPT [3:180]\n\
            [12:720] -A DANM_IN_0 -m conntrack --ctstate NEW -m comment --comment nw_cn_0000002a\n\
            [5:300] -A DANM_IN_0 -m mark --mark 0x20000/0x60000 -m conntrack --ctstate NEW -m comment --comment \"nw_wd_0000002a\"\n\
            [2:120] -A DANM_IN_0 -m limit --limit 10/min -m comment --comment nw_wl_0000002a -j NFLOG --nflog-prefix \"nw:wd:0000002a \"\n\
            [7:1] -A DANM_IN_0 -m comment --comment other-tool -j ACCEPT\n\
            [9:1] -A DANM_IN_0 -j MARK --set-xmark 0x0/0x60000\nCOMMIT\n";
        let got = parse_saved_counters(saved);
        assert_eq!(
            got,
            [
                ((LogKey(42), CounterKind::Connections), 12),
                ((LogKey(42), CounterKind::WouldDeny), 5),
                ((LogKey(42), CounterKind::Logged), 2),
            ]
            .into()
        );
    }

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
