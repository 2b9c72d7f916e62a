//! Reading a `serde_json::Value` field by field while recording a [`Problem`] for every field
//! that is present but malformed, so that one bad field never hides the others.
//!
//! A field of the wrong type (a list where an object belongs, an unquoted `y` that YAML 1.1
//! reads as a boolean) marks the whole object rejected ([`Ctx::rejected`]): it was not written
//! as its author believes, so no part of it is trusted, and nothing falls back to a default
//! (an unreadable namespace never becomes `default`). Values of the right type that are
//! invalid (a port out of range, a bad CIDR) are handled by each reader, which drops the
//! smallest part that keeps the object from widening.

use std::net::IpAddr;

use ipnet::IpNet;
use netwarden_engine::Protocol;
use serde_json::{Map, Value};

use crate::validate;
use crate::{Problem, Severity};

/// What identifies an object: two objects with the same id are duplicates. Here, below every
/// reader, because [`Ctx::id`] holds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ObjectId {
    pub kind: &'static str,
    /// `""` for Namespaces.
    pub namespace: String,
    pub name: String,
}

/// Where problems found in one object go, how they are labelled, and what is known about the
/// object so far.
pub(crate) struct Ctx<'a> {
    pub file: &'a str,
    pub kind: &'static str,
    pub object: String,
    pub problems: &'a mut Vec<Problem>,
    /// Set as soon as kind, namespace and name are read and valid.
    pub id: Option<ObjectId>,
    /// A field had the wrong type: the object must not be loaded.
    pub rejected: bool,
    /// Errors reported for this object so far.
    pub errors: usize,
}

/// How [`Ctx::string_map`] checks a map of labels.
pub(crate) struct LabelCheck {
    /// Appended to the reason of an invalid entry, e.g. `"; object ignored"`.
    pub consequence: &'static str,
}

/// `base.key`, or `key` at the top.
pub(crate) fn join(base: &str, key: &str) -> String {
    if base.is_empty() {
        key.to_string()
    } else {
        format!("{base}.{key}")
    }
}

/// `base[i]`.
pub(crate) fn index(base: &str, i: usize) -> String {
    format!("{base}[{i}]")
}

/// The field path of an annotation or label, as `kubectl` users write it.
pub(crate) fn keyed(base: &str, key: &str) -> String {
    format!("{base}[\"{}\"]", validate::shorten(key))
}

/// A field of an object; `null` counts as absent (as in Kubernetes).
pub(crate) fn get<'v>(v: &'v Value, key: &str) -> Option<&'v Value> {
    match v.get(key) {
        None | Some(Value::Null) => None,
        Some(x) => Some(x),
    }
}

pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A short rendering of a value for a reason.
pub(crate) fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{}\"", validate::shorten(s)),
        Value::Array(_) | Value::Object(_) | Value::Null => type_name(v).to_string(),
        other => validate::shorten(&other.to_string()),
    }
}

impl<'a> Ctx<'a> {
    pub fn new(
        file: &'a str,
        kind: &'static str,
        object: String,
        problems: &'a mut Vec<Problem>,
    ) -> Self {
        Self {
            file,
            kind,
            object,
            problems,
            id: None,
            rejected: false,
            errors: 0,
        }
    }

    pub fn push(&mut self, severity: Severity, field: &str, reason: impl Into<String>) {
        if severity == Severity::Error {
            self.errors += 1;
        }
        self.problems.push(Problem {
            file: self.file.to_string(),
            kind: self.kind.to_string(),
            object: self.object.clone(),
            field: field.to_string(),
            reason: reason.into(),
            severity,
        });
    }

    pub fn error(&mut self, field: &str, reason: impl Into<String>) {
        self.push(Severity::Error, field, reason);
    }

    pub fn warn(&mut self, field: &str, reason: impl Into<String>) {
        self.push(Severity::Warning, field, reason);
    }

    /// Reports a field whose value cannot be read and rejects the object.
    pub fn reject(&mut self, field: &str, reason: impl Into<String>) {
        self.rejected = true;
        self.error(field, format!("{}; object ignored", reason.into()));
    }

    /// Reports a field of the wrong type and rejects the object (see the module doc). When a
    /// string was expected and YAML produced a boolean or a number, says how to quote it.
    pub fn wrong_type(&mut self, field: &str, want: &str, got: &Value) {
        self.rejected = true;
        let found =
            match got {
                Value::Bool(b) if want == "a string" => {
                    format!(
                "the boolean {b} (YAML reads an unquoted {} as {b}): quote the value, e.g. {}",
                if *b { "y, yes, on or true" } else { "n, no, off or false" },
                quoted_example(field, if *b { "y" } else { "n" })
            )
                }
                Value::Number(n) if want == "a string" => format!(
                    "the number {}: quote the value, e.g. {}",
                    validate::shorten(&n.to_string()),
                    quoted_example(field, &n.to_string())
                ),
                other => type_name(other).to_string(),
            };
        self.error(
            field,
            format!("expected {want}, found {found}; object ignored"),
        );
    }

    /// `v[key]` as a string; reports a present non-string.
    pub fn str<'v>(&mut self, v: &'v Value, base: &str, key: &str) -> Option<&'v str> {
        match get(v, key)? {
            Value::String(s) => Some(s),
            other => {
                self.wrong_type(&join(base, key), "a string", other);
                None
            }
        }
    }

    /// `v[key]` as a non-empty string; reports it missing (with `what`) or of the wrong type.
    pub fn required_str<'v>(
        &mut self,
        v: &'v Value,
        base: &str,
        key: &str,
        what: &str,
    ) -> Option<&'v str> {
        match get(v, key) {
            None | Some(Value::String(_)) => {}
            Some(other) => {
                self.wrong_type(&join(base, key), "a string", other);
                return None;
            }
        }
        match get(v, key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        {
            Some(s) => Some(s),
            None => {
                self.error(&join(base, key), format!("missing {what}"));
                None
            }
        }
    }

    /// `v[key]` as a boolean; reports a present non-boolean.
    pub fn bool(&mut self, v: &Value, base: &str, key: &str) -> Option<bool> {
        match get(v, key)? {
            Value::Bool(b) => Some(*b),
            other => {
                self.wrong_type(&join(base, key), "true or false", other);
                None
            }
        }
    }

    /// `v[key]` as a list; reports a present non-list.
    pub fn array<'v>(&mut self, v: &'v Value, base: &str, key: &str) -> Option<&'v Vec<Value>> {
        match get(v, key)? {
            Value::Array(a) => Some(a),
            other => {
                self.wrong_type(&join(base, key), "a list", other);
                None
            }
        }
    }

    /// `v[key]` as an object; reports a present non-object.
    pub fn object<'v>(
        &mut self,
        v: &'v Value,
        base: &str,
        key: &str,
    ) -> Option<&'v Map<String, Value>> {
        match get(v, key)? {
            Value::Object(m) => Some(m),
            other => {
                self.wrong_type(&join(base, key), "an object", other);
                None
            }
        }
    }

    /// A map of string values (labels, annotations, selectors). A non-string value (or a
    /// non-object map) rejects the object. With `labels`, keys and values are checked against
    /// the label syntax; an invalid entry is reported (its reason ending in `labels.consequence`)
    /// and skipped. Returns the map and whether every entry was valid.
    pub fn string_map(
        &mut self,
        v: &Value,
        base: &str,
        key: &str,
        labels: Option<LabelCheck>,
    ) -> (netwarden_engine::Labels, bool) {
        let mut out = netwarden_engine::Labels::new();
        let mut ok = true;
        let field = join(base, key);
        let Some(map) = self.object(v, base, key) else {
            return (out, get(v, key).is_none());
        };
        for (k, val) in map {
            // The field path is built only for a problem: most maps have none.
            let f = || keyed(&field, k);
            let Value::String(s) = val else {
                self.wrong_type(&f(), "a string", val);
                ok = false;
                continue;
            };
            if let Some(check) = &labels {
                let valid = validate::label_key(k).and_then(|()| validate::label_value(s));
                if let Err(e) = valid {
                    self.error(&f(), format!("{e}{}", check.consequence));
                    ok = false;
                    continue;
                }
            }
            out.insert(k.clone(), s.clone());
        }
        out.shrink_to_fit();
        (out, ok)
    }

    /// `v[key]` as a protocol: absent means TCP; `None` (reported) when invalid. Kubernetes
    /// wants upper case; other spellings are accepted with a warning since they are unambiguous.
    pub fn protocol(&mut self, v: &Value, base: &str, key: &str) -> Option<Protocol> {
        let field = join(base, key);
        let s = match get(v, key) {
            None => return Some(Protocol::Tcp),
            Some(Value::String(s)) => s,
            Some(other) => {
                self.wrong_type(&field, "TCP, UDP or SCTP", other);
                return None;
            }
        };
        match Protocol::parse(s) {
            Some(p) if p.as_str() == s => Some(p),
            Some(p) => {
                self.warn(
                    &field,
                    format!("protocol {:?} read as {p}", validate::shorten(s)),
                );
                Some(p)
            }
            None => {
                self.error(
                    &field,
                    format!(
                        "unknown protocol \"{}\" (expected TCP, UDP or SCTP)",
                        validate::shorten(s)
                    ),
                );
                None
            }
        }
    }

    /// A port number (1..=65535) given as an integer.
    pub fn port_number(&mut self, field: &str, v: &Value) -> Option<u16> {
        match v {
            Value::Number(n) => match n.as_i64() {
                Some(p) if (1..=65535).contains(&p) => Some(p as u16),
                Some(p) => {
                    self.error(field, format!("port {p} is out of range 1-65535"));
                    None
                }
                None => {
                    self.error(
                        field,
                        format!("port {n} is not an integer in range 1-65535"),
                    );
                    None
                }
            },
            other => {
                self.wrong_type(field, "a port number", other);
                None
            }
        }
    }
}

/// How the value of `field` is written quoted: `namespace: "y"`, `app: "y"` for a label, or
/// `- "y"` for a list item.
fn quoted_example(field: &str, value: &str) -> String {
    let value = validate::shorten(value);
    if let Some(open) = field.rfind("[\"").filter(|_| field.ends_with("\"]")) {
        let key = &field[open + 2..field.len() - 2];
        return format!("{key}: \"{value}\"");
    }
    if field.ends_with(']') {
        return format!("- \"{value}\"");
    }
    let key = field.rsplit('.').next().unwrap_or(field);
    format!("{key}: \"{value}\"")
}

/// Parses a plain address, or an address with a prefix (`10.0.0.5/24`), returning the address
/// and its prefix length (defaulting to /24 for IPv4 and /64 for IPv6 when none is written:
/// only the lab uses it, to build subnets).
pub(crate) fn parse_addr(s: &str) -> Result<(IpAddr, u8), String> {
    let s = s.trim();
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok((ip, default_prefix(ip)));
    }
    match s.parse::<IpNet>() {
        Ok(net) => Ok((net.addr(), net.prefix_len())),
        Err(_) => Err(format!("{:?} is not an IP address", validate::shorten(s))),
    }
}

pub(crate) fn default_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() {
        24
    } else {
        64
    }
}
