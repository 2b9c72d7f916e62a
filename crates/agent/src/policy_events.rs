//! Which Kubernetes Events the agent wants on policy objects (issue 8, item 4): a policy with a
//! load error (`InvalidPolicy`) or one that selects no pod anywhere in the cluster
//! (`SelectsNoPods`). A pure function of what the agent already holds — the current problems,
//! the engine's policies and pods (every pod of the cluster: remote pods are peers, so the
//! engine has them all) and the policies' identities from the watchers; writing them, once per
//! cluster, is [`netwarden_kube::events`]' job.

use std::collections::BTreeMap;

use netwarden_engine::{selects, Engine, Pod};
use netwarden_kube::{EventReason, PolicyEvent, PolicyObject};
use netwarden_manifest::{ClusterKey, Problem, Severity};

/// The note of a `SelectsNoPods` Event: names the field, holds no object text.
pub const SELECTS_NO_PODS_NOTE: &str =
    "spec.podSelector: selects no pod in the cluster (hostNetwork pods are never selected): the policy has no effect";

/// The namespaced kinds Events are written about.
const POLICY_KINDS: [&str; 3] = ["NetworkPolicy", "DanmNetworkPolicy", "MultiNetworkPolicy"];

/// The cluster-scoped kinds (SPEC 8) Events are written about (their problems name the object
/// by name alone).
const ADMIN_POLICY_KINDS: [&str; 3] = [
    "AdminNetworkPolicy",
    "BaselineAdminNetworkPolicy",
    "ClusterNetworkPolicy",
];

/// The Events wanted now, sorted. A policy whose identity the watchers do not hold
/// (`identity` answers `None`: it cannot be referenced) gets none. Several errors of one
/// policy make one Event, their lines joined (problem lines already escape object text).
/// Cheap enough to ask after every change: one selector scan per policy, stopping at the first
/// pod selected.
///
/// `unplaced` are pods that exist but that the engine does not hold: local pods refused for
/// now (their netns cannot be read). They still count as selected, or a policy selecting only
/// them would be reported as selecting nothing.
pub fn wanted_events(
    problems: &[Problem],
    engine: &Engine,
    unplaced: &[&Pod],
    identity: &dyn Fn(&ClusterKey) -> Option<PolicyObject>,
) -> Vec<PolicyEvent> {
    let mut notes: BTreeMap<(ClusterKey, EventReason), Vec<String>> = BTreeMap::new();
    for problem in problems.iter().filter(|p| p.severity == Severity::Error) {
        let kind = problem.kind.as_str();
        let (namespace, name) = if POLICY_KINDS.contains(&kind) {
            let Some(split) = problem.object.split_once('/') else {
                continue;
            };
            split
        } else if ADMIN_POLICY_KINDS.contains(&kind) {
            ("", problem.object.as_str())
        } else {
            continue;
        };
        let key = ClusterKey::new(&problem.kind, namespace, name);
        let line = match problem.field.is_empty() {
            true => problem.reason.clone(),
            false => format!("{}: {}", problem.field, problem.reason),
        };
        notes
            .entry((key, EventReason::InvalidPolicy))
            .or_default()
            .push(line);
    }
    for policy in engine.policies() {
        if !engine.selects_any_pod(policy) && !unplaced.iter().any(|pod| selects(policy, pod)) {
            let key = ClusterKey::new(
                policy.kind.as_str(),
                &policy.key.namespace,
                &policy.key.name,
            );
            notes
                .entry((key, EventReason::SelectsNoPods))
                .or_default()
                .push(SELECTS_NO_PODS_NOTE.to_string());
        }
    }
    notes
        .into_iter()
        .filter_map(|((key, reason), mut lines)| {
            lines.sort();
            lines.dedup();
            Some(PolicyEvent {
                policy: identity(&key)?,
                reason,
                note: lines.join("; "),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Locality;
    use netwarden_engine::EngineOptions;
    use netwarden_manifest::{parse_str, InventoryDelta, LoadOptions};

    const OBJECTS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: ns, labels: {app: web}}
spec: {nodeName: n2, containers: [{name: c, image: x}]}
status: {podIP: 10.0.0.1, podIPs: [{ip: 10.0.0.1}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-in, namespace: ns}
spec: {podSelector: {matchLabels: {app: web}}, policyTypes: [Ingress]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: nobody, namespace: ns}
spec: {podSelector: {matchLabels: {app: nobody}}, policyTypes: [Ingress]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: broken, namespace: ns}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: [{from: [{ipBlock: {cidr: "10.0.0.0/99"}}]}]
"#;

    fn identity(name: &str) -> (ClusterKey, PolicyObject) {
        let key = ClusterKey::new("NetworkPolicy", "ns", name);
        let object = PolicyObject {
            key: key.clone(),
            api_version: "networking.k8s.io/v1".into(),
            uid: format!("uid-{name}"),
            generation: 1,
        };
        (key, object)
    }

    /// An admin policy (cluster-scoped) with a load error wants its `InvalidPolicy` Event
    /// too, its problems naming it by name alone.
    #[test]
    fn an_invalid_admin_policy_wants_an_event() {
        let text = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata: {name: default}
spec:
  subject: {namespaces: {}}
  egress:
  - {name: pass, action: Pass, to: [{networks: [10.0.0.0/8]}]}
"#;
        let inventory = parse_str("cluster", text, &LoadOptions::default());
        let engine = Engine::new(EngineOptions::default());
        let key = ClusterKey::new("BaselineAdminNetworkPolicy", "", "default");
        let object = PolicyObject {
            key: key.clone(),
            api_version: "policy.networking.k8s.io/v1alpha1".into(),
            uid: "uid-default".into(),
            generation: 1,
        };
        let known = |k: &ClusterKey| (*k == key).then(|| object.clone());
        let wanted = wanted_events(&inventory.problems, &engine, &[], &known);
        assert_eq!(wanted.len(), 1, "{wanted:#?}");
        assert_eq!(wanted[0].reason, EventReason::InvalidPolicy);
        assert_eq!(wanted[0].policy.key, key);
        assert!(
            wanted[0].note.contains("spec.egress[0]"),
            "{}",
            wanted[0].note
        );
    }

    #[test]
    fn invalid_and_empty_policies_want_one_event_each() {
        let inventory = parse_str("cluster", OBJECTS, &LoadOptions::default());
        let mut engine = Engine::new(EngineOptions::default());
        crate::agent::apply_delta(
            &mut engine,
            InventoryDelta::between(None, &inventory),
            // Every pod remote: set as a peer (local pods wait for their netns).
            &Locality::Node("another-node".into()),
            &mut BTreeMap::new(),
        );
        let identities: BTreeMap<_, _> = ["web-in", "nobody", "broken"]
            .into_iter()
            .map(identity)
            .collect();
        let known = |key: &ClusterKey| identities.get(key).cloned();
        let wanted = wanted_events(&inventory.problems, &engine, &[], &known);
        let got: Vec<(&str, EventReason)> = wanted
            .iter()
            .map(|e| (e.policy.key.name.as_str(), e.reason))
            .collect();
        assert_eq!(
            got,
            [
                ("broken", EventReason::InvalidPolicy),
                ("nobody", EventReason::SelectsNoPods)
            ],
            "{wanted:#?}"
        );
        assert!(
            wanted[0]
                .note
                .starts_with("spec.ingress[0].from[0].ipBlock.cidr: "),
            "{}",
            wanted[0].note
        );
        assert_eq!(wanted[1].note, SELECTS_NO_PODS_NOTE);
        // Without an identity, no Event (nothing to reference).
        assert!(wanted_events(&inventory.problems, &engine, &[], &|_| None).is_empty());
        // A pod the engine does not hold yet (refused for now) is still selected.
        let mut nobody = netwarden_engine::testing::pod("ns", "x", &[("app", "nobody")], &[]);
        nobody.node_name = Some("n1".into());
        let wanted = wanted_events(&inventory.problems, &engine, &[&nobody], &known);
        assert_eq!(wanted.len(), 1, "only the invalid policy: {wanted:#?}");
    }
}
