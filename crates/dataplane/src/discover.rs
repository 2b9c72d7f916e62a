//! Discovering a pod's interfaces from inside its network namespace.
//!
//! SPEC section 2 (seed 004): a pod interface is any kernel interface in the pod's netns that has
//! an L3 address, except `lo`. We ask the kernel through `ip -j addr show` run inside the netns
//! (iproute2's JSON is stable and saves a netlink dependency) and parse it here.
//!
//! IPv6 link-local addresses (`fe80::/10`) exist on every IPv6-enabled interface, so they do not
//! make an interface a pod interface, and they never identify a pod to policy. They are kept apart
//! in [`DiscoveredInterface::link_local`]: an interface whose only addresses are link-local is not
//! returned at all, and `addrs` holds only the addresses that count.

use std::net::IpAddr;
use std::path::Path;

use ipnet::IpNet;
use serde::Deserialize;

use crate::netns::{exec_in, NetnsError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredInterface {
    pub name: String,
    pub index: u32,
    /// The addresses that count for policy (IPv4 of any scope, IPv6 except link-local), with
    /// their prefix lengths, in kernel order.
    pub addrs: Vec<IpNet>,
    /// IPv6 link-local addresses, kept for information only (see the module doc).
    pub link_local: Vec<IpNet>,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
}

impl DiscoveredInterface {
    pub fn ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.addrs.iter().map(IpNet::addr)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("cannot parse `ip -j addr show` output: {0}")]
    Json(#[from] serde_json::Error),
    #[error("interface {interface}: bad address {addr}/{prefix_len}")]
    BadAddress {
        interface: String,
        addr: String,
        prefix_len: u8,
    },
}

/// The interfaces with an L3 address in the netns at `path`, except `lo`.
pub fn interfaces(path: &Path) -> Result<Vec<DiscoveredInterface>, DiscoverError> {
    let output = exec_in(path, "ip", &["-j", "addr", "show"], None)?;
    parse_ip_addr_json(&output.stdout)
}

#[derive(Deserialize)]
struct IpLink {
    ifindex: u32,
    ifname: String,
    #[serde(default)]
    flags: Vec<String>,
    #[serde(default)]
    addr_info: Vec<IpAddrInfo>,
}

#[derive(Deserialize)]
struct IpAddrInfo {
    // Entries without `local` (e.g. a lone `broadcast`) do not carry an address.
    local: Option<String>,
    prefixlen: Option<u8>,
}

/// Parses the JSON of `ip -j addr show` (split out so it can be tested without a netns).
pub fn parse_ip_addr_json(json: &[u8]) -> Result<Vec<DiscoveredInterface>, DiscoverError> {
    let links: Vec<IpLink> = serde_json::from_slice(json)?;
    let mut out = Vec::new();
    for link in links {
        if link.ifname == "lo" {
            continue;
        }
        let mut addrs = Vec::new();
        let mut link_local = Vec::new();
        for info in &link.addr_info {
            let Some(local) = &info.local else { continue };
            let bad = || DiscoverError::BadAddress {
                interface: link.ifname.clone(),
                addr: local.clone(),
                prefix_len: info.prefixlen.unwrap_or(0),
            };
            let ip: IpAddr = local.parse().map_err(|_| bad())?;
            let host_len = if ip.is_ipv4() { 32 } else { 128 };
            let net = IpNet::new(ip, info.prefixlen.unwrap_or(host_len)).map_err(|_| bad())?;
            match ip {
                IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => link_local.push(net),
                _ => addrs.push(net),
            }
        }
        if addrs.is_empty() {
            continue;
        }
        out.push(DiscoveredInterface {
            up: link.flags.iter().any(|f| f == "UP"),
            name: link.ifname,
            index: link.ifindex,
            addrs,
            link_local,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"[
      {"ifindex":1,"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"],"addr_info":[
        {"family":"inet","local":"127.0.0.1","prefixlen":8,"scope":"host"},
        {"family":"inet6","local":"::1","prefixlen":128,"scope":"host"}]},
      {"ifindex":2,"ifname":"eth0","link_index":9,"flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],
       "addr_info":[
        {"family":"inet","local":"10.0.0.5","prefixlen":24,"broadcast":"10.0.0.255","scope":"global"},
        {"family":"inet6","local":"fd00::5","prefixlen":64,"scope":"global"},
        {"family":"inet6","local":"fe80::1","prefixlen":64,"scope":"link"}]},
      {"ifindex":3,"ifname":"net1","flags":["BROADCAST","MULTICAST"],"addr_info":[
        {"family":"inet","local":"192.168.7.2","prefixlen":28,"scope":"global"}]},
      {"ifindex":4,"ifname":"ll-only","flags":["UP"],"addr_info":[
        {"family":"inet6","local":"fe80::2","prefixlen":64,"scope":"link"}]},
      {"ifindex":5,"ifname":"bare","flags":["UP"],"addr_info":[]}
    ]"#;

    #[test]
    fn keeps_l3_interfaces_except_lo_and_link_local_only() {
        let got = parse_ip_addr_json(SAMPLE.as_bytes()).unwrap();
        let names: Vec<&str> = got.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["eth0", "net1"]);
        let eth0 = &got[0];
        assert_eq!(eth0.index, 2);
        assert!(eth0.up);
        assert_eq!(
            eth0.addrs,
            vec![
                "10.0.0.5/24".parse::<IpNet>().unwrap(),
                "fd00::5/64".parse().unwrap()
            ]
        );
        assert_eq!(
            eth0.link_local,
            vec!["fe80::1/64".parse::<IpNet>().unwrap()]
        );
        assert_eq!(
            eth0.ips().collect::<Vec<_>>(),
            vec![
                "10.0.0.5".parse::<IpAddr>().unwrap(),
                "fd00::5".parse().unwrap()
            ]
        );
        assert!(!got[1].up);
        assert_eq!(
            got[1].addrs,
            vec!["192.168.7.2/28".parse::<IpNet>().unwrap()]
        );
    }

    #[test]
    fn rejects_garbage() {
        assert!(matches!(
            parse_ip_addr_json(b"{"),
            Err(DiscoverError::Json(_))
        ));
        let bad = br#"[{"ifindex":2,"ifname":"x","addr_info":[{"local":"nope","prefixlen":8}]}]"#;
        assert!(matches!(
            parse_ip_addr_json(bad),
            Err(DiscoverError::BadAddress { .. })
        ));
        let bad =
            br#"[{"ifindex":2,"ifname":"x","addr_info":[{"local":"10.0.0.1","prefixlen":40}]}]"#;
        assert!(matches!(
            parse_ip_addr_json(bad),
            Err(DiscoverError::BadAddress { .. })
        ));
    }
}
