//! What the watchers report about themselves: whether each kind has been listed in full once,
//! whether the API answers now, and counters for metrics. Pure state, updated by the watch
//! tasks and read by the agent loop (readiness, `/metrics`).
//!
//! Readiness (issue 8, item 4) is "every watched kind listed in full at least once, and no
//! watcher failing now": an optional kind whose CRD is absent counts as done once discovery
//! has said so, a kind still being discovered does not.

use std::collections::BTreeMap;

/// Where one kind's watch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KindState {
    /// An optional kind whose first discovery has not answered yet.
    Discovering,
    /// An optional kind the cluster does not serve (its CRD is not installed).
    Absent,
    /// Watched at this version.
    Watching { version: &'static str },
}

/// One kind's status and counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindStatus {
    pub state: KindState,
    /// The watch reached `InitDone` (a full list) at least once.
    pub listed_once: bool,
    /// The last thing the watcher yielded was an error (API unreachable, 403, ...).
    pub failing: Option<String>,
    /// Full lists after the first one: relists after 410 Gone or a lost watch.
    pub restarts: u64,
    /// Errors the watcher yielded (each is retried with backoff).
    pub errors: u64,
    /// An optional kind watched that discovery stopped listing: its last objects are kept
    /// (enforced) until it is served again or the grace period ends.
    pub unserved: Option<Unserved>,
}

/// Since when a watched kind has not been served. Fixed while it lasts, so that the
/// readiness reason built from it does not change from one tick to the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unserved {
    /// `group/version` the kind was watched at.
    pub api_version: String,
    /// RFC 3339, UTC.
    pub since: String,
}

/// The status of every watched kind, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchStatus {
    pub kinds: BTreeMap<&'static str, KindStatus>,
}

impl WatchStatus {
    pub fn track(&mut self, kind: &'static str, state: KindState) {
        self.kinds.insert(
            kind,
            KindStatus {
                state,
                listed_once: false,
                failing: None,
                restarts: 0,
                errors: 0,
                unserved: None,
            },
        );
    }

    fn get(&mut self, kind: &'static str) -> &mut KindStatus {
        self.kinds.entry(kind).or_insert(KindStatus {
            state: KindState::Discovering,
            listed_once: false,
            failing: None,
            restarts: 0,
            errors: 0,
            unserved: None,
        })
    }

    pub fn set_state(&mut self, kind: &'static str, state: KindState) {
        self.get(kind).state = state;
    }

    /// A list starts (`Init`): after the first, it is a restart.
    pub fn list_started(&mut self, kind: &'static str) {
        let k = self.get(kind);
        if k.listed_once {
            k.restarts += 1;
        }
        k.failing = None;
    }

    /// `InitDone`.
    pub fn list_done(&mut self, kind: &'static str) {
        let k = self.get(kind);
        k.listed_once = true;
        k.failing = None;
        k.unserved = None;
    }

    /// Any event, or a watch request the API server accepted: the API answers for this kind.
    pub fn progressed(&mut self, kind: &'static str) {
        let k = self.get(kind);
        k.failing = None;
        k.unserved = None;
    }

    /// Discovery stopped listing a watched kind (first noticed at `since`); kept if already
    /// set, so the time is that of the first answer.
    pub fn unserved(&mut self, kind: &'static str, api_version: String, since: String) {
        self.get(kind)
            .unserved
            .get_or_insert(Unserved { api_version, since });
    }

    /// Discovery lists the kind again (its watch may still have to recover).
    pub fn served_again(&mut self, kind: &'static str) {
        self.get(kind).unserved = None;
    }

    /// An optional kind is no longer served (its CRD was deleted while watched): absent, and
    /// its watch's errors are no reason to be unready any more.
    pub fn gone(&mut self, kind: &'static str) {
        let k = self.get(kind);
        k.state = KindState::Absent;
        k.failing = None;
        k.listed_once = false;
        k.unserved = None;
    }

    pub fn failed(&mut self, kind: &'static str, error: String) {
        let k = self.get(kind);
        k.errors += 1;
        k.failing = Some(error);
    }

    /// Every kind is settled: listed once, or known to be absent.
    pub fn synced_once(&self) -> bool {
        !self.kinds.is_empty()
            && self.kinds.values().all(|k| match k.state {
                KindState::Discovering => false,
                KindState::Absent => true,
                KindState::Watching { .. } => k.listed_once,
            })
    }

    /// Why the cluster view is not trustworthy now (`None`: it is).
    pub fn not_ready_reason(&self) -> Option<String> {
        let waiting: Vec<&str> = self
            .kinds
            .iter()
            .filter(|(_, k)| match k.state {
                KindState::Discovering => true,
                KindState::Absent => false,
                KindState::Watching { .. } => !k.listed_once,
            })
            .map(|(kind, _)| *kind)
            .collect();
        if !waiting.is_empty() || self.kinds.is_empty() {
            return Some(format!("not listed yet: {}", waiting.join(", ")));
        }
        // A kind not served says so rather than its watch's errors: that text is the same for
        // as long as the condition holds (one "not ready" line in the log, not one per error).
        let unserved: Vec<String> = self
            .kinds
            .iter()
            .filter_map(|(kind, k)| {
                k.unserved.as_ref().map(|u| {
                    format!(
                        "{kind}: {} not served since {}; keeping last state",
                        u.api_version, u.since
                    )
                })
            })
            .collect();
        let failing: Vec<String> = self
            .kinds
            .iter()
            .filter(|(_, k)| k.unserved.is_none())
            .filter_map(|(kind, k)| k.failing.as_ref().map(|e| format!("{kind}: {e}")))
            .collect();
        let mut why = unserved;
        if !failing.is_empty() {
            why.push(format!("API not reachable: {}", failing.join("; ")));
        }
        (!why.is_empty()).then(|| why.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> WatchStatus {
        let mut s = WatchStatus::default();
        s.track("Pod", KindState::Watching { version: "v1" });
        s.track("DanmEp", KindState::Discovering);
        s
    }

    #[test]
    fn ready_after_every_kind_is_listed_or_absent() {
        let mut s = status();
        assert!(!s.synced_once());
        assert!(s.not_ready_reason().unwrap().contains("DanmEp, Pod"));
        s.list_started("Pod");
        s.list_done("Pod");
        assert!(!s.synced_once(), "DanmEp is still being discovered");
        s.set_state("DanmEp", KindState::Absent);
        assert!(s.synced_once());
        assert_eq!(s.not_ready_reason(), None);
    }

    #[test]
    fn errors_make_it_not_ready_until_the_watch_progresses() {
        let mut s = status();
        s.set_state("DanmEp", KindState::Absent);
        s.list_started("Pod");
        s.list_done("Pod");
        s.failed("Pod", "connection refused".into());
        assert!(s.synced_once(), "listed once stays true");
        let reason = s.not_ready_reason().unwrap();
        assert!(reason.contains("Pod: connection refused"), "{reason}");
        // The watcher relists (410 Gone or a new connection): a restart, and healthy again.
        s.list_started("Pod");
        assert_eq!(s.kinds["Pod"].restarts, 1);
        assert_eq!(s.kinds["Pod"].errors, 1);
        assert_eq!(s.not_ready_reason(), None);
        s.failed("Pod", "timeout".into());
        s.progressed("Pod");
        assert_eq!(s.not_ready_reason(), None);
    }

    /// A kind not served names itself and the time it stopped, and that text does not change
    /// with the errors that follow; served again, it is ready again.
    #[test]
    fn an_unserved_kind_has_one_stable_reason() {
        let mut s = status();
        s.set_state("DanmEp", KindState::Watching { version: "v1" });
        for kind in ["Pod", "DanmEp"] {
            s.list_started(kind);
            s.list_done(kind);
        }
        s.unserved(
            "DanmEp",
            "danm.k8s.io/v1".into(),
            "2026-01-01T00:00:00Z".into(),
        );
        s.failed("DanmEp", "404 (1)".into());
        let reason = s.not_ready_reason().unwrap();
        assert_eq!(
            reason,
            "DanmEp: danm.k8s.io/v1 not served since 2026-01-01T00:00:00Z; keeping last state"
        );
        s.unserved(
            "DanmEp",
            "danm.k8s.io/v1".into(),
            "2026-01-01T00:00:09Z".into(),
        );
        s.failed("DanmEp", "404 (2)".into());
        assert_eq!(s.not_ready_reason().unwrap(), reason);
        s.progressed("DanmEp");
        assert_eq!(s.not_ready_reason(), None);
    }
}
