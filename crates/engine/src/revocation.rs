//! Which live connections a change of a pod's rules can newly deny: what a revocation pass
//! (SPEC 5) must look at after an apply, computed from the rules alone.
//!
//! A revocation pass lists the pod netns's conntrack table and judges every entry by the new
//! rules ([`crate::judge`]). Listing costs the kernel one message per entry: at 27,500 entries
//! about 76 ms per pass, beside the traffic. Most changes in a cluster are pods coming, going
//! or moving: a peer set gains or loses addresses and nothing else changes. Then the only
//! connections the change can deny are those with a lost address at the other end, and the
//! kernel can be asked for those alone (a filtered dump); a change that only adds allows can
//! deny nothing, and needs no pass at all.
//!
//! The answer is a sufficient condition read from the rules' form, never a guess: whatever
//! this module cannot prove about a change (tiers that changed, rules added or removed at
//! different places, ports changed, interfaces changed) is [`RevocationScope::Everything`],
//! the full pass. The property test (`tests/revocation_scope.rs`) checks the promise on random
//! changes: every flow the old rules allow and the new deny is within the scope.

use std::net::IpAddr;

use crate::addrset::AddrSet;
use crate::rules::{AllowRule, Clause, DirectionRules, Isolation, PeerMatch, PodRules, PortMatch};

/// What a revocation pass must judge after a change of a pod's rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevocationScope {
    /// The new rules allow every flow the old ones did: nothing to revoke.
    Nothing,
    /// Only flows with one of these peers can be newly denied: incoming flows from `ingress`
    /// (conntrack's original source), outgoing flows to `egress` (original destination).
    Peers { ingress: AddrSet, egress: AddrSet },
    /// Any flow may be: judge them all.
    Everything,
}

impl RevocationScope {
    /// What either scope names: the scope of two changes judged at once.
    pub fn join(self, other: RevocationScope) -> RevocationScope {
        use RevocationScope::*;
        match (self, other) {
            (Everything, _) | (_, Everything) => Everything,
            (Nothing, x) | (x, Nothing) => x,
            (
                Peers { ingress, egress },
                Peers {
                    ingress: i2,
                    egress: e2,
                },
            ) => Peers {
                ingress: AddrSet::union_of([ingress, i2]),
                egress: AddrSet::union_of([egress, e2]),
            },
        }
    }

    fn lost(set: AddrSet, ingress: bool) -> RevocationScope {
        if set.is_empty() {
            return RevocationScope::Nothing;
        }
        let (ingress, egress) = if ingress {
            (set, AddrSet::new())
        } else {
            (AddrSet::new(), set)
        };
        RevocationScope::Peers { ingress, egress }
    }
}

/// What a revocation pass must judge after `new` replaced `old` (`None`: the pod had no rules,
/// it was open).
pub fn revocation_scope(old: Option<&PodRules>, new: &PodRules) -> RevocationScope {
    let Some(old) = old else {
        return RevocationScope::Everything;
    };
    let same_interfaces = old.interfaces.len() == new.interfaces.len()
        && old
            .interfaces
            .iter()
            .zip(&new.interfaces)
            .all(|(o, n)| o.name == n.name && o.network == n.network && o.ips == n.ips);
    // An address two interfaces claim is judged by whichever has rules in that direction
    // (see `judge`): a direction opening could move it to another interface's rules.
    let mut ips: Vec<IpAddr> = new.interfaces.iter().flat_map(|i| i.ips.clone()).collect();
    let all = ips.len();
    ips.sort();
    ips.dedup();
    if !same_interfaces || ips.len() != all {
        return RevocationScope::Everything;
    }
    old.interfaces
        .iter()
        .zip(&new.interfaces)
        .fold(RevocationScope::Nothing, |scope, (o, n)| {
            scope
                .join(direction_scope(&o.ingress, &n.ingress, true))
                .join(direction_scope(&o.egress, &n.egress, false))
        })
}

/// One direction's part (enforced view only: the staged view decides no packet).
fn direction_scope(old: &DirectionRules, new: &DirectionRules, ingress: bool) -> RevocationScope {
    // The tiers decide before and after the namespaced one: changed, anything may be.
    if old.admin.enforced != new.admin.enforced || old.baseline.enforced != new.baseline.enforced {
        return RevocationScope::Everything;
    }
    let old_allow = match &old.enforced {
        Isolation::Open => {
            return match &new.enforced {
                Isolation::Open => RevocationScope::Nothing,
                Isolation::Isolated(_) => RevocationScope::Everything,
            }
        }
        Isolation::Isolated(allow) => allow,
    };
    let new_allow = match &new.enforced {
        // Opened: what no Admin rule decides goes to the Baseline tier, which may deny.
        Isolation::Open if new.baseline.enforced.is_empty() => return RevocationScope::Nothing,
        Isolation::Open => return RevocationScope::Everything,
        Isolation::Isolated(allow) => allow,
    };
    if old.implicit_dns.enforced && !new.implicit_dns.enforced {
        return RevocationScope::Everything;
    }
    if let Some(lost) = lost_peers(old_allow, new_allow) {
        return RevocationScope::lost(lost, ingress);
    }
    // Not clause by clause: nothing lost if every old clause is within a new one.
    let new_clauses: Vec<&Clause> = new_allow.iter().flat_map(|r| &r.clauses).collect();
    let covered = old_allow
        .iter()
        .flat_map(|r| &r.clauses)
        .all(|c| new_clauses.iter().any(|n| clause_within(c, n)));
    if covered {
        RevocationScope::Nothing
    } else {
        RevocationScope::Everything
    }
}

/// When `new` has the rules of `old`, clause for clause with the same ports (only peer sets
/// differ: pods came, went or moved), the addresses some clause lost; `None` otherwise.
fn lost_peers(old: &[AllowRule], new: &[AllowRule]) -> Option<AddrSet> {
    if old.len() != new.len() {
        return None;
    }
    let mut lost = AddrSet::new();
    for (o, n) in old.iter().zip(new) {
        if o.clauses.len() != n.clauses.len() {
            return None;
        }
        for (oc, nc) in o.clauses.iter().zip(&n.clauses) {
            if oc.ports != nc.ports {
                return None;
            }
            match (&oc.peers, &nc.peers) {
                (_, PeerMatch::Any) => {}
                (PeerMatch::Any, PeerMatch::Addrs(_)) => return None,
                (PeerMatch::Addrs(o), PeerMatch::Addrs(n)) => lost.union_with(&o.difference(n)),
            }
        }
    }
    Some(lost)
}

/// Whether every flow `inner` matches, `outer` matches too.
fn clause_within(inner: &Clause, outer: &Clause) -> bool {
    let peers = match (&inner.peers, &outer.peers) {
        (_, PeerMatch::Any) => true,
        (PeerMatch::Any, PeerMatch::Addrs(_)) => false,
        (PeerMatch::Addrs(i), PeerMatch::Addrs(o)) => i.difference(o).is_empty(),
    };
    let ports = match (&inner.ports, &outer.ports) {
        (_, PortMatch::Any) => true,
        (PortMatch::Any, PortMatch::Only(_)) => false,
        (PortMatch::Only(i), PortMatch::Only(o)) => i.iter().all(|r| {
            o.iter().any(|w| {
                w.protocol == r.protocol
                    && match (r.ports, w.ports) {
                        (_, None) => true,
                        (None, Some(_)) => false,
                        (Some((lo, hi)), Some((wlo, whi))) => wlo <= lo && hi <= whi,
                    }
            })
        }),
    };
    peers && ports
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{PodKey, Policy};
    use crate::testing::{netpol, pod, pods_with, rule, selector, tcp};
    use crate::{Engine, EngineOptions};

    fn addrs(list: &[&str]) -> AddrSet {
        AddrSet::from_addrs(list.iter().map(|a| a.parse::<IpAddr>().unwrap()))
    }

    /// The server's rules in a cluster of `peers` (`(name, ip, role)`) under `policies`.
    fn server(peers: &[(&str, &str, &str)], policies: &[Policy]) -> PodRules {
        let mut engine = Engine::new(EngineOptions::default());
        engine.set_pod(pod("ns", "server", &[("app", "server")], &["10.0.0.1"]));
        for (name, ip, role) in peers {
            engine.set_pod(pod("ns", name, &[("role", role)], &[ip]));
        }
        for p in policies {
            engine.set_policy(p.clone());
        }
        engine.pod_rules(&PodKey::new("ns", "server")).unwrap()
    }

    fn allow(name: &str, role: &str, ports: Vec<crate::model::PolicyPort>) -> Policy {
        netpol(
            "ns",
            name,
            selector(&[("app", "server")]),
            Some(vec![rule(vec![pods_with(&[("role", role)])], ports)]),
            None,
        )
    }

    #[test]
    fn a_peer_that_moved_is_the_only_one_to_look_at() {
        let policy = [allow("p", "peer", vec![tcp(80)])];
        let old = server(
            &[("a", "10.1.0.1", "peer"), ("b", "10.1.0.2", "peer")],
            &policy,
        );
        let moved = server(
            &[("a", "10.1.0.1", "peer"), ("b", "10.1.0.9", "peer")],
            &policy,
        );
        assert_eq!(
            revocation_scope(Some(&old), &moved),
            RevocationScope::Peers {
                ingress: addrs(&["10.1.0.2"]),
                egress: AddrSet::new()
            }
        );
        // A peer relabelled away: the same.
        let relabelled = server(
            &[("a", "10.1.0.1", "peer"), ("b", "10.1.0.2", "x")],
            &policy,
        );
        assert_eq!(
            revocation_scope(Some(&old), &relabelled),
            RevocationScope::Peers {
                ingress: addrs(&["10.1.0.2"]),
                egress: AddrSet::new()
            }
        );
        // Gained only: nothing to revoke.
        let wider = server(
            &[
                ("a", "10.1.0.1", "peer"),
                ("b", "10.1.0.2", "peer"),
                ("c", "10.1.0.3", "peer"),
            ],
            &policy,
        );
        assert_eq!(
            revocation_scope(Some(&old), &wider),
            RevocationScope::Nothing
        );
        // Another policy allowing more: covered, nothing.
        let peers = [("a", "10.1.0.1", "peer"), ("b", "10.1.0.2", "peer")];
        let added = server(&peers, &[policy[0].clone(), allow("q", "other", vec![])]);
        assert_eq!(
            revocation_scope(Some(&old), &added),
            RevocationScope::Nothing
        );
        // Isolated before, no policy now (no Baseline tier): nothing denied.
        assert_eq!(
            revocation_scope(Some(&old), &server(&peers, &[])),
            RevocationScope::Nothing
        );
    }

    #[test]
    fn what_cannot_be_proven_is_everything() {
        let peers = [("a", "10.1.0.1", "peer")];
        let old = server(&peers, &[allow("p", "peer", vec![tcp(80)])]);
        // A port changed, a policy removed among others, the pod open before.
        let port = server(&peers, &[allow("p", "peer", vec![tcp(81)])]);
        assert_eq!(
            revocation_scope(Some(&old), &port),
            RevocationScope::Everything
        );
        let open = server(&peers, &[]);
        assert_eq!(
            revocation_scope(Some(&open), &old),
            RevocationScope::Everything
        );
        assert_eq!(revocation_scope(None, &old), RevocationScope::Everything);
        // The pod's own address changed.
        let mut readdressed = old.clone();
        readdressed.interfaces[0].ips = vec!["10.0.0.2".parse().unwrap()];
        assert_eq!(
            revocation_scope(Some(&old), &readdressed),
            RevocationScope::Everything
        );
    }
}
