//! The values written on the command line that the library's own analyses take: `PORT/PROTO`
//! ([`PortProto`]: `reach`, `explain`, `diff`, the lab and the demo probe ports) and pod
//! selectors ([`PodSelectorArg`]: `ns/pod`, `ns/*`, `*`, the pairs `reach` covers). The rest of
//! the command line — its flags and the parsers of the values only the binary reads (durations,
//! marks, kinds) — is the binary's `cli` module.

use std::fmt;
use std::str::FromStr;

use netwarden_engine::{PodKey, Protocol};

/// `80/TCP`, `53/udp`, or `8080` (TCP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortProto {
    pub port: u16,
    pub protocol: Protocol,
}

impl FromStr for PortProto {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (port, proto) = s.split_once('/').unwrap_or((s, "TCP"));
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("invalid port {port:?} in {s:?}: expected 1-65535"))?;
        let protocol = Protocol::parse(proto).ok_or_else(|| {
            format!("invalid protocol {proto:?} in {s:?}: expected TCP, UDP or SCTP")
        })?;
        Ok(PortProto { port, protocol })
    }
}

impl fmt::Display for PortProto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.port, self.protocol)
    }
}

/// `ns/pod`, `ns/*` or `*`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PodSelectorArg {
    #[default]
    All,
    Namespace(String),
    Pod(PodKey),
}

impl PodSelectorArg {
    pub fn matches(&self, pod: &PodKey) -> bool {
        match self {
            PodSelectorArg::All => true,
            PodSelectorArg::Namespace(ns) => pod.namespace == *ns,
            PodSelectorArg::Pod(key) => key == pod,
        }
    }
}

impl FromStr for PodSelectorArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "*" {
            return Ok(PodSelectorArg::All);
        }
        match s.split_once('/') {
            Some((ns, "*")) if !ns.is_empty() => Ok(PodSelectorArg::Namespace(ns.to_string())),
            Some((ns, pod)) if !ns.is_empty() && !pod.is_empty() && !pod.contains('/') => {
                Ok(PodSelectorArg::Pod(PodKey::new(ns, pod)))
            }
            _ => Err(format!(
                "invalid pod selector {s:?}: expected ns/pod, ns/* or *"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_proto() {
        assert_eq!(
            "80/TCP".parse::<PortProto>().unwrap(),
            PortProto {
                port: 80,
                protocol: Protocol::Tcp
            }
        );
        assert_eq!(
            "53/udp".parse::<PortProto>().unwrap().protocol,
            Protocol::Udp
        );
        assert_eq!("81".parse::<PortProto>().unwrap().protocol, Protocol::Tcp);
        assert!("0/TCP".parse::<PortProto>().is_err());
        assert!("70000/TCP".parse::<PortProto>().is_err());
        assert!("80/ICMP".parse::<PortProto>().is_err());
    }

    #[test]
    fn pod_selector() {
        let key = PodKey::new("x", "a");
        assert!("*".parse::<PodSelectorArg>().unwrap().matches(&key));
        assert!("x/*".parse::<PodSelectorArg>().unwrap().matches(&key));
        assert!(!"y/*".parse::<PodSelectorArg>().unwrap().matches(&key));
        assert!("x/a".parse::<PodSelectorArg>().unwrap().matches(&key));
        assert!("x".parse::<PodSelectorArg>().is_err());
    }
}
