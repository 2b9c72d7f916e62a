//! Revocation's judge (`netwarden_engine::judge`) against the rules themselves: for pod rules
//! decoded from arbitrary bytes (the render fuzz decoder: one to three interfaces, each
//! direction open, enforced, monitored or both, learn mode or not) and a connection's first
//! packet, the judge revokes exactly what the nft table, walked by the packet tracer, rejects.
//! Peers and ports are drawn around the rules' own address and port bounds, so both sides of
//! every boundary are met.

use std::net::{IpAddr, Ipv4Addr};

use netwarden_engine::{
    judge, Direction, Isolation, Judgement, PeerMatch, PodRules, PortMatch, Protocol, TrackedFlow,
};
use netwarden_render::fuzzing::pod_rules_from_bytes;
use netwarden_render::tracer::{trace, TracePacket, TraceProtocol};
use netwarden_render::RenderOptions;
use proptest::prelude::*;

/// Addresses worth trying as peers: each range bound of every peer set and its neighbours,
/// and a few that no set names.
fn peers(rules: &PodRules) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = vec![
        Ipv4Addr::new(192, 0, 2, 1).into(),
        Ipv4Addr::new(10, 9, 9, 9).into(),
    ];
    for iface in &rules.interfaces {
        for d in [&iface.ingress, &iface.egress] {
            for iso in [&d.enforced, &d.staged] {
                for clause in iso.rules().iter().flat_map(|r| &r.clauses) {
                    if let PeerMatch::Addrs(set) = &clause.peers {
                        for (lo, hi) in set.v4_ranges() {
                            let (lo, hi) = (u32::from(lo), u32::from(hi));
                            for a in [lo.wrapping_sub(1), lo, hi, hi.wrapping_add(1)] {
                                out.push(Ipv4Addr::from(a).into());
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Ports worth trying: each range bound and its neighbours, 53, and one no rule names.
fn ports(rules: &PodRules) -> Vec<u16> {
    let mut out = vec![53, 4321];
    for iface in &rules.interfaces {
        for d in [&iface.ingress, &iface.egress] {
            for iso in [&d.enforced, &d.staged] {
                if let Isolation::Isolated(allow) = iso {
                    for clause in allow.iter().flat_map(|r| &r.clauses) {
                        if let PortMatch::Only(ranges) = &clause.ports {
                            for (lo, hi) in ranges.iter().filter_map(|r| r.ports) {
                                for p in [lo.wrapping_sub(1), lo, hi, hi.wrapping_add(1)] {
                                    out.push(p);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn the_judge_revokes_what_the_rules_reject(
        data in proptest::collection::vec(any::<u8>(), 0..256),
        iface_pick in any::<usize>(),
        peer_pick in any::<usize>(),
        port_pick in any::<usize>(),
        proto_pick in 0usize..4,
        ingress in any::<bool>(),
    ) {
        let rules = pod_rules_from_bytes(&data);
        let iface = &rules.interfaces[iface_pick % rules.interfaces.len()];
        let local = iface.ips[0];
        let peers = peers(&rules);
        let peer = peers[peer_pick % peers.len()];
        // A peer that is one of the pod's own addresses, or a loopback address, goes over `lo`.
        prop_assume!(!peer.is_loopback() && !rules.interfaces.iter().any(|i| i.ips.contains(&peer)));
        let ports = ports(&rules);
        let port = ports[port_pick % ports.len()];
        let (protocol, number, trace_protocol) = match proto_pick {
            0 => (Protocol::Tcp, 6, None),
            1 => (Protocol::Udp, 17, None),
            2 => (Protocol::Sctp, 132, None),
            _ => (Protocol::Tcp, 1, Some(TraceProtocol::Icmp)),
        };
        let (direction, flow) = if ingress {
            (Direction::Ingress, TrackedFlow { src: peer, dst: local, protocol: number, sport: 999, dport: port })
        } else {
            (Direction::Egress, TrackedFlow { src: local, dst: peer, protocol: number, sport: 999, dport: port })
        };
        let mut packet = TracePacket::new(direction, &iface.name, peer, protocol, port);
        if let Some(p) = trace_protocol {
            packet.protocol = p;
        }
        if ingress {
            packet = packet.with_local(local);
        }
        let Ok(traced) = trace(&rules, &RenderOptions::default(), &packet) else {
            // A name nft cannot match: the pod is refused, nothing to compare.
            return Ok(());
        };
        let judged = judge(&rules, &flow);
        prop_assert_ne!(&judged, &Judgement::NotJudged);
        prop_assert_eq!(
            judged.is_denied(),
            !traced.accepted,
            "{:?} {} on {}: judge {:?}, rules {:?} through {:?}",
            direction, flow, iface.name, judged, traced.verdict, traced.chains
        );
    }
}
