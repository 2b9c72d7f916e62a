//! The nftables dataplane: table `inet netwarden` in each pod netns, updated in place by one
//! libnftables transaction per apply ([`libnft`](crate::libnft): one buffer, one batch, all or
//! nothing — also when the agent is killed mid-apply).
//!
//! Each apply runs on a thread inside the pod's netns: it reads what the kernel holds when
//! that is not known yet, plans against it ([`nft_plan`](crate::nft_plan)) — new peer sets in a
//! transaction of their own, then the rules — and commits each as libnftables JSON (any
//! interface name, exactly). Contexts stay open per netns
//! ([`nft_contexts`](crate::nft_contexts)); batches apply to several netns at once.
//!
//! Moving from the iptables backend: the first time this process touches a netns, it looks for
//! the iptables backend's chains (`DANM_*` in a filter table, nf_tables or legacy) and, after
//! the nft table is in place (so no window opens), removes them with their sets through the
//! cleanup [`switch`](crate::switch) gave it (this module does not know the iptables backend).
//!
//! Nothing here touches another table: removal deletes `inet netwarden` only, and only when it
//! exists (the pod is open then, so no packet depends on what goes).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use netwarden_engine::PodRules;
use netwarden_render::iptables::CHAIN_PREFIX;
use netwarden_render::nft::{
    build_table, fallback_table_name, is_netwarden_table_name, Table, Transaction, TABLE_FAMILY,
    TABLE_NAME,
};
use netwarden_render::{RenderError, RenderOptions};

use crate::apply::{
    run_parallel, AppliedLog, ApplyError, ApplyOutcome, Backend, Dataplane, EvidenceCounters,
    SwitchCleanup, APPLY_WORKERS,
};
use crate::libnft::{LibnftError, NftContext, Output};
use crate::netns::{netns_gone, Netns};
use crate::nft_contexts::{ContextPool, MAX_CONTEXTS};
use crate::nft_netlink::{self, ListingError};
use crate::nft_plan::{plan, KernelTables, NftNetnsState, NftObjects};
use crate::nft_verify::{elements_differ, rule_differences};
use crate::tamper::{Difference, Part, VerifyScope};

/// The nft ruleset of one pod: its table, `None` when nothing is isolated.
pub type NftRuleset = Option<Arc<Table>>;

/// One apply inside a netns, run on a thread that entered it. When the state is unknown (first
/// contact in this process, or after a failure or a change of netns), the kernel is read, and
/// the iptables backend's leftovers are looked for at the same time.
struct Job {
    ctx: Option<NftContext>,
    desired: NftRuleset,
    state: Option<NftNetnsState>,
    /// The name of netwarden's table in this netns ([`TABLE_NAME`] unless a pod took it).
    table_name: String,
    /// The ruleset generation of the netns's last clean comparison, if known (see
    /// `Committed::vouched`).
    verified: Option<u32>,
}

struct JobDone {
    /// The context to keep (`None`: nothing to keep, the pod is open).
    ctx: Option<NftContext>,
    result: Result<Committed, JobError>,
}

struct Committed {
    /// The generation after the job, when it can stand for a clean comparison: the netns was
    /// at its last clean comparison's generation when the job began, and every commit since
    /// is one of the job's (each moves it by one). Then the kernel holds exactly what was
    /// compared plus what the job committed, and the notifications of the job's own commits
    /// need no listing (see `NftDataplane::verify`).
    vouched: Option<u32>,
    after: NftNetnsState,
    /// The table's name now (another than the job's when the pod holds that one).
    table_name: String,
    /// The iptables backend's chains were found in this netns.
    iptables_leftovers: bool,
}

enum JobError {
    Nft(crate::libnft::LibnftError),
    Listing(serde_json::Error),
    Reading(ListingError),
}

impl JobError {
    fn into_apply_error(self, netns: &Path) -> ApplyError {
        match self {
            JobError::Nft(source) => ApplyError::Nft {
                netns: netns.to_owned(),
                source,
            },
            JobError::Listing(source) => ApplyError::Listing {
                netns: netns.to_owned(),
                source,
            },
            JobError::Reading(source) => ApplyError::Reading {
                netns: netns.to_owned(),
                source,
            },
        }
    }
}

impl From<crate::libnft::LibnftError> for JobError {
    fn from(e: crate::libnft::LibnftError) -> Self {
        JobError::Nft(e)
    }
}

impl From<ListingError> for JobError {
    fn from(e: ListingError) -> Self {
        JobError::Reading(e)
    }
}

impl From<serde_json::Error> for JobError {
    fn from(e: serde_json::Error) -> Self {
        JobError::Listing(e)
    }
}

/// Every table of the netns of the calling thread, each with the names of its sets and
/// chains, over nf_tables netlink dumps ([`nft_netlink`](crate::nft_netlink): no libnftables
/// listing, which would print the tables a pod made, see there).
///
/// Names only, never set elements: a restarted agent finds tables whose peer sets hold
/// thousands of elements (20,000 pods: about half a second of CPU per libnftables listing that
/// fetched them), and reading them kept it from ever finishing its first sync (issue 20,
/// defect 6).
fn list_ruleset() -> Result<KernelTables, JobError> {
    Ok(nft_netlink::read_here()?.objects)
}

/// The evidence counters ([`netwarden_render::CounterKind`]) of netwarden's table `inet
/// NAME` in the calling thread's netns; other counters (learn mode's) are left out.
fn evidence_counters(name: &str) -> Result<EvidenceCounters, JobError> {
    let mut out = EvidenceCounters::new();
    for ((family, table, counter), packets) in nft_netlink::read_here()?.counters {
        if family != TABLE_FAMILY || table != name {
            continue;
        }
        if let Some((kind, key)) = netwarden_render::parse_counter_name(&counter) {
            out.insert((key, kind), packets);
        }
    }
    Ok(out)
}

/// What netwarden's table `inet NAME` holds (names only; empty when there is none).
fn netwarden_objects(tables: &KernelTables, name: &str) -> NftObjects {
    tables
        .get(&(TABLE_FAMILY.to_string(), name.to_string()))
        .cloned()
        .unwrap_or_default()
}

/// The tables of netwarden's names ([`is_netwarden_table_name`]) other than `name`: what an
/// earlier agent left under another name, to delete once the rules are in place.
fn other_netwarden_tables(tables: &KernelTables, name: &str) -> Vec<String> {
    tables
        .keys()
        .filter(|(family, table)| {
            family == TABLE_FAMILY && table != name && is_netwarden_table_name(table)
        })
        .map(|(_, table)| table.clone())
        .collect()
}

/// Whether nft refused a transaction because a table it names belongs to another process.
///
/// A process may create a table with the `owner` flag: while its netlink socket lives, the
/// kernel refuses every change to that table by anyone else with `EPERM` — root and
/// `CAP_NET_ADMIN` included, and nothing else refuses netwarden that way. A pod with
/// `CAP_NET_ADMIN` can delete netwarden's table and create its own of the same name so: the
/// rules then go to a table of another name ([`fresh_table_name`]).
fn refused_by_owner(e: &LibnftError) -> bool {
    matches!(e, LibnftError::Refused(msg) if msg.contains("Operation not permitted"))
}

/// A new random [`fallback_table_name`].
fn fresh_table_name() -> String {
    use std::hash::{BuildHasher, Hasher};
    // Random keys per `RandomState` (from the OS, then stepped per thread): a pod cannot know
    // the name before netwarden creates it.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    fallback_table_name(hasher.finish())
}

/// Commits `tx` on table `inet NAME`.
fn commit(ctx: &mut NftContext, tx: &Transaction<'_>, name: &str) -> Result<(), JobError> {
    ctx.run(&tx.to_json_in(name), Output::Json)?;
    Ok(())
}

/// Whether the iptables backend's chains are in this netns: in an nf_tables `filter` table
/// (iptables-nft), or a legacy x_tables `filter` table exists (then the iptables tools tell).
fn iptables_leftovers(tables: &KernelTables) -> bool {
    let nft = ["ip", "ip6"].iter().any(|family| {
        tables
            .get(&(family.to_string(), "filter".to_string()))
            .is_some_and(|t| t.chains.iter().any(|c| c.starts_with(CHAIN_PREFIX)))
    });
    // /proc/thread-self/net is this thread's netns (the pod's); /proc/net would be the
    // thread-group leader's.
    nft || ["ip_tables_names", "ip6_tables_names"].iter().any(|f| {
        std::fs::read_to_string(format!("/proc/thread-self/net/{f}"))
            .is_ok_and(|names| names.lines().any(|l| l.trim() == "filter"))
    })
}

/// Runs one job on the current thread, which is inside the netns.
fn run_job(job: Job) -> JobDone {
    let mut ctx = match job.ctx {
        Some(ctx) => ctx,
        None => match NftContext::new() {
            Ok(ctx) => ctx,
            Err(e) => {
                return JobDone {
                    ctx: None,
                    result: Err(e.into()),
                }
            }
        },
    };
    let result = (|| {
        let mut name = job.table_name;
        let at_start = job
            .verified
            .and_then(|_| nft_netlink::generation_here().ok());
        let commits = std::cell::Cell::new(0u32);
        let commit = |ctx: &mut NftContext, tx: &Transaction, name: &str| {
            let result = commit(ctx, tx, name);
            if result.is_ok() {
                commits.set(commits.get() + 1);
            }
            result
        };
        // First contact (or after a failure): one cheap listing says what the kernel holds,
        // whether the iptables backend left chains here, and which tables of netwarden's
        // names an earlier agent left.
        let (state, iptables_leftovers, others) = match job.state {
            Some(state) => (state, false, Vec::new()),
            None => {
                let tables = list_ruleset()?;
                (
                    NftNetnsState::from_kernel(netwarden_objects(&tables, &name)),
                    iptables_leftovers(&tables),
                    other_netwarden_tables(&tables, &name),
                )
            }
        };
        // A new table (see below) is planned from nothing.
        let empty = NftNetnsState::default();
        let mut plan = plan(job.desired.as_deref(), &state);
        // New sets first, then the rules that use them (see `nft_plan`): each an atomic batch.
        let committed = plan
            .transactions()
            .try_for_each(|tx| commit(&mut ctx, tx, &name));
        match committed {
            Ok(()) => {}
            // The pod holds a table of this name (see `refused_by_owner`): it is not ours. An
            // open pod needs nothing; an isolated one gets its rules in a new table.
            Err(JobError::Nft(e)) if refused_by_owner(&e) && job.desired.is_none() => {}
            Err(JobError::Nft(e)) if refused_by_owner(&e) => {
                name = fresh_table_name();
                plan = crate::nft_plan::plan(job.desired.as_deref(), &empty);
                plan.transactions()
                    .try_for_each(|tx| commit(&mut ctx, tx, &name))?;
            }
            Err(e) => return Err(e),
        }
        // Once the rules are in place: an earlier agent's table under another name goes (one
        // that a pod holds cannot, and is not ours).
        for other in others.iter().filter(|other| **other != name) {
            let _ = commit(&mut ctx, &Transaction::removal(), other);
        }
        let vouched = match (job.verified, at_start) {
            (Some(verified), Some(start)) if verified == start => nft_netlink::generation_here()
                .ok()
                .filter(|now| *now == start.wrapping_add(commits.get())),
            _ => None,
        };
        Ok(Committed {
            vouched,
            after: plan.after,
            table_name: name,
            iptables_leftovers,
        })
    })();
    // An open pod needs no context: do not keep its netns alive.
    let keep = job.desired.is_some() && result.is_ok();
    JobDone {
        ctx: keep.then_some(ctx),
        result,
    }
}

/// Applies nft rulesets, skipping those identical to the last successful apply of the netns.
#[derive(Debug)]
pub struct NftDataplane {
    options: RenderOptions,
    /// Last successful applies (dropped on any failure: the next sync is a full one).
    applied: AppliedLog,
    /// What the table holds, per netns, as of our last transaction. Dropped on any failure,
    /// `forget`, or when the netns changed (then read from the kernel before the next apply).
    state: HashMap<PathBuf, NftNetnsState>,
    /// The table last applied, per netns (what verification compares the kernel with, and
    /// what a repair puts back). Absent: nothing of ours known there.
    tables: HashMap<PathBuf, Arc<Table>>,
    /// The name of netwarden's table, per netns where it is not [`TABLE_NAME`] (a pod holds a
    /// table of that name: see `refused_by_owner`). Dropped with the state: the next full
    /// apply tries [`TABLE_NAME`] again.
    names: HashMap<PathBuf, String>,
    /// Evidence counter values a repair reset (it recreates the table), per netns: added to
    /// what the kernel counts from then on, so the counters stay cumulative.
    carried: HashMap<PathBuf, EvidenceCounters>,
    contexts: ContextPool,
    /// Netns found changed by a sweep, not yet reported by `changed_netns`.
    changed: Vec<PathBuf>,
    /// Per netns, the ruleset generation at its last clean comparison (see `verify`).
    verified: Mutex<HashMap<PathBuf, Verified>>,
    /// Set when the agent stops: a batch starts no further netns (see `Dataplane::set_stop`).
    stop: Arc<AtomicBool>,
    /// Added to every netns apply of a batch (see [`SLOW_APPLY_ENV`]).
    slow_apply: std::time::Duration,
    /// Removes the iptables backend's chains and sets from a netns where a job found them
    /// (moving from iptables to nft). Given by [`switch`](crate::switch), where `new` is.
    switch_cleanup: SwitchCleanup,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A netns whose rules compared equal to what was applied, at a ruleset generation.
#[derive(Debug, Clone, Copy)]
struct Verified {
    /// `NFT_MSG_GETGEN` then: every nf_tables commit in the netns moves it.
    generation: u32,
    /// Comparisons answered from the generation since the last listing.
    skipped: u32,
    /// Whether the comparison covered every set's elements too (else the rules and objects
    /// only: what the periodic comparison asks for).
    whole: bool,
}

/// Where a netns first compared by the periodic comparison starts counting towards
/// [`LIST_EVERY`]: spread by path, so that it lists a sixth of the netns each round, not all
/// of them every sixth round (a burst of child processes that held the agent's loop ~400 ms).
fn list_offset(netns: &Path) -> u32 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    netns.hash(&mut hasher);
    (hasher.finish() % u64::from(LIST_EVERY)) as u32
}

/// Every how many comparisons of an unchanged generation the rules are listed anyway (a
/// bound on trusting the generation: a 32-bit counter a pod could, in principle, wrap).
const LIST_EVERY: u32 = 6;

/// Test hook: milliseconds each netns apply of a batch is held up before it starts, so that
/// the agent's tests can stop it in the middle of a long sync (a slow kernel) without
/// building thousands of netns. Unset in production.
pub const SLOW_APPLY_ENV: &str = "NETWARDEN_TEST_SLOW_APPLY_MS";

impl NftDataplane {
    /// A dataplane that runs `switch_cleanup` to remove the other backend's rules (see the
    /// field). [`NftDataplane::new`] gives it the iptables backend's.
    pub(crate) fn with_switch_cleanup(
        options: RenderOptions,
        switch_cleanup: SwitchCleanup,
    ) -> Self {
        NftDataplane {
            options,
            applied: AppliedLog::default(),
            state: HashMap::new(),
            tables: HashMap::new(),
            names: HashMap::new(),
            carried: HashMap::new(),
            contexts: ContextPool::new(MAX_CONTEXTS),
            changed: Vec::new(),
            verified: Mutex::new(HashMap::new()),
            stop: Arc::new(AtomicBool::new(false)),
            slow_apply: std::env::var(SLOW_APPLY_ENV)
                .ok()
                .and_then(|ms| ms.parse().ok())
                .map_or(std::time::Duration::ZERO, std::time::Duration::from_millis),
            switch_cleanup,
        }
    }

    /// Keeps at most `max` contexts open (0: a new context for every apply).
    pub fn with_max_contexts(mut self, max: usize) -> Self {
        self.contexts.set_max(max);
        self
    }

    /// How many contexts are open (each holds its netns alive).
    pub fn contexts_open(&self) -> usize {
        self.contexts.len()
    }

    /// The netns this dataplane believes are programmed (applied and not forgotten).
    pub fn known(&self) -> impl Iterator<Item = &Path> {
        self.applied.paths()
    }

    /// What this dataplane believes the table in `netns` holds (`None`: unknown, read back at
    /// the next apply).
    pub fn state(&self, netns: &Path) -> Option<&NftNetnsState> {
        self.state.get(netns)
    }

    /// The name of netwarden's table in `netns`.
    pub fn table_name(&self, netns: &Path) -> &str {
        self.names.get(netns).map_or(TABLE_NAME, String::as_str)
    }

    /// Runs `f` with a fresh context inside `netns`.
    fn with_context<T: Send + 'static>(
        netns: &Path,
        f: impl FnOnce(&mut NftContext) -> Result<T, JobError> + Send + 'static,
    ) -> Result<T, ApplyError> {
        Self::in_netns(netns, move || f(&mut NftContext::new()?))
    }

    /// Runs `f` on a thread inside `netns` (what reads the kernel over netlink needs no
    /// libnftables context).
    fn in_netns<T: Send + 'static>(
        netns: &Path,
        f: impl FnOnce() -> Result<T, JobError> + Send + 'static,
    ) -> Result<T, ApplyError> {
        let handle = Netns::open(netns).map_err(|source| ApplyError::Netns {
            netns: netns.to_owned(),
            source,
        })?;
        handle
            .run(f)
            .map_err(|source| ApplyError::Netns {
                netns: netns.to_owned(),
                source,
            })?
            .map_err(|e| e.into_apply_error(netns))
    }

    /// The evidence counters of netwarden's table `inet NAME` in `netns` (none when it has no
    /// table).
    fn read_counters_in(netns: &Path, name: String) -> Result<EvidenceCounters, ApplyError> {
        Self::in_netns(netns, move || evidence_counters(&name))
    }

    /// Forgets the netns whose path names another namespace (or none) now, releasing what held
    /// them, and keeps their paths for [`Dataplane::changed_netns`].
    fn sweep_changed(&mut self) {
        for netns in self.applied.take_changed() {
            self.state.remove(&netns);
            self.tables.remove(&netns);
            self.names.remove(&netns);
            self.carried.remove(&netns);
            self.contexts.close(&netns);
            self.changed.push(netns);
        }
    }

    /// Deletes netwarden's tables (`inet netwarden`, and any under another of its names) from
    /// `netns` if they are there, and nothing else (no bookkeeping, no look at other tables):
    /// how a switch to the iptables backend removes what the nft backend left
    /// ([`switch`](crate::switch)). Whether a table was deleted (one a pod holds is not
    /// netwarden's: it stays).
    pub fn remove_table(netns: &Path) -> Result<bool, ApplyError> {
        Self::with_context(netns, |ctx| {
            let tables = list_ruleset()?;
            let mut deleted = false;
            for name in other_netwarden_tables(&tables, "") {
                match commit(ctx, &Transaction::removal(), &name) {
                    Ok(()) => deleted = true,
                    Err(JobError::Nft(e)) if refused_by_owner(&e) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(deleted)
        })
    }

    /// Whether netwarden's table exists in `netns`.
    pub fn table_exists(&self, netns: &Path) -> Result<bool, ApplyError> {
        self.kernel_objects(netns).map(|objects| objects.table)
    }

    /// The sets and chains netwarden's table in `netns` holds (empty when there is none).
    pub fn kernel_objects(&self, netns: &Path) -> Result<NftObjects, ApplyError> {
        let name = self.table_name(netns).to_string();
        Self::in_netns(netns, move || {
            Ok(netwarden_objects(&list_ruleset()?, &name))
        })
    }

    /// Checks `table`'s creation transaction against the kernel of `netns` without applying
    /// anything (`nft -c`).
    pub fn check(&self, netns: &Path, table: &Table) -> Result<(), ApplyError> {
        let json = Transaction::create(table).to_json_in(self.table_name(netns));
        Self::with_context(netns, move |ctx| Ok(ctx.check(&json, Output::Json)?))
    }

    /// The job for `netns`, taking its context and state out (a failure leaves both unknown).
    fn job(&mut self, netns: &Path, desired: &NftRuleset) -> Job {
        let state = self.state.remove(netns);
        if state.is_none() {
            // Unknown state: the name is found again (see `names`).
            self.names.remove(netns);
        }
        Job {
            ctx: self.contexts.take(netns),
            desired: desired.clone(),
            state,
            table_name: self.table_name(netns).to_string(),
            verified: lock(&self.verified).get(netns).map(|v| v.generation),
        }
    }

    /// Books the outcome of a job on `handle` (the netns opened for it): context, state,
    /// iptables leftovers, applied hash.
    fn finish(
        &mut self,
        netns: &Path,
        handle: Netns,
        ruleset: &NftRuleset,
        done: JobDone,
    ) -> Result<ApplyOutcome, ApplyError> {
        let committed = match done.result {
            Ok(committed) => committed,
            Err(e) => {
                lock(&self.verified).remove(netns);
                return Err(e.into_apply_error(netns));
            }
        };
        {
            let mut verified = lock(&self.verified);
            match committed.vouched {
                Some(generation) => {
                    // What was compared, plus the job's commits: as wide as the comparison.
                    if let Some(v) = verified.get_mut(netns) {
                        v.generation = generation;
                    }
                }
                None => {
                    verified.remove(netns);
                }
            }
        }
        if let Some(ctx) = done.ctx {
            self.contexts.give_back(netns, ctx, handle.id());
        }
        if committed.iptables_leftovers {
            // After the nft table is in place: the pod is enforced throughout.
            (self.switch_cleanup)(netns)?;
        }
        self.state.insert(netns.to_owned(), committed.after);
        if committed.table_name == TABLE_NAME || ruleset.is_none() {
            self.names.remove(netns);
        } else {
            self.names
                .insert(netns.to_owned(), committed.table_name.clone());
        }
        match ruleset {
            Some(table) => self.tables.insert(netns.to_owned(), table.clone()),
            None => {
                self.carried.remove(netns);
                self.tables.remove(netns)
            }
        };
        self.applied
            .record(netns, handle, netwarden_engine::hash::content_hash(ruleset));
        Ok(if ruleset.is_none() {
            ApplyOutcome::Removed
        } else {
            ApplyOutcome::Applied
        })
    }

    fn run_one(&mut self, netns: &Path, ruleset: &NftRuleset) -> Result<ApplyOutcome, ApplyError> {
        let handle = Netns::open(netns).map_err(|source| {
            // Its context (if any) serves a namespace that is gone or replaced.
            self.contexts.close(netns);
            ApplyError::Netns {
                netns: netns.to_owned(),
                source,
            }
        })?;
        let job = self.job(netns, ruleset);
        let done = handle
            .run(move || run_job(job))
            .map_err(|source| ApplyError::Netns {
                netns: netns.to_owned(),
                source,
            })?;
        self.finish(netns, handle, ruleset, done)
    }
}

/// The transaction that puts `table` back whatever the netns holds: the table declared (so
/// that its deletion cannot fail), deleted with everything in it, and created again, in one
/// batch. Nothing someone added survives it and nothing is half done.
///
/// Its cost, beside a refill: the peer sets are new sets, and an interval set answers from a
/// search array the kernel builds as the transaction commits (see `nft_plan`), so allowed
/// packets arriving during the commit of a repair may be refused — in the netns that was
/// tampered with, at the moment its rules were being put back.
fn restore_transaction(table: &Table, name: &str) -> String {
    let mut tx = Transaction::removal();
    tx.commands.extend(Transaction::create(table).commands);
    tx.to_json_in(name)
}

/// [`Dataplane::verify`] inside the netns of `ctx`.
fn verify_in(
    ctx: &mut NftContext,
    table: &Table,
    name: &str,
    kept: &BTreeSet<String>,
    scope: &VerifyScope,
) -> Result<Vec<Difference>, JobError> {
    let listing = nft_netlink::ruleset_json_here(name)?;
    let mut out = rule_differences(Some(table), name, kept, &listing)?;
    if out.contains(&Difference::Missing(Part::Table)) {
        return Ok(out);
    }
    for set in &table.sets {
        if !(scope.all || scope.sets.contains(&set.name)) {
            continue;
        }
        if out.contains(&Difference::Missing(Part::Set(set.name.clone()))) {
            continue;
        }
        let listing = ctx.run(
            &format!("list set {TABLE_FAMILY} {name} {}", set.name),
            Output::Json,
        )?;
        if elements_differ(set, name, &listing)? {
            out.push(Difference::Changed(Part::Elements(set.name.clone())));
        }
    }
    Ok(out)
}

impl NftDataplane {
    /// `counters` plus what a repair carried over for `netns`.
    fn with_carried(&self, netns: &Path, mut counters: EvidenceCounters) -> EvidenceCounters {
        if let Some(carried) = self.carried.get(netns) {
            for (key, value) in carried {
                *counters.entry(*key).or_default() += value;
            }
        }
        counters
    }
}

/// The table a pod's rules need, shared by every nft-shaped dataplane (this one and the fake).
pub(crate) fn render_ruleset(
    rules: &PodRules,
    options: &RenderOptions,
) -> Result<NftRuleset, RenderError> {
    Ok(build_table(rules, options)?.map(Arc::new))
}

impl Dataplane for NftDataplane {
    type Ruleset = NftRuleset;
    const BACKEND: Backend = Backend::Nft;

    fn render(&self, rules: &PodRules) -> Result<NftRuleset, RenderError> {
        render_ruleset(rules, &self.options)
    }

    fn apply(&mut self, netns: &Path, ruleset: &NftRuleset) -> Result<ApplyOutcome, ApplyError> {
        let hash = netwarden_engine::hash::content_hash(ruleset);
        if self.applied.is_current(netns, hash) {
            return Ok(ApplyOutcome::Unchanged);
        }
        // Forget first: whatever happens below, a failure must leave no stale hash behind.
        self.applied.forget(netns);
        let result = self.run_one(netns, ruleset);
        if ruleset.is_none() {
            // Nothing of ours is left to remember in an open pod's netns.
            self.contexts.close(netns);
            if matches!(&result, Err(e) if e.netns_gone()) {
                return Ok(ApplyOutcome::Removed);
            }
        }
        result
    }

    /// Applies the changed rulesets of a batch to several netns at once; unchanged ones are
    /// skipped. Each netns still gets exactly one transaction, planned against its own state.
    fn apply_many(
        &mut self,
        batch: &[(PathBuf, NftRuleset)],
    ) -> Vec<Result<ApplyOutcome, ApplyError>> {
        // Contexts and applied records of pods deleted since the last batch go now (each holds
        // a netns alive); the caller still hears of them from `changed_netns`.
        self.sweep_changed();
        self.contexts.prune();
        let mut results: Vec<Option<Result<ApplyOutcome, ApplyError>>> =
            Vec::with_capacity(batch.len());
        // Each worker owns its item's job while it runs (the Mutex is never contended).
        // Each worker owns its item's job while it runs (the Mutex is never contended). The
        // netns is opened here, before the apply: what was applied is recorded against it.
        let mut todo: Vec<(usize, Netns, Mutex<Option<Job>>)> = Vec::new();
        for (i, (netns, ruleset)) in batch.iter().enumerate() {
            let hash = netwarden_engine::hash::content_hash(ruleset);
            if self.applied.is_current(netns, hash) {
                results.push(Some(Ok(ApplyOutcome::Unchanged)));
                continue;
            }
            self.applied.forget(netns);
            match Netns::open(netns) {
                Ok(handle) => {
                    let job = self.job(netns, ruleset);
                    todo.push((i, handle, Mutex::new(Some(job))));
                    results.push(None);
                }
                Err(e) if ruleset.is_none() && netns_gone(&e) => {
                    self.contexts.close(netns);
                    results.push(Some(Ok(ApplyOutcome::Removed)));
                }
                Err(source) => {
                    self.contexts.close(netns);
                    results.push(Some(Err(ApplyError::Netns {
                        netns: netns.clone(),
                        source,
                    })))
                }
            }
        }
        let stop = &self.stop;
        let slow_apply = self.slow_apply;
        let outcomes = run_parallel(&todo, APPLY_WORKERS, |(_, handle, job)| {
            // A stopping agent starts no further netns: the rest keep the rules they have.
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            std::thread::sleep(slow_apply);
            let job = job
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .expect("each job runs once");
            // This worker thread is scoped to the batch: entering one netns after the other is
            // harmless (see `netns`).
            Some(handle.enter_current_thread().map(|()| run_job(job)))
        });
        for ((i, handle, _), outcome) in todo.into_iter().zip(outcomes) {
            let (netns, ruleset) = &batch[i];
            let result = match outcome {
                Some(Ok(done)) => self.finish(netns, handle, ruleset, done),
                Some(Err(source)) => Err(ApplyError::Netns {
                    netns: netns.clone(),
                    source,
                }),
                None => Err(ApplyError::Stopped {
                    netns: netns.clone(),
                }),
            };
            if ruleset.is_none() {
                self.contexts.close(netns);
            }
            results[i] = Some(match result {
                Err(e) if ruleset.is_none() && e.netns_gone() => Ok(ApplyOutcome::Removed),
                other => other,
            });
        }
        results
            .into_iter()
            .map(|r| r.expect("every item has a result"))
            .collect()
    }

    fn remove(&mut self, netns: &Path) -> Result<(), ApplyError> {
        self.applied.forget(netns);
        self.state.remove(netns);
        self.contexts.close(netns);
        match self.run_one(netns, &None) {
            Ok(_) => Ok(()),
            // The pod and its netns are gone: so are its rules.
            Err(e) if e.netns_gone() => Ok(()),
            Err(e) => Err(e),
        }
        .inspect(|()| {
            // Removed rules are not "applied": the next apply of this netns is a full one.
            self.applied.forget(netns);
            self.contexts.close(netns);
        })
    }

    fn read_back(&self, netns: &Path) -> Result<Option<String>, ApplyError> {
        let name = self.table_name(netns).to_string();
        Self::with_context(netns, move |ctx| {
            if !netwarden_objects(&list_ruleset()?, &name).table {
                return Ok(None);
            }
            Ok(Some(ctx.run(
                &format!("list table {TABLE_FAMILY} {name}"),
                Output::Text,
            )?))
        })
    }

    /// Named counters keep their values across chain refills (`add counter` of an existing
    /// one changes nothing), so the kernel's figures are cumulative already.
    fn read_counters(&self, netns: &Path) -> Result<EvidenceCounters, ApplyError> {
        Self::read_counters_in(netns, self.table_name(netns).to_string())
            .map(|c| self.with_carried(netns, c))
    }

    /// Side by side, as applies run: each reading waits on its own netns thread and
    /// listing (about 10 ms each; 100 pods read one after the other held the agent's first
    /// status up for a second).
    fn read_counters_many(&self, netns: &[&Path]) -> Vec<Result<EvidenceCounters, ApplyError>> {
        let names: Vec<(&Path, String)> = netns
            .iter()
            .map(|n| (*n, self.table_name(n).to_string()))
            .collect();
        let read = run_parallel(&names, APPLY_WORKERS, |(n, name)| {
            Self::read_counters_in(n, name.clone())
        });
        read.into_iter()
            .zip(netns)
            .map(|(r, n)| r.map(|c| self.with_carried(n, c)))
            .collect()
    }

    fn verify(&self, netns: &Path, scope: &VerifyScope) -> Result<Vec<Difference>, ApplyError> {
        let Some(table) = self.tables.get(netns).cloned() else {
            return Ok(Vec::new());
        };
        let scope = scope.clone();
        // The sets the last apply left beside the table's (kept while old rules may walk them).
        let kept = self
            .state
            .get(netns)
            .map(|state| state.kernel.sets.clone())
            .unwrap_or_default();
        let name = self.table_name(netns).to_string();
        // Unchanged since the last clean comparison (the ruleset generation did not move: no
        // commit at all in the netns, ours or anyone's): equal, without listing. Cheap enough
        // for the periodic comparison of every netns, which would otherwise spawn a listing
        // process each (see `nft_netlink`); still listed every `LIST_EVERY` times.
        let known = lock(&self.verified).get(netns).copied();
        let whole = scope.all;
        let elements = scope.all || !scope.sets.is_empty();
        let (differences, generation, skipped) = Self::in_netns(netns, move || {
            let generation = nft_netlink::generation_here()?;
            if let Some(v) = known.filter(|v| {
                v.generation == generation && v.skipped < LIST_EVERY && (v.whole || !elements)
            }) {
                return Ok((Vec::new(), generation, Some(v.skipped + 1)));
            }
            let differences = verify_in(&mut NftContext::new()?, &table, &name, &kept, &scope)?;
            Ok((differences, generation, None))
        })?;
        let mut verified = lock(&self.verified);
        if !differences.is_empty() {
            verified.remove(netns);
            return Ok(differences);
        }
        let entry = match (skipped, verified.get(netns)) {
            // Answered from the generation: one more time.
            (Some(skipped), Some(v)) => Verified { skipped, ..*v },
            (Some(_), None) => return Ok(differences),
            // Listed: vouches for the generation, as widely as it compared.
            (None, previous) => Verified {
                generation,
                // The periodic comparison (rules only) of netns first listed together
                // spreads their next listings over the rounds.
                skipped: match previous {
                    None if !whole => list_offset(netns),
                    _ => 0,
                },
                whole: whole || previous.is_some_and(|v| v.whole && v.generation == generation),
            },
        };
        verified.insert(netns.to_owned(), entry);
        Ok(differences)
    }

    fn repair(&mut self, netns: &Path) -> Result<(), ApplyError> {
        let Some(table) = self.tables.get(netns).cloned() else {
            return Ok(());
        };
        let restored = table.clone();
        let name = self.table_name(netns).to_string();
        let before = Self::with_context(netns, move |ctx| {
            // The counters' values first: recreating the table starts them from zero. A
            // listing that fails (what made the comparison fail, perhaps) does not hold the
            // repair back: the rules matter, the monitor's counts restart from zero.
            let counters = evidence_counters(&name).unwrap_or_default();
            match ctx.run(&restore_transaction(&restored, &name), Output::Json) {
                Ok(_) => Ok((counters, name)),
                // The pod deleted the table and holds one of its name now (see
                // `refused_by_owner`): the rules go to a new table.
                Err(e) if refused_by_owner(&e) => {
                    let fresh = fresh_table_name();
                    commit(ctx, &Transaction::create(&restored), &fresh)?;
                    Ok((counters, fresh))
                }
                Err(e) => Err(e.into()),
            }
        });
        let before = match before {
            Ok((before, name)) => {
                if name == TABLE_NAME {
                    self.names.remove(netns);
                } else {
                    self.names.insert(netns.to_owned(), name);
                }
                before
            }
            Err(e) => {
                // Whatever the kernel holds now is unknown: the next apply reads it.
                self.forget(netns);
                return Err(e);
            }
        };
        let carried = self.carried.entry(netns.to_owned()).or_default();
        for (key, value) in before {
            *carried.entry(key).or_default() += value;
        }
        self.state.insert(
            netns.to_owned(),
            NftNetnsState::from_kernel(NftObjects::of(&table)),
        );
        Ok(())
    }

    fn forget(&mut self, netns: &Path) {
        lock(&self.verified).remove(netns);
        self.applied.forget(netns);
        self.state.remove(netns);
        self.tables.remove(netns);
        self.names.remove(netns);
        self.contexts.close(netns);
    }

    fn forget_all(&mut self) {
        lock(&self.verified).clear();
        self.applied.forget_all();
        self.state.clear();
        self.tables.clear();
        self.names.clear();
        self.contexts.close_all();
    }

    fn changed_netns(&mut self) -> Vec<PathBuf> {
        self.sweep_changed();
        std::mem::take(&mut self.changed)
    }

    fn set_stop(&mut self, stop: Arc<AtomicBool>) {
        self.stop = stop;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gone_netns_is_reported_as_such() {
        let mut dp = NftDataplane::new(RenderOptions::default());
        let missing = Path::new("/nonexistent/netwarden-netns");
        let err = dp
            .apply(missing, &Some(Arc::new(Table::default())))
            .unwrap_err();
        assert!(err.netns_gone(), "{err}");
        // Removing from a netns that is gone succeeds: nothing is left there.
        dp.remove(missing).unwrap();
        assert_eq!(dp.apply(missing, &None).unwrap(), ApplyOutcome::Removed);
        assert!(dp.changed_netns().is_empty());
    }
}
