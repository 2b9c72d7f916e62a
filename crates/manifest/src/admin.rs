//! ClusterNetworkPolicy (`policy.networking.k8s.io/v1alpha2`), AdminNetworkPolicy and
//! BaselineAdminNetworkPolicy (`v1alpha1`) to the engine's [`AdminPolicy`], and Node to its
//! [`Node`] (SPEC 8). What the upstream CRDs validate is checked here too, since manifests never
//! went through an API server.
//!
//! What is invalid, and what becomes of it:
//! - **What places the policy** (`metadata`, `spec.tier`, `spec.priority`, `spec.subject`, a
//!   BaselineAdminNetworkPolicy not named `default`): the policy cannot be evaluated anywhere
//!   sensible, so it is ignored (an error says so; a running agent keeps the last good version).
//! - **A rule** that cannot be implemented as written (an unknown action, a peer or port that
//!   cannot be read, too many peers or ports, a field combination the CRD refuses) **fails
//!   closed** as upstream says: an Allow (Accept) matches nothing; a Deny or Pass (or an
//!   unreadable action) denies everything it would have covered — its peers and ports where they
//!   could be read, every address and port where not. The rule keeps its place, so rule indexes
//!   stay those written (`explain` names them). A rule that fails closed because a field had the
//!   wrong type marks the object as read in its fail-closed form, so a running agent keeps the
//!   last good version instead ([`crate::set::merge`]), as for the namespaced policies.
//! - Counts above the CRD's maxima on rules, a rule name longer than 100 characters: errors;
//!   read as written (the name is dropped), since nothing is widened by it.

use std::net::IpAddr;

use ipnet::IpNet;
use netwarden_engine::{
    AdminAction, AdminKind, AdminPeer, AdminPolicy, AdminPort, AdminRule, Direction, Node,
    PodsSelector, PolicyScope, PortRange, Protocol, Tier,
};
use serde_json::Value;

use crate::ctx::{get, index, join, show, type_name, Ctx};
use crate::meta::read_meta;
use crate::pod::section;
use crate::policy::{
    read_policy_annotations, read_policy_for, read_selector, PolicyAnnotations, POLICY_FOR,
};
use crate::validate;

/// Longest rule name the CRDs accept.
const MAX_RULE_NAME: usize = 100;
/// Most CIDRs or domain names in one peer (every version).
const MAX_PEER_ITEMS: usize = 25;

/// Upper bounds of the CRD, per kind: (rules per direction, peers per rule, ports per rule).
fn limits(kind: AdminKind) -> (usize, usize, usize) {
    match kind {
        AdminKind::ClusterNetworkPolicy => (25, 25, 25),
        AdminKind::AdminNetworkPolicy | AdminKind::BaselineAdminNetworkPolicy => (100, 100, 100),
    }
}

/// Reads one admin policy: the policy, and whether a rule failed closed because a field had
/// the wrong type (see the module doc). `None` when it cannot be placed (reported).
pub(crate) fn read_admin_policy(cx: &mut Ctx<'_>, doc: &Value) -> Option<(AdminPolicy, bool)> {
    // The loader dispatches only the three admin kinds here.
    let kind = AdminKind::from_name(cx.kind).unwrap_or(AdminKind::BaselineAdminNetworkPolicy);
    let meta = read_meta(cx, doc, false)?;
    let mut placeable = true;
    if kind == AdminKind::BaselineAdminNetworkPolicy && meta.name != "default" {
        cx.error(
            "metadata.name",
            "a BaselineAdminNetworkPolicy must be named \"default\" (the cluster's one \
             baseline; the CRD refuses other names); policy ignored",
        );
        placeable = false;
    }
    let spec = match get(doc, "spec") {
        Some(spec @ Value::Object(_)) => spec,
        Some(other) => {
            cx.wrong_type("spec", "an object", other);
            return None;
        }
        None => {
            cx.error("spec", "missing spec; policy ignored");
            return None;
        }
    };
    let tier = match kind {
        AdminKind::ClusterNetworkPolicy => read_tier(cx, spec),
        AdminKind::AdminNetworkPolicy => Some(Tier::Admin),
        AdminKind::BaselineAdminNetworkPolicy => Some(Tier::Baseline),
    };
    let priority = match kind {
        AdminKind::BaselineAdminNetworkPolicy => Some(0),
        _ => read_priority(cx, spec),
    };
    let subject = read_subject(cx, spec);
    let scope = match meta.annotations.get(POLICY_FOR) {
        None => PolicyScope::Primary,
        found => PolicyScope::Networks(read_policy_for(cx, found, None)),
    };
    let PolicyAnnotations {
        mode,
        replaces,
        log_denies,
    } = read_policy_annotations(cx, &meta.annotations);
    let mut rules = Rules {
        kind,
        tier,
        wrong_type: false,
    };
    let ingress = rules.read(cx, spec, Direction::Ingress);
    let egress = rules.read(cx, spec, Direction::Egress);
    if !placeable {
        return None;
    }
    let policy = AdminPolicy {
        kind,
        name: meta.name,
        tier: tier?,
        priority: priority?,
        subject: subject?,
        ingress,
        egress,
        scope,
        mode,
        replaces,
        log_denies,
    };
    Some((policy, rules.wrong_type))
}

/// `spec.tier` of a ClusterNetworkPolicy.
fn read_tier(cx: &mut Ctx<'_>, spec: &Value) -> Option<Tier> {
    match get(spec, "tier") {
        Some(Value::String(s)) if s == "Admin" => Some(Tier::Admin),
        Some(Value::String(s)) if s == "Baseline" => Some(Tier::Baseline),
        Some(v @ Value::String(_)) => {
            let reason = format!(
                "expected \"Admin\" or \"Baseline\", found {}; policy ignored",
                show(v)
            );
            cx.error("spec.tier", reason);
            None
        }
        Some(other) => {
            cx.wrong_type("spec.tier", "\"Admin\" or \"Baseline\"", other);
            None
        }
        None => {
            cx.error(
                "spec.tier",
                "missing tier (Admin or Baseline); policy ignored",
            );
            None
        }
    }
}

/// `spec.priority`: an integer 0–1000, lower first.
fn read_priority(cx: &mut Ctx<'_>, spec: &Value) -> Option<u32> {
    let field = "spec.priority";
    match get(spec, "priority") {
        Some(Value::Number(n)) => match n.as_i64() {
            Some(p) if (0..=1000).contains(&p) => Some(p as u32),
            _ => {
                let reason =
                    format!("priority {n} is not an integer in range 0-1000; policy ignored");
                cx.error(field, reason);
                None
            }
        },
        Some(other) => {
            cx.wrong_type(field, "an integer 0-1000", other);
            None
        }
        None => {
            cx.error(field, "missing priority (0-1000); policy ignored");
            None
        }
    }
}

/// The one field of `v` among `allowed`, or `None` (reported at `field`) when there is not
/// exactly one. `known` are every field of the object's type across directions and versions:
/// one of them where not allowed is reported as such.
fn one_field<'v>(
    cx: &mut Ctx<'_>,
    v: &'v Value,
    field: &str,
    allowed: &[&'static str],
    known: &[&'static str],
    consequence: &str,
) -> Option<(&'static str, &'v Value)> {
    let mut ok = true;
    for key in known.iter().filter(|k| !allowed.contains(k)) {
        if get(v, key).is_some() {
            cx.error(
                &join(field, key),
                format!(
                    "not allowed here (expected one of {}){consequence}",
                    allowed.join(", ")
                ),
            );
            ok = false;
        }
    }
    let present: Vec<(&'static str, &Value)> = allowed
        .iter()
        .filter_map(|k| get(v, k).map(|value| (*k, value)))
        .collect();
    match present.as_slice() {
        [one] if ok => Some(*one),
        [_] => None,
        [] if !ok => None,
        [] => {
            cx.error(
                field,
                format!(
                    "needs exactly one of {}, found none{consequence}",
                    allowed.join(", ")
                ),
            );
            None
        }
        more => {
            let found: Vec<&str> = more.iter().map(|(k, _)| *k).collect();
            cx.error(
                field,
                format!(
                    "needs exactly one of {}, found {}{consequence}",
                    allowed.join(", "),
                    found.join(" and ")
                ),
            );
            None
        }
    }
}

/// `spec.subject`: exactly one of `namespaces` and `pods`.
fn read_subject(cx: &mut Ctx<'_>, spec: &Value) -> Option<PodsSelector> {
    let field = "spec.subject";
    let subject = match get(spec, "subject") {
        Some(s @ Value::Object(_)) => s,
        Some(other) => {
            cx.wrong_type(field, "an object", other);
            return None;
        }
        None => {
            cx.error(field, "missing subject; policy ignored");
            return None;
        }
    };
    let fields = ["namespaces", "pods"];
    let (key, value) = one_field(cx, subject, field, &fields, &fields, "; policy ignored")?;
    let selector = read_pods_peer(cx, key, value, &join(field, key));
    if selector.is_none() {
        cx.error(field, "the subject cannot be read; policy ignored");
    }
    selector
}

/// `namespaces` (a namespace selector) or `pods` (`namespaceSelector` and `podSelector`, both
/// required) as pods selected.
fn read_pods_peer(cx: &mut Ctx<'_>, key: &str, v: &Value, field: &str) -> Option<PodsSelector> {
    if key == "namespaces" {
        return read_selector(cx, v, field).map(PodsSelector::namespaces);
    }
    if !v.is_object() {
        cx.wrong_type(field, "an object", v);
        return None;
    }
    let selector = |cx: &mut Ctx<'_>, key: &str| match get(v, key) {
        Some(s) => read_selector(cx, s, &join(field, key)),
        None => {
            cx.error(&join(field, key), format!("missing {key}"));
            None
        }
    };
    let namespaces = selector(cx, "namespaceSelector");
    let pods = selector(cx, "podSelector");
    Some(PodsSelector {
        namespaces: namespaces?,
        pods: pods?,
    })
}

/// Reads the rules of a policy, one direction at a time.
struct Rules {
    kind: AdminKind,
    /// `None` when `spec.tier` cannot be read (the policy is ignored, its rules still checked).
    tier: Option<Tier>,
    /// A rule failed closed because a field had the wrong type.
    wrong_type: bool,
}

/// One rule as far as it could be read: `None` for each part that could not.
struct RuleParts {
    name: Option<String>,
    action: Option<AdminAction>,
    peers: Option<Vec<AdminPeer>>,
    /// `Some(None)`: no ports (every port and protocol).
    ports: Option<Option<Vec<AdminPort>>>,
    /// The parts read, but they do not go together (a named port with a networks peer,
    /// domainNames in a Deny): the ports or peers in question are widened when failing closed.
    conflict: bool,
    /// Errors about the name alone (which only drop the name).
    name_errors: usize,
}

impl Rules {
    fn read(&mut self, cx: &mut Ctx<'_>, spec: &Value, direction: Direction) -> Vec<AdminRule> {
        let key = direction.as_str();
        let field = join("spec", key);
        let list = match get(spec, key) {
            None => return Vec::new(),
            Some(Value::Array(list)) => list,
            Some(other) => {
                // Which rules were meant is unknown: the whole direction fails closed.
                cx.error(
                    &field,
                    format!(
                        "expected a list, found {}: its rules cannot be read, so the policy \
                         denies everything in {key} (fail closed)",
                        type_name(other)
                    ),
                );
                self.wrong_type = true;
                return vec![deny_all(None)];
            }
        };
        let (max_rules, _, _) = limits(self.kind);
        if list.len() > max_rules {
            cx.error(
                &field,
                format!(
                    "{} rules: the CRD allows at most {max_rules}; read as written",
                    list.len()
                ),
            );
        }
        let mut out = Vec::with_capacity(list.len());
        for (i, rule) in list.iter().enumerate() {
            let rbase = index(&field, i);
            let first_problem = cx.problems.len();
            let errors = cx.errors;
            // A wrong type inside one rule fails that rule closed, not the whole policy.
            let rejected = std::mem::replace(&mut cx.rejected, false);
            let parts = self.read_rule(cx, rule, &rbase, direction);
            let wrong_type = std::mem::replace(&mut cx.rejected, rejected);
            if wrong_type {
                for p in &mut cx.problems[first_problem..] {
                    if let Some(reason) = p.reason.strip_suffix("; object ignored") {
                        p.reason = reason.to_string();
                    }
                }
                self.wrong_type = true;
            }
            let broken = wrong_type || cx.errors > errors + parts.name_errors || parts.conflict;
            out.push(fail_closed(cx, &rbase, parts, broken));
        }
        out
    }

    fn read_rule(
        &self,
        cx: &mut Ctx<'_>,
        rule: &Value,
        rbase: &str,
        direction: Direction,
    ) -> RuleParts {
        let mut parts = RuleParts {
            name: None,
            action: None,
            peers: None,
            ports: None,
            conflict: false,
            name_errors: 0,
        };
        if !rule.is_object() {
            cx.wrong_type(rbase, "an object", rule);
            return parts;
        }
        let errors = cx.errors;
        if let Some(name) = cx.str(rule, rbase, "name") {
            if name.chars().count() > MAX_RULE_NAME {
                cx.error(
                    &join(rbase, "name"),
                    format!("longer than {MAX_RULE_NAME} characters; name ignored"),
                );
            } else if !name.is_empty() {
                parts.name = Some(name.to_string());
            }
        }
        // A name the CRD refuses is only dropped: that alone does not break the rule.
        parts.name_errors = cx.errors - errors;
        parts.action = self.read_action(cx, rule, rbase);
        let peers_key = match direction {
            Direction::Ingress => "from",
            Direction::Egress => "to",
        };
        parts.peers = self.read_peers(cx, rule, &join(rbase, peers_key), peers_key, direction);
        parts.ports = match self.kind {
            AdminKind::ClusterNetworkPolicy => self.read_protocols(cx, rule, rbase),
            _ => self.read_ports(cx, rule, rbase),
        };
        let peers = parts.peers.as_deref().unwrap_or_default();
        let named = matches!(&parts.ports, Some(Some(ports))
            if ports.iter().any(|p| matches!(p, AdminPort::Named(_))));
        let unnamed_peer = peers.iter().any(|p| {
            matches!(
                p,
                AdminPeer::Networks(_) | AdminPeer::Nodes(_) | AdminPeer::DomainNames(_)
            )
        });
        if named && unnamed_peer {
            cx.error(
                rbase,
                "named ports cannot be used with networks, nodes or domainNames peers: they \
                 have no named ports (the CRD refuses this rule)",
            );
            parts.conflict = true;
        }
        if let Some(i) = peers
            .iter()
            .position(|p| matches!(p, AdminPeer::DomainNames(_)))
        {
            let field = join(&index(&join(rbase, peers_key), i), "domainNames");
            if parts.action.is_some_and(|a| a != AdminAction::Allow) {
                cx.error(
                    &field,
                    format!(
                        "domainNames are only allowed in {} rules",
                        allow_word(self.kind)
                    ),
                );
                parts.conflict = true;
            } else {
                cx.warn(
                    &field,
                    "domainNames match nothing until netwarden resolves domain names: this \
                     peer allows nothing yet (upstream's fail-closed rule)",
                );
            }
        }
        parts
    }

    fn read_action(&self, cx: &mut Ctx<'_>, rule: &Value, rbase: &str) -> Option<AdminAction> {
        let field = join(rbase, "action");
        let (allow, expected) = match self.kind {
            AdminKind::ClusterNetworkPolicy => ("Accept", "Accept, Deny or Pass"),
            AdminKind::AdminNetworkPolicy => ("Allow", "Allow, Deny or Pass"),
            AdminKind::BaselineAdminNetworkPolicy => ("Allow", "Allow or Deny"),
        };
        let written = match get(rule, "action") {
            Some(Value::String(s)) => s.as_str(),
            Some(other) => {
                cx.wrong_type(&field, "a string", other);
                return None;
            }
            None => {
                cx.error(&field, format!("missing action ({expected})"));
                return None;
            }
        };
        let action = match written {
            a if a == allow => AdminAction::Allow,
            "Deny" => AdminAction::Deny,
            "Pass" if self.kind != AdminKind::BaselineAdminNetworkPolicy => AdminAction::Pass,
            other => {
                cx.error(
                    &field,
                    format!(
                        "expected {expected}, found \"{}\"",
                        validate::shorten(other)
                    ),
                );
                return None;
            }
        };
        if action == AdminAction::Pass && self.tier == Some(Tier::Baseline) {
            cx.error(
                &field,
                "Pass is only allowed in the Admin tier (there is no later tier of the same \
                 kind to pass to)",
            );
        }
        Some(action)
    }

    /// `from` / `to`: at least one peer, at most the CRD's maximum; every peer must be read.
    fn read_peers(
        &self,
        cx: &mut Ctx<'_>,
        rule: &Value,
        field: &str,
        key: &str,
        direction: Direction,
    ) -> Option<Vec<AdminPeer>> {
        let list = match get(rule, key) {
            Some(Value::Array(list)) => list,
            Some(other) => {
                cx.wrong_type(field, "a list", other);
                return None;
            }
            None => {
                cx.error(field, "missing: a rule needs at least one peer");
                return None;
            }
        };
        let (_, max_peers, _) = limits(self.kind);
        if list.is_empty() {
            cx.error(field, "empty: a rule needs at least one peer");
            return None;
        }
        if list.len() > max_peers {
            cx.error(
                field,
                format!("{} peers: the CRD allows at most {max_peers}", list.len()),
            );
        }
        let peers: Vec<Option<AdminPeer>> = list
            .iter()
            .enumerate()
            .map(|(i, v)| self.read_peer(cx, v, &index(field, i), direction))
            .collect();
        if list.len() > max_peers {
            return None;
        }
        peers.into_iter().collect()
    }

    fn read_peer(
        &self,
        cx: &mut Ctx<'_>,
        v: &Value,
        field: &str,
        direction: Direction,
    ) -> Option<AdminPeer> {
        if !v.is_object() {
            cx.wrong_type(field, "an object", v);
            return None;
        }
        const ALL: [&str; 5] = ["namespaces", "pods", "nodes", "networks", "domainNames"];
        let allowed: &[&'static str] = match (direction, self.kind) {
            (Direction::Ingress, _) => &ALL[..2],
            (Direction::Egress, AdminKind::BaselineAdminNetworkPolicy) => &ALL[..4],
            (Direction::Egress, _) => &ALL,
        };
        let (key, value) = one_field(cx, v, field, allowed, &ALL, "")?;
        let field = join(field, key);
        match key {
            "namespaces" | "pods" => read_pods_peer(cx, key, value, &field).map(AdminPeer::Pods),
            "nodes" => read_selector(cx, value, &field).map(AdminPeer::Nodes),
            "networks" => read_networks(cx, value, &field).map(AdminPeer::Networks),
            _ => read_domain_names(cx, value, &field).map(AdminPeer::DomainNames),
        }
    }

    /// v1alpha2 `protocols`: `None` when unreadable; `Some(None)` when absent.
    fn read_protocols(
        &self,
        cx: &mut Ctx<'_>,
        rule: &Value,
        rbase: &str,
    ) -> Option<Option<Vec<AdminPort>>> {
        let field = join(rbase, "protocols");
        let list = self.port_list(cx, rule, &field, "protocols")?;
        let Some(list) = list else {
            return Some(None);
        };
        let mut out = Vec::new();
        let mut ok = true;
        for (i, entry) in list.iter().enumerate() {
            let efield = index(&field, i);
            if !entry.is_object() {
                cx.wrong_type(&efield, "an object", entry);
                ok = false;
                continue;
            }
            let fields = ["tcp", "udp", "sctp", "destinationNamedPort"];
            let Some((key, value)) = one_field(cx, entry, &efield, &fields, &fields, "") else {
                ok = false;
                continue;
            };
            let pfield = join(&efield, key);
            let port = match key {
                "destinationNamedPort" => read_named_port(cx, value, &pfield),
                _ => {
                    let protocol = match key {
                        "tcp" => Protocol::Tcp,
                        "udp" => Protocol::Udp,
                        _ => Protocol::Sctp,
                    };
                    read_destination_port(cx, value, &pfield, protocol)
                }
            };
            match port {
                Some(port) => out.push(port),
                None => ok = false,
            }
        }
        ok.then_some(Some(out))
    }

    /// v1alpha1 `ports`: `None` when unreadable; `Some(None)` when absent.
    fn read_ports(
        &self,
        cx: &mut Ctx<'_>,
        rule: &Value,
        rbase: &str,
    ) -> Option<Option<Vec<AdminPort>>> {
        let field = join(rbase, "ports");
        let list = self.port_list(cx, rule, &field, "ports")?;
        let Some(list) = list else {
            return Some(None);
        };
        let mut out = Vec::new();
        let mut ok = true;
        for (i, entry) in list.iter().enumerate() {
            let efield = index(&field, i);
            if !entry.is_object() {
                cx.wrong_type(&efield, "an object", entry);
                ok = false;
                continue;
            }
            let fields = ["portNumber", "portRange", "namedPort"];
            let Some((key, value)) = one_field(cx, entry, &efield, &fields, &fields, "") else {
                ok = false;
                continue;
            };
            let pfield = join(&efield, key);
            let port = match key {
                "namedPort" => read_named_port(cx, value, &pfield),
                _ if !value.is_object() => {
                    cx.wrong_type(&pfield, "an object", value);
                    None
                }
                "portNumber" => {
                    let protocol = cx.protocol(value, &pfield, "protocol");
                    let port = required_port(cx, value, &pfield, "port");
                    protocol.zip(port).map(|(protocol, port)| {
                        AdminPort::Numbers(PortRange {
                            protocol,
                            ports: Some((port, port)),
                        })
                    })
                }
                _ => {
                    let protocol = cx.protocol(value, &pfield, "protocol");
                    let range = read_range(cx, value, &pfield);
                    protocol.zip(range).map(|(protocol, range)| {
                        AdminPort::Numbers(PortRange {
                            protocol,
                            ports: Some(range),
                        })
                    })
                }
            };
            match port {
                Some(port) => out.push(port),
                None => ok = false,
            }
        }
        ok.then_some(Some(out))
    }

    /// The port list of a rule: `Some(None)` when absent, `None` when unreadable (empty,
    /// too long, not a list).
    fn port_list<'v>(
        &self,
        cx: &mut Ctx<'_>,
        rule: &'v Value,
        field: &str,
        key: &str,
    ) -> Option<Option<&'v Vec<Value>>> {
        let (_, _, max_ports) = limits(self.kind);
        match get(rule, key) {
            None => Some(None),
            Some(Value::Array(list)) if list.is_empty() => {
                cx.error(
                    field,
                    format!("empty: leave {key} out to match every port (the CRD needs at least one entry)"),
                );
                None
            }
            Some(Value::Array(list)) if list.len() > max_ports => {
                cx.error(
                    field,
                    format!("{} entries: the CRD allows at most {max_ports}", list.len()),
                );
                None
            }
            Some(Value::Array(list)) => Some(Some(list)),
            Some(other) => {
                cx.wrong_type(field, "a list", other);
                None
            }
        }
    }
}

/// The fail-closed form of a rule (see the module doc), or the rule itself when whole.
fn fail_closed(cx: &mut Ctx<'_>, rbase: &str, parts: RuleParts, broken: bool) -> AdminRule {
    let RuleParts {
        name,
        action,
        peers,
        ports,
        conflict,
        ..
    } = parts;
    match (broken, action, peers, ports) {
        (false, Some(action), Some(peers), Some(ports)) => AdminRule {
            name,
            action,
            peers,
            ports,
        },
        (_, Some(AdminAction::Allow), _, _) => {
            cx.error(
                rbase,
                "the rule cannot be implemented as written: it fails closed, matching nothing",
            );
            AdminRule {
                name,
                action: AdminAction::Allow,
                // No address: the rule keeps its index but matches nothing.
                peers: vec![AdminPeer::Networks(Vec::new())],
                ports: None,
            }
        }
        (_, _, peers, ports) => {
            cx.error(
                rbase,
                "the rule cannot be implemented as written: it fails closed, denying all it \
                 could cover (every peer and port that could not be read)",
            );
            // Domain names resolve to unknown addresses: a Deny of them denies every address.
            let peers = peers.filter(|p| !p.iter().any(|p| matches!(p, AdminPeer::DomainNames(_))));
            // A conflict of named ports with address peers: the names cannot be resolved there.
            let ports = ports.filter(|_| !conflict);
            AdminRule {
                name,
                action: AdminAction::Deny,
                peers: peers.unwrap_or_else(every_address),
                ports: ports.unwrap_or(None),
            }
        }
    }
}

/// A rule that denies every address, port and protocol.
fn deny_all(name: Option<String>) -> AdminRule {
    AdminRule {
        name,
        action: AdminAction::Deny,
        peers: every_address(),
        ports: None,
    }
}

fn every_address() -> Vec<AdminPeer> {
    vec![AdminPeer::Networks(vec![
        "0.0.0.0/0".parse().expect("valid CIDR"),
        "::/0".parse().expect("valid CIDR"),
    ])]
}

fn allow_word(kind: AdminKind) -> &'static str {
    match kind {
        AdminKind::ClusterNetworkPolicy => "Accept",
        _ => "Allow",
    }
}

/// `networks`: 1–25 CIDRs, IPv4 or IPv6. Host bits are cleared with a warning.
fn read_networks(cx: &mut Ctx<'_>, v: &Value, field: &str) -> Option<Vec<IpNet>> {
    let list = bounded_list(cx, v, field, "CIDRs")?;
    let mut out = Vec::new();
    let mut ok = true;
    for (i, item) in list.iter().enumerate() {
        let f = index(field, i);
        let Value::String(s) = item else {
            cx.wrong_type(&f, "a CIDR string", item);
            ok = false;
            continue;
        };
        match s.parse::<IpNet>() {
            Ok(net) => {
                let masked = net.trunc();
                if masked != net {
                    cx.warn(&f, format!("{net} has host bits set; read as {masked}"));
                }
                out.push(masked);
            }
            Err(_) => {
                cx.error(&f, format!("invalid CIDR \"{}\"", validate::shorten(s)));
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

/// `domainNames`: 1–25 names, each `[*.]label.label[.]` as the CRD's pattern says.
fn read_domain_names(cx: &mut Ctx<'_>, v: &Value, field: &str) -> Option<Vec<String>> {
    let list = bounded_list(cx, v, field, "domain names")?;
    let mut out = Vec::new();
    let mut ok = true;
    for (i, item) in list.iter().enumerate() {
        let f = index(field, i);
        let Value::String(s) = item else {
            cx.wrong_type(&f, "a string", item);
            ok = false;
            continue;
        };
        if domain_name(s) {
            out.push(s.clone());
        } else {
            cx.error(
                &f,
                format!(
                    "invalid domain name \"{}\" (expected e.g. example.com or *.example.com)",
                    validate::shorten(s)
                ),
            );
            ok = false;
        }
    }
    ok.then_some(out)
}

/// A list of 1 to [`MAX_PEER_ITEMS`] items.
fn bounded_list<'v>(
    cx: &mut Ctx<'_>,
    v: &'v Value,
    field: &str,
    what: &str,
) -> Option<&'v Vec<Value>> {
    let Value::Array(list) = v else {
        cx.wrong_type(field, "a list", v);
        return None;
    };
    if list.is_empty() {
        cx.error(
            field,
            format!("empty: the CRD needs at least one of its {what}"),
        );
        return None;
    }
    if list.len() > MAX_PEER_ITEMS {
        cx.error(
            field,
            format!(
                "{} {what}: the CRD allows at most {MAX_PEER_ITEMS}",
                list.len()
            ),
        );
        return None;
    }
    Some(list)
}

/// The CRD's pattern for a domain name: an optional `*.` prefix, then at least two labels of
/// letters, digits, `-` and `_` that start and end with a letter or digit, and an optional
/// final dot.
fn domain_name(s: &str) -> bool {
    let s = s.strip_prefix("*.").unwrap_or(s);
    let s = s.strip_suffix('.').unwrap_or(s);
    let labels: Vec<&str> = s.split('.').collect();
    labels.len() >= 2
        && labels.iter().all(|label| {
            let b = label.as_bytes();
            let edge = |c: &u8| c.is_ascii_alphanumeric();
            b.first().is_some_and(edge)
                && b.last().is_some_and(edge)
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_')
        })
}

/// `destinationNamedPort` / `namedPort`: a container port name.
fn read_named_port(cx: &mut Ctx<'_>, v: &Value, field: &str) -> Option<AdminPort> {
    let Value::String(name) = v else {
        cx.wrong_type(field, "a string", v);
        return None;
    };
    match validate::port_name(name) {
        Ok(()) => Some(AdminPort::Named(name.clone())),
        Err(e) => {
            cx.error(field, e);
            None
        }
    }
}

/// v1alpha2 `tcp` / `udp` / `sctp`: `destinationPort` (required by the CRD) with exactly one of
/// `number` and `range`.
fn read_destination_port(
    cx: &mut Ctx<'_>,
    v: &Value,
    field: &str,
    protocol: Protocol,
) -> Option<AdminPort> {
    if !v.is_object() {
        cx.wrong_type(field, "an object", v);
        return None;
    }
    let dfield = join(field, "destinationPort");
    let Some(port) = get(v, "destinationPort") else {
        cx.error(
            &dfield,
            "missing (the CRD needs destinationPort; leave protocols out to match every port)",
        );
        return None;
    };
    if !port.is_object() {
        cx.wrong_type(&dfield, "an object", port);
        return None;
    }
    let fields = ["number", "range"];
    let (key, value) = one_field(cx, port, &dfield, &fields, &fields, "")?;
    let pfield = join(&dfield, key);
    let ports = match key {
        "number" => cx.port_number(&pfield, value).map(|p| (p, p)),
        _ if !value.is_object() => {
            cx.wrong_type(&pfield, "an object", value);
            None
        }
        _ => read_range(cx, value, &pfield),
    }?;
    Some(AdminPort::Numbers(PortRange {
        protocol,
        ports: Some(ports),
    }))
}

/// `start` and `end`, both 1–65535, start below end.
fn read_range(cx: &mut Ctx<'_>, v: &Value, field: &str) -> Option<(u16, u16)> {
    let start = required_port(cx, v, field, "start");
    let end = required_port(cx, v, field, "end");
    let (start, end) = (start?, end?);
    if start >= end {
        cx.error(
            &join(field, "end"),
            format!("end {end} must be greater than start {start}"),
        );
        return None;
    }
    Some((start, end))
}

fn required_port(cx: &mut Ctx<'_>, v: &Value, base: &str, key: &str) -> Option<u16> {
    let field = join(base, key);
    match get(v, key) {
        Some(n) => cx.port_number(&field, n),
        None => {
            cx.error(&field, format!("missing {key}"));
            None
        }
    }
}

/// A Node: its labels and the `status.addresses` that are IP addresses (a `Hostname` entry is
/// not; an `InternalIP` or `ExternalIP` that does not parse is reported and skipped).
pub(crate) fn read_node(cx: &mut Ctx<'_>, doc: &Value) -> Option<Node> {
    let meta = read_meta(cx, doc, false)?;
    let status = section(cx, doc, "", "status");
    let mut addresses: Vec<IpAddr> = Vec::new();
    let list = cx
        .array(status, "status", "addresses")
        .map_or(&[][..], Vec::as_slice);
    for (i, entry) in list.iter().enumerate() {
        let field = index("status.addresses", i);
        if !entry.is_object() {
            cx.wrong_type(&field, "an object", entry);
            continue;
        }
        let kind = cx.str(entry, &field, "type").unwrap_or_default();
        let Some(address) = cx.str(entry, &field, "address") else {
            continue;
        };
        match address.trim().parse::<IpAddr>() {
            Ok(ip) if !addresses.contains(&ip) => addresses.push(ip),
            Ok(_) => {}
            Err(_) if matches!(kind, "InternalIP" | "ExternalIP") => cx.error(
                &join(&field, "address"),
                format!(
                    "{kind} \"{}\" is not an IP address; ignored",
                    validate::shorten(address)
                ),
            ),
            Err(_) => {}
        }
    }
    Some(Node {
        name: meta.name,
        labels: meta.labels,
        addresses,
    })
}

#[cfg(test)]
mod tests {
    use netwarden_engine::{LabelSelector, Labels, Mode, NetworkId};

    use super::*;
    use crate::{parse_str, Inventory, LoadOptions, Severity};

    fn load(text: &str) -> Inventory {
        parse_str("t.yaml", text, &LoadOptions::default())
    }

    /// (kind, object, field, reason) of every problem of `severity`.
    fn problems(inv: &Inventory, severity: Severity) -> Vec<(String, String, String, String)> {
        inv.problems
            .iter()
            .filter(|p| p.severity == severity)
            .map(|p| {
                (
                    p.kind.clone(),
                    p.object.clone(),
                    p.field.clone(),
                    p.reason.clone(),
                )
            })
            .collect()
    }

    /// Whether an error on `field` of `object` has a reason containing `reason`.
    fn has_error(inv: &Inventory, object: &str, field: &str, reason: &str) -> bool {
        problems(inv, Severity::Error)
            .iter()
            .any(|(_, o, f, r)| o == object && f == field && r.contains(reason))
    }

    fn sel(labels: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Labels>(),
            match_expressions: Vec::new(),
        }
    }

    fn admin<'a>(inv: &'a Inventory, name: &str) -> &'a AdminPolicy {
        inv.admin_policies
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no admin policy {name}: {:#?}", inv.problems))
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn numbers(protocol: Protocol, lo: u16, hi: u16) -> AdminPort {
        AdminPort::Numbers(PortRange {
            protocol,
            ports: Some((lo, hi)),
        })
    }

    fn deny_everything(name: Option<&str>) -> AdminRule {
        deny_all(name.map(str::to_string))
    }

    /// A Deny of every pod (what a rule with peer `namespaces: {}` and an unreadable action
    /// becomes: it denies what it covers).
    fn deny_all_namespaces(name: Option<&str>) -> AdminRule {
        AdminRule {
            name: name.map(str::to_string),
            action: AdminAction::Deny,
            peers: vec![AdminPeer::Pods(PodsSelector::namespaces(
                LabelSelector::everything(),
            ))],
            ports: None,
        }
    }

    fn matches_nothing(name: Option<&str>) -> AdminRule {
        AdminRule {
            name: name.map(str::to_string),
            action: AdminAction::Allow,
            peers: vec![AdminPeer::Networks(Vec::new())],
            ports: None,
        }
    }

    #[test]
    fn cluster_network_policy_every_field() {
        let inv = load(
            r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata:
  name: cnp.example
  annotations:
    k8s.v1.cni.cncf.io/policy-for: "net/storage, net/storage,other/backup"
    netwarden.io/mode: monitor
    netwarden.io/replaces: older
    netwarden.io/log: "true"
spec:
  tier: Admin
  priority: 1000
  subject:
    namespaces: {matchLabels: {team: a}}
  ingress:
  - name: from-monitoring
    action: Accept
    from:
    - namespaces: {matchLabels: {role: monitoring}}
    - pods:
        namespaceSelector: {}
        podSelector: {matchLabels: {app: probe}}
    protocols:
    - tcp: {destinationPort: {number: 9090}}
    - udp: {destinationPort: {range: {start: 1000, end: 2000}}}
    - sctp: {destinationPort: {number: 7}}
    - destinationNamedPort: metrics
  egress:
  - action: Deny
    to:
    - networks: ["10.0.0.0/8", "fd00::/8"]
    - nodes: {matchLabels: {role: control-plane}}
  - action: Pass
    to:
    - namespaces: {}
"#,
        );
        assert!(inv.problems.is_empty(), "{:#?}", inv.problems);
        let p = admin(&inv, "cnp.example");
        let expected = AdminPolicy {
            kind: AdminKind::ClusterNetworkPolicy,
            name: "cnp.example".into(),
            tier: Tier::Admin,
            priority: 1000,
            subject: PodsSelector::namespaces(sel(&[("team", "a")])),
            ingress: vec![AdminRule {
                name: Some("from-monitoring".into()),
                action: AdminAction::Allow,
                peers: vec![
                    AdminPeer::Pods(PodsSelector::namespaces(sel(&[("role", "monitoring")]))),
                    AdminPeer::Pods(PodsSelector {
                        namespaces: LabelSelector::everything(),
                        pods: sel(&[("app", "probe")]),
                    }),
                ],
                ports: Some(vec![
                    numbers(Protocol::Tcp, 9090, 9090),
                    numbers(Protocol::Udp, 1000, 2000),
                    numbers(Protocol::Sctp, 7, 7),
                    AdminPort::Named("metrics".into()),
                ]),
            }],
            egress: vec![
                AdminRule {
                    name: None,
                    action: AdminAction::Deny,
                    peers: vec![
                        AdminPeer::Networks(vec![net("10.0.0.0/8"), net("fd00::/8")]),
                        AdminPeer::Nodes(sel(&[("role", "control-plane")])),
                    ],
                    ports: None,
                },
                AdminRule {
                    name: None,
                    action: AdminAction::Pass,
                    peers: vec![AdminPeer::Pods(PodsSelector::namespaces(
                        LabelSelector::everything(),
                    ))],
                    ports: None,
                },
            ],
            scope: PolicyScope::Networks(vec![
                NetworkId::nad("net", "storage"),
                NetworkId::nad("other", "backup"),
            ]),
            mode: Mode::Monitor,
            replaces: Some("older".into()),
            log_denies: true,
        };
        assert_eq!(p, &expected);
        // A Baseline ClusterNetworkPolicy is read into the Baseline tier.
        let inv = load(
            r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: base}
spec:
  tier: Baseline
  priority: 0
  subject: {pods: {namespaceSelector: {matchLabels: {a: b}}, podSelector: {}}}
  ingress: [{action: Deny, from: [{namespaces: {}}]}]
"#,
        );
        assert!(inv.problems.is_empty(), "{:#?}", inv.problems);
        let p = admin(&inv, "base");
        assert_eq!(
            (p.tier, p.priority, &p.scope),
            (Tier::Baseline, 0, &PolicyScope::Primary)
        );
        assert_eq!(p.subject.namespaces, sel(&[("a", "b")]));
    }

    #[test]
    fn admin_network_policy_every_field() {
        let inv = load(
            r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: anp}
spec:
  priority: 3
  subject:
    pods: {namespaceSelector: {matchLabels: {team: a}}, podSelector: {matchLabels: {app: web}}}
  ingress:
  - name: deny-b
    action: Deny
    from: [{namespaces: {matchLabels: {team: b}}}]
    ports:
    - portNumber: {port: 80}
    - portRange: {protocol: UDP, start: 5000, end: 5010}
    - namedPort: http
  - action: Pass
    from: [{pods: {namespaceSelector: {}, podSelector: {}}}]
  egress:
  - action: Allow
    to:
    - networks: [192.168.1.0/24]
    - nodes: {}
    - domainNames: ["*.example.com", "example.org."]
"#,
        );
        let p = admin(&inv, "anp");
        assert_eq!(
            (p.kind, p.tier, p.priority),
            (AdminKind::AdminNetworkPolicy, Tier::Admin, 3)
        );
        assert_eq!(
            p.subject,
            PodsSelector {
                namespaces: sel(&[("team", "a")]),
                pods: sel(&[("app", "web")]),
            }
        );
        assert_eq!(
            p.ingress[0],
            AdminRule {
                name: Some("deny-b".into()),
                action: AdminAction::Deny,
                peers: vec![AdminPeer::Pods(PodsSelector::namespaces(sel(&[(
                    "team", "b"
                )])))],
                ports: Some(vec![
                    numbers(Protocol::Tcp, 80, 80),
                    numbers(Protocol::Udp, 5000, 5010),
                    AdminPort::Named("http".into()),
                ]),
            }
        );
        assert_eq!(p.ingress[1].action, AdminAction::Pass);
        assert_eq!(
            p.egress[0].peers,
            vec![
                AdminPeer::Networks(vec![net("192.168.1.0/24")]),
                AdminPeer::Nodes(LabelSelector::everything()),
                AdminPeer::DomainNames(vec!["*.example.com".into(), "example.org.".into()]),
            ]
        );
        assert_eq!(
            (p.mode, p.scope.clone()),
            (Mode::Enforce, PolicyScope::Primary)
        );
        // Valid, but domain names match nothing yet: a warning says so, nothing else.
        assert!(
            problems(&inv, Severity::Error).is_empty(),
            "{:#?}",
            inv.problems
        );
        let warnings = problems(&inv, Severity::Warning);
        assert_eq!(warnings.len(), 1, "{warnings:#?}");
        assert_eq!(warnings[0].2, "spec.egress[0].to[2].domainNames");
        assert!(warnings[0].3.contains("match nothing"), "{warnings:?}");
    }

    #[test]
    fn baseline_admin_network_policy() {
        let inv = load(
            r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata: {name: default}
spec:
  subject: {namespaces: {}}
  ingress: [{action: Deny, from: [{namespaces: {}}]}]
  egress:
  - {action: Allow, to: [{networks: [0.0.0.0/0]}]}
  - {name: pass, action: Pass, to: [{nodes: {}}], ports: [{portNumber: {port: 22}}]}
---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata: {name: other}
spec:
  subject: {namespaces: {}}
"#,
        );
        let p = admin(&inv, "default");
        assert_eq!((p.tier, p.priority), (Tier::Baseline, 0));
        assert_eq!(p.ingress[0].action, AdminAction::Deny);
        assert_eq!(p.egress[0].action, AdminAction::Allow);
        // Pass is not a Baseline action: the rule fails closed, denying what it covers.
        assert!(has_error(
            &inv,
            "default",
            "spec.egress[1].action",
            "expected Allow or Deny"
        ));
        assert!(has_error(&inv, "default", "spec.egress[1]", "fails closed"));
        assert_eq!(
            p.egress[1],
            AdminRule {
                name: Some("pass".into()),
                action: AdminAction::Deny,
                peers: vec![AdminPeer::Nodes(LabelSelector::everything())],
                ports: Some(vec![numbers(Protocol::Tcp, 22, 22)]),
            }
        );
        // The singleton: another name is an error and the object is not loaded.
        assert!(has_error(
            &inv,
            "other",
            "metadata.name",
            "must be named \"default\""
        ));
        assert_eq!(inv.admin_policies.len(), 1);
    }

    #[test]
    fn nodes_keep_their_labels_and_ip_addresses() {
        let inv = load(
            r#"
apiVersion: v1
kind: Node
metadata: {name: node-1.example.com, labels: {role: worker}}
status:
  addresses:
  - {type: Hostname, address: node-1}
  - {type: InternalIP, address: 10.1.0.1}
  - {type: InternalIP, address: "fd00::1"}
  - {type: ExternalIP, address: 10.1.0.1}
  - {type: ExternalIP, address: not-an-ip}
"#,
        );
        assert_eq!(
            inv.nodes,
            vec![Node {
                name: "node-1.example.com".into(),
                labels: Labels::from([("role".to_string(), "worker".to_string())]),
                addresses: vec!["10.1.0.1".parse().unwrap(), "fd00::1".parse().unwrap()],
            }]
        );
        assert!(has_error(
            &inv,
            "node-1.example.com",
            "status.addresses[4].address",
            "not an IP address"
        ));
    }

    /// Errors that leave the policy out (it cannot be placed), each naming object and field.
    #[test]
    fn what_places_a_policy_must_be_valid() {
        let cases = [
            ("subject: {namespaces: {}, pods: {namespaceSelector: {}, podSelector: {}}}\n  priority: 1", "spec.subject", "found namespaces and pods"),
            ("subject: {}\n  priority: 1", "spec.subject", "found none"),
            ("priority: 1", "spec.subject", "missing subject"),
            ("subject: {namespaces: {}}\n  priority: 1001", "spec.priority", "not an integer in range 0-1000"),
            ("subject: {namespaces: {}}\n  priority: -1", "spec.priority", "not an integer in range 0-1000"),
            ("subject: {namespaces: {}}", "spec.priority", "missing priority"),
            ("subject: {pods: {podSelector: {}}}\n  priority: 1", "spec.subject.pods.namespaceSelector", "missing namespaceSelector"),
            ("subject: {namespaces: {matchExpressions: [{key: a, operator: Is}]}}\n  priority: 1", "spec.subject.namespaces.matchExpressions[0].operator", "unknown operator"),
        ];
        for (spec, field, reason) in cases {
            let text = format!(
                "apiVersion: policy.networking.k8s.io/v1alpha1\nkind: AdminNetworkPolicy\n\
                 metadata: {{name: p}}\nspec:\n  {spec}\n"
            );
            let inv = load(&text);
            assert!(
                has_error(&inv, "p", field, reason),
                "{spec}: {:#?}",
                inv.problems
            );
            assert!(inv.admin_policies.is_empty(), "{spec}");
        }
        let inv = load(
            "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\n\
             metadata: {name: p}\nspec: {tier: Middle, priority: 1, subject: {namespaces: {}}}\n",
        );
        assert!(has_error(
            &inv,
            "p",
            "spec.tier",
            "expected \"Admin\" or \"Baseline\""
        ));
        assert!(inv.admin_policies.is_empty());
        let inv = load(
            "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\n\
             metadata: {name: p}\nspec: {priority: 1, subject: {namespaces: {}}}\n",
        );
        assert!(has_error(&inv, "p", "spec.tier", "missing tier"));
    }

    /// A ClusterNetworkPolicy in `tier` with `rule` as its only rule of `direction`.
    fn cnp_rule(tier: &str, direction: &str, rule: &str) -> Inventory {
        load(&format!(
            "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\n\
             metadata: {{name: p}}\nspec:\n  tier: {tier}\n  priority: 1\n  \
             subject: {{namespaces: {{}}}}\n  {direction}:\n  - {rule}\n"
        ))
    }

    /// Rules that cannot be implemented fail closed (an Accept matches nothing, a Deny or Pass
    /// denies), each error naming object and field; the policy still loads.
    #[test]
    fn invalid_rules_fail_closed() {
        let cases: Vec<(&str, &str, &str, &str, AdminRule)> = vec![
            ("ingress", "{action: Accept, from: []}", "spec.ingress[0].from", "at least one peer", matches_nothing(None)),
            ("ingress", "{action: Deny}", "spec.ingress[0].from", "missing", deny_everything(None)),
            ("ingress", "{action: Deny, from: [{}]}", "spec.ingress[0].from[0]", "found none", deny_everything(None)),
            ("ingress", "{action: Pass, from: [{namespaces: {}, nodes: {}}]}", "spec.ingress[0].from[0].nodes", "not allowed here", deny_everything(None)),
            ("ingress", "{action: Accept, from: [{networks: [10.0.0.0/8]}]}", "spec.ingress[0].from[0].networks", "not allowed here", matches_nothing(None)),
            ("egress", "{action: Deny, to: [{namespaces: {}, pods: {namespaceSelector: {}, podSelector: {}}}]}", "spec.egress[0].to[0]", "found namespaces and pods", deny_everything(None)),
            ("egress", "{action: Deny, to: [{networks: [10.0.0.0/33]}]}", "spec.egress[0].to[0].networks[0]", "invalid CIDR", deny_everything(None)),
            ("egress", "{action: Accept, to: [{networks: []}]}", "spec.egress[0].to[0].networks", "at least one", matches_nothing(None)),
            ("egress", "{action: Deny, to: [{domainNames: [example.com]}]}", "spec.egress[0].to[0].domainNames", "only allowed in Accept rules", deny_everything(None)),
            ("egress", "{action: Accept, to: [{domainNames: [\"-bad-.com\"]}]}", "spec.egress[0].to[0].domainNames[0]", "invalid domain name", matches_nothing(None)),
            ("egress", "{action: Accept, to: [{networks: [10.0.0.0/8]}], protocols: [{destinationNamedPort: http}]}", "spec.egress[0]", "named ports cannot be used", matches_nothing(None)),
            ("ingress", "{action: Accept, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {range: {start: 90, end: 80}}}}]}", "spec.ingress[0].protocols[0].tcp.destinationPort.range.end", "greater than start", matches_nothing(None)),
            ("ingress", "{action: Accept, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {number: 0}}}]}", "spec.ingress[0].protocols[0].tcp.destinationPort.number", "out of range", matches_nothing(None)),
            ("ingress", "{action: Accept, from: [{namespaces: {}}], protocols: [{tcp: {}}]}", "spec.ingress[0].protocols[0].tcp.destinationPort", "the CRD needs destinationPort", matches_nothing(None)),
            ("ingress", "{action: Accept, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {number: 1}}, udp: {destinationPort: {number: 1}}}]}", "spec.ingress[0].protocols[0]", "found tcp and udp", matches_nothing(None)),
            ("ingress", "{action: Accept, from: [{namespaces: {}}], protocols: []}", "spec.ingress[0].protocols", "empty", matches_nothing(None)),
            ("ingress", "{action: Allow, from: [{namespaces: {}}]}", "spec.ingress[0].action", "expected Accept, Deny or Pass", deny_all_namespaces(None)),
            ("ingress", "{name: x, from: [{namespaces: {}}]}", "spec.ingress[0].action", "missing action", deny_all_namespaces(Some("x"))),
            // A wrong type in a rule fails the rule, not the policy.
            ("ingress", "{action: Accept, from: {namespaces: {}}}", "spec.ingress[0].from", "expected a list", matches_nothing(None)),
        ];
        for (direction, rule, field, reason, expected) in cases {
            let inv = cnp_rule("Admin", direction, rule);
            assert!(
                has_error(&inv, "p", field, reason),
                "{rule}: {:#?}",
                inv.problems
            );
            assert!(
                has_error(&inv, "p", &format!("spec.{direction}[0]"), "fails closed"),
                "{rule}"
            );
            assert!(
                !inv.problems
                    .iter()
                    .any(|p| p.reason.contains("object ignored")),
                "{rule}: {:#?}",
                inv.problems
            );
            let p = admin(&inv, "p");
            let rules = if direction == "ingress" {
                &p.ingress
            } else {
                &p.egress
            };
            assert_eq!(rules, &vec![expected], "{rule}");
        }
        // Pass only in the Admin tier: a Baseline Pass denies what it covers.
        let inv = cnp_rule(
            "Baseline",
            "ingress",
            "{action: Pass, from: [{namespaces: {a: b}}]}",
        );
        assert!(has_error(
            &inv,
            "p",
            "spec.ingress[0].action",
            "only allowed in the Admin tier"
        ));
        let p = admin(&inv, "p");
        assert_eq!(p.ingress[0].action, AdminAction::Deny);
        assert_eq!(
            p.ingress[0].peers,
            vec![AdminPeer::Pods(PodsSelector::namespaces(
                LabelSelector::everything()
            ))]
        );
        // A Deny with a named port beside a networks peer denies those networks on every port.
        let inv = cnp_rule(
            "Admin",
            "egress",
            "{action: Deny, to: [{networks: [10.0.0.0/8]}], protocols: [{destinationNamedPort: http}]}",
        );
        let p = admin(&inv, "p");
        assert_eq!(
            p.egress[0].peers,
            vec![AdminPeer::Networks(vec![net("10.0.0.0/8")])]
        );
        assert_eq!(p.egress[0].ports, None);
    }

    #[test]
    fn limits_and_names() {
        // A name above 100 characters is dropped; the rule stays as written.
        let long = "n".repeat(101);
        let inv = cnp_rule(
            "Admin",
            "ingress",
            &format!("{{name: {long}, action: Deny, from: [{{namespaces: {{}}}}]}}"),
        );
        assert!(has_error(
            &inv,
            "p",
            "spec.ingress[0].name",
            "longer than 100"
        ));
        let p = admin(&inv, "p");
        assert_eq!(p.ingress[0].name, None);
        assert_eq!(p.ingress[0].action, AdminAction::Deny);
        assert_eq!(p.ingress[0].peers.len(), 1);
        // 26 rules: the CRD of ClusterNetworkPolicy allows 25.
        let rules = vec!["{action: Deny, from: [{namespaces: {}}]}"; 26].join(", ");
        let inv = load(&format!(
            "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\n\
             metadata: {{name: p}}\nspec: {{tier: Admin, priority: 1, subject: {{namespaces: {{}}}}, \
             ingress: [{rules}]}}\n"
        ));
        assert!(has_error(&inv, "p", "spec.ingress", "at most 25"));
        assert_eq!(admin(&inv, "p").ingress.len(), 26);
        // 26 CIDRs in one peer: at most 25.
        let cidrs = vec!["10.0.0.0/8"; 26].join(", ");
        let inv = cnp_rule(
            "Admin",
            "egress",
            &format!("{{action: Deny, to: [{{networks: [{cidrs}]}}]}}"),
        );
        assert!(has_error(
            &inv,
            "p",
            "spec.egress[0].to[0].networks",
            "at most 25"
        ));
        assert_eq!(admin(&inv, "p").egress[0], deny_everything(None));
        // A direction that is not a list: nothing of it can be read, it denies everything.
        let inv = load(
            "apiVersion: policy.networking.k8s.io/v1alpha1\nkind: AdminNetworkPolicy\n\
             metadata: {name: p}\nspec: {priority: 1, subject: {namespaces: {}}, egress: {}}\n",
        );
        assert!(has_error(
            &inv,
            "p",
            "spec.egress",
            "denies everything in egress"
        ));
        assert_eq!(admin(&inv, "p").egress, vec![deny_everything(None)]);
    }

    #[test]
    fn policy_for_names_must_be_qualified() {
        let inv = load(
            r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata:
  name: p
  annotations: {k8s.v1.cni.cncf.io/policy-for: "storage,net/ok"}
spec: {priority: 1, subject: {namespaces: {}}}
"#,
        );
        let field = "metadata.annotations[\"k8s.v1.cni.cncf.io/policy-for\"]";
        assert!(
            has_error(&inv, "p", field, "has no namespace"),
            "{:#?}",
            inv.problems
        );
        assert_eq!(
            admin(&inv, "p").scope,
            PolicyScope::Networks(vec![NetworkId::nad("net", "ok")])
        );
        // Bad monitor annotations fail closed to enforce, as on the namespaced kinds.
        let inv = load(
            r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata:
  name: p
  annotations: {netwarden.io/mode: maybe}
spec: {priority: 1, subject: {namespaces: {}}}
"#,
        );
        assert!(has_error(
            &inv,
            "p",
            "metadata.annotations[\"netwarden.io/mode\"]",
            "stays enforced"
        ));
        assert_eq!(admin(&inv, "p").mode, Mode::Enforce);
    }

    #[test]
    fn near_misses_of_the_admin_kinds_and_nodes_are_errors() {
        let cases = [
            (
                "AdminNetworkPolicies",
                "policy.networking.k8s.io/v1alpha1",
                "kind",
                "did you mean AdminNetworkPolicy",
            ),
            (
                "ClusterNetworkPolicy",
                "policy.networking.k8s.io/v1alpha1",
                "apiVersion",
                "policy.networking.k8s.io/v1alpha2",
            ),
            (
                "AdminNetworkPolicy",
                "policy.networking.k8s.io/v1alpha2",
                "apiVersion",
                "policy.networking.k8s.io/v1alpha1",
            ),
            (
                "BaselineAdminNetworkPolicy",
                "policy.networking.k8s.io/v1",
                "apiVersion",
                "policy.networking.k8s.io/v1alpha1",
            ),
            (
                "BaselineAdminNetworkpolicy",
                "policy.networking.k8s.io/v1alpha1",
                "kind",
                "did you mean BaselineAdminNetworkPolicy",
            ),
            ("Nodes", "v1", "kind", "did you mean Node"),
        ];
        for (kind, version, field, reason) in cases {
            let inv = load(&format!(
                "apiVersion: {version}\nkind: {kind}\nmetadata: {{name: x}}\n"
            ));
            let errors = problems(&inv, Severity::Error);
            assert!(
                errors
                    .iter()
                    .any(|(_, o, f, r)| o == "x" && f == field && r.contains(reason)),
                "{kind} {version}: {errors:#?}"
            );
            assert!(inv.admin_policies.is_empty() && inv.nodes.is_empty());
        }
    }

    #[test]
    fn equal_priorities_that_can_disagree_are_warned_about() {
        let doc = |kind: &str, name: &str, priority: u32, action: &str| {
            format!(
                "apiVersion: policy.networking.k8s.io/{}\nkind: {kind}\nmetadata: {{name: {name}}}\n\
                 spec: {{tier: Admin, priority: {priority}, subject: {{namespaces: {{}}}}, \
                 ingress: [{{action: {action}, from: [{{namespaces: {{}}}}]}}]}}\n",
                if kind == "ClusterNetworkPolicy" { "v1alpha2" } else { "v1alpha1" }
            )
        };
        let text = [
            doc("AdminNetworkPolicy", "b", 5, "Deny"),
            doc("AdminNetworkPolicy", "a", 5, "Allow"),
            doc("AdminNetworkPolicy", "c", 5, "Allow"),
            doc("AdminNetworkPolicy", "d", 6, "Pass"),
            doc("ClusterNetworkPolicy", "e", 7, "Deny"),
            doc("AdminNetworkPolicy", "f", 7, "Deny"),
        ]
        .join("---\n");
        let inv = load(&text);
        let warnings = problems(&inv, Severity::Warning);
        // a < b < c by name: b disagrees with a; c agrees with a but not with b.
        let warned: Vec<&str> = warnings.iter().map(|w| w.1.as_str()).collect();
        assert_eq!(warned, ["b", "c"], "{warnings:#?}");
        assert!(warnings.iter().all(|w| w.2 == "spec.priority"));
        assert!(
            warnings[0].3.contains("AdminNetworkPolicy/a"),
            "{warnings:?}"
        );
        // Duplicates are errors, the first one kept.
        let inv = load(
            &[
                doc("AdminNetworkPolicy", "a", 5, "Deny"),
                doc("AdminNetworkPolicy", "a", 6, "Deny"),
            ]
            .join("---\n"),
        );
        assert!(has_error(&inv, "a", "metadata.name", "duplicate object"));
        assert_eq!(admin(&inv, "a").priority, 5);
    }

    #[test]
    fn deltas_and_the_cluster_carry_admin_policies_and_nodes() {
        let anp = serde_json::json!({"apiVersion": "policy.networking.k8s.io/v1alpha1",
            "kind": "AdminNetworkPolicy", "metadata": {"name": "p"},
            "spec": {"priority": 1, "subject": {"namespaces": {}},
                     "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}});
        let node = serde_json::json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1"}, "status": {"addresses": [{"type": "InternalIP", "address": "10.9.0.1"}]}});
        let mut set = crate::ClusterSet::new(LoadOptions::default());
        assert!(set.upsert(&anp));
        assert!(set.upsert(&node));
        let first = set.take_delta();
        assert_eq!(first.admin_policies.len(), 1);
        assert_eq!(first.nodes.len(), 1);
        assert_eq!(
            set.inventory().admin_policies,
            vec![AdminPolicy::clone(&first.admin_policies[0])]
        );
        // A version with a wrong type in a rule: the last good version is kept.
        let mut broken = anp.clone();
        broken["spec"]["ingress"][0]["from"] = serde_json::json!("everyone");
        set.upsert(&broken);
        let kept = set.take_delta();
        assert!(
            kept.admin_policies
                .iter()
                .all(|p| p.ingress[0].peers.len() == 1
                    && matches!(p.ingress[0].peers[0], AdminPeer::Pods(_))),
            "{kept:#?}"
        );
        assert!(set
            .problems()
            .iter()
            .any(|p| p.reason.contains("last good version")));
        assert!(set.remove("AdminNetworkPolicy", "", "p"));
        assert!(set.remove("Node", "", "n1"));
        let gone = set.take_delta();
        assert_eq!(gone.admin_policies_removed.len(), 1);
        assert_eq!(gone.nodes_removed, ["n1"]);
        // Between two inventories of files.
        let before = load("apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n---\napiVersion: policy.networking.k8s.io/v1alpha1\nkind: BaselineAdminNetworkPolicy\nmetadata: {name: default}\nspec: {subject: {namespaces: {}}}\n");
        let delta = crate::InventoryDelta::between(Some(&before), &Inventory::default());
        assert_eq!(delta.nodes_removed, ["n1"]);
        assert_eq!(delta.admin_policies_removed.len(), 1);
        // And the engine gets them.
        let engine = crate::feed::engine_from(&before, netwarden_engine::EngineOptions::default());
        assert_eq!(engine.admin_policies().count(), 1);
        assert_eq!(engine.nodes().count(), 1);
    }
}
