//! A small checker of CRD OpenAPI v3 schemas, for what `deploy.rs` needs without an API server:
//! whether a schema is *structural* (the rules the API server applies before accepting a CRD),
//! and whether an object validates against one — including the fields the server would prune
//! because the schema does not declare them, which it drops silently rather than refusing.
//!
//! It covers the keywords netwarden's CRDs use (type, properties, additionalProperties, items,
//! required, nullable, enum, format int32, x-kubernetes-int-or-string, anyOf/allOf/oneOf/not);
//! a schema using anything else is reported by [`structural_problems`], so a new keyword cannot
//! slip past both functions unchecked.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use serde_json::Value;

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

fn shown(path: &str) -> &str {
    if path.is_empty() {
        "(root)"
    } else {
        path
    }
}

/// The subschema at `steps` below `schema`: a property name, or `[]` for array items.
pub fn at<'a>(schema: &'a JSONSchemaProps, steps: &[&str]) -> &'a JSONSchemaProps {
    let mut node = schema;
    for step in steps {
        node = if *step == "[]" {
            match &node.items {
                Some(JSONSchemaPropsOrArray::Schema(s)) => s,
                _ => panic!("no items schema at {step}"),
            }
        } else {
            node.properties
                .as_ref()
                .and_then(|p| p.get(*step))
                .unwrap_or_else(|| panic!("no property {step}"))
        };
    }
    node
}

/// Why the API server would refuse `root` as a CRD version's openAPIV3Schema (empty: it would
/// not). The rules of "Specifying a structural schema" in the Kubernetes CRD documentation,
/// plus the keywords apiextensions/v1 forbids.
pub fn structural_problems(root: &JSONSchemaProps) -> Vec<String> {
    let mut problems = Vec::new();
    if root.type_.as_deref() != Some("object") {
        problems.push("(root): type must be object".to_string());
    }
    // metadata: only restrictions on name and generateName.
    if let Some(meta) = root.properties.as_ref().and_then(|p| p.get("metadata")) {
        let allowed = ["name", "generateName"];
        let extra = meta
            .properties
            .iter()
            .flatten()
            .any(|(k, _)| !allowed.contains(&k.as_str()));
        if extra || meta.type_.as_deref() != Some("object") {
            problems.push("metadata: only name and generateName may be restricted".to_string());
        }
    }
    check_node(root, "", false, &mut problems);
    problems
}

fn is_int_or_string_any_of(any_of: &[JSONSchemaProps]) -> bool {
    let only_type = |s: &JSONSchemaProps, t: &str| {
        s == &JSONSchemaProps {
            type_: Some(t.to_string()),
            ..Default::default()
        }
    };
    any_of.len() == 2 && only_type(&any_of[0], "integer") && only_type(&any_of[1], "string")
}

fn check_node(s: &JSONSchemaProps, path: &str, in_junctor: bool, out: &mut Vec<String>) {
    let at = shown(path);
    let forbidden = [
        ("$ref", s.ref_path.is_some()),
        ("$schema", s.schema.is_some()),
        ("definitions", s.definitions.is_some()),
        ("dependencies", s.dependencies.is_some()),
        ("id", s.id.is_some()),
        ("additionalItems", s.additional_items.is_some()),
        ("patternProperties", s.pattern_properties.is_some()),
        ("uniqueItems: true", s.unique_items == Some(true)),
        (
            "items as a list",
            matches!(s.items, Some(JSONSchemaPropsOrArray::Schemas(_))),
        ),
        (
            "properties together with additionalProperties",
            s.properties.is_some() && s.additional_properties.is_some(),
        ),
    ];
    for (what, present) in forbidden {
        if present {
            out.push(format!("{at}: {what} is not allowed"));
        }
    }
    let int_or_string = s.x_kubernetes_int_or_string == Some(true);
    let preserve = s.x_kubernetes_preserve_unknown_fields == Some(true);
    if in_junctor {
        let set = [
            ("description", s.description.is_some()),
            ("type", s.type_.is_some()),
            ("default", s.default.is_some()),
            ("additionalProperties", s.additional_properties.is_some()),
            ("nullable", s.nullable.is_some()),
        ];
        for (what, present) in set {
            if present {
                out.push(format!("{at}: {what} inside anyOf/allOf/oneOf/not"));
            }
        }
    } else if s.type_.is_none() && !int_or_string && !preserve {
        out.push(format!("{at}: no type"));
    }
    if int_or_string {
        if s.type_.is_some() {
            out.push(format!("{at}: x-kubernetes-int-or-string with a type"));
        }
        if s.any_of
            .as_deref()
            .is_some_and(|a| !is_int_or_string_any_of(a))
        {
            out.push(format!(
                "{at}: x-kubernetes-int-or-string with another anyOf"
            ));
        }
    }
    if let Some(default) = &s.default {
        for p in validate_node(s, &default.0, path) {
            out.push(format!("{at}: default is invalid: {p}"));
        }
    }

    for (name, sub) in s.properties.iter().flatten() {
        check_node(sub, &join(path, name), in_junctor, out);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(sub)) = &s.additional_properties {
        check_node(sub, &join(path, "*"), in_junctor, out);
    }
    if let Some(JSONSchemaPropsOrArray::Schema(sub)) = &s.items {
        check_node(sub, &format!("{path}[]"), in_junctor, out);
    }
    let int_or_string_pattern =
        int_or_string && s.any_of.as_deref().is_some_and(is_int_or_string_any_of);
    let junctors = s
        .all_of
        .iter()
        .flatten()
        .chain(s.one_of.iter().flatten())
        .chain(s.any_of.iter().flatten().filter(|_| !int_or_string_pattern))
        .chain(s.not.as_deref());
    for sub in junctors {
        // Every field and item a junctor speaks of is also specified outside it.
        for name in sub.properties.iter().flatten().map(|(k, _)| k) {
            if !s.properties.as_ref().is_some_and(|p| p.contains_key(name)) {
                out.push(format!("{at}: {name} is only specified inside a junctor"));
            }
        }
        if sub.items.is_some() && s.items.is_none() {
            out.push(format!("{at}: items only specified inside a junctor"));
        }
        check_node(sub, path, true, out);
    }
}

/// What is wrong with `object` under `root` (empty: the API server would store it as written).
/// `apiVersion`, `kind` and `metadata` are the API server's own and not checked here.
pub fn validate(root: &JSONSchemaProps, object: &Value) -> Vec<String> {
    let Some(fields) = object.as_object() else {
        return vec!["(root): expected object".to_string()];
    };
    let mut out = Vec::new();
    for (name, value) in fields {
        if matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        match root.properties.as_ref().and_then(|p| p.get(name)) {
            Some(sub) => out.extend(validate_node(sub, value, name)),
            None => out.push(format!(
                "{name}: unknown field (the API server would prune it)"
            )),
        }
    }
    for name in root.required.iter().flatten() {
        if !fields.contains_key(name) {
            out.push(format!("(root): missing required field {name}"));
        }
    }
    out
}

fn validate_node(s: &JSONSchemaProps, value: &Value, path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let at = shown(path);
    if value.is_null() {
        if s.nullable != Some(true) {
            out.push(format!("{at}: null is not allowed"));
        }
        return out;
    }
    if s.x_kubernetes_int_or_string == Some(true) {
        if !(value.is_i64() || value.is_u64() || value.is_string()) {
            out.push(format!("{at}: expected an integer or a string"));
        }
        return out;
    }
    let type_ok = match s.type_.as_deref() {
        None => true,
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some(other) => {
            out.push(format!("{at}: unknown type {other}"));
            return out;
        }
    };
    if !type_ok {
        out.push(format!("{at}: expected {}", s.type_.as_deref().unwrap()));
        return out;
    }
    if let Some(allowed) = &s.enum_ {
        if !allowed.iter().any(|a| a.0 == *value) {
            out.push(format!("{at}: {value} is not one of the allowed values"));
        }
    }
    if s.format.as_deref() == Some("int32")
        && value.as_i64().and_then(|v| i32::try_from(v).ok()).is_none()
    {
        out.push(format!("{at}: {value} is out of the int32 range"));
    }
    match value {
        Value::Object(fields) => {
            let properties: BTreeMap<&str, &JSONSchemaProps> = s
                .properties
                .iter()
                .flatten()
                .map(|(k, v)| (k.as_str(), v))
                .collect();
            for (name, v) in fields {
                let field = join(path, name);
                match (properties.get(name.as_str()), &s.additional_properties) {
                    (Some(sub), _) => out.extend(validate_node(sub, v, &field)),
                    (None, Some(JSONSchemaPropsOrBool::Schema(sub))) => {
                        out.extend(validate_node(sub, v, &field))
                    }
                    _ if s.x_kubernetes_preserve_unknown_fields == Some(true) => {}
                    _ => out.push(format!(
                        "{field}: unknown field (the API server would prune it)"
                    )),
                }
            }
            for name in s.required.iter().flatten() {
                if !fields.contains_key(name) {
                    out.push(format!("{at}: missing required field {name}"));
                }
            }
        }
        Value::Array(items) => {
            if let Some(JSONSchemaPropsOrArray::Schema(sub)) = &s.items {
                for (i, v) in items.iter().enumerate() {
                    out.extend(validate_node(sub, v, &format!("{path}[{i}]")));
                }
            }
        }
        _ => {}
    }
    if let Some(any_of) = &s.any_of {
        if !any_of
            .iter()
            .any(|sub| validate_node(sub, value, path).is_empty())
        {
            out.push(format!("{at}: matches none of anyOf"));
        }
    }
    for sub in s.all_of.iter().flatten() {
        out.extend(validate_node(sub, value, path));
    }
    if let Some(one_of) = &s.one_of {
        let matching = one_of
            .iter()
            .filter(|sub| validate_node(sub, value, path).is_empty())
            .count();
        if matching != 1 {
            out.push(format!(
                "{at}: matches {matching} of oneOf, not exactly one"
            ));
        }
    }
    if let Some(not) = &s.not {
        if validate_node(not, value, path).is_empty() {
            out.push(format!("{at}: matches the schema under not"));
        }
    }
    out
}

/// Where `after` differs from `before` (paths and what happened), for round trips through a
/// typed object: a field dropped, changed or added by the type.
pub fn differences(before: &Value, after: &Value, path: &str) -> Vec<String> {
    let at = shown(path);
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            let mut out = Vec::new();
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => out.extend(differences(v, w, &join(path, k))),
                    None if v.is_null() => {}
                    None => out.push(format!("{}: dropped", join(path, k))),
                }
            }
            for (k, w) in b {
                if !a.contains_key(k) {
                    out.push(format!("{}: added as {w}", join(path, k)));
                }
            }
            out
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .flat_map(|(i, (v, w))| differences(v, w, &format!("{path}[{i}]")))
            .collect(),
        _ if before == after => Vec::new(),
        _ => vec![format!("{at}: {before} became {after}")],
    }
}
