//! The resource types the fake serves, which CRDs are installed, and the discovery documents
//! built from them (`/api`, `/api/v1`, `/apis`, `/apis/{group}`, `/apis/{group}/{version}`).
//!
//! Kinds are looked up three ways, as the real server does: by URL (group, version, plural) for
//! HTTP, by `apiVersion` + `kind` for objects a test hands in, and by group + plural for the
//! storage, which is shared by every version of a resource (a CRD served at v1beta1 and v1beta2
//! stores one set of objects, converted by rewriting `apiVersion` — the CRD "None" strategy).

use serde_json::{json, Value};

/// One resource type as discovery lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceType {
    /// `""` for the core group.
    pub group: String,
    pub version: String,
    pub kind: String,
    /// The URL segment: `pods`, `networkpolicies`, `danmnetworkpolicies`.
    pub plural: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
}

impl ResourceType {
    fn new(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> Self {
        ResourceType {
            group: group.to_string(),
            version: version.to_string(),
            kind: kind.to_string(),
            plural: plural.to_string(),
            namespaced,
            short_names: Vec::new(),
        }
    }

    /// `v1` for the core group, `group/version` otherwise — the objects' `apiVersion`.
    pub fn api_version(&self) -> String {
        api_version(&self.group, &self.version)
    }

    /// Where the objects of every version of this resource are stored.
    pub fn storage_key(&self) -> StorageKey {
        StorageKey {
            group: self.group.clone(),
            plural: self.plural.clone(),
        }
    }

    /// The list kind (`PodList`), as the real server names it.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }
}

/// The storage identity of a resource: group and plural, independent of the version.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StorageKey {
    pub group: String,
    pub plural: String,
}

/// `v1` for the core group, `group/version` otherwise.
pub fn api_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

/// Splits an `apiVersion` into group and version (`v1` → `("", "v1")`).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    }
}

/// A CRD known to the fake, served or not. The node agent's CRDs are known from the start so
/// that `install_crd(group, version, kind)` needs no plural (the one the CRD manifests use).
pub fn known_crds() -> Vec<ResourceType> {
    vec![
        ResourceType::new(
            "danm.k8s.io",
            "v1",
            "DanmNetworkPolicy",
            "danmnetworkpolicies",
            true,
        ),
        ResourceType::new("danm.k8s.io", "v1", "DanmEp", "danmeps", true),
        ResourceType::new(
            "k8s.cni.cncf.io",
            "v1beta1",
            "MultiNetworkPolicy",
            "multi-networkpolicies",
            true,
        ),
        ResourceType::new(
            "k8s.cni.cncf.io",
            "v1beta2",
            "MultiNetworkPolicy",
            "multi-networkpolicies",
            true,
        ),
        ResourceType::new(
            "policy.networking.k8s.io",
            "v1alpha2",
            "ClusterNetworkPolicy",
            "clusternetworkpolicies",
            false,
        ),
        ResourceType::new(
            "policy.networking.k8s.io",
            "v1alpha1",
            "AdminNetworkPolicy",
            "adminnetworkpolicies",
            false,
        ),
        ResourceType::new(
            "policy.networking.k8s.io",
            "v1alpha1",
            "BaselineAdminNetworkPolicy",
            "baselineadminnetworkpolicies",
            false,
        ),
    ]
}

/// The built-in kinds the fake always serves.
pub fn builtin() -> Vec<ResourceType> {
    let mut ns = ResourceType::new("", "v1", "Namespace", "namespaces", false);
    ns.short_names = vec!["ns".into()];
    let mut pod = ResourceType::new("", "v1", "Pod", "pods", true);
    pod.short_names = vec!["po".into()];
    let node = ResourceType::new("", "v1", "Node", "nodes", false);
    let mut svc = ResourceType::new("", "v1", "Service", "services", true);
    svc.short_names = vec!["svc".into()];
    let mut ev = ResourceType::new("", "v1", "Event", "events", true);
    ev.short_names = vec!["ev".into()];
    let mut netpol = ResourceType::new(
        "networking.k8s.io",
        "v1",
        "NetworkPolicy",
        "networkpolicies",
        true,
    );
    netpol.short_names = vec!["netpol".into()];
    let mut ev2 = ResourceType::new("events.k8s.io", "v1", "Event", "events", true);
    ev2.short_names = vec!["ev".into()];
    vec![
        ns,
        node,
        pod,
        svc,
        ev,
        ResourceType::new(
            "discovery.k8s.io",
            "v1",
            "EndpointSlice",
            "endpointslices",
            true,
        ),
        netpol,
        ev2,
    ]
}

/// Whether a kind has a `status` subresource: then a write to the main resource over HTTP
/// keeps the stored status, and `/status` writes only the status (as on the real server).
pub fn has_status_subresource(r: &ResourceType) -> bool {
    matches!(
        (r.group.as_str(), r.kind.as_str()),
        ("", "Pod" | "Service" | "Namespace") | ("danm.k8s.io", "DanmNetworkPolicy")
    )
}

/// What the server serves right now: the built-in kinds plus the installed CRD versions.
#[derive(Clone, Debug)]
pub struct Catalogue {
    served: Vec<ResourceType>,
}

impl Default for Catalogue {
    fn default() -> Self {
        Catalogue { served: builtin() }
    }
}

impl Catalogue {
    pub fn served(&self) -> &[ResourceType] {
        &self.served
    }

    /// By URL: `(group, version, plural)`.
    pub fn by_path(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.served
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    /// By an object's `apiVersion` and `kind`.
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<&ResourceType> {
        let (group, version) = split_api_version(api_version);
        self.served
            .iter()
            .find(|r| r.group == group && r.version == version && r.kind == kind)
    }

    /// Every served version of a kind name (`Pod`, `MultiNetworkPolicy`).
    pub fn by_kind_name<'a>(
        &'a self,
        kind: &'a str,
    ) -> impl Iterator<Item = &'a ResourceType> + 'a {
        self.served.iter().filter(move |r| r.kind == kind)
    }

    /// Serves one version of a CRD; a known CRD needs no plural. Returns whether it was new.
    pub fn install(&mut self, r: ResourceType) -> bool {
        if self.by_path(&r.group, &r.version, &r.plural).is_some() {
            return false;
        }
        self.served.push(r);
        true
    }

    /// Stops serving one version of a CRD. Returns the removed type; built-in kinds cannot be
    /// removed (returns `None`).
    pub fn uninstall(&mut self, group: &str, version: &str, kind: &str) -> Option<ResourceType> {
        let builtin = builtin();
        let i = self
            .served
            .iter()
            .position(|r| r.group == group && r.version == version && r.kind == kind)?;
        if builtin.contains(&self.served[i]) {
            return None;
        }
        Some(self.served.remove(i))
    }

    /// Whether any version of this storage is still served.
    pub fn serves_storage(&self, key: &StorageKey) -> bool {
        self.served.iter().any(|r| &r.storage_key() == key)
    }

    /// The groups, in the order they were first served, with their versions (the first one is
    /// the preferred version, as for a CRD's first listed version).
    fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for r in self.served.iter().filter(|r| !r.group.is_empty()) {
            match out.iter_mut().find(|(g, _)| g == &r.group) {
                Some((_, versions)) => {
                    if !versions.contains(&r.version) {
                        versions.push(r.version.clone());
                    }
                }
                None => out.push((r.group.clone(), vec![r.version.clone()])),
            }
        }
        out
    }

    /// `/api`: the core group's versions (an `APIVersions` object).
    pub fn core_versions(&self) -> Value {
        json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
        })
    }

    /// `/apis`: every named group (an `APIGroupList`).
    pub fn group_list(&self) -> Value {
        let groups: Vec<Value> = self
            .groups()
            .iter()
            .map(|(g, v)| group_json(g, v))
            .collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    /// `/apis/{group}`: one group (an `APIGroup`), `None` when no version of it is served.
    pub fn group(&self, group: &str) -> Option<Value> {
        let groups = self.groups();
        let (g, versions) = groups.iter().find(|(g, _)| g == group)?;
        let mut doc = group_json(g, versions);
        doc["kind"] = json!("APIGroup");
        doc["apiVersion"] = json!("v1");
        Some(doc)
    }

    /// `/api/v1` or `/apis/{group}/{version}`: the resources of one group version (an
    /// `APIResourceList`), `None` when nothing is served there.
    pub fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let mut resources = Vec::new();
        for r in self
            .served
            .iter()
            .filter(|r| r.group == group && r.version == version)
        {
            resources.push(json!({
                "name": r.plural,
                "singularName": r.kind.to_ascii_lowercase(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                "shortNames": r.short_names,
            }));
            // The status subresource, as the real server lists it for these kinds.
            if has_status_subresource(r) {
                resources.push(json!({
                    "name": format!("{}/status", r.plural),
                    "singularName": "",
                    "namespaced": r.namespaced,
                    "kind": r.kind,
                    "verbs": ["get", "patch", "update"],
                }));
            }
        }
        if resources.is_empty() {
            return None;
        }
        Some(json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": api_version(group, version),
            "resources": resources,
        }))
    }
}

fn group_json(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({
        "name": group,
        "versions": vs,
        "preferredVersion": vs[0],
    })
}

/// What a request path names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `/version`
    Version,
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/apis/{group}`
    Group(String),
    /// `/api/v1`, `/apis/{group}/{version}`
    Resources { group: String, version: String },
    /// A collection: all namespaces (`namespace == None`) or one.
    Collection {
        resource: ResourceType,
        namespace: Option<String>,
    },
    /// One object, or its `status` subresource.
    Object {
        resource: ResourceType,
        namespace: Option<String>,
        name: String,
        status: bool,
    },
}

/// Resolves a request path against what is served; `None` is the real server's 404 "the server
/// could not find the requested resource" (an unknown path, or a CRD that is not installed).
pub fn resolve(catalogue: &Catalogue, path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segs.as_slice() {
        ["version"] => return Some(Target::Version),
        ["api"] => return Some(Target::CoreVersions),
        ["apis"] => return Some(Target::Groups),
        ["apis", group] => {
            return catalogue
                .group(group)
                .map(|_| Target::Group(group.to_string()));
        }
        ["api", "v1"] => {
            return Some(Target::Resources {
                group: String::new(),
                version: "v1".into(),
            })
        }
        ["apis", group, version] => {
            return catalogue
                .resource_list(group, version)
                .map(|_| Target::Resources {
                    group: group.to_string(),
                    version: version.to_string(),
                });
        }
        _ => {}
    }
    let (group, version, rest) = match segs.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let lookup = |plural: &str| catalogue.by_path(group, version, plural).cloned();
    let object = |resource: ResourceType, namespace: Option<&str>, name: &str, status: bool| {
        Some(Target::Object {
            resource,
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
            status,
        })
    };
    // `namespaces/{ns}/...` is a namespaced path; `namespaces/{name}` is the Namespace object.
    match rest {
        ["namespaces", ns, plural] => {
            let r = lookup(plural).filter(|r| r.namespaced)?;
            Some(Target::Collection {
                resource: r,
                namespace: Some(ns.to_string()),
            })
        }
        ["namespaces", ns, plural, name] => object(
            lookup(plural).filter(|r| r.namespaced)?,
            Some(ns),
            name,
            false,
        ),
        ["namespaces", ns, plural, name, "status"] => object(
            lookup(plural).filter(|r| r.namespaced)?,
            Some(ns),
            name,
            true,
        ),
        [plural] => Some(Target::Collection {
            resource: lookup(plural)?,
            namespace: None,
        }),
        [plural, name] => object(lookup(plural).filter(|r| !r.namespaced)?, None, name, false),
        [plural, name, "status"] => {
            object(lookup(plural).filter(|r| !r.namespaced)?, None, name, true)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(kind: &str, version: &str) -> ResourceType {
        known_crds()
            .into_iter()
            .find(|r| r.kind == kind && r.version == version)
            .unwrap()
    }

    #[test]
    fn paths_resolve_to_collections_and_objects() {
        let c = Catalogue::default();
        let Some(Target::Collection {
            resource,
            namespace,
        }) = resolve(&c, "/api/v1/pods")
        else {
            panic!("pods")
        };
        assert_eq!((resource.kind.as_str(), namespace), ("Pod", None));
        let Some(Target::Object { resource, name, .. }) = resolve(&c, "/api/v1/namespaces/default")
        else {
            panic!("namespace object")
        };
        assert_eq!(
            (resource.kind.as_str(), name.as_str()),
            ("Namespace", "default")
        );
        let Some(Target::Collection {
            resource,
            namespace,
        }) = resolve(
            &c,
            "/apis/networking.k8s.io/v1/namespaces/a/networkpolicies",
        )
        else {
            panic!("netpols")
        };
        assert_eq!(
            (resource.kind.as_str(), namespace.as_deref()),
            ("NetworkPolicy", Some("a"))
        );
        assert!(matches!(
            resolve(&c, "/api/v1/namespaces/a/pods/p/status"),
            Some(Target::Object { status: true, .. })
        ));
        // A namespaced kind has no cluster-scoped object path, and the reverse.
        assert_eq!(resolve(&c, "/api/v1/pods/p"), None);
        assert_eq!(resolve(&c, "/api/v1/namespaces/a/namespaces"), None);
    }

    #[test]
    fn a_crd_is_absent_until_installed() {
        let mut c = Catalogue::default();
        let path = "/apis/danm.k8s.io/v1/namespaces/a/danmnetworkpolicies";
        assert_eq!(resolve(&c, path), None);
        assert_eq!(resolve(&c, "/apis/danm.k8s.io"), None);
        assert!(c.group_list()["groups"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["name"] != "danm.k8s.io"));
        assert!(c.install(crd("DanmNetworkPolicy", "v1")));
        assert!(resolve(&c, path).is_some());
        assert_eq!(
            c.group("danm.k8s.io").unwrap()["preferredVersion"]["version"],
            "v1"
        );
        assert!(c
            .uninstall("danm.k8s.io", "v1", "DanmNetworkPolicy")
            .is_some());
        assert_eq!(resolve(&c, path), None);
        // Built-in kinds stay.
        assert!(c.uninstall("", "v1", "Pod").is_none());
    }

    #[test]
    fn versions_of_one_crd_share_storage_and_discovery_lists_both() {
        let mut c = Catalogue::default();
        c.install(crd("MultiNetworkPolicy", "v1beta1"));
        c.install(crd("MultiNetworkPolicy", "v1beta2"));
        let a = c
            .by_kind("k8s.cni.cncf.io/v1beta1", "MultiNetworkPolicy")
            .unwrap();
        let b = c
            .by_kind("k8s.cni.cncf.io/v1beta2", "MultiNetworkPolicy")
            .unwrap();
        assert_eq!(a.storage_key(), b.storage_key());
        let group = c.group("k8s.cni.cncf.io").unwrap();
        assert_eq!(group["versions"].as_array().unwrap().len(), 2);
        let list = c.resource_list("k8s.cni.cncf.io", "v1beta2").unwrap();
        assert_eq!(list["resources"][0]["name"], "multi-networkpolicies");
        let key = b.storage_key();
        c.uninstall("k8s.cni.cncf.io", "v1beta1", "MultiNetworkPolicy");
        assert!(c.serves_storage(&key));
    }
}
