//! Prometheus metrics, in the text exposition format (version 0.0.4), written by hand.
//!
//! The format is a few lines per metric; a client library would add more code than it saves.
//! Counters are atomics, per-policy counters sit in a mutex-protected ordered map (updated once
//! per event, which is rate-limited in the kernel), and `render` produces deterministic output.
//! [`crate::http::serve_metrics`] answers `GET /metrics`, `/healthz` (the agent loop ticked
//! recently) and `/readyz` (its view of the objects is complete, current and applied) with
//! what [`respond`] says.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::event::{Event, EventAction};

/// Upper bounds of the sync duration histogram, in seconds.
pub const SYNC_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

#[derive(Debug, Default)]
struct Histogram {
    /// Non-cumulative counts per bucket; the last slot is +Inf.
    counts: [u64; SYNC_BUCKETS.len() + 1],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, duration: Duration) {
        let secs = duration.as_secs_f64();
        let slot = SYNC_BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(SYNC_BUCKETS.len());
        self.counts[slot] += 1;
        self.sum += secs;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, bound) in SYNC_BUCKETS.iter().enumerate() {
            cumulative += self.counts[i];
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.counts[SYNC_BUCKETS.len()];
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// Every metric the agent exports. Shared as `Arc<Metrics>`.
#[derive(Debug, Default)]
pub struct Metrics {
    would_deny: Mutex<BTreeMap<String, u64>>,
    deny: Mutex<BTreeMap<String, u64>>,
    nflog_dropped_kernel: AtomicU64,
    nflog_dropped_queue: AtomicU64,
    nflog_enobufs: AtomicU64,
    /// Kernel and queue drops per pod (`ns/name`), for the status records' evidence.
    nflog_dropped_pods: Mutex<BTreeMap<String, u64>>,
    events_unknown: AtomicU64,
    /// Tamper repairs, per pod (`ns/name`).
    tampered: Mutex<BTreeMap<String, u64>>,
    /// Live connections ended because an apply denied them (revocation), per pod.
    revoked: Mutex<BTreeMap<String, u64>>,
    syncs: AtomicU64,
    sync_errors: AtomicU64,
    sync_duration: Mutex<Histogram>,
    managed_pods: AtomicI64,
    /// Local pods per state (`programmed`, `refused`, ...): what operators alert on.
    local_pods: Mutex<BTreeMap<&'static str, usize>>,
    listeners: AtomicI64,
    /// Per watched kind: (relists after the first, errors).
    watch: Mutex<BTreeMap<String, (u64, u64)>>,
    objects: Mutex<BTreeMap<String, usize>>,
    /// Kubernetes Events on policies, per outcome (`created`, `existed`, `dropped`, `failed`).
    kube_events: Mutex<BTreeMap<&'static str, u64>>,
    event_to_apply: Mutex<Histogram>,
    health: Health,
}

/// Liveness and readiness, as the agent loop reports them.
#[derive(Debug)]
pub struct Health {
    started: Instant,
    /// Milliseconds after `started` of the last loop tick.
    last_tick_ms: AtomicU64,
    /// `None`: ready; `Some(why)`: not ready.
    not_ready: Mutex<Option<String>>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            started: Instant::now(),
            last_tick_ms: AtomicU64::new(0),
            not_ready: Mutex::new(Some("starting".into())),
        }
    }
}

impl Health {
    /// The agent loop is alive.
    pub fn tick(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_tick_ms.store(ms, Ordering::Relaxed);
    }

    pub fn since_tick(&self) -> Duration {
        let now = self.started.elapsed();
        now.saturating_sub(Duration::from_millis(
            self.last_tick_ms.load(Ordering::Relaxed),
        ))
    }

    pub fn set_ready(&self, ready: Result<(), String>) {
        *self.not_ready.lock().unwrap_or_else(|p| p.into_inner()) = ready.err();
    }

    pub fn ready(&self) -> Result<(), String> {
        match &*self.not_ready.lock().unwrap_or_else(|p| p.into_inner()) {
            None => Ok(()),
            Some(why) => Err(why.clone()),
        }
    }
}

/// How long without a loop tick before `/healthz` fails: far beyond any `--interval` a
/// sync could take, short enough for a kubelet to restart a stuck agent.
pub const STALE_AFTER: Duration = Duration::from_secs(120);

fn bump(map: &Mutex<BTreeMap<String, u64>>, key: &str, n: u64) {
    let mut m = map.lock().unwrap_or_else(|p| p.into_inner());
    match m.get_mut(key) {
        Some(v) => *v += n,
        None => {
            m.insert(key.to_owned(), n);
        }
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// Counts an emitted event: a would-deny for each monitored policy it names, a deny for each
    /// enforced policy.
    pub fn record_event(&self, event: &Event) {
        match event.action {
            EventAction::WouldDeny => {
                for p in &event.policies {
                    bump(&self.would_deny, p, 1);
                }
            }
            EventAction::Deny => {
                for p in &event.enforced_policies {
                    bump(&self.deny, p, 1);
                }
            }
            // Learn mode's flows belong to no policy.
            EventAction::Observed => {}
        }
    }

    /// Log messages the kernel could not deliver (gaps in the NFLOG sequence numbers).
    pub fn add_nflog_dropped_kernel(&self, n: u64) {
        self.nflog_dropped_kernel.fetch_add(n, Ordering::Relaxed);
    }

    /// Records dropped because the collector's queue was full.
    pub fn add_nflog_dropped_queue(&self, n: u64) {
        self.nflog_dropped_queue.fetch_add(n, Ordering::Relaxed);
    }

    /// Drops (kernel or queue) of the listener of `pod`, on top of the totals above.
    pub fn add_nflog_dropped_pod(&self, pod: &str, n: u64) {
        bump(&self.nflog_dropped_pods, pod, n);
    }

    /// Drops per pod since the start (see [`add_nflog_dropped_pod`](Self::add_nflog_dropped_pod)).
    pub fn nflog_dropped_pods(&self) -> BTreeMap<String, u64> {
        self.nflog_dropped_pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Forgets the per-pod drops of pods not in `keep` (pods gone from the node), so the map
    /// stays as large as the node's pods.
    pub fn retain_dropped_pods(&self, keep: &dyn Fn(&str) -> bool) {
        self.nflog_dropped_pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|pod, _| keep(pod));
    }

    /// `recv` failed with ENOBUFS (the socket buffer overflowed at least once).
    pub fn add_nflog_overrun(&self) {
        self.nflog_enobufs.fetch_add(1, Ordering::Relaxed);
    }

    /// One repair of `pod`'s rules, changed by someone else.
    pub fn add_tampered(&self, pod: &str) {
        *self
            .tampered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(pod.to_string())
            .or_default() += 1;
    }

    /// Tamper repairs of `pod` so far.
    pub fn tampered(&self, pod: &str) -> u64 {
        self.tampered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(pod)
            .copied()
            .unwrap_or(0)
    }

    /// `n` connections of `pod` ended because an apply denied them (revocation).
    pub fn add_revoked(&self, pod: &str, n: u64) {
        *self
            .revoked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(pod.to_string())
            .or_default() += n;
    }

    /// Connections of `pod` revoked so far.
    pub fn revoked(&self, pod: &str) -> u64 {
        self.revoked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(pod)
            .copied()
            .unwrap_or(0)
    }

    pub fn add_unknown(&self) {
        self.events_unknown.fetch_add(1, Ordering::Relaxed);
    }

    /// One reconcile pass of the agent, successful or not.
    pub fn observe_sync(&self, duration: Duration, ok: bool) {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.sync_errors.fetch_add(1, Ordering::Relaxed);
        }
        self.sync_duration
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(duration);
    }

    pub fn health(&self) -> &Health {
        &self.health
    }

    /// A watched kind's counters (totals: relists after the first list, errors).
    pub fn set_watch_counters(&self, kind: &str, restarts: u64, errors: u64) {
        self.watch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(kind.to_owned(), (restarts, errors));
    }

    /// The objects held per kind.
    pub fn set_objects(&self, counts: BTreeMap<String, usize>) {
        *self.objects.lock().unwrap_or_else(|p| p.into_inner()) = counts;
    }

    /// The Kubernetes Event publisher's counters so far, per outcome: `created` (this node
    /// wrote it), `existed` (another node had: one Event per policy cluster-wide), `dropped`
    /// (queue full), `failed` (the API refused it).
    pub fn set_kube_events(&self, outcomes: [(&'static str, u64); 4]) {
        *self.kube_events.lock().unwrap_or_else(|p| p.into_inner()) = outcomes.into();
    }

    /// Time from receiving a watch event to the end of the sync that applied it.
    pub fn observe_event_to_apply(&self, latency: Duration) {
        self.event_to_apply
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(latency);
    }

    pub fn set_managed_pods(&self, n: usize) {
        self.managed_pods
            .store(i64::try_from(n).unwrap_or(i64::MAX), Ordering::Relaxed);
    }

    /// The local pods per state, the whole map (a state with none is said as 0).
    pub fn set_local_pods(&self, counts: BTreeMap<&'static str, usize>) {
        *self.local_pods.lock().unwrap_or_else(|p| p.into_inner()) = counts;
    }

    pub(crate) fn listeners_add(&self, delta: i64) {
        self.listeners.fetch_add(delta, Ordering::Relaxed);
    }

    pub fn would_deny_count(&self, policy: &str) -> u64 {
        self.would_deny
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(policy)
            .copied()
            .unwrap_or(0)
    }

    pub fn deny_count(&self, policy: &str) -> u64 {
        self.deny
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(policy)
            .copied()
            .unwrap_or(0)
    }

    /// Kernel-side plus queue-side drops.
    pub fn nflog_dropped(&self) -> u64 {
        self.nflog_dropped_kernel.load(Ordering::Relaxed)
            + self.nflog_dropped_queue.load(Ordering::Relaxed)
    }

    pub fn nflog_overruns(&self) -> u64 {
        self.nflog_enobufs.load(Ordering::Relaxed)
    }

    pub fn unknown(&self) -> u64 {
        self.events_unknown.load(Ordering::Relaxed)
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(2048);
        let per_policy =
            |out: &mut String, name: &str, help: &str, map: &Mutex<BTreeMap<String, u64>>| {
                let _ = writeln!(out, "# HELP {name} {help}");
                let _ = writeln!(out, "# TYPE {name} counter");
                for (policy, n) in map.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                    let _ = writeln!(out, "{name}{{policy=\"{}\"}} {n}", escape_label(policy));
                }
            };
        per_policy(
            &mut out,
            "netwarden_would_deny_total",
            "Connections a monitored policy would deny (traffic passed); admin policies named Kind/name.",
            &self.would_deny,
        );
        per_policy(
            &mut out,
            "netwarden_deny_total",
            "Logged connections denied by enforced policies.",
            &self.deny,
        );
        let _ = writeln!(
            out,
            "# HELP netwarden_rules_tampered_total Repairs of a pod's rules someone else changed."
        );
        let _ = writeln!(out, "# TYPE netwarden_rules_tampered_total counter");
        for (pod, n) in self
            .tampered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "netwarden_rules_tampered_total{{pod=\"{}\"}} {n}",
                escape_label(pod)
            );
        }
        let _ = writeln!(
            out,
            "# HELP netwarden_connections_revoked_total Live connections ended because an apply denied them."
        );
        let _ = writeln!(out, "# TYPE netwarden_connections_revoked_total counter");
        for (pod, n) in self
            .revoked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "netwarden_connections_revoked_total{{pod=\"{}\"}} {n}",
                escape_label(pod)
            );
        }
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP netwarden_nflog_dropped_total Log messages lost before becoming events."
        );
        let _ = writeln!(out, "# TYPE netwarden_nflog_dropped_total counter");
        let _ = writeln!(
            out,
            "netwarden_nflog_dropped_total{{reason=\"kernel\"}} {}",
            load(&self.nflog_dropped_kernel)
        );
        let _ = writeln!(
            out,
            "netwarden_nflog_dropped_total{{reason=\"queue\"}} {}",
            load(&self.nflog_dropped_queue)
        );
        let simple = |out: &mut String, name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name} {value}");
        };
        simple(
            &mut out,
            "netwarden_nflog_overruns_total",
            "counter",
            "NFLOG socket receive buffer overflows (ENOBUFS).",
            load(&self.nflog_enobufs).to_string(),
        );
        simple(
            &mut out,
            "netwarden_events_unknown_total",
            "counter",
            "Log records with an unknown prefix or key, or no decodable packet.",
            load(&self.events_unknown).to_string(),
        );
        simple(
            &mut out,
            "netwarden_syncs_total",
            "counter",
            "Reconcile passes.",
            load(&self.syncs).to_string(),
        );
        simple(
            &mut out,
            "netwarden_sync_errors_total",
            "counter",
            "Reconcile passes that failed.",
            load(&self.sync_errors).to_string(),
        );
        self.sync_duration
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .render(
                &mut out,
                "netwarden_sync_duration_seconds",
                "Duration of reconcile passes.",
            );
        simple(
            &mut out,
            "netwarden_managed_pods",
            "gauge",
            "Pods whose netns netwarden programs.",
            self.managed_pods.load(Ordering::Relaxed).to_string(),
        );
        {
            let local = self.local_pods.lock().unwrap_or_else(|p| p.into_inner());
            if !local.is_empty() {
                let name = "netwarden_local_pods";
                let _ = writeln!(
                    out,
                    "# HELP {name} Pods of this node by state: programmed, not_selected (no \
                     policy isolates it), selected_not_programmed, waiting_for_netns, refused, \
                     locked_down (its netns cannot be attributed), host_network."
                );
                let _ = writeln!(out, "# TYPE {name} gauge");
                for (state, n) in local.iter() {
                    let _ = writeln!(out, "{name}{{state=\"{state}\"}} {n}");
                }
            }
        }
        simple(
            &mut out,
            "netwarden_nflog_listeners",
            "gauge",
            "Open NFLOG listeners (one per managed netns).",
            self.listeners.load(Ordering::Relaxed).to_string(),
        );
        let watch = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        if !watch.is_empty() {
            for (name, help, pick) in [
                (
                    "netwarden_watch_restarts_total",
                    "Full relists of a watched kind after its first list (410 Gone, lost watch).",
                    0,
                ),
                (
                    "netwarden_watch_errors_total",
                    "Errors a watcher met (each retried with backoff).",
                    1,
                ),
            ] {
                let _ = writeln!(out, "# HELP {name} {help}");
                let _ = writeln!(out, "# TYPE {name} counter");
                for (kind, counts) in watch.iter() {
                    let n = if pick == 0 { counts.0 } else { counts.1 };
                    let _ = writeln!(out, "{name}{{kind=\"{}\"}} {n}", escape_label(kind));
                }
            }
            let name = "netwarden_objects";
            let _ = writeln!(out, "# HELP {name} Objects held (reduced) per kind.");
            let _ = writeln!(out, "# TYPE {name} gauge");
            for (kind, n) in self
                .objects
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
            {
                let _ = writeln!(out, "{name}{{kind=\"{}\"}} {n}", escape_label(kind));
            }
            let events = self.kube_events.lock().unwrap_or_else(|p| p.into_inner());
            if !events.is_empty() {
                let name = "netwarden_kube_events_total";
                let _ = writeln!(
                    out,
                    "# HELP {name} Kubernetes Events on policies (invalid, selecting nothing), by \
                     outcome: created here, existed (another node wrote it), dropped, failed."
                );
                let _ = writeln!(out, "# TYPE {name} counter");
                for (outcome, n) in events.iter() {
                    let _ = writeln!(out, "{name}{{outcome=\"{outcome}\"}} {n}");
                }
            }
            self.event_to_apply
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .render(
                    &mut out,
                    "netwarden_event_to_apply_seconds",
                    "From receiving a watch event to the end of the sync that applied it.",
                );
        }
        out
    }
}

/// Escapes a label value: backslash, double quote and line feed (exposition format 0.0.4).
pub fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// What `/metrics`, `/healthz` and `/readyz` answer to `method` `path` (the query ignored):
/// status code, content type, body. The HTTP server is [`crate::http`].
pub(crate) fn respond(metrics: &Metrics, method: &str, path: &str) -> (u16, &'static str, String) {
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => (
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.render(),
        ),
        ("GET" | "HEAD", "/healthz") => {
            let quiet = metrics.health().since_tick();
            if quiet <= STALE_AFTER {
                (200, "text/plain", "ok\n".to_owned())
            } else {
                let why = format!("the agent loop has not ticked for {}s\n", quiet.as_secs());
                (503, "text/plain", why)
            }
        }
        ("GET" | "HEAD", "/readyz") => match metrics.health().ready() {
            Ok(()) => (200, "text/plain", "ready\n".to_owned()),
            Err(why) => (503, "text/plain", format!("{why}\n")),
        },
        ("GET" | "HEAD", _) => (404, "text/plain", "not found\n".to_owned()),
        _ => (405, "text/plain", "method not allowed\n".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Cause;
    use crate::http::serve_metrics_on;
    use crate::time::Timestamp;
    use netwarden_engine::Direction;
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::sync::Arc;

    fn event(action: EventAction, policies: &[&str], enforced: &[&str]) -> Event {
        Event {
            time: Timestamp(0),
            node: "n".into(),
            action,
            direction: Direction::Ingress,
            pod: "a/b".into(),
            interface: "eth0".into(),
            network: "default".into(),
            peer: None,
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            sport: Some(1),
            dport: Some(2),
            protocol: "TCP".into(),
            policies: policies.iter().map(|s| s.to_string()).collect(),
            enforced_policies: enforced.iter().map(|s| s.to_string()).collect(),
            cause: Some(Cause::NewIsolation),
        }
    }

    #[test]
    fn escaping() {
        assert_eq!(escape_label(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label("x\ny"), "x\\ny");
        assert_eq!(escape_label("ns/name"), "ns/name");
    }

    /// A monitored admin policy's would-denies are counted under the name its events and
    /// status records give it (`Kind/name`), apart from a namespaced policy of the same name.
    #[test]
    fn admin_policies_are_counted_under_their_event_name() {
        let m = Metrics::new();
        m.record_event(&event(
            EventAction::WouldDeny,
            &["shop/web", "ClusterNetworkPolicy/web"],
            &[],
        ));
        m.record_event(&event(
            EventAction::WouldDeny,
            &["ClusterNetworkPolicy/web"],
            &[],
        ));
        assert_eq!(m.would_deny_count("ClusterNetworkPolicy/web"), 2);
        assert_eq!(m.would_deny_count("shop/web"), 1);
        let text = m.render();
        assert!(
            text.lines()
                .any(|l| l == "netwarden_would_deny_total{policy=\"ClusterNetworkPolicy/web\"} 2"),
            "{text}"
        );
    }

    #[test]
    fn renders_counters_histogram_and_gauges() {
        let m = Metrics::new();
        m.record_event(&event(
            EventAction::WouldDeny,
            &["shop/new", "shop/b\"ad"],
            &["shop/old"],
        ));
        m.record_event(&event(EventAction::WouldDeny, &["shop/new"], &[]));
        m.record_event(&event(EventAction::Deny, &[], &["shop/old"]));
        m.add_nflog_dropped_kernel(3);
        m.add_nflog_dropped_queue(2);
        m.add_nflog_overrun();
        m.add_unknown();
        m.observe_sync(Duration::from_millis(3), true);
        m.observe_sync(Duration::from_secs(30), false);
        m.set_managed_pods(7);
        m.add_revoked("shop/web", 2);
        m.add_revoked("shop/web", 1);
        let text = m.render();
        let has = |line: &str| {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        };
        has("# TYPE netwarden_would_deny_total counter");
        has("# TYPE netwarden_connections_revoked_total counter");
        has("netwarden_connections_revoked_total{pod=\"shop/web\"} 3");
        has("netwarden_would_deny_total{policy=\"shop/new\"} 2");
        has("netwarden_would_deny_total{policy=\"shop/b\\\"ad\"} 1");
        has("netwarden_deny_total{policy=\"shop/old\"} 1");
        has("netwarden_nflog_dropped_total{reason=\"kernel\"} 3");
        has("netwarden_nflog_dropped_total{reason=\"queue\"} 2");
        has("netwarden_nflog_overruns_total 1");
        has("netwarden_events_unknown_total 1");
        has("netwarden_syncs_total 2");
        has("netwarden_sync_errors_total 1");
        has("# TYPE netwarden_sync_duration_seconds histogram");
        has("netwarden_sync_duration_seconds_bucket{le=\"0.001\"} 0");
        has("netwarden_sync_duration_seconds_bucket{le=\"0.005\"} 1");
        has("netwarden_sync_duration_seconds_bucket{le=\"10\"} 1");
        has("netwarden_sync_duration_seconds_bucket{le=\"+Inf\"} 2");
        has("netwarden_sync_duration_seconds_sum 30.003");
        has("netwarden_sync_duration_seconds_count 2");
        has("# TYPE netwarden_managed_pods gauge");
        has("netwarden_managed_pods 7");
        m.set_local_pods(BTreeMap::from([("programmed", 3), ("refused", 1)]));
        let text = m.render();
        assert!(text.contains("# TYPE netwarden_local_pods gauge"), "{text}");
        assert!(
            text.contains("netwarden_local_pods{state=\"refused\"} 1"),
            "{text}"
        );
        assert_eq!(m.would_deny_count("shop/new"), 2);
        assert_eq!(m.deny_count("shop/old"), 1);
        assert_eq!(m.nflog_dropped(), 5);
        // Every sample line is `name{labels} value` or `name value` with a numeric value.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
            assert!(line.starts_with("netwarden_"), "{line}");
        }
    }

    #[test]
    fn serves_over_http() {
        let m = Arc::new(Metrics::new());
        m.set_managed_pods(3);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let _server = serve_metrics_on(listener, m.clone()).unwrap();
        let get = |path: &str| {
            let mut s = TcpStream::connect(addr).unwrap();
            write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let mut resp = String::new();
            s.read_to_string(&mut resp).unwrap();
            resp
        };
        let resp = get("/metrics");
        assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
        assert!(resp.contains("Content-Type: text/plain; version=0.0.4"));
        assert!(resp.contains("\r\n\r\n# HELP"));
        assert!(resp.contains("netwarden_managed_pods 3\n"));
        assert!(get("/other").starts_with("HTTP/1.1 404"));
    }

    fn serve() -> (SocketAddr, Arc<Metrics>) {
        let m = Arc::new(Metrics::new());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        serve_metrics_on(listener, m.clone()).unwrap();
        (addr, m)
    }

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        resp
    }

    #[test]
    fn health_and_readiness() {
        let (addr, m) = serve();
        m.health().tick();
        assert!(get(addr, "/healthz").starts_with("HTTP/1.1 200"));
        let resp = get(addr, "/readyz");
        assert!(resp.starts_with("HTTP/1.1 503"), "{resp}");
        assert!(resp.ends_with("starting\n"), "{resp}");
        m.health().set_ready(Ok(()));
        assert!(get(addr, "/readyz").starts_with("HTTP/1.1 200"));
        m.health()
            .set_ready(Err("API not reachable: Pod: connection refused".into()));
        let resp = get(addr, "/readyz");
        assert!(
            resp.contains("503") && resp.contains("connection refused"),
            "{resp}"
        );
    }

    #[test]
    fn watch_metrics_appear_once_recorded() {
        let m = Metrics::new();
        assert!(!m.render().contains("netwarden_watch_restarts_total"));
        m.set_watch_counters("Pod", 2, 5);
        m.set_objects(BTreeMap::from([("Pod".to_string(), 7)]));
        m.observe_event_to_apply(Duration::from_millis(3));
        let text = m.render();
        assert!(
            text.contains("netwarden_watch_restarts_total{kind=\"Pod\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("netwarden_watch_errors_total{kind=\"Pod\"} 5\n"));
        assert!(text.contains("netwarden_objects{kind=\"Pod\"} 7\n"));
        assert!(!text.contains("netwarden_kube_events_total"));
        m.set_kube_events([
            ("created", 1),
            ("existed", 2),
            ("dropped", 0),
            ("failed", 3),
        ]);
        let text = m.render();
        assert!(text.contains("netwarden_kube_events_total{outcome=\"existed\"} 2\n"));
        assert!(text.contains("netwarden_kube_events_total{outcome=\"failed\"} 3\n"));
        assert!(text.contains("netwarden_event_to_apply_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(text.contains("netwarden_event_to_apply_seconds_count 1\n"));
    }

    /// Defect: one client at a time; a client that connects and sends nothing held the only
    /// thread until its 5 s read timeout, and every probe behind it waited.
    #[test]
    fn a_slow_client_does_not_stall_the_others() {
        let (addr, m) = serve();
        m.health().tick();
        let slow: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let start = Instant::now();
        for _ in 0..5 {
            assert!(get(addr, "/healthz").starts_with("HTTP/1.1 200"));
        }
        let took = start.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "5 probes behind 3 silent clients took {took:?}"
        );
        drop(slow);
    }
}
