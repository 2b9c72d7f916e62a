//! The agent's side of the `status` records (`netwarden_monitor::status`): which monitored
//! policies it watches, since when, over which local pods, and the cumulative counters it
//! writes every `--status-interval` and once at shutdown. A monitored policy is a namespaced
//! one or a cluster-scoped admin policy (SPEC 8), one [`MonitoredRef`]: its records name it as
//! its would-deny events do (`ns/name`, `Kind/name`), its pods are the local pods whose
//! (interface, direction) it judges (isolates, or has admin rules on).
//!
//! An *episode* is one policy watched with one spec: it starts when the agent first sees the
//! policy in monitor mode, and again when the spec changes (a different policy is a different
//! experiment: the evidence for the old one says nothing about the new one). Counters are
//! reported relative to the episode's start, so a record never counts what happened before it.
//!
//! Two sources feed the counters:
//! - the agent's metrics, which count since the agent started: would-deny events per policy,
//!   NFLOG messages lost per pod. A pod's losses count for every monitored policy that covers
//!   it (a lost message may have been that policy's would-deny), from the moment the pod
//!   joined the episode; a pod that leaves keeps what it contributed;
//! - the kernel's evidence counters in each pod's rules ([`CounterKind`]), per (interface,
//!   direction) the policy monitors there: new connections judged, would-denies, and
//!   would-denies that passed the rate limit to the log (the difference is what the limit
//!   suppressed). They are read when a pod joins an episode (the base) and at every record;
//!   a reading below the previous one means the counters started again (a new netns, a table
//!   made anew) and counts from zero.
//!
//! Fail closed: when a pod's kernel counters cannot be read (its base at joining, or now), the
//! record carries `null` for connections and rate-limit suppressions, and `report` refuses to
//! call the policy ready rather than take an absent count for zero. Counts of a pod between
//! its last reading and the moment it leaves an episode are not seen (it is usually gone).

use std::collections::{BTreeMap, BTreeSet};

use netwarden_dataplane::EvidenceCounters;
use netwarden_engine::{AdminPolicy, Direction, Mode, MonitoredRef, PodKey, PodRules, Policy};
use netwarden_monitor::{RecordType, StatusRecord, Timestamp};
use netwarden_render::{log_key_for, CounterKind, LogKey};

/// What the kernel counted on one pod for one policy: accumulated readings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counted {
    connections: u64,
    would_deny: u64,
    logged: u64,
}

impl Counted {
    fn add(&mut self, other: Counted) {
        self.connections += other.connections;
        self.would_deny += other.would_deny;
        self.logged += other.logged;
    }

    /// Would-denies the rate limit kept out of the log.
    fn rate_limited(&self) -> u64 {
        self.would_deny.saturating_sub(self.logged)
    }
}

/// One pod's part in an episode.
#[derive(Debug, Clone)]
struct PodShare {
    /// The pod's NFLOG loss count when it joined.
    dropped_base: u64,
    /// The (interface, direction) keys the policy monitors on the pod, now.
    keys: BTreeSet<LogKey>,
    /// The kernel counters at the last reading; `None` when a reading failed (from then on the
    /// pod's kernel figures are unknown).
    last: Option<EvidenceCounters>,
    /// What the kernel counted on `keys` since the pod joined, up to `last`.
    counted: Counted,
}

impl PodShare {
    /// Takes a new reading: adds what each key counted since the last one.
    fn advance(&mut self, now: Option<&EvidenceCounters>) {
        let (Some(last), Some(now)) = (&self.last, now) else {
            self.last = None;
            return;
        };
        for key in &self.keys {
            for kind in CounterKind::ALL {
                let was = last.get(&(*key, kind)).copied().unwrap_or(0);
                let is = now.get(&(*key, kind)).copied().unwrap_or(0);
                // Below the last reading: the counter started again from zero.
                let delta = if is >= was { is - was } else { is };
                match kind {
                    CounterKind::Connections => self.counted.connections += delta,
                    CounterKind::WouldDeny => self.counted.would_deny += delta,
                    CounterKind::Logged => self.counted.logged += delta,
                }
            }
        }
        self.last = Some(now.clone());
    }
}

/// The spec an episode watches: a change of it starts a new episode.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Spec {
    Namespaced(Policy),
    Admin(AdminPolicy),
}

impl Spec {
    fn reference(&self) -> MonitoredRef {
        match self {
            Spec::Namespaced(p) => p.reference().into(),
            Spec::Admin(p) => p.reference().into(),
        }
    }
}

#[derive(Debug, Clone)]
struct Episode {
    spec: Spec,
    since: Timestamp,
    /// The policy's would-deny count when the episode started.
    would_deny_base: u64,
    /// Pods covered now.
    pods: BTreeMap<PodKey, PodShare>,
    /// Losses of pods that left the episode, while they were in it.
    dropped_settled: u64,
    /// Kernel counts of pods that left the episode, while they were in it.
    counted_settled: Counted,
    /// A pod that left had unknown kernel figures: the episode's stay unknown.
    counted_unknown: bool,
}

/// What the metrics and the kernel count, read at one instant.
pub struct Counters<'a> {
    /// Would-deny events naming a policy (`ns/name`, or `Kind/name` for an admin policy).
    pub would_deny: &'a dyn Fn(&str) -> u64,
    /// NFLOG messages lost per pod (`ns/name`).
    pub dropped: &'a BTreeMap<String, u64>,
    /// The evidence counters in each pod's netns now, in the pods' order (`None`: cannot be
    /// read). Asked once per call for every pod that needs a reading: each is a listing in
    /// the pod's netns, and the caller may read them side by side.
    pub kernel: &'a dyn Fn(&[PodKey]) -> Vec<Option<EvidenceCounters>>,
}

impl Counters<'_> {
    fn dropped(&self, pod: &PodKey) -> u64 {
        self.dropped.get(&pod.to_string()).copied().unwrap_or(0)
    }
}

/// Monitored policies → the local pods whose rules they monitor (any interface, any
/// direction) → the (interface, direction) keys they monitor there, from the rules
/// currently programmed.
pub fn coverage<'a>(
    rules: impl IntoIterator<Item = &'a PodRules>,
) -> BTreeMap<MonitoredRef, BTreeMap<PodKey, BTreeSet<LogKey>>> {
    let mut out: BTreeMap<MonitoredRef, BTreeMap<PodKey, BTreeSet<LogKey>>> = BTreeMap::new();
    for pod in rules {
        for iface in &pod.interfaces {
            for (direction, dr) in [
                (Direction::Ingress, &iface.ingress),
                (Direction::Egress, &iface.egress),
            ] {
                let key = log_key_for(pod, &iface.name, direction);
                for p in dr.monitored() {
                    let keys = out
                        .entry(p)
                        .or_default()
                        .entry(pod.pod.clone())
                        .or_default();
                    keys.extend(key);
                }
            }
        }
    }
    out
}

/// The episodes of every monitored policy this agent knows.
#[derive(Debug, Default)]
pub struct StatusTracker {
    episodes: BTreeMap<MonitoredRef, Episode>,
}

impl StatusTracker {
    pub fn new() -> StatusTracker {
        StatusTracker::default()
    }

    /// Follows the current state: `policies` and `admin` (all of them; the monitored ones are
    /// kept) and the local pods each covers. Call it after every sync so pods join promptly (a
    /// joining pod's kernel counters are read then, as its base).
    pub fn observe<'a>(
        &mut self,
        policies: impl IntoIterator<Item = &'a Policy>,
        admin: impl IntoIterator<Item = &'a AdminPolicy>,
        coverage: &BTreeMap<MonitoredRef, BTreeMap<PodKey, BTreeSet<LogKey>>>,
        counters: &Counters,
        now: Timestamp,
    ) {
        // Monitored policies are few: their specs are copied, to compare with the episodes'.
        let namespaced = policies
            .into_iter()
            .filter(|p| p.mode == Mode::Monitor)
            .map(|p| Spec::Namespaced(p.clone()));
        let admin = admin
            .into_iter()
            .filter(|p| p.mode == Mode::Monitor)
            .map(|p| Spec::Admin(p.clone()));
        let monitored: Vec<(MonitoredRef, Spec)> = namespaced
            .chain(admin)
            .map(|spec| (spec.reference(), spec))
            .collect();
        // The pods joining an episode need a reading, their base. One reading per pod, all
        // asked at once: when the agent starts, every covered pod joins every monitored
        // policy covering it.
        let joining: BTreeSet<&PodKey> = monitored
            .iter()
            .flat_map(|(reference, spec)| {
                let episode = self.episodes.get(reference).filter(|e| e.spec == *spec);
                coverage
                    .get(reference)
                    .into_iter()
                    .flat_map(|c| c.keys())
                    .filter(move |pod| episode.is_none_or(|e| !e.pods.contains_key(*pod)))
            })
            .collect();
        let joining: Vec<PodKey> = joining.into_iter().cloned().collect();
        let readings: BTreeMap<PodKey, Option<EvidenceCounters>> = joining
            .iter()
            .cloned()
            .zip((counters.kernel)(&joining))
            .collect();
        let mut seen = BTreeSet::new();
        for (reference, spec) in monitored {
            let fresh = || Episode {
                spec: spec.clone(),
                since: now,
                would_deny_base: (counters.would_deny)(&reference.to_string()),
                pods: BTreeMap::new(),
                dropped_settled: 0,
                counted_settled: Counted::default(),
                counted_unknown: false,
            };
            let episode = self
                .episodes
                .entry(reference.clone())
                .and_modify(|e| {
                    if e.spec != spec {
                        *e = fresh();
                    }
                })
                .or_insert_with(fresh);
            let covered = coverage.get(&reference);
            let left: Vec<PodKey> = episode
                .pods
                .keys()
                .filter(|k| !covered.is_some_and(|c| c.contains_key(*k)))
                .cloned()
                .collect();
            for pod in left {
                let Some(share) = episode.pods.remove(&pod) else {
                    continue;
                };
                episode.dropped_settled +=
                    counters.dropped(&pod).saturating_sub(share.dropped_base);
                episode.counted_settled.add(share.counted);
                episode.counted_unknown |= share.last.is_none();
            }
            for (pod, keys) in covered.into_iter().flatten() {
                episode
                    .pods
                    .entry(pod.clone())
                    .or_insert_with(|| PodShare {
                        dropped_base: counters.dropped(pod),
                        keys: BTreeSet::new(),
                        // Every joining pod was read above (a pod missing there would count
                        // as unknown: its figures stay null, the verdict not ready).
                        last: readings.get(pod).cloned().flatten(),
                        counted: Counted::default(),
                    })
                    .keys = keys.clone();
            }
            seen.insert(reference);
        }
        self.episodes.retain(|r, _| seen.contains(r));
    }

    /// One record per monitored policy, as of `now`. Reads the kernel counters of every
    /// covered pod (once each, however many policies cover it).
    pub fn records(
        &mut self,
        node: &str,
        counters: &Counters,
        now: Timestamp,
    ) -> Vec<StatusRecord> {
        let pods: BTreeSet<PodKey> = self
            .episodes
            .values()
            .flat_map(|e| e.pods.keys().cloned())
            .collect();
        let pods: Vec<PodKey> = pods.into_iter().collect();
        let readings: BTreeMap<PodKey, Option<EvidenceCounters>> =
            pods.iter().cloned().zip((counters.kernel)(&pods)).collect();
        self.episodes
            .iter_mut()
            .map(|(reference, e)| {
                let policy = reference.to_string();
                let mut dropped_now = 0;
                let mut counted = e.counted_settled;
                let mut known = !e.counted_unknown;
                for (pod, share) in &mut e.pods {
                    dropped_now += counters.dropped(pod).saturating_sub(share.dropped_base);
                    share.advance(readings.get(pod).and_then(Option::as_ref));
                    known &= share.last.is_some();
                    counted.add(share.counted);
                }
                StatusRecord {
                    time: now,
                    node: node.to_owned(),
                    record: RecordType::Status,
                    kind: reference.kind_str().to_owned(),
                    monitored_since: e.since,
                    pods: e.pods.len() as u64,
                    would_deny: (counters.would_deny)(&policy).saturating_sub(e.would_deny_base),
                    nflog_dropped: e.dropped_settled + dropped_now,
                    rate_limited: known.then(|| counted.rate_limited()),
                    connections: known.then_some(counted.connections),
                    policy,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::{LabelSelector, ObjectKey, PolicyKind, PolicyScope};

    fn policy(name: &str, mode: Mode, ingress: bool) -> Policy {
        Policy {
            kind: PolicyKind::NetworkPolicy,
            key: ObjectKey::new("shop", name),
            pod_selector: LabelSelector::default(),
            ingress: ingress.then(Vec::new),
            egress: None,
            scope: PolicyScope::Primary,
            mode,
            replaces: None,
            log_denies: false,
        }
    }

    /// Pods covered on one key each (`LogKey(1)`).
    fn pods(names: &[&str]) -> BTreeMap<PodKey, BTreeSet<LogKey>> {
        names
            .iter()
            .map(|n| (ObjectKey::new("shop", *n), BTreeSet::from([LogKey(1)])))
            .collect()
    }

    /// Kernel counters of key `LogKey(1)`: connections, would-deny, logged.
    fn kernel(cn: u64, wd: u64, wl: u64) -> EvidenceCounters {
        [
            ((LogKey(1), CounterKind::Connections), cn),
            ((LogKey(1), CounterKind::WouldDeny), wd),
            ((LogKey(1), CounterKind::Logged), wl),
            // Another key of the pod, which the policy does not monitor: never counted.
            ((LogKey(2), CounterKind::Connections), 1_000),
        ]
        .into()
    }

    #[test]
    fn episodes_count_from_their_start_and_restart_on_a_new_spec() {
        let web = policy("web", Mode::Monitor, true);
        let lock = policy("lock", Mode::Enforce, true);
        let mut would_deny: BTreeMap<String, u64> = [("shop/web".to_owned(), 5)].into();
        let mut dropped: BTreeMap<String, u64> = [("shop/a".to_owned(), 7)].into();
        let mut cover = BTreeMap::from([(web.reference().into(), pods(&["a"]))]);
        let mut t = StatusTracker::new();
        let at = Timestamp::from_secs;
        macro_rules! counters {
            () => {
                Counters {
                    would_deny: &|p: &str| would_deny.get(p).copied().unwrap_or(0),
                    dropped: &dropped,
                    kernel: &|pods: &[PodKey]| vec![Some(kernel(0, 0, 0)); pods.len()],
                }
            };
        }
        t.observe([&web, &lock], [], &cover, &counters!(), at(100));
        let r = t.records("node-a", &counters!(), at(110));
        assert_eq!(r.len(), 1, "only monitored policies: {r:?}");
        assert_eq!(
            (r[0].policy.as_str(), r[0].monitored_since, r[0].pods),
            ("shop/web", at(100), 1)
        );
        assert_eq!((r[0].would_deny, r[0].nflog_dropped), (0, 0));
        assert_eq!((r[0].connections, r[0].rate_limited), (Some(0), Some(0)));

        // Later: 2 would-deny, pod a lost 3 messages, then left; pod b joined.
        *would_deny.get_mut("shop/web").unwrap() += 2;
        *dropped.get_mut("shop/a").unwrap() += 3;
        cover.insert(web.reference().into(), pods(&["b"]));
        dropped.insert("shop/b".into(), 1);
        t.observe([&web], [], &cover, &counters!(), at(200));
        dropped.insert("shop/b".into(), 2);
        let r = t.records("node-a", &counters!(), at(210));
        assert_eq!(
            (
                r[0].monitored_since,
                r[0].would_deny,
                r[0].nflog_dropped,
                r[0].pods
            ),
            (at(100), 2, 4, 1)
        );

        // A changed spec is a new episode.
        let web2 = policy("web", Mode::Monitor, false);
        t.observe([&web2], [], &cover, &counters!(), at(300));
        let r = t.records("node-a", &counters!(), at(310));
        assert_eq!(
            (r[0].monitored_since, r[0].would_deny, r[0].nflog_dropped),
            (at(300), 0, 0)
        );
        // Promoted (enforced): no more records.
        let enforced = policy("web", Mode::Enforce, false);
        t.observe([&enforced], [], &cover, &counters!(), at(400));
        assert!(t.records("node-a", &counters!(), at(410)).is_empty());
    }

    #[test]
    fn kernel_counters_count_from_joining_survive_restarts_and_fail_closed() {
        let web = policy("web", Mode::Monitor, true);
        let dropped = BTreeMap::new();
        let cover = BTreeMap::from([(web.reference().into(), pods(&["a"]))]);
        let reading = std::cell::RefCell::new(Some(kernel(10, 4, 4)));
        let counters = Counters {
            would_deny: &|_: &str| 0,
            dropped: &dropped,
            kernel: &|pods: &[PodKey]| vec![reading.borrow().clone(); pods.len()],
        };
        let at = Timestamp::from_secs;
        let mut t = StatusTracker::new();
        // Joins with 10 connections and 4 would-denies (4 logged) counted before: not this
        // episode's. Then 15 connections, 5 would-denies, 2 logged: 3 suppressed.
        t.observe([&web], [], &cover, &counters, at(100));
        *reading.borrow_mut() = Some(kernel(25, 9, 6));
        let r = t.records("n", &counters, at(110));
        assert_eq!((r[0].connections, r[0].rate_limited), (Some(15), Some(3)));
        // The netns was made anew: counters from zero, nothing lost or subtracted.
        *reading.borrow_mut() = Some(kernel(3, 1, 0));
        let r = t.records("n", &counters, at(120));
        assert_eq!((r[0].connections, r[0].rate_limited), (Some(18), Some(4)));
        // Unreadable: unknown from then on (fail closed), even when readable again.
        *reading.borrow_mut() = None;
        let r = t.records("n", &counters, at(130));
        assert_eq!((r[0].connections, r[0].rate_limited), (None, None));
        *reading.borrow_mut() = Some(kernel(50, 1, 0));
        let r = t.records("n", &counters, at(140));
        assert_eq!((r[0].connections, r[0].rate_limited), (None, None));
        // A new spec is a new episode: known again, counting from its start.
        let web2 = policy("web", Mode::Monitor, false);
        t.observe([&web2], [], &cover, &counters, at(150));
        *reading.borrow_mut() = Some(kernel(52, 1, 0));
        let r = t.records("n", &counters, at(160));
        assert_eq!((r[0].connections, r[0].rate_limited), (Some(2), Some(0)));
    }

    /// A monitored admin policy: its pods are those its rules judge, found in the rules the
    /// engine computes; its record names it `Kind/name` (as its would-deny events), apart from
    /// a namespaced policy of the same name; a changed spec restarts its episode; enforced, it
    /// has no record.
    #[test]
    fn admin_policies_have_episodes_of_their_own() {
        use netwarden_engine::testing::{
            admin_policy, admin_rule, in_namespaces, namespace, pod, selector,
        };
        use netwarden_engine::{
            AdminAction, AdminKind, AdminPeer, Engine, EngineOptions, PodsSelector,
        };

        let mut engine = Engine::new(EngineOptions::default());
        engine.set_namespace(namespace("shop", &[("team", "shop")]));
        for (name, app) in [("web-0", "web"), ("db-0", "db")] {
            let mut p = pod("shop", name, &[("app", app)], &["10.0.0.1"]);
            p.netns = Some("/run/netns/x".into());
            engine.set_pod(p);
        }
        let deny_all = admin_rule(
            AdminAction::Deny,
            vec![AdminPeer::Pods(in_namespaces(&[]))],
            None,
        );
        let mut admin = admin_policy(
            AdminKind::ClusterNetworkPolicy,
            "web",
            10,
            PodsSelector {
                namespaces: selector(&[("team", "shop")]),
                pods: selector(&[("app", "web")]),
            },
            vec![deny_all],
            Vec::new(),
        );
        admin.mode = Mode::Monitor;
        engine.set_admin_policy(admin.clone());
        // A monitored NetworkPolicy of the same name, on the db pod.
        let mut namespaced = policy("web", Mode::Monitor, true);
        namespaced.pod_selector = selector(&[("app", "db")]);
        engine.set_policy(namespaced.clone());
        let rules = engine.all_pod_rules();
        let cover = coverage(rules.values());
        let admin_ref = MonitoredRef::from(admin.reference());
        assert_eq!(
            cover[&admin_ref].keys().collect::<Vec<_>>(),
            [&ObjectKey::new("shop", "web-0")],
            "{cover:?}"
        );
        let web_rules = &rules[&ObjectKey::new("shop", "web-0")];
        assert_eq!(
            cover[&admin_ref][&ObjectKey::new("shop", "web-0")],
            BTreeSet::from([log_key_for(web_rules, "eth0", Direction::Ingress).unwrap()]),
            "ingress only: the policy has no egress rules"
        );

        let would_deny: BTreeMap<String, u64> = [
            ("ClusterNetworkPolicy/web".to_owned(), 3),
            ("shop/web".to_owned(), 1),
        ]
        .into();
        let dropped = BTreeMap::new();
        let reading = std::cell::RefCell::new(0u64);
        let key = log_key_for(web_rules, "eth0", Direction::Ingress).unwrap();
        let counters = Counters {
            would_deny: &|p: &str| would_deny.get(p).copied().unwrap_or(0),
            dropped: &dropped,
            kernel: &|pods: &[PodKey]| {
                let n = *reading.borrow();
                let counted: EvidenceCounters = [
                    ((key, CounterKind::Connections), n),
                    ((key, CounterKind::WouldDeny), 0),
                    ((key, CounterKind::Logged), 0),
                ]
                .into();
                vec![Some(counted); pods.len()]
            },
        };
        let at = Timestamp::from_secs;
        let mut t = StatusTracker::new();
        t.observe(engine.policies(), [&admin], &cover, &counters, at(100));
        *reading.borrow_mut() = 6;
        let records = t.records("n", &counters, at(110));
        let row = |records: &[StatusRecord], policy: &str| {
            records
                .iter()
                .find(|r| r.policy == policy)
                .cloned()
                .unwrap_or_else(|| panic!("no record of {policy}: {records:?}"))
        };
        let a = row(&records, "ClusterNetworkPolicy/web");
        assert_eq!(
            (a.kind.as_str(), a.pods, a.monitored_since, a.would_deny),
            ("ClusterNetworkPolicy", 1, at(100), 0)
        );
        assert_eq!((a.connections, a.rate_limited), (Some(6), Some(0)));
        let n = row(&records, "shop/web");
        assert_eq!((n.kind.as_str(), n.pods), ("NetworkPolicy", 1));
        assert_eq!(records.len(), 2);

        // A changed spec: a new episode; enforced: no record, the namespaced one goes on.
        let mut changed = admin.clone();
        changed.priority = 11;
        t.observe([&namespaced], [&changed], &cover, &counters, at(200));
        let records = t.records("n", &counters, at(210));
        assert_eq!(
            row(&records, "ClusterNetworkPolicy/web").monitored_since,
            at(200)
        );
        assert_eq!(row(&records, "shop/web").monitored_since, at(100));
        let mut enforced = changed;
        enforced.mode = Mode::Enforce;
        t.observe([&namespaced], [&enforced], &cover, &counters, at(300));
        let records = t.records("n", &counters, at(310));
        assert_eq!(
            records
                .iter()
                .map(|r| r.policy.as_str())
                .collect::<Vec<_>>(),
            ["shop/web"]
        );
    }
}
