//! The [`Dataplane`] trait: programming one pod netns with a rendered ruleset, removing what
//! netwarden owns there, and reading it back.
//!
//! One implementation per backend ([`NftDataplane`](crate::nft_apply::NftDataplane), the iptables
//! one) plus an in-memory [`FakeDataplane`](crate::fake::FakeDataplane) for tests of the
//! reconcile loop. Implementations keep a hash of what they last applied per netns so that an
//! unchanged ruleset is not sent again; any failure forgets that hash, so the next sync of the
//! netns is a full one.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use crate::netns::NetnsError;

/// Which tool programs the netns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// One `nft -f` transaction updating table `inet netwarden` in place.
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

/// The rendered rules of one pod netns, for one backend.
///
/// `None` text means "nothing of this kind" (an open pod for nft is the removal transaction in
/// `nft`; the iptables backend leaves a family out when it has no rules).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RenderedRuleset {
    pub backend: Backend,
    /// `nft -f` transaction (backend Nft).
    pub nft: Option<String>,
    /// `iptables-restore` input (backend Iptables).
    pub iptables_v4: Option<String>,
    /// `ip6tables-restore` input (backend Iptables).
    pub iptables_v6: Option<String>,
    /// `ipset restore` input (backend Iptables).
    pub ipset: Option<String>,
}

impl RenderedRuleset {
    /// An nft ruleset from [`netwarden_render::render_nft`] output.
    pub fn nft(text: String) -> Self {
        RenderedRuleset {
            backend: Backend::Nft,
            nft: Some(text),
            iptables_v4: None,
            iptables_v6: None,
            ipset: None,
        }
    }

    /// An iptables ruleset (texts from the iptables renderer).
    pub fn iptables(v4: Option<String>, v6: Option<String>, ipset: Option<String>) -> Self {
        RenderedRuleset {
            backend: Backend::Iptables,
            nft: None,
            iptables_v4: v4,
            iptables_v6: v6,
            ipset,
        }
    }

    /// Whether applying this means "netwarden owns nothing in this netns".
    ///
    /// For nft: no text, or only the removal preamble ([`netwarden_render::nft::is_removal`]).
    /// For iptables: no text at all.
    pub fn is_removal(&self) -> bool {
        match self.backend {
            Backend::Nft => self
                .nft
                .as_deref()
                .is_none_or(netwarden_render::nft::is_removal),
            Backend::Iptables => {
                self.iptables_v4.is_none() && self.iptables_v6.is_none() && self.ipset.is_none()
            }
        }
    }

    /// A hash of the whole ruleset, to skip re-applying identical text. Only compared within one
    /// process (the std hasher is not stable across Rust versions); a restarted agent applies
    /// everything once, which is atomic per netns and so opens no window.
    pub fn content_hash(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
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

/// One variant per stage that can fail, each with its source.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{backend} dataplane cannot apply a {got} ruleset")]
    WrongBackend {
        backend: &'static str,
        got: &'static str,
    },
    #[error("applying rules in {}: {source}", netns.display())]
    Apply { netns: PathBuf, source: NetnsError },
    #[error("removing rules in {}: {source}", netns.display())]
    Remove { netns: PathBuf, source: NetnsError },
    #[error("reading rules back in {}: {source}", netns.display())]
    ReadBack { netns: PathBuf, source: NetnsError },
    /// A failure injected into a [`FakeDataplane`](crate::fake::FakeDataplane).
    #[error("injected failure in {}", netns.display())]
    Injected { netns: PathBuf },
}

impl ApplyError {
    /// Whether the pod's netns no longer exists (the pod is gone: its rules went with it).
    pub fn netns_gone(&self) -> bool {
        match self {
            ApplyError::Apply { source, .. }
            | ApplyError::Remove { source, .. }
            | ApplyError::ReadBack { source, .. } => netns_gone(source),
            _ => false,
        }
    }
}

pub(crate) fn netns_gone(e: &NetnsError) -> bool {
    matches!(e, NetnsError::Open { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
}

/// How many netns a batch applies to at once. Each apply is a child process that mostly waits
/// on the kernel (committing and releasing the previous rules), so a few more workers than
/// cores keep the machine busy without flooding it with processes.
pub const APPLY_WORKERS: usize = 8;

/// Runs `work` over `items` on up to `workers` threads; results come back in the order of
/// `items`. Used by the backends' batch applies.
pub fn run_parallel<T: Sync, R: Send>(
    items: &[T],
    workers: usize,
    work: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    if items.len() <= 1 || workers <= 1 {
        return items.iter().map(work).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<R>>> =
        items.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..workers.min(items.len()) {
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

/// Programs pod netns with rendered rules. One implementation per backend.
pub trait Dataplane: Send {
    /// Replaces everything netwarden owns in `netns` with `ruleset`, atomically per netns.
    /// A removal ruleset removes (see [`RenderedRuleset::is_removal`]).
    fn apply(
        &mut self,
        netns: &Path,
        ruleset: &RenderedRuleset,
    ) -> Result<ApplyOutcome, ApplyError>;

    /// Removes everything netwarden owns in `netns` and nothing else. A netns that no longer
    /// exists has nothing left to remove: that is success.
    fn remove(&mut self, netns: &Path) -> Result<(), ApplyError>;

    /// What netwarden owns in `netns` as the kernel lists it, `None` when nothing.
    fn read_back(&self, netns: &Path) -> Result<Option<String>, ApplyError>;

    /// Forgets what was applied to `netns` (its next apply is a full one).
    fn forget(&mut self, netns: &Path);

    /// Forgets everything (after a failure whose extent is unknown, or to force a full resync).
    fn forget_all(&mut self);

    /// Applies a batch, one ruleset per distinct netns; results in the order of `batch`.
    /// Backends whose applies mostly wait (on the kernel or a child process) override this to
    /// apply to several netns at once; the default applies one after the other.
    fn apply_many(
        &mut self,
        batch: &[(PathBuf, RenderedRuleset)],
    ) -> Vec<Result<ApplyOutcome, ApplyError>> {
        batch
            .iter()
            .map(|(netns, ruleset)| self.apply(netns, ruleset))
            .collect()
    }
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removal_and_hash() {
        let removal = RenderedRuleset::nft(netwarden_render::nft::render_removal());
        assert!(removal.is_removal());
        assert!(RenderedRuleset::iptables(None, None, None).is_removal());
        let some = RenderedRuleset::nft("table inet netwarden {}\n".into());
        assert!(!some.is_removal());
        assert_ne!(removal.content_hash(), some.content_hash());
        assert_eq!(some.content_hash(), some.clone().content_hash());
        // Same text, other backend: different rulesets.
        let ipt = RenderedRuleset::iptables(Some("x".into()), None, None);
        let ipt6 = RenderedRuleset::iptables(None, Some("x".into()), None);
        assert_ne!(ipt.content_hash(), ipt6.content_hash());
    }
}
