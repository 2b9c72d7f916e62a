//! The kinds the node agent watches, with what the API needs to serve them.
//!
//! The same shape as the `WATCHED_KINDS` of `netwarden crd` (deploy branch), so both can be
//! unified into one constant: the RBAC rules and the watchers then come from one list.

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
];

/// The kinds watched with `network_policy` on or off (`--no-network-policy`).
pub fn watched(network_policy: bool) -> impl Iterator<Item = &'static WatchedKind> {
    WATCHED_KINDS
        .iter()
        .filter(move |k| network_policy || k.kind != "NetworkPolicy")
}

#[cfg(test)]
mod tests {
    use super::*;

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
