//! Tamper repair in the agent (SPEC 5): every programmed pod netns is watched for nf_tables
//! changes ([`RulesWatch`]), compared with what was applied when the kernel says something
//! changed there and every `--verify-interval` anyway, and repaired when it differs.
//!
//! The dataplane does the comparing and the repairing (`Dataplane::verify`, `::repair`); this
//! module decides *when*, and says what happened: a `tamper` record in the events stream and
//! a counter for every repair, a log line at most once per pod per [`SAY_EVERY`] (a pod that
//! tampers in a loop is repaired every time, not logged every time).
//!
//! - The agent's own applies are notified like anyone's; the comparison after them finds
//!   nothing, which is what tells them apart (no report).
//! - A netns newly watched is compared once at once: a change between the apply and the
//!   subscription is not missed.
//! - What the kernel does not notify (ipset, a legacy iptables node, a lost notification
//!   without an overrun) is caught by the periodic comparison of every programmed netns.
//! - Repairs of one netns are paced, never given up: at least [`REPAIR_GAP`] apart, and when
//!   the rules still differ right after a repair (a pod tampering again at once, or something
//!   this process cannot put back) the gap doubles up to [`MAX_REPAIR_GAP`], back to the
//!   least after a repair that holds. A pod tampering in a loop is repaired every time, at a
//!   bounded cost; one that stops is repaired at once again. (A netns never left alone is the
//!   point: giving up on one whose differences "stay the same" would let a pod that deletes the
//!   table again and again keep it deleted.)

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use netwarden_dataplane::tamper::{summary, Difference, VerifyScope};
use netwarden_dataplane::{netns_id, Backend, Netns, NetnsId, Rules, RulesWatch};
use netwarden_engine::PodKey;
use netwarden_kube::{EventReason, PolicyEvent, PolicyObject};
use netwarden_manifest::ClusterKey;

/// The least time between two log lines about one pod's tampering.
pub const SAY_EVERY: Duration = Duration::from_secs(10);

/// The least time between two repairs of one netns: a pod tampering in a tight loop costs the
/// agent at most one transaction per gap.
pub const REPAIR_GAP: Duration = Duration::from_millis(10);

/// The most the gap grows to while repairs do not hold (see the module doc).
pub const MAX_REPAIR_GAP: Duration = Duration::from_millis(50);

/// When one netns may be repaired next.
#[derive(Debug, Clone, Copy)]
struct Pace {
    not_before: Instant,
    gap: Duration,
}

/// The tables whose nf_tables changes matter to `backend`: netwarden's own table, or the
/// filter tables iptables-nft keeps (iptables mode owns the pod's filter table).
pub fn watched_tables(backend: Backend) -> Vec<(u8, String)> {
    match backend {
        Backend::Nft => vec![(1, netwarden_render::nft::TABLE_NAME.to_string())],
        Backend::Iptables => vec![(2, "filter".to_string()), (10, "filter".to_string())],
    }
}

/// What one comparison found and did, for the caller to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    pub pod: PodKey,
    pub differences: Vec<Difference>,
    /// `Err`: why the rules are not in place again.
    pub result: Result<(), String>,
    /// Whether to log it (at most once per pod per [`SAY_EVERY`]); `repeats` repairs of the
    /// pod went unsaid before it.
    pub say: bool,
    pub repeats: u64,
}

/// When to compare which netns (see the module doc).
pub struct TamperGuard {
    watch: RulesWatch,
    /// The netns watched, the pod whose rules they hold, and which namespace the path named
    /// when it was watched (a sandbox restart puts a new one at the same path).
    watched: BTreeMap<PathBuf, (PodKey, Option<NetnsId>)>,
    every: Duration,
    last_all: Option<Instant>,
    /// Netns repaired lately: when they may be compared again.
    pace: HashMap<PathBuf, Pace>,
    /// What was due while its netns waited for its pace, merged.
    held: BTreeMap<PathBuf, (PodKey, VerifyScope)>,
    /// Per pod: when it was last logged, and repairs since.
    said: HashMap<PodKey, (Instant, u64)>,
}

impl TamperGuard {
    /// Watches for `backend`'s tables; `wake` is called when a watched netns changed.
    pub fn start(
        backend: Backend,
        every: Duration,
        wake: impl Fn() + Send + Sync + 'static,
    ) -> std::io::Result<TamperGuard> {
        let watch = RulesWatch::start_with(
            Rules {
                tables: watched_tables(backend),
            },
            wake,
        )?;
        Ok(TamperGuard {
            watch,
            watched: BTreeMap::new(),
            every,
            last_all: None,
            pace: HashMap::new(),
            held: BTreeMap::new(),
            said: HashMap::new(),
        })
    }

    /// The netns to compare now, with what to compare: those the kernel said changed, those
    /// newly programmed, and every one when the interval is due. Follows `programmed` (pod →
    /// netns) first: new netns are watched, those of pods gone are not any more.
    pub fn due(
        &mut self,
        programmed: &BTreeMap<PodKey, PathBuf>,
    ) -> Vec<(PodKey, PathBuf, VerifyScope)> {
        let wanted: BTreeMap<&PathBuf, &PodKey> =
            programmed.iter().map(|(pod, netns)| (netns, pod)).collect();
        let gone: Vec<PathBuf> = self
            .watched
            .keys()
            .filter(|netns| !wanted.contains_key(netns))
            .cloned()
            .collect();
        for netns in gone {
            self.watch.unwatch(&netns);
            self.watched.remove(&netns);
            self.pace.remove(&netns);
            self.held.remove(&netns);
        }
        let mut out: BTreeMap<PathBuf, (PodKey, VerifyScope)> = BTreeMap::new();
        for (netns, pod) in &wanted {
            // The namespace the path names now: a sandbox restarted at the same path is
            // watched anew (the old socket would keep the old namespace alive, its veth with
            // it) and compared at once.
            let id = netns_id(netns).ok();
            if self
                .watched
                .get(*netns)
                .is_some_and(|(watched_pod, watched_id)| watched_pod == *pod && *watched_id == id)
            {
                continue;
            }
            self.watch.unwatch(netns);
            // A pod's netns not watchable (gone meanwhile) is compared anyway: the comparison
            // says it is gone, and the next sync handles it.
            if let Ok(handle) = Netns::open(netns) {
                if let Err(e) = self.watch.watch(&handle) {
                    tracing::warn!("{pod}: cannot follow changes to its rules: {e}");
                }
            }
            self.watched.insert((*netns).clone(), ((*pod).clone(), id));
            out.insert((*netns).clone(), ((*pod).clone(), VerifyScope::rules()));
        }
        for (netns, news) in self.watch.take_news() {
            if news.scope.is_empty() {
                continue;
            }
            if let Some((pod, _)) = self.watched.get(&netns) {
                out.entry(netns)
                    .or_insert_with(|| (pod.clone(), VerifyScope::default()))
                    .1
                    .merge(news.scope);
            }
        }
        if self.last_all.is_none_or(|at| at.elapsed() >= self.every) {
            self.last_all = Some(Instant::now());
            for (netns, (pod, _)) in &self.watched {
                out.entry(netns.clone())
                    .or_insert_with(|| (pod.clone(), VerifyScope::default()))
                    .1
                    .merge(VerifyScope::rules());
            }
        }
        // What waits for its pace is held back, merged with what comes meanwhile.
        let now = Instant::now();
        for (netns, (pod, scope)) in std::mem::take(&mut self.held) {
            let entry = out
                .entry(netns)
                .or_insert_with(|| (pod, VerifyScope::default()));
            entry.1.merge(scope);
        }
        let mut due = Vec::new();
        for (netns, (pod, scope)) in out {
            match self.pace.get(&netns) {
                Some(pace) if pace.not_before > now => {
                    self.held.insert(netns, (pod, scope));
                }
                _ => due.push((pod, netns, scope)),
            }
        }
        due
    }

    /// When a held comparison is due (the caller waits no longer than this).
    pub fn next_due(&self) -> Option<Instant> {
        self.held
            .keys()
            .filter_map(|netns| self.pace.get(netns).map(|p| p.not_before))
            .min()
    }

    /// `pod`'s `netns` was repaired at `now`; `held`: whether its rules were as applied right
    /// after. Sets when it may be compared again (see the module doc); one that did not hold
    /// is compared again then whatever the kernel says meanwhile.
    pub fn repaired(&mut self, pod: &PodKey, netns: &PathBuf, held: bool, now: Instant) {
        if !held {
            self.held
                .entry(netns.clone())
                .or_insert_with(|| (pod.clone(), VerifyScope::default()))
                .1
                .merge(VerifyScope::all());
        }
        let gap = match self.pace.get(netns) {
            Some(pace) if !held => (pace.gap * 2).min(MAX_REPAIR_GAP),
            _ => REPAIR_GAP,
        };
        self.pace.insert(
            netns.clone(),
            Pace {
                not_before: now + gap,
                gap,
            },
        );
    }

    /// A repair of `pod` happened: whether to log it now, and how many went unsaid before.
    pub fn say(&mut self, pod: &PodKey, now: Instant) -> (bool, u64) {
        match self.said.get_mut(pod) {
            Some((at, unsaid)) if now.duration_since(*at) < SAY_EVERY => {
                *unsaid += 1;
                (false, *unsaid)
            }
            Some((at, unsaid)) => {
                let repeats = *unsaid;
                *at = now;
                *unsaid = 0;
                (true, repeats)
            }
            None => {
                self.said.insert(pod.clone(), (now, 0));
                (true, 0)
            }
        }
    }

    /// Forgets the pods not in `keep` (their rate limits).
    pub fn retain(&mut self, keep: &BTreeSet<&PodKey>) {
        self.said.retain(|pod, _| keep.contains(pod));
    }

    /// Notifications drained and overruns (for tests and metrics).
    pub fn counts(&self) -> (u64, u64) {
        self.watch.counts()
    }
}

/// The `RulesTampered` Event on the repaired Pod (with `--kube`; as rate-limited as the log
/// line). Each report is an Event of its own: its `generation` is the time of the report.
pub fn pod_event(repair: &Repair, uid: Option<String>, now: SystemTime) -> PolicyEvent {
    let millis = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    PolicyEvent {
        policy: PolicyObject {
            key: ClusterKey::new("Pod", &repair.pod.namespace, &repair.pod.name),
            api_version: "v1".into(),
            uid: uid.unwrap_or_default(),
            generation: millis,
        },
        reason: EventReason::RulesTampered,
        note: line(repair),
    }
}

/// What a comparison's outcome asks of the agent: `None`, nothing (the rules are as applied,
/// or the netns is gone with its pod); otherwise the differences to repair. A comparison that
/// fails for any other reason (the kernel's listing refused or not understood, e.g. an object
/// this nft cannot print) leaves what the rules let through unknown: it is a difference, and
/// the whole table is put back — never skipped, which would leave a tampered pod open.
pub fn to_repair(
    compared: Result<Vec<Difference>, netwarden_dataplane::ApplyError>,
) -> Option<Vec<Difference>> {
    match compared {
        Ok(differences) if differences.is_empty() => None,
        Ok(differences) => Some(differences),
        Err(e) if e.netns_gone() => None,
        Err(e) => Some(vec![Difference::Unreadable(e.to_string())]),
    }
}

/// One line about a repair.
pub fn line(repair: &Repair) -> String {
    let what = summary(&repair.differences, 5);
    let again = if repair.repeats > 0 {
        format!(" (and {} more times since the last report)", repair.repeats)
    } else {
        String::new()
    };
    match &repair.result {
        Ok(()) => format!(
            "{}: its rules were changed by someone else ({what}); put back{again}",
            repair.pod
        ),
        Err(e) => format!(
            "{}: its rules were changed by someone else ({what}); could not put them back: {e}",
            repair.pod
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comparison_that_fails_is_a_difference_unless_the_netns_is_gone() {
        use netwarden_dataplane::tamper::Part;
        use netwarden_dataplane::{ApplyError, NetnsError};
        let netns = PathBuf::from("/run/netns/p");
        assert_eq!(to_repair(Ok(Vec::new())), None);
        let missing = vec![Difference::Missing(Part::Table)];
        assert_eq!(to_repair(Ok(missing.clone())), Some(missing));
        let gone = ApplyError::Netns {
            netns: netns.clone(),
            source: NetnsError::Open {
                path: netns.clone(),
                source: std::io::ErrorKind::NotFound.into(),
            },
        };
        assert_eq!(to_repair(Err(gone)), None);
        // Refused or not understood: unknown, so repaired (fail closed), never skipped.
        let refused = ApplyError::Injected {
            netns: netns.clone(),
        };
        let Some(differences) = to_repair(Err(refused)) else {
            panic!("a failed comparison must be repaired");
        };
        assert!(
            matches!(&differences[..], [Difference::Unreadable(why)] if why.contains("/run/netns/p")),
            "{differences:?}"
        );
    }

    #[test]
    fn a_pod_tampering_in_a_loop_is_said_once_a_period_with_the_count() {
        let mut guard = TamperGuard::start(Backend::Nft, Duration::from_secs(10), || {}).unwrap();
        let pod = PodKey::new("a", "p");
        let t0 = Instant::now();
        assert_eq!(guard.say(&pod, t0), (true, 0));
        assert_eq!(guard.say(&pod, t0 + Duration::from_secs(1)), (false, 1));
        assert_eq!(guard.say(&pod, t0 + Duration::from_secs(2)), (false, 2));
        assert_eq!(
            guard.say(&pod, t0 + SAY_EVERY + Duration::from_secs(1)),
            (true, 2)
        );
        let repair = Repair {
            pod: pod.clone(),
            differences: vec![Difference::Missing(
                netwarden_dataplane::tamper::Part::Table,
            )],
            result: Ok(()),
            say: true,
            repeats: 2,
        };
        assert_eq!(
            line(&repair),
            "a/p: its rules were changed by someone else (table missing); put back (and 2 more \
             times since the last report)"
        );
    }

    #[test]
    fn every_programmed_netns_is_compared_when_due_and_new_ones_at_once() {
        let mut guard = TamperGuard::start(Backend::Nft, Duration::from_secs(3600), || {}).unwrap();
        let programmed: BTreeMap<PodKey, PathBuf> = [(
            PodKey::new("a", "p"),
            PathBuf::from("/nonexistent/netwarden-a"),
        )]
        .into();
        let first = guard.due(&programmed);
        assert_eq!(first.len(), 1);
        assert!(first[0].2.rules);
        // Nothing new, the interval not due: nothing to compare.
        assert!(guard.due(&programmed).is_empty());
        // The pod went: its netns is not followed any more.
        assert!(guard.due(&BTreeMap::new()).is_empty());
        assert!(guard.watched.is_empty());
    }

    #[test]
    fn repairs_of_one_netns_are_paced_never_given_up() {
        let mut guard = TamperGuard::start(Backend::Nft, Duration::from_secs(3600), || {}).unwrap();
        let pod = PodKey::new("a", "p");
        let netns = PathBuf::from("/nonexistent/netwarden-b");
        let programmed: BTreeMap<PodKey, PathBuf> = [(pod.clone(), netns.clone())].into();
        assert_eq!(guard.due(&programmed).len(), 1);
        // A repair that did not hold: compared again after the least gap, not before.
        let t0 = Instant::now();
        guard.repaired(&pod, &netns, false, t0);
        assert!(guard.due(&programmed).is_empty());
        assert_eq!(guard.next_due(), Some(t0 + REPAIR_GAP));
        std::thread::sleep(REPAIR_GAP);
        let again = guard.due(&programmed);
        assert_eq!(again.len(), 1);
        assert!(again[0].2.all, "compared whole");
        // Each repair that does not hold doubles the gap, up to the most.
        let mut expected = REPAIR_GAP;
        for _ in 0..10 {
            let now = Instant::now();
            guard.repaired(&pod, &netns, false, now);
            expected = (expected * 2).min(MAX_REPAIR_GAP);
            assert_eq!(guard.next_due(), Some(now + expected));
        }
        assert_eq!(expected, MAX_REPAIR_GAP);
        // One that holds: back to the least gap, and nothing held.
        guard.held.clear();
        let now = Instant::now();
        guard.repaired(&pod, &netns, true, now);
        assert_eq!(guard.pace[&netns].gap, REPAIR_GAP);
        assert_eq!(guard.next_due(), None);
    }
}
