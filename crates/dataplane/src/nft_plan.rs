//! Planning nft transactions: from the desired [`Table`] and what the kernel holds to the one
//! [`Transaction`] that gets there without a window. Pure: no kernel, no I/O.
//!
//! The renderer's [`Transaction::create`] updates the table in place (chains flushed and
//! refilled, peer sets named by content). What it cannot know is what became unused, because
//! that depends on the kernel; the plan adds it, in the same transaction:
//!
//! - chains no longer in the table (an interface that left, a direction no longer isolated)
//!   are flushed, all of them, then deleted — a stale base chain may jump to a stale chain;
//! - a set is deleted only when neither the new rules nor the PREVIOUS ones use it: the rules
//!   using it were replaced one apply earlier, so no packet can still be walking them (a set a
//!   transaction deletes looks empty to a packet still on the old rules, see the renderer);
//! - a set the kernel already holds is not sent again: its name is its content;
//! - a new set is created and filled by a transaction of its own, before the one that switches
//!   the rules to it. Interval sets answer lookups from a search array the kernel builds when
//!   the transaction's sets are committed (`nft_rbtree_commit`, since Linux 6.18), which is
//!   after the new rules are already live: rules and a large new set in one transaction
//!   refused allowed packets for a fraction of a millisecond (measured: 9–38 allowed connections
//!   refused per run with 20,000-element sets, `crash_e2e`). Between the two transactions the old
//!   rules are in force and the new sets simply unused, so no packet sees a half-made state,
//!   and an agent killed in between leaves only unused sets, collected later like any stale set.
//!
//! When the state is unknown (first apply in this process, after a failure, after the netns
//! changed) it is read from the kernel and every set found counts as possibly in use.

use std::collections::BTreeSet;

use netwarden_render::nft::{Command, Table, Transaction};

/// The named sets and chains of table `inet netwarden`, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NftObjects {
    /// Whether the table exists at all.
    pub table: bool,
    pub sets: BTreeSet<String>,
    pub chains: BTreeSet<String>,
}

impl NftObjects {
    /// The objects of a desired table.
    pub fn of(table: &Table) -> NftObjects {
        NftObjects {
            table: true,
            sets: table
                .sets
                .iter()
                .map(|s| s.name.clone())
                .chain(table.learn_sets.iter().map(|s| s.name.clone()))
                .collect(),
            chains: table.chains.iter().map(|c| c.name.clone()).collect(),
        }
    }

    /// Applies a transaction to this model of the kernel, names only, with the kernel's
    /// all-or-nothing semantics and the refusals that matter to the planner: touching an object
    /// that does not exist, deleting a chain that still has rules or is jumped to, or deleting
    /// a set a rule of the table uses. The fake dataplane and the planner's tests run on it.
    pub fn apply(&mut self, tx: &Transaction<'_>) -> Result<(), String> {
        let mut next = self.clone();
        // Rules per chain in the model: only what deletions need (which sets and chains a
        // chain's rules reference). Chains existing before the transaction are assumed to hold
        // rules we do not know of until they are flushed.
        let mut refs: std::collections::BTreeMap<String, Option<BTreeSet<String>>> =
            next.chains.iter().map(|c| (c.clone(), None)).collect();
        for c in &tx.commands {
            let known_chain = |next: &NftObjects, name: &str| {
                if next.table && next.chains.contains(name) {
                    Ok(())
                } else {
                    Err(format!("no such chain {name}"))
                }
            };
            match c {
                Command::AddTable => next.table = true,
                Command::DeleteTable => {
                    next = NftObjects::default();
                    refs.clear();
                }
                Command::AddLimit(_) => {
                    if !next.table {
                        return Err("add limit: no table".into());
                    }
                }
                Command::AddSet(s) => {
                    if !next.table {
                        return Err(format!("add set {}: no table", s.name));
                    }
                    next.sets.insert(s.name.clone());
                }
                Command::AddLearnSet(s) => {
                    if !next.table {
                        return Err(format!("add set {}: no table", s.name));
                    }
                    next.sets.insert(s.name.clone());
                }
                Command::AddCounter(name) => {
                    if !next.table {
                        return Err(format!("add counter {name}: no table"));
                    }
                }
                Command::AddElements(s) => {
                    if !next.sets.contains(&s.name) {
                        return Err(format!("add element: no such set {}", s.name));
                    }
                }
                Command::AddChain(chain) => {
                    if !next.table {
                        return Err(format!("add chain {}: no table", chain.name));
                    }
                    if next.chains.insert(chain.name.clone()) {
                        refs.insert(chain.name.clone(), Some(BTreeSet::new()));
                    }
                }
                Command::FlushChain(name) => {
                    known_chain(&next, name)?;
                    refs.insert(name.to_string(), Some(BTreeSet::new()));
                }
                Command::AddRule { chain, rule } => {
                    known_chain(&next, chain)?;
                    let used = refs.entry(chain.to_string()).or_insert(None);
                    let learn_sets = rule.matches.iter().filter_map(|m| match m {
                        netwarden_render::nft::Match::NotLearned(k) => Some(&k.set),
                        _ => None,
                    });
                    let learn_adds = rule.stmts.iter().filter_map(|s| match s {
                        netwarden_render::nft::Stmt::Learn(k) => Some(&k.set),
                        _ => None,
                    });
                    let addr_sets = rule.matches.iter().filter_map(|m| match m {
                        netwarden_render::nft::Match::Addr { set, .. } => Some(set),
                        _ => None,
                    });
                    for set in addr_sets.chain(learn_sets).chain(learn_adds) {
                        if !next.sets.contains(set) {
                            return Err(format!("rule in {chain}: no such set {set}"));
                        }
                        if let Some(u) = used.as_mut() {
                            u.insert(set.clone());
                        }
                    }
                    if let Some(target) = rule.verdict.target() {
                        known_chain(&next, target)?;
                        if let Some(u) = used.as_mut() {
                            u.insert(format!("chain:{target}"));
                        }
                    }
                }
                Command::DeleteChain(name) => {
                    known_chain(&next, name)?;
                    if refs.get(*name) != Some(&Some(BTreeSet::new())) {
                        return Err(format!("delete chain {name}: it may hold rules"));
                    }
                    let jumped = refs.iter().any(|(other, used)| {
                        other != name
                            && used
                                .as_ref()
                                .is_none_or(|u| u.contains(&format!("chain:{name}")))
                    });
                    if jumped {
                        return Err(format!("delete chain {name}: another chain may jump to it"));
                    }
                    next.chains.remove(*name);
                    refs.remove(*name);
                }
                Command::DeleteSet(name) => {
                    if !next.sets.contains(*name) {
                        return Err(format!("delete set {name}: no such set"));
                    }
                    let used = refs
                        .values()
                        .any(|u| u.as_ref().is_none_or(|u| u.contains(*name)));
                    if used {
                        return Err(format!("delete set {name}: a rule may use it"));
                    }
                    next.sets.remove(*name);
                }
            }
        }
        *self = next;
        Ok(())
    }
}

/// What the applier knows of netwarden's table in one netns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NftNetnsState {
    /// What the kernel holds after the last transaction.
    pub kernel: NftObjects,
    /// The sets the rules of the last applied table use: packets may still be walking those
    /// rules while the next apply commits, so the next apply keeps these sets.
    pub in_use: BTreeSet<String>,
}

impl NftNetnsState {
    /// The state when only the kernel's content is known (no history): every set found may be
    /// used by the rules in force.
    pub fn from_kernel(kernel: NftObjects) -> NftNetnsState {
        NftNetnsState {
            in_use: kernel.sets.clone(),
            kernel,
        }
    }
}

/// The transactions of one update, in order, and the state once both committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftPlan<'t> {
    /// The new peer sets, created and filled before any rule uses them (empty when no set is
    /// new; see the module doc).
    pub sets: Transaction<'t>,
    /// Everything else: chains refilled (their rules switched to the new sets), stale objects
    /// deleted; or the table's removal.
    pub rules: Transaction<'t>,
    pub after: NftNetnsState,
}

impl NftPlan<'_> {
    /// Whether there is nothing to send (a removal where no table exists).
    pub fn is_empty(&self) -> bool {
        self.sets.commands.is_empty() && self.rules.commands.is_empty()
    }

    /// The transactions to send, in order, leaving out empty ones.
    pub fn transactions(&self) -> impl Iterator<Item = &Transaction<'_>> {
        [&self.sets, &self.rules]
            .into_iter()
            .filter(|t| !t.commands.is_empty())
    }
}

/// Plans the transaction bringing a netns in `state` to `desired` (`None`: no table at all).
pub fn plan<'t>(desired: Option<&'t Table>, state: &'t NftNetnsState) -> NftPlan<'t> {
    let Some(table) = desired else {
        let transaction = if state.kernel.table {
            Transaction::removal()
        } else {
            Transaction::default()
        };
        return NftPlan {
            sets: Transaction::default(),
            rules: transaction,
            after: NftNetnsState::default(),
        };
    };
    let wanted = NftObjects::of(table);
    // Peer sets are named by their content: a set the kernel already holds already has these
    // elements, so only new ones are sent, ahead of the rules that use them.
    let mut sets = Transaction::default();
    let new_sets: Vec<_> = table
        .sets
        .iter()
        .filter(|set| !state.kernel.sets.contains(&set.name))
        .collect();
    if !new_sets.is_empty() {
        sets.add_sets(new_sets);
    }
    let mut transaction = Transaction::default();
    // Learn sets fill themselves in the kernel: declared once, when the kernel lacks them
    // (see `Transaction::declare_some`).
    transaction.declare_some(table, |_| false, |s| !state.kernel.sets.contains(&s.name));
    transaction.refill_chains(table);
    let stale_chains: Vec<&'t String> = state
        .kernel
        .chains
        .iter()
        .filter(|c| !wanted.chains.contains(*c))
        .collect();
    for c in &stale_chains {
        transaction.commands.push(Command::FlushChain(c));
    }
    for c in &stale_chains {
        transaction.commands.push(Command::DeleteChain(c));
    }
    let stale_sets: BTreeSet<&'t String> = state
        .kernel
        .sets
        .iter()
        .filter(|s| !wanted.sets.contains(*s) && !state.in_use.contains(*s))
        .collect();
    for s in &stale_sets {
        transaction.commands.push(Command::DeleteSet(s));
    }
    let mut held: BTreeSet<String> = state
        .kernel
        .sets
        .iter()
        .filter(|s| !stale_sets.contains(s))
        .cloned()
        .collect();
    held.extend(wanted.sets.iter().cloned());
    NftPlan {
        sets,
        rules: transaction,
        after: NftNetnsState {
            kernel: NftObjects {
                table: true,
                sets: held,
                chains: wanted.chains,
            },
            in_use: wanted.sets,
        },
    }
}

/// Every table of a netns, by (family, name), with the names of its sets and chains.
pub type KernelTables = std::collections::BTreeMap<(String, String), NftObjects>;

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::Family;

    use netwarden_render::nft::{AddrEnd, AddrSetDef, Chain, Hook, IfBy, Match, Rule, Verdict};

    /// A table with `chains` (the first one a base chain jumping to each other) and one set per
    /// name in `sets`, each used by a rule of the first non-base chain.
    fn table(chains: &[&str], sets: &[&str]) -> Table {
        let rule = |matches, verdict| Rule {
            matches,
            stmts: vec![],
            verdict,
            origin: None,
        };
        let mut out = Table::default();
        for s in sets {
            out.sets.push(AddrSetDef {
                name: s.to_string(),
                family: Family::Ipv4,
                ranges: vec![(1, 1)],
            });
        }
        let base = Chain {
            name: chains[0].into(),
            hook: Some(Hook::Input),
            rules: chains[1..]
                .iter()
                .map(|c| {
                    rule(
                        vec![Match::IfName {
                            by: IfBy::In,
                            name: format!("if-{c}"),
                        }],
                        Verdict::Jump(c.to_string()),
                    )
                })
                .collect(),
        };
        out.chains.push(base);
        for (i, c) in chains[1..].iter().enumerate() {
            let rules = if i == 0 {
                sets.iter()
                    .map(|s| {
                        rule(
                            vec![Match::Addr {
                                family: Family::Ipv4,
                                end: AddrEnd::Src,
                                set: s.to_string(),
                            }],
                            Verdict::Accept,
                        )
                    })
                    .collect()
            } else {
                vec![]
            };
            out.chains.push(Chain {
                name: c.to_string(),
                hook: None,
                rules,
            });
        }
        out
    }

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// Applies both transactions of a plan to the model, in order.
    fn commit(kernel: &mut NftObjects, p: &NftPlan<'_>) {
        for tx in p.transactions() {
            kernel.apply(tx).unwrap();
        }
    }

    fn deletes(p: &NftPlan<'_>) -> Vec<String> {
        p.rules
            .commands
            .iter()
            .filter_map(|c| match c {
                Command::DeleteSet(n) => Some(format!("set {n}")),
                Command::DeleteChain(n) => Some(format!("chain {n}")),
                Command::DeleteTable => Some("table".into()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn sets_go_two_applies_after_their_last_use_and_chains_at_once() {
        let mut kernel = NftObjects::default();
        let mut state = NftNetnsState::from_kernel(kernel.clone());

        // 1: A on two interfaces.
        let t1 = table(&["input", "in_0", "in_1"], &["p4_a"]);
        let p = plan(Some(&t1), &state);
        assert!(deletes(&p).is_empty());
        commit(&mut kernel, &p);
        state = p.after;
        assert_eq!(state.kernel, kernel);

        // 2: peers changed (B), in_1 left: it goes now, A stays (the rules being replaced use it).
        let t2 = table(&["input", "in_0"], &["p4_b"]);
        let p = plan(Some(&t2), &state);
        assert_eq!(deletes(&p), ["chain in_1"]);
        commit(&mut kernel, &p);
        state = p.after;
        assert_eq!(kernel.sets, names(&["p4_a", "p4_b"]));
        assert_eq!(kernel.chains, names(&["input", "in_0"]));

        // 3: C: A is two applies stale and goes; B stays.
        let t3 = table(&["input", "in_0"], &["p4_c"]);
        let p = plan(Some(&t3), &state);
        assert_eq!(deletes(&p), ["set p4_a"]);
        commit(&mut kernel, &p);
        state = p.after;
        assert_eq!(kernel.sets, names(&["p4_b", "p4_c"]));

        // 4: back to B (still held, not re-sent): C stays one more apply.
        let t4 = table(&["input", "in_0"], &["p4_b"]);
        let p = plan(Some(&t4), &state);
        assert!(deletes(&p).is_empty());
        assert!(p.sets.commands.is_empty(), "a held set is not sent again");
        assert!(!p
            .rules
            .commands
            .iter()
            .any(|c| matches!(c, Command::AddSet(_) | Command::AddElements(_))));
        commit(&mut kernel, &p);
        state = p.after;

        // 5: same again: C goes.
        let p = plan(Some(&t4), &state);
        assert_eq!(deletes(&p), ["set p4_c"]);
        commit(&mut kernel, &p);
        assert_eq!(kernel.sets, names(&["p4_b"]));
        assert_eq!(p.after.kernel, kernel);

        // 6: nothing isolated any more: the table goes; then nothing is left to remove.
        let state = p.after;
        let p = plan(None, &state);
        assert_eq!(deletes(&p), ["table"]);
        commit(&mut kernel, &p);
        assert_eq!(kernel, NftObjects::default());
        assert!(plan(None, &p.after).is_empty());
    }

    #[test]
    fn unknown_state_keeps_every_set_found_once() {
        // A restarted agent finds sets in the kernel it knows nothing about.
        let mut kernel = NftObjects {
            table: true,
            sets: names(&["p4_old", "p4_a"]),
            chains: names(&["input", "in_0", "in_3"]),
        };
        let state = NftNetnsState::from_kernel(kernel.clone());
        let t = table(&["input", "in_0"], &["p4_a"]);
        let p = plan(Some(&t), &state);
        assert_eq!(deletes(&p), ["chain in_3"]);
        commit(&mut kernel, &p);
        let p2 = plan(Some(&t), &p.after);
        assert_eq!(deletes(&p2), ["set p4_old"]);
        commit(&mut kernel, &p2);
        assert_eq!(kernel.sets, names(&["p4_a"]));
    }

    #[test]
    fn stale_chains_are_all_flushed_before_any_is_deleted() {
        let state = NftNetnsState::from_kernel(NftObjects {
            table: true,
            sets: BTreeSet::new(),
            chains: names(&["input", "in_0", "output", "out_0"]),
        });
        let t = table(&["input", "in_0"], &[]);
        let p = plan(Some(&t), &state);
        let tail: Vec<String> = p
            .rules
            .commands
            .iter()
            .rev()
            .take(4)
            .map(|c| format!("{c:?}"))
            .collect();
        assert_eq!(
            tail,
            [
                "DeleteChain(\"output\")",
                "DeleteChain(\"out_0\")",
                "FlushChain(\"output\")",
                "FlushChain(\"out_0\")",
            ]
        );
        // The model accepts it: the stale base chain jumped to the stale chain.
        let mut kernel = state.kernel.clone();
        commit(&mut kernel, &p);
    }

    /// A new set is filled by a transaction of its own before any rule refers to it; the
    /// rules' transaction only refers to sets that exist by then.
    #[test]
    fn new_sets_are_made_before_the_rules_that_use_them() {
        let state = NftNetnsState::from_kernel(NftObjects {
            table: true,
            sets: names(&["p4_a"]),
            chains: names(&["input", "in_0"]),
        });
        let t = table(&["input", "in_0"], &["p4_a", "p4_new"]);
        let p = plan(Some(&t), &state);
        let made: Vec<&str> = p
            .sets
            .commands
            .iter()
            .filter_map(|c| match c {
                Command::AddElements(s) => Some(s.name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(made, ["p4_new"]);
        assert!(p.sets.commands.iter().all(|c| matches!(
            c,
            Command::AddTable | Command::AddSet(_) | Command::AddElements(_)
        )));
        assert!(!p
            .rules
            .commands
            .iter()
            .any(|c| matches!(c, Command::AddSet(_) | Command::AddElements(_))));
        // Killed between the two: the kernel holds the new set, unused; the old rules stay.
        let mut kernel = state.kernel.clone();
        kernel.apply(&p.sets).unwrap();
        assert!(kernel.sets.contains("p4_new"));
        // The rules alone would be refused without the sets made first.
        let mut without = state.kernel.clone();
        assert!(without.apply(&p.rules).is_err());
    }

    #[test]
    fn model_refuses_what_the_kernel_refuses() {
        let t = table(&["input", "in_0"], &["p4_a"]);
        let mut k = NftObjects::default();
        k.apply(&Transaction::create(&t)).unwrap();
        let before = k.clone();
        // Deleting a set the transaction's rules use fails, and changes nothing.
        let mut bad = Transaction::create(&t);
        bad.commands.push(Command::DeleteSet("p4_a"));
        assert!(k.apply(&bad).is_err());
        assert_eq!(k, before);
        // So does deleting a chain that was not flushed.
        let mut bad = Transaction::default();
        bad.commands.push(Command::DeleteChain("in_0"));
        assert!(k.apply(&bad).is_err());
        assert_eq!(k, before);
    }
}
