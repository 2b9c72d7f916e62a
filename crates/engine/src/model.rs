//! The objects the engine reasons about, cut down to the fields that matter.
//!
//! The manifest loader (and later the Kubernetes watcher) reduces `Namespace`, `Pod`, `DanmEp`,
//! `NetworkPolicy`, `DanmNetworkPolicy`, `MultiNetworkPolicy` and `Service` objects to these
//! structs. They are plain data: validation happened at the edge, so everything here is
//! well-formed (CIDRs parsed, ports in range, selector operators known).

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::Serialize;

pub use crate::labels::Labels;

/// `namespace/name` of a namespaced object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

pub type PodKey = ObjectKey;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    pub name: String,
    pub labels: Labels,
    /// Learn mode for every pod of the namespace (annotation `netwarden.io/learn: "true"`).
    pub learn: bool,
}

/// A `--learn` selector: `NS/POD` (one pod) or `NS/*` (every pod of a namespace). Pods it
/// selects log each distinct new flow once per window, like pods annotated
/// `netwarden.io/learn: "true"` (issue 9, learn mode).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LearnSelector {
    pub namespace: String,
    /// `None` for `NS/*`.
    pub pod: Option<String>,
}

impl LearnSelector {
    pub fn matches(&self, key: &PodKey) -> bool {
        self.namespace == key.namespace && self.pod.as_ref().is_none_or(|p| *p == key.name)
    }
}

impl std::str::FromStr for LearnSelector {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("--learn {s:?}: expected NS/POD or NS/*");
        let (ns, pod) = s.split_once('/').ok_or_else(bad)?;
        if ns.is_empty() || pod.is_empty() || ns.contains('*') || pod.contains('/') {
            return Err(bad());
        }
        if pod.contains('*') && pod != "*" {
            return Err(bad());
        }
        Ok(LearnSelector {
            namespace: ns.to_string(),
            pod: (pod != "*").then(|| pod.to_string()),
        })
    }
}

impl fmt::Display for LearnSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            self.namespace,
            self.pod.as_deref().unwrap_or("*")
        )
    }
}

/// An address family. One type for the whole project: `reach` output (`"ipv4"`/`"ipv6"`), the
/// renderers' per-family sets and tables, and the lab's probes all use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Ipv4,
    Ipv6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::Ipv4, Family::Ipv6];

    pub fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv4() {
            Family::Ipv4
        } else {
            Family::Ipv6
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Family::Ipv4 => "ipv4",
            Family::Ipv6 => "ipv6",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// L4 protocols a NetworkPolicy port can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub const ALL: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

    /// Parses the Kubernetes spelling (`TCP`, `UDP`, `SCTP`); case-insensitive for CLI use.
    pub fn parse(s: &str) -> Option<Protocol> {
        match s.to_ascii_uppercase().as_str() {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    /// The lower-case name nftables and iptables use.
    pub fn lower(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A container port; `name` is what named ports in policies resolve against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerPort {
    pub name: Option<String>,
    pub port: u16,
    pub protocol: Protocol,
}

/// The kind of network an interface is attached to (SPEC section 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum NetworkType {
    /// A Multus NetworkAttachmentDefinition (namespaced).
    NetworkAttachmentDefinition,
    /// DANM `DanmNet` (namespaced in the pod's namespace).
    DanmNet,
    /// DANM `TenantNetwork` (namespaced in the pod's namespace).
    TenantNetwork,
    /// DANM `ClusterNetwork` (cluster-wide, no namespace).
    ClusterNetwork,
}

impl NetworkType {
    /// Parses the `type` of a networkSelector entry or a DanmEp apiType.
    pub fn parse(s: &str) -> Option<NetworkType> {
        match s {
            "NetworkAttachmentDefinition" | "NAD" => Some(NetworkType::NetworkAttachmentDefinition),
            "DanmNet" => Some(NetworkType::DanmNet),
            "TenantNetwork" => Some(NetworkType::TenantNetwork),
            "ClusterNetwork" => Some(NetworkType::ClusterNetwork),
            _ => None,
        }
    }

    pub fn is_namespaced(self) -> bool {
        !matches!(self, NetworkType::ClusterNetwork)
    }
}

/// Which network an interface belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NetworkId {
    /// The cluster (primary) network: the interface holding `status.podIPs`.
    Primary,
    /// A secondary network. `namespace` is `None` only for `ClusterNetwork`.
    Named {
        kind: NetworkType,
        namespace: Option<String>,
        name: String,
    },
}

impl NetworkId {
    pub fn nad(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        NetworkId::Named {
            kind: NetworkType::NetworkAttachmentDefinition,
            namespace: Some(namespace.into()),
            name: name.into(),
        }
    }

    pub fn is_primary(&self) -> bool {
        matches!(self, NetworkId::Primary)
    }

    /// The name used in CLI output and events: `default`, `ns/name`, or `name` (ClusterNetwork).
    pub fn display_name(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for NetworkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetworkId::Primary => f.write_str("default"),
            NetworkId::Named {
                namespace: Some(ns),
                name,
                ..
            } => write!(f, "{ns}/{name}"),
            NetworkId::Named {
                namespace: None,
                name,
                ..
            } => f.write_str(name),
        }
    }
}

impl Serialize for NetworkId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One kernel interface of a pod that has an L3 address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInterface {
    /// Kernel interface name inside the pod netns (validated: at most 15 safe characters).
    pub name: String,
    pub network: NetworkId,
    pub ips: Vec<IpAddr>,
    /// Prefix lengths matching `ips`, where known (the lab uses them to build subnets).
    pub prefix_lens: Vec<u8>,
}

impl PodInterface {
    pub fn is_primary(&self) -> bool {
        self.network.is_primary()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub key: PodKey,
    pub labels: Labels,
    pub host_network: bool,
    pub container_ports: Vec<ContainerPort>,
    /// Every interface with an address; the primary one (if any) has `NetworkId::Primary`.
    pub interfaces: Vec<PodInterface>,
    /// Where the pod's network namespace is (standalone mode: annotation `netwarden.io/netns`).
    pub netns: Option<String>,
    /// The node the pod is scheduled on (`spec.nodeName`; `None` while unscheduled): a node
    /// agent programs only its own node's pods, while every pod is a peer.
    pub node_name: Option<String>,
    /// `metadata.uid`: matches the pod to its CRI sandbox (whose metadata kubelet fills with
    /// the pod's namespace, name and uid), so a sandbox left by an older pod of the same name
    /// is never taken for this one's. `None` in manifests that omit it.
    pub uid: Option<String>,
    /// Learn mode asked by the pod itself (annotation `netwarden.io/learn: "true"`); the
    /// namespace's annotation and `--learn` selectors add to it ([`crate::PodRules::learn`]).
    pub learn: bool,
}

impl Pod {
    pub fn primary(&self) -> Option<&PodInterface> {
        self.interfaces.iter().find(|i| i.is_primary())
    }

    pub fn interface_on(&self, network: &NetworkId) -> Option<&PodInterface> {
        self.interfaces.iter().find(|i| &i.network == network)
    }

    /// Resolves a named container port for `protocol` (SPEC 3: name AND protocol must match).
    pub fn named_port(&self, name: &str, protocol: Protocol) -> Option<u16> {
        self.container_ports
            .iter()
            .find(|p| p.protocol == protocol && p.name.as_deref() == Some(name))
            .map(|p| p.port)
    }
}

/// A label selector requirement operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: Vec<String>,
}

/// A Kubernetes label selector; the empty selector matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct LabelSelector {
    pub match_labels: Labels,
    pub match_expressions: Vec<Requirement>,
}

impl LabelSelector {
    pub fn everything() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator {
                    Operator::In => value.is_some_and(|v| r.values.contains(v)),
                    Operator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                    Operator::Exists => value.is_some(),
                    Operator::DoesNotExist => value.is_none(),
                }
            })
    }
}

/// The three policy APIs netwarden reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum PolicyKind {
    NetworkPolicy,
    DanmNetworkPolicy,
    MultiNetworkPolicy,
}

impl PolicyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::NetworkPolicy => "NetworkPolicy",
            PolicyKind::DanmNetworkPolicy => "DanmNetworkPolicy",
            PolicyKind::MultiNetworkPolicy => "MultiNetworkPolicy",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identifies one policy object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyRef {
    pub kind: PolicyKind,
    pub key: ObjectKey,
}

impl fmt::Display for PolicyRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.key)
    }
}

impl Serialize for PolicyRef {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Ingress or egress, from the point of view of the pod interface being protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A port as written in a policy: a number or a container port name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PortRef {
    Number(u16),
    Named(String),
}

/// One entry of a rule's `ports`: protocol (defaulted to TCP at the edge), optional port and
/// optional inclusive `endPort` (only with a numeric port).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PolicyPort {
    pub protocol: Protocol,
    pub port: Option<PortRef>,
    pub end_port: Option<u16>,
}

/// A DanmNetworkPolicy `networkSelector` entry (type already parsed; NAD names already
/// resolved to `namespace/name`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NetworkSelectorEntry {
    pub kind: NetworkType,
    /// For NAD: the namespace of the attachment definition. For DanmNet/TenantNetwork: `None`
    /// (the namespace is that of the pod owning the interface). ClusterNetwork: `None`.
    pub namespace: Option<String>,
    pub name: String,
}

impl NetworkSelectorEntry {
    /// Whether an interface of a pod in `pod_namespace` attached to `network` is selected.
    pub fn matches(&self, network: &NetworkId, pod_namespace: &str) -> bool {
        let NetworkId::Named {
            kind,
            namespace,
            name,
        } = network
        else {
            return false;
        };
        if *kind != self.kind || *name != self.name {
            return false;
        }
        match self.kind {
            NetworkType::NetworkAttachmentDefinition => namespace == &self.namespace,
            NetworkType::DanmNet | NetworkType::TenantNetwork => {
                namespace.as_deref() == Some(pod_namespace)
            }
            NetworkType::ClusterNetwork => true,
        }
    }
}

/// An IP block: `cidr` minus every `except`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IpBlock {
    pub cidr: IpNet,
    pub except: Vec<IpNet>,
}

/// One peer of a rule (`from[]` / `to[]` entry).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Peer {
    /// Pod-based peer. `None` selectors are absent fields; `Some(empty)` matches everything.
    Pods {
        pod_selector: Option<LabelSelector>,
        namespace_selector: Option<LabelSelector>,
        /// DanmNetworkPolicy only.
        network_selector: Option<Vec<NetworkSelectorEntry>>,
    },
    IpBlock(IpBlock),
}

/// One ingress or egress rule. Empty `peers` = all peers; empty `ports` = all ports.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct PolicyRule {
    pub peers: Vec<Peer>,
    pub ports: Vec<PolicyPort>,
}

/// Whether a policy is enforced or only previewed (SPEC section 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Enforce,
    Monitor,
}

/// Which interfaces of a selected pod a policy isolates.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PolicyScope {
    /// NetworkPolicy: the primary interface only.
    Primary,
    /// DanmNetworkPolicy: every interface.
    AllInterfaces,
    /// MultiNetworkPolicy: interfaces attached to these NADs (from `policy-for`).
    Networks(Vec<NetworkId>),
}

impl PolicyScope {
    /// Whether a policy of this scope covers `iface`.
    pub fn covers(&self, iface: &PodInterface) -> bool {
        match self {
            PolicyScope::Primary => iface.is_primary(),
            PolicyScope::AllInterfaces => true,
            PolicyScope::Networks(nets) => nets.contains(&iface.network),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub kind: PolicyKind,
    pub key: ObjectKey,
    pub pod_selector: LabelSelector,
    /// `Some` when the policy isolates ingress (policyTypes resolved at the edge).
    pub ingress: Option<Vec<PolicyRule>>,
    /// `Some` when the policy isolates egress.
    pub egress: Option<Vec<PolicyRule>>,
    pub scope: PolicyScope,
    pub mode: Mode,
    /// `netwarden.io/replaces`: name of an enforced policy in the same namespace that this
    /// monitored policy previews replacing.
    pub replaces: Option<String>,
    /// `netwarden.io/log: "true"`: log the enforced denies this policy takes part in.
    pub log_denies: bool,
}

impl Policy {
    pub fn reference(&self) -> PolicyRef {
        PolicyRef {
            kind: self.kind,
            key: self.key.clone(),
        }
    }

    pub fn rules(&self, direction: Direction) -> Option<&[PolicyRule]> {
        match direction {
            Direction::Ingress => self.ingress.as_deref(),
            Direction::Egress => self.egress.as_deref(),
        }
    }

    /// Whether this policy isolates `iface` of a pod it selects.
    pub fn covers_interface(&self, iface: &PodInterface) -> bool {
        self.scope.covers(iface)
    }
}

/// A Service port: what clients dial (`port`) and what the endpoints serve (`target`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub protocol: Protocol,
    pub port: u16,
    pub target: PortRef,
}

/// A Service with virtual IPs on the primary network (SPEC 3.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub key: ObjectKey,
    pub cluster_ips: Vec<IpAddr>,
    /// Selector over pods of the Service's namespace; `None` when endpoints come from slices.
    pub selector: Option<Labels>,
    /// Endpoint addresses from EndpointSlices (used when there is no selector).
    pub endpoint_addrs: Vec<IpAddr>,
    pub ports: Vec<ServicePort>,
}
