//! Invariants of the loader on arbitrary input, for fuzzers and property tests.
//!
//! [`check_load`] feeds bytes to the loader (as a YAML file and as a JSON file) and panics when
//! an invariant breaks. The cargo-fuzz target `fuzz/fuzz_targets/manifest.rs` calls it with
//! libFuzzer's inputs; `tests/fuzz_corpus.rs` calls it on a seed corpus and its mutations, and
//! on generated documents, under `cargo test`.
//!
//! The invariants:
//! - nothing panics, however broken or hostile the input;
//! - reading a text while it is parsed (`stream::read_text`, see `crate::stream`) gives
//!   exactly what parsing it whole and reducing after gives (`stream::read_text_whole`);
//! - every loaded object has valid names (they reach rule comments and log prefixes);
//! - every interface name passes [`validate::ifname`], and addresses and prefix lengths pair up;
//! - no loaded policy is wider than written: a direction written as isolated stays isolated, a
//!   written non-empty `podSelector` is not read as "all pods", rules come out in written order
//!   with no peer or port list emptied (an empty list means "all"), an `ipBlock` keeps all its
//!   `except` entries, and a MultiNetworkPolicy applies to no network its `policy-for` does not
//!   name;
//! - problems are one bounded line each (no control characters, at most [`MAX_PROBLEM_PART`]
//!   bytes per part), so hostile input cannot flood or forge log lines.
//!
//! [`check_cluster`] does the same for [`crate::ClusterSet`], the agent's reduction of watched
//! objects, over histories of watch events (see [`cluster`] for its invariants); its target is
//! `fuzz/fuzz_targets/cluster.rs`, its CI test `tests/fuzz_cluster.rs`.

pub mod cluster;

use ipnet::IpNet;
use netwarden_engine::{
    LabelSelector, NetworkId, Peer, Policy, PolicyKind, PolicyRule, PolicyScope,
};
use serde_json::Value;

use crate::assemble::{assemble, Part};
use crate::{documents, files, stream, validate, Inventory, LoadOptions, Loader, Problem};

pub use cluster::check_cluster;

/// The longest a problem's file, kind, object, field or reason may be.
pub const MAX_PROBLEM_PART: usize = 1024;

/// Runs the loader on `data` as a YAML file and as a JSON file, and checks every invariant of
/// the module documentation; panics on a violation.
pub fn check_load(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        // The file stage refuses non-UTF-8 with a problem; check that path too.
        let read = files::read_bytes("fuzz.yaml", data.to_vec());
        let inv = assemble([Part::File(&read)], &LoadOptions::default());
        check_problems(&inv.problems);
        return;
    };
    // The file name matters only for text that looks like JSON (a `.json` file falls back to
    // YAML differently): YAML text is loaded once.
    let looks_like_json = matches!(text.trim_start().chars().next(), Some('{' | '['));
    let labels: &[&str] = if looks_like_json {
        &["fuzz.yaml", "fuzz.json"]
    } else {
        &["fuzz.yaml"]
    };
    for &label in labels {
        // What `parse_str` does, keeping the parsed documents to compare with.
        let mut problems = Vec::new();
        let docs = documents::parse_documents(label, text, &mut problems);
        let read = stream::read_documents(label, problems, &docs);
        // Reading while parsing gives what reading the whole tree first gives.
        assert_eq!(
            stream::read_text(label, text),
            read,
            "streamed read of {label}"
        );
        let inv = assemble([Part::File(&read)], &LoadOptions::default());
        let written: Vec<Value> = docs.into_iter().map(|d| d.value).collect();
        check_inventory(&inv, &written);
    }
    // A document handed over already parsed (as the agent's API source does).
    if let Ok(doc) = serde_json::from_str::<Value>(text) {
        let mut loader = Loader::new(LoadOptions::default());
        loader.add_value("fuzz", "#1", &doc);
        check_inventory(&loader.finish(), std::slice::from_ref(&doc));
    }
}

/// Checks an inventory against the documents it was loaded from.
pub(crate) fn check_inventory(inv: &Inventory, written: &[Value]) {
    for ns in &inv.namespaces {
        assert_eq!(
            validate::dns1123_label(&ns.name),
            Ok(()),
            "namespace {ns:?}"
        );
    }
    for pod in &inv.pods {
        assert_eq!(
            validate::dns1123_label(&pod.key.namespace),
            Ok(()),
            "{pod:?}"
        );
        assert_eq!(
            validate::dns1123_subdomain(&pod.key.name),
            Ok(()),
            "{pod:?}"
        );
        for iface in &pod.interfaces {
            assert_eq!(validate::ifname(&iface.name), Ok(()), "{pod:?}");
            assert_eq!(iface.ips.len(), iface.prefix_lens.len(), "{pod:?}");
        }
    }
    for svc in &inv.services {
        assert_eq!(
            validate::dns1123_label(&svc.key.namespace),
            Ok(()),
            "{svc:?}"
        );
        assert_eq!(
            validate::dns1123_subdomain(&svc.key.name),
            Ok(()),
            "{svc:?}"
        );
    }
    let objects = objects_of(written);
    for policy in &inv.policies {
        assert_eq!(
            validate::dns1123_label(&policy.key.namespace),
            Ok(()),
            "{policy:?}"
        );
        assert_eq!(
            validate::dns1123_subdomain(&policy.key.name),
            Ok(()),
            "{policy:?}"
        );
        // Several documents may carry the identity (a duplicate, a rejected first
        // definition): the policy must be what one of them says, or narrower.
        let identity = Some((
            policy.kind,
            policy.key.namespace.as_str(),
            policy.key.name.as_str(),
        ));
        let verdicts: Vec<Result<(), String>> = objects
            .iter()
            .filter(|o| written_identity(o) == identity)
            .map(|o| not_wider(policy, o))
            .collect();
        assert!(
            !verdicts.is_empty(),
            "loaded policy {} has no written document",
            policy.key
        );
        assert!(
            verdicts.iter().any(Result::is_ok),
            "policy {} is wider than written: {verdicts:?}\n{policy:?}",
            policy.key
        );
    }
    check_problems(&inv.problems);
}

fn check_problems(problems: &[Problem]) {
    for p in problems {
        for part in [&p.file, &p.kind, &p.object, &p.field, &p.reason] {
            assert!(
                part.len() <= MAX_PROBLEM_PART,
                "problem part too long: {p:?}"
            );
            assert!(
                !part.chars().any(char::is_control),
                "control character in a problem: {p:?}"
            );
        }
    }
}

/// Every object of the documents, Lists unfolded (typed-list items get their list's kind).
fn objects_of(docs: &[Value]) -> Vec<Value> {
    fn walk(v: &Value, inherited_kind: Option<&str>, depth: usize, out: &mut Vec<Value>) {
        let Some(map) = v.as_object() else { return };
        let kind = map.get("kind").and_then(Value::as_str).or(inherited_kind);
        match kind {
            Some(k) if depth < 10 && (k == "List" || k.ends_with("List")) => {
                let item_kind = k.strip_suffix("List").filter(|k| !k.is_empty());
                for item in map
                    .get("items")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    walk(item, item_kind, depth + 1, out);
                }
            }
            Some(k) => {
                let mut object = v.clone();
                object["kind"] = Value::String(k.to_string());
                out.push(object);
            }
            None => {}
        }
    }
    let mut out = Vec::new();
    for d in docs {
        walk(d, None, 0, &mut out);
    }
    out
}

fn written_identity(o: &Value) -> Option<(PolicyKind, &str, &str)> {
    let kind = match o.get("kind")?.as_str()? {
        "NetworkPolicy" => PolicyKind::NetworkPolicy,
        "DanmNetworkPolicy" => PolicyKind::DanmNetworkPolicy,
        "MultiNetworkPolicy" => PolicyKind::MultiNetworkPolicy,
        _ => return None,
    };
    let meta = o.get("metadata")?;
    let name = meta.get("name")?.as_str()?;
    let namespace = match meta.get("namespace") {
        None | Some(Value::Null) => "default",
        Some(Value::String(s)) if s.is_empty() => "default",
        Some(v) => v.as_str()?,
    };
    Some((kind, namespace, name))
}

/// A written field, `null` counting as absent.
fn field<'v>(v: &'v Value, key: &str) -> Option<&'v Value> {
    v.get(key).filter(|x| !x.is_null())
}

/// Whether `policy` is at most as wide as the written document says; the reason if not.
fn not_wider(policy: &Policy, written: &Value) -> Result<(), String> {
    let spec = field(written, "spec").cloned().unwrap_or(Value::Null);
    let types: Vec<&str> = field(&spec, "policyTypes")
        .and_then(Value::as_array)
        .map(|l| l.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let written_egress_rules = field(&spec, "egress")
        .and_then(Value::as_array)
        .is_some_and(|l| !l.is_empty());
    if (types.contains(&"Ingress") || types.is_empty()) && policy.ingress.is_none() {
        return Err("ingress isolation lost".into());
    }
    if (types.contains(&"Egress") || (types.is_empty() && written_egress_rules))
        && policy.egress.is_none()
    {
        return Err("egress isolation lost".into());
    }
    // A selector that cannot be read widens to the whole namespace only in the fail-closed
    // form (SPEC 7): isolating more pods while allowing nothing opens nothing.
    let allows_nothing = [&policy.ingress, &policy.egress]
        .into_iter()
        .all(|rules| rules.as_ref().is_none_or(Vec::is_empty));
    if field(&spec, "podSelector").is_some_and(selector_written_non_empty)
        && policy.pod_selector == LabelSelector::everything()
        && !allows_nothing
    {
        return Err("podSelector widened to all pods".into());
    }
    for (dir, peers_key, rules) in [
        ("ingress", "from", &policy.ingress),
        ("egress", "to", &policy.egress),
    ] {
        let written_rules: Vec<Value> = field(&spec, dir)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        check_rules(
            rules.as_deref().unwrap_or_default(),
            &written_rules,
            peers_key,
        )?;
    }
    if let PolicyScope::Networks(nets) = &policy.scope {
        let written_for = field(written, "metadata")
            .and_then(|m| field(m, "annotations"))
            .and_then(|a| field(a, crate::POLICY_FOR))
            .and_then(Value::as_str)
            .unwrap_or_default();
        for net in nets {
            let NetworkId::Named { name, .. } = net else {
                return Err("a MultiNetworkPolicy scoped to the primary network".into());
            };
            if !written_for.contains(name.as_str()) {
                return Err(format!("network {net} is not in policy-for"));
            }
        }
    }
    Ok(())
}

fn selector_written_non_empty(sel: &Value) -> bool {
    let non_empty = |k: &str| match field(sel, k) {
        Some(Value::Object(m)) => !m.is_empty(),
        Some(Value::Array(l)) => !l.is_empty(),
        Some(_) => true,
        None => false,
    };
    !sel.is_object() || non_empty("matchLabels") || non_empty("matchExpressions")
}

/// Loaded rules are written rules, in order, some dropped; none lost its peers or ports, and
/// every ipBlock kept its excepts.
fn check_rules(loaded: &[PolicyRule], written: &[Value], peers_key: &str) -> Result<(), String> {
    let mut next = 0;
    for rule in loaded {
        match (next..written.len()).find(|&i| rule_fits(rule, &written[i], peers_key)) {
            Some(i) => next = i + 1,
            None => return Err(format!("rule {rule:?} is wider than any written one")),
        }
    }
    Ok(())
}

fn list_len(rule: &Value, key: &str) -> Option<usize> {
    match field(rule, key) {
        None => Some(0),
        Some(Value::Array(l)) => Some(l.len()),
        Some(_) => None,
    }
}

fn rule_fits(rule: &PolicyRule, written: &Value, peers_key: &str) -> bool {
    let written = if written.is_null() {
        &Value::Object(Default::default())
    } else {
        written
    };
    let (Some(peers), Some(ports)) = (list_len(written, peers_key), list_len(written, "ports"))
    else {
        return false;
    };
    let peers_ok = (rule.peers.is_empty() == (peers == 0)) && rule.peers.len() <= peers;
    let ports_ok = (rule.ports.is_empty() == (ports == 0)) && rule.ports.len() <= ports;
    let blocks_ok = rule.peers.iter().all(|p| match p {
        Peer::IpBlock(b) => written_blocks(written, peers_key)
            .iter()
            .any(|(cidr, excepts)| *cidr == b.cidr && *excepts == b.except.len()),
        Peer::Pods { .. } => true,
    });
    peers_ok && ports_ok && blocks_ok
}

/// (cidr as read, number of excepts) of the rule's written ipBlocks.
fn written_blocks(rule: &Value, peers_key: &str) -> Vec<(IpNet, usize)> {
    field(rule, peers_key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|peer| {
            let block = field(peer, "ipBlock")?;
            let cidr: IpNet = field(block, "cidr")?.as_str()?.trim().parse().ok()?;
            let excepts = field(block, "except")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            Some((cidr.trunc(), excepts))
        })
        .collect()
}
