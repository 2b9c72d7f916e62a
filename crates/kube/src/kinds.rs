//! The Kubernetes resources the node agent reads and writes, in one place: the watchers take
//! their kinds from [`WATCHED_KINDS`], and the ClusterRole in `deploy/rbac.yaml` is tested
//! (`crates/netwarden/tests/deploy.rs`) to grant exactly [`WATCH_VERBS`] on these and
//! [`EVENT_VERBS`] on [`EVENT_RESOURCES`] — so a watcher added here without its permission (or
//! a permission nobody uses) fails CI instead of a cluster install.
//!
//! Plain data, no kube or k8s-openapi types: the watchers build their `ApiResource`s from it,
//! the deploy tests compare it with YAML.

/// One kind the agent watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchedKind {
    /// API group (`""` for the core group).
    pub group: &'static str,
    /// Versions read, in order of preference (the first one the cluster serves is watched).
    pub versions: &'static [&'static str],
    pub kind: &'static str,
    pub plural: &'static str,
    pub namespaced: bool,
    /// A CRD that may not be installed: skipped (with one warning) until it is.
    pub optional: bool,
}

impl WatchedKind {
    /// `group/version` (or `version` for the core group).
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }
}

/// Every kind `run --kube` watches (issue 8, item 1).
pub const WATCHED_KINDS: &[WatchedKind] = &[
    WatchedKind {
        group: "",
        versions: &["v1"],
        kind: "Namespace",
        plural: "namespaces",
        namespaced: false,
        optional: false,
    },
    WatchedKind {
        group: "",
        versions: &["v1"],
        kind: "Pod",
        plural: "pods",
        namespaced: true,
        optional: false,
    },
    WatchedKind {
        group: "networking.k8s.io",
        versions: &["v1"],
        kind: "NetworkPolicy",
        plural: "networkpolicies",
        namespaced: true,
        optional: false,
    },
    WatchedKind {
        group: "danm.k8s.io",
        versions: &["v1"],
        kind: "DanmNetworkPolicy",
        plural: "danmnetworkpolicies",
        namespaced: true,
        optional: true,
    },
    WatchedKind {
        group: "k8s.cni.cncf.io",
        versions: &["v1beta2", "v1beta1"],
        kind: "MultiNetworkPolicy",
        plural: "multi-networkpolicies",
        namespaced: true,
        optional: true,
    },
    WatchedKind {
        group: "danm.k8s.io",
        versions: &["v1"],
        kind: "DanmEp",
        plural: "danmeps",
        namespaced: true,
        optional: true,
    },
    WatchedKind {
        group: "",
        versions: &["v1"],
        kind: "Service",
        plural: "services",
        namespaced: true,
        optional: false,
    },
    WatchedKind {
        group: "discovery.k8s.io",
        versions: &["v1"],
        kind: "EndpointSlice",
        plural: "endpointslices",
        namespaced: true,
        optional: false,
    },
    // Admin policies (SPEC 8): sigs.k8s.io/network-policy-api's CRDs, installed by the cluster
    // (v1alpha2, v1alpha1, or both side by side), and the Nodes their `nodes` peers select.
    WatchedKind {
        group: "policy.networking.k8s.io",
        versions: &["v1alpha2"],
        kind: "ClusterNetworkPolicy",
        plural: "clusternetworkpolicies",
        namespaced: false,
        optional: true,
    },
    WatchedKind {
        group: "policy.networking.k8s.io",
        versions: &["v1alpha1"],
        kind: "AdminNetworkPolicy",
        plural: "adminnetworkpolicies",
        namespaced: false,
        optional: true,
    },
    WatchedKind {
        group: "policy.networking.k8s.io",
        versions: &["v1alpha1"],
        kind: "BaselineAdminNetworkPolicy",
        plural: "baselineadminnetworkpolicies",
        namespaced: false,
        optional: true,
    },
    WatchedKind {
        group: "",
        versions: &["v1"],
        kind: "Node",
        plural: "nodes",
        namespaced: false,
        optional: false,
    },
];

/// The kinds watched with `network_policy` on or off (`--no-network-policy`).
pub fn watched(network_policy: bool) -> impl Iterator<Item = &'static WatchedKind> {
    WATCHED_KINDS
        .iter()
        .filter(move |k| network_policy || k.kind != "NetworkPolicy")
}

/// What the agent may do with a watched kind: read it, never change it.
pub const WATCH_VERBS: [&str; 3] = ["get", "list", "watch"];

/// Where the agent writes Kubernetes Events, as `(group, plural)`: `events.k8s.io/v1` only
/// (`crate::events` creates them there, `regarding` the policy).
pub const EVENT_RESOURCES: [(&str, &str); 1] = [("events.k8s.io", "events")];

/// Each Event is created once under a name every node computes alike (`crate::events`): never
/// patched, so `create` is all it takes.
pub const EVENT_VERBS: [&str; 1] = ["create"];

/// The watched kind named `kind`, if any.
pub fn by_kind(kind: &str) -> Option<&'static WatchedKind> {
    WATCHED_KINDS.iter().find(|k| k.kind == kind)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(by_kind("Deployment").is_none());
    }

    #[test]
    fn network_policies_can_be_left_out() {
        assert_eq!(watched(true).count(), WATCHED_KINDS.len());
        assert!(watched(false).all(|k| k.kind != "NetworkPolicy"));
        assert_eq!(watched(false).count(), WATCHED_KINDS.len() - 1);
    }

    #[test]
    fn api_versions() {
        let mnp = WATCHED_KINDS
            .iter()
            .find(|k| k.kind == "MultiNetworkPolicy")
            .unwrap();
        assert_eq!(mnp.api_version(mnp.versions[0]), "k8s.cni.cncf.io/v1beta2");
        assert_eq!(WATCHED_KINDS[0].api_version("v1"), "v1");
    }
}
