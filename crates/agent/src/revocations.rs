//! When and how widely each pod netns's live connections are judged after its rules changed
//! (revocation, SPEC 5): the bookkeeping, no I/O ([`crate::sync`] runs the passes).
//!
//! - **Scope**: a pass judges only what the change can deny since the netns was last judged
//!   ([`revocation_scope`] against the rules of its last successful pass): nothing when the
//!   rules only allow more, the connections of the peers that lost access when only peer sets
//!   changed (a filtered dump), else every connection. A netns never judged, whose pass
//!   failed, whose rules were removed (open meanwhile) or which was replaced judges everything.
//! - **Coalescing**: the pass of a netns runs [`REVOCATION_DELAY`] after the first change not
//!   yet judged, with the rules in force then; changes meanwhile join it. A busy cluster
//!   changes a pod's peers every few hundred milliseconds, and each pass costs the kernel a walk
//!   of the conntrack table (about 22 ms at 27,500 entries, even filtered): one pass per
//!   window instead of one per change. SPEC 5 asks for 1 s: the delay plus a pass (p99 120 ms
//!   for a full listing of 27,500 entries) stays well within it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use netwarden_engine::revocation::{revocation_scope, RevocationScope};
use netwarden_engine::{PodKey, PodRules};

/// How long after a netns's first unjudged change its revocation pass runs (see the module
/// doc).
pub const REVOCATION_DELAY: Duration = Duration::from_millis(250);

/// One pass to run: the pod, its netns, the rules to judge by, and what to look at.
#[derive(Debug, Clone)]
pub struct Pass {
    pub pod: PodKey,
    pub netns: PathBuf,
    pub rules: PodRules,
    pub scope: RevocationScope,
}

#[derive(Debug)]
struct Pending {
    pod: PodKey,
    rules: PodRules,
    since: Instant,
    /// The rules in force earlier in the window, each replaced before the pass: connections
    /// may have started under any of them.
    earlier: Vec<PodRules>,
}

/// The most rule changes one pass scopes against one by one; beyond, it judges everything.
const MAX_EARLIER: usize = 16;

/// The revocation passes owed and what each netns was last judged by.
#[derive(Debug)]
pub struct Revocations {
    delay: Duration,
    pending: BTreeMap<PathBuf, Pending>,
    /// Per netns, rules that allow every connection live there (its last pass judged them all
    /// by these).
    judged: BTreeMap<PathBuf, PodRules>,
}

impl Revocations {
    /// Passes run `delay` after a netns's first unjudged change (zero: at the next
    /// [`Revocations::due`]).
    pub fn new(delay: Duration) -> Self {
        Revocations {
            delay,
            pending: BTreeMap::new(),
            judged: BTreeMap::new(),
        }
    }

    /// How long after a netns's first unjudged change its pass runs.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// `pod`'s rules in `netns` changed to `rules` at `now` (an apply reached the kernel).
    pub fn changed(&mut self, pod: PodKey, netns: PathBuf, rules: PodRules, now: Instant) {
        match self.pending.get_mut(&netns) {
            Some(pending) => {
                pending.pod = pod;
                let replaced = std::mem::replace(&mut pending.rules, rules);
                pending.earlier.push(replaced);
            }
            None => {
                self.pending.insert(
                    netns,
                    Pending {
                        pod,
                        rules,
                        since: now,
                        earlier: Vec::new(),
                    },
                );
            }
        }
    }

    /// Nothing of netwarden's judges `netns` from now on (its rules were removed, it was
    /// replaced by another namespace, an apply there failed): no pass is owed, and the next
    /// judges everything.
    pub fn forget(&mut self, netns: &Path) {
        self.pending.remove(netns);
        self.judged.remove(netns);
    }

    /// The passes due at `now` (all owed when `all`, as when the agent stops), each with its
    /// scope; taken off the queue. Report each outcome with [`Revocations::done`].
    pub fn due(&mut self, now: Instant, all: bool) -> Vec<Pass> {
        let due: Vec<PathBuf> = self
            .pending
            .iter()
            .filter(|(_, p)| all || now >= p.since + self.delay)
            .map(|(netns, _)| netns.clone())
            .collect();
        due.into_iter()
            .filter_map(|netns| {
                let pending = self.pending.remove(&netns)?;
                // Connections may have started under the judged rules or under any rules in
                // force since: what the last rules deny of any of them.
                let scope = if pending.earlier.len() > MAX_EARLIER {
                    RevocationScope::Everything
                } else {
                    pending.earlier.iter().fold(
                        revocation_scope(self.judged.get(&netns), &pending.rules),
                        |scope, earlier| {
                            scope.join(revocation_scope(Some(earlier), &pending.rules))
                        },
                    )
                };
                Some(Pass {
                    pod: pending.pod,
                    netns,
                    rules: pending.rules,
                    scope,
                })
            })
            .collect()
    }

    /// A pass over `netns` with `rules` ended: `judged` whether it judged what it had to (the
    /// connections live there are all allowed by `rules` now); a failed one leaves the next
    /// to judge everything.
    pub fn done(&mut self, netns: &Path, rules: &PodRules, judged: bool) {
        if judged {
            self.judged.insert(netns.to_owned(), rules.clone());
        } else {
            self.judged.remove(netns);
        }
    }

    /// When the next pass is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.pending.values().map(|p| p.since + self.delay).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::testing::{netpol, pod, rule, selector, tcp};
    use netwarden_engine::{Engine, EngineOptions};

    /// The rules of pod `ns/web` allowing TCP `ports` to everyone (empty: every port).
    fn web(ports: &[u16]) -> PodRules {
        let mut e = Engine::new(EngineOptions::default());
        e.set_pod(pod("ns", "web", &[("app", "web")], &["10.0.0.1"]));
        e.set_policy(netpol(
            "ns",
            "p",
            selector(&[("app", "web")]),
            Some(vec![rule(vec![], ports.iter().map(|p| tcp(*p)).collect())]),
            None,
        ));
        e.pod_rules(&PodKey::new("ns", "web")).unwrap()
    }

    #[test]
    fn changes_within_the_delay_make_one_pass_with_the_last_rules() {
        let mut r = Revocations::new(Duration::from_millis(250));
        let netns = PathBuf::from("/run/netns/web");
        let key = PodKey::new("ns", "web");
        let t0 = Instant::now();
        r.changed(key.clone(), netns.clone(), web(&[80, 81]), t0);
        r.changed(
            key.clone(),
            netns.clone(),
            web(&[80]),
            t0 + Duration::from_millis(100),
        );
        assert_eq!(r.next_due(), Some(t0 + Duration::from_millis(250)));
        assert!(r.due(t0 + Duration::from_millis(200), false).is_empty());
        let passes = r.due(t0 + Duration::from_millis(250), false);
        assert_eq!(passes.len(), 1);
        assert_eq!(passes[0].rules, web(&[80]));
        // Never judged: everything.
        assert_eq!(passes[0].scope, RevocationScope::Everything);
        r.done(&netns, &passes[0].rules, true);
        assert_eq!(r.next_due(), None);

        // Wider since the last pass: nothing to look at; narrower: everything.
        let t1 = t0 + Duration::from_secs(1);
        r.changed(key.clone(), netns.clone(), web(&[]), t1);
        let pass = r.due(t1, true).remove(0);
        assert_eq!(pass.scope, RevocationScope::Nothing);
        r.done(&netns, &pass.rules, true);
        r.changed(key.clone(), netns.clone(), web(&[443]), t1);
        let pass = r.due(t1, true).remove(0);
        assert_eq!(pass.scope, RevocationScope::Everything);
        // A failed pass: the next judges everything, even for a wider change.
        r.done(&netns, &pass.rules, false);
        r.changed(key.clone(), netns.clone(), web(&[]), t1);
        assert_eq!(r.due(t1, true)[0].scope, RevocationScope::Everything);
    }

    /// A change that allowed more, then one that took part of it back, in one window: the
    /// connections started in between are judged, though the last rules allow all the judged
    /// ones did (found by `revoke_e2e`: a namespace policy, then a namespace label change).
    #[test]
    fn rules_in_force_within_the_window_count_too() {
        let mut r = Revocations::new(Duration::from_millis(250));
        let netns = PathBuf::from("/run/netns/web");
        let key = PodKey::new("ns", "web");
        let t0 = Instant::now();
        r.done(&netns, &web(&[80]), true);
        r.changed(key.clone(), netns.clone(), web(&[80, 81]), t0);
        r.changed(key.clone(), netns.clone(), web(&[80]), t0);
        // Against the judged rules alone: nothing. Against those in force meanwhile: port
        // 81 was lost.
        assert_eq!(
            revocation_scope(Some(&web(&[80])), &web(&[80])),
            RevocationScope::Nothing
        );
        assert_eq!(r.due(t0, true)[0].scope, RevocationScope::Everything);
    }

    #[test]
    fn a_forgotten_netns_owes_nothing_and_is_judged_whole_next_time() {
        let mut r = Revocations::new(Duration::ZERO);
        let netns = PathBuf::from("/run/netns/web");
        let key = PodKey::new("ns", "web");
        let now = Instant::now();
        r.changed(key.clone(), netns.clone(), web(&[80]), now);
        let pass = r.due(now, false).remove(0);
        r.done(&netns, &pass.rules, true);
        r.changed(key.clone(), netns.clone(), web(&[80, 81]), now);
        r.forget(&netns);
        assert!(r.due(now, true).is_empty());
        r.changed(key, netns.clone(), web(&[80, 81]), now);
        assert_eq!(r.due(now, false)[0].scope, RevocationScope::Everything);
    }
}
