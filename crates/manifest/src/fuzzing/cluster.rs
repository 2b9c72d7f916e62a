//! Invariants of [`ClusterSet`] (the agent's reduction of watched objects) on arbitrary
//! histories: [`check_cluster`] decodes bytes into a [`History`] of watch events — upserts of
//! objects of the watched kinds (Namespace, Pod, NetworkPolicy, MultiNetworkPolicy,
//! DanmNetworkPolicy, DanmEp, Service, EndpointSlice) built from plausible templates with
//! fields replaced by odd values, and of other or near-miss kinds; deletes; relists of a kind —
//! applies them one at a time and checks after each step:
//!
//! - nothing panics;
//! - `upsert` returning `false` leaves the inventory as it was; `remove` returns whether the
//!   object was held; `retain_kind` returns exactly the held objects of the kind the relist
//!   does not have;
//! - `counts()` and `len()` agree with the objects a model of the watch says are held;
//! - every problem is a bounded line (see [`super::MAX_PROBLEM_PART`]) from the `cluster`
//!   source that names its object;
//! - `overlay` without files is the inventory.
//!
//! And at the end, **incremental = fresh**: the inventory equals that of a new `ClusterSet`
//! fed, in reverse key order, only each object's final version — preceded by the version
//! whose object is held when the final one is refused, unidentifiable or a policy's
//! fail-closed form ("a rejected update keeps the last good version", the module
//! documentation of [`crate::cluster`]). Which versions are good is the model's
//! one use of the reader: each version read alone either loads an object, is refused with its
//! identity or unidentifiable (the last good version stays), is skipped (nothing of it to
//! load, and nothing kept), or is none of netwarden's kinds (the object is dropped).

use std::collections::{BTreeMap, BTreeSet};

// Reads bytes as choices; zeros past the end, so every input is a history and short inputs
// give short ones.
use netwarden_fuzzbytes::Bytes;
use serde_json::{json, Map, Value};

use crate::cluster::{ClusterKey, ClusterSet, CLUSTER_SOURCE};
use crate::read::{FileRead, Outcome};
use crate::{LoadOptions, Problem};

use super::check_problems;

/// Decodes `data` into a history of watch events and checks every invariant of the module
/// documentation; panics on a violation.
pub fn check_cluster(data: &[u8]) {
    let history = History::from_bytes(data);
    let mut set = ClusterSet::new(history.opts.clone());
    let mut model = Model::default();
    for (step, op) in history.ops.iter().enumerate() {
        let before = set.inventory();
        match op {
            Op::Upsert(object) => {
                let changed = set.upsert(object);
                model.upsert(object);
                if !changed {
                    assert_eq!(
                        set.inventory(),
                        before,
                        "step {step}: upsert said nothing changed, but the inventory did: {object}"
                    );
                }
            }
            Op::Remove(key) => {
                let held = model.held.remove(key).is_some();
                assert_eq!(
                    set.remove(&key.kind, &key.namespace, &key.name),
                    held,
                    "step {step}: remove {key}"
                );
            }
            Op::Retain(kind, present) => {
                let gone: Vec<ClusterKey> = model
                    .held
                    .keys()
                    .filter(|k| k.kind == *kind && !present.contains(*k))
                    .cloned()
                    .collect();
                for key in &gone {
                    model.held.remove(key);
                }
                assert_eq!(
                    set.retain_kind(kind, present),
                    gone,
                    "step {step}: relist of {kind}"
                );
            }
        }
        check_held(&set, &model, step);
    }
    let inventory = set.inventory();
    check_cluster_problems(&inventory.problems);
    assert_eq!(
        set.overlay(&[]),
        inventory,
        "overlay without files differs from the inventory"
    );
    // A version refused (or only readable in its fail-closed form) after a good one changes
    // nothing but the problems.
    for state in model.held.values() {
        let Some(good) = state.good().filter(|g| **g != state.last) else {
            continue;
        };
        let mut kept = ClusterSet::new(history.opts.clone());
        kept.upsert(good);
        let mut only_good = kept.inventory();
        kept.upsert(&state.last);
        let mut after = kept.inventory();
        only_good.problems.clear();
        after.problems.clear();
        assert_eq!(
            after, only_good,
            "a refused version {} did not keep the last good one {good}",
            state.last
        );
    }
    let mut fresh = ClusterSet::new(history.opts.clone());
    for (key, state) in model.held.iter().rev() {
        if let Some((version, _)) = &state.object {
            fresh.upsert(version);
        }
        assert_eq!(&ClusterKey::of(&state.last), key);
        fresh.upsert(&state.last);
    }
    assert_eq!(
        fresh.inventory(),
        inventory,
        "incremental differs from fresh after {:#?}",
        history.ops
    );
}

fn check_held(set: &ClusterSet, model: &Model, step: usize) {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for key in model.held.keys() {
        *counts.entry(key.kind.clone()).or_insert(0) += 1;
    }
    assert_eq!(set.counts(), counts, "step {step}: counts");
    assert_eq!(set.len(), model.held.len(), "step {step}: len");
    assert_eq!(set.is_empty(), model.held.is_empty());
}

/// Problems of objects read from the cluster: bounded lines, each naming its object.
fn check_cluster_problems(problems: &[Problem]) {
    check_problems(problems);
    for p in problems {
        assert_eq!(p.file, CLUSTER_SOURCE, "{p:?}");
        assert!(
            !p.object.trim().is_empty(),
            "a problem that does not name its object: {p:?}"
        );
    }
}

// ----- the model ----------------------------------------------------------------------------

/// What the watch has delivered about one object that is held.
#[derive(Debug)]
struct Held {
    /// The version whose object the set holds now, and whether it is a good one (not only
    /// a policy's fail-closed form): what a later refused version keeps.
    object: Option<(Value, bool)>,
    last: Value,
}

impl Held {
    /// The good version held, if any.
    fn good(&self) -> Option<&Value> {
        self.object
            .as_ref()
            .filter(|(_, good)| *good)
            .map(|(v, _)| v)
    }
}

#[derive(Debug, Default)]
struct Model {
    held: BTreeMap<ClusterKey, Held>,
}

/// What a version does to what is held, read alone.
enum Reading {
    /// An object loaded: the new good version.
    Loaded,
    /// A policy that cannot be read, loaded in its fail-closed form: a good version held
    /// stays, else this one is held.
    FailClosed,
    /// Refused with its identity: the good version held stays, else nothing is.
    Refused,
    /// Not identifiable, or not parsed: whatever is held stays.
    Keeps,
    /// Nothing to load, nothing wrong with that: held, with no object.
    Skipped,
    /// Not a kind netwarden reads: dropped.
    Nothing,
}

fn reading(object: &Value) -> Reading {
    let key = ClusterKey::of(object);
    let mut read = FileRead {
        documents: 1,
        ..FileRead::default()
    };
    read.add_value(CLUSTER_SOURCE, &key.to_string(), object);
    if read.entries.is_empty() && read.file_problems.is_empty() {
        return Reading::Nothing;
    }
    let outcomes = || read.entries.iter().map(|e| &e.outcome);
    let unidentified = outcomes().any(|o| matches!(o, Outcome::Unidentified));
    if !read.parsed_cleanly() || unidentified {
        return Reading::Keeps;
    }
    for outcome in outcomes() {
        match outcome {
            Outcome::Loaded(object) if object.fail_closed => return Reading::FailClosed,
            Outcome::Loaded(_) => return Reading::Loaded,
            _ => {}
        }
    }
    if outcomes().any(|o| matches!(o, Outcome::Rejected(_))) {
        Reading::Refused
    } else {
        Reading::Skipped
    }
}

impl Model {
    fn upsert(&mut self, version: &Value) {
        let key = ClusterKey::of(version);
        let last = version.clone();
        let before = self.held.remove(&key).and_then(|h| h.object);
        let good_before = before.clone().filter(|(_, good)| *good);
        let object = match reading(version) {
            Reading::Nothing => return,
            Reading::Loaded => Some((last.clone(), true)),
            Reading::FailClosed => good_before.or(Some((last.clone(), false))),
            Reading::Refused => good_before,
            Reading::Keeps => before,
            Reading::Skipped => None,
        };
        self.held.insert(key, Held { object, last });
    }
}

// ----- the history, from bytes ---------------------------------------------------------------

/// One watch event.
#[derive(Debug, Clone)]
pub enum Op {
    Upsert(Value),
    Remove(ClusterKey),
    /// A relist of the kind found these objects.
    Retain(String, BTreeSet<ClusterKey>),
}

/// Watch events and the options of the set they are applied to.
#[derive(Debug, Clone)]
pub struct History {
    pub opts: LoadOptions,
    pub ops: Vec<Op>,
}

/// The kinds generated: the watched ones (twice as likely), then near misses and others.
const KINDS: &[&str] = &[
    "Namespace",
    "Pod",
    "NetworkPolicy",
    "MultiNetworkPolicy",
    "DanmNetworkPolicy",
    "DanmEp",
    "Service",
    "EndpointSlice",
    "Namespace",
    "Pod",
    "NetworkPolicy",
    "MultiNetworkPolicy",
    "DanmNetworkPolicy",
    "DanmEp",
    "Service",
    "EndpointSlice",
    "Deployment",
    "Networkpolicy",
    "ConfigMap",
    "",
];

const NAMES: &[&str] = &["a", "b", "a", "b", "c", "web-0", "A_b", "", "x.y"];
const NAMESPACES: &[&str] = &["ns", "ns", "default", "other", "", "Bad_NS"];

/// Values of the wrong type, or odd values of the right one.
const ODD: &[&str] = &[
    "null",
    "7",
    "-1",
    "65536",
    "true",
    "\"\"",
    "\"x\"",
    "\"10.0.0.0/33\"",
    "\"999.0.0.1\"",
    "\"fd00::/64\"",
    "\"eth0;drop\"",
    "\"a\\nb\"",
    "[]",
    "{}",
    "[null]",
    "[{}]",
    "{\"app\":\"db\"}",
    "1.5",
];

fn api_version(kind: &str) -> &'static str {
    match kind {
        "NetworkPolicy" => "networking.k8s.io/v1",
        "MultiNetworkPolicy" => "k8s.cni.cncf.io/v1beta1",
        "DanmNetworkPolicy" | "DanmEp" => "danm.k8s.io/v1",
        "EndpointSlice" => "discovery.k8s.io/v1",
        "Deployment" => "apps/v1",
        _ => "v1",
    }
}

/// A plausible object of `kind` (without `metadata.name`/`namespace`), `variant` choosing
/// among a few shapes.
fn template(kind: &str, variant: usize) -> Value {
    let labels = [json!({"app": "web"}), json!({"app": "db"}), json!({})][variant % 3].clone();
    match kind {
        "Namespace" => json!({"metadata": {"labels": {"team": (["a", "b"][variant % 2])}}}),
        "Pod" => json!({
            "metadata": {"labels": labels, "uid": format!("u-{}", variant % 2),
                         "resourceVersion": variant.to_string(),
                         "annotations": if variant % 4 == 3 {
                             json!({crate::NETWORK_STATUS: r#"[{"name":"ns/net1","interface":"net1","ips":["10.1.0.1"]}]"#})
                         } else {
                             json!({})
                         }},
            "spec": {"nodeName": (["n1", "n2"][variant % 2]), "hostNetwork": variant % 5 == 4,
                     "containers": [{"name": "c", "image": format!("busybox:{variant}"),
                                     "ports": [{"name": "http", "containerPort": 80}]}]},
            "status": {"podIPs": [{"ip": format!("10.0.0.{}", variant % 3 + 1)}],
                       "phase": "Running"}
        }),
        "NetworkPolicy" | "MultiNetworkPolicy" | "DanmNetworkPolicy" => {
            let mut p = json!({
                "metadata": {"annotations": {}},
                "spec": {"podSelector": {"matchLabels": labels},
                         "policyTypes": ([json!(["Ingress"]), json!(["Egress"]), json!(["Ingress", "Egress"])][variant % 3].clone()),
                         "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}},
                                               {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                                      "ports": [{"protocol": "TCP", "port": 80}]}],
                         "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": "http"}]}]}
            });
            if kind == "MultiNetworkPolicy" {
                p["metadata"]["annotations"][crate::POLICY_FOR] = json!("ns/net1");
            }
            if variant % 4 == 1 {
                p["metadata"]["annotations"][crate::MODE] = json!("monitor");
            }
            if kind == "DanmNetworkPolicy" && variant.is_multiple_of(2) {
                p["spec"]["ingress"][0]["from"][0]["networkSelector"] = json!([{"name": "n1"}]);
            }
            p
        }
        "DanmEp" => json!({"spec": {
            "NetworkName": "n1", "NetworkType": "ipvlan", "EndpointID": "x",
            "Interface": {"Name": "n1", "Address": format!("10.10.1.{}/24", variant % 3 + 1),
                          "AddressIPv6": "", "MacAddress": "02:00:00:00:00:01"},
            "Host": "n1", "Pod": (["a", "b"][variant % 2]), "apiType": "DanmNet"}}),
        "Service" => json!({"spec": {
            "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
            "selector": if variant.is_multiple_of(2) { labels } else { Value::Null },
            "ports": [{"port": 5432, "targetPort": (["http", "80"][variant % 2]), "protocol": "TCP"}]}}),
        "EndpointSlice" => json!({
            "metadata": {"labels": {crate::SERVICE_NAME_LABEL: (["a", "b"][variant % 2])}},
            "addressType": (["IPv4", "IPv6", "FQDN"][variant % 3]),
            "endpoints": [{"addresses": ["10.0.0.2"], "conditions": {"ready": variant.is_multiple_of(2)}}],
            "ports": [{"name": "", "port": 80, "protocol": "TCP"}]}),
        _ => json!({"spec": {"replicas": variant}}),
    }
}

/// Replaces one field somewhere in `value` (found by walking with the cursor) by an odd
/// value, or adds or removes one.
fn mutate(value: &mut Value, c: &mut Bytes) {
    // The field's JSON pointer, chosen on the value as it is.
    let mut pointer = String::new();
    let mut at: &Value = value;
    for _ in 0..c.below(6) {
        at = match at {
            Value::Object(m) if !m.is_empty() => {
                let (key, next) = m.iter().nth(c.below(m.len())).expect("an index below len");
                pointer.push('/');
                pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
                next
            }
            Value::Array(l) if !l.is_empty() => {
                let i = c.below(l.len());
                pointer.push_str(&format!("/{i}"));
                &l[i]
            }
            _ => break,
        };
    }
    let at = value
        .pointer_mut(&pointer)
        .expect("the pointer just walked");
    let odd: Value = serde_json::from_str(c.pick::<&str>(ODD)).expect("ODD values are JSON");
    match (c.below(4), &mut *at) {
        (0, Value::Object(m)) if !m.is_empty() => {
            let i = c.below(m.len());
            let key = m.keys().nth(i).cloned().expect("an index below len");
            m.remove(&key);
        }
        (1, Value::Object(m)) => {
            let key = *c.pick(&["name", "port", "ip", "labels", "ports", "from", "x"]);
            m.insert(key.into(), odd);
        }
        // The API server sends objects: the object itself is never replaced.
        (_, Value::Object(m)) if pointer.is_empty() => {
            m.insert("spec".into(), odd);
        }
        _ => *at = odd,
    }
}

fn object(c: &mut Bytes) -> Value {
    let kind = *c.pick(KINDS);
    let mut object = template(kind, c.below(12));
    let mut meta = match object.get("metadata") {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    match c.below(16) {
        0 => {}
        1 => {
            meta.insert("name".into(), json!(7));
        }
        _ => {
            meta.insert("name".into(), json!(c.pick(NAMES)));
        }
    }
    if kind != "Namespace" || c.below(8) == 0 {
        match c.below(12) {
            0 => {}
            _ => {
                meta.insert("namespace".into(), json!(c.pick(NAMESPACES)));
            }
        }
    }
    object["metadata"] = Value::Object(meta);
    object["apiVersion"] = json!(if c.below(16) == 0 {
        c.pick(&["v1", "networking.k8s.io/v2", "danm.k8s.io/v2", "x/v1"])
    } else {
        api_version(kind)
    });
    if !kind.is_empty() {
        object["kind"] = json!(kind);
    }
    for _ in 0..*c.pick(&[0, 0, 0, 1, 1, 2, 3]) {
        mutate(&mut object, c);
    }
    object
}

impl History {
    pub fn from_bytes(data: &[u8]) -> History {
        let c = &mut Bytes::new(data);
        let opts = LoadOptions {
            network_policy_enabled: c.below(8) != 0,
        };
        let mut ops = Vec::new();
        // Objects upserted so far: removes and relists mostly name them.
        let mut seen: Vec<ClusterKey> = Vec::new();
        while !c.done() && ops.len() < 32 {
            let op = match c.below(10) {
                0 => {
                    let key = if !seen.is_empty() && c.below(4) != 0 {
                        c.pick(&seen).clone()
                    } else {
                        ClusterKey::new(*c.pick(KINDS), *c.pick(NAMESPACES), *c.pick(NAMES))
                    };
                    Op::Remove(key)
                }
                1 => {
                    let kind = c.pick(KINDS).to_string();
                    let present = seen
                        .iter()
                        .filter(|k| k.kind == kind)
                        .filter(|_| c.below(2) == 0)
                        .cloned()
                        .collect();
                    Op::Retain(kind, present)
                }
                2 if !ops.is_empty() => {
                    // The same object again, perhaps touched: a resync, or a status update.
                    let previous = ops.iter().rev().find_map(|op| match op {
                        Op::Upsert(o) => Some(o.clone()),
                        _ => None,
                    });
                    match previous {
                        Some(mut o) => {
                            if c.below(2) == 0 {
                                mutate(&mut o, c);
                            }
                            Op::Upsert(o)
                        }
                        None => Op::Upsert(object(c)),
                    }
                }
                _ => Op::Upsert(object(c)),
            };
            if let Op::Upsert(o) = &op {
                seen.push(ClusterKey::of(o));
            }
            ops.push(op);
        }
        History { opts, ops }
    }
}
