//! The agent's side of the `status` records (`netwarden_monitor::status`): which monitored
//! policies it watches, since when, over which local pods, and the cumulative counters it
//! writes every `--status-interval` and once at shutdown.
//!
//! An *episode* is one policy watched with one spec: it starts when the agent first sees the
//! policy in monitor mode, and again when the spec changes (a different policy is a different
//! experiment: the evidence for the old one says nothing about the new one). Counters are
//! reported relative to the episode's start, so a record never counts what happened before it.
//!
//! Counters come from the agent's metrics, which count since the agent started: would-deny
//! events per policy, NFLOG messages lost per pod. A pod's losses count for every monitored
//! policy that covers it (a lost message may have been that policy's would-deny), from the
//! moment the pod joined the episode; a pod that leaves keeps what it contributed.
//!
//! Connections and rate-limit suppressions are written as `null`: this agent does not count
//! them in the kernel yet, and `report` then refuses to call the policy ready (fail closed)
//! rather than take an absent count for zero.

use std::collections::{BTreeMap, BTreeSet};

use netwarden_engine::{Mode, PodKey, PodRules, Policy, PolicyRef};
use netwarden_monitor::{RecordType, StatusRecord, Timestamp};

#[derive(Debug, Clone)]
struct Episode {
    spec: Policy,
    since: Timestamp,
    /// The policy's would-deny count when the episode started.
    would_deny_base: u64,
    /// Pods covered now → their NFLOG loss count when they joined.
    pods: BTreeMap<PodKey, u64>,
    /// Losses of pods that left the episode, while they were in it.
    dropped_settled: u64,
}

/// What the metrics count since the agent started, read at one instant.
pub struct Counters<'a> {
    /// Would-deny events naming a policy (`ns/name`).
    pub would_deny: &'a dyn Fn(&str) -> u64,
    /// NFLOG messages lost per pod (`ns/name`).
    pub dropped: &'a BTreeMap<String, u64>,
}

impl Counters<'_> {
    fn dropped(&self, pod: &PodKey) -> u64 {
        self.dropped.get(&pod.to_string()).copied().unwrap_or(0)
    }
}

/// Monitored policies → the local pods whose rules they monitor (any interface, any
/// direction), from the rules currently programmed.
pub fn coverage<'a>(
    rules: impl IntoIterator<Item = &'a PodRules>,
) -> BTreeMap<PolicyRef, BTreeSet<PodKey>> {
    let mut out: BTreeMap<PolicyRef, BTreeSet<PodKey>> = BTreeMap::new();
    for pod in rules {
        for iface in &pod.interfaces {
            for dr in [&iface.ingress, &iface.egress] {
                for p in &dr.monitored_policies {
                    out.entry(p.clone()).or_default().insert(pod.pod.clone());
                }
            }
        }
    }
    out
}

/// The episodes of every monitored policy this agent knows.
#[derive(Debug, Default)]
pub struct StatusTracker {
    episodes: BTreeMap<PolicyRef, Episode>,
}

impl StatusTracker {
    pub fn new() -> StatusTracker {
        StatusTracker::default()
    }

    /// Follows the current state: `policies` (all of them; the monitored ones are kept) and
    /// the local pods each covers. Call it after every sync so pods join promptly.
    pub fn observe<'a>(
        &mut self,
        policies: impl IntoIterator<Item = &'a Policy>,
        coverage: &BTreeMap<PolicyRef, BTreeSet<PodKey>>,
        counters: &Counters,
        now: Timestamp,
    ) {
        let mut seen = BTreeSet::new();
        for policy in policies.into_iter().filter(|p| p.mode == Mode::Monitor) {
            let reference = policy.reference();
            let fresh = || Episode {
                spec: policy.clone(),
                since: now,
                would_deny_base: (counters.would_deny)(&policy.key.to_string()),
                pods: BTreeMap::new(),
                dropped_settled: 0,
            };
            let episode = self
                .episodes
                .entry(reference.clone())
                .and_modify(|e| {
                    if e.spec != *policy {
                        *e = fresh();
                    }
                })
                .or_insert_with(fresh);
            let covered = coverage.get(&reference);
            let left: Vec<PodKey> = episode
                .pods
                .keys()
                .filter(|k| !covered.is_some_and(|c| c.contains(*k)))
                .cloned()
                .collect();
            for pod in left {
                let base = episode.pods.remove(&pod).unwrap_or(0);
                episode.dropped_settled += counters.dropped(&pod).saturating_sub(base);
            }
            for pod in covered.into_iter().flatten() {
                episode
                    .pods
                    .entry(pod.clone())
                    .or_insert_with(|| counters.dropped(pod));
            }
            seen.insert(reference);
        }
        self.episodes.retain(|r, _| seen.contains(r));
    }

    /// One record per monitored policy, as of `now`.
    pub fn records(&self, node: &str, counters: &Counters, now: Timestamp) -> Vec<StatusRecord> {
        self.episodes
            .iter()
            .map(|(reference, e)| {
                let policy = reference.key.to_string();
                let dropped_now: u64 = e
                    .pods
                    .iter()
                    .map(|(pod, base)| counters.dropped(pod).saturating_sub(*base))
                    .sum();
                StatusRecord {
                    time: now,
                    node: node.to_owned(),
                    record: RecordType::Status,
                    kind: reference.kind.to_string(),
                    monitored_since: e.since,
                    pods: e.pods.len() as u64,
                    would_deny: (counters.would_deny)(&policy).saturating_sub(e.would_deny_base),
                    nflog_dropped: e.dropped_settled + dropped_now,
                    rate_limited: None,
                    connections: None,
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

    fn pods(names: &[&str]) -> BTreeSet<PodKey> {
        names.iter().map(|n| ObjectKey::new("shop", *n)).collect()
    }

    #[test]
    fn episodes_count_from_their_start_and_restart_on_a_new_spec() {
        let web = policy("web", Mode::Monitor, true);
        let lock = policy("lock", Mode::Enforce, true);
        let mut would_deny: BTreeMap<String, u64> = [("shop/web".to_owned(), 5)].into();
        let mut dropped: BTreeMap<String, u64> = [("shop/a".to_owned(), 7)].into();
        let mut cover = BTreeMap::from([(web.reference(), pods(&["a"]))]);
        let mut t = StatusTracker::new();
        let at = Timestamp::from_secs;
        macro_rules! counters {
            () => {
                Counters {
                    would_deny: &|p: &str| would_deny.get(p).copied().unwrap_or(0),
                    dropped: &dropped,
                }
            };
        }
        t.observe([&web, &lock], &cover, &counters!(), at(100));
        let r = t.records("node-a", &counters!(), at(110));
        assert_eq!(r.len(), 1, "only monitored policies: {r:?}");
        assert_eq!(
            (r[0].policy.as_str(), r[0].monitored_since, r[0].pods),
            ("shop/web", at(100), 1)
        );
        assert_eq!((r[0].would_deny, r[0].nflog_dropped), (0, 0));
        assert_eq!((r[0].connections, r[0].rate_limited), (None, None));

        // Later: 2 would-deny, pod a lost 3 messages, then left; pod b joined.
        *would_deny.get_mut("shop/web").unwrap() += 2;
        *dropped.get_mut("shop/a").unwrap() += 3;
        cover.insert(web.reference(), pods(&["b"]));
        dropped.insert("shop/b".into(), 1);
        t.observe([&web], &cover, &counters!(), at(200));
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
        t.observe([&web2], &cover, &counters!(), at(300));
        let r = t.records("node-a", &counters!(), at(310));
        assert_eq!(
            (r[0].monitored_since, r[0].would_deny, r[0].nflog_dropped),
            (at(300), 0, 0)
        );
        // Promoted (enforced): no more records.
        let enforced = policy("web", Mode::Enforce, false);
        t.observe([&enforced], &cover, &counters!(), at(400));
        assert!(t.records("node-a", &counters!(), at(410)).is_empty());
    }
}
