//! The object type the watchers and the one-shot listing read: an object's JSON as the API
//! server sent it, deserialized once, straight into the [`Value`] that
//! [`ClusterSet::upsert`](netwarden_manifest::ClusterSet::upsert) reduces.
//!
//! kube's `DynamicObject` costs three passes over every object: serde's buffering of the
//! whole object for its flattened `data`, a typed `ObjectMeta`, and — to hand the reducer a
//! `Value` — serializing all of it back. Measured at 100,000 pods (`perf` on the agent's
//! watch thread, initial list): deserializing `DynamicObject`s took 24% of that thread and the
//! way back to a `Value` another 16%. Here the object is parsed once; the watcher gets only
//! the metadata it reads (the `resourceVersion` it resumes from, and the name and namespace a
//! deletion is known by), copied out of the parsed value.
//!
//! `metadata.managedFields` is skipped while parsing, never built: the API server's record of
//! which client set which field, often the largest part of a real object (a pod's runs to
//! kilobytes), and nothing netwarden reads.

use std::borrow::Cow;

use kube::api::ApiResource;
use kube::core::{DynamicResourceScope, ObjectMeta, Resource};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// One object of a watched kind, as JSON.
#[derive(Debug, Clone)]
pub struct RawObject {
    /// `name`, `namespace`, `uid` and `resourceVersion` of the object's metadata (the rest is
    /// in [`RawObject::value`] only).
    metadata: ObjectMeta,
    value: Value,
}

impl RawObject {
    /// The object as JSON, typed with the apiVersion and kind it was watched as (the items of
    /// a list lack them).
    pub fn into_typed_value(self, resource: &ApiResource) -> Value {
        let mut value = self.value;
        if let Some(map) = value.as_object_mut() {
            map.insert("apiVersion".into(), resource.api_version.clone().into());
            map.insert("kind".into(), resource.kind.clone().into());
        }
        value
    }

    /// The `apiVersion` and `kind` the object says it has, when it says (list items of
    /// built-in kinds usually do not).
    pub fn stated_type(&self) -> (Option<&str>, Option<&str>) {
        (
            self.value.get("apiVersion").and_then(Value::as_str),
            self.value.get("kind").and_then(Value::as_str),
        )
    }

    /// `metadata.uid`, if any.
    pub fn uid_str(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
    }

    /// Namespace (empty when cluster-scoped) and name.
    pub fn namespace_and_name(&self) -> (&str, &str) {
        (
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name.as_deref().unwrap_or_default(),
        )
    }
}

impl<'de> Deserialize<'de> for RawObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = deserializer.deserialize_any(Pruned { depth: 0 })?;
        let meta = value.get("metadata");
        let text = |field: &str| {
            meta.and_then(|m| m.get(field))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let metadata = ObjectMeta {
            name: text("name"),
            namespace: text("namespace"),
            uid: text("uid"),
            resource_version: text("resourceVersion"),
            ..ObjectMeta::default()
        };
        Ok(RawObject { metadata, value })
    }
}

/// A JSON value as [`Value`] reads it, but for `metadata.managedFields` of the object
/// (`depth` 0: the object, 1: its metadata), which is skipped unread.
struct Pruned {
    depth: u8,
}

impl<'de> Visitor<'de> for Pruned {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
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

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element::<Value>()? {
            out.push(item);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = match (self.depth, key.as_str()) {
                (0, "metadata") => map.next_value_seed(Pruned { depth: 1 })?,
                (1, "managedFields") => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
                _ => map.next_value::<Value>()?,
            };
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

impl<'de> DeserializeSeed<'de> for Pruned {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// The same dynamic typing as kube's `DynamicObject`: the kind, its group, version and plural
/// come from the [`ApiResource`] it is watched as.
impl Resource for RawObject {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;
    use serde_json::json;

    fn pods() -> ApiResource {
        ApiResource {
            group: String::new(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: "Pod".into(),
            plural: "pods".into(),
        }
    }

    #[test]
    fn the_json_is_kept_whole_and_the_watcher_gets_its_metadata() {
        let sent = json!({"metadata": {"name": "web", "namespace": "ns", "uid": "u1",
                                       "resourceVersion": "42", "labels": {"app": "web"}},
                          "spec": {"nodeName": "n1"}});
        let object: RawObject = serde_json::from_value(sent.clone()).unwrap();
        assert_eq!(object.resource_version().as_deref(), Some("42"));
        assert_eq!(object.uid().as_deref(), Some("u1"));
        assert_eq!(object.namespace_and_name(), ("ns", "web"));
        let value = object.into_typed_value(&pods());
        let mut expected = sent;
        expected["apiVersion"] = "v1".into();
        expected["kind"] = "Pod".into();
        assert_eq!(value, expected, "nothing dropped, type added");
    }

    #[test]
    fn managed_fields_are_not_kept_and_nothing_else_is_lost() {
        let sent = json!({"metadata": {"name": "web", "namespace": "ns",
                                       "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
                                       "labels": {"app": "web", "managedFields": "a label"}},
                          "spec": {"nodeName": "n1", "managedFields": [1, 2.5, null, true],
                                   "containers": [{"name": "c", "ports": [{"containerPort": 80}]}]},
                          "status": {"podIPs": [{"ip": "10.0.0.1"}], "big": 18446744073709551615u64,
                                     "negative": -3, "ratio": 0.5, "none": null, "flag": false}});
        let object: RawObject = serde_json::from_value(sent.clone()).unwrap();
        let mut expected = sent.clone();
        expected["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        expected["apiVersion"] = "v1".into();
        expected["kind"] = "Pod".into();
        assert_eq!(object.into_typed_value(&pods()), expected);
        // The same through text, as the watcher reads it.
        let text = serde_json::to_string(&sent).unwrap();
        let object: RawObject = serde_json::from_str(&text).unwrap();
        assert_eq!(object.into_typed_value(&pods()), expected);
    }

    #[test]
    fn an_object_with_odd_metadata_still_reads() {
        // The reducer reports what is wrong with it; the watcher must not fail on it.
        for sent in [
            json!({}),
            json!({"metadata": {"name": 7}}),
            json!({"metadata": []}),
            json!({"metadata": "text"}),
            json!({"metadata": {"managedFields": 3}}),
        ] {
            let object: RawObject = serde_json::from_value(sent).unwrap();
            assert_eq!(object.namespace_and_name(), ("", ""));
        }
    }

    #[test]
    fn a_list_page_reads_as_kube_reads_it() {
        let page = json!({"apiVersion": "v1", "kind": "PodList",
                          "metadata": {"resourceVersion": "7", "continue": "next"},
                          "items": [{"metadata": {"name": "a", "namespace": "ns"}},
                                    {"metadata": {"name": "b", "namespace": "ns"}}]});
        let list: kube::core::ObjectList<RawObject> = serde_json::from_value(page).unwrap();
        assert_eq!(list.metadata.continue_.as_deref(), Some("next"));
        let names: Vec<_> = list
            .items
            .iter()
            .map(|o| o.namespace_and_name().1)
            .collect();
        assert_eq!(names, ["a", "b"]);
    }
}
