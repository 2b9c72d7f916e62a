//! The [`Dataplane`] trait: programming one pod netns with a rendered ruleset, removing what
//! netwarden owns there, and reading it back.
//!
//! One implementation per backend ([`NftDataplane`](crate::nft_apply::NftDataplane), the iptables
//! one) plus an in-memory [`FakeDataplane`](crate::fake::FakeDataplane) for tests of the
//! reconcile loop. Implementations keep a hash of what they last applied per netns so that an
//! unchanged ruleset is not sent again; any failure forgets that hash, so the next sync of the
//! netns is a full one.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use netwarden_engine::revocation::RevocationScope;
use netwarden_engine::PodRules;
use netwarden_render::{CounterKind, LogKey, RenderError};

use crate::conntrack::{ConntrackError, DumpFilter, Revoked};
use crate::iptables_error::IptablesError;
use crate::libnft::LibnftError;
use crate::netns::{netns_gone, Netns, NetnsError, NetnsId};
use crate::tamper::{Difference, VerifyScope};

/// What a backend runs when it first meets a netns that may still hold the other backend's
/// rules (after a switch of backends), to remove them. A plain function so that neither
/// backend names the other: the [`switch`](crate::switch) module, which knows both, hands each
/// backend the cleanup of the other.
pub type SwitchCleanup = fn(&Path) -> Result<(), ApplyError>;

/// Which tool programs the netns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// One libnftables transaction updating table `inet netwarden` in place.
    Nft,
    /// `ipset restore` then `iptables-restore` / `ip6tables-restore` (seed 004).
    Iptables,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Nft => "nft",
            Backend::Iptables => "iptables",
        }
    }
}

/// What [`Dataplane::apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// The rules were (re)programmed.
    Applied,
    /// Identical to what was last applied successfully: nothing sent.
    Unchanged,
    /// The ruleset was a removal: netwarden's rules are gone from the netns.
    Removed,
}

/// Evidence counter values of one netns: (interface-direction key, counter) → packets.
pub type EvidenceCounters = std::collections::BTreeMap<(LogKey, CounterKind), u64>;

/// One variant per stage that can fail, each with its source.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The netns could not be opened or entered (gone, not a network namespace, the agent's
    /// own...).
    #[error("{}: {source}", netns.display())]
    Netns { netns: PathBuf, source: NetnsError },
    /// libnftables is missing or refused the transaction (nothing of it was applied).
    #[error("{}: {source}", netns.display())]
    Nft { netns: PathBuf, source: LibnftError },
    /// What the kernel listed could not be read.
    #[error("{}: unreadable nft listing: {source}", netns.display())]
    Listing {
        netns: PathBuf,
        source: serde_json::Error,
    },
    /// The kernel's nf_tables could not be read (netlink dumps, or the `nft` command).
    #[error("{}: reading nf_tables: {source}", netns.display())]
    Reading {
        netns: PathBuf,
        source: crate::nft_netlink::ListingError,
    },
    /// A stage of the iptables backend failed.
    #[error("{}: {source}", netns.display())]
    Iptables {
        netns: PathBuf,
        // Boxed: the largest source, and errors are the rare path.
        source: Box<IptablesError>,
    },
    /// A failure injected into a [`FakeDataplane`](crate::fake::FakeDataplane).
    #[error("injected failure in {}", netns.display())]
    Injected { netns: PathBuf },
    /// Not applied: the agent is stopping (the netns keeps the rules it had).
    #[error("{}: not applied, stopping", netns.display())]
    Stopped { netns: PathBuf },
}

impl ApplyError {
    /// A failed stage of the iptables backend in `netns`.
    pub fn iptables(netns: &Path, source: IptablesError) -> ApplyError {
        ApplyError::Iptables {
            netns: netns.to_owned(),
            source: Box::new(source),
        }
    }

    /// Whether the pod's netns no longer exists (the pod is gone: its rules went with it).
    pub fn netns_gone(&self) -> bool {
        match self {
            ApplyError::Netns { source, .. } => netns_gone(source),
            ApplyError::Iptables { source, .. } => source.netns_gone(),
            _ => false,
        }
    }
}

/// The identity of the network namespace a path names now ([`NetnsId`]: the same for a
/// `/run/netns/NAME` bind mount and `/proc/PID/ns/net`). A netns deleted and created again at
/// the same path (a pod sandbox restart) has a new identity. `None`: the path names no network
/// namespace that may be used (gone, not a netns, the agent's own).
pub fn netns_identity(path: &Path) -> Option<NetnsId> {
    crate::netns::netns_id(path).ok()
}

/// What a dataplane remembers of its last successful apply to one netns: the namespace it
/// applied to (opened before the apply) and what was applied.
///
/// The handle is held on purpose. A namespace's identity is its nsfs inode number, and the
/// kernel gives a freed number to the next namespace it creates: a pod netns deleted and
/// created again at the same path (a sandbox restart) can get the very number of the one it
/// replaces, once nothing holds the old one. Holding it keeps the number taken, so "the path
/// names another namespace" is always seen; the handle is dropped as soon as it is (or when the
/// netns is forgotten), so a deleted pod's netns is not kept beyond the next check.
#[derive(Debug)]
pub struct Applied {
    pub netns: Netns,
    pub hash: u64,
}

/// Last successful applies, per netns path (the bookkeeping every backend shares).
#[derive(Debug, Default)]
pub struct AppliedLog {
    applied: HashMap<PathBuf, Applied>,
}

impl AppliedLog {
    /// Whether `hash` is what was last applied to the namespace `netns` names now.
    pub fn is_current(&self, netns: &Path, hash: u64) -> bool {
        self.applied
            .get(netns)
            .is_some_and(|a| a.hash == hash && netns_identity(netns) == Some(a.netns.id()))
    }

    /// Records a successful apply of `hash` to `handle`, the namespace opened at `netns` before
    /// the apply. If the path names another namespace by now, the next
    /// [`take_changed`](Self::take_changed) says so.
    pub fn record(&mut self, netns: &Path, handle: Netns, hash: u64) {
        self.applied.insert(
            netns.to_owned(),
            Applied {
                netns: handle,
                hash,
            },
        );
    }

    pub fn forget(&mut self, netns: &Path) {
        self.applied.remove(netns);
    }

    pub fn forget_all(&mut self) {
        self.applied.clear();
    }

    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.applied.keys().map(PathBuf::as_path)
    }

    /// Whether nothing was applied to `netns` since the last change or failure: its first
    /// contact in this process, as far as the other backend's leftovers are concerned.
    pub fn knows(&self, netns: &Path) -> bool {
        self.applied.contains_key(netns)
    }

    /// Forgets, and returns, every netns whose path now names another namespace or nothing.
    pub fn take_changed(&mut self) -> Vec<PathBuf> {
        let changed: Vec<PathBuf> = self
            .applied
            .iter()
            .filter(|(path, a)| netns_identity(path) != Some(a.netns.id()))
            .map(|(path, _)| path.clone())
            .collect();
        for path in &changed {
            self.applied.remove(path);
        }
        changed
    }
}

/// How many netns a batch applies to at once. Each apply is a child process that mostly waits
/// on the kernel (committing and releasing the previous rules), so a few more workers than
/// cores keep the machine busy without flooding it with processes.
pub const APPLY_WORKERS: usize = 8;

/// Runs `work` over `items` on up to `workers` threads scoped to this call; results come back
/// in the order of `items`. Used by the backends' batch applies.
///
/// `work` never runs on the calling thread, not even for one item: it may move its thread into
/// a pod netns (`setns` is per thread), and the agent's main thread must stay in the netns the
/// process started in — a main thread left in a pod netns pins that netns after the pod is
/// gone, makes every thread spawned later start there, and breaks what "the agent's own
/// netns" means (see `netns::own_netns_id`).
pub fn run_parallel<T: Sync, R: Send>(
    items: &[T],
    workers: usize,
    work: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    if items.is_empty() {
        return Vec::new();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<R>>> =
        items.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..workers.clamp(1, items.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = work(item);
                *results[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            });
        }
    });
    results
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .expect("every item was processed")
        })
        .collect()
}

/// Programs pod netns with rendered rules. One implementation per backend, each with its own
/// ruleset type: a ruleset of one backend cannot be handed to another.
pub trait Dataplane: Send {
    /// What this backend programs into one netns; its [`Default`] is the removal (netwarden
    /// owns nothing there).
    type Ruleset: Clone + Default + PartialEq + Hash + Send + Sync + 'static;

    /// The backend, for reports.
    const BACKEND: Backend;

    /// A pod's rules for this backend (pure; the options were given when the dataplane was
    /// made). An error refuses the pod: its netns keeps what it has.
    fn render(&self, rules: &PodRules) -> Result<Self::Ruleset, RenderError>;

    /// Whether applying `ruleset` removes everything netwarden owns.
    fn is_removal(ruleset: &Self::Ruleset) -> bool {
        *ruleset == Self::Ruleset::default()
    }

    /// Replaces everything netwarden owns in `netns` with `ruleset`, atomically per netns.
    fn apply(&mut self, netns: &Path, ruleset: &Self::Ruleset) -> Result<ApplyOutcome, ApplyError>;

    /// Makes [`Dataplane::apply_many`] leave the netns it has not started yet once `stop` is
    /// set ([`ApplyError::Stopped`]): a stopping agent does not wait for a long batch. An
    /// apply under way is finished (its transaction is atomic either way).
    fn set_stop(&mut self, stop: Arc<AtomicBool>) {
        let _ = stop;
    }

    /// Applies a batch, one ruleset per distinct netns; results in the order of `batch`.
    /// Backends whose applies mostly wait on the kernel override this to apply to several netns
    /// at once; the default applies one after the other.
    fn apply_many(
        &mut self,
        batch: &[(PathBuf, Self::Ruleset)],
    ) -> Vec<Result<ApplyOutcome, ApplyError>> {
        batch
            .iter()
            .map(|(netns, ruleset)| self.apply(netns, ruleset))
            .collect()
    }

    /// Removes everything netwarden owns in `netns` and nothing else. A netns that no longer
    /// exists has nothing left to remove: that is success.
    fn remove(&mut self, netns: &Path) -> Result<(), ApplyError>;

    /// What netwarden owns in `netns` as the kernel lists it, `None` when nothing.
    fn read_back(&self, netns: &Path) -> Result<Option<String>, ApplyError>;

    /// The evidence counters of the monitored chains in `netns`
    /// ([`CounterKind`](netwarden_render::CounterKind)), cumulative for as long as this
    /// dataplane programmed it: a backend whose applies reset them carries the old values over.
    /// Empty when nothing is monitored there.
    fn read_counters(&self, netns: &Path) -> Result<EvidenceCounters, ApplyError>;

    /// [`Dataplane::read_counters`] of several netns, in their order (a backend that can
    /// reads them side by side: each is a listing in its own netns).
    fn read_counters_many(&self, netns: &[&Path]) -> Vec<Result<EvidenceCounters, ApplyError>> {
        netns.iter().map(|n| self.read_counters(n)).collect()
    }

    /// Compares what this dataplane last applied to `netns` with what the kernel holds there
    /// now, within `scope` (tamper repair, SPEC 5). Empty: the same, or nothing was applied
    /// there by this process (it owns nothing it knows of to compare).
    fn verify(&self, netns: &Path, scope: &VerifyScope) -> Result<Vec<Difference>, ApplyError>;

    /// Puts back exactly what this dataplane last applied to `netns`, whatever the kernel
    /// holds there now (what was added is removed too), atomically. Nothing applied: nothing
    /// to do.
    fn repair(&mut self, netns: &Path) -> Result<(), ApplyError>;

    /// Ends the live connections of `netns` that the enforced view of `rules` denies
    /// (revocation, SPEC 5; see [`crate::conntrack`]): run after an apply that changed the
    /// netns's rules, within `scope` (what the change can deny, [`revocation_scope`]: nothing
    /// at all, the connections of a few peers, or every one). The same for every backend —
    /// the conntrack table is the kernel's, not the rules' — and an associated function, so a
    /// batch can run side by side.
    ///
    /// [`revocation_scope`]: netwarden_engine::revocation::revocation_scope
    fn revoke_connections(
        netns: &Path,
        rules: &PodRules,
        scope: &RevocationScope,
    ) -> Result<Revoked, ConntrackError> {
        let Some(filters) = dump_filters(scope) else {
            return Ok(Revoked::default());
        };
        let handle = Netns::open(netns)?;
        let rules = rules.clone();
        crate::conntrack::revoke(&handle, filters, move |flow| {
            netwarden_engine::judge(&rules, flow).is_denied()
        })
    }

    /// Forgets what was applied to `netns` (its next apply is a full one).
    fn forget(&mut self, netns: &Path);

    /// Forgets everything (after a failure whose extent is unknown, or to force a full resync).
    fn forget_all(&mut self);

    /// The netns applied to whose path now names another namespace (deleted and created again:
    /// a pod sandbox restart) or none. They are forgotten; the caller syncs their pods again.
    fn changed_netns(&mut self) -> Vec<PathBuf>;
}

/// The most peers a revocation pass asks the kernel for one by one (a dump each) before it
/// lists the whole table instead.
pub const MAX_FILTERED_PEERS: usize = 16;

/// The dumps a revocation pass within `scope` makes: `None` for none at all; one per peer
/// address (its incoming connections by original source, its outgoing ones by original
/// destination) when the scope names a few single addresses; else the whole table.
pub fn dump_filters(scope: &RevocationScope) -> Option<Vec<DumpFilter>> {
    let (ingress, egress) = match scope {
        RevocationScope::Nothing => return None,
        RevocationScope::Everything => return Some(vec![DumpFilter::All]),
        RevocationScope::Peers { ingress, egress } => (ingress, egress),
    };
    let singles = |set: &netwarden_engine::AddrSet| -> Option<Vec<IpAddr>> {
        let v4 = set
            .v4_ranges()
            .map(|(lo, hi)| (lo == hi).then_some(IpAddr::V4(lo)));
        let v6 = set
            .v6_ranges()
            .map(|(lo, hi)| (lo == hi).then_some(IpAddr::V6(lo)));
        v4.chain(v6).take(MAX_FILTERED_PEERS + 1).collect()
    };
    let filters: Option<Vec<DumpFilter>> = (|| {
        let mut out: Vec<DumpFilter> = singles(ingress)?
            .into_iter()
            .map(DumpFilter::OrigSource)
            .collect();
        out.extend(
            singles(egress)?
                .into_iter()
                .map(DumpFilter::OrigDestination),
        );
        (out.len() <= MAX_FILTERED_PEERS).then_some(out)
    })();
    Some(filters.unwrap_or_else(|| vec![DumpFilter::All]))
}

#[cfg(test)]
mod parallel_tests {
    use super::run_parallel;

    #[test]
    fn results_keep_the_order_of_items() {
        let items: Vec<u32> = (0..100).collect();
        let out = run_parallel(&items, 8, |x| x * 2);
        assert_eq!(out, items.iter().map(|x| x * 2).collect::<Vec<_>>());
        assert_eq!(run_parallel(&[7u32], 8, |x| x + 1), vec![8]);
        assert!(run_parallel(&[] as &[u32], 8, |x| *x).is_empty());
        assert_eq!(run_parallel(&[1u32, 2], 0, |x| x + 1), vec![2, 3]);
    }

    #[test]
    fn work_never_runs_on_the_calling_thread() {
        let caller = std::thread::current().id();
        for n in [1usize, 2, 9] {
            let items: Vec<usize> = (0..n).collect();
            for workers in [0, 1, 8] {
                let ran_on = run_parallel(&items, workers, |_| std::thread::current().id());
                assert!(
                    ran_on.iter().all(|id| *id != caller),
                    "{n} items, {workers} workers"
                );
            }
        }
    }
}
