//! The address sets of pod peers, numbered: many rules name the same peers (every policy of a
//! team allowing `tier: web` from the team's namespaces), so each distinct peer — with what
//! else decides its addresses, [`PeerSetKey`] — gets one number while a filed rule names it,
//! and its addresses are found once and shared (issue 10, "peer sets shared between every
//! rule and pod that need the same set").
//!
//! Rules hold the numbers, so a pod event that must look at a rule's peer sets compares
//! numbers, not selectors. A number whose last rule is unfiled is given back with its set:
//! a set is kept exact only while a filed rule names it (the engine looks at the sets of the
//! rules that can select a changed pod), so an unnamed set must not outlive its rules.

use std::collections::HashMap;
use std::sync::Arc;

use crate::addrset::AddrSet;
use crate::model::{Peer, PolicyKind, PolicyScope};

/// What a pod peer's addresses depend on besides the cluster: the peer, the policy's namespace
/// when the peer has no namespace selector (it looks there; with one, the policy's namespace
/// plays no part, so the policies of every namespace share the set), and the policy's kind and
/// scope (which interfaces' addresses count).
pub(crate) type PeerSetKey = (Peer, Option<String>, PolicyKind, PolicyScope);

/// A peer set's number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PeerSetId(u32);

/// One numbered peer: what it is, how many filed rules name it, and its addresses once found.
#[derive(Debug, Clone)]
struct Slot {
    key: PeerSetKey,
    filings: usize,
    addrs: Option<Arc<AddrSet>>,
}

/// The numbered peers and their resolved address sets.
#[derive(Debug, Default, Clone)]
pub(crate) struct PeerSets {
    ids: HashMap<PeerSetKey, PeerSetId>,
    slots: Vec<Option<Slot>>,
    free: Vec<PeerSetId>,
    /// How many slots hold addresses (so that forgetting everything is free when none do).
    resolved: usize,
}

impl PeerSets {
    /// The number of `key`, for one more rule that names it.
    pub fn file(&mut self, key: PeerSetKey) -> PeerSetId {
        if let Some(&id) = self.ids.get(&key) {
            self.slot_mut(id).filings += 1;
            return id;
        }
        let slot = Slot {
            key: key.clone(),
            filings: 1,
            addrs: None,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id.0 as usize] = Some(slot);
                id
            }
            None => {
                self.slots.push(Some(slot));
                PeerSetId(u32::try_from(self.slots.len() - 1).expect("< 2^32 peer sets"))
            }
        };
        self.ids.insert(key, id);
        id
    }

    /// One rule that named `id` no longer does; the last one takes the number and the set.
    pub fn unfile(&mut self, id: PeerSetId) {
        let slot = self.slot_mut(id);
        slot.filings -= 1;
        if slot.filings > 0 {
            return;
        }
        let slot = self.slots[id.0 as usize].take().expect("filed above");
        if slot.addrs.is_some() {
            self.resolved -= 1;
        }
        self.ids.remove(&slot.key);
        self.free.push(id);
    }

    fn slot(&self, id: PeerSetId) -> &Slot {
        self.slots[id.0 as usize]
            .as_ref()
            .expect("a filed peer set number")
    }

    fn slot_mut(&mut self, id: PeerSetId) -> &mut Slot {
        self.slots[id.0 as usize]
            .as_mut()
            .expect("a filed peer set number")
    }

    /// What peer set `id` is.
    pub fn key(&self, id: PeerSetId) -> &PeerSetKey {
        &self.slot(id).key
    }

    /// The addresses of `id`, if found since they last changed.
    pub fn addrs(&self, id: PeerSetId) -> Option<&Arc<AddrSet>> {
        self.slot(id).addrs.as_ref()
    }

    /// Keeps the addresses found for `id`.
    pub fn keep(&mut self, id: PeerSetId, addrs: Arc<AddrSet>) {
        let slot = self.slot_mut(id);
        if slot.addrs.replace(addrs).is_none() {
            self.resolved += 1;
        }
    }

    /// Forgets the addresses of `id` (they changed).
    pub fn forget(&mut self, id: PeerSetId) {
        if self.slot_mut(id).addrs.take().is_some() {
            self.resolved -= 1;
        }
    }

    /// Forgets every set's addresses (any may have changed).
    pub fn forget_all(&mut self) {
        if self.resolved == 0 {
            return;
        }
        for slot in self.slots.iter_mut().flatten() {
            slot.addrs = None;
        }
        self.resolved = 0;
    }

    /// Whether no set's addresses are kept.
    pub fn none_resolved(&self) -> bool {
        self.resolved == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LabelSelector;
    use crate::testing::labels;

    fn key(app: &str) -> PeerSetKey {
        (
            Peer::Pods {
                pod_selector: Some(LabelSelector {
                    match_labels: labels(&[("app", app)]),
                    match_expressions: vec![],
                }),
                namespace_selector: None,
                network_selector: None,
            },
            Some("ns".into()),
            PolicyKind::NetworkPolicy,
            PolicyScope::Primary,
        )
    }

    #[test]
    fn a_set_lives_while_a_rule_names_it() {
        let mut sets = PeerSets::default();
        let web = sets.file(key("web"));
        assert_eq!(sets.file(key("web")), web, "one number per peer");
        let db = sets.file(key("db"));
        assert_ne!(web, db);
        sets.keep(web, Arc::new(AddrSet::default()));
        assert!(sets.addrs(web).is_some() && !sets.none_resolved());
        sets.unfile(web);
        assert!(sets.addrs(web).is_some(), "one rule still names it");
        sets.unfile(web);
        assert!(sets.none_resolved(), "the last rule took the set");
        // The number is reused, without the old addresses.
        let api = sets.file(key("api"));
        assert_eq!(api, web);
        assert!(sets.addrs(api).is_none());
        assert_eq!(sets.key(api), &key("api"));
        sets.keep(db, Arc::new(AddrSet::default()));
        sets.forget_all();
        assert!(sets.addrs(db).is_none() && sets.none_resolved());
    }
}
