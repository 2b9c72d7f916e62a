//! The dispatch plan: which packets of a pod's base chains go to which interface's policy
//! chain, shared by both backends (nft: [`crate::nft`], iptables: [`crate::iptables`]), so they
//! cannot disagree about what is judged where.
//!
//! An incoming packet is judged by the policies of the interface that **owns the address it is
//! sent to**, whatever interface it arrives on: a peer on a secondary network can route the
//! pod's primary address through that network (`ip route add <primary>/32 dev net1`), and the
//! primary interface's policy must still decide (SPEC 3.1, issue 20 defect 3a). Packets to
//! other destinations (broadcast, multicast, a local address no interface of the pod owns) are
//! judged by the interface they arrive on. An interface netwarden does not know (no address, or
//! created after the last sync) matches neither, and in a pod that enforces any isolation the
//! base chain ends in a reject: it is closed until it is known (defect 3b).
//!
//! ```text
//! input:  (lo, established/related, ICMPv6 ND, learn rules: before the plan)
//!         daddr A jump in_N      for each address A of an interface N ingress-isolated in either view
//!         daddr A accept         for each address A of an interface open in both views
//!         iifname "N" jump in_N  for each interface isolated in either view
//!         iifname "N" accept     for each open interface
//!         reject                 when any interface is enforced-isolated, in either direction
//! output: oifname "N" jump out_N / oifname "N" accept, then reject when any interface is
//!         enforced-isolated in egress
//! ```
//!
//! The base chain goes on after a jump returns, so every policy chain ends with a verdict:
//! enforced-isolated chains end in reject, monitor-only chains (staged isolated, enforced open)
//! in an explicit accept. Egress is dispatched by outgoing interface only: the route chooses
//! it, and the pod's own processes choose the route.
//!
//! The plan is pure and typed; the backends print it (`ip daddr 10.0.0.1 jump in_0`,
//! `-d 10.0.0.1/32 -j DANM_IN_0`).

use std::collections::BTreeSet;
use std::net::IpAddr;

use netwarden_engine::{Direction, DirectionRules, InterfaceRules};

/// Where a dispatched packet goes: the policy chain of interface `n` (an index into the
/// interface list the plan was computed from), or straight through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// The chain of the interface at this index (every such chain ends with a verdict).
    Chain(usize),
    Accept,
}

/// The dispatch of one base chain (input or output).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DirectionPlan {
    /// By the pod's local address (destination on input; empty on output), in interface order.
    pub by_addr: Vec<(IpAddr, Target)>,
    /// By the interface the packet arrives on (input) or leaves by (output), in interface
    /// order: names exactly as the engine gave them (each backend escapes or refuses them).
    pub by_iface: Vec<(String, Target)>,
    /// A final reject: everything not dispatched above (unknown interfaces, unknown
    /// destinations on unknown interfaces) is refused.
    pub reject_rest: bool,
}

/// The dispatch of both base chains; `None` where a base chain needs no dispatch at all.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DispatchPlan {
    pub input: Option<DirectionPlan>,
    pub output: Option<DirectionPlan>,
}

/// Whether a direction has a policy chain: isolated in the enforced or the staged view, or an
/// admin policy has rules for it (SPEC 8).
pub fn has_chain(dr: &DirectionRules) -> bool {
    dr.needs_rules()
}

/// Whether a policy chain ends in an explicit accept: isolated only in the staged view (its
/// packets are logged as would-denies and pass; the base chain must not reject them after the
/// jump returns).
pub fn ends_in_accept(dr: &DirectionRules) -> bool {
    !dr.enforced.is_isolated()
}

/// The plan for `interfaces`, in the order the backend numbers its chains (targets are indexes
/// into this slice).
pub fn plan(interfaces: &[&InterfaceRules]) -> DispatchPlan {
    let any_enforced = interfaces
        .iter()
        .any(|i| i.ingress.enforced.is_isolated() || i.egress.enforced.is_isolated());
    let any_egress_enforced = interfaces.iter().any(|i| i.egress.enforced.is_isolated());
    let any = |d: Direction| interfaces.iter().any(|i| has_chain(i.direction(d)));
    let target = |n: usize, d: Direction| {
        if has_chain(interfaces[n].direction(d)) {
            Target::Chain(n)
        } else {
            Target::Accept
        }
    };

    let input = (any(Direction::Ingress) || any_enforced).then(|| {
        // An address two interfaces claim goes to an isolated owner if it has one (first by
        // order), never to an accept: fail closed.
        let isolated_addrs: BTreeSet<IpAddr> = interfaces
            .iter()
            .filter(|i| has_chain(&i.ingress))
            .flat_map(|i| i.ips.iter().copied())
            .collect();
        let mut seen = BTreeSet::new();
        let mut by_addr = Vec::new();
        for (n, iface) in interfaces.iter().enumerate() {
            let t = target(n, Direction::Ingress);
            for &addr in &iface.ips {
                if t == Target::Accept && isolated_addrs.contains(&addr) {
                    continue;
                }
                if seen.insert(addr) {
                    by_addr.push((addr, t));
                }
            }
        }
        DirectionPlan {
            by_addr,
            by_iface: by_iface(interfaces, Direction::Ingress),
            reject_rest: any_enforced,
        }
    });
    let output = any(Direction::Egress).then(|| DirectionPlan {
        by_addr: Vec::new(),
        by_iface: by_iface(interfaces, Direction::Egress),
        reject_rest: any_egress_enforced,
    });
    DispatchPlan { input, output }
}

fn by_iface(interfaces: &[&InterfaceRules], d: Direction) -> Vec<(String, Target)> {
    interfaces
        .iter()
        .enumerate()
        .map(|(n, i)| {
            let t = if has_chain(i.direction(d)) {
                Target::Chain(n)
            } else {
                Target::Accept
            };
            (i.name.clone(), t)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::{Isolation, NetworkId};

    fn iface(name: &str, ips: &[&str], ingress: Isolation, egress: Isolation) -> InterfaceRules {
        let dr = |iso: Isolation| DirectionRules {
            enforced: iso.clone(),
            staged: iso,
            ..DirectionRules::open()
        };
        InterfaceRules {
            name: name.into(),
            network: NetworkId::Primary,
            ips: ips.iter().map(|a| a.parse().unwrap()).collect(),
            ingress: dr(ingress),
            egress: dr(egress),
        }
    }

    fn shut() -> Isolation {
        Isolation::Isolated(Vec::new().into())
    }

    fn a(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn isolated_addresses_jump_open_ones_accept_and_the_rest_is_rejected() {
        let eth0 = iface("eth0", &["10.0.0.1", "fd00::1"], shut(), Isolation::Open);
        let net1 = iface("net1", &["10.1.0.1"], Isolation::Open, Isolation::Open);
        let p = plan(&[&eth0, &net1]);
        let input = p.input.unwrap();
        assert_eq!(
            input.by_addr,
            vec![
                (a("10.0.0.1"), Target::Chain(0)),
                (a("fd00::1"), Target::Chain(0)),
                (a("10.1.0.1"), Target::Accept),
            ]
        );
        assert_eq!(
            input.by_iface,
            vec![
                ("eth0".to_string(), Target::Chain(0)),
                ("net1".to_string(), Target::Accept)
            ]
        );
        assert!(input.reject_rest);
        // Nothing isolates egress: no output dispatch.
        assert_eq!(p.output, None);
    }

    #[test]
    fn egress_only_isolation_still_closes_unknown_interfaces_on_input() {
        let eth0 = iface("eth0", &["10.0.0.1"], Isolation::Open, shut());
        let p = plan(&[&eth0]);
        let input = p.input.unwrap();
        assert_eq!(input.by_addr, vec![(a("10.0.0.1"), Target::Accept)]);
        assert!(input.reject_rest);
        let output = p.output.unwrap();
        assert_eq!(
            output.by_iface,
            vec![("eth0".to_string(), Target::Chain(0))]
        );
        assert!(output.reject_rest);
    }

    #[test]
    fn monitor_only_rejects_nothing_more() {
        let mut eth0 = iface("eth0", &["10.0.0.1"], Isolation::Open, Isolation::Open);
        eth0.ingress.staged = shut();
        assert!(ends_in_accept(&eth0.ingress));
        let p = plan(&[&eth0]);
        let input = p.input.unwrap();
        assert_eq!(input.by_addr, vec![(a("10.0.0.1"), Target::Chain(0))]);
        assert!(!input.reject_rest, "monitoring never closes anything");
        assert_eq!(p.output, None);
    }

    #[test]
    fn an_address_on_two_interfaces_goes_to_the_isolated_one() {
        let eth0 = iface("eth0", &["10.0.0.1"], Isolation::Open, Isolation::Open);
        let net1 = iface("net1", &["10.0.0.1"], shut(), Isolation::Open);
        let input = plan(&[&eth0, &net1]).input.unwrap();
        assert_eq!(input.by_addr, vec![(a("10.0.0.1"), Target::Chain(1))]);
    }

    #[test]
    fn nothing_isolated_nothing_dispatched() {
        let eth0 = iface("eth0", &["10.0.0.1"], Isolation::Open, Isolation::Open);
        assert_eq!(plan(&[&eth0]), DispatchPlan::default());
    }
}
