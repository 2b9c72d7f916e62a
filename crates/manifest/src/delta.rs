//! [`InventoryDelta`]: what changed between two views of the objects, as the engine takes it
//! (objects to set, keys to remove).
//!
//! The node agent feeds the engine deltas, never whole inventories: a cluster's
//! [`crate::ClusterSet`] assembles again only the objects an event touched
//! ([`crate::ClusterSet::take_delta`]), so one pod event costs work for one pod, not for the
//! cluster. Manifest files change rarely and are re-read whole; [`InventoryDelta::between`]
//! turns two of their inventories into the same shape.
//!
//! An object in a delta may equal what the engine already holds (the engine ignores it): a
//! delta says what may have changed, and is exact about what was removed.

use std::collections::BTreeSet;
use std::sync::Arc;

use netwarden_engine::{
    AdminPolicy, AdminRef, Namespace, Node, ObjectKey, Pod, PodKey, Policy, PolicyRef, Service,
};

use crate::Inventory;

/// Objects to set and keys to remove, per kind of the engine's model.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct InventoryDelta {
    pub namespaces: Vec<Namespace>,
    pub namespaces_removed: Vec<String>,
    /// Shared with the [`crate::ClusterSet`] that made the delta (the engine keeps them as
    /// they are): the agent holds each pod and policy once.
    pub pods: Vec<Arc<Pod>>,
    pub pods_removed: Vec<PodKey>,
    pub policies: Vec<Arc<Policy>>,
    pub policies_removed: Vec<PolicyRef>,
    /// Admin policies (SPEC 8), shared like policies.
    pub admin_policies: Vec<Arc<AdminPolicy>>,
    pub admin_policies_removed: Vec<AdminRef>,
    pub nodes: Vec<Node>,
    /// Node names.
    pub nodes_removed: Vec<String>,
    pub services: Vec<Service>,
    pub services_removed: Vec<ObjectKey>,
}

impl InventoryDelta {
    /// From `previous` (`None`: nothing yet) to `next`: everything in `next` is set, and what
    /// only `previous` has is removed.
    pub fn between(previous: Option<&Inventory>, next: &Inventory) -> InventoryDelta {
        let mut delta = InventoryDelta {
            namespaces: next.namespaces.clone(),
            pods: next.pods.iter().cloned().map(Arc::new).collect(),
            policies: next.policies.iter().cloned().map(Arc::new).collect(),
            admin_policies: next.admin_policies.iter().cloned().map(Arc::new).collect(),
            nodes: next.nodes.clone(),
            services: next.services.clone(),
            ..InventoryDelta::default()
        };
        let Some(prev) = previous else {
            return delta;
        };
        let pods: BTreeSet<&PodKey> = next.pods.iter().map(|p| &p.key).collect();
        delta.pods_removed = prev
            .pods
            .iter()
            .filter(|p| !pods.contains(&p.key))
            .map(|p| p.key.clone())
            .collect();
        let policies: BTreeSet<PolicyRef> = next.policies.iter().map(Policy::reference).collect();
        delta.policies_removed = prev
            .policies
            .iter()
            .map(Policy::reference)
            .filter(|r| !policies.contains(r))
            .collect();
        let admin: BTreeSet<AdminRef> = next
            .admin_policies
            .iter()
            .map(AdminPolicy::reference)
            .collect();
        delta.admin_policies_removed = prev
            .admin_policies
            .iter()
            .map(AdminPolicy::reference)
            .filter(|r| !admin.contains(r))
            .collect();
        let nodes: BTreeSet<&String> = next.nodes.iter().map(|n| &n.name).collect();
        delta.nodes_removed = prev
            .nodes
            .iter()
            .filter(|n| !nodes.contains(&n.name))
            .map(|n| n.name.clone())
            .collect();
        let services: BTreeSet<&ObjectKey> = next.services.iter().map(|s| &s.key).collect();
        delta.services_removed = prev
            .services
            .iter()
            .filter(|s| !services.contains(&s.key))
            .map(|s| s.key.clone())
            .collect();
        let namespaces: BTreeSet<&String> = next.namespaces.iter().map(|n| &n.name).collect();
        delta.namespaces_removed = prev
            .namespaces
            .iter()
            .filter(|n| !namespaces.contains(&n.name))
            .map(|n| n.name.clone())
            .collect();
        delta
    }

    pub fn is_empty(&self) -> bool {
        *self == InventoryDelta::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_str, LoadOptions};

    const BEFORE: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {app: a}}
status: {podIPs: [{ip: 10.0.0.1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: x}
status: {podIPs: [{ip: 10.0.0.2}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec: {podSelector: {}}
"#;

    const AFTER: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: z, labels: {app: a}}
status: {podIPs: [{ip: 10.0.0.1}]}
"#;

    #[test]
    fn what_only_the_previous_view_has_is_removed() {
        let opts = LoadOptions::default();
        let before = parse_str("f", BEFORE, &opts);
        let after = parse_str("f", AFTER, &opts);
        let first = InventoryDelta::between(None, &before);
        assert_eq!(first.pods.len(), 2);
        assert!(first.pods_removed.is_empty());
        let delta = InventoryDelta::between(Some(&before), &after);
        let pods: Vec<Pod> = delta.pods.iter().map(|p| Pod::clone(p)).collect();
        assert_eq!(pods, after.pods);
        let removed: Vec<String> = delta.pods_removed.iter().map(|k| k.to_string()).collect();
        assert_eq!(removed, ["x/a", "x/b"]);
        assert_eq!(delta.policies_removed.len(), 1);
        assert_eq!(delta.namespaces_removed, ["x"]);
        assert_eq!(delta.namespaces.len(), 1);
        assert!(InventoryDelta::between(Some(&after), &after)
            .pods_removed
            .is_empty());
    }
}
