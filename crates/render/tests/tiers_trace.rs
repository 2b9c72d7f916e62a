//! The admin policies' tiers in the nft table (SPEC 8) agree with the engine's decision
//! ([`DirectionRules::decide`] through [`side_allows`]), packet by packet: random pod rules
//! with Admin and Baseline tiers (Allow, Deny, Pass; monitored views that add or leave out a
//! rule) over random namespaced isolation, traced through the very table the kernel gets.
//! For every interface, direction and probe made from the rules' own addresses and ports:
//! accepted iff the enforced view allows; a would-deny logged iff the enforced view allows and
//! the staged one does not.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netwarden_engine::{
    side_allows, AdminAction, Clause, Decision, Direction, DirectionRules, Isolation, PeerMatch,
    PortMatch, Protocol,
};
use netwarden_render::fuzzing::pod_rules_from_bytes;
use netwarden_render::tracer::{trace, TracePacket};
use netwarden_render::{LogAction, RenderOptions};
use proptest::prelude::*;

/// Every clause of every view and tier of `dr`.
fn clauses(dr: &DirectionRules) -> Vec<&Clause> {
    let mut out: Vec<&Clause> = Vec::new();
    for iso in [&dr.enforced, &dr.staged] {
        if let Isolation::Isolated(rules) = iso {
            out.extend(rules.iter().flat_map(|r| &r.clauses));
        }
    }
    for tier in [&dr.admin, &dr.baseline] {
        for view in [&tier.enforced, &tier.staged] {
            out.extend(view.iter().flat_map(|r| &r.clauses));
        }
    }
    out
}

/// Probes from the rules themselves: each end of each address range of a clause, each end of
/// each port range, and addresses and ports no rule names.
fn probes(dr: &DirectionRules) -> Vec<(IpAddr, Protocol, u16)> {
    let mut peers: Vec<IpAddr> = vec![
        IpAddr::V4(Ipv4Addr::new(203, 0, 113, 9)),
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 9)),
    ];
    let mut ports: Vec<(Protocol, u16)> = vec![(Protocol::Tcp, 80), (Protocol::Udp, 53)];
    for clause in clauses(dr) {
        if let PeerMatch::Addrs(set) = &clause.peers {
            for (lo, hi) in set.v4_ranges().take(3) {
                peers.extend([IpAddr::V4(lo), IpAddr::V4(hi)]);
            }
            for (lo, hi) in set.v6_ranges().take(3) {
                peers.extend([IpAddr::V6(lo), IpAddr::V6(hi)]);
            }
        }
        if let PortMatch::Only(ranges) = &clause.ports {
            for r in ranges.iter().take(3) {
                match r.ports {
                    Some((lo, hi)) => ports.extend([(r.protocol, lo), (r.protocol, hi)]),
                    None => ports.push((r.protocol, 4242)),
                }
            }
        }
    }
    peers.sort();
    peers.dedup();
    ports.sort();
    ports.dedup();
    peers.truncate(12);
    ports.truncate(8);
    let mut out = Vec::new();
    for peer in &peers {
        for (protocol, port) in &ports {
            out.push((*peer, *protocol, *port));
        }
    }
    out
}

/// What the checks saw decided by each kind of tier rule (for the coverage test below).
#[derive(Debug, Default)]
struct Seen {
    admin_allow: usize,
    admin_deny: usize,
    passed: usize,
    baseline: usize,
    tier_would_deny: usize,
}

fn check(data: &[u8]) -> Result<(), TestCaseError> {
    check_counting(data, &mut Seen::default())
}

fn check_counting(data: &[u8], seen: &mut Seen) -> Result<(), TestCaseError> {
    let rules = pod_rules_from_bytes(data);
    let opts = RenderOptions::default();
    for iface in &rules.interfaces {
        for direction in [Direction::Ingress, Direction::Egress] {
            let dr = iface.direction(direction);
            for (peer, protocol, port) in probes(dr) {
                let mut packet = TracePacket::new(direction, &iface.name, peer, protocol, port);
                packet.local = iface.ips.first().copied();
                let Ok(traced) = trace(&rules, &opts, &packet) else {
                    // An interface name nft cannot match exactly: refused, tested elsewhere.
                    return Ok(());
                };
                let enforced = side_allows(direction, dr, false, peer, protocol, port, false);
                let staged = side_allows(direction, dr, true, peer, protocol, port, false);
                match dr.decide(false, peer, protocol, port) {
                    Decision::Admin(r) if r.action == AdminAction::Allow => seen.admin_allow += 1,
                    Decision::Admin(_) => seen.admin_deny += 1,
                    Decision::Baseline(_) => seen.baseline += 1,
                    _ => {}
                }
                if dr
                    .admin
                    .first_match(false, peer, protocol, port)
                    .is_some_and(|r| r.action == AdminAction::Pass)
                {
                    seen.passed += 1;
                }
                if dr.has_tiers() && enforced && !staged {
                    seen.tier_would_deny += 1;
                }
                let what = format!(
                    "{} {direction} {peer} {protocol}/{port}: chains {:?}",
                    iface.name, traced.chains
                );
                prop_assert_eq!(traced.accepted, enforced, "accepted: {}", what);
                if dr.has_monitor() {
                    prop_assert_eq!(
                        traced.logged == Some(LogAction::WouldDeny),
                        enforced && !staged,
                        "would-deny: {}",
                        what
                    );
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    #[test]
    fn the_table_decides_as_the_engine(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        check(&data)?;
    }
}

/// The random rules do reach every kind of tier decision (else the property above would pass
/// without testing the tiers).
#[test]
fn every_kind_of_tier_decision_is_exercised() {
    let mut random = netwarden_testing::Lcg::new(0x5eed_7135);
    let mut seen = Seen::default();
    for _ in 0..300 {
        let data = random.bytes(600);
        check_counting(&data, &mut seen).unwrap();
    }
    println!("{seen:?}");
    assert!(
        seen.admin_allow > 0
            && seen.admin_deny > 0
            && seen.passed > 0
            && seen.baseline > 0
            && seen.tier_would_deny > 0,
        "{seen:?}"
    );
}
