//! netwarden-monitor: the monitor phase's userspace half (SPEC section 4).
//!
//! The verdicts are computed in the kernel; the rules log would-denies and denies to NFLOG with
//! a prefix naming only a key (`netwarden_render::logkey`). This crate:
//! - [`nflog`]: opens one NFLOG socket per pod netns ([`Collector`]) feeding one bounded queue;
//! - [`nlmsg`] / [`decode`]: parses the netlink messages and the packet headers (pure,
//!   fuzz-safe; `fuzzing`, with the feature `fuzzing`, holds the invariants the cargo-fuzz
//!   target `nflog` checks);
//! - [`event`]: turns a record plus the pod's context into an [`Event`] JSON line (SPEC 6);
//! - [`sink`]: where events and status records are written (JSON lines, memory, several);
//! - [`pipeline`]: drains the queue into events, counters and sinks;
//! - [`status`]: the agent's periodic `status` records, the stream's line type ([`Line`]) and
//!   reading a stream back;
//! - [`evidence`]: status records and events over a window → a promotion [`Verdict`];
//! - [`report`]: aggregates events into promotion evidence (`netwarden report`);
//! - [`metrics`]: Prometheus counters, and what `/metrics`, `/healthz`, `/readyz` answer;
//! - [`http`]: the HTTP server of those (hyper), proof against slow clients;
//! - [`time`]: RFC 3339 timestamps at microsecond precision, on jiff's calendar.

#![forbid(unsafe_code)]

pub mod decode;
pub mod event;
pub mod evidence;
// Fuzzing and its CI replays only (feature `fuzzing`): not compiled into the netwarden binary.
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod http;
pub mod metrics;
pub mod nflog;
pub mod nlmsg;
pub mod pipeline;
pub mod report;
pub mod sink;
pub mod status;
pub mod time;

pub use decode::{decode_packet, Family, L4Protocol, PacketInfo};
pub use event::{build_event, BadLine, Cause, Event, EventAction, PodContext, Unrecognized};
pub use evidence::{combine, verdict, Evidence, Failing, Verdict};
pub use http::{serve_metrics, serve_metrics_in, serve_metrics_on};
pub use metrics::Metrics;
pub use nflog::{
    Collector, ListenerConfig, ListenerExit, NflogError, NflogSocket, RawRecord, Received,
    DEFAULT_GROUP,
};
pub use nlmsg::{parse_netlink, parse_nflog_message, NflogRecord, NlItem, ParseError};
pub use pipeline::EventProcessor;
pub use report::{
    aggregate, aggregate_with, workload_name, workload_of, PolicyRow, PolicyStatus, Report,
};
pub use sink::{EventSink, FanoutSink, JsonLinesSink, MemorySink};
pub use status::{
    read_events, read_events_file, read_stream, read_stream_file, Line, RecordType, StatusRecord,
    Stream, TamperRecord,
};
pub use time::Timestamp;
