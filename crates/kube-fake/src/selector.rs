//! `labelSelector` and `fieldSelector` query parameters: parsed once per request, then matched
//! against stored objects (a LIST filters the items, a WATCH filters each event).
//!
//! Label selectors take the real server's grammar: `k=v`, `k==v`, `k!=v`, `k in (a,b)`,
//! `k notin (a,b)`, `k`, `!k`, joined by commas. Field selectors take `=`, `==` and `!=` on
//! the fields the real server indexes for that kind; any other field is refused with 400, as
//! the real server does ("field label not supported"), so a test cannot pass here with a
//! selector a real cluster rejects.

use serde_json::Value;

/// A parse failure, with the offending text; the HTTP layer answers 400 BadRequest with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed `labelSelector`; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelRequirement>);

/// Splits at commas that are not inside parentheses (`a in (x,y),b=c`).
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn value_set(s: &str, whole: &str) -> Result<Vec<String>, SelectorError> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| {
            SelectorError(format!(
                "labelSelector {whole:?}: expected a (value, ...) set"
            ))
        })?;
    Ok(inner.split(',').map(|v| v.trim().to_string()).collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector(reqs));
        }
        for part in split_top_level(s) {
            let part = part.trim();
            let bad = || SelectorError(format!("labelSelector {s:?}: cannot parse {part:?}"));
            if part.is_empty() {
                return Err(bad());
            }
            let req = if let Some((k, v)) = part.split_once("!=") {
                LabelRequirement::NotEquals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                LabelRequirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelRequirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, set)) = part.split_once(" notin ") {
                LabelRequirement::NotIn(k.trim().into(), value_set(set, s)?)
            } else if let Some((k, set)) = part.split_once(" in ") {
                LabelRequirement::In(k.trim().into(), value_set(set, s)?)
            } else if let Some(k) = part.strip_prefix('!') {
                LabelRequirement::DoesNotExist(k.trim().into())
            } else if part.contains(['(', ')', ' ', '<', '>']) {
                return Err(bad());
            } else {
                LabelRequirement::Exists(part.into())
            };
            let key = match &req {
                LabelRequirement::Equals(k, _)
                | LabelRequirement::NotEquals(k, _)
                | LabelRequirement::In(k, _)
                | LabelRequirement::NotIn(k, _)
                | LabelRequirement::Exists(k)
                | LabelRequirement::DoesNotExist(k) => k,
            };
            if key.is_empty() || key.contains(char::is_whitespace) {
                return Err(bad());
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelRequirement::Equals(k, v) => get(k) == Some(v.as_str()),
            LabelRequirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            LabelRequirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelRequirement::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            LabelRequirement::Exists(k) => get(k).is_some(),
            LabelRequirement::DoesNotExist(k) => get(k).is_none(),
        })
    }
}

/// The fields the real server accepts in a field selector for a kind (its field label
/// conversion functions); `metadata.name` and `metadata.namespace` hold for every kind.
fn supported_fields(group: &str, kind: &str) -> &'static [&'static str] {
    match (group, kind) {
        ("", "Pod") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "Namespace") => &["status.phase"],
        ("", "Event") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("events.k8s.io", "Event") => &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reason",
            "reportingController",
            "type",
        ],
        _ => &[],
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldRequirement {
    path: Vec<String>,
    value: String,
    equal: bool,
}

/// A parsed `fieldSelector`; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<FieldRequirement>);

impl FieldSelector {
    /// Parses a selector for objects of `kind` in `group`, refusing fields the real server
    /// does not support for that kind.
    pub fn parse(s: &str, group: &str, kind: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector(reqs));
        }
        for part in s.split(',') {
            let (field, value, equal) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, true)
            } else {
                return Err(SelectorError(format!(
                    "fieldSelector {s:?}: invalid selector {part:?}; expected field=value, field==value or field!=value"
                )));
            };
            let field = field.trim();
            let supported = matches!(field, "metadata.name" | "metadata.namespace")
                || supported_fields(group, kind).contains(&field);
            if !supported {
                return Err(SelectorError(format!(
                    "fieldSelector {s:?}: field label not supported for {kind}: {field}"
                )));
            }
            reqs.push(FieldRequirement {
                path: field.split('.').map(str::to_string).collect(),
                value: value.trim().to_string(),
                equal,
            });
        }
        Ok(FieldSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|r| {
            let mut v = obj;
            for seg in &r.path {
                v = &v[seg.as_str()];
            }
            // The real server compares the field's string form; an unset field is "".
            let actual = match v {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (actual == r.value) == r.equal
        })
    }
}

/// Both selectors of one request.
#[derive(Debug, Clone, Default)]
pub struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: Value, node: Option<&str>) -> Value {
        let mut p =
            json!({"metadata": {"name": "p", "namespace": "a", "labels": labels}, "spec": {}});
        if let Some(n) = node {
            p["spec"]["nodeName"] = json!(n);
        }
        p
    }

    #[test]
    fn label_selectors_follow_the_real_grammar() {
        let p = pod(json!({"app": "web", "tier": "front"}), None);
        let yes = [
            "app=web",
            "app==web",
            "app!=db",
            "app in (web, db)",
            "tier notin (back)",
            "app",
            "!gone",
            "app=web,tier",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&p), "{s}");
        }
        let no = [
            "app=db",
            "app!=web",
            "app in (db)",
            "app notin (web,x)",
            "gone",
            "!app",
            "app=web,tier=back",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&p), "{s}");
        }
        assert!(LabelSelector::parse("").unwrap().matches(&p));
        assert!(LabelSelector::parse("a in x").is_err());
        assert!(LabelSelector::parse("a,,b").is_err());
        assert!(LabelSelector::parse("a > 3").is_err());
    }

    #[test]
    fn field_selectors_compare_string_forms_and_refuse_unknown_fields() {
        let on = pod(json!({}), Some("node-1"));
        let off = pod(json!({}), None);
        let s = FieldSelector::parse("spec.nodeName=node-1", "", "Pod").unwrap();
        assert!(s.matches(&on) && !s.matches(&off));
        let s =
            FieldSelector::parse("spec.nodeName!=node-1,metadata.namespace==a", "", "Pod").unwrap();
        assert!(!s.matches(&on) && s.matches(&off));
        // Unset compares as "", as unscheduled pods match `spec.nodeName=` on a real server.
        assert!(FieldSelector::parse("spec.nodeName=", "", "Pod")
            .unwrap()
            .matches(&off));
        let err = FieldSelector::parse("spec.nodeName=x", "", "Service").unwrap_err();
        assert!(
            err.0
                .contains("field label not supported for Service: spec.nodeName"),
            "{err}"
        );
        assert!(FieldSelector::parse("metadata.name", "", "Pod").is_err());
    }
}
