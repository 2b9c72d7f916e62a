//! The libnftables contexts kept open, one per pod netns, least recently used closed first.
//!
//! A context holds a netlink socket in its pod's netns, which saves creating one per apply
//! (and the kernel's wait when an nf_tables socket is closed) but also keeps that netns alive:
//! a context is closed when its pod's rules are removed, when the dataplane forgets the netns,
//! and as soon as its path names another namespace or none (checked before each use and swept
//! at every batch).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::apply::netns_identity;
use crate::libnft::NftContext;
use crate::netns::NetnsId;

/// How many contexts (one per netns) are kept open. Each keeps libnftables' cache of its
/// netns's ruleset, every set element included: with a node's pods allowing thousands of
/// peers, about 0.7 MiB per context (75 MiB for 105 pods of the 10,000-pod agent benchmark
/// at 256, measured with heaptrack). Events touch a few pods at a time, so the hot ones stay
/// open; a cold pod pays one new context (a socket and one table dump) on its next apply.
pub const MAX_CONTEXTS: usize = 24;

#[derive(Debug)]
struct Pooled {
    ctx: NftContext,
    identity: NetnsId,
    used: u64,
}

#[derive(Debug)]
pub struct ContextPool {
    max: usize,
    open: HashMap<PathBuf, Pooled>,
    tick: u64,
}

impl ContextPool {
    pub fn new(max: usize) -> ContextPool {
        ContextPool {
            max,
            open: HashMap::new(),
            tick: 0,
        }
    }

    /// The open context of `netns` if it still serves the namespace the path names now (taken
    /// out: hand it back with [`give_back`](Self::give_back)).
    pub fn take(&mut self, netns: &Path) -> Option<NftContext> {
        let pooled = self.open.remove(netns)?;
        (netns_identity(netns) == Some(pooled.identity)).then_some(pooled.ctx)
    }

    /// Keeps `ctx` for the namespace with `identity` at `netns`, closing the least recently used
    /// beyond the bound.
    pub fn give_back(&mut self, netns: &Path, ctx: NftContext, identity: NetnsId) {
        if self.max == 0 {
            return;
        }
        self.tick += 1;
        self.open.insert(
            netns.to_owned(),
            Pooled {
                ctx,
                identity,
                used: self.tick,
            },
        );
        self.evict_beyond_max();
    }

    /// Closes the least recently used contexts until at most `max` are open.
    fn evict_beyond_max(&mut self) {
        while self.open.len() > self.max {
            let Some(oldest) = self
                .open
                .iter()
                .min_by_key(|(_, p)| p.used)
                .map(|(path, _)| path.clone())
            else {
                break;
            };
            self.open.remove(&oldest);
        }
    }

    pub fn close(&mut self, netns: &Path) {
        self.open.remove(netns);
    }

    pub fn close_all(&mut self) {
        self.open.clear();
    }

    /// Closes the contexts whose path no longer names their namespace (deleted pods).
    pub fn prune(&mut self) {
        self.open
            .retain(|path, p| netns_identity(path) == Some(p.identity));
    }

    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    pub fn set_max(&mut self, max: usize) {
        self.max = max;
        self.evict_beyond_max();
    }
}
