//! Promotion evidence: the status records ([`crate::status`]) of one policy, from every node,
//! combined over the `clean_for` window into a [`Verdict`].
//!
//! A monitored policy is **ready to promote** only when all of these hold in the window
//! `[now - clean_for, now]`:
//! - there is evidence at all: a status record for it within the window (an empty events file,
//!   or one written by an agent that is gone, proves nothing);
//! - it was monitored for at least `clean_for` on every node still reporting: per node, from the
//!   `monitored_since` of its current episode to its last status record. An agent restart or a
//!   changed spec starts a new episode, so the clock starts again (fail closed: the restarted
//!   agent cannot vouch for what happened while it was down);
//! - its pods saw traffic (connections > 0): a policy whose pods nobody talked to was not tested;
//! - no would-deny (from the status counters or from the events, whichever says more);
//! - no log message was lost (NFLOG drops, rate-limit suppressions): otherwise "no would-deny"
//!   may only mean "none that reached us".
//!
//! Counters are cumulative per (node, `monitored_since`) episode, so the window's figure per
//! episode is its last record minus its last record at or before the window start (zero when
//! the episode began inside the window, or when no record precedes the window start: then the
//! whole episode counts, which can only add would-denies and losses, never hide them). Every
//! episode with a record inside the window counts, including ones a restart ended, so
//! would-denies seen just before a restart are not forgotten. Nodes add up.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::status::StatusRecord;
use crate::time::{human_duration, Timestamp};

/// One policy's evidence in the window, combined over nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Evidence {
    /// Nodes with a status record for the policy inside the window.
    pub nodes: Vec<String>,
    /// The latest `monitored_since` among those nodes' current episodes.
    pub monitored_since: Option<Timestamp>,
    /// The shortest monitored time among those nodes (see the module doc).
    pub monitored_seconds: u64,
    /// Pods the policy selects, summed over the nodes' last records.
    pub pods: u64,
    pub would_deny: u64,
    pub nflog_dropped: u64,
    /// `None` when a record in the window did not count them.
    pub rate_limited: Option<u64>,
    /// `None` when a record in the window did not count them.
    pub connections: Option<u64>,
    /// The last status record.
    pub last_status: Option<Timestamp>,
}

/// A condition that keeps a monitored policy from being ready to promote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "condition", rename_all = "kebab-case")]
pub enum Failing {
    /// No status record inside the window.
    NoEvidence,
    MonitoredTooShort {
        monitored_seconds: u64,
        required_seconds: u64,
    },
    NoTraffic,
    /// A status record in the window carries `null` for this counter.
    NotCounted {
        counter: &'static str,
    },
    WouldDeny {
        count: u64,
    },
    EventsLost {
        nflog_dropped: u64,
        rate_limited: u64,
    },
}

impl fmt::Display for Failing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failing::NoEvidence => write!(f, "no evidence yet"),
            Failing::MonitoredTooShort {
                monitored_seconds,
                required_seconds,
            } => write!(
                f,
                "monitored for only {} of {}",
                human_duration(Duration::from_secs(*monitored_seconds)),
                human_duration(Duration::from_secs(*required_seconds))
            ),
            Failing::NoTraffic => write!(f, "no traffic on its pods"),
            Failing::NotCounted { counter } => {
                write!(
                    f,
                    "{counter} not counted by the agent (null in its status records)"
                )
            }
            Failing::WouldDeny { count } => write!(f, "{count} would-deny in the window"),
            Failing::EventsLost {
                nflog_dropped,
                rate_limited,
            } => write!(
                f,
                "events were dropped ({nflog_dropped} NFLOG, {rate_limited} rate-limited)"
            ),
        }
    }
}

/// The decision for one monitored policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub ready: bool,
    /// Empty exactly when `ready`.
    pub failing: Vec<Failing>,
    /// For people: the failing conditions, or what the readiness rests on.
    pub reason: String,
}

/// Combines the status records of one policy (any nodes, any order) over the window.
pub fn combine(records: &[&StatusRecord], now: Timestamp, clean_for: Duration) -> Evidence {
    let start = now.minus(clean_for);
    let mut episodes: BTreeMap<(&str, Timestamp), Vec<&StatusRecord>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.time <= now) {
        episodes
            .entry((r.node.as_str(), r.monitored_since))
            .or_default()
            .push(r);
    }
    let mut ev = Evidence {
        rate_limited: Some(0),
        connections: Some(0),
        ..Evidence::default()
    };
    // Per node: the episode with the last record inside the window.
    let mut current: BTreeMap<&str, &StatusRecord> = BTreeMap::new();
    for ((node, _), list) in &mut episodes {
        list.sort_by_key(|r| r.time);
        let Some(last) = list.last().copied().filter(|r| r.time >= start) else {
            continue; // nothing inside the window
        };
        let base = list.iter().rev().find(|r| r.time <= start).copied();
        let delta = |f: fn(&StatusRecord) -> u64| f(last).saturating_sub(base.map_or(0, f));
        // A counter the agent did not count (`None`, at either end) makes the sum unknown.
        let counted = |f: fn(&StatusRecord) -> Option<u64>| {
            let at_base = base.map_or(Some(0), f);
            Some(f(last)?.saturating_sub(at_base?))
        };
        let add = |sum: Option<u64>, d: Option<u64>| Some(sum? + d?);
        ev.would_deny += delta(|r| r.would_deny);
        ev.nflog_dropped += delta(|r| r.nflog_dropped);
        ev.rate_limited = add(ev.rate_limited, counted(|r| r.rate_limited));
        ev.connections = add(ev.connections, counted(|r| r.connections));
        let slot = current.entry(*node).or_insert(last);
        if last.time > slot.time {
            *slot = last;
        }
    }
    ev.nodes = current.keys().map(|n| (*n).to_owned()).collect();
    ev.monitored_since = current.values().map(|r| r.monitored_since).max();
    ev.monitored_seconds = current
        .values()
        .map(|r| r.time.since(r.monitored_since).as_secs())
        .min()
        .unwrap_or(0);
    ev.pods = current.values().map(|r| r.pods).sum();
    ev.last_status = current.values().map(|r| r.time).max();
    ev
}

/// The verdict on `ev`; `would_deny_events` is the number of would-deny events naming the policy
/// inside the window (they count even without status records).
pub fn verdict(ev: &Evidence, would_deny_events: u64, clean_for: Duration) -> Verdict {
    let mut failing = Vec::new();
    let would_deny = ev.would_deny.max(would_deny_events);
    if ev.nodes.is_empty() {
        failing.push(Failing::NoEvidence);
    } else {
        if ev.monitored_seconds < clean_for.as_secs() {
            failing.push(Failing::MonitoredTooShort {
                monitored_seconds: ev.monitored_seconds,
                required_seconds: clean_for.as_secs(),
            });
        }
        match ev.connections {
            None => failing.push(Failing::NotCounted {
                counter: "connections",
            }),
            Some(0) => failing.push(Failing::NoTraffic),
            Some(_) => {}
        }
        if ev.rate_limited.is_none() {
            failing.push(Failing::NotCounted {
                counter: "rate-limit suppressions",
            });
        }
    }
    if would_deny > 0 {
        failing.push(Failing::WouldDeny { count: would_deny });
    }
    let rate_limited = ev.rate_limited.unwrap_or(0);
    if ev.nflog_dropped > 0 || rate_limited > 0 {
        failing.push(Failing::EventsLost {
            nflog_dropped: ev.nflog_dropped,
            rate_limited,
        });
    }
    let reason = if failing.is_empty() {
        format!(
            "monitored for {} on {} node(s), {} connection(s), no would-deny, no events lost",
            human_duration(Duration::from_secs(ev.monitored_seconds)),
            ev.nodes.len(),
            ev.connections.unwrap_or(0)
        )
    } else {
        failing
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    };
    Verdict {
        ready: failing.is_empty(),
        failing,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::RecordType;

    const HOUR: u64 = 3600;

    /// A status record of `shop/web` on `node`, at `secs`, in the episode begun at `since`.
    fn st(node: &str, secs: i64, since: i64, would_deny: u64, connections: u64) -> StatusRecord {
        StatusRecord {
            time: Timestamp::from_secs(secs),
            node: node.into(),
            record: RecordType::Status,
            policy: "shop/web".into(),
            kind: "NetworkPolicy".into(),
            monitored_since: Timestamp::from_secs(since),
            pods: 1,
            would_deny,
            nflog_dropped: 0,
            rate_limited: Some(0),
            connections: Some(connections),
        }
    }

    fn judge(records: &[StatusRecord], now: i64, events: u64) -> Verdict {
        let refs: Vec<&StatusRecord> = records.iter().collect();
        let clean_for = Duration::from_secs(HOUR);
        verdict(
            &combine(&refs, Timestamp::from_secs(now), clean_for),
            events,
            clean_for,
        )
    }

    #[test]
    fn counts_are_window_differences_per_episode() {
        // Before the window (now 7200, start 3600): 5 would-deny, 100 connections; after: none.
        let records = vec![
            st("a", 3000, 0, 5, 100),
            st("a", 3600, 0, 5, 100),
            st("a", 7200, 0, 5, 160),
        ];
        let v = judge(&records, 7200, 0);
        assert!(v.ready, "{v:?}");
        assert_eq!(
            v.reason,
            "monitored for 2h on 1 node(s), 60 connection(s), no would-deny, no events lost"
        );
        // A restart at 6000 with would-denies just before it: the old episode still counts, and
        // the clock starts again.
        let records = vec![
            st("a", 3600, 0, 0, 100),
            st("a", 5900, 0, 2, 150),
            st("a", 7200, 6000, 0, 10),
        ];
        let v = judge(&records, 7200, 0);
        assert_eq!(
            v.failing,
            vec![
                Failing::MonitoredTooShort {
                    monitored_seconds: 1200,
                    required_seconds: HOUR
                },
                Failing::WouldDeny { count: 2 }
            ]
        );
        assert_eq!(
            v.reason,
            "monitored for only 20m of 1h; 2 would-deny in the window"
        );
    }

    #[test]
    fn records_after_now_or_before_the_window_are_not_evidence() {
        let v = judge(&[st("a", 100, 0, 0, 5), st("a", 9000, 0, 0, 9)], 7200, 0);
        assert_eq!(v.failing, vec![Failing::NoEvidence]);
        assert_eq!(v.reason, "no evidence yet");
    }

    #[test]
    fn nodes_combine() {
        // Node b carries the traffic, node a was restarted 30 minutes ago.
        let records = vec![
            st("a", 3600, 0, 0, 0),
            st("a", 7200, 5400, 0, 0),
            st("b", 3600, 0, 0, 10),
            st("b", 7200, 0, 0, 40),
        ];
        let refs: Vec<&StatusRecord> = records.iter().collect();
        let ev = combine(&refs, Timestamp::from_secs(7200), Duration::from_secs(HOUR));
        assert_eq!(ev.nodes, ["a", "b"]);
        assert_eq!(ev.connections, Some(30));
        assert_eq!(ev.pods, 2);
        assert_eq!(ev.monitored_seconds, 1800);
        assert_eq!(ev.monitored_since, Some(Timestamp::from_secs(5400)));
        let v = judge(&records, 7200, 0);
        assert_eq!(v.reason, "monitored for only 30m of 1h");
    }
}
