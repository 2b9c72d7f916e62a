//! Judging a live connection against a pod's enforced rules, for revocation (SPEC 5): after an
//! apply, the agent lists the pod netns's connection-tracking entries and ends those the new
//! rules would refuse.
//!
//! A connection is known by its original-direction tuple ([`TrackedFlow`]), as conntrack holds
//! it in the pod netns. The judgement follows what the rendered rules do with the connection's
//! first packet (see `netwarden_render::dispatch` and the nft module doc there):
//!
//! - a flow sent **to** one of the pod's addresses is ingress, judged by the `ingress` rules of
//!   the interface owning that address (the input chain dispatches by destination address;
//!   an address two interfaces claim belongs to the first by name with an ingress chain, as
//!   there), the source being the peer;
//! - a flow sent **from** one of the pod's addresses is egress, judged by the `egress` rules of
//!   the interface owning that address, the destination being the peer. The output chain
//!   dispatches by outgoing interface; the interface that owns the source address is the one
//!   the route leaves by in every pod set up the usual way (a pod routing its own address out
//!   of another interface is judged here by the owner's rules);
//! - loopback (a loopback address, or the pod's addresses at both ends: the kernel delivers
//!   those over `lo`) and flows touching none of the pod's addresses (forwarded traffic,
//!   broadcast) are never revoked; nor are flows to or from an IPv6 link-local address, which
//!   is no pod address (the rules judge those by interface, which conntrack does not record).
//!
//! Only the **enforced** view counts: a monitored policy never changes what passes. TCP, UDP
//! and SCTP are judged with their destination port; any other protocol (ICMP echo, GRE, ...)
//! only by clauses without ports, as the rules match it (a clause with ports names its
//! protocol). Outgoing DNS that a view implies is allowed as the rules allow it.
//!
//! Every match on the rule types is exhaustive on purpose: a new kind of peer or port match
//! must be taught here before it compiles, so the judge cannot silently disagree with the
//! rules. Where it could not tell, it would keep the connection: the rules still judge every
//! new connection.

use std::net::IpAddr;

use crate::admin::{AdminAction, Tier};
use crate::model::{Direction, Protocol};
use crate::rules::{
    AllowRule, Clause, DirectionRules, InterfaceRules, Isolation, PeerMatch, PodRules, PortMatch,
    PortRange, TierRule,
};

/// IP protocol numbers of the protocols policies name by port.
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_SCTP: u8 = 132;

/// A tracked connection's original-direction tuple: who sent the first packet to whom.
/// `sport`/`dport` are 0 for protocols without ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrackedFlow {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// The IP protocol number (6 TCP, 17 UDP, 132 SCTP, 1 ICMP, 58 ICMPv6 ...).
    pub protocol: u8,
    pub sport: u16,
    pub dport: u16,
}

impl TrackedFlow {
    /// The policy protocol of this flow, when it is one policies name with ports.
    pub fn policy_protocol(&self) -> Option<Protocol> {
        match self.protocol {
            IPPROTO_TCP => Some(Protocol::Tcp),
            IPPROTO_UDP => Some(Protocol::Udp),
            IPPROTO_SCTP => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

impl std::fmt::Display for TrackedFlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let end = |f: &mut std::fmt::Formatter<'_>, ip: IpAddr, port: u16| match ip {
            IpAddr::V4(v4) => write!(f, "{v4}:{port}"),
            IpAddr::V6(v6) => write!(f, "[{v6}]:{port}"),
        };
        write!(f, "proto {} ", self.protocol)?;
        end(f, self.src, self.sport)?;
        write!(f, " -> ")?;
        end(f, self.dst, self.dport)
    }
}

/// What the enforced rules make of a tracked connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// Not the pod's to judge: loopback, or no pod address at either end.
    NotJudged,
    /// The rules allow it (or the direction is open).
    Allowed,
    /// The rules refuse it: `direction` of `interface`.
    Denied {
        direction: Direction,
        interface: String,
    },
}

impl Judgement {
    pub fn is_denied(&self) -> bool {
        matches!(self, Judgement::Denied { .. })
    }
}

/// Judges `flow` against the enforced view of `rules` (see the module doc).
pub fn judge(rules: &PodRules, flow: &TrackedFlow) -> Judgement {
    if flow.src.is_loopback() || flow.dst.is_loopback() {
        return Judgement::NotJudged;
    }
    // As the dispatch: interfaces in name order, and an address two interfaces claim belongs
    // to the first that has a chain in that direction (fail closed), else to the first.
    let mut interfaces: Vec<&InterfaceRules> = rules.interfaces.iter().collect();
    interfaces.sort_by(|a, b| a.name.cmp(&b.name));
    let owner = |ip: IpAddr, direction: Direction| {
        let owners = || {
            interfaces
                .iter()
                .copied()
                .filter(move |i| i.ips.contains(&ip))
        };
        owners()
            .find(|i| i.direction(direction).needs_rules())
            .or_else(|| owners().next())
    };
    let (iface, direction, peer) = match (
        owner(flow.dst, Direction::Ingress),
        owner(flow.src, Direction::Egress),
    ) {
        (Some(_), Some(_)) | (None, None) => return Judgement::NotJudged,
        (Some(iface), None) => (iface, Direction::Ingress, flow.src),
        (None, Some(iface)) => (iface, Direction::Egress, flow.dst),
    };
    if direction_allows(iface.direction(direction), peer, flow) {
        Judgement::Allowed
    } else {
        Judgement::Denied {
            direction,
            interface: iface.name.clone(),
        }
    }
}

/// The action of the first rule of `tier` that matches `flow`, if one does (a Pass in the
/// Baseline tier, which the edge refuses, decides nothing: see `DirectionRules::decide`).
fn first_tier_match(tier: &[TierRule], peer: IpAddr, flow: &TrackedFlow) -> Option<AdminAction> {
    tier.iter()
        .filter(|r| r.origin.tier == Tier::Admin || r.action != AdminAction::Pass)
        .find(|r| r.clauses.iter().any(|c| clause_allows(c, peer, flow)))
        .map(|r| r.action)
}

/// Whether one direction's enforced view lets `flow` (with `peer` at the other end) start:
/// the Admin tier, then the namespaced tier, or the Baseline tier when no namespaced policy
/// isolates (SPEC 8), as the kernel's chains decide.
fn direction_allows(rules: &DirectionRules, peer: IpAddr, flow: &TrackedFlow) -> bool {
    match first_tier_match(&rules.admin.enforced, peer, flow) {
        Some(AdminAction::Allow) => return true,
        Some(AdminAction::Deny) => return false,
        Some(AdminAction::Pass) | None => {}
    }
    let allow: &[AllowRule] = match &rules.enforced {
        Isolation::Open => {
            return first_tier_match(&rules.baseline.enforced, peer, flow)
                != Some(AdminAction::Deny);
        }
        Isolation::Isolated(allow) => allow,
    };
    // The implicit DNS clause of the renderer: TCP and UDP 53 to any peer.
    if rules.implicit_dns.enforced
        && flow.dport == 53
        && matches!(flow.protocol, IPPROTO_TCP | IPPROTO_UDP)
    {
        return true;
    }
    allow
        .iter()
        .flat_map(|r| r.clauses.iter())
        .any(|c| clause_allows(c, peer, flow))
}

fn clause_allows(clause: &Clause, peer: IpAddr, flow: &TrackedFlow) -> bool {
    let peer_ok = match &clause.peers {
        PeerMatch::Any => true,
        PeerMatch::Addrs(set) => set.contains(peer),
    };
    let port_ok = match &clause.ports {
        PortMatch::Any => true,
        // A protocol without ports is matched by no port range (each names TCP, UDP or SCTP).
        PortMatch::Only(ranges) => flow.policy_protocol().is_some_and(|protocol| {
            ranges.iter().any(|&PortRange { protocol: p, ports }| {
                p == protocol && ports.is_none_or(|(lo, hi)| flow.dport >= lo && flow.dport <= hi)
            })
        }),
    };
    peer_ok && port_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NetworkId;
    use crate::testing::{ip_block, netpol, pod, port, rule, selector, tcp};
    use crate::{Engine, EngineOptions, Mode, Peer, PodKey};

    fn flow(src: &str, dst: &str, protocol: u8, sport: u16, dport: u16) -> TrackedFlow {
        TrackedFlow {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            protocol,
            sport,
            dport,
        }
    }

    /// web (10.0.0.1, fd00::1) ingress: TCP 80 from 10.0.1.0/24 and fd01::/64; egress: UDP
    /// 5000-5010 anywhere.
    fn web_rules() -> PodRules {
        let mut e = Engine::new(EngineOptions::default());
        e.set_pod(pod(
            "ns",
            "web",
            &[("app", "web")],
            &["10.0.0.1", "fd00::1"],
        ));
        let peers: Vec<Peer> = vec![ip_block("10.0.1.0/24", &[]), ip_block("fd01::/64", &[])];
        e.set_policy(netpol(
            "ns",
            "in",
            selector(&[("app", "web")]),
            Some(vec![rule(peers, vec![tcp(80)])]),
            Some(vec![rule(
                vec![],
                vec![port(Protocol::Udp, Some(5000), Some(5010))],
            )]),
        ));
        e.pod_rules(&PodKey::new("ns", "web")).unwrap()
    }

    #[test]
    fn ingress_is_judged_by_source_and_destination_port() {
        let r = web_rules();
        assert_eq!(
            judge(&r, &flow("10.0.1.5", "10.0.0.1", 6, 40000, 80)),
            Judgement::Allowed
        );
        assert_eq!(
            judge(&r, &flow("fd01::5", "fd00::1", 6, 40000, 80)),
            Judgement::Allowed
        );
        let denied = Judgement::Denied {
            direction: Direction::Ingress,
            interface: "eth0".into(),
        };
        assert_eq!(
            judge(&r, &flow("10.0.2.5", "10.0.0.1", 6, 40000, 80)),
            denied
        );
        assert_eq!(
            judge(&r, &flow("10.0.1.5", "10.0.0.1", 6, 40000, 81)),
            denied
        );
        assert_eq!(
            judge(&r, &flow("10.0.1.5", "10.0.0.1", 17, 40000, 80)),
            denied
        );
        assert_eq!(judge(&r, &flow("fd02::5", "fd00::1", 6, 40000, 80)), denied);
        // ICMP echo: no clause without ports.
        assert_eq!(judge(&r, &flow("10.0.1.5", "10.0.0.1", 1, 0, 0)), denied);
    }

    #[test]
    fn egress_is_judged_by_destination_and_port_ranges() {
        let r = web_rules();
        for dport in [5000, 5005, 5010] {
            assert!(!judge(&r, &flow("10.0.0.1", "192.0.2.1", 17, 1234, dport)).is_denied());
        }
        for (protocol, dport) in [(17, 4999), (17, 5011), (6, 5000), (132, 5000)] {
            assert_eq!(
                judge(&r, &flow("fd00::1", "2001:db8::1", protocol, 1234, dport)),
                Judgement::Denied {
                    direction: Direction::Egress,
                    interface: "eth0".into()
                }
            );
        }
    }

    #[test]
    fn loopback_and_foreign_flows_are_not_judged() {
        let r = web_rules();
        for f in [
            flow("127.0.0.1", "127.0.0.1", 6, 1, 2),
            flow("::1", "::1", 6, 1, 2),
            flow("10.0.0.1", "10.0.0.1", 6, 1, 2),
            flow("10.0.0.1", "fd00::1", 6, 1, 2),
            flow("192.0.2.1", "192.0.2.2", 6, 1, 2),
        ] {
            assert_eq!(judge(&r, &f), Judgement::NotJudged, "{f}");
        }
    }

    #[test]
    fn open_directions_and_monitor_only_policies_revoke_nothing() {
        let mut e = Engine::new(EngineOptions::default());
        e.set_pod(pod("ns", "web", &[("app", "web")], &["10.0.0.1"]));
        let mut p = netpol(
            "ns",
            "deny",
            selector(&[("app", "web")]),
            Some(vec![]),
            None,
        );
        p.mode = Mode::Monitor;
        e.set_policy(p);
        let r = e.pod_rules(&PodKey::new("ns", "web")).unwrap();
        assert!(r.interfaces[0].ingress.staged.is_isolated());
        assert_eq!(
            judge(&r, &flow("10.0.2.5", "10.0.0.1", 6, 1, 80)),
            Judgement::Allowed
        );
        assert_eq!(
            judge(&r, &flow("10.0.0.1", "10.0.2.5", 6, 1, 80)),
            Judgement::Allowed
        );
    }

    #[test]
    fn implicit_dns_is_allowed_like_the_rules_do() {
        let mut r = web_rules();
        let dns = flow("10.0.0.1", "192.0.2.53", 17, 1234, 53);
        assert!(judge(&r, &dns).is_denied());
        r.interfaces[0].egress.implicit_dns.enforced = true;
        assert_eq!(judge(&r, &dns), Judgement::Allowed);
        assert_eq!(
            judge(&r, &flow("10.0.0.1", "192.0.2.53", 6, 1234, 53)),
            Judgement::Allowed
        );
        assert!(judge(&r, &flow("10.0.0.1", "192.0.2.53", 132, 1234, 53)).is_denied());
    }

    #[test]
    fn a_second_interface_is_judged_by_its_own_rules() {
        let mut r = web_rules();
        let mut net1 = r.interfaces[0].clone();
        net1.name = "net1".into();
        net1.network = NetworkId::Primary;
        net1.ips = vec!["10.1.0.1".parse().unwrap()];
        net1.ingress = DirectionRules::open();
        r.interfaces.push(net1);
        assert_eq!(
            judge(&r, &flow("10.0.2.5", "10.1.0.1", 6, 1, 80)),
            Judgement::Allowed
        );
        assert!(judge(&r, &flow("10.0.2.5", "10.0.0.1", 6, 1, 80)).is_denied());
    }

    #[test]
    fn an_address_two_interfaces_claim_is_judged_by_the_isolated_one() {
        let mut r = web_rules();
        // "a0" sorts first, is open, and claims eth0's address too.
        let mut a0 = r.interfaces[0].clone();
        a0.name = "a0".into();
        a0.ingress = DirectionRules::open();
        a0.egress = DirectionRules::open();
        r.interfaces.insert(0, a0);
        assert!(judge(&r, &flow("10.0.2.5", "10.0.0.1", 6, 1, 80)).is_denied());
        assert!(judge(&r, &flow("10.0.0.1", "192.0.2.1", 6, 1, 80)).is_denied());
        // Open everywhere: the first owner, open, allows.
        r.interfaces[1].ingress = DirectionRules::open();
        assert_eq!(
            judge(&r, &flow("10.0.2.5", "10.0.0.1", 6, 1, 80)),
            Judgement::Allowed
        );
    }

    #[test]
    fn lockdown_denies_everything_judged() {
        let p = pod("ns", "web", &[], &["10.0.0.1"]);
        let r = PodRules::lockdown(&p);
        assert!(judge(&r, &flow("10.0.2.5", "10.0.0.1", 6, 1, 80)).is_denied());
        assert!(judge(&r, &flow("10.0.0.1", "10.0.2.5", 17, 1, 53)).is_denied());
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// For the protocols with ports, the judge agrees with the rules' own evaluation
            /// (`Isolation::evaluate`, which the verdicts and the tracer share).
            #[test]
            fn agrees_with_isolation_evaluate(
                peer_last in 0u8..8, dport in 75u16..85, proto in 0usize..3, ingress in any::<bool>(),
            ) {
                let r = web_rules();
                let peer: IpAddr = format!("10.0.{}.5", peer_last % 3).parse().unwrap();
                let protocol = Protocol::ALL[proto];
                let number = [IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP][proto];
                let own: IpAddr = "10.0.0.1".parse().unwrap();
                let (f, rules) = if ingress {
                    (TrackedFlow { src: peer, dst: own, protocol: number, sport: 999, dport },
                     &r.interfaces[0].ingress)
                } else {
                    (TrackedFlow { src: own, dst: peer, protocol: number, sport: 999, dport },
                     &r.interfaces[0].egress)
                };
                let (expected, _) = rules.enforced.evaluate(peer, protocol, dport);
                prop_assert_eq!(judge(&r, &f) == Judgement::Allowed, expected);
            }
        }
    }
}
