//! `netwarden diff`: the flows whose verdict a change to the objects changes (issue 9, SPEC
//! section 6) — "what will this pull request do to the traffic?".
//!
//! The probes are `reach`'s (same pairs, networks, ports and families); a [`Change`] is a probe
//! that exists in both views (same pods, interfaces, network, port, protocol and family) whose
//! `allowed` or `staged_allowed` differs. Probes of pods, interfaces or families that exist in
//! one view only are not verdict changes and are not listed.
//!
//! # Only the pairs that can change
//!
//! A probe's verdict is a function of its two ends only: the source interface's egress rules,
//! the destination interface's ingress rules, their addresses and whether they are one pod
//! ([`flow_verdict`]). So a probe can change only if one of its ends is a pod whose computed
//! [`PodRules`] (or whether it takes part at all: host-network) differ between the views. The
//! engine is fed the base, computes every pod's rules once, is fed the difference
//! ([`InventoryDelta`]), and names the pods whose rules may differ
//! ([`Engine::take_dirty`]: the targets of added, removed and edited policies, and of the
//! policies whose peers or named ports moved with a pod or namespace change). Only those are
//! recomputed, and only the pairs with such a pod at one end are considered: with one changed
//! policy on the 10,000-pod cluster, a few pods × 10,000 peers instead of 10,000².
//!
//! Of those, a pair with one touched end is evaluated in full (both views, with the policies
//! and rules that explain it) only where it can change (`TouchedSides`): the untouched end
//! has the same rules and addresses in both views, so its side's verdict is the same too, and
//! the flow's verdict changes only where the touched end's side verdict does — on the
//! direction facing the peer (the source's egress, the destination's ingress), against the
//! peer's address. That side test ([`side_allows`]) collects nothing, and is made once per
//! distinct (before, after) rules and peer, shared by the replicas whose rules are equal. A
//! touched pod whose addresses moved is paired in full (its peers see another address). A
//! property test (`tests/diff.rs`) checks the result against the naive comparison of two full
//! `reach` runs on random clusters and changes.
//!
//! # The policies responsible
//!
//! For a change, in each view whose flow verdict changed (enforced: `before`/`after`; staged:
//! `staged_before`/`staged_after`), and on each side (source egress, destination ingress) whose
//! verdict in that view changed, a policy is responsible when its *contribution* to that side
//! in that view changed: whether it isolates the side, and whether one of its rules matches
//! the flow. That names an added, removed or edited policy that selects the side, and also an
//! unchanged policy whose match changed because a peer pod or namespace was relabelled. A
//! policy that enters or leaves a side's staged view because a monitored policy started or
//! stopped replacing it (`netwarden.io/replaces`) also names the monitored policies that
//! replace it. Every change has at least one responsible policy: a side's verdict changes only
//! when its isolating policies or their matches do (loopback never changes; implicit DNS
//! follows the isolating policies' kinds).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{self, Write};
use std::net::IpAddr;

use netwarden_engine::verdict::SideVerdicts;
use netwarden_engine::{
    side_allows, AdminRef, Direction, DirectionRules, Engine, EngineOptions, FlowVerdict, Mode,
    NetworkId, PodKey, PodRules, PolicyRef, PortRef, Protocol, SideVerdict,
};
use netwarden_manifest::{Inventory, InventoryDelta};
use serde::Serialize;

use crate::cli_args::PortProto;
use crate::inventory::{apply_delta, engine_from};
use crate::reach::{as_display, Family, Member, Reach, ReachQuery};

/// What kind of verdict change a [`Change`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChangeKind {
    /// Allowed before, denied after (the enforced verdict).
    NewlyDenied,
    /// Denied before, allowed after (the enforced verdict).
    NewlyAllowed,
    /// The enforced verdict is the same; the staged one ("once the monitored policies are
    /// enforced") changed.
    StagedView,
}

impl ChangeKind {
    /// The kind of a change of the enforced verdict from `before` to `after`.
    pub fn of(before: bool, after: bool) -> ChangeKind {
        match (before, after) {
            (true, false) => ChangeKind::NewlyDenied,
            (false, true) => ChangeKind::NewlyAllowed,
            _ => ChangeKind::StagedView,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::NewlyDenied => "newly-denied",
            ChangeKind::NewlyAllowed => "newly-allowed",
            ChangeKind::StagedView => "staged-view",
        }
    }
}

/// One probe whose verdict the change changes. Serializes to the contract's object (SPEC 6);
/// `src`/`dst` are the addresses after the change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    #[serde(serialize_with = "as_display")]
    pub from: PodKey,
    #[serde(serialize_with = "as_display")]
    pub to: PodKey,
    pub network: NetworkId,
    pub port: u16,
    pub protocol: Protocol,
    pub family: Family,
    pub before: bool,
    pub after: bool,
    pub staged_before: bool,
    pub staged_after: bool,
    pub kind: ChangeKind,
    /// The policies responsible (see the [module documentation](self)), sorted.
    pub policies: Vec<PolicyRef>,
    /// The admin policies (SPEC 8) whose rule decided a changed side before or after, sorted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub admin_policies: Vec<AdminRef>,
    pub from_interface: String,
    pub to_interface: String,
    pub src: IpAddr,
    pub dst: IpAddr,
}

/// All changes, as `diff -o json` prints them.
#[derive(Debug, Clone, Serialize)]
pub struct DiffReport {
    pub changes: Vec<Change>,
}

/// Per enforced policy (`namespace`, `name`), the monitored policies that replace it
/// (`netwarden.io/replaces`), in one view.
type Replacers = HashMap<(String, String), Vec<PolicyRef>>;

fn replacers(inventory: &Inventory) -> Replacers {
    let mut out: Replacers = HashMap::new();
    for policy in inventory
        .policies
        .iter()
        .filter(|p| p.mode == Mode::Monitor)
    {
        if let Some(replaced) = &policy.replaces {
            out.entry((policy.key.namespace.clone(), replaced.clone()))
                .or_default()
                .push(policy.reference());
        }
    }
    out
}

/// The pods that take part in `reach` in a view (host-network pods do not).
fn taking_part(inventory: &Inventory) -> HashSet<&PodKey> {
    inventory
        .pods
        .iter()
        .filter(|p| !p.host_network)
        .map(|p| &p.key)
        .collect()
}

/// Every probe of `query` whose verdict differs between `base` and `changed` (see the
/// [module documentation](self)), in `reach`'s order: network, source, destination, port,
/// family.
pub fn diff(
    base: &Inventory,
    changed: &Inventory,
    options: &EngineOptions,
    query: &ReachQuery,
) -> Vec<Change> {
    let mut engine = engine_from(base, options.clone());
    let before = engine.all_pod_rules();
    apply_delta(&mut engine, InventoryDelta::between(Some(base), changed));
    let dirty = engine.take_dirty();
    let recomputed: BTreeMap<PodKey, PodRules> = dirty
        .iter()
        .filter_map(|key| engine.pod_rules(key).map(|r| (key.clone(), r)))
        .collect();
    let (part_before, part_after) = (taking_part(base), taking_part(changed));
    let before_view = before.values().filter(|r| part_before.contains(&r.pod));
    let after_view = after_rules(&engine, &before, &recomputed, &part_after);
    // The pods whose end of a flow differs between the views.
    let touched: HashSet<&PodKey> = dirty
        .iter()
        .filter(|key| {
            let was = before.get(*key).filter(|_| part_before.contains(key));
            let is = recomputed.get(*key).filter(|_| part_after.contains(key));
            was != is
        })
        .collect();
    let views = Views {
        before: Reach::over(before_view, query),
        after: Reach::over(after_view, query),
        replacers_before: replacers(base),
        replacers_after: replacers(changed),
        ports: &query.ports,
    };
    views.changes(&touched)
}

/// The rules of the pods taking part after the change, in pod order: recomputed where the
/// engine named the pod dirty, else as before.
fn after_rules<'a>(
    engine: &'a Engine,
    before: &'a BTreeMap<PodKey, PodRules>,
    recomputed: &'a BTreeMap<PodKey, PodRules>,
    part_after: &'a HashSet<&'a PodKey>,
) -> impl Iterator<Item = &'a PodRules> + 'a {
    engine
        .pods()
        .filter(move |p| part_after.contains(&p.key))
        .filter_map(move |p| recomputed.get(&p.key).or_else(|| before.get(&p.key)))
}

/// Both views, indexed for pairing.
struct Views<'a> {
    before: Reach<'a>,
    after: Reach<'a>,
    replacers_before: Replacers,
    replacers_after: Replacers,
    ports: &'a [PortProto],
}

impl Views<'_> {
    fn changes(&self, touched: &HashSet<&PodKey>) -> Vec<Change> {
        let before_networks: HashMap<&NetworkId, &Vec<Member<'_>>> = self
            .before
            .networks()
            .iter()
            .map(|(network, members)| (*network, members))
            .collect();
        let mut out = Vec::new();
        for (network, members) in self.after.networks() {
            let Some(old_members) = before_networks.get(network) else {
                continue;
            };
            // Each member's counterpart before the change: same pod, same interface.
            let old_index: HashMap<(&PodKey, &str), usize> = old_members
                .iter()
                .enumerate()
                .map(|(i, m)| ((m.pod, m.rules.name.as_str()), i))
                .collect();
            let counterpart: Vec<Option<&Member<'_>>> = members
                .iter()
                .map(|m| {
                    old_index
                        .get(&(m.pod, m.rules.name.as_str()))
                        .map(|i| &old_members[*i])
                })
                .collect();
            let is_touched: Vec<bool> = members.iter().map(|m| touched.contains(m.pod)).collect();
            let touched_members: Vec<usize> =
                (0..members.len()).filter(|i| is_touched[*i]).collect();
            let all: Vec<usize> = (0..members.len()).collect();
            let mut sides = TouchedSides::new(members, &counterpart, &touched_members, self.ports);
            for (s, src) in members.iter().enumerate() {
                let Some(old_src) = counterpart[s] else {
                    continue;
                };
                // A pair with neither end touched cannot change.
                let destinations = if is_touched[s] {
                    &all
                } else {
                    &touched_members
                };
                for &d in destinations {
                    let Some(old_dst) = counterpart[d] else {
                        continue;
                    };
                    // With one end touched, the untouched end's side is the same in both
                    // views: the pair can change only where the touched end's side does.
                    let may_change = match (is_touched[s], is_touched[d]) {
                        (true, false) => sides.may_change(s, Direction::Egress, d),
                        (false, true) => sides.may_change(d, Direction::Ingress, s),
                        _ => true,
                    };
                    if !may_change {
                        continue;
                    }
                    let dst = &members[d];
                    for port in self.ports {
                        for family in [Family::Ipv4, Family::Ipv6] {
                            let was = self.before.flow(old_src, old_dst, *port, family);
                            let is = self.after.flow(src, dst, *port, family);
                            let (Some((_, _, was)), Some((s_ip, d_ip, is))) = (was, is) else {
                                continue;
                            };
                            if was.allowed == is.allowed && was.staged_allowed == is.staged_allowed
                            {
                                continue;
                            }
                            out.push(Change {
                                from: src.pod.clone(),
                                to: dst.pod.clone(),
                                network: (*network).clone(),
                                port: port.port,
                                protocol: port.protocol,
                                family,
                                before: was.allowed,
                                after: is.allowed,
                                staged_before: was.staged_allowed,
                                staged_after: is.staged_allowed,
                                kind: ChangeKind::of(was.allowed, is.allowed),
                                policies: self.responsible(&was, &is),
                                admin_policies: admin_responsible(&was, &is),
                                from_interface: src.rules.name.clone(),
                                to_interface: dst.rules.name.clone(),
                                src: s_ip,
                                dst: d_ip,
                            });
                        }
                    }
                }
            }
        }
        out
    }

    /// The policies responsible for a flow's change (see the [module documentation](self)).
    fn responsible(&self, was: &FlowVerdict, is: &FlowVerdict) -> Vec<PolicyRef> {
        let mut out = BTreeSet::new();
        let sides = [(&was.egress, &is.egress), (&was.ingress, &is.ingress)];
        for staged in [false, true] {
            let flow_changed = if staged {
                was.staged_allowed != is.staged_allowed
            } else {
                was.allowed != is.allowed
            };
            if !flow_changed {
                continue;
            }
            for (old, new) in sides {
                let (old_view, new_view) = (view(old, staged), view(new, staged));
                if old_view.allowed == new_view.allowed {
                    continue;
                }
                let candidates: BTreeSet<&PolicyRef> =
                    old_view.policies.iter().chain(&new_view.policies).collect();
                for policy in candidates {
                    if contribution(old_view, policy) == contribution(new_view, policy) {
                        continue;
                    }
                    out.insert(policy.clone());
                    if staged {
                        for (side, replacers) in
                            [(old, &self.replacers_before), (new, &self.replacers_after)]
                        {
                            if replaced_on(side, policy) {
                                let key = (policy.key.namespace.clone(), policy.key.name.clone());
                                out.extend(replacers.get(&key).into_iter().flatten().cloned());
                            }
                        }
                    }
                }
            }
        }
        out.into_iter().collect()
    }
}

/// The admin policies responsible for a flow's change: on each side whose verdict changed (in
/// a view whose flow verdict changed), those whose rule decided it, or passed it on, before or
/// after, when that differs.
fn admin_responsible(was: &FlowVerdict, is: &FlowVerdict) -> Vec<AdminRef> {
    let mut out = BTreeSet::new();
    let sides = [(&was.egress, &is.egress), (&was.ingress, &is.ingress)];
    for staged in [false, true] {
        let flow_changed = if staged {
            was.staged_allowed != is.staged_allowed
        } else {
            was.allowed != is.allowed
        };
        if !flow_changed {
            continue;
        }
        for (old, new) in sides {
            let (old_view, new_view) = (view(old, staged), view(new, staged));
            if old_view.allowed == new_view.allowed
                || (old_view.tier_rule == new_view.tier_rule && old_view.passed == new_view.passed)
            {
                continue;
            }
            for side in [old_view, new_view] {
                let decided = side.tier_rule.iter().map(|d| &d.origin);
                for origin in decided.chain(&side.passed) {
                    out.insert(origin.policy.clone());
                }
            }
        }
    }
    out.into_iter().collect()
}

/// How a touched member's side (one direction of its interface) differs between the views.
#[derive(Debug, Clone, Copy)]
enum SideChange {
    /// Same rules, same addresses: no pair changes through this side.
    Same,
    /// The member's addresses moved: its peers see another address, so any pair may change.
    Moved,
    /// Other rules, same addresses: the pair changes only where [`side_allows`] differs for
    /// the peer's address; the index names the distinct (before, after) rules.
    Rules(usize),
}

/// For the touched members of one network, whether a pair with one touched end can change:
/// the untouched end's rules and addresses are the same in both views, so its side's verdict
/// is too, and the flow's verdict can change only where the touched end's side does. The
/// answer is a function of the touched side's (before, after) rules and the peer's address, so
/// members with equal rules (the replicas of a workload) share it: it is computed once per
/// distinct rules and peer, and only for the peers asked about.
struct TouchedSides<'m, 'a> {
    members: &'m [Member<'a>],
    ports: &'m [PortProto],
    /// Per member, per direction (egress, ingress); `Same` for untouched members (unused).
    sides: Vec<[SideChange; 2]>,
    /// The distinct (direction, before, after) rules of the `Rules` sides.
    distinct: Vec<(Direction, &'a DirectionRules, &'a DirectionRules)>,
    /// Per distinct rules, per peer member: whether some port and family changes.
    answers: Vec<Vec<Option<bool>>>,
}

impl<'m, 'a> TouchedSides<'m, 'a> {
    fn new(
        members: &'m [Member<'a>],
        counterpart: &[Option<&'m Member<'a>>],
        touched: &[usize],
        ports: &'m [PortProto],
    ) -> Self {
        let mut sides = vec![[SideChange::Same; 2]; members.len()];
        let mut index: HashMap<(Direction, &'a DirectionRules, &'a DirectionRules), usize> =
            HashMap::new();
        let mut distinct = Vec::new();
        for &t in touched {
            let (member, Some(old)) = (&members[t], counterpart[t]) else {
                continue;
            };
            let moved = [Family::Ipv4, Family::Ipv6]
                .into_iter()
                .any(|f| member.address(f) != old.address(f));
            for (slot, direction) in [Direction::Egress, Direction::Ingress]
                .into_iter()
                .enumerate()
            {
                let (before, after) = (
                    old.rules.direction(direction),
                    member.rules.direction(direction),
                );
                sides[t][slot] = if moved {
                    SideChange::Moved
                } else if before == after {
                    SideChange::Same
                } else {
                    let key = (direction, before, after);
                    SideChange::Rules(*index.entry(key).or_insert_with(|| {
                        distinct.push(key);
                        distinct.len() - 1
                    }))
                };
            }
        }
        let answers = vec![vec![None; members.len()]; distinct.len()];
        TouchedSides {
            members,
            ports,
            sides,
            distinct,
            answers,
        }
    }

    /// Whether a pair of touched member `t` (on its `direction` side) and untouched member
    /// `peer` may change its verdict; `false` only when it certainly does not.
    fn may_change(&mut self, t: usize, direction: Direction, peer: usize) -> bool {
        let slot = match direction {
            Direction::Egress => 0,
            Direction::Ingress => 1,
        };
        let g = match self.sides[t][slot] {
            SideChange::Same => return false,
            SideChange::Moved => return true,
            SideChange::Rules(g) => g,
        };
        if let Some(known) = self.answers[g][peer] {
            return known;
        }
        let (direction, before, after) = self.distinct[g];
        let peer_member = &self.members[peer];
        let changes = [Family::Ipv4, Family::Ipv6]
            .into_iter()
            .filter_map(|family| peer_member.address(family))
            .any(|ip| {
                self.ports.iter().any(|port| {
                    [false, true].into_iter().any(|staged| {
                        // Different pods (one is touched, the other not): never loopback.
                        let allows = |rules| {
                            side_allows(
                                direction,
                                rules,
                                staged,
                                ip,
                                port.protocol,
                                port.port,
                                false,
                            )
                        };
                        allows(before) != allows(after)
                    })
                })
            });
        self.answers[g][peer] = Some(changes);
        changes
    }
}

fn view(side: &SideVerdicts, staged: bool) -> &SideVerdict {
    if staged {
        &side.staged
    } else {
        &side.enforced
    }
}

/// A policy's contribution to one side in one view: whether it isolates the side, and
/// whether one of its rules matches the flow.
fn contribution(side: &SideVerdict, policy: &PolicyRef) -> (bool, bool) {
    (
        side.policies.contains(policy),
        side.matched.iter().any(|m| m.policy == *policy),
    )
}

/// Whether `policy` isolates `side` in the enforced view but was left out of its staged view
/// (replaced by a monitored policy).
fn replaced_on(side: &SideVerdicts, policy: &PolicyRef) -> bool {
    side.enforced.policies.contains(policy) && !side.staged.policies.contains(policy)
}

/// The ports `diff` probes when none is given: every (port, protocol) a rule of either view
/// names by number (both ends of a range), and every container port a pod of either view
/// declares (where named ports resolve, and what rules without ports open); `80/TCP` when
/// there is none. Sorted by port, then protocol (TCP, UDP, SCTP).
pub fn default_ports(base: &Inventory, changed: &Inventory) -> Vec<PortProto> {
    let mut ports: BTreeSet<(u16, Protocol)> = BTreeSet::new();
    let mut add = |port: u16, protocol: Protocol| {
        ports.insert((port, protocol));
    };
    for inventory in [base, changed] {
        for policy in &inventory.policies {
            let rules = policy
                .ingress
                .iter()
                .flatten()
                .chain(policy.egress.iter().flatten());
            for port in rules.flat_map(|r| &r.ports) {
                if let Some(PortRef::Number(n)) = port.port {
                    add(n, port.protocol);
                    if let Some(end) = port.end_port {
                        add(end, port.protocol);
                    }
                }
            }
        }
        for cp in inventory.pods.iter().flat_map(|p| &p.container_ports) {
            add(cp.port, cp.protocol);
        }
    }
    if ports.is_empty() {
        ports.insert((80, Protocol::Tcp));
    }
    ports
        .into_iter()
        .map(|(port, protocol)| PortProto { port, protocol })
        .collect()
}

/// Whether any change denies a flow that was allowed (what `--fail-on-deny` fails on).
pub fn denies_any(changes: &[Change]) -> bool {
    changes.iter().any(|c| c.before && !c.after)
}

/// Writes `{"changes": [...]}`, pretty-printed, then a newline.
pub fn write_json(changes: &[Change], out: &mut impl Write) -> io::Result<()> {
    #[derive(Serialize)]
    struct Document<'c> {
        changes: &'c [Change],
    }
    serde_json::to_writer_pretty(&mut *out, &Document { changes })?;
    out.write_all(b"\n")
}

/// The readable form: one group per (network, port), in the network's name and port order,
/// each change on a line (`kind  from -> to  family  enforced  staged  policies`), then a
/// count per kind.
pub fn write_table(changes: &[Change], out: &mut impl Write) -> io::Result<()> {
    let mut groups: BTreeMap<(String, u16, &'static str), Vec<&Change>> = BTreeMap::new();
    for change in changes {
        let key = (
            change.network.display_name(),
            change.port,
            change.protocol.as_str(),
        );
        groups.entry(key).or_default().push(change);
    }
    let verdict = |allowed: bool| if allowed { "allow" } else { "deny" };
    for ((network, port, protocol), group) in &groups {
        writeln!(out, "network {network}, {port}/{protocol}")?;
        let width = |f: &dyn Fn(&Change) -> usize| group.iter().map(|c| f(c)).max().unwrap_or(0);
        let from_w = width(&|c| c.from.to_string().len());
        let to_w = width(&|c| c.to.to_string().len());
        for c in group {
            // The admin policies (SPEC 8) after the namespaced ones, as `Kind/name`.
            let policies: Vec<String> = c
                .policies
                .iter()
                .map(|p| p.to_string())
                .chain(c.admin_policies.iter().map(ToString::to_string))
                .collect();
            writeln!(
                out,
                "  {:13} {:from_w$} -> {:to_w$}  {}  enforced {:>5} -> {:5}  staged {:>5} -> {:5}  {}",
                c.kind.as_str(),
                c.from.to_string(),
                c.to.to_string(),
                c.family.as_str(),
                verdict(c.before),
                verdict(c.after),
                verdict(c.staged_before),
                verdict(c.staged_after),
                policies.join(", "),
            )?;
        }
        writeln!(out)?;
    }
    let count = |kind: ChangeKind| changes.iter().filter(|c| c.kind == kind).count();
    if changes.is_empty() {
        writeln!(out, "no flow changes its verdict")
    } else {
        writeln!(
            out,
            "{} change(s): {} newly denied, {} newly allowed, {} in the staged view only",
            changes.len(),
            count(ChangeKind::NewlyDenied),
            count(ChangeKind::NewlyAllowed),
            count(ChangeKind::StagedView),
        )
    }
}
