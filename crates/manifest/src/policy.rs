//! NetworkPolicy, DanmNetworkPolicy and MultiNetworkPolicy to [`Policy`] (SPEC 3 and 4).
//!
//! The rule of thumb when something is invalid: never widen. A field of the wrong type, or a
//! `policyTypes` entry that is neither Ingress nor Egress, rejects the whole policy (see
//! `ctx`): it was not written as its author believes. A value of the right type that is
//! invalid narrows: an invalid peer or port is dropped (narrowing its rule); a rule that had
//! peers (or ports) but lost them all is dropped whole, since an empty list would mean "all";
//! an invalid `podSelector` drops the policy; a bad monitor annotation leaves the policy
//! enforced.

use ipnet::IpNet;
use netwarden_engine::{
    IpBlock, LabelSelector, Mode, NetworkId, NetworkSelectorEntry, NetworkType, ObjectKey,
    Operator, Peer, Policy, PolicyKind, PolicyPort, PolicyRule, PolicyScope, PortRef, Requirement,
};
use serde_json::Value;

use std::collections::HashSet;

use crate::ctx::{get, index, join, keyed, show, Ctx, LabelCheck};
use crate::meta::read_meta;
use crate::pod::{section, split_network_name};
use crate::validate;

pub const MODE: &str = "netwarden.io/mode";
pub const KUBE_ROUTER_MONITOR: &str = "kube-router.io/network-policy.monitor";
pub const KUBE_ROUTER_STAGED: &str = "kube-router.io/network-policy.staged";
pub const REPLACES: &str = "netwarden.io/replaces";
pub const LOG: &str = "netwarden.io/log";
pub const POLICY_FOR: &str = "k8s.v1.cni.cncf.io/policy-for";

pub(crate) fn read_policy(cx: &mut Ctx<'_>, doc: &Value) -> Option<Policy> {
    let kind = match cx.kind {
        "NetworkPolicy" => PolicyKind::NetworkPolicy,
        "DanmNetworkPolicy" => PolicyKind::DanmNetworkPolicy,
        _ => PolicyKind::MultiNetworkPolicy,
    };
    let meta = read_meta(cx, doc, true)?;
    let spec = section(cx, doc, "", "spec");

    let pod_selector = match get(spec, "podSelector") {
        None => Some(LabelSelector::everything()),
        Some(v) => read_selector(cx, v, "spec.podSelector"),
    };
    if pod_selector.is_none() {
        cx.warn(
            "spec.podSelector",
            "policy ignored: its podSelector is invalid",
        );
    }

    let (isolates_ingress, isolates_egress) = read_policy_types(cx, spec);
    let ns = meta.namespace.as_str();
    let ingress_rules = read_rules(cx, spec, "ingress", "from", kind, ns);
    let egress_rules = read_rules(cx, spec, "egress", "to", kind, ns);

    let scope = match kind {
        PolicyKind::NetworkPolicy => PolicyScope::Primary,
        PolicyKind::DanmNetworkPolicy => PolicyScope::AllInterfaces,
        PolicyKind::MultiNetworkPolicy => PolicyScope::Networks(read_policy_for(
            cx,
            meta.annotations.get(POLICY_FOR),
            Some(ns),
        )),
    };

    let PolicyAnnotations {
        mode,
        replaces,
        log_denies,
    } = read_policy_annotations(cx, &meta.annotations);

    Some(Policy {
        kind,
        key: ObjectKey::new(meta.namespace.clone(), meta.name),
        pod_selector: pod_selector?,
        ingress: isolates_ingress.then_some(ingress_rules),
        egress: isolates_egress.then_some(egress_rules),
        scope,
        mode,
        replaces,
        log_denies,
    })
}

/// The fail-closed form of a policy that cannot be read (SPEC 7): it isolates the pods its
/// `podSelector` selects, with no allows, in the directions it names — both when they cannot
/// be read. When even its selector (or its spec) cannot be read, which pods it meant is
/// unknown: it isolates every pod of its namespace (the reader's problems say why). Mode (a readable `netwarden.io/mode: monitor` keeps it
/// monitored: monitoring never changes enforcement) and `policy-for` are read as the full
/// reader would; what cannot be read there is enforce and "no network".
///
/// So a restarted agent enforces what a running one does: the running agent keeps the policy's
/// last good version when it has one ([`crate::set::merge`]), and both isolate rather than
/// open the pods the author meant to protect.
pub(crate) fn fail_closed(
    doc: &Value,
    namespace: &str,
    name: &str,
    kind: PolicyKind,
) -> Option<Policy> {
    // The reader already reported every problem: this pass reads quietly.
    let mut scratch = Vec::new();
    let kind_name = match kind {
        PolicyKind::NetworkPolicy => "NetworkPolicy",
        PolicyKind::DanmNetworkPolicy => "DanmNetworkPolicy",
        PolicyKind::MultiNetworkPolicy => "MultiNetworkPolicy",
    };
    let mut cx = Ctx::new("", kind_name, String::new(), &mut scratch);
    // A spec that is not an object says nothing of selector or directions: the whole
    // namespace, both ways.
    let (spec, unknown_directions) = match get(doc, "spec") {
        Some(s @ Value::Object(_)) => (s, false),
        Some(_) => (&Value::Null, true),
        None => (&Value::Null, false),
    };
    let pod_selector = match get(spec, "podSelector") {
        None => LabelSelector::everything(),
        Some(v) => match read_selector(&mut cx, v, "spec.podSelector") {
            Some(selector) if !cx.rejected => selector,
            _ => LabelSelector::everything(),
        },
    };
    let (ingress, egress) = if unknown_directions {
        (true, true)
    } else {
        fail_closed_directions(spec)
    };
    let annotations: netwarden_engine::Labels = get(doc, "metadata")
        .and_then(|m| get(m, "annotations"))
        .and_then(Value::as_object)
        .map(|a| {
            a.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let mode = read_mode(&mut cx, &annotations);
    let scope = match kind {
        PolicyKind::NetworkPolicy => PolicyScope::Primary,
        PolicyKind::DanmNetworkPolicy => PolicyScope::AllInterfaces,
        PolicyKind::MultiNetworkPolicy => PolicyScope::Networks(read_policy_for(
            &mut cx,
            annotations.get(POLICY_FOR),
            Some(namespace),
        )),
    };
    Some(Policy {
        kind,
        key: ObjectKey::new(namespace, name),
        pod_selector,
        ingress: ingress.then(Vec::new),
        egress: egress.then(Vec::new),
        scope,
        mode,
        replaces: None,
        log_denies: false,
    })
}

/// The directions an unreadable policy names: `policyTypes` when every entry reads as Ingress
/// or Egress; both when it cannot be read; unset, Ingress plus Egress when `spec.egress` is
/// anything but absent or an empty list (an egress section of the wrong type was still meant).
fn fail_closed_directions(spec: &Value) -> (bool, bool) {
    let unset = || {
        let egress = match get(spec, "egress") {
            None => false,
            Some(Value::Array(a)) => !a.is_empty(),
            Some(_) => true,
        };
        (true, egress)
    };
    match get(spec, "policyTypes") {
        None => unset(),
        Some(Value::Array(list)) if list.is_empty() => unset(),
        Some(Value::Array(list)) => {
            let (mut ingress, mut egress) = (false, false);
            for t in list {
                match t.as_str() {
                    Some("Ingress") => ingress = true,
                    Some("Egress") => egress = true,
                    _ => return (true, true),
                }
            }
            (ingress, egress)
        }
        Some(_) => (true, true),
    }
}

/// Resolves `policyTypes`: unset (or empty) means Ingress, plus Egress when `spec.egress` has
/// rules. An entry that is neither Ingress nor Egress rejects the policy: a misspelled
/// `Egress` would otherwise leave egress open.
fn read_policy_types(cx: &mut Ctx<'_>, spec: &Value) -> (bool, bool) {
    let has_egress_rules = matches!(get(spec, "egress"), Some(Value::Array(a)) if !a.is_empty());
    let default = (true, has_egress_rules);
    let Some(list) = cx.array(spec, "spec", "policyTypes") else {
        return default;
    };
    let (mut ingress, mut egress, mut any) = (false, false, false);
    for (i, t) in list.iter().enumerate() {
        let field = index("spec.policyTypes", i);
        match t {
            Value::String(s) if s == "Ingress" => (ingress, any) = (true, true),
            Value::String(s) if s == "Egress" => (egress, any) = (true, true),
            Value::String(_) => cx.reject(
                &field,
                format!("expected \"Ingress\" or \"Egress\", found {}", show(t)),
            ),
            other => cx.wrong_type(&field, "\"Ingress\" or \"Egress\"", other),
        }
    }
    if any {
        (ingress, egress)
    } else {
        default
    }
}

/// The rules of one direction. A rule that cannot be read safely is dropped (narrowing).
fn read_rules(
    cx: &mut Ctx<'_>,
    spec: &Value,
    dir: &str,
    peers_key: &str,
    kind: PolicyKind,
    ns: &str,
) -> Vec<PolicyRule> {
    let base = join("spec", dir);
    let Some(rules) = cx.array(spec, "spec", dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, rule) in rules.iter().enumerate() {
        let rbase = index(&base, i);
        let rule = match rule {
            Value::Null => &Value::Object(Default::default()),
            Value::Object(_) => rule,
            other => {
                cx.wrong_type(&rbase, "an object", other);
                continue;
            }
        };
        let peers = read_list(cx, rule, &rbase, peers_key, "peers", |cx, v, f| {
            read_peer(cx, v, f, kind, ns)
        });
        let ports = read_list(cx, rule, &rbase, "ports", "ports", read_port);
        if let (Some(peers), Some(ports)) = (peers, ports) {
            out.push(PolicyRule { peers, ports });
        }
    }
    out
}

/// A rule's peer or port list. `None` when the rule must be dropped: the list is not a list
/// (which also rejects the policy), or it had entries and every one was invalid (an empty list
/// would mean "all").
fn read_list<T>(
    cx: &mut Ctx<'_>,
    rule: &Value,
    rbase: &str,
    key: &str,
    what: &str,
    mut read: impl FnMut(&mut Ctx<'_>, &Value, &str) -> Option<T>,
) -> Option<Vec<T>> {
    let field = join(rbase, key);
    let list = match get(rule, key) {
        None => return Some(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(other) => {
            cx.wrong_type(&field, "a list", other);
            return None;
        }
    };
    let out: Vec<T> = list
        .iter()
        .enumerate()
        .filter_map(|(i, v)| read(cx, v, &index(&field, i)))
        .collect();
    if !list.is_empty() && out.is_empty() {
        cx.warn(
            rbase,
            format!("rule dropped: all its {what} are invalid (an empty list would allow all)"),
        );
        return None;
    }
    Some(out)
}

fn read_peer(cx: &mut Ctx<'_>, v: &Value, field: &str, kind: PolicyKind, ns: &str) -> Option<Peer> {
    if !v.is_object() {
        cx.wrong_type(field, "an object", v);
        return None;
    }
    let pod_sel = get(v, "podSelector");
    let ns_sel = get(v, "namespaceSelector");
    let ip_block = get(v, "ipBlock");
    let net_sel = get(v, "networkSelector");

    if net_sel.is_some() && kind != PolicyKind::DanmNetworkPolicy {
        // Ignoring it would widen the peer to every network.
        cx.error(
            &join(field, "networkSelector"),
            format!("networkSelector is only read in DanmNetworkPolicy, not {kind}; peer dropped"),
        );
        return None;
    }
    if let Some(block) = ip_block {
        if pod_sel.is_some() || ns_sel.is_some() || net_sel.is_some() {
            cx.error(
                field,
                "ipBlock cannot be combined with selectors in one peer; peer dropped",
            );
            return None;
        }
        return read_ip_block(cx, block, &join(field, "ipBlock")).map(Peer::IpBlock);
    }
    if pod_sel.is_none() && ns_sel.is_none() && net_sel.is_none() {
        cx.error(
            field,
            "empty peer: it needs podSelector, namespaceSelector or ipBlock; peer dropped",
        );
        return None;
    }
    let mut ok = true;
    let mut selector =
        |cx: &mut Ctx<'_>, sel: Option<&Value>, key: &str| -> Option<LabelSelector> {
            let s = read_selector(cx, sel?, &join(field, key));
            ok &= s.is_some();
            s
        };
    let pod_selector = selector(cx, pod_sel, "podSelector");
    let namespace_selector = selector(cx, ns_sel, "namespaceSelector");
    let network_selector = match net_sel {
        None => None,
        Some(n) => {
            let r = read_network_selector(cx, n, &join(field, "networkSelector"), ns);
            ok &= r.is_some();
            r
        }
    };
    if !ok {
        cx.warn(field, "peer dropped: it has an invalid selector");
        return None;
    }
    Some(Peer::Pods {
        pod_selector,
        namespace_selector,
        network_selector,
    })
}

fn read_network_selector(
    cx: &mut Ctx<'_>,
    v: &Value,
    field: &str,
    policy_ns: &str,
) -> Option<Vec<NetworkSelectorEntry>> {
    let Value::Array(list) = v else {
        cx.wrong_type(field, "a list", v);
        return None;
    };
    if list.is_empty() {
        cx.error(field, "empty networkSelector selects no network");
        return None;
    }
    let mut out = Vec::new();
    let mut ok = true;
    for (i, e) in list.iter().enumerate() {
        let ebase = index(field, i);
        if !e.is_object() {
            cx.wrong_type(&ebase, "an object", e);
            ok = false;
            continue;
        }
        let name = cx.str(e, &ebase, "name");
        let kind = match cx.str(e, &ebase, "type").filter(|t| !t.is_empty()) {
            None => Some(NetworkType::DanmNet),
            Some(t) => {
                let k = NetworkType::parse(t);
                if k.is_none() {
                    cx.error(
                        &join(&ebase, "type"),
                        format!(
                            "unknown network type \"{}\" (expected DanmNet, TenantNetwork, ClusterNetwork, NetworkAttachmentDefinition or NAD)",
                            validate::shorten(t)
                        ),
                    );
                }
                k
            }
        };
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            if get(e, "name").is_none_or(|n| n.as_str() == Some("")) {
                cx.error(&join(&ebase, "name"), "missing network name");
            }
            ok = false;
            continue;
        };
        let Some(kind) = kind else {
            ok = false;
            continue;
        };
        let entry = if kind == NetworkType::NetworkAttachmentDefinition {
            split_network_name(name, policy_ns).map(|(ns, n)| NetworkSelectorEntry {
                kind,
                namespace: Some(ns),
                name: n,
            })
        } else {
            // DANM networks live in the namespace of the pod that uses them (or nowhere, for
            // ClusterNetwork): a namespace in the name means nothing here.
            validate::dns1123_subdomain(name)
                .map(|()| NetworkSelectorEntry {
                    kind,
                    namespace: None,
                    name: name.to_string(),
                })
                .map_err(|e| format!("network name: {e}"))
        };
        match entry {
            Ok(e) => out.push(e),
            Err(e) => {
                cx.error(&join(&ebase, "name"), e);
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

/// `cidr` minus `except`. Any invalid part drops the whole block: dropping only a bad `except`
/// would widen it.
fn read_ip_block(cx: &mut Ctx<'_>, v: &Value, field: &str) -> Option<IpBlock> {
    if !v.is_object() {
        cx.wrong_type(field, "an object", v);
        return None;
    }
    let cidr_field = join(field, "cidr");
    let Some(cidr_text) = cx.str(v, field, "cidr") else {
        if get(v, "cidr").is_none() {
            cx.error(&cidr_field, "missing cidr; peer dropped");
        }
        return None;
    };
    let cidr = parse_cidr(cx, &cidr_field, cidr_text)?;
    let mut except = Vec::new();
    let mut ok = true;
    if let Some(list) = cx.array(v, field, "except") {
        for (i, e) in list.iter().enumerate() {
            let efield = index(&join(field, "except"), i);
            let Value::String(s) = e else {
                cx.wrong_type(&efield, "a CIDR string", e);
                ok = false;
                continue;
            };
            let Some(net) = parse_cidr(cx, &efield, s) else {
                ok = false;
                continue;
            };
            let same_family = net.addr().is_ipv4() == cidr.addr().is_ipv4();
            if !same_family {
                cx.error(
                    &efield,
                    format!(
                        "except {net} is not of the same IP family as cidr {cidr}; peer dropped"
                    ),
                );
                ok = false;
            } else if !cidr.contains(&net) || net.prefix_len() <= cidr.prefix_len() {
                cx.error(
                    &efield,
                    format!("except {net} is not strictly inside cidr {cidr}; peer dropped"),
                );
                ok = false;
            } else {
                except.push(net);
            }
        }
    } else if get(v, "except").is_some() {
        ok = false;
    }
    ok.then_some(IpBlock { cidr, except })
}

/// A CIDR; host bits are cleared with a warning (Kubernetes accepts them).
fn parse_cidr(cx: &mut Ctx<'_>, field: &str, s: &str) -> Option<IpNet> {
    match s.trim().parse::<IpNet>() {
        Ok(net) => {
            let masked = net.trunc();
            if masked != net {
                cx.warn(field, format!("{net} has host bits set; read as {masked}"));
            }
            Some(masked)
        }
        Err(_) => {
            cx.error(
                field,
                format!("invalid CIDR \"{}\"; peer dropped", validate::shorten(s)),
            );
            None
        }
    }
}

fn read_port(cx: &mut Ctx<'_>, v: &Value, field: &str) -> Option<PolicyPort> {
    if !v.is_object() {
        cx.wrong_type(field, "an object", v);
        return None;
    }
    let protocol = cx.protocol(v, field, "protocol");
    let port_field = join(field, "port");
    let port = match get(v, "port") {
        None => Ok(None),
        Some(Value::String(s)) => match validate::port_name(s) {
            Ok(()) => Ok(Some(PortRef::Named(s.clone()))),
            Err(e) => {
                cx.error(&port_field, e);
                Err(())
            }
        },
        Some(n) => cx
            .port_number(&port_field, n)
            .map(|p| Some(PortRef::Number(p)))
            .ok_or(()),
    };
    let end_field = join(field, "endPort");
    let end_port = match get(v, "endPort") {
        None => Ok(None),
        Some(e) => {
            let end = match e.as_i64() {
                Some(n) if e.is_i64() || e.is_u64() => Ok(n),
                _ if !e.is_number() => {
                    cx.wrong_type(&end_field, "a port number", e);
                    Err(())
                }
                _ => {
                    cx.error(
                        &end_field,
                        format!("expected a port number, found {}", show(e)),
                    );
                    Err(())
                }
            };
            match (end, &port) {
                (Err(()), _) | (_, Err(())) => Err(()),
                (Ok(end), Ok(p)) => match p {
                    Some(PortRef::Number(start)) => {
                        if end > 65535 {
                            cx.error(&end_field, format!("endPort {end} is out of range 1-65535"));
                            Err(())
                        } else if end < i64::from(*start) {
                            cx.error(&end_field, format!("endPort {end} is below port {start}"));
                            Err(())
                        } else {
                            Ok(Some(end as u16))
                        }
                    }
                    Some(PortRef::Named(_)) => {
                        cx.error(&end_field, "endPort needs a numeric port, not a named one");
                        Err(())
                    }
                    None => {
                        cx.error(&end_field, "endPort needs a numeric port");
                        Err(())
                    }
                },
            }
        }
    };
    match (protocol, port, end_port) {
        (Some(protocol), Ok(port), Ok(end_port)) => Some(PolicyPort {
            protocol,
            port,
            end_port,
        }),
        _ => {
            cx.warn(field, "port dropped: it is invalid");
            None
        }
    }
}

/// A label selector; `None` (reported) when invalid.
pub(crate) fn read_selector(cx: &mut Ctx<'_>, v: &Value, field: &str) -> Option<LabelSelector> {
    if !v.is_object() {
        cx.wrong_type(field, "an object", v);
        return None;
    }
    let check = LabelCheck { consequence: "" };
    let (match_labels, mut ok) = cx.string_map(v, field, "matchLabels", Some(check));
    let mut match_expressions = Vec::new();
    if let Some(exprs) = cx.array(v, field, "matchExpressions") {
        for (i, e) in exprs.iter().enumerate() {
            match read_requirement(cx, e, &index(&join(field, "matchExpressions"), i)) {
                Some(r) => match_expressions.push(r),
                None => ok = false,
            }
        }
    } else if get(v, "matchExpressions").is_some() {
        ok = false;
    }
    ok.then_some(LabelSelector {
        match_labels,
        match_expressions,
    })
}

fn read_requirement(cx: &mut Ctx<'_>, v: &Value, field: &str) -> Option<Requirement> {
    if !v.is_object() {
        cx.wrong_type(field, "an object", v);
        return None;
    }
    let mut ok = true;
    let key = cx.required_str(v, field, "key", "key");
    match key {
        Some(k) => {
            if let Err(e) = validate::label_key(k) {
                cx.error(&join(field, "key"), e);
                ok = false;
            }
        }
        None => ok = false,
    }
    let op_field = join(field, "operator");
    let operator = match cx.str(v, field, "operator") {
        Some("In") => Some(Operator::In),
        Some("NotIn") => Some(Operator::NotIn),
        Some("Exists") => Some(Operator::Exists),
        Some("DoesNotExist") => Some(Operator::DoesNotExist),
        Some(other) => {
            cx.error(
                &op_field,
                format!(
                    "unknown operator \"{}\" (expected In, NotIn, Exists or DoesNotExist)",
                    validate::shorten(other)
                ),
            );
            None
        }
        None => {
            if get(v, "operator").is_none() {
                cx.error(&op_field, "missing operator");
            }
            None
        }
    };
    let values_field = join(field, "values");
    let mut values = Vec::new();
    if let Some(list) = cx.array(v, field, "values") {
        for (i, val) in list.iter().enumerate() {
            let f = index(&values_field, i);
            match val {
                Value::String(s) => match validate::label_value(s) {
                    Ok(()) => values.push(s.clone()),
                    Err(e) => {
                        cx.error(&f, e);
                        ok = false;
                    }
                },
                other => {
                    cx.wrong_type(&f, "a string", other);
                    ok = false;
                }
            }
        }
    } else if get(v, "values").is_some() {
        ok = false;
    }
    match operator {
        Some(Operator::In | Operator::NotIn) if values.is_empty() && ok => {
            cx.error(&values_field, "In and NotIn need at least one value");
            ok = false;
        }
        Some(Operator::Exists | Operator::DoesNotExist) if !values.is_empty() => {
            cx.error(&values_field, "Exists and DoesNotExist take no values");
            ok = false;
        }
        _ => {}
    }
    match (ok, key, operator) {
        (true, Some(key), Some(operator)) => Some(Requirement {
            key: key.to_string(),
            operator,
            values,
        }),
        _ => None,
    }
}

/// `policy-for`: comma-separated `name` or `ns/name`, bare names in the policy's namespace
/// (`policy_ns`). A cluster-scoped policy (`policy_ns` `None`: the admin kinds) has no
/// namespace to resolve a bare name in, so there every name must be qualified. A policy left
/// with no network applies nowhere, which is worth a warning.
pub(crate) fn read_policy_for(
    cx: &mut Ctx<'_>,
    annotation: Option<&String>,
    policy_ns: Option<&str>,
) -> Vec<NetworkId> {
    let field = keyed("metadata.annotations", POLICY_FOR);
    let kind = cx.kind;
    let Some(text) = annotation.filter(|t| !t.trim().is_empty()) else {
        cx.warn(
            &field,
            format!("missing: a {kind} without policy-for applies nowhere"),
        );
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for part in text.split(',').map(str::trim) {
        if part.is_empty() {
            continue;
        }
        let parsed = match policy_ns {
            Some(ns) => split_network_name(part, ns),
            None if !part.contains('/') => Err(format!(
                "a {kind} has no namespace: name the network as namespace/name"
            )),
            None => split_network_name(part, ""),
        };
        match parsed {
            Ok((n, name)) => {
                let id = NetworkId::nad(n, name);
                if seen.insert(id.clone()) {
                    out.push(id);
                }
            }
            Err(e) => cx.error(
                &field,
                format!("\"{}\": {e}; entry ignored", validate::shorten(part)),
            ),
        }
    }
    if out.is_empty() {
        cx.warn(
            &field,
            format!(
                "\"{}\" names no valid network: the {kind} applies nowhere",
                validate::shorten(text)
            ),
        );
    }
    out
}

/// The annotations every policy kind reads the same way (SPEC 4): the monitor phase,
/// `netwarden.io/replaces` and `netwarden.io/log`.
pub(crate) struct PolicyAnnotations {
    pub mode: Mode,
    /// A valid name, also when the policy is enforced (a warning says it is ignored there).
    pub replaces: Option<String>,
    pub log_denies: bool,
}

/// Reads [`PolicyAnnotations`]; anything unclear fails closed (enforced, not replacing, not
/// logging) with an error.
pub(crate) fn read_policy_annotations(
    cx: &mut Ctx<'_>,
    annotations: &netwarden_engine::Labels,
) -> PolicyAnnotations {
    let mode = read_mode(cx, annotations);
    let replaces = annotations.get(REPLACES).and_then(|r| {
        let field = keyed("metadata.annotations", REPLACES);
        match validate::dns1123_subdomain(r) {
            Ok(()) => {
                if mode == Mode::Enforce {
                    cx.warn(
                        &field,
                        "only a monitored policy can preview replacing another; ignored here",
                    );
                }
                Some(r.clone())
            }
            Err(e) => {
                cx.error(&field, format!("invalid policy name: {e}; ignored"));
                None
            }
        }
    });
    let log_denies = match annotations.get(LOG).map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            cx.error(
                &keyed("metadata.annotations", LOG),
                format!(
                    "expected \"true\" or \"false\", found \"{}\"; not logging",
                    validate::shorten(other)
                ),
            );
            false
        }
    };
    PolicyAnnotations {
        mode,
        replaces,
        log_denies,
    }
}

/// Monitor or enforce, from the three annotation keys. Anything unclear fails closed (enforce).
fn read_mode(cx: &mut Ctx<'_>, annotations: &netwarden_engine::Labels) -> Mode {
    let mut votes: Vec<(&str, Mode)> = Vec::new();
    let mut bad = false;
    for (key, monitor, enforce) in [
        (MODE, "monitor", "enforce"),
        (KUBE_ROUTER_MONITOR, "true", "false"),
        (KUBE_ROUTER_STAGED, "true", "false"),
    ] {
        let Some(value) = annotations.get(key) else {
            continue;
        };
        if value == monitor {
            votes.push((key, Mode::Monitor));
        } else if value == enforce {
            votes.push((key, Mode::Enforce));
        } else {
            cx.error(
                &keyed("metadata.annotations", key),
                format!(
                    "expected \"{monitor}\" or \"{enforce}\", found \"{}\"; policy stays enforced",
                    validate::shorten(value)
                ),
            );
            bad = true;
        }
    }
    let monitor = votes
        .iter()
        .filter(|(_, m)| *m == Mode::Monitor)
        .map(|(k, _)| *k)
        .collect::<Vec<_>>();
    let enforce = votes
        .iter()
        .filter(|(_, m)| *m == Mode::Enforce)
        .map(|(k, _)| *k)
        .collect::<Vec<_>>();
    if !monitor.is_empty() && !enforce.is_empty() {
        cx.error(
            "metadata.annotations",
            format!(
                "conflicting mode annotations ({} say monitor, {} say enforce); policy stays enforced",
                monitor.join(", "),
                enforce.join(", ")
            ),
        );
        return Mode::Enforce;
    }
    if bad || monitor.is_empty() {
        Mode::Enforce
    } else {
        Mode::Monitor
    }
}
