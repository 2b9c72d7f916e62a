//! `status` records: the agent's periodic statement of the evidence it holds for each monitored
//! policy, written into the same JSON-lines stream as the events.
//!
//! Events say what a monitored policy *would have refused*; they cannot say that nothing was
//! refused, nor that the policy was watched at all: an empty events file is also what a stopped
//! agent, a policy nobody applied or a lost log message leave behind. A status record closes that
//! gap: every `--status-interval` (and once at shutdown) the agent writes, per monitored policy,
//! since when it watches it, how many pods it covers, and cumulative counters since then —
//! would-deny events, NFLOG messages lost, log messages suppressed by the rate limit, and new
//! connections seen on those pods. `netwarden report` turns these into a promotion verdict.
//! The last two are counted in the kernel; a record may carry `null` for them (an agent that
//! does not count them): the verdict then fails closed.
//!
//! The counters are cumulative since `monitored_since` (like Prometheus counters), so a lost or
//! late status record loses no evidence: the window's figure is a difference of two records of
//! the same (node, `monitored_since`) episode. A new episode (agent restart, changed spec)
//! starts from zero.
//!
//! A line of the stream is one [`Line`]: an [`Event`] (no `record` field, as every stream
//! written before status records existed) or a [`StatusRecord`] (`"record": "status"`).

use std::fs::File;
use std::io::{self, BufRead};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::event::{BadLine, Event};
use crate::time::Timestamp;

/// The tag that marks a status line (`"record": "status"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RecordType {
    Status,
    /// A tamper repair ([`TamperRecord`]).
    Tamper,
}

/// A repair of a pod's rules someone else changed (SPEC 5, "Tamper repair"), written into the
/// events stream: `"record": "tamper"`, `"action": "tampered"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TamperRecord {
    pub time: Timestamp,
    pub node: String,
    pub record: RecordType,
    /// Always `tampered`.
    pub action: String,
    /// `ns/name` of the pod whose rules were changed.
    pub pod: String,
    /// `nft` or `iptables`.
    pub backend: String,
    /// What differed from the rules netwarden computed (`"chain in_0 missing"`, ...).
    pub differences: Vec<String>,
    /// Whether the computed rules are in place again.
    pub repaired: bool,
    /// Why not, when the repair failed (it is tried again).
    pub error: Option<String>,
    /// Repairs of this pod since its previous record that were not recorded one by one (a
    /// pod tampering in a loop: at most one record per pod per 10 s, like the log line).
    pub repeats: u64,
}

impl TamperRecord {
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Evidence for one monitored policy on one node, cumulative since `monitored_since`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusRecord {
    pub time: Timestamp,
    pub node: String,
    pub record: RecordType,
    /// `ns/name`, as in the events' `policies`; `Kind/name` for an admin policy (SPEC 8).
    pub policy: String,
    /// `NetworkPolicy`, `MultiNetworkPolicy`, `DanmNetworkPolicy`, or an admin kind
    /// (`ClusterNetworkPolicy`, `AdminNetworkPolicy`, `BaselineAdminNetworkPolicy`).
    pub kind: String,
    /// When this agent first saw the policy in monitor mode with its current spec.
    pub monitored_since: Timestamp,
    /// Pods on this node the policy selects (monitored directions), now.
    pub pods: u64,
    /// Would-deny events emitted naming this policy.
    pub would_deny: u64,
    /// Log messages of its pods lost between the kernel and the sink (NFLOG sequence gaps and
    /// a full collector queue).
    pub nflog_dropped: u64,
    /// Would-deny log messages of its pods the per-pod rate limit suppressed; `null` when the
    /// agent does not count them (then nothing proves no would-deny was suppressed).
    pub rate_limited: Option<u64>,
    /// New connections (conntrack NEW) in the directions it isolates, on its pods; `null` when
    /// the agent does not count them (then nothing proves the policy saw traffic).
    pub connections: Option<u64>,
}

impl StatusRecord {
    /// The record as one JSON line, without the newline.
    pub fn to_json_line(&self) -> String {
        // Strings, numbers and timestamps always serialize.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// One line of an events stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Event(Event),
    Status(StatusRecord),
    Tamper(TamperRecord),
}

impl Line {
    /// The line as JSON, without the newline.
    pub fn to_json_line(&self) -> String {
        match self {
            Line::Event(e) => e.to_json_line(),
            Line::Status(s) => s.to_json_line(),
            Line::Tamper(t) => t.to_json_line(),
        }
    }

    /// Parses one line. The `record` field decides the type, so an error names what is wrong
    /// with *that* type instead of "matched no variant".
    pub fn parse(text: &str) -> Result<Line, serde_json::Error> {
        #[derive(Deserialize)]
        struct Tag {
            record: Option<RecordType>,
        }
        match serde_json::from_str::<Tag>(text)?.record {
            None => serde_json::from_str(text).map(Line::Event),
            Some(RecordType::Status) => serde_json::from_str(text).map(Line::Status),
            Some(RecordType::Tamper) => serde_json::from_str(text).map(Line::Tamper),
        }
    }
}

/// What an events stream holds.
#[derive(Debug, Default)]
pub struct Stream {
    pub events: Vec<Event>,
    pub statuses: Vec<StatusRecord>,
    pub tampers: Vec<TamperRecord>,
    pub bad: Vec<BadLine>,
}

/// Reads a JSON-lines stream of events and status records; blank lines are skipped, bad lines
/// are returned beside the good ones so one corrupt line (a crash mid-write) hides nothing else.
pub fn read_stream(reader: impl BufRead) -> io::Result<Stream> {
    let mut stream = Stream::default();
    for (i, line) in reader.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match Line::parse(&line) {
            Ok(Line::Event(e)) => stream.events.push(e),
            Ok(Line::Status(s)) => stream.statuses.push(s),
            Ok(Line::Tamper(t)) => stream.tampers.push(t),
            Err(e) => stream.bad.push(BadLine {
                line: i + 1,
                reason: e.to_string(),
            }),
        }
    }
    Ok(stream)
}

/// [`read_stream`] on a file.
pub fn read_stream_file(path: &Path) -> io::Result<Stream> {
    read_stream(io::BufReader::new(File::open(path)?))
}

/// Reads the JSON-lines events of a file (see [`read_events`]).
pub fn read_events_file(path: &Path) -> io::Result<(Vec<Event>, Vec<BadLine>)> {
    read_events(io::BufReader::new(File::open(path)?))
}

/// Reads JSON-lines events; blank lines are skipped, bad lines are returned beside the good
/// ones so one corrupt line (a crash mid-write) does not hide the rest. Status records
/// are valid lines and skipped here; [`read_stream`] keeps them.
pub fn read_events(reader: impl BufRead) -> io::Result<(Vec<Event>, Vec<BadLine>)> {
    let stream = read_stream(reader)?;
    Ok((stream.events, stream.bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn status(node: &str, secs: i64) -> StatusRecord {
        StatusRecord {
            time: Timestamp::from_secs(secs),
            node: node.into(),
            record: RecordType::Status,
            policy: "shop/web".into(),
            kind: "NetworkPolicy".into(),
            monitored_since: Timestamp::from_secs(0),
            pods: 2,
            would_deny: 0,
            nflog_dropped: 0,
            rate_limited: Some(0),
            connections: Some(7),
        }
    }

    #[test]
    fn status_lines_have_the_contract_fields_and_read_back() {
        let s = status("node-a", 60);
        let json: serde_json::Value = serde_json::from_str(&s.to_json_line()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "time": "1970-01-01T00:01:00.000000Z",
                "node": "node-a",
                "record": "status",
                "policy": "shop/web",
                "kind": "NetworkPolicy",
                "monitored_since": "1970-01-01T00:00:00.000000Z",
                "pods": 2,
                "would_deny": 0,
                "nflog_dropped": 0,
                "rate_limited": 0,
                "connections": 7,
            })
        );
        assert_eq!(Line::parse(&s.to_json_line()).unwrap(), Line::Status(s));
    }

    #[test]
    fn mixed_streams_and_old_streams_parse() {
        let s = status("node-a", 60);
        let event = r#"{"time":"1970-01-01T00:00:30.000000Z","node":"node-a","action":"would-deny","direction":"ingress","pod":"shop/web-0","interface":"eth0","network":"default","peer":null,"src":"10.0.0.9","dst":"10.0.0.2","sport":4000,"dport":80,"protocol":"TCP","policies":["shop/web"],"enforced_policies":[],"cause":"new-isolation"}"#;
        let text = format!(
            "{event}\n\n{}\n{{\"record\":\"status\",\"node\":\"x\"}}\n{{\"record\":\"other\"}}\n",
            s.to_json_line()
        );
        let stream = read_stream(text.as_bytes()).unwrap();
        assert_eq!(stream.events.len(), 1);
        assert_eq!(stream.statuses, vec![s]);
        let bad: Vec<(usize, &str)> = stream
            .bad
            .iter()
            .map(|b| (b.line, b.reason.as_str()))
            .collect();
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert_eq!(bad[0].0, 4);
        assert!(bad[0].1.contains("missing field"), "{bad:?}");
        assert_eq!(bad[1].0, 5);
        assert!(bad[1].1.contains("unknown variant"), "{bad:?}");
        // A stream written before status records existed reads as before.
        let old = read_stream(event.as_bytes()).unwrap();
        assert_eq!(
            (old.events.len(), old.statuses.len(), old.bad.len()),
            (1, 0, 0)
        );
    }
}
