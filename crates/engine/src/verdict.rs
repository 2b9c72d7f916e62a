//! Verdicts for single flows: a connection from one pod interface to another is allowed when
//! the source side's egress allows it AND the destination side's ingress allows it, each in the
//! enforced and in the staged view.

use std::net::IpAddr;

use serde::Serialize;

use crate::admin::{AdminAction, AdminRef};
use crate::model::{Direction, PodKey, PolicyRef, Protocol};
use crate::rules::{Decision, DirectionRules, InterfaceRules, RuleOrigin, StagedCause, TierOrigin};

/// Why a side allows traffic without looking at any rule (SPEC 3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AlwaysAllowed {
    /// A pod talking to itself goes through `lo`.
    Loopback,
    /// Outgoing DNS where the isolating policies imply it (SPEC 3.1, `--dns`).
    Dns,
}

/// One side (egress of the source or ingress of the destination) in one view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SideVerdict {
    pub allowed: bool,
    pub isolated: bool,
    /// The policies isolating this side in this view.
    pub policies: Vec<PolicyRef>,
    /// Every rule that matches the flow.
    pub matched: Vec<RuleOrigin>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub always_allowed: Option<AlwaysAllowed>,
    /// The admin policy rule that decided (SPEC 8: an Admin tier Allow or Deny before the
    /// namespaced tier, or a Baseline rule when no namespaced policy isolates), if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier_rule: Option<TierDecision>,
    /// The Admin tier rule that matched with Pass, handing the flow to the namespaced tier
    /// (empty or one: the first matching Admin rule decides).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub passed: Vec<TierOrigin>,
}

/// An admin policy rule's decision on one side of a flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TierDecision {
    pub origin: TierOrigin,
    pub action: AdminAction,
}

/// A side in both views.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SideVerdicts {
    pub direction: Direction,
    pub pod: PodKey,
    pub interface: String,
    pub enforced: SideVerdict,
    pub staged: SideVerdict,
}

/// The verdict for one flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FlowVerdict {
    pub allowed: bool,
    pub staged_allowed: bool,
    pub egress: SideVerdicts,
    pub ingress: SideVerdicts,
    /// Set when the flow is a would-deny (enforced allows, staged denies).
    pub cause: Option<StagedCause>,
    /// Monitored policies concerned (isolating a side of a would-deny).
    pub monitored_policies: Vec<PolicyRef>,
    /// Monitored admin policies concerned (with rules on a side of a would-deny, SPEC 8).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub monitored_admin: Vec<AdminRef>,
}

/// One end of a flow: a pod, one of its interfaces (with rules) and the address used.
#[derive(Debug, Clone, Copy)]
pub struct FlowEnd<'a> {
    pub pod: &'a PodKey,
    pub interface: &'a InterfaceRules,
    pub ip: IpAddr,
}

/// Why one side allows the flow whatever its rules say, in one view: a pod talking to itself
/// (loopback), or outgoing DNS where the view implies it (SPEC 3.1).
#[derive(Debug, Clone, Copy)]
struct Implicit {
    loopback: bool,
    /// The flow is to TCP/UDP 53 and this is the egress side.
    dns_port: bool,
}

impl Implicit {
    /// The implicit allowances of a `direction` side of a flow to `protocol`/`port`, between
    /// two interfaces of one pod (`loopback`) or not.
    fn of(direction: Direction, loopback: bool, protocol: Protocol, port: u16) -> Implicit {
        Implicit {
            loopback,
            dns_port: direction == Direction::Egress
                && port == 53
                && matches!(protocol, Protocol::Tcp | Protocol::Udp),
        }
    }

    fn in_view(self, rules: &DirectionRules, staged: bool) -> Option<AlwaysAllowed> {
        if self.loopback {
            Some(AlwaysAllowed::Loopback)
        } else if self.dns_port && rules.implicit_dns.in_view(staged) {
            Some(AlwaysAllowed::Dns)
        } else {
            None
        }
    }
}

fn side(
    rules: &DirectionRules,
    staged: bool,
    peer: IpAddr,
    protocol: Protocol,
    port: u16,
    implicit: Implicit,
) -> SideVerdict {
    let isolation = rules.isolation(staged);
    let policies = if staged {
        let mut p: Vec<PolicyRef> = rules
            .enforced_policies
            .iter()
            .filter(|p| !rules.replaced_policies.contains(p))
            .cloned()
            .collect();
        p.extend(rules.monitored_policies.iter().cloned());
        p
    } else {
        rules.enforced_policies.clone()
    };
    let isolated = isolation.is_isolated();
    // A pod talking to itself goes through `lo`, before any tier (SPEC 3.1 and 8).
    if implicit.loopback {
        return SideVerdict {
            allowed: true,
            isolated,
            policies,
            matched: Vec::new(),
            // Said where a rule would otherwise have been consulted (as before tiers).
            always_allowed: (isolated || rules.has_tiers()).then_some(AlwaysAllowed::Loopback),
            tier_rule: None,
            passed: Vec::new(),
        };
    }
    // The first Admin rule that matches decides (SPEC 8): a Pass hands over at once, so at
    // most one Pass is ever consulted; the rules after it are not.
    let passed: Vec<TierOrigin> = rules
        .admin
        .view(staged)
        .iter()
        .find(|r| r.matches(peer, protocol, port))
        .filter(|r| r.action == AdminAction::Pass)
        .map(|r| r.origin.clone())
        .into_iter()
        .collect();
    let decided = |rule: &crate::rules::TierRule| TierDecision {
        origin: rule.origin.clone(),
        action: rule.action,
    };
    match rules.decide(staged, peer, protocol, port) {
        Decision::Namespaced(matched) => {
            // The implicit DNS allowance belongs to the namespaced tier (an admin Deny
            // blocks DNS too).
            let always = implicit.in_view(rules, staged);
            SideVerdict {
                allowed: !matched.is_empty() || always.is_some(),
                isolated,
                policies,
                matched: matched.into_iter().map(|r| r.origin.clone()).collect(),
                always_allowed: always,
                tier_rule: None,
                passed,
            }
        }
        decision => SideVerdict {
            allowed: decision.allowed(),
            isolated,
            policies,
            matched: Vec::new(),
            always_allowed: None,
            tier_rule: match decision {
                Decision::Admin(rule) | Decision::Baseline(rule) => Some(decided(rule)),
                _ => None,
            },
            passed,
        },
    }
}

fn side_verdicts(
    direction: Direction,
    end: FlowEnd<'_>,
    peer: IpAddr,
    protocol: Protocol,
    port: u16,
    implicit: Implicit,
) -> SideVerdicts {
    let rules = end.interface.direction(direction);
    SideVerdicts {
        direction,
        pod: end.pod.clone(),
        interface: end.interface.name.clone(),
        enforced: side(rules, false, peer, protocol, port, implicit),
        staged: side(rules, true, peer, protocol, port, implicit),
    }
}

/// Whether one side of a flow allows it in one view: the `allowed` of that side's
/// [`SideVerdict`] in [`flow_verdict`], without collecting the policies and rules that explain
/// it — for callers that test many flows and explain few (`diff` tests every peer of a changed
/// pod and explains only the flows whose verdict changed). `rules` is the side's direction of
/// its interface, `peer` the other end's address, `loopback` whether both ends are one pod.
pub fn side_allows(
    direction: Direction,
    rules: &DirectionRules,
    staged: bool,
    peer: IpAddr,
    protocol: Protocol,
    port: u16,
    loopback: bool,
) -> bool {
    if loopback {
        return true;
    }
    match rules.decide(staged, peer, protocol, port) {
        Decision::Namespaced(matched) => {
            !matched.is_empty()
                || Implicit::of(direction, loopback, protocol, port)
                    .in_view(rules, staged)
                    .is_some()
        }
        decision => decision.allowed(),
    }
}

/// The verdict for a new connection `src → dst` to `protocol`/`port`.
pub fn flow_verdict(
    src: FlowEnd<'_>,
    dst: FlowEnd<'_>,
    protocol: Protocol,
    port: u16,
) -> FlowVerdict {
    let loopback = src.pod == dst.pod;
    let egress = side_verdicts(
        Direction::Egress,
        src,
        dst.ip,
        protocol,
        port,
        Implicit::of(Direction::Egress, loopback, protocol, port),
    );
    let ingress = side_verdicts(
        Direction::Ingress,
        dst,
        src.ip,
        protocol,
        port,
        Implicit::of(Direction::Ingress, loopback, protocol, port),
    );
    let allowed = egress.enforced.allowed && ingress.enforced.allowed;
    let staged_allowed = egress.staged.allowed && ingress.staged.allowed;
    let mut cause = None;
    let mut monitored_policies = Vec::new();
    let mut monitored_admin = Vec::new();
    if allowed && !staged_allowed {
        for (sv, end, dir) in [
            (&egress, src, Direction::Egress),
            (&ingress, dst, Direction::Ingress),
        ] {
            if !sv.staged.allowed {
                let rules = end.interface.direction(dir);
                cause.get_or_insert(rules.staged_cause());
                monitored_policies.extend(rules.monitored_policies.iter().cloned());
                monitored_admin.extend(rules.monitored_admin());
            }
        }
    }
    FlowVerdict {
        allowed,
        staged_allowed,
        egress,
        ingress,
        cause,
        monitored_policies,
        monitored_admin,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::{AdminAction, AdminKind, AdminPeer};
    use crate::testing::*;
    use crate::{Engine, EngineOptions, PodRules};

    /// The first Admin rule that matches decides: of two matching Pass rules, `explain`
    /// names the first only (the second is never consulted).
    #[test]
    fn only_the_first_matching_pass_is_named() {
        let mut e = Engine::new(EngineOptions::default());
        e.set_namespace(namespace("a", &[("team", "a")]));
        e.set_pod(pod("a", "client", &[], &["10.0.0.1"]));
        e.set_pod(pod("a", "server", &[], &["10.0.0.2"]));
        for (name, priority) in [("first", 1), ("second", 2)] {
            e.set_admin_policy(admin_policy(
                AdminKind::AdminNetworkPolicy,
                name,
                priority,
                in_namespaces(&[("team", "a")]),
                vec![admin_rule(
                    AdminAction::Pass,
                    vec![AdminPeer::Pods(in_namespaces(&[("team", "a")]))],
                    None,
                )],
                vec![],
            ));
        }
        let (ck, sk) = (PodKey::new("a", "client"), PodKey::new("a", "server"));
        let (client, server) = (e.pod_rules(&ck).unwrap(), e.pod_rules(&sk).unwrap());
        fn end<'a>(pod: &'a PodKey, rules: &'a PodRules) -> FlowEnd<'a> {
            FlowEnd {
                pod,
                interface: &rules.interfaces[0],
                ip: rules.interfaces[0].ips[0],
            }
        }
        let verdict = flow_verdict(end(&ck, &client), end(&sk, &server), Protocol::Tcp, 80);
        let passed = &verdict.ingress.enforced.passed;
        assert_eq!(passed.len(), 1, "{passed:?}");
        assert_eq!(passed[0].policy.name, "first");
        assert!(verdict.ingress.enforced.allowed);
    }
}
