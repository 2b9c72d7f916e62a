//! A tier's rules (SPEC 8) as the kernel walks them, both backends: runs of one action.
//!
//! The first Admin (or Baseline) rule that matches decides, so its rules are walked in order.
//! But consecutive rules with the same action decide the same way whichever of them matches
//! first: a run of them can be walked as one. Within a run, the clauses with the same ports
//! are merged into one whose peers are the union of theirs, then those with the same peers
//! into one whose ports are the union of theirs — one set lookup per distinct peer set and
//! port list instead of one per rule. Fifty admin rules denying whole namespaces cost a new
//! connection fifty set lookups before; the same rules in one run cost one. What a packet
//! meets is still the first run that matches, in the rules' order.
//!
//! Pure: the merged clauses are new values; a clause alone in its group is kept as it was
//! (its set shared with the rest of the table).

use std::sync::Arc;

use netwarden_engine::{AddrSet, AdminAction, Clause, PeerMatch, PortMatch, PortRange, TierRule};

/// One run: the action, and the clauses that take it (merged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierRun {
    pub action: AdminAction,
    pub clauses: Vec<Clause>,
}

/// The runs of `tier` in order. `skip_pass`: a Pass decides nothing here (the Baseline tier,
/// where the edge refuses it): its rules are left out.
pub fn tier_runs(tier: &[TierRule], skip_pass: bool) -> Vec<TierRun> {
    let mut runs: Vec<(AdminAction, Vec<&Clause>)> = Vec::new();
    for rule in tier {
        if skip_pass && rule.action == AdminAction::Pass {
            continue;
        }
        match runs.last_mut() {
            Some((action, clauses)) if *action == rule.action => clauses.extend(&rule.clauses),
            _ => runs.push((rule.action, rule.clauses.iter().collect())),
        }
    }
    runs.into_iter()
        .map(|(action, clauses)| TierRun {
            action,
            clauses: merged(&clauses),
        })
        .collect()
}

/// `clauses` merged where it is exact: those with the same ports into one (peers united),
/// then those with the same peers into one (ports united) — never two that differ in both,
/// which would allow the pairs neither did. In the order each first appears.
fn merged(clauses: &[&Clause]) -> Vec<Clause> {
    let by_ports = group(
        clauses,
        |a, b| a.ports == b.ports,
        |group| Clause {
            peers: united(group),
            ports: group[0].ports.clone(),
        },
    );
    let refs: Vec<&Clause> = by_ports.iter().collect();
    group(
        &refs,
        |a, b| a.peers == b.peers,
        |group| Clause {
            peers: group[0].peers.clone(),
            ports: ports_united(group),
        },
    )
}

/// `clauses` grouped by `same` (each joins the first group it is the same as), a group of
/// several made one by `join`, one alone kept as it was.
fn group(
    clauses: &[&Clause],
    same: impl Fn(&Clause, &Clause) -> bool,
    join: impl Fn(&[&Clause]) -> Clause,
) -> Vec<Clause> {
    let mut groups: Vec<Vec<&Clause>> = Vec::new();
    for clause in clauses {
        match groups.iter_mut().find(|g| same(g[0], clause)) {
            Some(group) => group.push(clause),
            None => groups.push(vec![clause]),
        }
    }
    groups
        .into_iter()
        .map(|group| match group.as_slice() {
            [one] => (*one).clone(),
            _ => join(&group),
        })
        .collect()
}

fn ports_united(group: &[&Clause]) -> PortMatch {
    let mut ranges: Vec<PortRange> = Vec::new();
    for clause in group {
        match &clause.ports {
            PortMatch::Any => return PortMatch::Any,
            PortMatch::Only(only) => {
                for range in only {
                    if !ranges.contains(range) {
                        ranges.push(*range);
                    }
                }
            }
        }
    }
    PortMatch::Only(ranges)
}

fn united(group: &[&Clause]) -> PeerMatch {
    let mut sets = Vec::new();
    for clause in group {
        match &clause.peers {
            PeerMatch::Any => return PeerMatch::Any,
            PeerMatch::Addrs(set) => sets.push(set.as_ref()),
        }
    }
    PeerMatch::Addrs(Arc::new(AddrSet::union_of(sets)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::{AdminKind, AdminRef, Direction, Mode, Protocol, Tier, TierOrigin};
    use std::net::IpAddr;

    fn rule(action: AdminAction, peers: &[&str], port: Option<u16>) -> TierRule {
        TierRule {
            origin: TierOrigin {
                policy: AdminRef {
                    kind: AdminKind::AdminNetworkPolicy,
                    name: "p".into(),
                },
                tier: Tier::Admin,
                priority: 1,
                direction: Direction::Ingress,
                index: 0,
                name: None,
                mode: Mode::Enforce,
            },
            action,
            clauses: vec![Clause {
                peers: PeerMatch::Addrs(Arc::new(AddrSet::from_addrs(
                    peers.iter().map(|p| p.parse::<IpAddr>().unwrap()),
                ))),
                ports: match port {
                    None => PortMatch::Any,
                    Some(p) => PortMatch::Only(vec![PortRange {
                        protocol: Protocol::Tcp,
                        ports: Some((p, p)),
                    }]),
                },
            }],
        }
    }

    #[test]
    fn consecutive_rules_of_one_action_become_one_run_with_united_peers() {
        use AdminAction::*;
        let tier = [
            rule(Deny, &["10.0.0.1"], None),
            rule(Deny, &["10.0.0.2"], None),
            rule(Deny, &["10.0.0.3"], Some(80)),
            rule(Allow, &["10.0.0.4"], None),
            rule(Deny, &["10.0.0.5"], None),
            rule(Pass, &["10.0.0.6"], None),
        ];
        let runs = tier_runs(&tier, false);
        let actions: Vec<AdminAction> = runs.iter().map(|r| r.action).collect();
        assert_eq!(actions, [Deny, Allow, Deny, Pass]);
        // The first run: the two any-port rules merged, the port-80 one apart.
        assert_eq!(runs[0].clauses.len(), 2);
        let PeerMatch::Addrs(set) = &runs[0].clauses[0].peers else {
            panic!()
        };
        assert!(set.contains("10.0.0.1".parse().unwrap()));
        assert!(set.contains("10.0.0.2".parse().unwrap()));
        assert!(!set.contains("10.0.0.3".parse().unwrap()));
        assert_eq!(
            runs[0].clauses[1], tier[2].clauses[0],
            "alone: kept as it was"
        );
        // The same peers on different ports: one clause, the ports united (and never a clause
        // of other peers and other ports: 10.0.0.9 stays on 443 alone).
        let tier = [
            rule(Deny, &["10.0.0.1"], Some(80)),
            rule(Deny, &["10.0.0.1"], Some(81)),
            rule(Deny, &["10.0.0.9"], Some(443)),
        ];
        let runs = tier_runs(&tier, false);
        assert_eq!(runs[0].clauses.len(), 2);
        assert_eq!(runs[0].clauses[0].peers, tier[0].clauses[0].peers);
        let PortMatch::Only(ports) = &runs[0].clauses[0].ports else {
            panic!()
        };
        assert_eq!(ports.len(), 2);
        assert_eq!(runs[0].clauses[1], tier[2].clauses[0]);
        // Baseline: Pass decides nothing, so the Denies around it join.
        let baseline = [
            rule(Deny, &["10.0.0.1"], None),
            rule(Pass, &["10.0.0.2"], None),
            rule(Deny, &["10.0.0.3"], None),
        ];
        let runs = tier_runs(&baseline, true);
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].clauses.len(), 1);
    }
}
