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

use std::borrow::Cow;

use kube::api::ApiResource;
use kube::core::{DynamicResourceScope, ObjectMeta, Resource};
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
        let value = Value::deserialize(deserializer)?;
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
    fn an_object_with_odd_metadata_still_reads() {
        // The reducer reports what is wrong with it; the watcher must not fail on it.
        for sent in [
            json!({}),
            json!({"metadata": {"name": 7}}),
            json!({"metadata": []}),
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
