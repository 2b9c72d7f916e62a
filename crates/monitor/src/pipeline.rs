//! From queued log records to counted, emitted events.
//!
//! The consumer side of the [`Collector`](crate::Collector) queue: each record is turned into an
//! event with the pod context it was collected under and a peer resolver over the agent's
//! current state, counted in [`Metrics`], and written to the sink. Records that are not ours
//! (unknown prefix or key) are only counted.

use std::net::IpAddr;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use netwarden_engine::PodKey;

use crate::event::{build_event, Event};
use crate::metrics::Metrics;
use crate::nflog::RawRecord;
use crate::sink::EventSink;

/// Turns records into events, counts them and emits them.
pub struct EventProcessor {
    metrics: Arc<Metrics>,
    sink: Arc<dyn EventSink>,
}

impl EventProcessor {
    pub fn new(metrics: Arc<Metrics>, sink: Arc<dyn EventSink>) -> EventProcessor {
        EventProcessor { metrics, sink }
    }

    /// Handles one record; returns the event when it was one of ours.
    pub fn handle(
        &self,
        raw: &RawRecord,
        resolve: &dyn Fn(IpAddr) -> Option<PodKey>,
    ) -> Option<Event> {
        match build_event(&raw.record, raw.received, &raw.context, resolve) {
            Ok(event) => {
                self.metrics.record_event(&event);
                if let Err(e) = self.sink.emit(&event) {
                    tracing::warn!("cannot write event: {e}");
                }
                Some(event)
            }
            Err(why) => {
                self.metrics.add_unknown();
                tracing::debug!(netns = %raw.netns.display(), "log record ignored: {why}");
                None
            }
        }
    }

    /// Handles records until none arrives for `idle`, or `max_wait` has passed, or the queue is
    /// closed. Returns the number of events emitted.
    pub fn drain(
        &self,
        rx: &Receiver<RawRecord>,
        resolve: &dyn Fn(IpAddr) -> Option<PodKey>,
        idle: Duration,
        max_wait: Duration,
    ) -> usize {
        let deadline = Instant::now() + max_wait;
        let mut emitted = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return emitted;
            }
            match rx.recv_timeout(idle.min(left)) {
                Ok(raw) => emitted += usize::from(self.handle(&raw, resolve).is_some()),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return emitted,
            }
        }
    }

    /// Handles records until the queue is closed (every sender dropped): the agent's consumer
    /// thread body.
    pub fn run(&self, rx: &Receiver<RawRecord>, resolve: &dyn Fn(IpAddr) -> Option<PodKey>) {
        for raw in rx {
            self.handle(&raw, resolve);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::tests::{record, rules};
    use crate::event::PodContext;
    use crate::sink::MemorySink;
    use crate::time::Timestamp;
    use netwarden_engine::Direction;
    use netwarden_render::{log_key_for, log_prefix, LogAction};
    use std::path::Path;

    #[test]
    fn records_become_counted_events() {
        let r = rules();
        let ctx = Arc::new(PodContext::new("node-a", &r));
        let metrics = Arc::new(Metrics::new());
        let sink = MemorySink::new();
        let proc = EventProcessor::new(metrics.clone(), Arc::new(sink.clone()));
        let key = log_key_for(&r, "eth0", Direction::Ingress).unwrap();
        let raw = |prefix: &str| RawRecord {
            netns: Arc::from(Path::new("/run/netns/x")),
            context: ctx.clone(),
            received: Timestamp(0),
            record: record(prefix, "10.0.0.9", "10.0.0.2", 80),
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(8);
        tx.send(raw(&log_prefix(LogAction::WouldDeny, key)))
            .unwrap();
        tx.send(raw("something else")).unwrap();
        tx.send(raw(&log_prefix(LogAction::WouldDeny, key)))
            .unwrap();
        drop(tx);
        let n = proc.drain(
            &rx,
            &|_| None,
            Duration::from_millis(50),
            Duration::from_secs(5),
        );
        assert_eq!(n, 2);
        assert_eq!(sink.events().len(), 2);
        assert_eq!(metrics.would_deny_count("shop/new-web"), 2);
        assert_eq!(metrics.unknown(), 1);
    }
}
