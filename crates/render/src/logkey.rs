//! The NFLOG prefix contract between the rendered rules and the event collector.
//!
//! A log rule carries `nw:<action>:<key> ` where `<action>` is `wd` (would-deny), `dn` (deny)
//! or `ob` (observed: a distinct flow in learn mode) and `<key>` 8 lowercase hex digits identifying one (interface, direction) of the pod. The
//! collector maps the key back with [`log_keys`] on the pod's current [`PodRules`], so nothing
//! from object names, labels or annotations ever appears in the prefix (which the kernel limits
//! to 64 bytes for NFLOG, 29 for the iptables LOG target — ours is 15 ASCII bytes).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use netwarden_engine::{AdminRef, Direction, NetworkId, PodRules, PolicyRef, StagedCause};

use netwarden_engine::hash::hash_parts;

/// What a log message reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogAction {
    /// The enforced view allowed, the staged view would deny (the packet passed).
    WouldDeny,
    /// The enforced view denied (the packet was rejected).
    Deny,
    /// Learn mode saw a flow not seen in the current window (the verdict is not involved).
    Observed,
}

impl LogAction {
    /// The two letters in the prefix.
    pub fn code(self) -> &'static str {
        match self {
            LogAction::WouldDeny => "wd",
            LogAction::Deny => "dn",
            LogAction::Observed => "ob",
        }
    }

    /// The event's `action` field (SPEC 6).
    pub fn as_str(self) -> &'static str {
        match self {
            LogAction::WouldDeny => "would-deny",
            LogAction::Deny => "deny",
            LogAction::Observed => "observed",
        }
    }
}

/// Identifies one (interface, direction) of a pod in log prefixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogKey(pub u32);

impl fmt::Display for LogKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

const PREFIX_TAG: &str = "nw";

/// `nw:wd:0123abcd ` — ASCII, 15 bytes, with a trailing space so the kernel log line stays
/// readable when the prefix is printed in front of packet fields.
pub fn log_prefix(action: LogAction, key: LogKey) -> String {
    format!("{PREFIX_TAG}:{}:{key} ", action.code())
}

/// Inverse of [`log_prefix`]; tolerates a missing trailing space and trailing NULs (NFLOG
/// delivers the prefix as a C string).
pub fn parse_log_prefix(s: &str) -> Option<(LogAction, LogKey)> {
    let s = s.trim_end_matches(['\0', ' ']);
    let mut parts = s.split(':');
    if parts.next()? != PREFIX_TAG {
        return None;
    }
    let action = match parts.next()? {
        "wd" => LogAction::WouldDeny,
        "dn" => LogAction::Deny,
        "ob" => LogAction::Observed,
        _ => return None,
    };
    let hex = parts.next()?;
    if parts.next().is_some() || hex.len() != 8 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let key = u32::from_str_radix(hex, 16).ok()?;
    Some((action, LogKey(key)))
}

/// A kernel counter kept per monitored (interface, direction) of a pod: the evidence a `status`
/// record carries besides the events (issue 9, "promotion with evidence"). Counted in the
/// policy chain of that interface and direction, so only traffic a monitored policy judges:
///
/// - [`Connections`](CounterKind::Connections): new connections entering the chain;
/// - [`WouldDeny`](CounterKind::WouldDeny): new connections the staged view would deny;
/// - [`Logged`](CounterKind::Logged): those of them the rate limit let through to the log.
///
/// `WouldDeny − Logged` is what the rate limit suppressed. The name is the same in both
/// backends (an nft named counter, an iptables rule comment) and, like a log prefix, carries
/// only a generated key: `nw_cn_0123abcd`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CounterKind {
    Connections,
    WouldDeny,
    Logged,
}

impl CounterKind {
    pub const ALL: [CounterKind; 3] = [
        CounterKind::Connections,
        CounterKind::WouldDeny,
        CounterKind::Logged,
    ];

    fn code(self) -> &'static str {
        match self {
            CounterKind::Connections => "cn",
            CounterKind::WouldDeny => "wd",
            CounterKind::Logged => "wl",
        }
    }
}

/// `nw_cn_0123abcd`: the name of counter `kind` of (interface, direction) `key`.
pub fn counter_name(kind: CounterKind, key: LogKey) -> String {
    format!("{PREFIX_TAG}_{}_{key}", kind.code())
}

/// Inverse of [`counter_name`]; `None` for any other name (learn mode's `lrn_full`, another
/// tool's comment).
pub fn parse_counter_name(s: &str) -> Option<(CounterKind, LogKey)> {
    let rest = s.strip_prefix(PREFIX_TAG)?.strip_prefix('_')?;
    let (code, hex) = rest.split_once('_')?;
    let kind = CounterKind::ALL.into_iter().find(|k| k.code() == code)?;
    if hex.len() != 8 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((kind, LogKey(u32::from_str_radix(hex, 16).ok()?)))
}

/// What the collector needs to turn a log message into an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogKeyInfo {
    pub interface: String,
    pub network: NetworkId,
    pub direction: Direction,
    pub monitored_policies: Vec<PolicyRef>,
    /// Monitored admin policies with rules on this direction (SPEC 8).
    pub monitored_admin: Vec<AdminRef>,
    pub enforced_policies: Vec<PolicyRef>,
    /// Enforced admin policies with rules on this direction (SPEC 8): a deny may be theirs.
    pub enforced_admin: Vec<AdminRef>,
    /// Why a would-deny happened (meaningless for deny messages).
    pub cause: StagedCause,
}

/// The key of every (interface, direction) of the pod. Stable: a hash of the interface name and
/// direction, so a key survives unrelated changes of the pod's rules. Collisions inside one pod
/// (rare: a handful of interfaces) are resolved by rehashing with a counter, visiting pairs in
/// sorted order so the result does not depend on the order of `rules.interfaces`.
pub(crate) fn assign_keys(rules: &PodRules) -> BTreeMap<(String, Direction), LogKey> {
    let mut pairs: Vec<(String, Direction)> = rules
        .interfaces
        .iter()
        .flat_map(|i| {
            [
                (i.name.clone(), Direction::Ingress),
                (i.name.clone(), Direction::Egress),
            ]
        })
        .collect();
    pairs.sort();
    pairs.dedup();
    let mut used = BTreeSet::new();
    let mut out = BTreeMap::new();
    for (name, dir) in pairs {
        let mut attempt: u32 = 0;
        let key = loop {
            let salt = attempt.to_be_bytes();
            let parts: Vec<&[u8]> = if attempt == 0 {
                vec![name.as_bytes(), dir.as_str().as_bytes()]
            } else {
                vec![name.as_bytes(), dir.as_str().as_bytes(), &salt]
            };
            // The low 32 bits of the project's content hash (8 hex digits in the prefix).
            let k = hash_parts(&parts) as u32;
            if used.insert(k) {
                break k;
            }
            attempt += 1;
        };
        out.insert((name, dir), LogKey(key));
    }
    out
}

/// Key → what it stands for, for every (interface, direction) of the pod.
pub fn log_keys(rules: &PodRules) -> BTreeMap<u32, LogKeyInfo> {
    let keys = assign_keys(rules);
    let mut out = BTreeMap::new();
    for iface in &rules.interfaces {
        for dir in [Direction::Ingress, Direction::Egress] {
            let Some(key) = keys.get(&(iface.name.clone(), dir)) else {
                continue;
            };
            let dr = iface.direction(dir);
            out.entry(key.0).or_insert_with(|| LogKeyInfo {
                interface: iface.name.clone(),
                network: iface.network.clone(),
                direction: dir,
                monitored_policies: dr.monitored_policies.clone(),
                monitored_admin: dr.monitored_admin(),
                enforced_policies: dr.enforced_policies.clone(),
                enforced_admin: dr.enforced_admin(),
                cause: dr.staged_cause(),
            });
        }
    }
    out
}

/// The key of one (interface, direction) of the pod, if the interface exists.
pub fn log_key_for(rules: &PodRules, interface: &str, direction: Direction) -> Option<LogKey> {
    assign_keys(rules)
        .get(&(interface.to_string(), direction))
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::{DirectionRules, InterfaceRules, ObjectKey};

    #[test]
    fn counter_names_round_trip_and_nothing_else_parses() {
        for kind in CounterKind::ALL {
            let name = counter_name(kind, LogKey(0x0123_abcd));
            assert_eq!(name.len(), 14, "{name}");
            assert_eq!(parse_counter_name(&name), Some((kind, LogKey(0x0123_abcd))));
        }
        assert_eq!(
            counter_name(CounterKind::Logged, LogKey(7)),
            "nw_wl_00000007"
        );
        for other in [
            "lrn_full",
            "nw_xx_0123abcd",
            "nw_cn_0123abc",
            "nw_cn_0123abcdz",
            "cn_0123abcd",
            "",
        ] {
            assert_eq!(parse_counter_name(other), None, "{other}");
        }
    }

    fn pod(ifaces: &[&str]) -> PodRules {
        PodRules {
            pod: ObjectKey::new("ns", "p"),
            netns: None,
            learn: false,
            interfaces: ifaces
                .iter()
                .map(|n| InterfaceRules {
                    name: n.to_string(),
                    network: NetworkId::Primary,
                    ips: vec![],
                    ingress: DirectionRules::open(),
                    egress: DirectionRules::open(),
                })
                .collect(),
        }
    }

    #[test]
    fn prefix_round_trips() {
        for action in [LogAction::WouldDeny, LogAction::Deny, LogAction::Observed] {
            let p = log_prefix(action, LogKey(0x0123abcd));
            assert!(p.is_ascii() && p.len() < 32, "{p}");
            assert_eq!(parse_log_prefix(&p), Some((action, LogKey(0x0123abcd))));
            assert_eq!(
                parse_log_prefix(p.trim_end()),
                Some((action, LogKey(0x0123abcd)))
            );
        }
        assert_eq!(
            log_prefix(LogAction::WouldDeny, LogKey(0x0123abcd)),
            "nw:wd:0123abcd "
        );
        assert_eq!(
            log_prefix(LogAction::Observed, LogKey(0x0123abcd)),
            "nw:ob:0123abcd "
        );
        assert_eq!(parse_log_prefix("nw:xx:0123abcd "), None);
        assert_eq!(parse_log_prefix("nw:wd:0123abc "), None);
        assert_eq!(parse_log_prefix("nw:wd:0123abcg"), None);
        assert_eq!(parse_log_prefix("xx:wd:0123abcd"), None);
        assert_eq!(parse_log_prefix("nw:wd:0123abcd:1"), None);
    }

    #[test]
    fn keys_are_stable_unique_and_order_independent() {
        let a = log_keys(&pod(&["eth0", "net1", "net2"]));
        let b = log_keys(&pod(&["net2", "eth0", "net1"]));
        assert_eq!(a, b);
        assert_eq!(a.len(), 6);
        // The key of eth0 does not depend on the other interfaces.
        let c = log_keys(&pod(&["eth0"]));
        for (k, info) in &c {
            assert_eq!(a.get(k), Some(info));
        }
        let k = log_key_for(&pod(&["eth0"]), "eth0", Direction::Ingress).unwrap();
        assert_eq!(c[&k.0].direction, Direction::Ingress);
    }

    #[test]
    fn many_interfaces_get_distinct_keys() {
        let names: Vec<String> = (0..500).map(|i| format!("if{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        assert_eq!(log_keys(&pod(&refs)).len(), 1000);
    }
}
