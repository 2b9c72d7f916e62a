//! Comparing table `inet netwarden` as the kernel lists it with the [`Table`] the dataplane
//! applied (tamper repair, SPEC 5). Pure: the listings come in as libnftables JSON.
//!
//! - Objects and rules come from the terse `list ruleset` (no set elements: cheap at any set
//!   size): every chain with its hook, type, priority and policy, every rule's expressions in
//!   order, every set's declaration, every counter and limit.
//! - Elements come from `list set` of one set at a time, only for the sets asked for.
//!
//! The rules are compared as expressions, not text. libnftables prints one thing differently
//! from how the renderer writes it: `meta l4proto tcp` followed by `th dport …` (what
//! netwarden sends: one port match for every protocol) comes back as `tcp dport …` — the same
//! kernel expressions, which the printer folds into the protocol's own header. The expected
//! side is brought to the printed form ([`listed_form`]); everything else is printed as
//! written. A root test applies random tables and checks that each verifies clean
//! (`tests/nft_tamper_root.rs`), so a printer difference not covered here shows as a test
//! failure, not as a false tamper report in production.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use netwarden_engine::Family;
use netwarden_render::nft::transaction::rule_json;
use netwarden_render::nft::{AddrSetDef, Table, TABLE_FAMILY};

use crate::tamper::{Difference, Part};

/// The table as listed: each object kind by name.
#[derive(Debug, Default)]
struct Listed {
    table: bool,
    chains: BTreeMap<String, Value>,
    rules: BTreeMap<String, Vec<Value>>,
    sets: BTreeMap<String, Value>,
    objects: BTreeMap<String, Value>,
}

fn ours(item: &Value, name: &str) -> bool {
    item["family"] == TABLE_FAMILY && item["table"] == name
}

/// What table `inet NAME` of a listing holds.
fn listed(json: &str, table_name: &str) -> Result<Listed, serde_json::Error> {
    let listing: Value = serde_json::from_str(json)?;
    let mut out = Listed::default();
    let items = listing["nftables"].as_array().cloned().unwrap_or_default();
    for item in items {
        let Some((kind, body)) = item.as_object().and_then(|o| o.iter().next()) else {
            continue;
        };
        let name = body["name"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "table" if body["family"] == TABLE_FAMILY && body["name"] == table_name => {
                out.table = true
            }
            "chain" if ours(body, table_name) => {
                out.chains.insert(name, body.clone());
            }
            "rule" if ours(body, table_name) => {
                let chain = body["chain"].as_str().unwrap_or_default().to_string();
                out.rules
                    .entry(chain)
                    .or_default()
                    .push(body["expr"].clone());
            }
            "set" if ours(body, table_name) => {
                out.sets.insert(name, body.clone());
            }
            "counter" | "limit" if ours(body, table_name) => {
                out.objects.insert(format!("{kind} {name}"), body.clone());
            }
            // Anything else named in our table (a map, a quota, a flowtable, …) is not ours.
            _ if ours(body, table_name) => {
                out.objects.insert(format!("{kind} {name}"), body.clone());
            }
            _ => {}
        }
    }
    Ok(out)
}

/// A rule's expressions as libnftables prints them back (see the module doc): a
/// `meta l4proto P` match followed, in the same rule, by `th` payload expressions becomes those
/// expressions on protocol `P`, without the protocol match.
pub fn listed_form(exprs: Vec<Value>) -> Vec<Value> {
    let is_proto = |e: &Value| {
        let m = &e["match"];
        m["left"]["meta"]["key"] == "l4proto" && m["op"] == "==" && m["right"].is_string()
    };
    let Some(proto) = exprs
        .iter()
        .find(|e| is_proto(e))
        .map(|e| e["match"]["right"].clone())
    else {
        return exprs;
    };
    fn uses_th(v: &Value) -> bool {
        match v {
            Value::Object(o) => {
                o.get("payload").is_some_and(|p| p["protocol"] == "th") || o.values().any(uses_th)
            }
            Value::Array(a) => a.iter().any(uses_th),
            _ => false,
        }
    }
    fn rewrite(v: &mut Value, proto: &Value) {
        match v {
            Value::Object(o) => {
                if let Some(p) = o.get_mut("payload") {
                    if p["protocol"] == "th" {
                        p["protocol"] = proto.clone();
                    }
                }
                o.values_mut().for_each(|v| rewrite(v, proto));
            }
            Value::Array(a) => a.iter_mut().for_each(|v| rewrite(v, proto)),
            _ => {}
        }
    }
    if !exprs.iter().any(uses_th) {
        return exprs;
    }
    exprs
        .into_iter()
        .filter(|e| !is_proto(e))
        .map(|mut e| {
            rewrite(&mut e, &proto);
            e
        })
        .collect()
}

/// What differs between `table` (what was applied as `inet NAME`; `None`: nothing) and the terse ruleset
/// listing `json` (`list ruleset`, JSON, terse), set elements aside. `kept`: the sets the
/// dataplane knowingly left in the kernel beside `table`'s (an earlier apply's, which rules may
/// still walk, collected at the next apply; see `nft_plan`): not differences.
pub fn rule_differences(
    table: Option<&Table>,
    name: &str,
    kept: &BTreeSet<String>,
    json: &str,
) -> Result<Vec<Difference>, serde_json::Error> {
    let kernel = listed(json, name)?;
    let mut out = Vec::new();
    let Some(table) = table else {
        // Nothing applied: netwarden owns nothing here (a table of that name made by someone
        // else only restricts the pod; it is not ours to judge).
        return Ok(out);
    };
    if !kernel.table {
        out.push(Difference::Missing(Part::Table));
        return Ok(out);
    }
    // Chains: names, and a base chain's hook, type, priority and policy.
    for chain in &table.chains {
        let Some(listed) = kernel.chains.get(&chain.name) else {
            out.push(Difference::Missing(Part::Chain(chain.name.clone())));
            continue;
        };
        let same_head = match chain.hook {
            Some(hook) => {
                listed["hook"] == hook.as_str()
                    && listed["type"] == "filter"
                    && listed["prio"] == 0
                    && listed["policy"] == "accept"
            }
            None => listed.get("hook").is_none(),
        };
        if !same_head {
            out.push(Difference::Changed(Part::Chain(chain.name.clone())));
        }
        let expected: Vec<Value> = chain
            .rules
            .iter()
            .map(|r| Value::Array(listed_form(rule_json(r))))
            .collect();
        let found = kernel.rules.get(&chain.name).cloned().unwrap_or_default();
        if found != expected {
            out.push(Difference::Changed(Part::Rules(chain.name.clone())));
        }
    }
    let chains: BTreeSet<&str> = table.chains.iter().map(|c| c.name.as_str()).collect();
    for name in kernel.chains.keys() {
        if !chains.contains(name.as_str()) {
            out.push(Difference::Extra(Part::Chain(name.clone())));
        }
    }
    // Sets: every peer set with its type and flags, every learn set by name and type.
    let mut sets: BTreeSet<&str> = BTreeSet::new();
    for set in &table.sets {
        sets.insert(&set.name);
        match kernel.sets.get(&set.name) {
            None => out.push(Difference::Missing(Part::Set(set.name.clone()))),
            Some(listed) => {
                if listed["type"] != set_type(set.family)
                    || listed["flags"] != serde_json::json!(["interval"])
                {
                    out.push(Difference::Changed(Part::Set(set.name.clone())));
                }
            }
        }
    }
    for set in &table.learn_sets {
        sets.insert(&set.name);
        if !kernel.sets.contains_key(&set.name) {
            out.push(Difference::Missing(Part::Set(set.name.clone())));
        }
    }
    for name in kernel.sets.keys() {
        if !sets.contains(name.as_str()) && !kept.contains(name) {
            out.push(Difference::Extra(Part::Set(name.clone())));
        }
    }
    // Counters and limits, by name (a counter's value is the kernel's, not compared).
    for limit in &table.limits {
        let key = format!("limit {}", limit.name);
        match kernel.objects.get(&key) {
            Some(l)
                if l["rate"] == limit.per_minute
                    && l["per"] == "minute"
                    && l["burst"] == limit.burst => {}
            Some(_) => out.push(Difference::Changed(Part::Object(key.clone()))),
            None => out.push(Difference::Missing(Part::Object(key))),
        }
    }
    for name in &table.counters {
        let key = format!("counter {name}");
        if !kernel.objects.contains_key(&key) {
            out.push(Difference::Missing(Part::Object(key)));
        }
    }
    // Counters and limits beyond the table's are not compared: in-place applies add them and
    // never delete them (an earlier apply's stay until the table is created again), and one
    // no rule names does nothing (rules are compared exactly, above).
    Ok(out)
}

fn set_type(family: Family) -> &'static str {
    match family {
        Family::Ipv4 => "ipv4_addr",
        Family::Ipv6 => "ipv6_addr",
    }
}

/// Whether the elements `json` (a `list set` listing of `set` in table `inet NAME`, JSON) holds
/// are exactly the set's ranges. An element that cannot be read counts as a difference.
pub fn elements_differ(
    set: &AddrSetDef,
    name: &str,
    json: &str,
) -> Result<bool, serde_json::Error> {
    let listing: Value = serde_json::from_str(json)?;
    let items = listing["nftables"].as_array().cloned().unwrap_or_default();
    let Some(body) = items
        .iter()
        .filter_map(|i| i.get("set"))
        .find(|s| ours(s, name) && s["name"] == set.name.as_str())
    else {
        return Ok(true);
    };
    let elements = body["elem"].as_array().cloned().unwrap_or_default();
    let mut ranges = Vec::with_capacity(elements.len());
    for e in &elements {
        match element_range(set.family, e) {
            Some(r) => ranges.push(r),
            None => return Ok(true),
        }
    }
    Ok(merge(ranges) != merge(set.ranges.clone()))
}

/// One listed element as an inclusive range: an address, `{"prefix": …}` or `{"range": …}`.
fn element_range(family: Family, e: &Value) -> Option<(u128, u128)> {
    let addr = |v: &Value| -> Option<u128> {
        let ip: std::net::IpAddr = v.as_str()?.parse().ok()?;
        match (family, ip) {
            (Family::Ipv4, std::net::IpAddr::V4(a)) => Some(u128::from(u32::from(a))),
            (Family::Ipv6, std::net::IpAddr::V6(a)) => Some(u128::from(a)),
            _ => None,
        }
    };
    let bits: u32 = match family {
        Family::Ipv4 => 32,
        Family::Ipv6 => 128,
    };
    if let Some(prefix) = e.get("prefix") {
        let lo = addr(&prefix["addr"])?;
        let len = u32::try_from(prefix["len"].as_u64()?).ok()?;
        if len > bits {
            return None;
        }
        let host = bits - len;
        let span = if host == 128 {
            u128::MAX
        } else {
            (1u128 << host) - 1
        };
        return Some((lo & !span, lo | span));
    }
    if let Some(range) = e.get("range") {
        return Some((addr(&range[0])?, addr(&range[1])?));
    }
    let a = addr(e)?;
    Some((a, a))
}

/// Sorted, with overlapping and adjacent ranges joined.
fn merge(mut ranges: Vec<(u128, u128)>) -> Vec<(u128, u128)> {
    ranges.sort_unstable();
    let mut out: Vec<(u128, u128)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        if let Some(last) = out.last_mut() {
            if lo <= last.1.saturating_add(1) {
                last.1 = last.1.max(hi);
                continue;
            }
        }
        out.push((lo, hi));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_render::nft::TABLE_NAME;
    use serde_json::json;

    #[test]
    fn a_protocol_match_before_th_ports_is_folded_as_nft_prints_it() {
        let written = vec![
            json!({"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}}),
            json!({"match": {"op": "==", "left": {"payload": {"protocol": "th", "field": "dport"}}, "right": 80}}),
            json!({"accept": null}),
        ];
        assert_eq!(
            listed_form(written),
            vec![
                json!({"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 80}}),
                json!({"accept": null}),
            ]
        );
        // A protocol alone (all its ports) stays as it is.
        let alone = vec![
            json!({"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "udp"}}),
            json!({"accept": null}),
        ];
        assert_eq!(listed_form(alone.clone()), alone);
    }

    fn set(ranges: Vec<(u128, u128)>) -> AddrSetDef {
        AddrSetDef {
            name: "p4_x".into(),
            family: Family::Ipv4,
            ranges,
        }
    }

    fn listing(elem: Value) -> String {
        json!({"nftables": [
            {"metainfo": {"version": "1.0.6"}},
            {"set": {"family": "inet", "table": "netwarden", "name": "p4_x",
                     "type": "ipv4_addr", "flags": ["interval"], "elem": elem}}
        ]})
        .to_string()
    }

    #[test]
    fn elements_are_compared_as_ranges() {
        let ten = u128::from(u32::from(std::net::Ipv4Addr::new(10, 0, 0, 0)));
        let def = set(vec![(ten, ten + 255), (ten + 1000, ten + 1000)]);
        let same = listing(json!([
            {"prefix": {"addr": "10.0.0.0", "len": 25}},
            {"range": ["10.0.0.128", "10.0.0.255"]},
            "10.0.3.232"
        ]));
        assert!(!elements_differ(&def, TABLE_NAME, &same).unwrap());
        let one_more = listing(json!([
            {"prefix": {"addr": "10.0.0.0", "len": 24}},
            "10.0.3.232",
            "10.9.9.9"
        ]));
        assert!(elements_differ(&def, TABLE_NAME, &one_more).unwrap());
        let one_less = listing(json!([{"prefix": {"addr": "10.0.0.0", "len": 24}}]));
        assert!(elements_differ(&def, TABLE_NAME, &one_less).unwrap());
        let unreadable = listing(json!([{"elem": {"val": "10.0.0.1", "timeout": 5}}]));
        assert!(elements_differ(&def, TABLE_NAME, &unreadable).unwrap());
        let gone = json!({"nftables": []}).to_string();
        assert!(elements_differ(&def, TABLE_NAME, &gone).unwrap());
    }

    #[test]
    fn objects_of_our_table_only_are_judged() {
        let none = BTreeSet::new();
        let table = Table {
            chains: vec![netwarden_render::nft::Chain {
                name: "input".into(),
                hook: Some(netwarden_render::nft::Hook::Input),
                rules: vec![],
            }],
            ..Table::default()
        };
        let base = |policy: &str| {
            json!({"chain": {"family": "inet", "table": "netwarden", "name": "input",
                "type": "filter", "hook": "input", "prio": 0, "policy": policy}})
        };
        let clean = json!({"nftables": [
            {"table": {"family": "inet", "name": "netwarden"}},
            base("accept"),
            // The pod's own table is not ours.
            {"table": {"family": "inet", "name": "mine"}},
            {"chain": {"family": "inet", "table": "mine", "name": "input", "hook": "input"}},
            {"rule": {"family": "inet", "table": "mine", "chain": "input", "expr": [{"accept": null}]}},
        ]});
        assert_eq!(
            rule_differences(Some(&table), TABLE_NAME, &none, &clean.to_string()).unwrap(),
            vec![]
        );
        let tampered = json!({"nftables": [
            {"table": {"family": "inet", "name": "netwarden"}},
            base("drop"),
            {"rule": {"family": "inet", "table": "netwarden", "chain": "input", "expr": [{"accept": null}]}},
            {"chain": {"family": "inet", "table": "netwarden", "name": "sneaky"}},
            {"set": {"family": "inet", "table": "netwarden", "name": "mine", "type": "ipv4_addr"}},
        ]});
        assert_eq!(
            rule_differences(Some(&table), TABLE_NAME, &none, &tampered.to_string()).unwrap(),
            vec![
                Difference::Changed(Part::Chain("input".into())),
                Difference::Changed(Part::Rules("input".into())),
                Difference::Extra(Part::Chain("sneaky".into())),
                Difference::Extra(Part::Set("mine".into())),
            ]
        );
        let flushed = json!({"nftables": []}).to_string();
        assert_eq!(
            rule_differences(Some(&table), TABLE_NAME, &none, &flushed).unwrap(),
            vec![Difference::Missing(Part::Table)]
        );
        assert_eq!(
            rule_differences(None, TABLE_NAME, &none, &flushed).unwrap(),
            vec![]
        );
        // A set the dataplane kept from its last apply is not one.
        let kept_set = json!({"nftables": [
            {"table": {"family": "inet", "name": "netwarden"}},
            base("accept"),
            {"set": {"family": "inet", "table": "netwarden", "name": "p4_old", "type": "ipv4_addr"}},
            {"counter": {"family": "inet", "table": "netwarden", "name": "nw_cn_00000001"}},
        ]})
        .to_string();
        let kept: BTreeSet<String> = ["p4_old".to_string()].into();
        assert_eq!(
            rule_differences(Some(&table), TABLE_NAME, &kept, &kept_set).unwrap(),
            vec![]
        );
        assert_eq!(
            rule_differences(Some(&table), TABLE_NAME, &none, &kept_set).unwrap(),
            vec![Difference::Extra(Part::Set("p4_old".into()))]
        );
    }
}
