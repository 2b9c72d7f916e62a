//! Cluster-scoped admin policies (SPEC 8): ClusterNetworkPolicy (v1alpha2, tiers `Admin` and
//! `Baseline`), AdminNetworkPolicy and BaselineAdminNetworkPolicy (v1alpha1), as the engine
//! holds them once the edge has parsed and validated them, and the Nodes their `nodes` peers
//! select.
//!
//! Per (pod interface, direction) the verdict is **Admin tier → namespaced tier (section 3) →
//! Baseline tier → allow**. Inside a tier, policies in ascending priority (ties: by kind, then
//! name — upstream leaves them undefined and `validate` warns), rules in written order; the
//! first rule whose peers and ports match decides: Allow, Deny, or Pass (on to the namespaced
//! tier). The resolved form, per pod interface, is [`crate::rules::TierRule`].

use std::cmp::Ordering;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::Serialize;

use crate::labels::Labels;
use crate::model::{
    Direction, LabelSelector, Mode, NetworkId, PodInterface, PolicyRef, PolicyScope,
};
use crate::rules::PortRange;

/// The three kinds, as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum AdminKind {
    /// `policy.networking.k8s.io/v1alpha2`, either tier.
    ClusterNetworkPolicy,
    /// `policy.networking.k8s.io/v1alpha1`, the Admin tier.
    AdminNetworkPolicy,
    /// `policy.networking.k8s.io/v1alpha1`, the Baseline tier (the singleton `default`).
    BaselineAdminNetworkPolicy,
}

impl AdminKind {
    pub const ALL: [AdminKind; 3] = [
        AdminKind::ClusterNetworkPolicy,
        AdminKind::AdminNetworkPolicy,
        AdminKind::BaselineAdminNetworkPolicy,
    ];

    /// The kind `kind:` names `name`, if it is one of the three.
    pub fn from_name(name: &str) -> Option<AdminKind> {
        AdminKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AdminKind::ClusterNetworkPolicy => "ClusterNetworkPolicy",
            AdminKind::AdminNetworkPolicy => "AdminNetworkPolicy",
            AdminKind::BaselineAdminNetworkPolicy => "BaselineAdminNetworkPolicy",
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            AdminKind::ClusterNetworkPolicy => "policy.networking.k8s.io/v1alpha2",
            _ => "policy.networking.k8s.io/v1alpha1",
        }
    }
}

impl fmt::Display for AdminKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One admin policy object (cluster-scoped: a name, no namespace).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AdminRef {
    pub kind: AdminKind,
    pub name: String,
}

impl fmt::Display for AdminRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

impl Serialize for AdminRef {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A policy object of either scope, as the monitor phase names it: a namespaced policy
/// (`ns/name` in events, status records and the would-deny counters) or a cluster-scoped admin
/// policy (`Kind/name`: it has no namespace, and a kind is never a namespace name, so the two
/// cannot be confused). The status records and `promote` identify a monitored policy by it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MonitoredRef {
    Namespaced(PolicyRef),
    Admin(AdminRef),
}

impl MonitoredRef {
    /// The kind, as `kind:` names it.
    pub fn kind_str(&self) -> &'static str {
        match self {
            MonitoredRef::Namespaced(r) => r.kind.as_str(),
            MonitoredRef::Admin(r) => r.kind.as_str(),
        }
    }

    /// `Kind ns/name` or `Kind name`: the object as messages and load problems name it.
    pub fn object(&self) -> String {
        match self {
            MonitoredRef::Namespaced(r) => format!("{} {}", r.kind, r.key),
            MonitoredRef::Admin(r) => format!("{} {}", r.kind, r.name),
        }
    }
}

impl fmt::Display for MonitoredRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MonitoredRef::Namespaced(r) => r.fmt(f),
            MonitoredRef::Admin(r) => r.fmt(f),
        }
    }
}

impl From<PolicyRef> for MonitoredRef {
    fn from(r: PolicyRef) -> Self {
        MonitoredRef::Namespaced(r)
    }
}

impl From<AdminRef> for MonitoredRef {
    fn from(r: AdminRef) -> Self {
        MonitoredRef::Admin(r)
    }
}

/// Where a policy's rules are evaluated: before the namespaced tier or after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Tier {
    Admin,
    Baseline,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Admin => "Admin",
            Tier::Baseline => "Baseline",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a matching rule does. v1alpha2's `Accept` and v1alpha1's `Allow` are one action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum AdminAction {
    /// Allowed; later tiers are not consulted.
    Allow,
    /// Denied (a reject, as in section 3.1).
    Deny,
    /// The rest of this tier is skipped: the namespaced tier decides (Admin tier only).
    Pass,
}

impl AdminAction {
    pub fn as_str(self) -> &'static str {
        match self {
            AdminAction::Allow => "Allow",
            AdminAction::Deny => "Deny",
            AdminAction::Pass => "Pass",
        }
    }
}

impl fmt::Display for AdminAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Pods selected by namespace labels and pod labels (both must match). `namespaces: {}` as a
/// subject or peer is `pods` with an empty pod selector.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct PodsSelector {
    pub namespaces: LabelSelector,
    pub pods: LabelSelector,
}

impl PodsSelector {
    /// Every pod of the namespaces `namespaces` selects.
    pub fn namespaces(namespaces: LabelSelector) -> PodsSelector {
        PodsSelector {
            namespaces,
            pods: LabelSelector::everything(),
        }
    }

    pub fn matches(&self, namespace_labels: &Labels, pod_labels: &Labels) -> bool {
        self.namespaces.matches(namespace_labels) && self.pods.matches(pod_labels)
    }
}

/// One peer of an admin rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AdminPeer {
    /// `namespaces` / `pods`: the selected pods' addresses (on the policy's networks).
    Pods(PodsSelector),
    /// `networks` (egress): CIDRs, pod addresses included.
    Networks(Vec<IpNet>),
    /// `nodes` (egress): the addresses of the selected Nodes, never pod addresses.
    Nodes(LabelSelector),
    /// `domainNames` (egress, Allow only): matches nothing until netwarden resolves names
    /// (upstream's fail-closed rule for an Allow it cannot implement).
    DomainNames(Vec<String>),
}

/// One destination port entry of an admin rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AdminPort {
    /// A protocol with a port, an inclusive range, or (`ports: None`) every port.
    Numbers(PortRange),
    /// A container port name, resolved on the destination pod (name and protocol).
    Named(String),
}

/// One ingress or egress rule of an admin policy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AdminRule {
    /// `name`, when the rule has one (events and `explain` name it).
    pub name: Option<String>,
    pub action: AdminAction,
    /// Never empty (the CRD requires at least one peer).
    pub peers: Vec<AdminPeer>,
    /// `None`: every protocol and port.
    pub ports: Option<Vec<AdminPort>>,
}

/// One admin policy, parsed and validated at the edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminPolicy {
    pub kind: AdminKind,
    pub name: String,
    pub tier: Tier,
    /// 0–1000; lower is evaluated first. BaselineAdminNetworkPolicy has none (0).
    pub priority: u32,
    pub subject: PodsSelector,
    pub ingress: Vec<AdminRule>,
    pub egress: Vec<AdminRule>,
    /// Which interfaces of a subject the policy covers: the primary one, or those on the
    /// networks of `k8s.v1.cni.cncf.io/policy-for` (SPEC 8, secondary networks).
    pub scope: PolicyScope,
    pub mode: Mode,
    /// `netwarden.io/replaces`: an enforced admin policy of the same kind this monitored one
    /// previews replacing.
    pub replaces: Option<String>,
    /// `netwarden.io/log: "true"`: log the enforced denies of this policy.
    pub log_denies: bool,
}

impl AdminPolicy {
    pub fn reference(&self) -> AdminRef {
        AdminRef {
            kind: self.kind,
            name: self.name.clone(),
        }
    }

    pub fn rules(&self, direction: Direction) -> &[AdminRule] {
        match direction {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }

    /// Whether the policy covers `iface` of a subject pod.
    pub fn covers_interface(&self, iface: &PodInterface) -> bool {
        self.scope.covers(iface)
    }

    /// The networks whose addresses the policy's pod peers contribute: the primary network,
    /// or the `policy-for` networks.
    pub fn peer_networks(&self) -> Vec<NetworkId> {
        match &self.scope {
            PolicyScope::Networks(networks) => networks.clone(),
            _ => vec![NetworkId::Primary],
        }
    }

    /// Evaluation order inside a tier: priority, then kind, then name (see the module doc).
    pub fn order(&self, other: &AdminPolicy) -> Ordering {
        (self.tier, self.priority, self.kind, &self.name).cmp(&(
            other.tier,
            other.priority,
            other.kind,
            &other.name,
        ))
    }
}

/// A Node, for `nodes` peers: its labels and `status.addresses` (IP addresses only).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Node {
    pub name: String,
    pub labels: Labels,
    pub addresses: Vec<IpAddr>,
}
