//! The first pass: one file's documents, each reduced on its own to an [`Outcome`] with its
//! problems. Nothing here looks across objects (that is [`crate::assemble`]), so a file's
//! [`FileRead`] can be kept and reused as long as the file does not change
//! ([`crate::ManifestSet`]).

use std::sync::Arc;

use netwarden_engine::{AdminPolicy, Namespace, Node, Policy, Service};
use serde_json::Value;

// Re-exported: the modules above read.rs name an object's id with its outcome.
pub(crate) use crate::ctx::ObjectId;
use crate::ctx::{get, show, type_name, Ctx};
use crate::kinds::{self, ApiVersion, Resolved};
use crate::meta::{read_learn, read_meta};
use crate::pod::{self, DanmEpRecord};
use crate::service::{self, SliceRecord};
use crate::{admin, policy, validate, PodRecord, Problem, Severity};

/// Lists nest at most this deep (a List of Lists of ...): bounds recursion on hostile input.
/// A top-level document is always read ([`FileRead::add_list_item`] relies on it).
const MAX_LIST_DEPTH: usize = 8;
const _: () = assert!(MAX_LIST_DEPTH > 0);

/// One object read from a document, before the second pass.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ReadObject {
    pub id: ObjectId,
    pub file: String,
    /// How problems name it: `ns/name` or `name`.
    pub label: String,
    pub object: Object,
    /// A policy that could not be read, loaded in its fail-closed form
    /// ([`policy::fail_closed`]): a running agent keeps the last good version instead
    /// ([`crate::set::merge`]).
    pub fail_closed: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Object {
    Namespace(Namespace),
    Pod(PodRecord),
    // Boxed: the larger records would size every object (a node agent holds one per object
    // of the cluster).
    DanmEp(Box<DanmEpRecord>),
    Policy(Arc<Policy>),
    /// ClusterNetworkPolicy, AdminNetworkPolicy, BaselineAdminNetworkPolicy (SPEC 8).
    AdminPolicy(Arc<AdminPolicy>),
    Node(Box<Node>),
    Service(Box<Service>),
    Slice(Box<SliceRecord>),
}

/// What became of one object (a document, or an item of a List).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    Loaded(Box<ReadObject>),
    /// Its identity was read, but an error dropped it.
    Rejected(ObjectId),
    /// Nothing to load, and nothing wrong with that: an FQDN EndpointSlice, a switched-off
    /// kind, or an entry that only carries problems about its document (duplicate JSON keys).
    /// Another project's kind leaves no entry at all.
    Skipped,
    /// Not identifiable: not an object, no kind, a near miss of our kinds, an unreadable or
    /// invalid name or namespace.
    Unidentified,
    /// A deletion marker (annotation [`DELETE`] `"true"`): in the changes of `netwarden diff
    /// --with`, deletes this object from the base ([`crate::overlay`]); anywhere else it is
    /// ignored, with a warning.
    Delete(Box<DeleteMarker>),
}

/// A deletion marker: the object it deletes, and where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeleteMarker {
    pub id: ObjectId,
    pub file: String,
    /// How problems name it: `ns/name` or `name`.
    pub label: String,
}

/// The annotation that makes an object of `diff --with` a deletion of the base's object of the
/// same kind, namespace and name (`"true"`; `"false"` is the same as no annotation).
pub const DELETE: &str = "netwarden.io/delete";

/// One object's outcome and the problems found while reading it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    pub problems: Vec<Problem>,
    pub outcome: Outcome,
}

/// One file's first pass.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct FileRead {
    /// Problems about the file as a whole: it cannot be read, a document is not YAML or JSON.
    pub file_problems: Vec<Problem>,
    /// The documents' entries, in order.
    pub entries: Vec<Entry>,
    /// Non-empty documents found (a file of comments has none).
    pub documents: usize,
}

impl FileRead {
    /// A file that could not be read at all.
    pub fn unreadable(problem: Problem) -> Self {
        Self {
            file_problems: vec![problem],
            ..Self::default()
        }
    }

    /// Whether the text parsed without a syntax error.
    pub fn parsed_cleanly(&self) -> bool {
        self.file_problems.is_empty()
    }

    pub fn objects(&self) -> impl Iterator<Item = &ReadObject> {
        self.entries.iter().filter_map(|e| match &e.outcome {
            Outcome::Loaded(o) => Some(o.as_ref()),
            _ => None,
        })
    }

    /// Reads the non-empty document number `index` (1-based) of a file, whose duplicate keys
    /// (paths) were found while parsing it.
    pub fn add_document(
        &mut self,
        file: &str,
        index: usize,
        doc: &Value,
        duplicate_keys: &[String],
    ) {
        self.begin_document(file, index, duplicate_keys);
        self.add_value(file, &format!("#{index}"), doc);
    }

    /// Counts document `index` and reports its duplicate keys, before its entries.
    pub fn begin_document(&mut self, file: &str, index: usize, duplicate_keys: &[String]) {
        self.documents += 1;
        if let Some(entry) = duplicate_keys_entry(file, index, duplicate_keys) {
            self.entries.push(entry);
        }
    }

    /// Reads one parsed document (an object or a List); `label` names it while it has no name.
    pub fn add_value(&mut self, file: &str, label: &str, doc: &Value) {
        self.add_value_at(file, label, doc, 0, None);
    }

    /// `inherited`: (apiVersion, kind) of the items of a typed list (`PodList` items carry
    /// neither).
    fn add_value_at(
        &mut self,
        file: &str,
        label: &str,
        doc: &Value,
        depth: usize,
        inherited: Option<(ApiVersion<'_>, &str)>,
    ) {
        let mut problems = Vec::new();
        let mut fail = |field: &str, reason: String| {
            problems.push(Problem::untyped(
                Severity::Error,
                file.to_string(),
                label.to_string(),
                field.to_string(),
                reason,
            ));
        };
        if !doc.is_object() {
            fail("", format!("expected an object, found {}", type_name(doc)));
            return self.push(problems, Outcome::Unidentified);
        }
        let kind = match (doc.get("kind"), inherited) {
            (Some(Value::String(k)), _) if !k.is_empty() => k.as_str(),
            (None | Some(Value::Null), Some((_, k))) => k,
            (None | Some(Value::Null), None) => {
                fail("kind", "missing kind".into());
                return self.push(problems, Outcome::Unidentified);
            }
            (Some(other), _) => {
                let reason = format!("expected a non-empty string, found {}", show(other));
                fail("kind", reason);
                return self.push(problems, Outcome::Unidentified);
            }
        };
        // An item of a typed list (`PodList`) that says it is another kind is not what the
        // list promised: read as what it says, but never silently (issue 20, defect 14).
        if let Some((_, listed)) = inherited.filter(|(_, listed)| *listed != kind) {
            let what = match kinds::spec(kind) {
                Some(_) => format!("read as a {kind}"),
                None => "not a kind netwarden reads; ignored".to_string(),
            };
            problems.push(Problem {
                file: file.to_string(),
                kind: validate::shorten(kind),
                object: name_label(doc).unwrap_or_else(|| label.to_string()),
                field: "kind".into(),
                reason: format!(
                    "an item of kind \"{}\" in a {listed}List: {what}",
                    validate::shorten(kind)
                ),
                severity: Severity::Warning,
            });
            if kinds::spec(kind).is_none() {
                return self.push(problems, Outcome::Skipped);
            }
        }
        let api_version = match doc.get("apiVersion") {
            Some(Value::String(s)) => ApiVersion::Written(s),
            None | Some(Value::Null) => inherited.map_or(ApiVersion::Missing, |(a, _)| a),
            Some(other) => ApiVersion::NotAString(other),
        };

        if let Some(inherited) = list_items(kind, api_version) {
            return self.add_list(file, label, doc, inherited, depth);
        }
        let spec = match kinds::resolve(kind, api_version) {
            Resolved::Ours(spec) => spec,
            Resolved::NotOurs => return,
            Resolved::NearMiss { field, reason } => {
                problems.push(Problem {
                    file: file.to_string(),
                    // As written (it is not one of ours), so escaped and shortened.
                    kind: validate::shorten(kind),
                    object: name_label(doc).unwrap_or_else(|| label.to_string()),
                    field: field.to_string(),
                    reason,
                    severity: Severity::Error,
                });
                return self.push(problems, Outcome::Unidentified);
            }
        };
        let mut cx = Ctx::new(file, spec.kind, label.to_string(), &mut problems);
        match deletion(doc) {
            Marker::No => {}
            Marker::Yes => {
                // Only the identity matters; the rest of a deletion marker is not read.
                read_meta(&mut cx, doc, spec.namespaced);
                let outcome = match cx.id.take() {
                    Some(id) => Outcome::Delete(Box::new(DeleteMarker {
                        id,
                        file: file.to_string(),
                        label: cx.object.clone(),
                    })),
                    None => Outcome::Unidentified,
                };
                return self.push(problems, outcome);
            }
            Marker::Invalid(found) => {
                // Neither a deletion nor the object as written can be trusted: like any object
                // an error drops, it is not loaded (and, over a base, still hides its object).
                read_meta(&mut cx, doc, spec.namespaced);
                cx.error(
                    &format!("metadata.annotations.{DELETE}"),
                    format!("expected \"true\" or \"false\", found {found}; object ignored"),
                );
                let outcome = match cx.id.take() {
                    Some(id) => Outcome::Rejected(id),
                    None => Outcome::Unidentified,
                };
                return self.push(problems, outcome);
            }
        }
        // An admin policy with a rule that had to fail closed because part of it could not
        // be read: a running agent keeps its last good version instead (as for policies).
        let mut admin_fail_closed = false;
        let object = match spec.kind {
            "Namespace" => read_namespace(&mut cx, doc).map(Object::Namespace),
            "Pod" => pod::read_pod(&mut cx, doc).map(Object::Pod),
            "DanmEp" => pod::read_danmep(&mut cx, doc).map(|d| Object::DanmEp(Box::new(d))),
            "NetworkPolicy" | "DanmNetworkPolicy" | "MultiNetworkPolicy" => {
                policy::read_policy(&mut cx, doc).map(|p| Object::Policy(Arc::new(p)))
            }
            "ClusterNetworkPolicy" | "AdminNetworkPolicy" | "BaselineAdminNetworkPolicy" => {
                admin::read_admin_policy(&mut cx, doc).map(|(p, fail_closed)| {
                    admin_fail_closed = fail_closed;
                    Object::AdminPolicy(Arc::new(p))
                })
            }
            "Node" => admin::read_node(&mut cx, doc).map(|n| Object::Node(Box::new(n))),
            "Service" => service::read_service(&mut cx, doc).map(|s| Object::Service(Box::new(s))),
            "EndpointSlice" => {
                service::read_slice(&mut cx, doc).map(|s| Object::Slice(Box::new(s)))
            }
            other => unreachable!("kind {other} is in KINDS but has no reader"),
        };
        let label = cx.object.clone();
        let loaded = |object, id, fail_closed| {
            Outcome::Loaded(Box::new(ReadObject {
                id,
                file: file.to_string(),
                label: label.clone(),
                object,
                fail_closed,
            }))
        };
        let mut outcome = match (object, cx.id.clone()) {
            (Some(object), Some(id)) if !cx.rejected => loaded(object, id, admin_fail_closed),
            (_, Some(id)) if cx.rejected || cx.errors > 0 => Outcome::Rejected(id),
            (_, Some(_)) => Outcome::Skipped,
            (_, None) => Outcome::Unidentified,
        };
        // A policy that cannot be read is not dropped: that would open the pods its author
        // meant to protect, and only after a restart (a running agent keeps the last good
        // version). It isolates what it selects, with no allows (SPEC 7).
        if let Outcome::Rejected(id) = &outcome {
            let kind = match spec.kind {
                "NetworkPolicy" => Some(netwarden_engine::PolicyKind::NetworkPolicy),
                "DanmNetworkPolicy" => Some(netwarden_engine::PolicyKind::DanmNetworkPolicy),
                "MultiNetworkPolicy" => Some(netwarden_engine::PolicyKind::MultiNetworkPolicy),
                _ => None,
            };
            let fallback = kind.and_then(|k| policy::fail_closed(doc, &id.namespace, &id.name, k));
            if let Some(p) = fallback {
                let directions = match (p.ingress.is_some(), p.egress.is_some()) {
                    (true, true) => "ingress and egress",
                    (true, false) => "ingress",
                    _ => "egress",
                };
                cx.error(
                    "",
                    format!(
                        "the policy cannot be read: until it can, it isolates the pods its \
                         podSelector selects in {directions}, allowing nothing (fail closed)"
                    ),
                );
                let id = id.clone();
                outcome = loaded(Object::Policy(Arc::new(p)), id, true);
            }
        }
        self.push(problems, outcome);
    }

    fn push(&mut self, problems: Vec<Problem>, outcome: Outcome) {
        self.entries.push(Entry { problems, outcome });
    }

    /// Reads item `index` of the top-level List document `label` (its items are at depth 1),
    /// as [`Self::add_value`] reads it with its List: for a reader that meets the items one
    /// at a time ([`crate::stream`]).
    pub fn add_list_item(
        &mut self,
        file: &str,
        label: &str,
        index: usize,
        item: &Value,
        inherited: Option<(ApiVersion<'_>, &str)>,
    ) {
        self.add_value_at(file, &item_label(label, index), item, 1, inherited);
    }

    fn add_list(
        &mut self,
        file: &str,
        label: &str,
        doc: &Value,
        inherited: Option<(ApiVersion<'_>, &str)>,
        depth: usize,
    ) {
        let fail = |field: &str, reason: String| {
            Problem::untyped(
                Severity::Error,
                file.to_string(),
                label.to_string(),
                field.to_string(),
                reason,
            )
        };
        if depth >= MAX_LIST_DEPTH {
            let problem = fail("items", "Lists nested too deep".into());
            return self.push(vec![problem], Outcome::Unidentified);
        }
        let items = match doc.get("items") {
            None | Some(Value::Null) => return,
            Some(Value::Array(items)) => items,
            Some(other) => {
                let problem = fail(
                    "items",
                    format!("expected a list, found {}", type_name(other)),
                );
                return self.push(vec![problem], Outcome::Unidentified);
            }
        };
        for (i, item) in items.iter().enumerate() {
            self.add_value_at(file, &item_label(label, i), item, depth + 1, inherited);
        }
    }
}

/// How problems name item `index` of the List `label`.
fn item_label(label: &str, index: usize) -> String {
    format!("{label}.items[{index}]")
}

/// The entry that reports a document's duplicate keys (JSON only), if it has any.
fn duplicate_keys_entry(file: &str, index: usize, paths: &[String]) -> Option<Entry> {
    if paths.is_empty() {
        return None;
    }
    let problems = paths
        .iter()
        .map(|path| {
            Problem::untyped(
                Severity::Warning,
                file.to_string(),
                format!("#{index}"),
                path.clone(),
                "duplicate key; the last value is used",
            )
        })
        .collect();
    Some(Entry {
        problems,
        outcome: Outcome::Skipped,
    })
}

/// What a kind says about its `items`: `None` when it is not a List (its items are never
/// read), else the (apiVersion, kind) they inherit. Items of a typed list (`PodList`, as the
/// API returns it) carry no kind of their own; those of a `List` inherit nothing.
fn list_items<'a>(
    kind: &'a str,
    api_version: ApiVersion<'a>,
) -> Option<Option<(ApiVersion<'a>, &'a str)>> {
    let item_kind = kind.strip_suffix("List")?;
    if item_kind.is_empty() {
        return Some(None);
    }
    kinds::spec(item_kind)?;
    Some(Some((api_version, item_kind)))
}

/// [`list_items`] for a top-level document (nothing inherited) from its `kind` and
/// `apiVersion` fields: `None` when it is not a List, whatever else is wrong with it.
pub(crate) fn top_level_list_items<'a>(
    kind: Option<&'a Value>,
    api_version: Option<&'a Value>,
) -> Option<Option<(ApiVersion<'a>, &'a str)>> {
    let kind = kind?.as_str().filter(|k| !k.is_empty())?;
    let api_version = match api_version {
        Some(Value::String(s)) => ApiVersion::Written(s),
        None | Some(Value::Null) => ApiVersion::Missing,
        Some(other) => ApiVersion::NotAString(other),
    };
    list_items(kind, api_version)
}

/// Whether an item of a List reads the same whatever its List's kind and apiVersion: it
/// writes its own kind and apiVersion (as `kubectl get -o json` writes every item).
pub(crate) fn self_describing(item: &Value) -> bool {
    let kind = item.get("kind").and_then(Value::as_str);
    let api_version = item.get("apiVersion");
    kind.is_some_and(|k| !k.is_empty()) && api_version.is_some_and(|a| !a.is_null())
}

/// What the [`DELETE`] annotation of an object says.
enum Marker {
    No,
    Yes,
    /// Another value (shown as found; an error).
    Invalid(String),
}

/// Reads the [`DELETE`] annotation of an object of our kinds (a malformed `metadata` is left
/// to [`read_meta`] to report).
fn deletion(doc: &Value) -> Marker {
    let value = get(doc, "metadata")
        .and_then(|m| get(m, "annotations"))
        .and_then(|a| get(a, DELETE));
    match value {
        None => Marker::No,
        Some(Value::String(s)) if s == "false" => Marker::No,
        Some(Value::String(s)) if s == "true" => Marker::Yes,
        Some(other) => Marker::Invalid(show(other)),
    }
}

/// `ns/name` (or `name`) of a document whose kind is not read, for its problem; `None` when
/// the name is not a string.
fn name_label(doc: &Value) -> Option<String> {
    let meta = get(doc, "metadata")?;
    // An empty name names nothing: the caller's label (`#N`, the cluster key) does.
    let name = get(meta, "name")?.as_str().filter(|n| !n.is_empty())?;
    Some(match get(meta, "namespace").and_then(Value::as_str) {
        Some(ns) => format!("{}/{}", validate::shorten(ns), validate::shorten(name)),
        None => validate::shorten(name),
    })
}

fn read_namespace(cx: &mut Ctx<'_>, doc: &Value) -> Option<Namespace> {
    let meta = read_meta(cx, doc, false)?;
    let learn = read_learn(cx, &meta.annotations);
    Some(Namespace {
        name: meta.name,
        labels: meta.labels,
        learn,
    })
}
