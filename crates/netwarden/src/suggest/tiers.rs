//! What the cluster's admin policies (SPEC 8) decide for the observed flows, so that a
//! suggestion neither writes rules that can never take effect nor drops a flow silently.
//!
//! The Admin tier is evaluated before any namespaced policy: where one of its rules allows or
//! denies a side of a flow, no NetworkPolicy (nor MultiNetworkPolicy, DanmNetworkPolicy) on
//! that side is ever consulted. A Pass hands the side to the namespaced tier, which is where a
//! suggestion works. The Baseline tier is consulted only where no namespaced policy isolates
//! the side, so it stops applying wherever a suggestion isolates (the YAML says so).
//!
//! The decisions are the engine's own ([`DirectionRules::decide`], the evaluation `explain`
//! and the kernel rules follow), for every pod pair of the flow's workloads (every replica,
//! every address of the flow's network, same family) and both views:
//! - a side is **settled** when the Admin tier decides it (Allow or Deny) for every pair in
//!   both views: a namespaced rule there could never take effect, so none is suggested;
//! - a flow is **denied** when for every pair, in both views, the Admin tier denies one of its
//!   sides: no rule is suggested for it on either side;
//! - anything less (some replicas, one view only: a monitored admin policy) is listed, and the
//!   rules are suggested as if there were no admin policy (harmless where the Admin tier
//!   decides, needed where it does not).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use netwarden_engine::{
    AdminAction, AdminRef, Decision, Direction, DirectionRules, InterfaceRules, NetworkId, PodKey,
    PodRules, TierOrigin, TierRule,
};

use super::flows::{End, Flow, Observations};
use super::workloads::{WorkloadId, Workloads};

/// An Admin tier rule that decided a side of a flow, for at least one pod pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminDecision {
    pub origin: TierOrigin,
    pub action: AdminAction,
    /// It decided in the enforced view (for some pair).
    pub enforced: bool,
    /// It decided in the staged view (for some pair).
    pub staged: bool,
}

impl AdminDecision {
    /// `both views`, `enforced view` or `staged view`.
    pub fn views(&self) -> &'static str {
        match (self.enforced, self.staged) {
            (true, true) => "both views",
            (true, false) => "enforced view",
            _ => "staged view",
        }
    }
}

/// What the Admin tier decides for one observed flow.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowTiers {
    /// Denied by the Admin tier for every pod pair in both views.
    pub denied: bool,
    /// The sides the Admin tier decides for every pod pair in both views.
    pub settled: BTreeSet<Direction>,
    /// Every Admin rule that decided a side for some pair in some view, in the order met.
    pub rules: Vec<AdminDecision>,
}

/// The admin policies' part in a suggestion: per flow the Admin tier decides for at least one
/// pod pair, and per isolated unit the Baseline policies that stop applying.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminTiers {
    pub flows: HashMap<Flow, FlowTiers>,
    /// (workload, direction, network) → Baseline policies with rules on those interfaces of
    /// its pods (either view), for the workloads that logged in that direction.
    pub baseline: BTreeMap<(WorkloadId, Direction, NetworkId), Vec<AdminRef>>,
}

/// One end of a pod pair: its address, and for a pod its interface's rules.
type Candidate<'r> = (IpAddr, Option<&'r InterfaceRules>, Option<&'r PodKey>);

impl AdminTiers {
    /// The Admin tier's decisions for every flow of `observations`, from `rules` (the engine's
    /// rules of the cluster's pods; a pod missing there is taken as having no admin rule).
    pub fn of(
        workloads: &Workloads,
        observations: &Observations,
        rules: &BTreeMap<PodKey, PodRules>,
    ) -> AdminTiers {
        let mut out = AdminTiers::default();
        let interfaces = |end: End, network: &NetworkId| -> Vec<Candidate<'_>> {
            match end {
                End::Address(ip) => vec![(ip, None, None)],
                End::Workload(id) => workloads
                    .get(id)
                    .pods
                    .iter()
                    .filter_map(|key| rules.get_key_value(key))
                    .flat_map(|(key, pod)| {
                        pod.interfaces
                            .iter()
                            .filter(|i| &i.network == network)
                            .flat_map(move |i| {
                                i.ips.iter().map(move |ip| (*ip, Some(i), Some(key)))
                            })
                    })
                    .collect(),
            }
        };
        for (flow, _) in observations.sorted_flows() {
            let (srcs, dsts) = (
                interfaces(flow.src, &flow.network),
                interfaces(flow.dst, &flow.network),
            );
            let tiers = flow_tiers(flow, &srcs, &dsts);
            if !tiers.rules.is_empty() {
                out.flows.insert(flow.clone(), tiers);
            }
        }
        // Every interface of a workload that logged in a direction: a DanmNetworkPolicy
        // isolates them all, not only those of the networks that logged.
        let isolated: BTreeSet<(WorkloadId, Direction)> = observations
            .watched
            .iter()
            .map(|(workload, direction, _)| (*workload, *direction))
            .collect();
        for (workload, direction) in isolated {
            for key in &workloads.get(workload).pods {
                let Some(pod) = rules.get(key) else { continue };
                for i in &pod.interfaces {
                    let names = out
                        .baseline
                        .entry((workload, direction, i.network.clone()))
                        .or_default();
                    for name in i.direction(direction).baseline.policies() {
                        if !names.contains(&name) {
                            names.push(name);
                        }
                    }
                }
            }
        }
        out.baseline.retain(|_, names| !names.is_empty());
        out
    }

    /// The Baseline policies that stop applying to `workload`'s `direction` on `networks`.
    pub fn baseline_of<'a>(
        &self,
        workload: WorkloadId,
        direction: Direction,
        networks: impl Iterator<Item = &'a NetworkId>,
    ) -> Vec<AdminRef> {
        let mut out: Vec<AdminRef> = Vec::new();
        for network in networks {
            for name in self
                .baseline
                .get(&(workload, direction, network.clone()))
                .into_iter()
                .flatten()
            {
                if !out.contains(name) {
                    out.push(name.clone());
                }
            }
        }
        out
    }
}

/// The Admin rule deciding `rules` in `view` for `peer`, if the Admin tier decides.
fn admin_decision<'r>(
    rules: &'r DirectionRules,
    staged: bool,
    peer: IpAddr,
    flow: &Flow,
) -> Option<&'r TierRule> {
    match rules.decide(staged, peer, flow.protocol, flow.port) {
        Decision::Admin(rule) => Some(rule),
        _ => None,
    }
}

/// The Admin tier's decisions on one side of a flow, computed once per (own end's rules,
/// peer address, view). Replicas of a workload mostly have the same admin rules (subjects
/// select namespaces and labels), and the same rules decide alike, so the ends are grouped by
/// their admin rules: a flow between two workloads of n replicas costs about 2n evaluations
/// per view, not n².
struct Side<'r> {
    /// Per candidate: its group (`None`: an address, no rules of ours).
    group_of: Vec<Option<usize>>,
    /// One direction's rules per group, standing for every member (only its Admin tier is
    /// asked, which depends on `admin` alone).
    groups: Vec<&'r DirectionRules>,
    memo: HashMap<(usize, IpAddr, bool), Option<&'r TierRule>>,
}

impl<'r> Side<'r> {
    fn new(ends: &[Candidate<'r>], direction: Direction) -> Side<'r> {
        let mut groups: Vec<&'r DirectionRules> = Vec::new();
        let group_of = ends
            .iter()
            .map(|(_, rules, _)| {
                let rules = rules.map(|i| i.direction(direction))?;
                Some(match groups.iter().position(|g| g.admin == rules.admin) {
                    Some(n) => n,
                    None => {
                        groups.push(rules);
                        groups.len() - 1
                    }
                })
            })
            .collect();
        Side {
            group_of,
            groups,
            memo: HashMap::new(),
        }
    }

    /// The Admin rule deciding candidate `end`'s side for `peer` in a view (`None`: the
    /// Admin tier does not decide), noted in `seen` the first time.
    fn decide(
        &mut self,
        end: usize,
        peer: IpAddr,
        staged: bool,
        flow: &Flow,
        seen: &mut Vec<AdminDecision>,
    ) -> Option<&'r TierRule> {
        let group = self.group_of[end]?;
        let rules = self.groups[group];
        *self.memo.entry((group, peer, staged)).or_insert_with(|| {
            let rule = admin_decision(rules, staged, peer, flow);
            if let Some(rule) = rule {
                note(seen, rule, staged);
            }
            rule
        })
    }
}

fn flow_tiers(flow: &Flow, srcs: &[Candidate<'_>], dsts: &[Candidate<'_>]) -> FlowTiers {
    let mut out = FlowTiers::default();
    let mut pairs = 0usize;
    let mut denied = true;
    // Egress at the source, ingress at the destination.
    let (mut egress, mut ingress) = (
        Side::new(srcs, Direction::Egress),
        Side::new(dsts, Direction::Ingress),
    );
    let mut settled = [(Direction::Egress, true), (Direction::Ingress, true)];
    for (s, (src_ip, _, src_pod)) in srcs.iter().enumerate() {
        for (d, (dst_ip, _, dst_pod)) in dsts.iter().enumerate() {
            // A pod talking to itself is never subject to admin policies (SPEC 8), and only
            // addresses of one family make a flow.
            if src_ip.is_ipv4() != dst_ip.is_ipv4() || (src_pod.is_some() && src_pod == dst_pod) {
                continue;
            }
            pairs += 1;
            for staged in [false, true] {
                let sides = [
                    egress.decide(s, *dst_ip, staged, flow, &mut out.rules),
                    ingress.decide(d, *src_ip, staged, flow, &mut out.rules),
                ];
                let mut pair_denied = false;
                for (n, decided) in sides.into_iter().enumerate() {
                    match decided {
                        Some(rule) => pair_denied |= rule.action == AdminAction::Deny,
                        None => settled[n].1 = false,
                    }
                }
                denied &= pair_denied;
            }
        }
    }
    let decided_at_all = pairs > 0;
    out.denied = decided_at_all && denied;
    out.settled = settled
        .into_iter()
        .filter(|(_, all)| decided_at_all && *all)
        .map(|(direction, _)| direction)
        .collect();
    out
}

/// Adds `rule` (deciding in `staged`'s view) to `seen`, once per rule and action.
fn note(seen: &mut Vec<AdminDecision>, rule: &TierRule, staged: bool) {
    let found = seen
        .iter_mut()
        .find(|d| d.origin == rule.origin && d.action == rule.action);
    let entry = match found {
        Some(entry) => entry,
        None => {
            seen.push(AdminDecision {
                origin: rule.origin.clone(),
                action: rule.action,
                enforced: false,
                staged: false,
            });
            seen.last_mut().expect("just pushed")
        }
    };
    if staged {
        entry.staged = true;
    } else {
        entry.enforced = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suggest::flows::Seen;
    use netwarden_engine::testing::{admin_policy, admin_rule, namespace, pod};
    use netwarden_engine::{
        AdminKind, AdminPeer, Engine, EngineOptions, LabelSelector, Mode, PodsSelector, Protocol,
    };
    use netwarden_monitor::Timestamp;

    fn pods_of(ns: &str, labels: &[(&str, &str)]) -> PodsSelector {
        PodsSelector {
            namespaces: netwarden_engine::testing::selector(&[("team", ns)]),
            pods: netwarden_engine::testing::selector(labels),
        }
    }

    /// x/web-1 and x/web-2 (one workload, different pod-template-hash), x/client.
    /// `guard` denies client into web-1 only; a monitored `audit` denies web into client;
    /// `open` allows client's egress to 5432.
    fn setup() -> (Workloads, BTreeMap<PodKey, PodRules>) {
        let mut e = Engine::new(EngineOptions::default());
        e.set_namespace(namespace("x", &[("team", "x")]));
        let pods = [
            pod(
                "x",
                "web-1",
                &[("app", "web"), ("pod-template-hash", "h1")],
                &["10.0.0.1"],
            ),
            pod(
                "x",
                "web-2",
                &[("app", "web"), ("pod-template-hash", "h2")],
                &["10.0.0.2"],
            ),
            pod("x", "client", &[("app", "client")], &["10.0.0.3"]),
        ];
        for p in &pods {
            e.set_pod(p.clone());
        }
        let rule = |action, peer: PodsSelector, port: Option<u16>| {
            let mut r = admin_rule(action, vec![AdminPeer::Pods(peer)], None);
            r.ports = port.map(|p| {
                vec![netwarden_engine::AdminPort::Numbers(
                    netwarden_engine::PortRange {
                        protocol: Protocol::Tcp,
                        ports: Some((p, p)),
                    },
                )]
            });
            r
        };
        e.set_admin_policy(admin_policy(
            AdminKind::AdminNetworkPolicy,
            "guard",
            5,
            pods_of("x", &[("pod-template-hash", "h1")]),
            vec![rule(
                AdminAction::Deny,
                pods_of("x", &[("app", "client")]),
                None,
            )],
            vec![],
        ));
        let mut audit = admin_policy(
            AdminKind::AdminNetworkPolicy,
            "audit",
            1,
            pods_of("x", &[("app", "client")]),
            vec![rule(
                AdminAction::Deny,
                pods_of("x", &[("app", "web")]),
                None,
            )],
            vec![],
        );
        audit.mode = Mode::Monitor;
        e.set_admin_policy(audit);
        e.set_admin_policy(admin_policy(
            AdminKind::ClusterNetworkPolicy,
            "open",
            9,
            pods_of("x", &[("app", "client")]),
            vec![],
            vec![rule(
                AdminAction::Allow,
                PodsSelector {
                    namespaces: LabelSelector::default(),
                    pods: LabelSelector::default(),
                },
                Some(5432),
            )],
        ));
        (Workloads::new(&pods), e.all_pod_rules())
    }

    fn observe(w: &Workloads, flows: &[(&str, &str, u16)]) -> Observations {
        let mut obs = Observations::default();
        let id = |name: &str| w.of_pod(&PodKey::new("x", name)).unwrap();
        for (src, dst, port) in flows {
            let flow = Flow {
                network: NetworkId::Primary,
                src: End::Workload(id(src)),
                dst: End::Workload(id(dst)),
                protocol: Protocol::Tcp,
                port: *port,
            };
            let at = Timestamp::from_secs(0);
            obs.flows.insert(
                flow,
                Seen {
                    count: 1,
                    first: at,
                    last: at,
                },
            );
        }
        obs
    }

    #[test]
    fn decisions_over_replicas_and_views() {
        let (w, rules) = setup();
        let obs = observe(
            &w,
            &[
                ("client", "web-1", 80),
                ("web-1", "client", 80),
                ("client", "web-1", 5432),
            ],
        );
        let tiers = AdminTiers::of(&w, &obs, &rules);
        let get = |src: &str, dst: &str, port: u16| {
            let id = |name: &str| End::Workload(w.of_pod(&PodKey::new("x", name)).unwrap());
            tiers.flows.get(&Flow {
                network: NetworkId::Primary,
                src: id(src),
                dst: id(dst),
                protocol: Protocol::Tcp,
                port,
            })
        };
        // guard denies one replica of two: listed, neither denied nor settled.
        let partly = get("client", "web-1", 80).expect("guard decides for web-1");
        assert!(!partly.denied && partly.settled.is_empty(), "{partly:?}");
        assert_eq!(partly.rules.len(), 1);
        assert_eq!(partly.rules[0].origin.policy.name, "guard");
        assert_eq!(partly.rules[0].views(), "both views");
        // A monitored Deny decides in the staged view only: not settled.
        let staged = get("web-1", "client", 80).expect("audit decides when staged");
        assert!(!staged.denied && staged.settled.is_empty(), "{staged:?}");
        assert_eq!(
            (
                staged.rules[0].origin.policy.name.as_str(),
                staged.rules[0].views()
            ),
            ("audit", "staged view")
        );
        // An Allow on client's egress for every replica in both views settles that side; on
        // web-1 the ingress is also denied by guard, on web-2 not: not denied.
        let open = get("client", "web-1", 5432).expect("open decides");
        assert!(!open.denied);
        assert_eq!(
            open.settled.iter().collect::<Vec<_>>(),
            [&Direction::Egress]
        );
        let names: Vec<&str> = open
            .rules
            .iter()
            .map(|r| r.origin.policy.name.as_str())
            .collect();
        assert_eq!(names, ["open", "guard"]);
    }
}
