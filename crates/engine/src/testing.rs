//! Small builders for tests and benchmarks (`mk_pod`, `mk_policy`, ...), in the spirit of
//! index tests that apply objects and assert on the computed value — no cluster needed.

use std::net::IpAddr;

use crate::model::*;

pub use crate::generate::{labels, namespace};

pub fn selector(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: labels(pairs),
        match_expressions: Vec::new(),
    }
}

/// A pod interface `name` on `network` holding `addrs`: each an address with its on-link
/// prefix length (`10.0.0.1/16`), or without (`10.0.0.1`: /24 for IPv4, /64 for IPv6).
pub fn interface(name: &str, network: NetworkId, addrs: &[&str]) -> PodInterface {
    let (ips, prefix_lens): (Vec<IpAddr>, Vec<u8>) = addrs
        .iter()
        .map(|a| {
            let (ip, len) = a.split_once('/').unwrap_or((a, ""));
            let ip: IpAddr = ip.parse().expect("test address");
            let len = match len {
                "" if ip.is_ipv4() => 24,
                "" => 64,
                len => len.parse().expect("test prefix length"),
            };
            (ip, len)
        })
        .unzip();
    PodInterface {
        name: name.into(),
        network,
        ips,
        prefix_lens,
    }
}

/// A pod with a primary interface `eth0` holding `ips` (see [`interface`]).
pub fn pod(ns: &str, name: &str, pod_labels: &[(&str, &str)], ips: &[&str]) -> Pod {
    pod_with_interfaces(
        ns,
        name,
        pod_labels,
        vec![interface("eth0", NetworkId::Primary, ips)],
    )
}

/// A pod with exactly `interfaces` (none: a pod without addresses).
pub fn pod_with_interfaces(
    ns: &str,
    name: &str,
    pod_labels: &[(&str, &str)],
    interfaces: Vec<PodInterface>,
) -> Pod {
    Pod {
        key: PodKey::new(ns, name),
        labels: labels(pod_labels),
        host_network: false,
        container_ports: Vec::new(),
        interfaces,
        netns: None,
        node_name: None,
        uid: None,
        learn: false,
    }
}

/// Adds a secondary interface on `network` (see [`interface`]).
pub fn with_interface(mut pod: Pod, name: &str, network: NetworkId, ips: &[&str]) -> Pod {
    pod.interfaces.push(interface(name, network, ips));
    pod
}

pub fn with_port(mut pod: Pod, name: &str, port: u16, protocol: Protocol) -> Pod {
    pod.container_ports.push(ContainerPort {
        name: Some(name.into()),
        port,
        protocol,
    });
    pod
}

/// A policy of `kind` with the given rules; `None` directions are not isolated.
pub fn policy(
    kind: PolicyKind,
    ns: &str,
    name: &str,
    pod_selector: LabelSelector,
    ingress: Option<Vec<PolicyRule>>,
    egress: Option<Vec<PolicyRule>>,
) -> Policy {
    let scope = match kind {
        PolicyKind::NetworkPolicy => PolicyScope::Primary,
        PolicyKind::DanmNetworkPolicy => PolicyScope::AllInterfaces,
        PolicyKind::MultiNetworkPolicy => PolicyScope::Networks(Vec::new()),
    };
    Policy {
        kind,
        key: ObjectKey::new(ns, name),
        pod_selector,
        ingress,
        egress,
        scope,
        mode: Mode::Enforce,
        replaces: None,
        log_denies: false,
    }
}

pub fn netpol(
    ns: &str,
    name: &str,
    pod_selector: LabelSelector,
    ingress: Option<Vec<PolicyRule>>,
    egress: Option<Vec<PolicyRule>>,
) -> Policy {
    policy(
        PolicyKind::NetworkPolicy,
        ns,
        name,
        pod_selector,
        ingress,
        egress,
    )
}

pub fn pods_peer(
    pod_selector: Option<LabelSelector>,
    namespace_selector: Option<LabelSelector>,
) -> Peer {
    Peer::Pods {
        pod_selector,
        namespace_selector,
        network_selector: None,
    }
}

/// Pods of the policy's namespace carrying `pairs` as labels.
pub fn pods_with(pairs: &[(&str, &str)]) -> Peer {
    pods_peer(Some(selector(pairs)), None)
}

pub fn ip_block(cidr: &str, except: &[&str]) -> Peer {
    Peer::IpBlock(IpBlock {
        cidr: cidr.parse().expect("test cidr"),
        except: except
            .iter()
            .map(|e| e.parse().expect("test cidr"))
            .collect(),
    })
}

pub fn tcp(port: u16) -> PolicyPort {
    PolicyPort {
        protocol: Protocol::Tcp,
        port: Some(PortRef::Number(port)),
        end_port: None,
    }
}

/// `port` (`None`: every port) of `protocol`, up to `end_port` when given.
pub fn port(protocol: Protocol, port: Option<u16>, end_port: Option<u16>) -> PolicyPort {
    PolicyPort {
        protocol,
        port: port.map(PortRef::Number),
        end_port,
    }
}

pub fn named(protocol: Protocol, name: &str) -> PolicyPort {
    PolicyPort {
        protocol,
        port: Some(PortRef::Named(name.into())),
        end_port: None,
    }
}

pub fn rule(peers: Vec<Peer>, ports: Vec<PolicyPort>) -> PolicyRule {
    PolicyRule { peers, ports }
}

/// An admin policy of `kind` (its tier follows: ClusterNetworkPolicy builds the Admin tier; set
/// `tier` after for Baseline) selecting `subject`, enforced, on the primary network.
pub fn admin_policy(
    kind: crate::admin::AdminKind,
    name: &str,
    priority: u32,
    subject: crate::admin::PodsSelector,
    ingress: Vec<crate::admin::AdminRule>,
    egress: Vec<crate::admin::AdminRule>,
) -> crate::admin::AdminPolicy {
    crate::admin::AdminPolicy {
        kind,
        name: name.into(),
        tier: match kind {
            crate::admin::AdminKind::BaselineAdminNetworkPolicy => crate::admin::Tier::Baseline,
            _ => crate::admin::Tier::Admin,
        },
        priority,
        subject,
        ingress,
        egress,
        scope: PolicyScope::Primary,
        mode: Mode::Enforce,
        replaces: None,
        log_denies: false,
    }
}

/// An admin rule with `action` over `peers`, every port unless `ports`.
pub fn admin_rule(
    action: crate::admin::AdminAction,
    peers: Vec<crate::admin::AdminPeer>,
    ports: Option<Vec<crate::admin::AdminPort>>,
) -> crate::admin::AdminRule {
    crate::admin::AdminRule {
        name: None,
        action,
        peers,
        ports,
    }
}

/// Pods of the namespaces labelled `pairs`.
pub fn in_namespaces(pairs: &[(&str, &str)]) -> crate::admin::PodsSelector {
    crate::admin::PodsSelector::namespaces(selector(pairs))
}
