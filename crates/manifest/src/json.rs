//! JSON to `serde_json::Value`, noticing duplicate keys.
//!
//! `serde_json` keeps the last of two equal keys without a word; Kubernetes does the same but
//! warns ("duplicate field"). Two values for one key usually mean a merge gone wrong, so the
//! loader reports each duplicate with its field path and, like the API server, uses the last
//! value. (The YAML parser rejects duplicate keys outright.)
//!
//! The path of the current node is kept as a stack of segments and only formatted when a
//! duplicate is found, so a large clean document costs no extra allocation per key.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// A parsed JSON value and the paths of its duplicate keys (`metadata.labels["app"]`).
#[derive(Debug)]
pub(crate) struct Checked {
    pub value: Value,
    pub duplicate_keys: Vec<String>,
}

impl<'de> serde::Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut walk = Walk::default();
        let value = ValueSeed { walk: &mut walk }.deserialize(deserializer)?;
        Ok(Checked {
            value,
            duplicate_keys: walk.duplicates,
        })
    }
}

/// Parses one JSON text (exactly one value).
pub(crate) fn from_str(text: &str) -> Result<Checked, serde_json::Error> {
    serde_json::from_str(text)
}

/// Parses a stream of JSON values (`{...} {...}`).
pub(crate) fn stream(text: &str) -> Result<Vec<Checked>, serde_json::Error> {
    serde_json::Deserializer::from_str(text)
        .into_iter::<Checked>()
        .collect()
}

/// One step of the path from a document's root to the node being read.
pub(crate) enum Segment {
    Key(String),
    Index(usize),
}

/// Where a reader is in a document, and the duplicate keys found so far (shared by the
/// document reader of [`crate::stream`], which reads a List's items one at a time).
#[derive(Default)]
pub(crate) struct Walk {
    pub path: Vec<Segment>,
    pub duplicates: Vec<String>,
}

impl Walk {
    /// The path of `key` in the current object, as problems write fields.
    pub fn path_of(&self, key: &str) -> String {
        let mut out = String::new();
        for segment in &self.path {
            match segment {
                Segment::Key(k) => push_key(&mut out, k),
                Segment::Index(i) => out.push_str(&format!("[{i}]")),
            }
        }
        push_key(&mut out, key);
        bound_path(out)
    }
}

/// The longest path reported; a deeper one keeps its end, which says most.
const MAX_PATH: usize = 400;

fn bound_path(path: String) -> String {
    if path.len() <= MAX_PATH {
        return path;
    }
    let mut start = path.len() - MAX_PATH;
    while !path.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &path[start..])
}

/// Appends `.key`, or `["key"]` when the key is not a plain word (`k8s.io/name`).
fn push_key(out: &mut String, key: &str) {
    if !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric()) {
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(&crate::validate::shorten(key));
    } else {
        out.push_str(&format!("[\"{}\"]", crate::validate::shorten(key)));
    }
}

/// Reads one value as `serde_json::Value` does (for JSON and for YAML alike), recording
/// duplicate keys in the walk.
pub(crate) struct ValueSeed<'w> {
    pub walk: &'w mut Walk,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    // The YAML parser reports integers beyond 64 bits this way; `Value` takes those that fit
    // and refuses the others, and so does this reader.
    fn visit_i128<E: serde::de::Error>(self, v: i128) -> Result<Value, E> {
        int128(v)
    }

    fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Value, E> {
        uint128(v)
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(float(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        loop {
            self.walk.path.push(Segment::Index(out.len()));
            let next = seq.next_element_seed(ValueSeed {
                walk: &mut *self.walk,
            });
            self.walk.path.pop();
            match next? {
                Some(v) => out.push(v),
                None => return Ok(Value::Array(out)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            self.walk.path.push(Segment::Key(key));
            let value = map.next_value_seed(ValueSeed {
                walk: &mut *self.walk,
            });
            let Some(Segment::Key(key)) = self.walk.path.pop() else {
                unreachable!("the segment pushed above")
            };
            let value = value?;
            if out.contains_key(&key) {
                let path = self.walk.path_of(&key);
                self.walk.duplicates.push(path);
            }
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

/// A float as `Value` holds it: NaN and infinities (YAML has them) become null.
pub(crate) fn float(v: f64) -> Value {
    Number::from_f64(v).map_or(Value::Null, Value::Number)
}

/// An integer beyond 64 bits (the YAML parser reports them so): `Value` takes those that fit
/// and refuses the others.
pub(crate) fn int128<E: serde::de::Error>(v: i128) -> Result<Value, E> {
    <Number as serde::Deserialize>::deserialize(serde::de::value::I128Deserializer::<E>::new(v))
        .map(Value::Number)
}

/// See [`int128`].
pub(crate) fn uint128<E: serde::de::Error>(v: u128) -> Result<Value, E> {
    <Number as serde::Deserialize>::deserialize(serde::de::value::U128Deserializer::<E>::new(v))
        .map(Value::Number)
}

/// Reads a map key as `serde_json::Value` does (as a string, through `deserialize_str`).
pub(crate) struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E>(self, v: &str) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_string<E>(self, v: String) -> Result<String, E> {
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_are_found_with_their_path() {
        let c = from_str(
            r#"{"kind":"Pod","metadata":{"name":"a","labels":{"app":"x","k8s.io/x":"1","app":"y","k8s.io/x":"2"}},
                "spec":{"containers":[{"ports":[{"name":"a","name":"b"}]}]},"kind":"Pod"}"#,
        )
        .unwrap();
        assert_eq!(
            c.duplicate_keys,
            [
                "metadata.labels.app",
                "metadata.labels[\"k8s.io/x\"]",
                "spec.containers[0].ports[0].name",
                "kind"
            ]
        );
        // The last value is used, as serde_json (and the API server) do.
        assert_eq!(c.value["metadata"]["labels"]["app"], "y");
        assert_eq!(c.value["spec"]["containers"][0]["ports"][0]["name"], "b");
    }

    #[test]
    fn clean_documents_equal_serde_json() {
        let text = r#"{"a":[1,-2,3.5,true,null,"s",{"b":{}}],"c":18446744073709551615}"#;
        let c = from_str(text).unwrap();
        assert!(c.duplicate_keys.is_empty());
        assert_eq!(c.value, serde_json::from_str::<Value>(text).unwrap());
        let docs = stream(r#"{"a":1} {"a":2,"a":3}"#).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].duplicate_keys, ["a"]);
    }

    #[test]
    fn paths_stay_short() {
        let key = "k".repeat(1000);
        let outer = format!("{{\"{}\":", "o".repeat(100));
        let nested = format!(
            "{}{{\"{key}\":1,\"{key}\":2}}{}",
            outer.repeat(100),
            "}".repeat(100)
        );
        let c = from_str(&nested).unwrap();
        assert_eq!(c.duplicate_keys.len(), 1);
        let path = &c.duplicate_keys[0];
        assert!(path.len() <= MAX_PATH + 3, "{path}");
        assert!(
            path.starts_with("...") && path.ends_with("kkk..."),
            "{path}"
        );
    }

    #[test]
    fn deep_nesting_is_refused_not_fatal() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(from_str(&deep).is_err());
    }
}
