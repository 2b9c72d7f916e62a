//! `netwarden report`: evidence for promoting monitored policies, aggregated from events.
//!
//! Events are grouped per (policy, action, source workload, destination workload, port and
//! protocol) with a count and first/last seen, and summed per policy. Whether a monitored policy
//! is **ready to promote** is decided from the agents' status records and the events over the
//! `clean_for` window before `now` ([`crate::evidence`]): monitored long enough, traffic seen,
//! no would-deny, nothing lost. Without status records there is no evidence, whatever the
//! events say: an empty events file proves nothing.
//!
//! A "workload" is the pod name with the suffix its controller generates stripped, so the replicas
//! of one Deployment aggregate together. The heuristic, on the `-`-separated parts of the name:
//! - a last part of exactly 5 characters from Kubernetes' random-suffix alphabet
//!   (`bcdfghjklmnpqrstvwxz2456789`, no vowels so real words rarely match) is dropped
//!   (ReplicaSet, DaemonSet, Job pods), and then a part of 6 to 10 characters from the same
//!   alphabet (the pod-template-hash of a Deployment's ReplicaSet) is dropped too;
//! - otherwise a last part made only of digits (a StatefulSet ordinal) is dropped;
//! - a name is never reduced to nothing.
//!
//! So `web-7d4b9c-xk2p9` → `web`, `db-0` → `db`, `agent-x7k2p` → `agent`, `nginx-proxy` stays.
//! An address that is no known pod stays an address.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use netwarden_engine::Direction;
use serde::Serialize;

use crate::event::{Event, EventAction};
use crate::evidence::{combine, verdict, Evidence, Failing};
use crate::status::StatusRecord;
use crate::time::Timestamp;

const SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn in_alphabet(part: &str) -> bool {
    part.bytes().all(|b| SUFFIX_ALPHABET.contains(&b))
}

/// Strips the controller-generated suffix of a pod name (see the module doc).
pub fn workload_name(pod: &str) -> &str {
    let mut name = pod;
    if let Some((head, tail)) = name.rsplit_once('-') {
        if tail.len() == 5 && in_alphabet(tail) && !head.is_empty() {
            name = head;
            if let Some((head, tail)) = name.rsplit_once('-') {
                if (6..=10).contains(&tail.len()) && in_alphabet(tail) && !head.is_empty() {
                    name = head;
                }
            }
        } else if !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) && !head.is_empty() {
            name = head;
        }
    }
    name
}

/// `ns/name` of a pod → `ns/workload`; anything without a `/` is returned as is.
pub fn workload_of(pod: &str) -> String {
    match pod.split_once('/') {
        Some((ns, name)) => format!("{ns}/{}", workload_name(name)),
        None => pod.to_owned(),
    }
}

/// One aggregated flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FlowRow {
    pub policy: String,
    pub action: EventAction,
    /// `ns/workload`, or the address when the peer is no known pod.
    pub source: String,
    pub destination: String,
    pub port: Option<u16>,
    pub protocol: String,
    pub count: u64,
    pub first_seen: Timestamp,
    pub last_seen: Timestamp,
}

/// Where a policy stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyStatus {
    /// Monitored, and every condition of [`crate::evidence`] holds in the window.
    ReadyToPromote,
    /// Monitored, and at least one condition fails (the row's `failing` says which).
    NotReady,
    /// Only seen as an enforced policy (deny events).
    Enforced,
}

impl PolicyStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyStatus::ReadyToPromote => "ready to promote",
            PolicyStatus::NotReady => "not ready",
            PolicyStatus::Enforced => "enforced",
        }
    }
}

/// Totals of one policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyRow {
    pub policy: String,
    /// The kind, from the status records (events do not carry it).
    pub kind: Option<String>,
    /// Would-deny events naming it, all of the stream.
    pub would_deny: u64,
    pub deny: u64,
    /// Last would-deny.
    pub last_would_deny: Option<Timestamp>,
    /// Last event of any action naming this policy.
    pub last_seen: Option<Timestamp>,
    pub status: PolicyStatus,
    /// The window's evidence from status records (monitored policies only).
    pub evidence: Option<Evidence>,
    /// The conditions that fail; empty when ready or enforced.
    pub failing: Vec<Failing>,
    /// The verdict's reason, for people.
    pub reason: String,
}

/// The result of [`aggregate`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub now: Timestamp,
    pub clean_for_seconds: u64,
    /// Sorted by policy, then by count (largest first).
    pub flows: Vec<FlowRow>,
    /// Sorted by policy.
    pub policies: Vec<PolicyRow>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct FlowKey {
    policy: String,
    action: EventAction,
    source: String,
    destination: String,
    port: Option<u16>,
    protocol: String,
}

/// Aggregates `events` and `statuses` as of `now` with a `clean_for` window (see the module doc).
pub fn aggregate(
    events: &[Event],
    statuses: &[StatusRecord],
    now: Timestamp,
    clean_for: Duration,
) -> Report {
    aggregate_with(events, statuses, &[], now, clean_for)
}

/// Like [`aggregate`], also listing `monitored` policies (from the current state) that appear
/// in no event and no status record: their verdict says there is no evidence yet.
pub fn aggregate_with(
    events: &[Event],
    statuses: &[StatusRecord],
    monitored: &[String],
    now: Timestamp,
    clean_for: Duration,
) -> Report {
    let since = now.minus(clean_for);
    let mut flows: BTreeMap<FlowKey, FlowRow> = BTreeMap::new();
    #[derive(Default)]
    struct Acc<'a> {
        monitored: bool,
        would_deny: u64,
        deny: u64,
        last_would_deny: Option<Timestamp>,
        /// Would-deny events inside the window.
        recent_would_deny: u64,
        last_seen: Option<Timestamp>,
        kind: Option<String>,
        statuses: Vec<&'a StatusRecord>,
    }
    let mut policies: BTreeMap<String, Acc> = monitored
        .iter()
        .map(|p| {
            (
                p.clone(),
                Acc {
                    monitored: true,
                    ..Acc::default()
                },
            )
        })
        .collect();

    for st in statuses {
        let acc = policies.entry(st.policy.clone()).or_default();
        acc.monitored = true;
        acc.kind.get_or_insert_with(|| st.kind.clone());
        acc.statuses.push(st);
    }
    for ev in events {
        let own = workload_of(&ev.pod);
        let other = ev
            .peer
            .as_deref()
            .map_or_else(|| ev.peer_addr().to_string(), workload_of);
        let (source, destination) = match ev.direction {
            Direction::Ingress => (other, own),
            Direction::Egress => (own, other),
        };
        // A would-deny is evidence against the monitored policies; a deny is the work of the
        // enforced ones.
        let named = match ev.action {
            EventAction::WouldDeny => &ev.policies,
            EventAction::Deny => &ev.enforced_policies,
            // Learn mode's flows are no evidence for or against a policy.
            EventAction::Observed => continue,
        };
        for p in &ev.policies {
            policies.entry(p.clone()).or_default().monitored = true;
        }
        for policy in named {
            let acc = policies.entry(policy.clone()).or_default();
            acc.last_seen = acc.last_seen.max(Some(ev.time));
            match ev.action {
                EventAction::WouldDeny => {
                    acc.would_deny += 1;
                    acc.last_would_deny = acc.last_would_deny.max(Some(ev.time));
                    acc.recent_would_deny += u64::from((since..=now).contains(&ev.time));
                }
                EventAction::Deny => acc.deny += 1,
                EventAction::Observed => {}
            }
            let key = FlowKey {
                policy: policy.clone(),
                action: ev.action,
                source: source.clone(),
                destination: destination.clone(),
                port: ev.dport,
                protocol: ev.protocol.clone(),
            };
            flows
                .entry(key)
                .and_modify(|row| {
                    row.count += 1;
                    row.first_seen = row.first_seen.min(ev.time);
                    row.last_seen = row.last_seen.max(ev.time);
                })
                .or_insert_with(|| FlowRow {
                    policy: policy.clone(),
                    action: ev.action,
                    source: source.clone(),
                    destination: destination.clone(),
                    port: ev.dport,
                    protocol: ev.protocol.clone(),
                    count: 1,
                    first_seen: ev.time,
                    last_seen: ev.time,
                });
        }
    }

    let mut flows: Vec<FlowRow> = flows.into_values().collect();
    // Stable sort keeps the key order (action, source, ...) among equal counts.
    flows.sort_by(|a, b| a.policy.cmp(&b.policy).then(b.count.cmp(&a.count)));
    let policies = policies
        .into_iter()
        .map(|(policy, acc)| {
            let (status, evidence, failing, reason) = if acc.monitored {
                let evidence = combine(&acc.statuses, now, clean_for);
                let v = verdict(&evidence, acc.recent_would_deny, clean_for);
                let status = if v.ready {
                    PolicyStatus::ReadyToPromote
                } else {
                    PolicyStatus::NotReady
                };
                (status, Some(evidence), v.failing, v.reason)
            } else {
                let reason = "not monitored: only deny events name it".to_owned();
                (PolicyStatus::Enforced, None, Vec::new(), reason)
            };
            PolicyRow {
                policy,
                kind: acc.kind,
                would_deny: acc.would_deny,
                deny: acc.deny,
                last_would_deny: acc.last_would_deny,
                last_seen: acc.last_seen,
                status,
                evidence,
                failing,
                reason,
            }
        })
        .collect();
    Report {
        now,
        clean_for_seconds: clean_for.as_secs(),
        flows,
        policies,
    }
}

fn port_text(port: Option<u16>, protocol: &str) -> String {
    match port {
        Some(p) => format!("{p}/{protocol}"),
        None => protocol.to_owned(),
    }
}

fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[c]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

impl Report {
    /// Human-readable tables: policies first (the decision), then the evidence.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Policies (as of {}, clean window {}s):",
            self.now, self.clean_for_seconds
        );
        if self.policies.is_empty() {
            out.push_str("  (no events)\n");
        } else {
            let mut rows = vec![vec![
                "POLICY".to_owned(),
                "WOULD-DENY".to_owned(),
                "DENY".to_owned(),
                "LAST WOULD-DENY".to_owned(),
                "STATUS".to_owned(),
                "REASON".to_owned(),
            ]];
            for p in &self.policies {
                rows.push(vec![
                    p.policy.clone(),
                    p.would_deny.to_string(),
                    p.deny.to_string(),
                    p.last_would_deny
                        .map_or_else(|| "-".to_owned(), |t| t.to_string()),
                    p.status.as_str().to_owned(),
                    p.reason.clone(),
                ]);
            }
            out.push_str(&table(&rows));
        }
        out.push('\n');
        out.push_str("Flows:\n");
        if self.flows.is_empty() {
            out.push_str("  (none)\n");
        } else {
            let mut rows = vec![vec![
                "POLICY".to_owned(),
                "ACTION".to_owned(),
                "SOURCE".to_owned(),
                "DESTINATION".to_owned(),
                "PORT".to_owned(),
                "COUNT".to_owned(),
                "FIRST SEEN".to_owned(),
                "LAST SEEN".to_owned(),
            ]];
            for f in &self.flows {
                rows.push(vec![
                    f.policy.clone(),
                    f.action.as_str().to_owned(),
                    f.source.clone(),
                    f.destination.clone(),
                    port_text(f.port, &f.protocol),
                    f.count.to_string(),
                    f.first_seen.to_string(),
                    f.last_seen.to_string(),
                ]);
            }
            out.push_str(&table(&rows));
        }
        out
    }

    /// The report as pretty JSON.
    pub fn render_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Cause;

    #[test]
    fn workload_heuristic() {
        assert_eq!(workload_name("web-7d4b9c-xk2p9"), "web");
        assert_eq!(workload_name("web-api-5f8c7b9d4-xk2p9"), "web-api");
        assert_eq!(workload_name("db-0"), "db");
        assert_eq!(workload_name("kafka-broker-12"), "kafka-broker");
        assert_eq!(workload_name("agent-x7k2p"), "agent");
        assert_eq!(workload_name("nginx-proxy"), "nginx-proxy");
        assert_eq!(workload_name("web"), "web");
        assert_eq!(workload_name("0"), "0");
        assert_eq!(workload_name("-0"), "-0");
        assert_eq!(workload_name("app-v2"), "app-v2");
        assert_eq!(workload_of("shop/web-7d4b9c-xk2p9"), "shop/web");
        assert_eq!(workload_of("10.0.0.1"), "10.0.0.1");
    }

    #[allow(clippy::too_many_arguments)] // a flat event literal reads best in the tables below
    fn ev(
        secs: i64,
        action: EventAction,
        direction: Direction,
        pod: &str,
        peer: Option<&str>,
        dport: u16,
        policies: &[&str],
        enforced: &[&str],
    ) -> Event {
        Event {
            time: Timestamp::from_secs(secs),
            node: "n".into(),
            action,
            direction,
            pod: pod.into(),
            interface: "eth0".into(),
            network: "default".into(),
            peer: peer.map(str::to_owned),
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            sport: Some(40000),
            dport: Some(dport),
            protocol: "TCP".into(),
            policies: policies.iter().map(|s| s.to_string()).collect(),
            enforced_policies: enforced.iter().map(|s| s.to_string()).collect(),
            cause: match action {
                EventAction::WouldDeny => Some(Cause::NewIsolation),
                EventAction::Deny => Some(Cause::Denied),
                EventAction::Observed => None,
            },
        }
    }

    #[test]
    fn aggregates_per_policy_workloads_and_port() {
        use Direction::*;
        use EventAction::*;
        let events = vec![
            // Two replicas of web refused ingress from two replicas of client on 8080.
            ev(
                100,
                WouldDeny,
                Ingress,
                "shop/web-7d4b9c-xk2p9",
                Some("shop/client-5f8c7b9d4-ccccc"),
                8080,
                &["shop/new"],
                &[],
            ),
            ev(
                300,
                WouldDeny,
                Ingress,
                "shop/web-7d4b9c-zz2p9",
                Some("shop/client-5f8c7b9d4-dddd2"),
                8080,
                &["shop/new"],
                &[],
            ),
            ev(
                200,
                WouldDeny,
                Ingress,
                "shop/web-7d4b9c-xk2p9",
                None,
                8080,
                &["shop/new"],
                &[],
            ),
            // Egress from db-0 on 5432, denied by an enforced policy; shop/new also monitors here.
            ev(
                150,
                Deny,
                Egress,
                "shop/db-0",
                Some("store/s3-0"),
                5432,
                &["shop/new"],
                &["shop/lock"],
            ),
            // Another monitored policy, quiet for a long time.
            ev(
                10,
                WouldDeny,
                Egress,
                "shop/db-1",
                None,
                53,
                &["shop/dns"],
                &[],
            ),
        ];
        let now = Timestamp::from_secs(3700);
        let r = aggregate(&events, &[], now, Duration::from_secs(3600));
        assert_eq!(r.flows.len(), 4);
        let first = &r.flows[0];
        assert_eq!(first.policy, "shop/dns");
        assert_eq!(
            (first.source.as_str(), first.destination.as_str()),
            ("shop/db", "10.0.0.2")
        );
        let web = r
            .flows
            .iter()
            .find(|f| f.policy == "shop/new" && f.source == "shop/client")
            .unwrap();
        assert_eq!(
            (web.destination.as_str(), web.port, web.count),
            ("shop/web", Some(8080), 2)
        );
        assert_eq!(
            (web.first_seen, web.last_seen),
            (Timestamp::from_secs(100), Timestamp::from_secs(300))
        );
        let unknown_peer = r.flows.iter().find(|f| f.source == "10.0.0.1").unwrap();
        assert_eq!(unknown_peer.count, 1);
        let deny = r.flows.iter().find(|f| f.action == Deny).unwrap();
        assert_eq!(
            (
                deny.policy.as_str(),
                deny.source.as_str(),
                deny.destination.as_str()
            ),
            ("shop/lock", "shop/db", "store/s3")
        );

        let pol = |name: &str| r.policies.iter().find(|p| p.policy == name).unwrap();
        assert_eq!(pol("shop/new").would_deny, 3);
        assert_eq!(pol("shop/new").deny, 0);
        assert_eq!(
            pol("shop/new").last_would_deny,
            Some(Timestamp::from_secs(300))
        );
        // Events alone are never evidence of readiness.
        assert_eq!(pol("shop/new").status, PolicyStatus::NotReady);
        assert_eq!(
            pol("shop/new").failing,
            vec![Failing::NoEvidence, Failing::WouldDeny { count: 3 }]
        );
        assert_eq!(
            pol("shop/new").reason,
            "no evidence yet; 3 would-deny in the window"
        );
        assert_eq!(
            pol("shop/dns").failing,
            vec![Failing::NoEvidence],
            "last at 10s, window from 100s"
        );
        assert_eq!(pol("shop/lock").status, PolicyStatus::Enforced);
        assert_eq!(pol("shop/lock").deny, 1);
        assert!(pol("shop/lock").failing.is_empty());
    }

    /// Admin policies (SPEC 8) are named `Kind/name` by their events and status records: their
    /// rows and flows stand beside those of a namespaced policy of the same name, each with
    /// its own verdict.
    #[test]
    fn admin_policies_have_rows_flows_and_verdicts_of_their_own() {
        use crate::status::RecordType;
        let now = Timestamp::from_secs(10_000);
        let record = |policy: &str, kind: &str, connections: u64| StatusRecord {
            time: Timestamp::from_secs(9_990),
            node: "n".into(),
            record: RecordType::Status,
            policy: policy.into(),
            kind: kind.into(),
            monitored_since: Timestamp::from_secs(1_000),
            pods: 2,
            would_deny: 0,
            nflog_dropped: 0,
            rate_limited: Some(0),
            connections: Some(connections),
        };
        let statuses = [
            record("ClusterNetworkPolicy/web", "ClusterNetworkPolicy", 40),
            record("shop/web", "NetworkPolicy", 40),
            record("AdminNetworkPolicy/guard", "AdminNetworkPolicy", 40),
        ];
        // One would-deny of the admin guard, on a secondary network; none of the others.
        let mut would_deny = ev(
            9_000,
            EventAction::WouldDeny,
            Direction::Ingress,
            "ops/mon-0",
            Some("shop/web-0"),
            8080,
            &["AdminNetworkPolicy/guard"],
            &[],
        );
        would_deny.interface = "net1".into();
        would_deny.network = "shop/storage".into();
        let monitored = [
            "shop/web".to_owned(),
            "ClusterNetworkPolicy/web".to_owned(),
            "BaselineAdminNetworkPolicy/default".to_owned(),
        ];
        let r = aggregate_with(
            &[would_deny],
            &statuses,
            &monitored,
            now,
            Duration::from_secs(3600),
        );
        let row = |name: &str| r.policies.iter().find(|p| p.policy == name).unwrap();
        assert_eq!(
            row("ClusterNetworkPolicy/web").status,
            PolicyStatus::ReadyToPromote
        );
        assert_eq!(
            row("ClusterNetworkPolicy/web").kind.as_deref(),
            Some("ClusterNetworkPolicy")
        );
        assert_eq!(row("shop/web").status, PolicyStatus::ReadyToPromote);
        assert_eq!(
            row("AdminNetworkPolicy/guard").status,
            PolicyStatus::NotReady
        );
        assert_eq!(
            row("AdminNetworkPolicy/guard").failing,
            vec![Failing::WouldDeny { count: 1 }]
        );
        assert_eq!(
            row("BaselineAdminNetworkPolicy/default").failing,
            vec![Failing::NoEvidence]
        );
        assert_eq!(r.flows.len(), 1);
        assert_eq!(
            (
                r.flows[0].policy.as_str(),
                r.flows[0].source.as_str(),
                r.flows[0].destination.as_str()
            ),
            ("AdminNetworkPolicy/guard", "shop/web", "ops/mon")
        );
        let text = r.render_text();
        assert!(
            text.contains("ClusterNetworkPolicy/web") && text.contains("AdminNetworkPolicy/guard"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&r.render_json()).unwrap();
        assert_eq!(json["flows"][0]["policy"], "AdminNetworkPolicy/guard");
        let statuses: Vec<(&str, &str)> = json["policies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["policy"].as_str().unwrap(), p["status"].as_str().unwrap()))
            .collect();
        assert_eq!(
            statuses,
            [
                ("AdminNetworkPolicy/guard", "not-ready"),
                ("BaselineAdminNetworkPolicy/default", "not-ready"),
                ("ClusterNetworkPolicy/web", "ready-to-promote"),
                ("shop/web", "ready-to-promote"),
            ]
        );
    }

    #[test]
    fn quiet_monitored_policies_are_listed() {
        // The defect this module once had: an empty events file called a monitored policy
        // ready to promote.
        let r = aggregate_with(
            &[],
            &[],
            &["a/quiet".to_owned()],
            Timestamp::from_secs(10),
            Duration::from_secs(5),
        );
        assert_eq!(r.policies.len(), 1);
        assert_eq!(r.policies[0].status, PolicyStatus::NotReady);
        assert_eq!(r.policies[0].failing, vec![Failing::NoEvidence]);
        assert_eq!(r.policies[0].would_deny, 0);
        assert!(r.flows.is_empty());
        assert!(r.render_text().contains("not ready  no evidence yet"));
    }

    #[test]
    fn renders_text_and_json() {
        let events = vec![ev(
            100,
            EventAction::WouldDeny,
            Direction::Ingress,
            "shop/web-7d4b9c-xk2p9",
            Some("shop/client-0"),
            8080,
            &["shop/new"],
            &[],
        )];
        let r = aggregate(
            &events,
            &[],
            Timestamp::from_secs(200),
            Duration::from_secs(3600),
        );
        let text = r.render_text();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("Policies (as of 1970-01-01T00:03:20.000000Z"),
            "{text}"
        );
        assert!(lines[1].starts_with("POLICY"), "{text}");
        assert!(lines[2].starts_with("shop/new"), "{text}");
        assert!(
            lines[2].ends_with("not ready  no evidence yet; 1 would-deny in the window"),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>()
                    == [
                        "shop/new",
                        "would-deny",
                        "shop/client",
                        "shop/web",
                        "8080/TCP",
                        "1",
                        "1970-01-01T00:01:40.000000Z",
                        "1970-01-01T00:01:40.000000Z"
                    ]),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&r.render_json()).unwrap();
        assert_eq!(json["flows"][0]["source"], "shop/client");
        assert_eq!(
            json["flows"][0]["first_seen"],
            "1970-01-01T00:01:40.000000Z"
        );
        assert_eq!(json["policies"][0]["status"], "not-ready");
        assert_eq!(
            json["policies"][0]["failing"],
            serde_json::json!([{"condition": "no-evidence"}, {"condition": "would-deny", "count": 1}])
        );
        assert_eq!(json["clean_for_seconds"], 3600);
        let empty = aggregate(&[], &[], Timestamp(0), Duration::ZERO).render_text();
        assert!(empty.contains("(no events)") && empty.contains("(none)"));
    }
}
