//! Parsers for the small values the command line takes: `PORT/PROTO`, pod selectors
//! (`ns/pod`, `ns/*`, `*`) and durations.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

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

/// Parses a duration the same way for every option: jiff's friendly format (`1h30m`, `1.5h`,
/// `90s`, `250ms`, `2d`, `1w`, `1h 30m`; days are 24 hours, weeks 7 days; months and years are
/// refused as ambiguous), then checks it lies within `min..=max`, so that neither a huge value
/// (an overflow, a wait of centuries) nor zero (a loop spinning a core) gets through.
pub fn parse_duration_within(s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let span: jiff::Span = s.trim().parse().map_err(|e| {
        format!("invalid duration {s:?}: {e} (examples: 500ms, 30s, 1h30m, 1.5h, 2d)")
    })?;
    let relative = jiff::SpanRelativeTo::days_are_24_hours();
    let signed = span
        .to_duration(relative)
        .map_err(|e| format!("invalid duration {s:?}: {e}"))?;
    let d = Duration::try_from(signed)
        .map_err(|_| format!("invalid duration {s:?}: must not be negative"))?;
    if d < min || d > max {
        return Err(format!(
            "duration {s:?} out of range: between {} and {}",
            show_duration(min),
            show_duration(max)
        ));
    }
    Ok(d)
}

/// `run --crd-grace`: 0 (a kind not served is dropped at the first answer saying so) up to a
/// day.
pub fn parse_crd_grace(s: &str) -> Result<Duration, String> {
    parse_duration_within(s, Duration::ZERO, Duration::from_secs(86_400))
}

/// A duration the way people write it (`250ms`, `1s`, `1h`).
pub fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        _ if ms.is_multiple_of(3_600_000) && ms > 0 => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) && ms > 0 => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1_000) && ms > 0 => format!("{}s", ms / 1_000),
        _ => format!("{ms}ms"),
    }
}

/// `--interval`: 10 ms to 1 hour.
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    parse_duration_within(s, Duration::from_millis(10), Duration::from_secs(3600))
}

/// `--clean-for` and other evidence windows: 1 second to 10 years.
pub fn parse_window(s: &str) -> Result<Duration, String> {
    parse_duration_within(
        s,
        Duration::from_secs(1),
        Duration::from_secs(3650 * 86_400),
    )
}

#[cfg(test)]
mod duration_tests {
    use super::*;

    #[test]
    fn durations_are_parsed_one_way_and_bounded() {
        let s = Duration::from_secs;
        for (text, want) in [
            ("1h30m", s(5400)),
            ("1.5h", s(5400)),
            ("1h 30m", s(5400)),
            ("90s", s(90)),
            ("250ms", Duration::from_millis(250)),
            ("2d", s(2 * 86_400)),
            ("1w", s(7 * 86_400)),
            ("1s", s(1)),
        ] {
            assert_eq!(
                parse_window(text).or_else(|_| parse_interval(text)),
                Ok(want),
                "{text}"
            );
        }
        assert_eq!(parse_interval("250ms"), Ok(Duration::from_millis(250)));
        // Zero would spin a core; a huge value would overflow or never come.
        assert!(parse_interval("0s").unwrap_err().contains("out of range"));
        assert!(parse_interval("0").is_err());
        assert!(parse_interval("5ms").is_err());
        assert!(parse_interval("2h")
            .unwrap_err()
            .contains("between 10ms and 1h"));
        assert!(parse_interval("99999999999999999999h").is_err());
        assert!(parse_interval("1e300s").is_err());
        assert!(parse_window("100000d").is_err());
        // Ambiguous or malformed.
        assert!(parse_window("1mo").is_err());
        assert!(parse_window("1y").is_err());
        assert!(parse_window("-5s").is_err());
        assert!(parse_window("").is_err());
        assert!(parse_window("abc").is_err());
    }
}
