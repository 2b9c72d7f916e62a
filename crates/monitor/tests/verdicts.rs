//! Promotion verdicts from recorded event streams (`tests/streams/*.jsonl`, JSON lines as the
//! agent writes them: events and status records mixed): one stream per evidence condition,
//! and multi-node streams whose evidence combines. Every stream is judged as of
//! 2026-01-01T12:00:00Z with a one-hour window.

use std::path::Path;
use std::time::Duration;

use netwarden_monitor::{aggregate, read_stream_file, Failing, PolicyStatus, Timestamp};

fn judge(stream: &str) -> netwarden_monitor::PolicyRow {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/streams")
        .join(stream);
    let read = read_stream_file(&path).unwrap();
    assert!(read.bad.is_empty(), "{stream}: {:?}", read.bad);
    let now = Timestamp::parse_rfc3339("2026-01-01T12:00:00Z").unwrap();
    let report = aggregate(&read.events, &read.statuses, now, Duration::from_secs(3600));
    let rows: Vec<_> = report
        .policies
        .into_iter()
        .filter(|p| p.policy == "shop/web")
        .collect();
    assert_eq!(rows.len(), 1, "{stream}");
    rows.into_iter().next().unwrap()
}

/// (stream, the failing conditions, the reason people read).
const CASES: &[(&str, &str)] = &[
    (
        "ready.jsonl",
        "monitored for 3h on 1 node(s), 70 connection(s), no would-deny, no events lost",
    ),
    ("no-evidence.jsonl", "no evidence yet"),
    ("too-short.jsonl", "monitored for only 12m of 1h"),
    ("no-traffic.jsonl", "no traffic on its pods"),
    ("would-deny.jsonl", "3 would-deny in the window"),
    (
        "dropped.jsonl",
        "events were dropped (2 NFLOG, 0 rate-limited)",
    ),
    (
        "rate-limited.jsonl",
        "1 would-deny in the window; events were dropped (0 NFLOG, 40 rate-limited)",
    ),
    (
        "not-counted.jsonl",
        "connections not counted by the agent (null in its status records)",
    ),
    (
        "multi-node-ready.jsonl",
        "monitored for 2h 30m on 2 node(s), 40 connection(s), no would-deny, no events lost",
    ),
    (
        "multi-node-not-ready.jsonl",
        "monitored for only 20m of 1h; 1 would-deny in the window",
    ),
];

#[test]
fn each_condition_has_its_verdict_and_reason() {
    for (stream, reason) in CASES {
        let row = judge(stream);
        assert_eq!(row.reason, *reason, "{stream}");
        let ready = stream.contains("ready") && !stream.contains("not-ready");
        assert_eq!(
            row.status == PolicyStatus::ReadyToPromote,
            ready,
            "{stream}: {row:?}"
        );
        assert_eq!(row.failing.is_empty(), ready, "{stream}");
    }
}

#[test]
fn typed_conditions_and_combined_evidence() {
    assert_eq!(
        judge("no-evidence.jsonl").failing,
        vec![Failing::NoEvidence]
    );
    assert_eq!(
        judge("too-short.jsonl").failing,
        vec![Failing::MonitoredTooShort {
            monitored_seconds: 720,
            required_seconds: 3600
        }]
    );
    assert_eq!(
        judge("dropped.jsonl").failing,
        vec![Failing::EventsLost {
            nflog_dropped: 2,
            rate_limited: 0
        }]
    );
    let multi = judge("multi-node-ready.jsonl");
    let ev = multi.evidence.unwrap();
    assert_eq!(ev.nodes, ["node-a", "node-b"]);
    assert_eq!((ev.pods, ev.connections), (4, Some(40)));
    assert_eq!(multi.kind.as_deref(), Some("NetworkPolicy"));
    // The would-deny of node-b is seen both as an event and in its status counter: counted once.
    let not_ready = judge("multi-node-not-ready.jsonl");
    assert_eq!(not_ready.would_deny, 1);
    assert!(not_ready.failing.contains(&Failing::WouldDeny { count: 1 }));
}

#[test]
fn json_and_table_carry_verdict_and_reason() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/streams/too-short.jsonl");
    let read = read_stream_file(&path).unwrap();
    let now = Timestamp::parse_rfc3339("2026-01-01T12:00:00Z").unwrap();
    let report = aggregate(&read.events, &read.statuses, now, Duration::from_secs(3600));
    let json: serde_json::Value = serde_json::from_str(&report.render_json()).unwrap();
    let row = &json["policies"][0];
    assert_eq!(row["status"], "not-ready");
    assert_eq!(row["reason"], "monitored for only 12m of 1h");
    assert_eq!(
        row["failing"],
        serde_json::json!([{"condition": "monitored-too-short", "monitored_seconds": 720, "required_seconds": 3600}])
    );
    assert_eq!(row["evidence"]["connections"], 30);
    let text = report.render_text();
    let line = text.lines().find(|l| l.starts_with("shop/web")).unwrap();
    assert!(
        line.ends_with("not ready  monitored for only 12m of 1h"),
        "{text}"
    );
}
