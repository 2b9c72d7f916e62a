//! Kubernetes Events on policies that are invalid or select no pod, published once per policy
//! cluster-wide although every node's agent sees the same problem.
//!
//! ```text
//!  agent loop ──offer(wanted)──▶ EventLedger (what this node already queued)
//!                                   │ new ones only
//!                                   ▼ try_send (bounded; full ⇒ dropped, counted)
//!                               publisher task ──create Event "<name>" (rate-limited)──▶ API
//!                                                 409 AlreadyExists ⇒ another node won: done
//! ```
//!
//! **Once per cluster**: every agent derives the same Event name from (policy uid — or
//! kind/namespace/name when the uid is unknown —, generation, reason) with
//! [`event_name`]. The first node's `create` wins; every other node gets 409 AlreadyExists
//! and does nothing. kube-runtime's `Recorder` cannot do this: it names each Event itself
//! (object name plus a timestamp) and, on repeats, patches a series on its own Event, so N
//! nodes would write N Events. So the publisher uses `Api<Event>::create` with the fixed name.
//!
//! **Re-emitted only when the generation or the reason changes**: both are in the name, so the
//! same problem at the same generation always maps to the same Event (a node restarting, or a
//! problem going away and back, gets 409), while an edit of the policy (a new generation) that
//! keeps the problem gets one new Event.
//!
//! **Never blocks the sync loop**: [`EventPublisher::offer`] only queues; the network calls
//! happen on the watchers' runtime, at most one per [`PUBLISH_SPACING`].

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};
use netwarden_manifest::ClusterKey;
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// The `reportingController` of every Event the agent writes.
pub const REPORTING_CONTROLLER: &str = "netwarden.io/agent";
/// How many Events may wait to be written; more are dropped (and counted).
pub const QUEUE_CAPACITY: usize = 256;
/// The least time between two Event writes of one agent (at most 10 per second).
pub const PUBLISH_SPACING: Duration = Duration::from_millis(100);
/// The API server rejects a `note` longer than this (bytes).
const NOTE_MAX: usize = 1024;
/// Room kept for the policy name inside the Event name (the rest: reason and hash).
const NAME_PREFIX_MAX: usize = 200;

/// Why an Event is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventReason {
    /// The policy has a load problem of severity error (it is ignored or partly ignored).
    InvalidPolicy,
    /// The policy selects no pod anywhere in the cluster.
    SelectsNoPods,
    /// On a Pod: someone changed the rules netwarden programmed into its netns, and they were
    /// put back (tamper repair, SPEC 5). Written by the pod's node only, at most once per pod
    /// per the agent's report period ([`EventPublisher::send`]).
    RulesTampered,
}

impl EventReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EventReason::InvalidPolicy => "InvalidPolicy",
            EventReason::SelectsNoPods => "SelectsNoPods",
            EventReason::RulesTampered => "RulesTampered",
        }
    }
}

impl fmt::Display for EventReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The identity of a watched policy object, kept beside its reduced form (which has no uid or
/// generation) so Events can name and reference it; for [`EventReason::RulesTampered`], a Pod
/// (its `generation` then numbers the reports, so each is an Event of its own).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyObject {
    pub key: ClusterKey,
    pub api_version: String,
    /// `metadata.uid` (empty if the object had none).
    pub uid: String,
    /// `metadata.generation` (0 if absent).
    pub generation: i64,
}

impl PolicyObject {
    /// The identity of an object as the API serves it (`apiVersion`, `kind`, `metadata`).
    pub fn of(object: &serde_json::Value) -> PolicyObject {
        let meta = object.get("metadata");
        let text = |v: Option<&serde_json::Value>| {
            v.and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        PolicyObject {
            key: ClusterKey::of(object),
            api_version: text(object.get("apiVersion")),
            uid: text(meta.and_then(|m| m.get("uid"))),
            generation: meta
                .and_then(|m| m.get("generation"))
                .and_then(serde_json::Value::as_i64)
                .unwrap_or(0),
        }
    }
}

/// One Event the agent wants to exist.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PolicyEvent {
    pub policy: PolicyObject,
    pub reason: EventReason,
    /// What is wrong, naming the field (already escaped by whoever wrote it: a problem line).
    pub note: String,
}

impl PolicyEvent {
    /// What makes two Events the same one: the name's inputs.
    fn identity(&self) -> (ClusterKey, String, i64, EventReason) {
        (
            self.policy.key.clone(),
            self.policy.uid.clone(),
            self.policy.generation,
            self.reason,
        )
    }

    pub fn name(&self) -> String {
        event_name(&self.policy, self.reason)
    }
}

/// FNV-1a, 64 bits: a hash whose value is fixed by its definition, so agents built by different
/// compilers (a rolling upgrade) still agree on a name; std's `DefaultHasher` promises no
/// stability across releases.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.iter().chain([0u8].iter()) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The name every node gives the Event of `reason` on `policy` (see the module docs): a valid
/// DNS subdomain of at most 253 characters, `<name>.<reason>.<hash>`, where `<name>` is the
/// policy's name cut to lowercase alphanumerics and `-` (for the reader only: the hash of
/// uid — or kind/namespace/name —, generation and reason is what makes it unique).
pub fn event_name(policy: &PolicyObject, reason: EventReason) -> String {
    let identity = if policy.uid.is_empty() {
        format!(
            "{}/{}/{}",
            policy.key.kind, policy.key.namespace, policy.key.name
        )
    } else {
        policy.uid.clone()
    };
    let hash = fnv1a(&[
        identity.as_bytes(),
        policy.generation.to_string().as_bytes(),
        reason.as_str().as_bytes(),
    ]);
    let mut prefix = String::new();
    for c in policy.key.name.chars() {
        let c = c.to_ascii_lowercase();
        let c = if c.is_ascii_alphanumeric() { c } else { '-' };
        if !(c == '-' && (prefix.is_empty() || prefix.ends_with('-'))) {
            prefix.push(c);
        }
        if prefix.len() >= NAME_PREFIX_MAX {
            break;
        }
    }
    let prefix = prefix.trim_end_matches('-');
    let prefix = if prefix.is_empty() { "policy" } else { prefix };
    format!(
        "{prefix}.{}.{hash:016x}",
        reason.as_str().to_ascii_lowercase()
    )
}

/// `note` cut to what the API accepts, at a character boundary.
fn bounded_note(note: &str) -> String {
    if note.len() <= NOTE_MAX {
        return note.to_string();
    }
    let mut end = NOTE_MAX - 3;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &note[..end])
}

/// What this node has queued already: only the Events wanted now are remembered (bounded by the
/// number of current problems).
#[derive(Debug, Default)]
pub struct EventLedger {
    queued: BTreeSet<(ClusterKey, String, i64, EventReason)>,
}

impl EventLedger {
    /// Of `wanted`, those not queued yet; forgets what is no longer wanted.
    pub fn news(&mut self, wanted: &[PolicyEvent]) -> Vec<PolicyEvent> {
        let now: BTreeSet<_> = wanted.iter().map(PolicyEvent::identity).collect();
        self.queued.retain(|id| now.contains(id));
        wanted
            .iter()
            .filter(|e| !self.queued.contains(&e.identity()))
            .cloned()
            .collect()
    }

    pub fn mark_queued(&mut self, event: &PolicyEvent) {
        self.queued.insert(event.identity());
    }

    /// The write failed (not 409): the next offer tries again.
    pub fn forget(&mut self, event: &PolicyEvent) {
        self.queued.remove(&event.identity());
    }
}

/// Counters of the publisher.
#[derive(Debug, Default)]
pub struct EventCounters {
    pub created: AtomicU64,
    /// Another node had written it (409 AlreadyExists).
    pub existed: AtomicU64,
    /// Dropped because the queue was full.
    pub dropped: AtomicU64,
    pub failed: AtomicU64,
}

impl EventCounters {
    /// Every counter, named by outcome (as `/metrics` labels them).
    pub fn snapshot(&self) -> [(&'static str, u64); 4] {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("created", n(&self.created)),
            ("existed", n(&self.existed)),
            ("dropped", n(&self.dropped)),
            ("failed", n(&self.failed)),
        ]
    }
}

/// Queues Events for a background task that writes them; see the module docs.
pub struct EventPublisher {
    tx: mpsc::Sender<PolicyEvent>,
    ledger: Arc<Mutex<EventLedger>>,
    counters: Arc<EventCounters>,
}

impl EventPublisher {
    /// Spawns the writer on `runtime`; `reporting_instance` is this node's name.
    pub fn start(
        runtime: &tokio::runtime::Handle,
        client: Client,
        reporting_instance: String,
    ) -> EventPublisher {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let ledger = Arc::new(Mutex::new(EventLedger::default()));
        let counters = Arc::new(EventCounters::default());
        runtime.spawn(publish(
            client,
            reporting_instance,
            rx,
            ledger.clone(),
            counters.clone(),
        ));
        EventPublisher {
            tx,
            ledger,
            counters,
        }
    }

    /// Queues the Events of `wanted` this node has not queued yet (the whole current set is
    /// passed each time; see [`EventLedger::news`]). Never waits: a full queue drops the
    /// Event (counted) and the next offer tries again. Returns how many were queued.
    pub fn offer(&self, wanted: &[PolicyEvent]) -> usize {
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        let mut queued = 0;
        for event in ledger.news(wanted) {
            match self.tx.try_send(event.clone()) {
                Ok(()) => {
                    ledger.mark_queued(&event);
                    queued += 1;
                }
                Err(_) => {
                    self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        queued
    }

    /// Queues one Event that is not part of a wanted set (a report of something that
    /// happened, e.g. [`EventReason::RulesTampered`]): no ledger, the caller rate-limits it.
    /// Never waits: a full queue drops it (counted). Whether it was queued.
    pub fn send(&self, event: PolicyEvent) -> bool {
        let queued = self.tx.try_send(event).is_ok();
        if !queued {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
        queued
    }

    pub fn counters(&self) -> &EventCounters {
        &self.counters
    }
}

/// Where the Events about a cluster-scoped object go (as `kubectl describe` looks for them).
const CLUSTER_SCOPED_EVENTS_NAMESPACE: &str = "default";

/// The namespace the Event about `policy` is written in: the policy's own, `default` for a
/// cluster-scoped one (an admin policy, SPEC 8).
fn event_namespace(policy: &PolicyObject) -> &str {
    match policy.key.namespace.as_str() {
        "" => CLUSTER_SCOPED_EVENTS_NAMESPACE,
        namespace => namespace,
    }
}

/// The Event object written for `event`.
fn event_object(event: &PolicyEvent, reporting_instance: &str) -> Event {
    let policy = &event.policy;
    Event {
        metadata: ObjectMeta {
            name: Some(event.name()),
            namespace: Some(event_namespace(policy).to_string()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        type_: Some("Warning".into()),
        reason: Some(event.reason.as_str().into()),
        action: Some(
            match event.reason {
                EventReason::RulesTampered => "Repair",
                _ => "Enforce",
            }
            .into(),
        ),
        note: Some(bounded_note(&event.note)),
        reporting_controller: Some(REPORTING_CONTROLLER.into()),
        reporting_instance: Some(reporting_instance.into()),
        regarding: Some(ObjectReference {
            api_version: Some(policy.api_version.clone()),
            kind: Some(policy.key.kind.clone()),
            namespace: (!policy.key.namespace.is_empty()).then(|| policy.key.namespace.clone()),
            name: Some(policy.key.name.clone()),
            uid: (!policy.uid.is_empty()).then(|| policy.uid.clone()),
            ..ObjectReference::default()
        }),
        ..Event::default()
    }
}

async fn publish(
    client: Client,
    reporting_instance: String,
    mut rx: mpsc::Receiver<PolicyEvent>,
    ledger: Arc<Mutex<EventLedger>>,
    counters: Arc<EventCounters>,
) {
    while let Some(event) = rx.recv().await {
        let api: Api<Event> = Api::namespaced(client.clone(), event_namespace(&event.policy));
        let object = event_object(&event, &reporting_instance);
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => {
                counters.created.fetch_add(1, Ordering::Relaxed);
                debug!("{}: Event {} written", event.policy.key, event.reason);
            }
            // Another node wrote this very Event first: it is there once, as wanted.
            Err(kube::Error::Api(status)) if status.code == 409 => {
                counters.existed.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                counters.failed.fetch_add(1, Ordering::Relaxed);
                warn!(
                    "{}: cannot write Event {}: {e} (retried at the next change)",
                    event.policy.key, event.reason
                );
                ledger
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .forget(&event);
            }
        }
        tokio::time::sleep(PUBLISH_SPACING).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: &str, uid: &str, generation: i64) -> PolicyObject {
        PolicyObject {
            key: ClusterKey::new("NetworkPolicy", "ns", name),
            api_version: "networking.k8s.io/v1".into(),
            uid: uid.into(),
            generation,
        }
    }

    /// A DNS subdomain (RFC 1123): ≤ 253 characters, labels of lowercase alphanumerics and
    /// `-`, starting and ending alphanumeric.
    fn is_dns_subdomain(s: &str) -> bool {
        s.len() <= 253
            && s.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    #[test]
    fn event_names_are_stable_and_valid() {
        let p = policy("web-in", "0b6c1f1e-aaaa", 3);
        let name = event_name(&p, EventReason::InvalidPolicy);
        // Fixed by FNV-1a's definition: every node (and every build) computes this.
        assert_eq!(name, event_name(&p.clone(), EventReason::InvalidPolicy));
        assert!(name.starts_with("web-in.invalidpolicy."), "{name}");
        assert!(is_dns_subdomain(&name), "{name}");
        // Each input changes the name.
        assert_ne!(name, event_name(&p, EventReason::SelectsNoPods));
        assert_ne!(
            name,
            event_name(
                &policy("web-in", "0b6c1f1e-aaaa", 4),
                EventReason::InvalidPolicy
            )
        );
        assert_ne!(
            name,
            event_name(&policy("web-in", "other", 3), EventReason::InvalidPolicy)
        );
        // Without a uid, kind/namespace/name identify the policy.
        let a = event_name(&policy("x", "", 1), EventReason::SelectsNoPods);
        let mut other_ns = policy("x", "", 1);
        other_ns.key.namespace = "ns2".into();
        assert_ne!(a, event_name(&other_ns, EventReason::SelectsNoPods));
    }

    #[test]
    fn hostile_or_long_policy_names_still_give_valid_names() {
        let long = "a".repeat(253);
        for name in [
            "",
            "-",
            "..",
            "UPPER.case",
            "a\"b;+\n{x}",
            "ünï-cödé",
            "-x-",
            long.as_str(),
            "a.b..c-",
        ] {
            let got = event_name(&policy(name, "u", 1), EventReason::InvalidPolicy);
            assert!(is_dns_subdomain(&got), "{name:?} → {got:?}");
            assert!(!got.contains('"') && !got.contains('\n'), "{got:?}");
        }
        assert_eq!(
            event_name(&policy("", "u", 1), EventReason::InvalidPolicy)
                .split('.')
                .next(),
            Some("policy")
        );
    }

    #[test]
    fn the_hash_is_the_published_fnv1a() {
        // Test vectors of FNV-1a 64 ("" and "a"), before our 0 separator.
        let raw = |s: &[u8]| {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for b in s {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
            h
        };
        assert_eq!(raw(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(raw(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(&[b"a"]), raw(b"a\0"));
    }

    fn event(name: &str, generation: i64, reason: EventReason) -> PolicyEvent {
        PolicyEvent {
            policy: policy(name, "u", generation),
            reason,
            note: "spec.podSelector: selects no pod".into(),
        }
    }

    #[test]
    fn the_ledger_queues_only_changes_of_generation_or_reason() {
        let mut ledger = EventLedger::default();
        let first = vec![event("a", 1, EventReason::InvalidPolicy)];
        let news = ledger.news(&first);
        assert_eq!(news, first);
        ledger.mark_queued(&news[0]);
        assert!(ledger.news(&first).is_empty(), "same generation and reason");
        let bumped = vec![event("a", 2, EventReason::InvalidPolicy)];
        assert_eq!(ledger.news(&bumped), bumped);
        let other = vec![event("a", 1, EventReason::SelectsNoPods)];
        assert_eq!(ledger.news(&other), other);
        // A failed write is forgotten and offered again.
        ledger.mark_queued(&other[0]);
        ledger.forget(&other[0]);
        assert_eq!(ledger.news(&other), other);
    }

    #[test]
    fn notes_are_bounded_at_a_character_boundary() {
        let note = "é".repeat(1000);
        let cut = bounded_note(&note);
        assert!(cut.len() <= NOTE_MAX && cut.ends_with("..."));
        assert_eq!(bounded_note("short"), "short");
    }

    #[test]
    fn the_event_references_the_policy() {
        let e = event("web-in", 7, EventReason::SelectsNoPods);
        let object = event_object(&e, "node-1");
        assert_eq!(object.metadata.name.as_deref(), Some(e.name().as_str()));
        assert_eq!(object.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(object.type_.as_deref(), Some("Warning"));
        assert_eq!(object.reason.as_deref(), Some("SelectsNoPods"));
        assert_eq!(object.reporting_instance.as_deref(), Some("node-1"));
        let regarding = object.regarding.unwrap();
        assert_eq!(regarding.kind.as_deref(), Some("NetworkPolicy"));
        assert_eq!(regarding.name.as_deref(), Some("web-in"));
        assert_eq!(regarding.uid.as_deref(), Some("u"));
    }

    /// An admin policy is cluster-scoped: its Events go to `default` (where `kubectl
    /// describe` looks for a cluster-scoped object's), regarding it without a namespace.
    #[test]
    fn a_cluster_scoped_policy_has_its_events_in_default() {
        let e = PolicyEvent {
            policy: PolicyObject {
                key: ClusterKey::new("AdminNetworkPolicy", "", "deny-all"),
                api_version: "policy.networking.k8s.io/v1alpha1".into(),
                uid: "u".into(),
                generation: 2,
            },
            reason: EventReason::InvalidPolicy,
            note: "spec.ingress[0].from: fails closed".into(),
        };
        let object = event_object(&e, "node-1");
        assert_eq!(object.metadata.namespace.as_deref(), Some("default"));
        let regarding = object.regarding.unwrap();
        assert_eq!(regarding.kind.as_deref(), Some("AdminNetworkPolicy"));
        assert_eq!(regarding.namespace, None);
        assert_eq!(regarding.name.as_deref(), Some("deny-all"));
    }
}
