//! The pure half of `Lab::up`: input validation, names, and the `ip -batch` scripts.
//!
//! Keeping this free of I/O lets the topology be checked without root. Every word that reaches
//! an `ip -batch` line is either generated here (netns, bridge and veth names, formatted
//! addresses) or an interface name that passed [`valid_ifname`]: `ip -batch` splits lines on
//! blanks and treats quotes and `#` specially, and pod data is untrusted, so nothing else from a
//! manifest is ever written into a script.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;
use netwarden_engine::model::{NetworkId, PodKey, Protocol};

use crate::{LabError, LabSpec};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// `<prefix>-<6 hex>`: every netns of this lab starts with it and a `-`.
    pub instance: String,
    pub fabric: String,
    /// Bridge `nwbr<k>` in the fabric serves `networks[k]`.
    pub networks: Vec<NetworkId>,
    pub pods: Vec<PlannedPod>,
    /// Pods left out because they have no interface with an address.
    pub skipped: Vec<PodKey>,
    pub ports: Vec<(u16, Protocol)>,
    /// Requested ports whose protocol the lab cannot serve (SCTP: not in this kernel).
    pub unsupported: Vec<(u16, Protocol)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlannedPod {
    pub key: PodKey,
    pub netns: String,
    pub ifaces: Vec<PlannedIface>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlannedIface {
    /// Name inside the pod netns (validated).
    pub name: String,
    /// Index into `Plan::networks`.
    pub network: usize,
    /// The pod's addresses with their prefix lengths (host part kept).
    pub addrs: Vec<IpNet>,
    /// The veth end left in the fabric, attached to the network's bridge.
    pub fabric_end: String,
}

/// Kernel interface names: at most 15 bytes, and we only accept `[A-Za-z0-9_.-]`, not starting
/// with `-` or `.`, and never `lo` (the pod netns has its own).
pub(crate) fn valid_ifname(name: &str) -> bool {
    (1..=15).contains(&name.len())
        && name != "lo"
        && !name.starts_with(['-', '.'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A lab name prefix: `[a-z0-9]` words joined by `-`, 1-32 bytes (it ends up in netns names).
pub(crate) fn valid_prefix(prefix: &str) -> bool {
    (1..=32).contains(&prefix.len())
        && !prefix.starts_with('-')
        && !prefix.ends_with('-')
        && prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn invalid(msg: String) -> LabError {
    LabError::Invalid(msg)
}

pub(crate) fn plan(spec: &LabSpec, instance: &str) -> Result<Plan, LabError> {
    let mut ports = Vec::new();
    let mut unsupported = Vec::new();
    for &(port, protocol) in &spec.ports {
        if port == 0 {
            return Err(invalid(format!("port 0/{protocol} cannot be served")));
        }
        let list = if protocol == Protocol::Sctp {
            &mut unsupported
        } else {
            &mut ports
        };
        if !list.contains(&(port, protocol)) {
            list.push((port, protocol));
        }
    }

    let mut seen_keys = BTreeSet::new();
    let mut network_set = BTreeSet::new();
    for pod in &spec.pods {
        if !seen_keys.insert(&pod.key) {
            return Err(invalid(format!("pod {} appears twice", pod.key)));
        }
        for iface in pod.interfaces.iter().filter(|i| !i.ips.is_empty()) {
            network_set.insert(iface.network.clone());
        }
    }
    let networks: Vec<NetworkId> = network_set.into_iter().collect();
    let network_index: BTreeMap<&NetworkId, usize> =
        networks.iter().enumerate().map(|(k, n)| (n, k)).collect();

    let mut pods = Vec::new();
    let mut skipped = Vec::new();
    // (network, address) -> pod, to refuse two pods claiming one address on one network.
    let mut owners: BTreeMap<(usize, IpAddr), &PodKey> = BTreeMap::new();
    for pod in &spec.pods {
        let index = pods.len();
        let mut ifaces: Vec<PlannedIface> = Vec::new();
        for iface in pod.interfaces.iter().filter(|i| !i.ips.is_empty()) {
            if !valid_ifname(&iface.name) {
                return Err(invalid(format!(
                    "pod {}: interface name {:?} is not usable (1-15 of A-Z a-z 0-9 _ . -, not lo)",
                    pod.key, iface.name
                )));
            }
            if ifaces.iter().any(|i| i.name == iface.name) {
                return Err(invalid(format!(
                    "pod {}: interface {} appears twice",
                    pod.key, iface.name
                )));
            }
            let network = network_index[&iface.network];
            let mut addrs = Vec::new();
            for (k, ip) in iface.ips.iter().enumerate() {
                let host_len = if ip.is_ipv4() { 32 } else { 128 };
                let len = iface.prefix_lens.get(k).copied().unwrap_or(host_len);
                let net = IpNet::new(*ip, len).map_err(|_| {
                    invalid(format!("pod {}: bad prefix length {ip}/{len}", pod.key))
                })?;
                if let Some(owner) = owners.insert((network, *ip), &pod.key) {
                    if owner != &pod.key {
                        return Err(invalid(format!(
                            "address {ip} on network {} belongs to both {owner} and {}",
                            iface.network, pod.key
                        )));
                    }
                }
                addrs.push(net);
            }
            ifaces.push(PlannedIface {
                name: iface.name.clone(),
                network,
                addrs,
                fabric_end: format!("v{index}x{}", ifaces.len()),
            });
        }
        if ifaces.is_empty() {
            skipped.push(pod.key.clone());
            continue;
        }
        pods.push(PlannedPod {
            key: pod.key.clone(),
            netns: format!("{instance}-{index}"),
            ifaces,
        });
    }

    Ok(Plan {
        instance: instance.to_owned(),
        fabric: format!("{instance}-f"),
        networks,
        pods,
        skipped,
        ports,
        unsupported,
    })
}

impl Plan {
    /// Every netns this lab creates, the fabric first.
    pub fn netns_names(&self) -> Vec<String> {
        std::iter::once(self.fabric.clone())
            .chain(self.pods.iter().map(|p| p.netns.clone()))
            .collect()
    }

    /// For `ip -batch -` in the root netns: creates the namespaces.
    pub fn netns_add_script(&self) -> String {
        self.netns_names()
            .iter()
            .map(|n| format!("netns add {n}\n"))
            .collect()
    }

    /// For `ip -n FABRIC -batch -`: bridges, and veth pairs created from inside the fabric with
    /// the pod end born directly in the pod netns under its final name. Creating the pair here
    /// (not in the root netns) means the root namespace never sees a lab link, and naming the
    /// pod end at creation avoids clashes between pods' `eth0`s.
    pub fn fabric_script(&self) -> String {
        let mut s = String::new();
        for k in 0..self.networks.len() {
            // No multicast snooping: without a querier it can starve IPv6 neighbour discovery.
            let _ = writeln!(s, "link add name nwbr{k} type bridge mcast_snooping 0");
            let _ = writeln!(s, "link set nwbr{k} up");
        }
        for pod in &self.pods {
            for iface in &pod.ifaces {
                let _ = writeln!(
                    s,
                    "link add name {} type veth peer name {} netns {}",
                    iface.fabric_end, iface.name, pod.netns
                );
                let _ = writeln!(
                    s,
                    "link set {} master nwbr{} up",
                    iface.fabric_end, iface.network
                );
            }
        }
        s
    }

    /// For `ip -n POD -batch -`: addresses, links up, and the on-link routes to peers outside the
    /// interface's own subnets (see [`Plan::peer_routes`]).
    pub fn pod_script(&self, index: usize) -> String {
        let pod = &self.pods[index];
        let mut s = String::from("link set lo up\n");
        for (i, iface) in pod.ifaces.iter().enumerate() {
            let _ = writeln!(s, "link set {} address {}", iface.name, lab_mac(index, i));
            for addr in &iface.addrs {
                // nodad: the address is usable at once instead of after ~1 s of DAD.
                let nodad = if addr.addr().is_ipv6() { " nodad" } else { "" };
                let _ = writeln!(s, "addr add {addr} dev {}{nodad}", iface.name);
            }
            let _ = writeln!(s, "link set {} up", iface.name);
        }
        for (dest, dev) in self.peer_routes(index) {
            let _ = writeln!(s, "route replace {dest} dev {dev}");
        }
        for (addr, mac, dev) in self.peer_neighbours(index) {
            let _ = writeln!(
                s,
                "neigh replace {addr} lladdr {mac} dev {dev} nud permanent"
            );
        }
        s
    }

    /// Permanent neighbour entries for every peer address on the pod's networks. The kernel's
    /// IPv4/IPv6 neighbour tables are shared by every netns of the host and capped
    /// (`gc_thresh3`, 1024 by default): a lab of 100+ pods resolving each other dynamically
    /// overflows them, and then new connections silently time out. Permanent entries are not
    /// garbage-collected nor counted against that cap, and need no ARP/ND round trip.
    pub fn peer_neighbours(&self, index: usize) -> Vec<(IpAddr, String, String)> {
        let pod = &self.pods[index];
        let mut out = Vec::new();
        for iface in &pod.ifaces {
            for (q, peer) in self.pods.iter().enumerate() {
                if q == index {
                    continue;
                }
                for (j, peer_iface) in peer.ifaces.iter().enumerate() {
                    if peer_iface.network != iface.network {
                        continue;
                    }
                    for addr in &peer_iface.addrs {
                        let family_shared = iface
                            .addrs
                            .iter()
                            .any(|a| a.addr().is_ipv4() == addr.addr().is_ipv4());
                        if family_shared {
                            out.push((addr.addr(), lab_mac(q, j), iface.name.clone()));
                        }
                    }
                }
            }
        }
        out
    }
}

/// The MAC of pod `pod`'s interface `iface`: locally administered, unicast, unique in the lab.
pub(crate) fn lab_mac(pod: usize, iface: usize) -> String {
    format!(
        "02:6e:77:{:02x}:{:02x}:{:02x}",
        (pod >> 8) & 0xff,
        pod & 0xff,
        iface & 0xff
    )
}

impl Plan {
    /// Routes pod `index` needs to reach every peer on its networks. Peers inside one of the
    /// interface's own subnets are covered by the connected route. Otherwise the peer's subnet
    /// is routed on-link through the interface, or, when that subnet overlaps a subnet the pod
    /// has elsewhere (which the subnet route would hijack), just the peer's host address.
    pub fn peer_routes(&self, index: usize) -> Vec<(IpNet, String)> {
        let pod = &self.pods[index];
        let all_own: Vec<IpNet> = pod
            .ifaces
            .iter()
            .flat_map(|i| i.addrs.iter().map(IpNet::trunc))
            .collect();
        let mut seen = BTreeSet::new();
        let mut routes = Vec::new();
        for iface in &pod.ifaces {
            let own: Vec<IpNet> = iface.addrs.iter().map(IpNet::trunc).collect();
            for (q, peer) in self.pods.iter().enumerate() {
                if q == index {
                    continue;
                }
                let peer_addrs = peer
                    .ifaces
                    .iter()
                    .filter(|j| j.network == iface.network)
                    .flat_map(|j| &j.addrs);
                for addr in peer_addrs {
                    let same_family = |n: &IpNet| n.addr().is_ipv4() == addr.addr().is_ipv4();
                    if !own.iter().any(same_family) || own.iter().any(|n| n.contains(&addr.addr()))
                    {
                        continue;
                    }
                    let subnet = addr.trunc();
                    let overlaps = all_own
                        .iter()
                        .any(|n| n.contains(&subnet.network()) || subnet.contains(&n.network()));
                    let dest = if overlaps {
                        IpNet::new(addr.addr(), addr.max_prefix_len()).expect("host prefix")
                    } else {
                        subnet
                    };
                    if seen.insert(dest) {
                        routes.push((dest, iface.name.clone()));
                    }
                }
            }
        }
        routes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::model::{Pod, PodInterface};

    fn pod(name: &str, ifaces: &[(&str, NetworkId, &[&str])]) -> Pod {
        Pod {
            key: PodKey::new("ns", name),
            labels: Default::default(),
            host_network: false,
            container_ports: vec![],
            interfaces: ifaces
                .iter()
                .map(|(n, net, cidrs)| {
                    let nets: Vec<IpNet> = cidrs.iter().map(|c| c.parse().unwrap()).collect();
                    PodInterface {
                        name: n.to_string(),
                        network: net.clone(),
                        ips: nets.iter().map(IpNet::addr).collect(),
                        prefix_lens: nets.iter().map(IpNet::prefix_len).collect(),
                    }
                })
                .collect(),
            netns: None,
            node_name: None,
            uid: None,
            learn: false,
        }
    }

    #[test]
    fn plans_names_scripts_and_skips() {
        let x = NetworkId::nad("x", "net1");
        let spec = LabSpec {
            pods: vec![
                pod(
                    "a",
                    &[
                        ("eth0", NetworkId::Primary, &["10.1.0.1/24", "fd01::1/64"]),
                        ("net1", x.clone(), &["10.2.0.1/24"]),
                    ],
                ),
                pod("empty", &[]),
                pod(
                    "b",
                    &[("eth0", NetworkId::Primary, &["10.1.0.2/24", "fd01::2/64"])],
                ),
            ],
            ports: vec![
                (80, Protocol::Tcp),
                (80, Protocol::Tcp),
                (53, Protocol::Udp),
                (9, Protocol::Sctp),
            ],
        };
        let plan = plan(&spec, "nwlab-abcdef").unwrap();
        assert_eq!(plan.fabric, "nwlab-abcdef-f");
        assert_eq!(plan.networks, vec![NetworkId::Primary, x]);
        assert_eq!(plan.skipped, vec![PodKey::new("ns", "empty")]);
        assert_eq!(
            plan.netns_names(),
            ["nwlab-abcdef-f", "nwlab-abcdef-0", "nwlab-abcdef-1"]
        );
        assert_eq!(plan.ports, vec![(80, Protocol::Tcp), (53, Protocol::Udp)]);
        assert_eq!(plan.unsupported, vec![(9, Protocol::Sctp)]);
        assert_eq!(
            plan.fabric_script(),
            "link add name nwbr0 type bridge mcast_snooping 0\nlink set nwbr0 up\n\
             link add name nwbr1 type bridge mcast_snooping 0\nlink set nwbr1 up\n\
             link add name v0x0 type veth peer name eth0 netns nwlab-abcdef-0\nlink set v0x0 master nwbr0 up\n\
             link add name v0x1 type veth peer name net1 netns nwlab-abcdef-0\nlink set v0x1 master nwbr1 up\n\
             link add name v1x0 type veth peer name eth0 netns nwlab-abcdef-1\nlink set v1x0 master nwbr0 up\n"
        );
        assert_eq!(
            plan.pod_script(0),
            "link set lo up\nlink set eth0 address 02:6e:77:00:00:00\naddr add 10.1.0.1/24 dev eth0\n\
             addr add fd01::1/64 dev eth0 nodad\nlink set eth0 up\nlink set net1 address 02:6e:77:00:00:01\n\
             addr add 10.2.0.1/24 dev net1\nlink set net1 up\n\
             neigh replace 10.1.0.2 lladdr 02:6e:77:00:01:00 dev eth0 nud permanent\n\
             neigh replace fd01::2 lladdr 02:6e:77:00:01:00 dev eth0 nud permanent\n"
        );
    }

    #[test]
    fn routes_peers_in_other_subnets() {
        let spec = LabSpec {
            pods: vec![
                pod(
                    "a",
                    &[
                        ("eth0", NetworkId::Primary, &["10.1.0.1/24", "fd01::1/64"]),
                        ("net1", NetworkId::nad("x", "n"), &["10.9.0.1/24"]),
                    ],
                ),
                pod("b", &[("eth0", NetworkId::Primary, &["10.1.0.2/24"])]),
                pod(
                    "c",
                    &[("eth0", NetworkId::Primary, &["10.3.0.3/24", "fd03::3/64"])],
                ),
                pod("d", &[("eth0", NetworkId::Primary, &["10.9.0.4/16"])]),
                pod("e", &[("eth0", NetworkId::Primary, &["10.3.0.5/24"])]),
            ],
            ports: vec![],
        };
        let plan = plan(&spec, "t-000000").unwrap();
        let routes = |i| -> Vec<String> {
            plan.peer_routes(i)
                .iter()
                .map(|(n, d)| format!("{n} {d}"))
                .collect()
        };
        // a: c's subnet on-link; d's /16 overlaps a's net1 subnet, so only d's host address.
        assert_eq!(
            routes(0),
            ["10.3.0.0/24 eth0", "fd03::/64 eth0", "10.9.0.4/32 eth0"]
        );
        // b has no IPv6: no IPv6 routes.
        assert_eq!(routes(1), ["10.3.0.0/24 eth0", "10.9.0.0/16 eth0"]);
        // c and e share a subnet: only the others need routes.
        assert_eq!(
            routes(2),
            ["10.1.0.0/24 eth0", "fd01::/64 eth0", "10.9.0.0/16 eth0"]
        );
        assert!(plan
            .pod_script(1)
            .contains("route replace 10.9.0.0/16 dev eth0\n"));
    }

    #[test]
    fn rejects_bad_input() {
        let p = |n: &str| pod("a", &[(n, NetworkId::Primary, &["10.0.0.1/24"])]);
        for bad in [
            "lo",
            "",
            "eth 0",
            "-x",
            "a#b",
            "waytoolonginterface",
            "x\"y",
        ] {
            let spec = LabSpec {
                pods: vec![p(bad)],
                ports: vec![],
            };
            assert!(
                matches!(plan(&spec, "t"), Err(LabError::Invalid(_))),
                "{bad:?}"
            );
        }
        let dup_key = LabSpec {
            pods: vec![p("eth0"), p("eth1")],
            ports: vec![],
        };
        assert!(matches!(plan(&dup_key, "t"), Err(LabError::Invalid(_))));
        let mut b = p("eth0");
        b.key.name = "b".into();
        let dup_addr = LabSpec {
            pods: vec![p("eth0"), b],
            ports: vec![],
        };
        assert!(matches!(plan(&dup_addr, "t"), Err(LabError::Invalid(_))));
        let two_eth0 = LabSpec {
            pods: vec![pod(
                "a",
                &[
                    ("eth0", NetworkId::Primary, &["10.0.0.1/24"]),
                    ("eth0", NetworkId::nad("x", "y"), &["10.0.1.1/24"]),
                ],
            )],
            ports: vec![],
        };
        assert!(matches!(plan(&two_eth0, "t"), Err(LabError::Invalid(_))));
        let port0 = LabSpec {
            pods: vec![],
            ports: vec![(0, Protocol::Tcp)],
        };
        assert!(matches!(plan(&port0, "t"), Err(LabError::Invalid(_))));
        let mut bad_len = p("eth0");
        bad_len.interfaces[0].prefix_lens = vec![33];
        assert!(matches!(
            plan(
                &LabSpec {
                    pods: vec![bad_len],
                    ports: vec![]
                },
                "t"
            ),
            Err(LabError::Invalid(_))
        ));
    }

    #[test]
    fn missing_prefix_means_host_route_to_peers() {
        let mut a = pod("a", &[("eth0", NetworkId::Primary, &["10.0.0.1/24"])]);
        let mut b = pod("b", &[("eth0", NetworkId::Primary, &["10.0.0.2/24"])]);
        a.interfaces[0].prefix_lens.clear();
        b.interfaces[0].prefix_lens.clear();
        let plan = plan(
            &LabSpec {
                pods: vec![a, b],
                ports: vec![],
            },
            "t",
        )
        .unwrap();
        assert!(plan
            .pod_script(0)
            .contains("addr add 10.0.0.1/32 dev eth0\n"));
        assert_eq!(
            plan.peer_routes(0),
            vec![("10.0.0.2/32".parse().unwrap(), "eth0".to_string())]
        );
    }

    #[test]
    fn prefixes() {
        assert!(valid_prefix("nwlab"));
        assert!(valid_prefix("nwlab-t1"));
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(33)] {
            assert!(!valid_prefix(bad), "{bad:?}");
        }
    }
}
