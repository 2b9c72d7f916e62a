//! The CustomResourceDefinitions netwarden serves (`netwarden crd`, checked in as
//! `deploy/crds.yaml`): DanmNetworkPolicy (danm.k8s.io/v1, SPEC 1) and MultiNetworkPolicy
//! (k8s.cni.cncf.io, the Multus API, v1beta1 and v1beta2).
//!
//! The schemas are derived from the Rust types below (kube's `CustomResource` derive, schemars),
//! so the CRD, the typed objects and their documentation cannot drift apart. The derive makes the
//! schema structural, as the API server requires: subschemas inlined (no `$ref`), `nullable` for
//! optional fields, `x-kubernetes-int-or-string` for ports. Every field the manifest loader reads
//! is in the schema: the API server prunes fields a structural schema does not know, and a
//! pruned peer or port would silently change what a policy allows.
//!
//! The specs are shaped like `networking.k8s.io/v1` NetworkPolicySpec (Kubernetes 1.37:
//! `podSelector` optional, `endPort`), with `networkSelector` added to DanmNetworkPolicy peers.
//! The values Kubernetes validates for NetworkPolicy are enums in the schema too
//! ([`restrict_values`]: policy types, selector operators, protocols), so the API server refuses a
//! policy netwarden could not read instead of storing it (issue 20, defect 5); whatever gets past
//! it anyway (an older CRD, files) the loader reports with its field and enforces fail-closed.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSON,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::crd::merge_crds;
use kube::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The command that writes `deploy/crds.yaml`; named in the file's header and in the test that
/// catches drift.
pub const REGENERATE: &str = "cargo run -p netwarden -- crd > deploy/crds.yaml";

/// The MultiNetworkPolicy version the API server stores (the newest; v1beta1 stays served).
pub const MULTI_STORAGE_VERSION: &str = "v1beta2";

/// A port (and protocol) a rule allows, as in NetworkPolicyPort.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyPort {
    /// TCP, UDP or SCTP; TCP when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// A port number, or the name of a container port of the selected pods; every port when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<IntOrString>,
    /// With a numeric `port`: the range `port`..=`endPort` is allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_port: Option<i32>,
}

/// An IP range a rule allows, as in NetworkPolicy's IPBlock.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct IpBlock {
    /// The range, e.g. `10.0.0.0/16` or `2001:db8::/64`.
    pub cidr: String,
    /// Ranges inside `cidr` that are not allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub except: Option<Vec<String>>,
}

/// One network a DanmNetworkPolicy peer is restricted to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NetworkSelector {
    /// The network's name: a DanmNet, TenantNetwork or ClusterNetwork name, or for
    /// NetworkAttachmentDefinition `ns/name` or a name in the policy's namespace.
    pub name: String,
    /// DanmNet, TenantNetwork, ClusterNetwork, or NetworkAttachmentDefinition (alias NAD).
    #[serde(rename = "type", default = "default_network_type")]
    pub network_type: String,
}

fn default_network_type() -> String {
    "DanmNet".to_string()
}

/// A peer of a DanmNetworkPolicy rule: NetworkPolicyPeer plus `networkSelector`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DanmPeer {
    /// Pods (in the policy's namespace, or in the namespaces `namespaceSelector` selects).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// Namespaces whose pods are peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// An IP range; then no other field may be set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_block: Option<IpBlock>,
    /// Only the peers' addresses on these networks (every network when absent); with no other
    /// field, every pod's address on these networks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_selector: Option<Vec<NetworkSelector>>,
}

/// A peer of a MultiNetworkPolicy rule, as in NetworkPolicyPeer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MultiPeer {
    /// Pods (in the policy's namespace, or in the namespaces `namespaceSelector` selects).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// Namespaces whose pods are peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// An IP range; then no other field may be set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_block: Option<IpBlock>,
}

/// Traffic a policy lets into the pods it selects: from any of `from`, to any of `ports`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct IngressRule<P> {
    /// Every port when absent or empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<PolicyPort>>,
    /// Every source when absent or empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Vec<P>>,
}

/// Traffic a policy lets out of the pods it selects: to any of `to`, on any of `ports`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EgressRule<P> {
    /// Every port when absent or empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<PolicyPort>>,
    /// Every destination when absent or empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Vec<P>>,
}

/// The fields every policy kind shares with NetworkPolicySpec, on a spec struct that the
/// `CustomResource` derive turns into a kind (the derive needs the fields on the struct itself,
/// so they cannot come from a generic type).
macro_rules! policy_spec {
    ($(#[$attr:meta])* $name:ident, $peer:ty) => {
        #[derive(
            kube::CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize,
            JsonSchema,
        )]
        $(#[$attr])*
        #[serde(rename_all = "camelCase")]
        pub struct $name {
            /// The pods the policy applies to, in its namespace; every pod when absent or empty.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub pod_selector: Option<LabelSelector>,
            /// `Ingress`, `Egress` or both: the directions the selected pods are isolated in.
            /// When absent: Ingress, plus Egress if the policy has egress rules.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub policy_types: Option<Vec<String>>,
            /// Allowed incoming traffic; an isolated direction without rules allows nothing.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub ingress: Option<Vec<IngressRule<$peer>>>,
            /// Allowed outgoing traffic.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub egress: Option<Vec<EgressRule<$peer>>>,
        }
    };
}

policy_spec!(
    #[kube(
        group = "danm.k8s.io",
        version = "v1",
        kind = "DanmNetworkPolicy",
        plural = "danmnetworkpolicies",
        singular = "danmnetworkpolicy",
        shortname = "dnetpol",
        namespaced,
        status = "DanmNetworkPolicyStatus",
        doc = "A NetworkPolicy for every interface of a pod: the same spec, and peers can be \
               restricted to networks (networkSelector). Annotation netwarden.io/mode: monitor \
               logs what it would deny instead of enforcing it.",
        printcolumn(
            name = "Pod-Selector",
            type_ = "string",
            json_path = ".spec.podSelector",
            description = "The pods the policy applies to"
        ),
        printcolumn(
            name = "Policy-Types",
            type_ = "string",
            json_path = ".spec.policyTypes",
            description = "The isolated directions"
        ),
        printcolumn(
            name = "Mode",
            type_ = "string",
            json_path = ".metadata.annotations.netwarden\\.io/mode",
            description = "netwarden.io/mode: enforce (when empty) or monitor"
        ),
        printcolumn(
            name = "Age",
            type_ = "date",
            json_path = ".metadata.creationTimestamp"
        )
    )]
    /// The DanmNetworkPolicy spec: NetworkPolicySpec with `networkSelector` in peers.
    DanmNetworkPolicySpec,
    DanmPeer
);

// The agent reports through Events and does not write this yet (so RBAC grants no
// danmnetworkpolicies/status). The status subresource is declared so that whoever writes it later
// cannot change the spec, and so that `metadata.generation` moves only with the spec.
/// What is known about a DanmNetworkPolicy: conditions (such as whether it is valid) and the
/// generation they describe.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DanmNetworkPolicyStatus {
    /// The `metadata.generation` the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Standard conditions (e.g. whether the policy is valid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}

/// One served MultiNetworkPolicy version. Both versions have the same schema, v1beta2's (with
/// `endPort`): the CRD has no conversion webhook, so an object read through v1beta1 is the
/// stored object pruned to v1beta1's schema, and a v1beta1 schema without `endPort` would turn a
/// port range into its first port.
macro_rules! multi_network_policy {
    ($module:ident, $version:tt) => {
        #[doc = concat!("MultiNetworkPolicy ", $version, ".")]
        pub mod $module {
            use super::*;

            policy_spec!(
                #[kube(
                    group = "k8s.cni.cncf.io",
                    version = $version,
                    kind = "MultiNetworkPolicy",
                    plural = "multi-networkpolicies",
                    singular = "multi-networkpolicy",
                    shortname = "multi-policy",
                    namespaced,
                    doc = "A NetworkPolicy for the secondary networks (NetworkAttachmentDefinitions) \
                           that annotation k8s.v1.cni.cncf.io/policy-for names. Annotation \
                           netwarden.io/mode: monitor logs what it would deny instead of \
                           enforcing it.",
                    printcolumn(
                        name = "Policy-For",
                        type_ = "string",
                        json_path = ".metadata.annotations.k8s\\.v1\\.cni\\.cncf\\.io/policy-for",
                        description = "The networks the policy applies to"
                    ),
                    printcolumn(
                        name = "Pod-Selector",
                        type_ = "string",
                        json_path = ".spec.podSelector",
                        description = "The pods the policy applies to"
                    ),
                    printcolumn(
                        name = "Mode",
                        type_ = "string",
                        json_path = ".metadata.annotations.netwarden\\.io/mode",
                        description = "netwarden.io/mode: enforce (when empty) or monitor"
                    ),
                    printcolumn(
                        name = "Age",
                        type_ = "date",
                        json_path = ".metadata.creationTimestamp"
                    )
                )]
                /// The MultiNetworkPolicy spec: NetworkPolicySpec.
                MultiNetworkPolicySpec,
                MultiPeer
            );
        }
    };
}

multi_network_policy!(v1beta1, "v1beta1");
multi_network_policy!(v1beta2, "v1beta2");

/// The CRDs `netwarden crd` prints, in a fixed order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    // Both versions are served; merging marks MULTI_STORAGE_VERSION alone as stored.
    let multi = merge_crds(
        vec![
            v1beta1::MultiNetworkPolicy::crd(),
            v1beta2::MultiNetworkPolicy::crd(),
        ],
        MULTI_STORAGE_VERSION,
    )
    // Both versions come from the macro above: same group, kind, names and scope.
    .expect("the MultiNetworkPolicy versions agree on everything but the version");
    let mut crds = vec![DanmNetworkPolicy::crd(), multi];
    for crd in &mut crds {
        for version in &mut crd.spec.versions {
            if let Some(schema) = version
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
            {
                restrict_values(schema);
            }
        }
    }
    crds
}

/// The values of `policyTypes`, label selector operators and port protocols that Kubernetes
/// accepts in a NetworkPolicy.
pub const POLICY_TYPES: [&str; 2] = ["Ingress", "Egress"];
pub const SELECTOR_OPERATORS: [&str; 4] = ["In", "NotIn", "Exists", "DoesNotExist"];
pub const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];
/// The network types a DanmNetworkPolicy's `networkSelector` entry names (absent: DanmNet).
pub const NETWORK_TYPES: [&str; 5] = [
    "DanmNet",
    "TenantNetwork",
    "ClusterNetwork",
    "NetworkAttachmentDefinition",
    "NAD",
];

/// Adds the enums of [`POLICY_TYPES`], [`SELECTOR_OPERATORS`], [`PROTOCOLS`] and
/// [`NETWORK_TYPES`] wherever the schema has those fields (every selector, every rule's ports,
/// every `networkSelector` entry). A patch of the derived schema
/// rather than attributes: the selectors are k8s-openapi's `LabelSelector`, whose schema is not
/// ours to annotate. An enum'd field is not nullable: a `null` is pruned (the field is absent,
/// as the loader reads it) instead of failing the enum.
pub fn restrict_values(schema: &mut JSONSchemaProps) {
    fn one_of(values: &[&str]) -> Option<Vec<JSON>> {
        Some(
            values
                .iter()
                .map(|v| JSON(serde_json::Value::String((*v).to_string())))
                .collect(),
        )
    }
    if let Some(properties) = schema.properties.as_mut() {
        for (name, field) in properties.iter_mut() {
            match name.as_str() {
                "policyTypes" => {
                    if let Some(JSONSchemaPropsOrArray::Schema(items)) = field.items.as_mut() {
                        items.enum_ = one_of(&POLICY_TYPES);
                    }
                }
                "protocol" => {
                    field.enum_ = one_of(&PROTOCOLS);
                    field.nullable = None;
                }
                "operator" => {
                    field.enum_ = one_of(&SELECTOR_OPERATORS);
                    field.nullable = None;
                }
                "networkSelector" => {
                    if let Some(JSONSchemaPropsOrArray::Schema(items)) = field.items.as_mut() {
                        if let Some(kind) =
                            items.properties.as_mut().and_then(|p| p.get_mut("type"))
                        {
                            kind.enum_ = one_of(&NETWORK_TYPES);
                            kind.nullable = None;
                        }
                    }
                }
                _ => {}
            }
            restrict_values(field);
        }
    }
    if let Some(JSONSchemaPropsOrArray::Schema(items)) = schema.items.as_mut() {
        restrict_values(items);
    }
}

/// The CRDs as one multi-document YAML stream, headed by how it was made.
pub fn render_yaml() -> Result<String, serde_saphyr::ser::Error> {
    let mut out = format!(
        "# The CustomResourceDefinitions netwarden serves. Generated by `netwarden crd`: do not\n\
         # edit; regenerate with `{REGENERATE}`.\n"
    );
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd)?);
    }
    Ok(out)
}
