//! Observed flows: event streams reduced to the distinct flows between workloads and
//! addresses, each with its count and first/last time seen.
//!
//! Streams are read line by line and each event is folded into a map keyed by the flow, so
//! memory grows with the number of distinct flows, never with the number of events (learn
//! mode logs a flow once per window; a week of windows is still one entry).
//!
//! The flows to allow are the `observed` events (learn mode) and the `would-deny` ones (a
//! monitored policy would cut them: the user wants them kept). `deny` events are what an
//! enforced policy refuses on purpose, and are not turned into allows. Lines that are not
//! events (another record type such as `"record": "status"`, a line cut by a crash) are counted
//! and skipped: one bad line must not hide a week of evidence.
//!
//! Besides the flows, the reader notes which (workload, direction, network) **logged**: learn
//! mode watches a pod's every interface, so a workload that logged in a direction had its
//! traffic in that direction observed, and only such directions are isolated by a suggestion.

use std::collections::{BTreeSet, HashMap};
use std::io::{self, BufRead};
use std::net::IpAddr;

use netwarden_engine::{Direction, NetworkId, PodKey, Protocol};
use netwarden_monitor::{Event, EventAction, Timestamp};

use super::workloads::{WorkloadId, Workloads};

/// One end of a flow: a workload of the cluster state, or an address that is no pod's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum End {
    Workload(WorkloadId),
    Address(IpAddr),
}

/// A distinct flow: who connected to whom, on which network, protocol and destination port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Flow {
    pub network: NetworkId,
    pub src: End,
    pub dst: End,
    pub protocol: Protocol,
    pub port: u16,
}

/// How often a flow was logged, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub count: u64,
    pub first: Timestamp,
    pub last: Timestamp,
}

impl Seen {
    fn at(time: Timestamp) -> Seen {
        Seen {
            count: 1,
            first: time,
            last: time,
        }
    }

    fn add(&mut self, time: Timestamp) {
        self.count += 1;
        self.first = self.first.min(time);
        self.last = self.last.max(time);
    }
}

/// Why events were not turned into flows (each counted, none fatal).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Lines that are not events (other record types, unparsable lines).
    pub not_events: u64,
    /// The first such line, `file:line: reason`, for the one warning.
    pub first_not_event: Option<String>,
    /// `deny` events: refused on purpose by an enforced policy.
    pub denied: u64,
    /// Events of pods the cluster state does not know (gone, or host-network), or on an
    /// interface the pod does not have.
    pub unknown_pod: u64,
    /// ICMP and other protocols, or no destination port: no policy port can name them.
    pub no_port: u64,
}

/// Everything read from the event streams.
#[derive(Debug, Clone, Default)]
pub struct Observations {
    pub flows: HashMap<Flow, Seen>,
    /// (workload, direction, network) that logged at least one flow.
    pub watched: BTreeSet<(WorkloadId, Direction, NetworkId)>,
    pub events: u64,
    pub skipped: Skipped,
}

impl Observations {
    /// Reads one stream of JSON lines (`source` names it in the warning).
    pub fn read(
        &mut self,
        workloads: &Workloads,
        source: &str,
        mut reader: impl BufRead,
    ) -> io::Result<()> {
        let mut line = String::new();
        let mut number = 0usize;
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            number += 1;
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Event>(&line) {
                Ok(event) => self.add(workloads, &event),
                Err(e) => {
                    self.skipped.not_events += 1;
                    self.skipped
                        .first_not_event
                        .get_or_insert_with(|| format!("{source}:{number}: {e}"));
                }
            }
        }
    }

    /// Folds one event in.
    pub fn add(&mut self, workloads: &Workloads, event: &Event) {
        self.events += 1;
        match event.action {
            EventAction::Observed | EventAction::WouldDeny => {}
            EventAction::Deny => {
                self.skipped.denied += 1;
                return;
            }
        }
        let Some((own, network)) = own_end(workloads, event) else {
            self.skipped.unknown_pod += 1;
            return;
        };
        let (Some(protocol), Some(port)) = (Protocol::parse(&event.protocol), event.dport) else {
            self.skipped.no_port += 1;
            return;
        };
        let peer_ip = event.peer_addr();
        let peer = workloads
            .at_address(network, peer_ip)
            .map_or(End::Address(peer_ip), End::Workload);
        let (src, dst) = match event.direction {
            Direction::Ingress => (peer, End::Workload(own)),
            Direction::Egress => (End::Workload(own), peer),
        };
        self.watched.insert((own, event.direction, network.clone()));
        let flow = Flow {
            network: network.clone(),
            src,
            dst,
            protocol,
            port,
        };
        self.flows
            .entry(flow)
            .and_modify(|s| s.add(event.time))
            .or_insert_with(|| Seen::at(event.time));
    }

    /// The flows, sorted.
    pub fn sorted_flows(&self) -> Vec<(&Flow, &Seen)> {
        let mut flows: Vec<_> = self.flows.iter().collect();
        flows.sort_by(|a, b| a.0.cmp(b.0));
        flows
    }
}

/// The workload of the pod that logged `event`, and the network of the interface it logged
/// on.
fn own_end<'w>(workloads: &'w Workloads, event: &Event) -> Option<(WorkloadId, &'w NetworkId)> {
    let (namespace, name) = event.pod.split_once('/')?;
    let pod = PodKey::new(namespace, name);
    let id = workloads.of_pod(&pod)?;
    let network = workloads.network_of(&pod, &event.interface)?;
    Some((id, network))
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::testing::pod;

    pub fn event(
        action: EventAction,
        pod: &str,
        direction: Direction,
        src: &str,
        dst: &str,
    ) -> Event {
        Event {
            time: Timestamp::from_secs(1_700_000_000),
            node: "n".into(),
            action,
            direction,
            pod: pod.into(),
            interface: "eth0".into(),
            network: "default".into(),
            peer: None,
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            sport: Some(40000),
            dport: Some(80),
            protocol: "TCP".into(),
            policies: vec![],
            enforced_policies: vec![],
            cause: None,
        }
    }

    #[test]
    fn lines_fold_into_distinct_flows_and_the_rest_is_counted() {
        let pods = [
            pod("x", "a-0", &[("app", "a")], &["10.0.0.1"]),
            pod("x", "a-1", &[("app", "a")], &["10.0.0.2"]),
            pod("x", "b-0", &[("app", "b")], &["10.0.0.3"]),
        ];
        let w = Workloads::new(&pods);
        let mut lines = String::new();
        // The same workload-level flow from two replicas, seen from both ends.
        for (p, d, s, t) in [
            ("x/a-0", Direction::Egress, "10.0.0.1", "10.0.0.3"),
            ("x/a-1", Direction::Egress, "10.0.0.2", "10.0.0.3"),
            ("x/b-0", Direction::Ingress, "10.0.0.1", "10.0.0.3"),
        ] {
            lines += &event(EventAction::Observed, p, d, s, t).to_json_line();
            lines.push('\n');
        }
        lines += &event(
            EventAction::Deny,
            "x/b-0",
            Direction::Ingress,
            "10.0.0.1",
            "10.0.0.3",
        )
        .to_json_line();
        lines += "\n{\"record\": \"status\", \"node\": \"n\"}\n\nnot json\n";
        let mut outside = event(
            EventAction::WouldDeny,
            "x/a-0",
            Direction::Egress,
            "10.0.0.1",
            "192.0.2.7",
        );
        outside.time = Timestamp::from_secs(1_700_000_100);
        lines += &outside.to_json_line();
        lines.push('\n');
        lines += &event(
            EventAction::Observed,
            "x/gone",
            Direction::Egress,
            "10.0.0.9",
            "10.0.0.3",
        )
        .to_json_line();
        lines.push('\n');

        let mut obs = Observations::default();
        obs.read(&w, "events.jsonl", lines.as_bytes()).unwrap();
        let a = w.of_pod(&PodKey::new("x", "a-0")).unwrap();
        let b = w.of_pod(&PodKey::new("x", "b-0")).unwrap();
        let flows = obs.sorted_flows();
        assert_eq!(flows.len(), 2, "{flows:?}");
        assert_eq!(
            flows[0].0,
            &Flow {
                network: NetworkId::Primary,
                src: End::Workload(a),
                dst: End::Workload(b),
                protocol: Protocol::Tcp,
                port: 80
            }
        );
        assert_eq!(flows[0].1.count, 3);
        assert_eq!(flows[1].0.dst, End::Address("192.0.2.7".parse().unwrap()));
        assert_eq!(flows[1].1.last, Timestamp::from_secs(1_700_000_100));
        assert_eq!(obs.events, 6);
        assert_eq!(obs.skipped.not_events, 2);
        assert!(obs
            .skipped
            .first_not_event
            .as_deref()
            .unwrap()
            .starts_with("events.jsonl:5: "));
        assert_eq!(obs.skipped.denied, 1);
        assert_eq!(obs.skipped.unknown_pod, 1);
        assert!(obs
            .watched
            .contains(&(a, Direction::Egress, NetworkId::Primary)));
        assert!(obs
            .watched
            .contains(&(b, Direction::Ingress, NetworkId::Primary)));
        assert!(!obs
            .watched
            .contains(&(b, Direction::Egress, NetworkId::Primary)));
    }
}
