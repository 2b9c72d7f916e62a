//! The Kubernetes resources the node agent reads and writes, in one place: the watchers take
//! their kinds from [`WATCHED_KINDS`], and the ClusterRole in `deploy/rbac.yaml` is tested to
//! grant exactly [`WATCH_VERBS`] on these and [`EVENT_VERBS`] on [`EVENT_RESOURCES`] — so a
//! watcher added here without its permission (or a permission nobody uses) fails CI instead of a
//! cluster install.
//!
//! Plain data, no kube or k8s-openapi types: the agent builds its `ApiResource`s from it, the
//! deploy tests compare it with YAML.

/// One resource kind the agent lists and watches (SPEC 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchedKind {
    pub kind: &'static str,
    /// API group; `""` is the core group (apiVersion `v1`).
    pub group: &'static str,
    /// The versions read, most preferred first: the agent watches the first one the cluster
    /// serves (MultiNetworkPolicy is served as v1beta2 or v1beta1 depending on the install).
    pub versions: &'static [&'static str],
    /// The resource name in URLs and RBAC rules.
    pub plural: &'static str,
    pub namespaced: bool,
    /// Defined by a CustomResourceDefinition that may be missing from a cluster: the agent skips
    /// the kind with a warning until it appears, instead of failing.
    pub custom: bool,
}

impl WatchedKind {
    /// `group/version` as written in `apiVersion` (`v1` for the core group).
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }
}

/// Everything the agent lists and watches. The order is the order of the initial sync:
/// namespaces and pods first, so that policies find what they select.
pub const WATCHED_KINDS: [WatchedKind; 8] = [
    WatchedKind {
        kind: "Namespace",
        group: "",
        versions: &["v1"],
        plural: "namespaces",
        namespaced: false,
        custom: false,
    },
    WatchedKind {
        kind: "Pod",
        group: "",
        versions: &["v1"],
        plural: "pods",
        namespaced: true,
        custom: false,
    },
    WatchedKind {
        kind: "DanmEp",
        group: "danm.k8s.io",
        versions: &["v1"],
        plural: "danmeps",
        namespaced: true,
        custom: true,
    },
    WatchedKind {
        kind: "Service",
        group: "",
        versions: &["v1"],
        plural: "services",
        namespaced: true,
        custom: false,
    },
    WatchedKind {
        kind: "EndpointSlice",
        group: "discovery.k8s.io",
        versions: &["v1"],
        plural: "endpointslices",
        namespaced: true,
        custom: false,
    },
    WatchedKind {
        kind: "NetworkPolicy",
        group: "networking.k8s.io",
        versions: &["v1"],
        plural: "networkpolicies",
        namespaced: true,
        custom: false,
    },
    WatchedKind {
        kind: "DanmNetworkPolicy",
        group: "danm.k8s.io",
        versions: &["v1"],
        plural: "danmnetworkpolicies",
        namespaced: true,
        custom: true,
    },
    WatchedKind {
        kind: "MultiNetworkPolicy",
        group: "k8s.cni.cncf.io",
        versions: &["v1beta2", "v1beta1"],
        plural: "multi-networkpolicies",
        namespaced: true,
        custom: true,
    },
];

/// What the agent may do with a watched kind: read it, never change it.
pub const WATCH_VERBS: [&str; 3] = ["get", "list", "watch"];

/// Where the agent writes Kubernetes Events (kube-runtime's recorder writes `events.k8s.io/v1`;
/// the core group is granted too for clusters and tools that still read or write `v1` Events),
/// as `(group, plural)`.
pub const EVENT_RESOURCES: [(&str, &str); 2] = [("", "events"), ("events.k8s.io", "events")];

/// A recorder creates an Event and then patches its count when the same event repeats.
pub const EVENT_VERBS: [&str; 2] = ["create", "patch"];

/// The watched kind `kind`, if any.
pub fn watched(kind: &str) -> Option<&'static WatchedKind> {
    WATCHED_KINDS.iter().find(|k| k.kind == kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_versions_are_written_as_in_manifests() {
        assert_eq!(watched("Pod").unwrap().api_version("v1"), "v1");
        let multi = watched("MultiNetworkPolicy").unwrap();
        assert_eq!(
            multi.api_version(multi.versions[0]),
            "k8s.cni.cncf.io/v1beta2"
        );
        assert!(watched("Deployment").is_none());
    }

    #[test]
    fn kinds_and_plurals_are_unique() {
        let mut kinds: Vec<_> = WATCHED_KINDS.iter().map(|k| k.kind).collect();
        let mut resources: Vec<_> = WATCHED_KINDS.iter().map(|k| (k.group, k.plural)).collect();
        kinds.sort();
        kinds.dedup();
        resources.sort();
        resources.dedup();
        assert_eq!(kinds.len(), WATCHED_KINDS.len());
        assert_eq!(resources.len(), WATCHED_KINDS.len());
    }
}
