//! Monitor and deny events: one JSON line each, with the field names SPEC section 6 fixes.
//!
//! A log record names only a key (`nw:wd:<8 hex>`, see `netwarden_render::logkey`); the pod
//! context it was collected for maps the key back to interface, network, direction and policies,
//! so nothing an object's author controls ever travelled through the kernel. Records whose key
//! the context does not know (stale rules, someone else's log rule on the same group) are
//! counted as unknown and not emitted.

use std::collections::BTreeMap;
use std::net::IpAddr;

use netwarden_engine::{Direction, PodKey, PodRules, StagedCause};
use netwarden_render::{log_keys, parse_log_prefix, LogAction, LogKeyInfo};
use serde::{Deserialize, Deserializer, Serialize};

use crate::nlmsg::NflogRecord;
use crate::time::Timestamp;

/// What the collector knows about the pod whose netns a listener watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodContext {
    pub pod: PodKey,
    /// The node name put in every event.
    pub node: String,
    /// Log key → (interface, direction, policies), from `netwarden_render::log_keys`.
    pub log_keys: BTreeMap<u32, LogKeyInfo>,
}

impl PodContext {
    pub fn new(node: impl Into<String>, rules: &PodRules) -> PodContext {
        PodContext {
            pod: rules.pod.clone(),
            node: node.into(),
            log_keys: log_keys(rules),
        }
    }
}

/// `would-deny`, `deny` or `observed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventAction {
    WouldDeny,
    Deny,
    /// A distinct flow seen in learn mode (once per window per flow).
    Observed,
}

impl EventAction {
    pub fn as_str(self) -> &'static str {
        match self {
            EventAction::WouldDeny => "would-deny",
            EventAction::Deny => "deny",
            EventAction::Observed => "observed",
        }
    }
}

impl From<LogAction> for EventAction {
    fn from(a: LogAction) -> EventAction {
        match a {
            LogAction::WouldDeny => EventAction::WouldDeny,
            LogAction::Deny => EventAction::Deny,
            LogAction::Observed => EventAction::Observed,
        }
    }
}

/// Why an event happened (SPEC 4): a would-deny comes from a new isolation or from an allow
/// only the replaced policy gave; an enforced deny is just denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cause {
    NewIsolation,
    ReplacedAllow,
    /// A monitored admin policy's tier would deny (SPEC 8).
    AdminTier,
    Denied,
}

impl From<StagedCause> for Cause {
    fn from(c: StagedCause) -> Cause {
        match c {
            StagedCause::NewIsolation => Cause::NewIsolation,
            StagedCause::ReplacedAllow => Cause::ReplacedAllow,
            StagedCause::AdminTier => Cause::AdminTier,
        }
    }
}

/// One event. Serialized with exactly the field names of SPEC 6.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub time: Timestamp,
    pub node: String,
    pub action: EventAction,
    #[serde(deserialize_with = "de_direction")]
    pub direction: Direction,
    /// `ns/name` of the pod whose rules logged the packet.
    pub pod: String,
    pub interface: String,
    /// `default`, `ns/name` or a ClusterNetwork name.
    pub network: String,
    /// `ns/name` of the pod on the other end, when its address is known.
    pub peer: Option<String>,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: Option<u16>,
    pub dport: Option<u16>,
    /// `TCP`, `UDP`, `SCTP`, `ICMP`, `ICMPv6`, or the protocol number.
    pub protocol: String,
    /// Monitored policies concerned (`ns/name`).
    pub policies: Vec<String>,
    /// Enforced policies isolating this direction (`ns/name`), then the enforced admin policies
    /// with rules on it (`Kind/name`): a deny may come from any of them.
    pub enforced_policies: Vec<String>,
    pub cause: Option<Cause>,
}

fn de_direction<'de, D: Deserializer<'de>>(d: D) -> Result<Direction, D::Error> {
    match <std::borrow::Cow<'de, str>>::deserialize(d)?.as_ref() {
        "ingress" => Ok(Direction::Ingress),
        "egress" => Ok(Direction::Egress),
        other => Err(serde::de::Error::custom(format!(
            "unknown direction {other:?}"
        ))),
    }
}

impl Event {
    /// The event as one JSON line, without the newline.
    pub fn to_json_line(&self) -> String {
        // Serializing plain strings, numbers and addresses cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The address on the other end, from the logged pod's point of view.
    pub fn peer_addr(&self) -> IpAddr {
        match self.direction {
            Direction::Ingress => self.src,
            Direction::Egress => self.dst,
        }
    }
}

/// Why a record produced no event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unrecognized {
    #[error("log record without prefix")]
    NoPrefix,
    #[error("log prefix {0:?} is not netwarden's")]
    ForeignPrefix(String),
    #[error("log key {0:08x} unknown for this pod")]
    UnknownKey(u32),
    #[error("log record without a decodable IP packet")]
    NoPacket,
}

/// Builds the event for `record`, logged in the netns of `ctx.pod`.
///
/// `time` is used when the kernel gave no timestamp (it only stamps packets that came in
/// through an interface), or one RFC 3339 cannot write (past year 9999: its eight bytes of
/// seconds are not checked by anyone before us), which would make a line no reader accepts. `resolve` maps an address to the pod holding it in the current state.
pub fn build_event(
    record: &NflogRecord,
    time: Timestamp,
    ctx: &PodContext,
    resolve: &dyn Fn(IpAddr) -> Option<PodKey>,
) -> Result<Event, Unrecognized> {
    let prefix = record.prefix.as_deref().ok_or(Unrecognized::NoPrefix)?;
    let (action, key) =
        parse_log_prefix(prefix).ok_or_else(|| Unrecognized::ForeignPrefix(prefix.to_owned()))?;
    let info = ctx
        .log_keys
        .get(&key.0)
        .ok_or(Unrecognized::UnknownKey(key.0))?;
    let packet = record.packet.as_ref().ok_or(Unrecognized::NoPacket)?;
    let peer_addr = match info.direction {
        Direction::Ingress => packet.src,
        Direction::Egress => packet.dst,
    };
    let action = EventAction::from(action);
    // An observed flow is no verdict: it names no policy and has no cause (SPEC 6).
    let observed = action == EventAction::Observed;
    // Admin policies follow the namespaced ones, named `Kind/name` (they have no namespace).
    let policy_names = |namespaced: &[netwarden_engine::PolicyRef],
                        admin: &[netwarden_engine::AdminRef]|
     -> Vec<String> {
        if observed {
            Vec::new()
        } else {
            let admin = admin.iter().map(ToString::to_string);
            namespaced
                .iter()
                .map(ToString::to_string)
                .chain(admin)
                .collect()
        }
    };
    Ok(Event {
        time: record
            .timestamp
            .map(Timestamp::from)
            .filter(|t| t.is_rfc3339())
            .unwrap_or(time),
        node: ctx.node.clone(),
        action,
        direction: info.direction,
        pod: ctx.pod.to_string(),
        interface: info.interface.clone(),
        network: info.network.to_string(),
        peer: resolve(peer_addr).map(|k| k.to_string()),
        src: packet.src,
        dst: packet.dst,
        sport: packet.sport,
        dport: packet.dport,
        protocol: packet.protocol.name().into_owned(),
        policies: policy_names(&info.monitored_policies, &info.monitored_admin),
        enforced_policies: policy_names(&info.enforced_policies, &info.enforced_admin),
        cause: match action {
            EventAction::WouldDeny => Some(info.cause.into()),
            EventAction::Deny => Some(Cause::Denied),
            EventAction::Observed => None,
        },
    })
}

/// A line of an events file that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct BadLine {
    pub line: usize,
    pub reason: String,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::decode::{L4Protocol, PacketInfo};
    use crate::sink::{EventSink, FanoutSink, JsonLinesSink, MemorySink};
    use crate::status::{read_events, read_events_file};
    use netwarden_engine::{
        DirectionRules, InterfaceRules, Isolation, NetworkId, ObjectKey, PolicyKind, PolicyRef,
    };
    use netwarden_render::{log_key_for, log_prefix, LogKey};

    pub fn policy(ns: &str, name: &str) -> PolicyRef {
        PolicyRef {
            kind: PolicyKind::NetworkPolicy,
            key: ObjectKey::new(ns, name),
        }
    }

    /// A pod with eth0 (primary, ingress monitored by `shop/new-web`, enforced `shop/old`)
    /// and net1 (egress enforced by `shop/lock`).
    pub fn rules() -> PodRules {
        let mut ingress = DirectionRules::open();
        ingress.enforced = Isolation::Isolated(vec![].into());
        ingress.staged = Isolation::Isolated(vec![].into());
        ingress.enforced_policies = vec![policy("shop", "old")];
        ingress.monitored_policies = vec![policy("shop", "new-web")];
        ingress.replaced_policies = vec![policy("shop", "old")];
        let mut egress = DirectionRules::open();
        egress.enforced = Isolation::Isolated(vec![].into());
        egress.staged = Isolation::Isolated(vec![].into());
        egress.enforced_policies = vec![policy("shop", "lock")];
        PodRules {
            learn: false,
            pod: ObjectKey::new("shop", "web-7d4b9c-xk2p9"),
            netns: None,
            interfaces: vec![
                InterfaceRules {
                    name: "eth0".into(),
                    network: NetworkId::Primary,
                    ips: vec!["10.0.0.2".parse().unwrap()],
                    ingress,
                    egress: DirectionRules::open(),
                },
                InterfaceRules {
                    name: "net1".into(),
                    network: NetworkId::nad("shop", "storage"),
                    ips: vec!["192.168.5.2".parse().unwrap()],
                    ingress: DirectionRules::open(),
                    egress,
                },
            ],
        }
    }

    pub fn record(prefix: &str, src: &str, dst: &str, dport: u16) -> NflogRecord {
        NflogRecord {
            family: 2,
            group: 100,
            prefix: Some(prefix.to_owned()),
            hw_protocol: Some(0x0800),
            hook: Some(1),
            mark: None,
            indev: None,
            outdev: None,
            timestamp: None,
            seq: Some(1),
            packet: Some(PacketInfo {
                src: src.parse().unwrap(),
                dst: dst.parse().unwrap(),
                protocol: L4Protocol::Tcp,
                sport: Some(40000),
                dport: Some(dport),
                icmp: None,
            }),
        }
    }

    fn resolver(ip: IpAddr) -> Option<PodKey> {
        (ip == "10.0.0.9".parse::<IpAddr>().unwrap()).then(|| ObjectKey::new("shop", "client-0"))
    }

    #[test]
    fn would_deny_event_has_the_spec_fields() {
        let r = rules();
        let ctx = PodContext::new("node-a", &r);
        let key = log_key_for(&r, "eth0", Direction::Ingress).unwrap();
        let rec = record(
            &log_prefix(LogAction::WouldDeny, key),
            "10.0.0.9",
            "10.0.0.2",
            8080,
        );
        let ev = build_event(&rec, Timestamp(1_700_000_000_000_000), &ctx, &resolver).unwrap();
        let json: serde_json::Value = serde_json::from_str(&ev.to_json_line()).unwrap();
        let expected = serde_json::json!({
            "time": "2023-11-14T22:13:20.000000Z",
            "node": "node-a",
            "action": "would-deny",
            "direction": "ingress",
            "pod": "shop/web-7d4b9c-xk2p9",
            "interface": "eth0",
            "network": "default",
            "peer": "shop/client-0",
            "src": "10.0.0.9",
            "dst": "10.0.0.2",
            "sport": 40000,
            "dport": 8080,
            "protocol": "TCP",
            "policies": ["shop/new-web"],
            "enforced_policies": ["shop/old"],
            "cause": "replaced-allow",
        });
        assert_eq!(json, expected);
        // And it reads back.
        let back: Event = serde_json::from_value(json).unwrap();
        assert_eq!(back, ev);
    }

    #[test]
    fn observed_event_names_no_policy() {
        // The same (interface, direction) key as would-deny messages, action `ob`: the event
        // has the usual fields, no policy and no cause (SPEC 6).
        let r = rules();
        let ctx = PodContext::new("node-a", &r);
        let key = log_key_for(&r, "eth0", Direction::Ingress).unwrap();
        let rec = record(
            &log_prefix(LogAction::Observed, key),
            "10.0.0.9",
            "10.0.0.2",
            8080,
        );
        let ev = build_event(&rec, Timestamp(1_700_000_000_000_000), &ctx, &resolver).unwrap();
        assert_eq!(ev.action.as_str(), "observed");
        let json: serde_json::Value = serde_json::from_str(&ev.to_json_line()).unwrap();
        let expected = serde_json::json!({
            "time": "2023-11-14T22:13:20.000000Z",
            "node": "node-a",
            "action": "observed",
            "direction": "ingress",
            "pod": "shop/web-7d4b9c-xk2p9",
            "interface": "eth0",
            "network": "default",
            "peer": "shop/client-0",
            "src": "10.0.0.9",
            "dst": "10.0.0.2",
            "sport": 40000,
            "dport": 8080,
            "protocol": "TCP",
            "policies": [],
            "enforced_policies": [],
            "cause": null,
        });
        assert_eq!(json, expected);
        let back: Event = serde_json::from_value(json).unwrap();
        assert_eq!(back, ev);
    }

    #[test]
    fn a_kernel_time_rfc3339_cannot_write_gives_the_receive_time() {
        // Found by the nflog fuzz check: NFULA_TIMESTAMP is eight bytes of seconds; past year
        // 9999 the time was written with a five-digit year, a line `read_events` (and so
        // `netwarden report`) rejects.
        let r = rules();
        let ctx = PodContext::new("node-a", &r);
        let key = log_key_for(&r, "eth0", Direction::Ingress).unwrap();
        let received = Timestamp(1_700_000_000_000_000);
        for secs in [253_402_300_800, 1 << 40, u64::from(u32::MAX) << 24] {
            let mut rec = record(
                &log_prefix(LogAction::WouldDeny, key),
                "10.0.0.9",
                "10.0.0.2",
                80,
            );
            rec.timestamp =
                std::time::SystemTime::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(secs));
            let ev = build_event(&rec, received, &ctx, &resolver).unwrap();
            assert_eq!(ev.time, received, "{secs}");
            let (events, bad) = read_events(ev.to_json_line().as_bytes()).unwrap();
            assert!(bad.is_empty(), "{bad:?}");
            assert_eq!(events, vec![ev]);
        }
        // The last instant RFC 3339 can write is kept.
        let mut rec = record(
            &log_prefix(LogAction::WouldDeny, key),
            "10.0.0.9",
            "10.0.0.2",
            80,
        );
        rec.timestamp = Some(
            std::time::SystemTime::UNIX_EPOCH
                + std::time::Duration::from_micros(253_402_300_799_999_999),
        );
        let ev = build_event(&rec, received, &ctx, &resolver).unwrap();
        assert_eq!(ev.time.to_string(), "9999-12-31T23:59:59.999999Z");
    }

    #[test]
    fn deny_event_on_secondary_network_with_unknown_peer() {
        let r = rules();
        let ctx = PodContext::new("node-a", &r);
        let key = log_key_for(&r, "net1", Direction::Egress).unwrap();
        let mut rec = record(
            &log_prefix(LogAction::Deny, key),
            "192.168.5.2",
            "192.168.5.77",
            5432,
        );
        rec.timestamp =
            Some(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(86_400));
        let ev = build_event(&rec, Timestamp(0), &ctx, &resolver).unwrap();
        assert_eq!(ev.action, EventAction::Deny);
        assert_eq!(ev.direction, Direction::Egress);
        assert_eq!(ev.network, "shop/storage");
        assert_eq!(ev.peer, None);
        assert_eq!(ev.peer_addr(), "192.168.5.77".parse::<IpAddr>().unwrap());
        assert_eq!(ev.cause, Some(Cause::Denied));
        assert_eq!(ev.enforced_policies, vec!["shop/lock"]);
        assert!(ev.policies.is_empty());
        assert_eq!(
            ev.time,
            Timestamp::from_secs(86_400),
            "kernel timestamp wins"
        );
        let json: serde_json::Value = serde_json::from_str(&ev.to_json_line()).unwrap();
        assert_eq!(json["peer"], serde_json::Value::Null);
        assert_eq!(json["cause"], "denied");
    }

    #[test]
    fn deny_and_would_deny_events_name_the_admin_policies_of_their_direction() {
        use netwarden_engine::{
            AdminAction, AdminKind, AdminRef, Mode, Tier, TierOrigin, TierRule, TierRules,
        };
        let rule = |kind, name: &str, tier, mode| TierRule {
            origin: TierOrigin {
                policy: AdminRef {
                    kind,
                    name: name.to_owned(),
                },
                tier,
                priority: 10,
                direction: Direction::Egress,
                index: 0,
                name: None,
                mode,
            },
            action: AdminAction::Deny,
            clauses: Vec::new(),
        };
        let guard = rule(
            AdminKind::ClusterNetworkPolicy,
            "guard",
            Tier::Admin,
            Mode::Enforce,
        );
        let trial = rule(
            AdminKind::AdminNetworkPolicy,
            "trial",
            Tier::Admin,
            Mode::Monitor,
        );
        let floor = rule(
            AdminKind::BaselineAdminNetworkPolicy,
            "default",
            Tier::Baseline,
            Mode::Enforce,
        );
        let mut r = rules();
        let egress = &mut r.interfaces[1].egress;
        egress.admin = TierRules {
            enforced: vec![guard.clone()].into(),
            staged: vec![guard, trial].into(),
        };
        egress.baseline = TierRules {
            enforced: vec![floor.clone()].into(),
            staged: vec![floor].into(),
        };
        let ctx = PodContext::new("node-a", &r);
        let key = log_key_for(&r, "net1", Direction::Egress).unwrap();
        let event = |action| {
            let rec = record(&log_prefix(action, key), "192.168.5.2", "192.168.5.9", 5432);
            build_event(&rec, Timestamp(0), &ctx, &resolver).unwrap()
        };
        let deny = event(LogAction::Deny);
        assert_eq!(
            deny.enforced_policies,
            [
                "shop/lock",
                "ClusterNetworkPolicy/guard",
                "BaselineAdminNetworkPolicy/default"
            ]
        );
        let would_deny = event(LogAction::WouldDeny);
        assert_eq!(would_deny.policies, ["AdminNetworkPolicy/trial"]);
        assert_eq!(deny.policies, would_deny.policies);
        assert_eq!(would_deny.enforced_policies, deny.enforced_policies);
        let observed = event(LogAction::Observed);
        assert!(observed.policies.is_empty() && observed.enforced_policies.is_empty());
    }

    #[test]
    fn unrecognized_records() {
        let r = rules();
        let ctx = PodContext::new("n", &r);
        let t = Timestamp(0);
        let mut rec = record("nw:wd:00000000 ", "10.0.0.9", "10.0.0.2", 1);
        let known = log_key_for(&r, "eth0", Direction::Ingress).unwrap();
        let unknown = (0..)
            .map(LogKey)
            .find(|k| !ctx.log_keys.contains_key(&k.0))
            .unwrap();
        rec.prefix = Some(log_prefix(LogAction::WouldDeny, unknown));
        assert_eq!(
            build_event(&rec, t, &ctx, &resolver),
            Err(Unrecognized::UnknownKey(unknown.0))
        );
        rec.prefix = Some("DROP ".into());
        assert!(matches!(
            build_event(&rec, t, &ctx, &resolver),
            Err(Unrecognized::ForeignPrefix(_))
        ));
        rec.prefix = None;
        assert_eq!(
            build_event(&rec, t, &ctx, &resolver),
            Err(Unrecognized::NoPrefix)
        );
        rec.prefix = Some(log_prefix(LogAction::WouldDeny, known));
        rec.packet = None;
        assert_eq!(
            build_event(&rec, t, &ctx, &resolver),
            Err(Unrecognized::NoPacket)
        );
    }

    #[test]
    fn sinks_write_lines_and_read_back() {
        let r = rules();
        let ctx = PodContext::new("node-a", &r);
        let key = log_key_for(&r, "eth0", Direction::Ingress).unwrap();
        let rec = record(
            &log_prefix(LogAction::WouldDeny, key),
            "10.0.0.9",
            "10.0.0.2",
            80,
        );
        let ev = build_event(&rec, Timestamp(5), &ctx, &resolver).unwrap();

        let dir = std::env::temp_dir().join(format!("nw-monitor-sink-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("events.jsonl");
        let _ = std::fs::remove_file(&path);
        let mem = MemorySink::new();
        let fan = FanoutSink(vec![
            Box::new(JsonLinesSink::new(false, Some(&path)).unwrap()),
            Box::new(mem.clone()),
        ]);
        fan.emit(&ev).unwrap();
        // A second sink on the same file appends.
        JsonLinesSink::new(false, Some(&path))
            .unwrap()
            .emit(&ev)
            .unwrap();
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("\n{not json}\n");
        let (events, bad) = read_events(text.as_bytes()).unwrap();
        assert_eq!(read_events_file(&path).unwrap().0.len(), 2);
        assert_eq!(events, vec![ev.clone(), ev.clone()]);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].line, 4);
        assert_eq!(mem.take(), vec![ev]);
        assert!(mem.events().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
