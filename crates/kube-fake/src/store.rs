//! The objects, the global resourceVersion counter and the retained history of changes — the
//! fake's etcd plus watch cache. Synchronous and free of I/O: the server holds it behind one
//! mutex, so a write, its history entry and its delivery to every open watch happen atomically
//! (a watch that starts never misses or repeats a change).
//!
//! Every write takes the next resourceVersion (one counter for all kinds, as etcd's revision),
//! stamps it in `metadata.resourceVersion` and appends a [`Change`] to the history. A write
//! that changes nothing (same content) takes no version and sends no event, as on the real
//! server. The history is bounded (`history_limit`) and can be dropped at once
//! ([`Store::compact`]); a LIST or WATCH from a version older than what is retained fails with
//! 410 Expired. Past states for consistent pages and `resourceVersionMatch=Exact` are rebuilt by
//! undoing the retained history, so they are exact.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::resources::{ResourceType, StorageKey};
use crate::selector::Selectors;
use crate::status::ApiError;

/// `(namespace, name)`; the namespace is `""` for cluster-scoped kinds. Sorted, so that pages
/// and per-namespace lists are range scans.
pub type ObjectKey = (String, String);

type Objects = BTreeMap<ObjectKey, Arc<Value>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

impl ChangeType {
    /// The watch event type on the wire.
    pub fn wire(self) -> &'static str {
        match self {
            ChangeType::Added => "ADDED",
            ChangeType::Modified => "MODIFIED",
            ChangeType::Deleted => "DELETED",
        }
    }
}

/// One committed write.
#[derive(Debug)]
pub struct Change {
    pub rv: u64,
    pub key: StorageKey,
    pub change: ChangeType,
    /// The object after the write; for a deletion, the last state stamped with the deletion's
    /// resourceVersion (what the real server sends in DELETED).
    pub object: Arc<Value>,
    /// The object before the write (none for an addition): selectors need it to turn a
    /// modification into ADDED or DELETED for a watch whose selector it starts or stops
    /// matching, and a past state is rebuilt from it.
    pub previous: Option<Arc<Value>>,
}

struct Subscriber {
    key: StorageKey,
    tx: mpsc::UnboundedSender<Arc<Change>>,
}

/// A subscription: the retained changes after the requested version, then everything new.
pub struct Subscription {
    pub replay: Vec<Arc<Change>>,
    pub rx: mpsc::UnboundedReceiver<Arc<Change>>,
}

/// A state to start a watch from: the current objects, their version, and the changes after.
pub struct SnapshotSubscription {
    pub objects: Vec<Arc<Value>>,
    pub rv: u64,
    pub rx: mpsc::UnboundedReceiver<Arc<Change>>,
}

/// One page of a LIST.
pub struct Page {
    pub items: Vec<Arc<Value>>,
    /// The key of the last object returned when more remain (the next page starts after it).
    pub next: Option<ObjectKey>,
}

/// What a replacement does with `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusRule {
    /// The new object whole, status included (a kind without a status subresource, or a test
    /// acting as the controller).
    Whole,
    /// The main resource of a kind with a status subresource: the stored status stays.
    KeepStored,
    /// The status subresource: only the new status is taken.
    OnlyStatus,
}

/// Metadata the server sets on create: the timestamp (RFC 3339, seconds) and a source of
/// unique identifiers — passed in so that the store stays deterministic under test.
pub struct Stamp {
    pub now: String,
}

pub struct Store {
    rv: u64,
    /// Changes at or below this version are forgotten: a LIST or WATCH from an older version
    /// is 410 Expired.
    compacted: u64,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    objects: HashMap<StorageKey, Objects>,
    subscribers: Vec<Subscriber>,
    next_uid: u64,
}

fn namespaces_key() -> StorageKey {
    StorageKey {
        group: String::new(),
        plural: "namespaces".into(),
    }
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj["metadata"][field].as_str().filter(|s| !s.is_empty())
}

/// The object without `metadata` and `status`: what `metadata.generation` counts changes of.
fn spec_part(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    v
}

/// Equal except for `metadata.resourceVersion` (which the client may omit or send stale).
fn same_content(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v["metadata"].as_object_mut() {
            m.remove("resourceVersion");
        }
        v
    };
    strip(a) == strip(b)
}

/// RFC 7386 JSON merge patch: objects merge key by key, `null` removes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("made an object above");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// A suffix for `metadata.generateName`, from the real server's alphabet (no vowels, no
/// look-alike digits).
fn generated_suffix(mut n: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    // Spread consecutive numbers over the alphabet (a multiplicative hash), five characters.
    n = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..5)
        .map(|i| ALPHABET[((n >> (i * 12)) % ALPHABET.len() as u64) as usize] as char)
        .collect()
}

impl Store {
    /// An empty store; the first write gets resourceVersion 2.
    pub fn new(history_limit: usize) -> Self {
        Store {
            rv: 1,
            compacted: 1,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            objects: HashMap::new(),
            subscribers: Vec::new(),
            next_uid: 1,
        }
    }

    pub fn current_rv(&self) -> u64 {
        self.rv
    }

    /// The oldest version a LIST or WATCH may still start from.
    pub fn oldest_rv(&self) -> u64 {
        self.compacted
    }

    pub fn get(&self, key: &StorageKey, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.objects
            .get(key)?
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Every object of a storage, sorted by namespace and name.
    pub fn all(&self, key: &StorageKey) -> Vec<Arc<Value>> {
        self.objects
            .get(key)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    fn uid(&mut self) -> String {
        let n = self.next_uid;
        self.next_uid += 1;
        // A version-4-shaped UUID, unique per store; deterministic (tests compare them).
        format!("00000000-0000-4000-8000-{n:012x}")
    }

    /// Commits a write: takes the next version, stamps it, stores the object, records the
    /// change and hands it to the subscribers of that storage.
    fn commit(
        &mut self,
        key: &StorageKey,
        objkey: ObjectKey,
        change: ChangeType,
        mut object: Value,
        previous: Option<Arc<Value>>,
    ) -> Arc<Value> {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let object = Arc::new(object);
        let map = self.objects.entry(key.clone()).or_default();
        match change {
            ChangeType::Deleted => {
                map.remove(&objkey);
            }
            _ => {
                map.insert(objkey, object.clone());
            }
        }
        let entry = Arc::new(Change {
            rv: self.rv,
            key: key.clone(),
            change,
            object: object.clone(),
            previous,
        });
        self.history.push_back(entry.clone());
        while self.history.len() > self.history_limit {
            let gone = self.history.pop_front().expect("longer than the limit");
            self.compacted = gone.rv;
        }
        // A subscriber whose watch ended has dropped its receiver: forget it here.
        self.subscribers
            .retain(|s| &s.key != key || s.tx.send(entry.clone()).is_ok());
        object
    }

    /// Creates an object of `resource`. The namespace (for a namespaced kind) must be set and
    /// exist; `metadata.name` or `metadata.generateName` must be set.
    pub fn create(
        &mut self,
        resource: &ResourceType,
        mut obj: Value,
        stamp: &Stamp,
    ) -> Result<Arc<Value>, ApiError> {
        let key = resource.storage_key();
        if !obj["metadata"].is_object() {
            return Err(ApiError::invalid(
                &resource.kind,
                "",
                "metadata: Required value".into(),
            ));
        }
        let name = match (meta_str(&obj, "name"), meta_str(&obj, "generateName")) {
            (Some(n), _) => n.to_string(),
            (None, Some(prefix)) => format!("{prefix}{}", generated_suffix(self.rv + 1)),
            (None, None) => {
                return Err(ApiError::invalid(
                    &resource.kind,
                    "",
                    "metadata.name: Required value: name or generateName is required".into(),
                ))
            }
        };
        let namespace = if resource.namespaced {
            let ns = meta_str(&obj, "namespace").ok_or_else(|| {
                ApiError::invalid(
                    &resource.kind,
                    &name,
                    "metadata.namespace: Required value".into(),
                )
            })?;
            if self.get(&namespaces_key(), "", ns).is_none() {
                return Err(ApiError::not_found("", "namespaces", ns));
            }
            ns.to_string()
        } else {
            String::new()
        };
        let objkey = (namespace.clone(), name.clone());
        if self
            .objects
            .get(&key)
            .is_some_and(|m| m.contains_key(&objkey))
        {
            return Err(ApiError::already_exists(
                &resource.group,
                &resource.plural,
                &name,
            ));
        }
        obj["apiVersion"] = json!(resource.api_version());
        obj["kind"] = json!(resource.kind);
        let uid = self.uid();
        let meta = obj["metadata"].as_object_mut().expect("checked above");
        meta.insert("name".into(), json!(name));
        if resource.namespaced {
            meta.insert("namespace".into(), json!(namespace));
        } else {
            meta.remove("namespace");
        }
        meta.insert("uid".into(), json!(uid));
        meta.insert("creationTimestamp".into(), json!(stamp.now));
        meta.insert("generation".into(), json!(1));
        meta.remove("deletionTimestamp");
        Ok(self.commit(&key, objkey, ChangeType::Added, obj, None))
    }

    /// Replaces an object. `expected_rv` (an HTTP PUT's `metadata.resourceVersion`) must match
    /// the stored one when given; `rule` says what happens to `status`. Identity fields (uid, creationTimestamp) are the server's; generation
    /// counts changes outside metadata and status.
    // Integration (kube-agent branch): the workspace's clippy runs with -D warnings.
    #[allow(clippy::too_many_arguments)]
    pub fn replace(
        &mut self,
        resource: &ResourceType,
        namespace: &str,
        name: &str,
        mut obj: Value,
        expected_rv: Option<&str>,
        rule: StatusRule,
    ) -> Result<Arc<Value>, ApiError> {
        let key = resource.storage_key();
        let old = self
            .get(&key, namespace, name)
            .ok_or_else(|| ApiError::not_found(&resource.group, &resource.plural, name))?;
        if let Some(rv) = expected_rv {
            if meta_str(&old, "resourceVersion") != Some(rv) {
                return Err(ApiError::conflict(&resource.group, &resource.plural, name));
            }
        }
        if rule == StatusRule::OnlyStatus {
            let status = obj.get("status").cloned();
            obj = (*old).clone();
            match status {
                Some(s) => obj["status"] = s,
                None => {
                    obj.as_object_mut().map(|m| m.remove("status"));
                }
            }
        } else if rule == StatusRule::KeepStored {
            match old.get("status") {
                Some(s) => obj["status"] = s.clone(),
                None => {
                    obj.as_object_mut().map(|m| m.remove("status"));
                }
            }
        }
        if !obj["metadata"].is_object() {
            return Err(ApiError::invalid(
                &resource.kind,
                name,
                "metadata: Required value".into(),
            ));
        }
        obj["apiVersion"] = json!(resource.api_version());
        obj["kind"] = json!(resource.kind);
        let generation = old["metadata"]["generation"].as_i64().unwrap_or(1)
            + i64::from(spec_part(&old) != spec_part(&obj));
        let meta = obj["metadata"].as_object_mut().expect("checked above");
        meta.insert("name".into(), json!(name));
        if resource.namespaced {
            meta.insert("namespace".into(), json!(namespace));
        } else {
            meta.remove("namespace");
        }
        for field in ["uid", "creationTimestamp"] {
            match old["metadata"].get(field) {
                Some(v) => meta.insert(field.into(), v.clone()),
                None => meta.remove(field),
            };
        }
        meta.insert("generation".into(), json!(generation));
        meta.insert(
            "resourceVersion".into(),
            old["metadata"]["resourceVersion"].clone(),
        );
        if same_content(&old, &obj) {
            return Ok(old);
        }
        let objkey = (namespace.to_string(), name.to_string());
        Ok(self.commit(&key, objkey, ChangeType::Modified, obj, Some(old)))
    }

    /// Applies a JSON merge patch to a stored object (see [`Store::replace`] for the flags).
    pub fn patch(
        &mut self,
        resource: &ResourceType,
        namespace: &str,
        name: &str,
        patch: &Value,
        rule: StatusRule,
    ) -> Result<Arc<Value>, ApiError> {
        let old = self
            .get(&resource.storage_key(), namespace, name)
            .ok_or_else(|| ApiError::not_found(&resource.group, &resource.plural, name))?;
        let mut obj = (*old).clone();
        merge_patch(&mut obj, patch);
        // A patch may carry a resourceVersion as a precondition, as on the real server.
        let expected = patch["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_string);
        self.replace(resource, namespace, name, obj, expected.as_deref(), rule)
    }

    /// Deletes an object (immediately: no finalizers, no grace period). A Namespace takes
    /// every namespaced object in it along, each with its own DELETED event.
    pub fn delete(
        &mut self,
        resource: &ResourceType,
        namespace: &str,
        name: &str,
    ) -> Result<Arc<Value>, ApiError> {
        let key = resource.storage_key();
        let old = self
            .get(&key, namespace, name)
            .ok_or_else(|| ApiError::not_found(&resource.group, &resource.plural, name))?;
        if key == namespaces_key() {
            let mut inside: Vec<(StorageKey, ObjectKey)> = Vec::new();
            for (k, objects) in &self.objects {
                inside.extend(
                    objects
                        .keys()
                        .filter(|(ns, _)| ns == name)
                        .map(|ok| (k.clone(), ok.clone())),
                );
            }
            inside.sort();
            for (k, ok) in inside {
                let prev = self.objects[&k][&ok].clone();
                self.commit(&k, ok, ChangeType::Deleted, (*prev).clone(), Some(prev));
            }
        }
        let objkey = (namespace.to_string(), name.to_string());
        Ok(self.commit(&key, objkey, ChangeType::Deleted, (*old).clone(), Some(old)))
    }

    /// Forgets the history: a LIST or WATCH from any version older than the current one is
    /// now 410 Expired. Open watches go on (they already hold what they need).
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    /// Drops a storage whose last served version was uninstalled (the real server deletes a
    /// CRD's objects with it) and ends its watches.
    pub fn drop_storage(&mut self, key: &StorageKey) {
        self.objects.remove(key);
        self.subscribers.retain(|s| &s.key != key);
    }

    /// The objects of a storage as they were at version `at` (the current ones when `at` is
    /// the current version): rebuilt by undoing the retained changes after `at`.
    fn state_at(
        &self,
        key: &StorageKey,
        at: u64,
    ) -> Result<std::borrow::Cow<'_, Objects>, ApiError> {
        static EMPTY: std::sync::OnceLock<Objects> = std::sync::OnceLock::new();
        let current = self
            .objects
            .get(key)
            .unwrap_or_else(|| EMPTY.get_or_init(Objects::new));
        if at >= self.rv {
            return Ok(std::borrow::Cow::Borrowed(current));
        }
        if at < self.compacted {
            return Err(ApiError::too_old(at, self.compacted));
        }
        let mut past = current.clone();
        for ch in self.history.iter().rev().take_while(|c| c.rv > at) {
            if &ch.key != key {
                continue;
            }
            let objkey = (
                meta_str(&ch.object, "namespace").unwrap_or("").to_string(),
                meta_str(&ch.object, "name").unwrap_or("").to_string(),
            );
            match (&ch.change, &ch.previous) {
                (ChangeType::Added, _) => {
                    past.remove(&objkey);
                }
                (_, Some(prev)) => {
                    past.insert(objkey, prev.clone());
                }
                (_, None) => unreachable!("modifications and deletions record the previous object"),
            }
        }
        Ok(std::borrow::Cow::Owned(past))
    }

    /// One page of a LIST at version `at`: the objects in `namespace` (all when `None`) that
    /// match the selectors, after `start_after`, at most `limit` (all when `None`).
    pub fn page(
        &self,
        key: &StorageKey,
        at: u64,
        namespace: Option<&str>,
        selectors: &Selectors,
        start_after: Option<&ObjectKey>,
        limit: Option<usize>,
    ) -> Result<Page, ApiError> {
        let state = self.state_at(key, at)?;
        let lower = match (start_after, namespace) {
            (Some(k), _) => Bound::Excluded(k.clone()),
            (None, Some(ns)) => Bound::Included((ns.to_string(), String::new())),
            (None, None) => Bound::Unbounded,
        };
        let mut items = Vec::new();
        let mut last: Option<&ObjectKey> = None;
        for (k, obj) in state.range((lower, Bound::Unbounded)) {
            if namespace.is_some_and(|ns| k.0 != ns) {
                break;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                return Ok(Page {
                    items,
                    next: last.cloned(),
                });
            }
            last = Some(k);
            if selectors.matches(obj) {
                items.push(obj.clone());
            }
        }
        Ok(Page { items, next: None })
    }

    /// Subscribes to a storage from version `from`: the retained changes after it, then every
    /// new one. 410 Expired when changes after `from` were forgotten.
    pub fn subscribe_from(
        &mut self,
        key: &StorageKey,
        from: u64,
    ) -> Result<Subscription, ApiError> {
        if from < self.compacted {
            return Err(ApiError::too_old(from, self.compacted));
        }
        let start = self.history.partition_point(|c| c.rv <= from);
        let replay = self
            .history
            .range(start..)
            .filter(|c| &c.key == key)
            .cloned()
            .collect();
        let (tx, rx) = mpsc::unbounded_channel();
        self.subscribers.push(Subscriber {
            key: key.clone(),
            tx,
        });
        Ok(Subscription { replay, rx })
    }

    /// Subscribes to a storage from its current state (every object, then every new change).
    pub fn subscribe_now(&mut self, key: &StorageKey) -> SnapshotSubscription {
        let (tx, rx) = mpsc::unbounded_channel();
        self.subscribers.push(Subscriber {
            key: key.clone(),
            tx,
        });
        SnapshotSubscription {
            objects: self.all(key),
            rv: self.rv,
            rx,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin;

    fn kind(k: &str) -> ResourceType {
        builtin().into_iter().find(|r| r.kind == k).unwrap()
    }

    fn stamp() -> Stamp {
        Stamp {
            now: "2026-01-01T00:00:00Z".into(),
        }
    }

    fn with_namespace() -> Store {
        let mut s = Store::new(100);
        s.create(
            &kind("Namespace"),
            json!({"metadata": {"name": "a"}}),
            &stamp(),
        )
        .unwrap();
        s
    }

    fn pod(name: &str, app: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "a", "labels": {"app": app}}, "spec": {"nodeName": "n1"}})
    }

    fn rv(v: &Value) -> u64 {
        v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn writes_take_increasing_versions_and_server_metadata() {
        let mut s = with_namespace();
        let p = s.create(&kind("Pod"), pod("p", "web"), &stamp()).unwrap();
        assert_eq!(p["metadata"]["generation"], 1);
        assert_eq!(p["metadata"]["creationTimestamp"], "2026-01-01T00:00:00Z");
        assert_eq!(p["apiVersion"], "v1");
        let uid = p["metadata"]["uid"].clone();
        let mut changed = pod("p", "db");
        changed["metadata"]["uid"] = json!("forged");
        let q = s
            .replace(&kind("Pod"), "a", "p", changed, None, StatusRule::Whole)
            .unwrap();
        assert!(rv(&q) > rv(&p));
        assert_eq!(q["metadata"]["uid"], uid);
        // Labels are metadata: no new generation.
        assert_eq!(q["metadata"]["generation"], 1);
        let mut spec = pod("p", "db");
        spec["spec"]["nodeName"] = json!("n2");
        let r = s
            .replace(
                &kind("Pod"),
                "a",
                "p",
                spec.clone(),
                None,
                StatusRule::Whole,
            )
            .unwrap();
        assert_eq!(r["metadata"]["generation"], 2);
        // The same content again: no version, no event.
        let before = s.current_rv();
        let same = s
            .replace(&kind("Pod"), "a", "p", spec, None, StatusRule::Whole)
            .unwrap();
        assert_eq!((rv(&same), s.current_rv()), (rv(&r), before));
    }

    #[test]
    fn create_refuses_duplicates_missing_namespaces_and_nameless_objects() {
        let mut s = with_namespace();
        s.create(&kind("Pod"), pod("p", "web"), &stamp()).unwrap();
        assert_eq!(
            s.create(&kind("Pod"), pod("p", "web"), &stamp())
                .unwrap_err()
                .code,
            409
        );
        let mut elsewhere = pod("q", "web");
        elsewhere["metadata"]["namespace"] = json!("nowhere");
        let e = s.create(&kind("Pod"), elsewhere, &stamp()).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (404, "namespaces \"nowhere\" not found")
        );
        let e = s
            .create(
                &kind("Pod"),
                json!({"metadata": {"namespace": "a"}}),
                &stamp(),
            )
            .unwrap_err();
        assert_eq!(e.code, 422);
        assert!(e.message.contains("metadata.name"), "{e}");
        let g = s
            .create(
                &kind("Pod"),
                json!({"metadata": {"generateName": "web-", "namespace": "a"}}),
                &stamp(),
            )
            .unwrap();
        assert!(g["metadata"]["name"].as_str().unwrap().starts_with("web-"));
    }

    #[test]
    fn updates_check_the_expected_version_and_respect_status_rules() {
        let mut s = with_namespace();
        let mut p = pod("p", "web");
        p["status"] = json!({"podIP": "10.0.0.1"});
        let p = s.create(&kind("Pod"), p, &stamp()).unwrap();
        let e = s
            .replace(
                &kind("Pod"),
                "a",
                "p",
                pod("p", "x"),
                Some("1"),
                StatusRule::Whole,
            )
            .unwrap_err();
        assert_eq!((e.code, e.reason), (409, "Conflict"));
        // The main resource keeps the status; the status subresource takes only the status.
        let mut wants_status = pod("p", "db");
        wants_status["status"] = json!({"podIP": "10.9.9.9"});
        let q = s
            .replace(
                &kind("Pod"),
                "a",
                "p",
                wants_status.clone(),
                p["metadata"]["resourceVersion"].as_str(),
                StatusRule::KeepStored,
            )
            .unwrap();
        assert_eq!(
            (
                q["status"]["podIP"].as_str(),
                q["metadata"]["labels"]["app"].as_str()
            ),
            (Some("10.0.0.1"), Some("db"))
        );
        let mut only_status = pod("p", "ignored");
        only_status["status"] = json!({"podIP": "10.9.9.9"});
        let r = s
            .replace(
                &kind("Pod"),
                "a",
                "p",
                only_status,
                None,
                StatusRule::OnlyStatus,
            )
            .unwrap();
        assert_eq!(
            (
                r["status"]["podIP"].as_str(),
                r["metadata"]["labels"]["app"].as_str()
            ),
            (Some("10.9.9.9"), Some("db"))
        );
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut v = json!({"a": {"b": 1, "c": 2}, "d": [1, 2]});
        merge_patch(&mut v, &json!({"a": {"b": null, "e": 3}, "d": [3]}));
        assert_eq!(v, json!({"a": {"c": 2, "e": 3}, "d": [3]}));
    }

    #[test]
    fn pages_are_consistent_at_their_version_and_expire_with_the_history() {
        let mut s = with_namespace();
        for i in 0..5 {
            s.create(&kind("Pod"), pod(&format!("p{i}"), "web"), &stamp())
                .unwrap();
        }
        let key = kind("Pod").storage_key();
        let at = s.current_rv();
        let first = s
            .page(&key, at, None, &Selectors::default(), None, Some(2))
            .unwrap();
        assert_eq!(first.items.len(), 2);
        // Writes between pages do not show in later pages of the same list.
        s.delete(&kind("Pod"), "a", "p3").unwrap();
        s.create(&kind("Pod"), pod("p9", "web"), &stamp()).unwrap();
        let rest = s
            .page(
                &key,
                at,
                None,
                &Selectors::default(),
                first.next.as_ref(),
                None,
            )
            .unwrap();
        let names: Vec<&str> = rest
            .items
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["p2", "p3", "p4"]);
        s.compact();
        let e = s
            .page(
                &key,
                at,
                None,
                &Selectors::default(),
                first.next.as_ref(),
                None,
            )
            .err()
            .unwrap();
        assert_eq!((e.code, e.reason), (410, "Expired"));
    }

    #[test]
    fn deleting_a_namespace_deletes_what_is_in_it() {
        let mut s = with_namespace();
        s.create(&kind("Pod"), pod("p", "web"), &stamp()).unwrap();
        let mut sub = s
            .subscribe_from(&kind("Pod").storage_key(), s.current_rv())
            .unwrap();
        s.delete(&kind("Namespace"), "", "a").unwrap();
        let ch = sub.rx.try_recv().unwrap();
        assert_eq!(
            (ch.change, ch.object["metadata"]["name"].as_str()),
            (ChangeType::Deleted, Some("p"))
        );
        // The deleted object carries the deletion's version.
        assert_eq!(rv(&ch.object), ch.rv);
        assert!(s.all(&kind("Pod").storage_key()).is_empty());
    }

    #[test]
    fn subscriptions_replay_retained_history_and_refuse_forgotten_versions() {
        let mut s = with_namespace();
        let from = s.current_rv();
        s.create(&kind("Pod"), pod("p", "web"), &stamp()).unwrap();
        s.create(
            &kind("Namespace"),
            json!({"metadata": {"name": "b"}}),
            &stamp(),
        )
        .unwrap();
        let sub = s.subscribe_from(&kind("Pod").storage_key(), from).unwrap();
        assert_eq!(sub.replay.len(), 1);
        // A bounded history forgets its oldest changes.
        let mut small = Store::new(2);
        small
            .create(
                &kind("Namespace"),
                json!({"metadata": {"name": "a"}}),
                &stamp(),
            )
            .unwrap();
        let early = small.current_rv();
        for i in 0..3 {
            small
                .create(&kind("Pod"), pod(&format!("p{i}"), "web"), &stamp())
                .unwrap();
        }
        assert_eq!(
            small
                .subscribe_from(&kind("Pod").storage_key(), early)
                .err()
                .unwrap()
                .code,
            410
        );
    }
}
