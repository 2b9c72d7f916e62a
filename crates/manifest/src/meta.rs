//! The metadata every object has (`metadata.name`, `namespace`, `labels`, `annotations`) and
//! the annotations read the same way on several kinds (learn mode).
//!
//! Below [`crate::read`] and the per-kind readers ([`crate::pod`], [`crate::policy`],
//! [`crate::service`]), which all start with [`read_meta`]: read.rs dispatches to those
//! readers, so what they share cannot live in read.rs without an import loop.

use netwarden_engine::Labels;
use serde_json::Value;

use crate::ctx::{get, keyed, Ctx, LabelCheck, ObjectId};
use crate::validate;

/// The metadata every object has. `cx.object` is set to the object's name as soon as known,
/// and `cx.id` once kind, namespace and name are read and valid.
pub(crate) struct Meta {
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    pub annotations: Labels,
}

/// Reads `metadata`; `None` (with problems) when the name or namespace is missing, unreadable
/// or invalid (such an object cannot be referred to safely), or when a label or annotation
/// cannot be read (a pod missing a label would leave the policies that select it).
pub(crate) fn read_meta(cx: &mut Ctx<'_>, doc: &Value, namespaced: bool) -> Option<Meta> {
    let empty = Value::Null;
    let meta = match get(doc, "metadata") {
        Some(m @ Value::Object(_)) => m,
        Some(other) => {
            cx.wrong_type("metadata", "an object", other);
            return None;
        }
        None => &empty,
    };
    let name = cx
        .required_str(meta, "metadata", "name", "name; object ignored")
        .map(str::to_string);
    if let Some(name) = &name {
        cx.object = validate::shorten(name);
    }
    // An unreadable namespace is never replaced by `default`: that would move the object.
    let namespace = match get(meta, "namespace") {
        _ if !namespaced => Some(String::new()),
        None => Some("default".to_string()),
        Some(Value::String(s)) if s.is_empty() => Some("default".to_string()),
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            cx.wrong_type("metadata.namespace", "a string", other);
            None
        }
    };
    if let (true, Some(name), Some(ns)) = (namespaced, &name, &namespace) {
        cx.object = format!("{}/{}", validate::shorten(ns), validate::shorten(name));
    }
    let mut valid_name = false;
    if let Some(name) = &name {
        // Namespace names are DNS labels; every other kind's (Nodes and the cluster-scoped
        // admin policies included) are DNS subdomains.
        let check = if namespaced || cx.kind != "Namespace" {
            validate::dns1123_subdomain(name)
        } else {
            validate::dns1123_label(name)
        };
        match check {
            Ok(()) => valid_name = true,
            Err(e) => cx.error(
                "metadata.name",
                format!("invalid name: {e}; object ignored"),
            ),
        }
    }
    let mut valid_namespace = !namespaced;
    if let (true, Some(ns)) = (namespaced, &namespace) {
        match validate::dns1123_label(ns) {
            Ok(()) => valid_namespace = true,
            Err(e) => cx.error(
                "metadata.namespace",
                format!("invalid namespace: {e}; object ignored"),
            ),
        }
    }
    if let (true, true, Some(name), Some(namespace)) =
        (valid_name, valid_namespace, &name, &namespace)
    {
        cx.id = Some(ObjectId {
            kind: cx.kind,
            namespace: namespace.clone(),
            name: name.clone(),
        });
    }
    let check = LabelCheck {
        consequence: "; object ignored",
    };
    let (labels, labels_ok) = cx.string_map(meta, "metadata", "labels", Some(check));
    let (annotations, _) = cx.string_map(meta, "metadata", "annotations", None);
    if cx.id.is_none() || !labels_ok || cx.rejected {
        return None;
    }
    Some(Meta {
        namespace: namespace.unwrap_or_default(),
        name: name.unwrap_or_default(),
        labels,
        annotations,
    })
}

/// Learn mode on a Pod or a Namespace (issue 9): its pods log each distinct new flow.
pub const LEARN: &str = "netwarden.io/learn";

/// The `netwarden.io/learn` annotation: `"true"` or `"false"`; anything else is reported and
/// read as `false` (learn mode only adds logging, so leaving it off changes no verdict).
pub(crate) fn read_learn(cx: &mut Ctx<'_>, annotations: &Labels) -> bool {
    match annotations.get(LEARN).map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            cx.error(
                &keyed("metadata.annotations", LEARN),
                format!(
                    "expected \"true\" or \"false\", found \"{}\"; not learning",
                    validate::shorten(other)
                ),
            );
            false
        }
    }
}
