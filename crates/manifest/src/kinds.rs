//! The kinds netwarden reads, the apiVersions it accepts for each, and how a near miss (a
//! misspelled kind, a wrong or missing apiVersion) is told apart from somebody else's object.
//!
//! A near miss is an error and the object is not read: the author meant one of our kinds, and a
//! policy that silently does not apply is the worst outcome. Objects of other projects stay
//! silently ignored, even when they share a kind name (Calico's `NetworkPolicy`, Knative's
//! `Service`): what decides is the apiVersion's group.
//!
//! - A kind we read, with an apiVersion we accept: read.
//! - A kind we read with an apiVersion that is missing, not a string, or whose group is one we
//!   read, a near spelling of one (edit distance at most 2), or a legacy home of that kind
//!   (`extensions` for NetworkPolicy): a near miss on `apiVersion`.
//! - Any other kind similar to one we read (same letters in another case, a plural, or within
//!   edit distance 2 — 1 for names of at most 4 letters, so that `Node` or `Job` never pass for
//!   `Pod`), unless its group is clearly another project's: a near miss on `kind`, naming the
//!   kind it resembles.
//! - Everything else (Deployments, ConfigMaps, CRDs of other projects): not ours, ignored.

use serde_json::Value;

use crate::ctx::type_name;
use crate::validate;

/// One kind netwarden reads.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct KindSpec {
    pub kind: &'static str,
    /// `""` for the core group (apiVersion `v1`).
    pub group: &'static str,
    pub versions: &'static [&'static str],
    /// Whether its objects live in a namespace (Namespaces, Nodes and the admin policies do
    /// not).
    pub namespaced: bool,
}

impl KindSpec {
    fn accepts(&self, api_version: &str) -> bool {
        let (group, version) = split_api_version(api_version);
        group == self.group && self.versions.contains(&version)
    }

    /// The accepted apiVersions as a user writes them: `networking.k8s.io/v1`, or
    /// `k8s.cni.cncf.io/v1beta1 or k8s.cni.cncf.io/v1beta2`.
    pub fn api_versions(&self) -> String {
        self.versions
            .iter()
            .map(|v| {
                if self.group.is_empty() {
                    v.to_string()
                } else {
                    format!("{}/{v}", self.group)
                }
            })
            .collect::<Vec<_>>()
            .join(" or ")
    }
}

/// The kinds read (SPEC 1). `<Kind>List` (as the API returns lists) is read as a List of them.
pub(crate) const KINDS: [KindSpec; 12] = [
    KindSpec {
        kind: "Namespace",
        group: "",
        versions: &["v1"],
        namespaced: false,
    },
    KindSpec {
        kind: "Pod",
        group: "",
        versions: &["v1"],
        namespaced: true,
    },
    KindSpec {
        kind: "DanmEp",
        group: "danm.k8s.io",
        versions: &["v1"],
        namespaced: true,
    },
    KindSpec {
        kind: "NetworkPolicy",
        group: "networking.k8s.io",
        versions: &["v1"],
        namespaced: true,
    },
    KindSpec {
        kind: "DanmNetworkPolicy",
        group: "danm.k8s.io",
        versions: &["v1"],
        namespaced: true,
    },
    KindSpec {
        kind: "MultiNetworkPolicy",
        group: "k8s.cni.cncf.io",
        versions: &["v1beta1", "v1beta2"],
        namespaced: true,
    },
    KindSpec {
        kind: "Service",
        group: "",
        versions: &["v1"],
        namespaced: true,
    },
    KindSpec {
        kind: "EndpointSlice",
        group: "discovery.k8s.io",
        versions: &["v1"],
        namespaced: true,
    },
    KindSpec {
        kind: "Node",
        group: "",
        versions: &["v1"],
        namespaced: false,
    },
    KindSpec {
        kind: "ClusterNetworkPolicy",
        group: "policy.networking.k8s.io",
        versions: &["v1alpha2"],
        namespaced: false,
    },
    KindSpec {
        kind: "AdminNetworkPolicy",
        group: "policy.networking.k8s.io",
        versions: &["v1alpha1"],
        namespaced: false,
    },
    KindSpec {
        kind: "BaselineAdminNetworkPolicy",
        group: "policy.networking.k8s.io",
        versions: &["v1alpha1"],
        namespaced: false,
    },
];

/// Other kinds of the groups we read (and of the core group). One of them is never a typo of
/// ours, and a typo closer to one of them than to ours is not ours either (`DanmNet` is two
/// edits from `DanmEp`).
const SIBLING_KINDS: &[&str] = &[
    // core/v1
    "Binding",
    "ComponentStatus",
    "ConfigMap",
    "Endpoints",
    "Event",
    "LimitRange",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "PodTemplate",
    "ReplicationController",
    "ResourceQuota",
    "Secret",
    "ServiceAccount",
    "Status",
    // networking.k8s.io
    "ClusterCIDR",
    "IPAddress",
    "Ingress",
    "IngressClass",
    "ServiceCIDR",
    // danm.k8s.io
    "ClusterNetwork",
    "DanmNet",
    "TenantConfig",
    "TenantNetwork",
    // k8s.cni.cncf.io
    "IPAMClaim",
    "NetworkAttachmentDefinition",
];

/// Groups that once served one of our kinds: an object there is ours, written for an API
/// that no longer exists.
const LEGACY_GROUPS: [(&str, &str); 1] = [("NetworkPolicy", "extensions")];

/// The apiVersion of an object as found: its own, or the one of the typed List holding it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ApiVersion<'a> {
    Missing,
    NotAString(&'a Value),
    Written(&'a str),
}

/// What an object's kind and apiVersion say about it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Resolved {
    /// A kind netwarden reads, under an apiVersion it accepts.
    Ours(&'static KindSpec),
    /// Somebody else's kind: ignored without a word.
    NotOurs,
    /// Meant as one of ours but not readable as it stands: an error on `field`.
    NearMiss { field: &'static str, reason: String },
}

/// `(group, version)`; the core group is `""`.
fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.rsplit_once('/').unwrap_or(("", api_version))
}

pub(crate) fn spec(kind: &str) -> Option<&'static KindSpec> {
    KINDS.iter().find(|k| k.kind == kind)
}

pub(crate) fn resolve(kind: &str, api_version: ApiVersion<'_>) -> Resolved {
    match spec(kind) {
        Some(spec) => resolve_version(spec, api_version),
        None => resolve_unknown(kind, api_version),
    }
}

fn resolve_version(spec: &'static KindSpec, api_version: ApiVersion<'_>) -> Resolved {
    let expected = spec.api_versions();
    let reason = match api_version {
        ApiVersion::Written(v) if spec.accepts(v) => return Resolved::Ours(spec),
        ApiVersion::Written(v) => {
            let (group, _) = split_api_version(v);
            if !group_is_ours(group, spec.kind) {
                return Resolved::NotOurs;
            }
            format!(
                "{} is {expected}, not \"{}\"; object ignored",
                spec.kind,
                validate::shorten(v)
            )
        }
        ApiVersion::Missing => {
            format!(
                "missing apiVersion ({} is {expected}); object ignored",
                spec.kind
            )
        }
        ApiVersion::NotAString(v) => format!(
            "expected a string ({} is {expected}), found {}; object ignored",
            spec.kind,
            type_name(v)
        ),
    };
    Resolved::NearMiss {
        field: "apiVersion",
        reason,
    }
}

fn resolve_unknown(kind: &str, api_version: ApiVersion<'_>) -> Resolved {
    let foreign = match api_version {
        ApiVersion::Written(v) => {
            let (group, _) = split_api_version(v);
            !KINDS.iter().any(|k| group_is_ours(group, k.kind))
        }
        ApiVersion::Missing | ApiVersion::NotAString(_) => false,
    };
    if foreign {
        return Resolved::NotOurs;
    }
    let suggestion = match similar_kind(kind) {
        Some(spec) => (spec.kind.to_string(), spec.api_versions()),
        None => match kind.strip_suffix("List").and_then(similar_kind) {
            Some(spec) => (format!("{}List", spec.kind), spec.api_versions()),
            None => return Resolved::NotOurs,
        },
    };
    Resolved::NearMiss {
        field: "kind",
        reason: format!(
            "unknown kind \"{}\": did you mean {} ({})? object ignored",
            validate::shorten(kind),
            suggestion.0,
            suggestion.1
        ),
    }
}

/// Whether an apiVersion group means one of our objects was intended for `kind`: no group at
/// all, a group we read (a NetworkPolicy under `danm.k8s.io` is a mix-up, not a CRD), a near
/// spelling of one, or a legacy home of the kind.
fn group_is_ours(group: &str, kind: &str) -> bool {
    if group.is_empty() || group.eq_ignore_ascii_case("core") {
        return true;
    }
    if LEGACY_GROUPS.contains(&(kind, group)) {
        return true;
    }
    KINDS.iter().filter(|k| !k.group.is_empty()).any(|k| {
        k.group == group
            || (group.len().abs_diff(k.group.len()) <= 2
                && edit_distance(&group.to_ascii_lowercase(), k.group) <= 2)
    })
}

/// The kind we read that `kind` most resembles, if any (see the module doc for the rule);
/// `None` when it resembles another kind of our groups at least as much.
pub(crate) fn similar_kind(kind: &str) -> Option<&'static KindSpec> {
    let written = kind.to_ascii_lowercase();
    let (distance, spec) = KINDS
        .iter()
        .filter_map(|spec| similarity(&written, spec.kind).map(|d| (d, spec)))
        .min_by_key(|(d, _)| *d)?;
    let sibling = SIBLING_KINDS
        .iter()
        .filter_map(|k| similarity(&written, k))
        .min();
    match sibling {
        Some(s) if s <= distance => None,
        _ => Some(spec),
    }
}

/// A distance when `written` (lower case) resembles `known`, else `None`.
fn similarity(written: &str, known: &str) -> Option<usize> {
    let known = known.to_ascii_lowercase();
    if written == known {
        return Some(0);
    }
    let plural = written.strip_suffix('s').is_some_and(|w| w == known)
        || written.strip_suffix("es").is_some_and(|w| w == known)
        || (known.ends_with('y') && written.strip_suffix("ies") == Some(&known[..known.len() - 1]));
    if plural {
        return Some(1);
    }
    let limit = if known.len() <= 4 { 1 } else { 2 };
    if written.len().abs_diff(known.len()) > limit {
        return None;
    }
    let d = edit_distance(written, &known);
    (d <= limit).then_some(d)
}

/// Optimal string alignment distance (Levenshtein plus transposition of neighbours) over bytes.
/// Callers bound the lengths, so the quadratic table stays tiny.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev2 = vec![0usize; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0usize; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(prev2[j - 2] + 1);
            }
            cur[j] = d;
        }
        std::mem::swap(&mut prev2, &mut prev);
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(v: &str) -> ApiVersion<'_> {
        ApiVersion::Written(v)
    }

    fn near_miss(kind: &str, api_version: ApiVersion<'_>) -> (&'static str, String) {
        match resolve(kind, api_version) {
            Resolved::NearMiss { field, reason } => (field, reason),
            other => panic!("{kind} {api_version:?}: {other:?}"),
        }
    }

    #[test]
    fn distances() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("pod", ""), 3);
        assert_eq!(edit_distance("networkpolicy", "netwrokpolicy"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("danmep", "danmnet"), 2);
        assert_eq!(edit_distance("networking.k8s.oi", "networking.k8s.io"), 1);
    }

    #[test]
    fn every_kind_reads_under_its_api_versions() {
        for spec in &KINDS {
            for version in spec.versions {
                let v = if spec.group.is_empty() {
                    version.to_string()
                } else {
                    format!("{}/{version}", spec.group)
                };
                assert_eq!(resolve(spec.kind, written(&v)), Resolved::Ours(spec));
            }
        }
    }

    #[test]
    fn misspelled_kinds_name_the_intended_one() {
        let cases = [
            ("Networkpolicy", "networking.k8s.io/v1", "NetworkPolicy"),
            ("NetworkPolicies", "networking.k8s.io/v1", "NetworkPolicy"),
            ("networkpolicy", "networking.k8s.io/v1", "NetworkPolicy"),
            ("NetworkPolicys", "networking.k8s.io/v1", "NetworkPolicy"),
            ("NetwrokPolicy", "networking.k8s.io/v1", "NetworkPolicy"),
            ("DanmNetworkpolicy", "danm.k8s.io/v1", "DanmNetworkPolicy"),
            (
                "MultiNetworkPolicies",
                "k8s.cni.cncf.io/v1beta1",
                "MultiNetworkPolicy",
            ),
            ("pod", "v1", "Pod"),
            ("Pods", "v1", "Pod"),
            ("Namepsace", "v1", "Namespace"),
            ("Services", "v1", "Service"),
            ("EndpointSlices", "discovery.k8s.io/v1", "EndpointSlice"),
            ("DanmEP", "danm.k8s.io/v1", "DanmEp"),
            (
                "NetworkpolicyList",
                "networking.k8s.io/v1",
                "NetworkPolicyList",
            ),
        ];
        for (kind, version, intended) in cases {
            let (field, reason) = near_miss(kind, written(version));
            assert_eq!(field, "kind", "{kind}");
            assert!(
                reason.contains(&format!("did you mean {intended} (")),
                "{kind}: {reason}"
            );
        }
        // Without an apiVersion the kind alone decides.
        let (field, reason) = near_miss("Networkpolicy", ApiVersion::Missing);
        assert_eq!(field, "kind");
        assert!(reason.contains("networking.k8s.io/v1"), "{reason}");
    }

    #[test]
    fn wrong_api_versions_of_our_kinds() {
        let cases = [
            ("NetworkPolicy", "networking.k8s.io/v2"),
            ("NetworkPolicy", "networking.k8s.io/v1beta1"),
            ("NetworkPolicy", "extensions/v1beta1"),
            ("NetworkPolicy", "networking.k8s.oi/v1"),
            ("NetworkPolicy", "v1"),
            ("NetworkPolicy", "danm.k8s.io/v1"),
            ("DanmNetworkPolicy", "danm.k8s.io/v2"),
            ("DanmEp", "danm.k8s.io/v2"),
            ("MultiNetworkPolicy", "k8s.cni.cncf.io/v1"),
            ("Pod", "v2"),
            ("Pod", "core/v1"),
            ("Service", "v1beta1"),
            ("EndpointSlice", "discovery.k8s.io/v1beta1"),
            ("Namespace", "networking.k8s.io/v1"),
        ];
        for (kind, version) in cases {
            let (field, reason) = near_miss(kind, written(version));
            assert_eq!(field, "apiVersion", "{kind} {version}");
            assert!(reason.contains("object ignored"), "{reason}");
        }
        let (_, reason) = near_miss("MultiNetworkPolicy", written("k8s.cni.cncf.io/v2"));
        assert!(
            reason.contains("k8s.cni.cncf.io/v1beta1 or k8s.cni.cncf.io/v1beta2"),
            "{reason}"
        );
        let (field, reason) = near_miss("NetworkPolicy", ApiVersion::Missing);
        assert_eq!(field, "apiVersion");
        assert!(reason.starts_with("missing apiVersion"), "{reason}");
        let n = Value::from(1);
        let (field, reason) = near_miss("Pod", ApiVersion::NotAString(&n));
        assert_eq!(field, "apiVersion");
        assert!(reason.contains("found a number"), "{reason}");
    }

    #[test]
    fn other_projects_objects_are_not_ours() {
        let cases = [
            // Same kind name, another project's group.
            ("NetworkPolicy", "crd.projectcalico.org/v1"),
            ("NetworkPolicy", "projectcalico.org/v3"),
            ("GlobalNetworkPolicy", "crd.projectcalico.org/v1"),
            ("Service", "serving.knative.dev/v1"),
            ("CiliumNetworkPolicy", "cilium.io/v2"),
            // Other projects' admin policies, whatever their kind.
            ("AdminNetworkPolicy", "crd.antrea.io/v1beta1"),
            // A near spelling of ours, in another project's group.
            ("NetworkPolicies", "crd.projectcalico.org/v1"),
            ("Pods", "metrics.k8s.io/v1beta1"),
            // Real kinds of the groups we read, close to ours or not.
            ("Endpoints", "v1"),
            ("Secret", "v1"),
            ("ServiceAccount", "v1"),
            ("PodTemplate", "v1"),
            ("ConfigMap", "v1"),
            ("Event", "v1"),
            ("ReplicationController", "v1"),
            ("Ingress", "networking.k8s.io/v1"),
            ("IngressClass", "networking.k8s.io/v1"),
            ("ServiceCIDR", "networking.k8s.io/v1"),
            ("IPAddress", "networking.k8s.io/v1"),
            ("DanmNet", "danm.k8s.io/v1"),
            ("ClusterNetwork", "danm.k8s.io/v1"),
            ("TenantNetwork", "danm.k8s.io/v1"),
            ("TenantConfig", "danm.k8s.io/v1"),
            ("NetworkAttachmentDefinition", "k8s.cni.cncf.io/v1"),
            ("IPAMClaim", "k8s.cni.cncf.io/v1alpha1"),
            // Everyday kinds.
            ("Deployment", "apps/v1"),
            ("Job", "batch/v1"),
            ("Role", "rbac.authorization.k8s.io/v1"),
            ("PodDisruptionBudget", "policy/v1"),
            ("PodSecurityPolicy", "policy/v1beta1"),
        ];
        for (kind, version) in cases {
            assert_eq!(
                resolve(kind, written(version)),
                Resolved::NotOurs,
                "{kind} {version}"
            );
        }
        // Short names need a closer match: Job is not a typo of Pod, nor Node (read itself).
        assert_eq!(similar_kind("node").map(|k| k.kind), Some("Node"));
        // A name closer to another kind of our groups is that kind's typo, not ours.
        assert_eq!(similar_kind("DanmNets"), None);
        assert_eq!(similar_kind("Secrets"), None);
        assert_eq!(similar_kind("job"), None);
        assert_eq!(similar_kind("pdo").map(|k| k.kind), Some("Pod"));
    }

    #[test]
    fn hostile_kinds_stay_cheap_and_quiet() {
        let long = "N".repeat(100_000);
        assert_eq!(resolve(&long, ApiVersion::Missing), Resolved::NotOurs);
        assert_eq!(similar_kind("ü"), None);
        assert_eq!(similar_kind(""), None);
    }
}
