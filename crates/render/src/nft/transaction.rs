//! nftables transactions as typed values, printed only at the edge.
//!
//! A [`Transaction`] is a list of [`Command`]s borrowing the [`Table`] (and the names the
//! dataplane's planner decides to delete). It is printed two ways from the same value:
//!
//! - [`Transaction::to_text`]: nft syntax, for people (`netwarden render`, golden tests);
//! - [`Transaction::to_json`]: the libnftables JSON schema, what the dataplane applies. JSON
//!   strings carry any interface name exactly (nft syntax has no escape for `"`), and the whole
//!   transaction is one buffer, committed as one netlink batch or not at all.
//!
//! Both printers spell an interface name's trailing `*` as `\*`, since nft reads a bare trailing
//! `*` as a wildcard; names nft cannot spell exactly never get here
//! ([`ifname_match_error`](super::ifname_match_error) refuses them when the table is built).

use std::fmt::Write as _;

use serde_json::{json, Value};

use netwarden_engine::Family;

use super::{
    AddrEnd, AddrSetDef, Chain, CtMatch, IfBy, LearnKey, LearnSetDef, LimitDef, Match, Rule,
    SetElement, Stmt, Table, Verdict, TABLE_FAMILY, TABLE_NAME,
};
use crate::logkey::log_prefix;

/// One nft command on table `inet netwarden`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<'t> {
    /// `add table` (idempotent).
    AddTable,
    /// `delete table`.
    DeleteTable,
    /// `add limit`.
    AddLimit(&'t LimitDef),
    /// `add set` (idempotent for a set of the same type).
    AddSet(&'t AddrSetDef),
    /// `add element` with every element of the set.
    AddElements(&'t AddrSetDef),
    /// `add set` of a learn set (idempotent: its name is its parameters; never filled here,
    /// the kernel's rules fill it).
    AddLearnSet(&'t LearnSetDef),
    /// `add counter NAME` (idempotent; keeps its value).
    AddCounter(&'t str),
    /// `add chain` (idempotent); a base chain with its hook.
    AddChain(&'t Chain),
    /// `flush chain NAME`.
    FlushChain(&'t str),
    /// `add rule CHAIN …`.
    AddRule { chain: &'t str, rule: &'t Rule },
    /// `delete chain NAME` (must be empty and unreferenced).
    DeleteChain(&'t str),
    /// `delete set NAME` (no rule may reference it).
    DeleteSet(&'t str),
}

/// An ordered list of commands, applied as one batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transaction<'t> {
    pub commands: Vec<Command<'t>>,
}

impl<'t> Transaction<'t> {
    /// Brings an empty netns (or one holding an older version of the table) to `table`:
    /// declarations first (so a `jump` never names a chain not yet declared), then each chain
    /// flushed and refilled.
    pub fn create(table: &'t Table) -> Transaction<'t> {
        let mut t = Transaction::default();
        t.declare(table, |_| true);
        t.refill_chains(table);
        t
    }

    /// Removes the table whether it exists or not: an empty declaration then its deletion.
    pub fn removal() -> Transaction<'t> {
        Transaction {
            commands: vec![Command::AddTable, Command::DeleteTable],
        }
    }

    /// Whether this only removes the table.
    pub fn is_removal(&self) -> bool {
        self.commands.last() == Some(&Command::DeleteTable)
    }

    /// `add table` then every set of `sets`, declared and filled.
    pub fn add_sets(&mut self, sets: impl IntoIterator<Item = &'t AddrSetDef>) {
        self.commands.push(Command::AddTable);
        for set in sets {
            self.commands.push(Command::AddSet(set));
            self.commands.push(Command::AddElements(set));
        }
    }

    /// `add table`, the limits, every learn set and counter (nothing to fill), the sets for
    /// which `send_set` says so (with their elements), and every chain.
    pub fn declare(&mut self, table: &'t Table, send_set: impl Fn(&AddrSetDef) -> bool) {
        self.declare_some(table, send_set, |_| true);
    }

    /// [`Transaction::declare`], with only the learn sets `send_learn_set` names.
    ///
    /// A learn set must not be declared again once the kernel holds it: nft's JSON parser
    /// (1.0.6) has no `dynamic` flag, nft adds it itself when a rule of the batch updates the
    /// set, and the kernel refuses a declaration of an existing set whose flags differ
    /// (`EEXIST`). The planner therefore sends only the learn sets the kernel lacks.
    pub fn declare_some(
        &mut self,
        table: &'t Table,
        send_set: impl Fn(&AddrSetDef) -> bool,
        send_learn_set: impl Fn(&LearnSetDef) -> bool,
    ) {
        self.commands.push(Command::AddTable);
        self.commands
            .extend(table.limits.iter().map(Command::AddLimit));
        self.commands.extend(
            table
                .learn_sets
                .iter()
                .filter(|s| send_learn_set(s))
                .map(Command::AddLearnSet),
        );
        self.commands
            .extend(table.counters.iter().map(|c| Command::AddCounter(c)));
        for set in table.sets.iter().filter(|s| send_set(s)) {
            self.commands.push(Command::AddSet(set));
            self.commands.push(Command::AddElements(set));
        }
        self.commands
            .extend(table.chains.iter().map(Command::AddChain));
    }

    /// Every chain of `table` flushed and refilled with its rules.
    pub fn refill_chains(&mut self, table: &'t Table) {
        for chain in &table.chains {
            self.commands.push(Command::FlushChain(&chain.name));
            self.commands
                .extend(chain.rules.iter().map(|rule| Command::AddRule {
                    chain: &chain.name,
                    rule,
                }));
        }
    }

    /// nft syntax, one command per line.
    pub fn to_text(&self) -> String {
        self.to_text_in(TABLE_NAME)
    }

    /// [`Transaction::to_text`] on the table named `table` (see [`super::fallback_table_name`]).
    pub fn to_text_in(&self, table: &str) -> String {
        let t = format!("{TABLE_FAMILY} {table}");
        let mut out = String::new();
        for c in &self.commands {
            let _ = match c {
                Command::AddTable => writeln!(out, "add table {t}"),
                Command::DeleteTable => writeln!(out, "delete table {t}"),
                Command::AddLimit(l) => writeln!(
                    out,
                    "add limit {t} {} {{ rate {}/minute burst {} packets }}",
                    l.name, l.per_minute, l.burst
                ),
                Command::AddSet(s) => writeln!(
                    out,
                    "add set {t} {} {{ type {}; flags interval; }}",
                    s.name,
                    set_type(s.family)
                ),
                Command::AddElements(s) => {
                    let elements: Vec<String> = s.elements().map(|e| e.to_string()).collect();
                    writeln!(
                        out,
                        "add element {t} {} {{ {} }}",
                        s.name,
                        elements.join(", ")
                    )
                }
                Command::AddLearnSet(s) => writeln!(
                    out,
                    "add set {t} {} {{ type {}; flags dynamic,timeout; timeout {}s; size {}; }}",
                    s.name,
                    learn_set_type(s.family).join(" . "),
                    s.timeout_secs,
                    s.size
                ),
                Command::AddCounter(name) => writeln!(out, "add counter {t} {name}"),
                Command::AddChain(chain) => match chain.hook {
                    Some(hook) => writeln!(
                        out,
                        "add chain {t} {} {{ type filter hook {} priority filter; policy accept; }}",
                        chain.name,
                        hook.as_str()
                    ),
                    None => writeln!(out, "add chain {t} {}", chain.name),
                },
                Command::FlushChain(name) => writeln!(out, "flush chain {t} {name}"),
                Command::AddRule { chain, rule } => {
                    writeln!(out, "add rule {t} {chain} {}", rule_text(rule))
                }
                Command::DeleteChain(name) => writeln!(out, "delete chain {t} {name}"),
                Command::DeleteSet(name) => writeln!(out, "delete set {t} {name}"),
            };
        }
        out
    }

    /// The libnftables JSON document (`{"nftables": [...]}`).
    pub fn to_json(&self) -> String {
        self.to_json_in(TABLE_NAME)
    }

    /// [`Transaction::to_json`] on the table named `table` (see [`super::fallback_table_name`]).
    pub fn to_json_in(&self, table: &str) -> String {
        let commands: Vec<Value> = self
            .commands
            .iter()
            .map(|c| command_json(c, table))
            .collect();
        json!({ "nftables": commands }).to_string()
    }
}

/// The key type of a learn set: interface, peer address, protocol, destination port.
fn learn_set_type(family: Family) -> [&'static str; 4] {
    ["ifname", set_type(family), "inet_proto", "inet_service"]
}

/// The learn key as nft text: `iifname . ip saddr . meta l4proto . th dport`.
fn learn_key_text(k: &LearnKey) -> String {
    format!(
        "{} . {} {} . meta l4proto . th dport",
        ifname_keyword(k.by()),
        addr_keyword(k.family),
        end_keyword(k.end())
    )
}

/// The learn key as a libnftables JSON concatenation.
fn learn_key_json(k: &LearnKey) -> Value {
    json!({ "concat": [
        meta(ifname_keyword(k.by())),
        payload(addr_keyword(k.family), end_keyword(k.end())),
        meta("l4proto"),
        payload("th", "dport"),
    ] })
}

fn set_type(family: Family) -> &'static str {
    match family {
        Family::Ipv4 => "ipv4_addr",
        Family::Ipv6 => "ipv6_addr",
    }
}

/// An interface name as nft must see it to match exactly: a trailing `*` escaped.
fn exact_ifname(name: &str) -> String {
    match name.strip_suffix('*') {
        Some(stem) => format!("{stem}\\*"),
        None => name.to_string(),
    }
}

/// An interface name in nft syntax. nft strings have no escape for `"`: such a name is shown
/// with `\"` (people can read it; nft would not load it — the dataplane applies JSON).
fn quoted_ifname(name: &str) -> String {
    format!("\"{}\"", exact_ifname(name).replace('"', "\\\""))
}

fn addr_keyword(family: Family) -> &'static str {
    match family {
        Family::Ipv4 => "ip",
        Family::Ipv6 => "ip6",
    }
}

fn addr_family(addr: std::net::IpAddr) -> Family {
    match addr {
        std::net::IpAddr::V4(_) => Family::Ipv4,
        std::net::IpAddr::V6(_) => Family::Ipv6,
    }
}

fn end_keyword(end: AddrEnd) -> &'static str {
    match end {
        AddrEnd::Src => "saddr",
        AddrEnd::Dst => "daddr",
    }
}

fn ifname_keyword(by: IfBy) -> &'static str {
    match by {
        IfBy::In => "iifname",
        IfBy::Out => "oifname",
    }
}

fn match_text(m: &Match, out: &mut String) {
    let _ = match m {
        Match::IifLoopback => write!(out, "iifname \"lo\""),
        Match::OifLoopback => write!(out, "oifname \"lo\""),
        Match::Ct(CtMatch::EstablishedRelated) => write!(out, "ct state established,related"),
        Match::Ct(CtMatch::New) => write!(out, "ct state new"),
        Match::Icmpv6Nd(t) => write!(out, "icmpv6 type {}", t.as_str()),
        Match::L4Proto(p) => write!(out, "meta l4proto {}", p.lower()),
        Match::DPort(lo, hi) if lo == hi => write!(out, "th dport {lo}"),
        Match::DPort(lo, hi) => write!(out, "th dport {lo}-{hi}"),
        Match::IfName { by, name } => {
            write!(out, "{} {}", ifname_keyword(*by), quoted_ifname(name))
        }
        Match::AddrIs { end, addr } => write!(
            out,
            "{} {} {addr}",
            addr_keyword(addr_family(*addr)),
            end_keyword(*end)
        ),
        Match::Addr { family, end, set } => write!(
            out,
            "{} {} @{set}",
            addr_keyword(*family),
            end_keyword(*end)
        ),
        Match::Mark { mask, value } => write!(out, "meta mark and {mask:#010x} == {value:#010x}"),
        Match::Limit(name) => write!(out, "limit name \"{name}\""),
        Match::NotLearned(k) => write!(out, "{} != @{}", learn_key_text(k), k.set),
    };
}

fn stmt_text(s: &Stmt, out: &mut String) {
    let _ = match s {
        Stmt::ClearMark(bits) => write!(out, "meta mark set meta mark and {:#010x}", !bits),
        Stmt::SetMark(bits) => write!(out, "meta mark set meta mark or {bits:#010x}"),
        Stmt::Log { group, action, key } => write!(
            out,
            "log group {group} prefix \"{}\"",
            log_prefix(*action, *key)
        ),
        Stmt::Learn(k) => write!(out, "add @{} {{ {} }}", k.set, learn_key_text(k)),
        Stmt::Counter(name) => write!(out, "counter name \"{name}\""),
    };
}

fn verdict_text(v: &Verdict, out: &mut String) {
    let _ = match v {
        Verdict::Continue => Ok(()),
        Verdict::Accept => write!(out, "accept"),
        Verdict::RejectTcpReset => write!(out, "reject with tcp reset"),
        Verdict::RejectPortUnreachable => write!(out, "reject with icmpx type port-unreachable"),
        Verdict::Jump(chain) => write!(out, "jump {chain}"),
        Verdict::Goto(chain) => write!(out, "goto {chain}"),
        Verdict::Return => write!(out, "return"),
    };
}

/// One rule in nft syntax (matches, statements, verdict).
pub fn rule_text(rule: &Rule) -> String {
    let mut out = String::new();
    let sep = |out: &mut String| {
        if !out.is_empty() {
            out.push(' ');
        }
    };
    for m in &rule.matches {
        sep(&mut out);
        match_text(m, &mut out);
    }
    for s in &rule.stmts {
        sep(&mut out);
        stmt_text(s, &mut out);
    }
    if rule.verdict != Verdict::Continue {
        sep(&mut out);
        verdict_text(&rule.verdict, &mut out);
    }
    out
}

fn object(kind: &str, table: &str, fields: Value) -> Value {
    let mut body = json!({ "family": TABLE_FAMILY, "table": table });
    if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), fields) {
        b.extend(extra);
    }
    json!({ kind: body })
}

fn table_object(table: &str) -> Value {
    json!({ "table": { "family": TABLE_FAMILY, "name": table } })
}

fn element_json(e: SetElement) -> Value {
    match e {
        SetElement::Addr(a) => json!(a.to_string()),
        SetElement::Prefix(a, len) => json!({ "prefix": { "addr": a.to_string(), "len": len } }),
        SetElement::Range(lo, hi) => json!({ "range": [lo.to_string(), hi.to_string()] }),
    }
}

fn command_json(c: &Command<'_>, table: &str) -> Value {
    match c {
        Command::AddTable => json!({ "add": table_object(table) }),
        Command::DeleteTable => json!({ "delete": table_object(table) }),
        Command::AddLimit(l) => json!({ "add": object("limit", table, json!({
            "name": l.name, "rate": l.per_minute, "per": "minute", "burst": l.burst,
        })) }),
        Command::AddSet(s) => json!({ "add": object("set", table, json!({
            "name": s.name, "type": set_type(s.family), "flags": ["interval"],
        })) }),
        Command::AddElements(s) => {
            let elem: Vec<Value> = s.elements().map(element_json).collect();
            json!({ "add": object("element", table, json!({ "name": s.name, "elem": elem })) })
        }
        // No "dynamic": see `declare_some` (nft adds it for the rules that update the set).
        Command::AddLearnSet(s) => json!({ "add": object("set", table, json!({
            "name": s.name, "type": learn_set_type(s.family), "flags": ["timeout"],
            "timeout": s.timeout_secs, "size": s.size,
        })) }),
        Command::AddCounter(name) => {
            json!({ "add": object("counter", table, json!({ "name": name })) })
        }
        Command::AddChain(chain) => {
            let fields = match chain.hook {
                Some(hook) => json!({
                    "name": chain.name, "type": "filter", "hook": hook.as_str(),
                    "prio": 0, "policy": "accept",
                }),
                None => json!({ "name": chain.name }),
            };
            json!({ "add": object("chain", table, fields) })
        }
        Command::FlushChain(name) => {
            json!({ "flush": object("chain", table, json!({ "name": name })) })
        }
        Command::AddRule { chain, rule } => json!({ "add": object("rule", table, json!({
            "chain": chain, "expr": rule_json(rule),
        })) }),
        Command::DeleteChain(name) => {
            json!({ "delete": object("chain", table, json!({ "name": name })) })
        }
        Command::DeleteSet(name) => {
            json!({ "delete": object("set", table, json!({ "name": name })) })
        }
    }
}

fn equals(left: Value, right: Value) -> Value {
    json!({ "match": { "op": "==", "left": left, "right": right } })
}

fn meta(key: &str) -> Value {
    json!({ "meta": { "key": key } })
}

fn payload(protocol: &str, field: &str) -> Value {
    json!({ "payload": { "protocol": protocol, "field": field } })
}

fn mark_set(op: &str, operand: u32) -> Value {
    json!({ "mangle": { "key": meta("mark"), "value": { op: [meta("mark"), operand] } } })
}

/// One rule's expressions in the libnftables JSON schema (each the counterpart of the text
/// printer's spelling, so both load as the same kernel rule).
pub fn rule_json(rule: &Rule) -> Vec<Value> {
    let mut expr = Vec::new();
    for m in &rule.matches {
        expr.push(match m {
            Match::IifLoopback => equals(meta("iifname"), json!("lo")),
            Match::OifLoopback => equals(meta("oifname"), json!("lo")),
            Match::Ct(CtMatch::EstablishedRelated) => json!({ "match": {
                "op": "in", "left": { "ct": { "key": "state" } },
                "right": ["established", "related"],
            } }),
            Match::Ct(CtMatch::New) => json!({ "match": {
                "op": "in", "left": { "ct": { "key": "state" } }, "right": "new",
            } }),
            Match::Icmpv6Nd(t) => equals(payload("icmpv6", "type"), json!(t.as_str())),
            Match::L4Proto(p) => equals(meta("l4proto"), json!(p.lower())),
            Match::DPort(lo, hi) if lo == hi => equals(payload("th", "dport"), json!(lo)),
            Match::DPort(lo, hi) => equals(payload("th", "dport"), json!({ "range": [lo, hi] })),
            Match::IfName { by, name } => {
                equals(meta(ifname_keyword(*by)), json!(exact_ifname(name)))
            }
            Match::AddrIs { end, addr } => equals(
                payload(addr_keyword(addr_family(*addr)), end_keyword(*end)),
                json!(addr.to_string()),
            ),
            Match::Addr { family, end, set } => equals(
                payload(addr_keyword(*family), end_keyword(*end)),
                json!(format!("@{set}")),
            ),
            Match::Mark { mask, value } => {
                equals(json!({ "&": [meta("mark"), mask] }), json!(value))
            }
            Match::Limit(name) => json!({ "limit": name }),
            Match::NotLearned(k) => json!({ "match": {
                "op": "!=", "left": learn_key_json(k), "right": format!("@{}", k.set),
            } }),
        });
    }
    for s in &rule.stmts {
        expr.push(match s {
            Stmt::ClearMark(bits) => mark_set("&", !bits),
            Stmt::SetMark(bits) => mark_set("|", *bits),
            Stmt::Log { group, action, key } => json!({ "log": {
                "prefix": log_prefix(*action, *key), "group": group,
            } }),
            Stmt::Learn(k) => json!({ "set": {
                "op": "add", "elem": learn_key_json(k), "set": format!("@{}", k.set),
            } }),
            Stmt::Counter(name) => json!({ "counter": name }),
        });
    }
    match &rule.verdict {
        Verdict::Continue => {}
        Verdict::Accept => expr.push(json!({ "accept": null })),
        Verdict::RejectTcpReset => expr.push(json!({ "reject": { "type": "tcp reset" } })),
        Verdict::RejectPortUnreachable => expr.push(json!({ "reject": {
            "type": "icmpx", "expr": "port-unreachable",
        } })),
        Verdict::Jump(chain) => expr.push(json!({ "jump": { "target": chain } })),
        Verdict::Goto(chain) => expr.push(json!({ "goto": { "target": chain } })),
        Verdict::Return => expr.push(json!({ "return": null })),
    }
    expr
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::{Hook, NdType};
    use netwarden_engine::Protocol;

    fn table() -> Table {
        let rule = Rule {
            matches: vec![
                Match::IfName {
                    by: IfBy::In,
                    name: "a\"b;+*".into(),
                },
                Match::L4Proto(Protocol::Tcp),
                Match::DPort(80, 90),
            ],
            stmts: vec![Stmt::SetMark(0x40000)],
            verdict: Verdict::Jump("in_0".into()),
            origin: None,
        };
        Table {
            limits: vec![],
            learn_sets: vec![],
            counters: vec![],
            sets: vec![AddrSetDef {
                name: "p4_x".into(),
                family: Family::Ipv4,
                ranges: vec![(1, 1), (256, 511), (1024, 1030)],
            }],
            chains: vec![
                Chain {
                    name: "input".into(),
                    hook: Some(Hook::Input),
                    rules: vec![
                        Rule {
                            matches: vec![Match::Icmpv6Nd(NdType::NeighborSolicit)],
                            stmts: vec![],
                            verdict: Verdict::Accept,
                            origin: None,
                        },
                        rule,
                    ],
                },
                Chain {
                    name: "in_0".into(),
                    hook: None,
                    rules: vec![],
                },
            ],
        }
    }

    #[test]
    fn a_transaction_renders_on_another_table_name_alike() {
        let name = crate::nft::fallback_table_name(0xfeed);
        assert_eq!(name, "netwarden_000000000000feed");
        assert!(crate::nft::is_netwarden_table_name(&name));
        for other in [
            "netwarden",
            "netwarden_x",
            "netwarden_000000000000feedx",
            "mine",
        ] {
            assert_eq!(
                crate::nft::is_netwarden_table_name(other),
                other == "netwarden",
                "{other}"
            );
        }
        let tx = Transaction::removal();
        assert_eq!(
            tx.to_text_in(&name),
            format!("add table inet {name}\ndelete table inet {name}\n")
        );
        let json: Value = serde_json::from_str(&tx.to_json_in(&name)).unwrap();
        assert_eq!(
            json["nftables"][1]["delete"]["table"]["name"],
            name.as_str()
        );
        assert_eq!(tx.to_json(), tx.to_json_in(TABLE_NAME));
    }

    #[test]
    fn text_and_json_spell_names_and_elements() {
        let t = table();
        let tx = Transaction::create(&t);
        let text = tx.to_text();
        assert!(
            text.contains(
                "add element inet netwarden p4_x { 0.0.0.1, 0.0.1.0/24, 0.0.4.0-0.0.4.6 }"
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"iifname "a\"b;+\*" meta l4proto tcp th dport 80-90"#),
            "{text}"
        );
        let json: Value = serde_json::from_str(&tx.to_json()).unwrap();
        let cmds = json["nftables"].as_array().unwrap();
        assert_eq!(cmds.len(), tx.commands.len());
        let rule = cmds
            .iter()
            .find_map(|c| c["add"]["rule"]["expr"].as_array().filter(|e| e.len() == 5))
            .expect("the dispatch rule");
        // JSON carries the quote as it is; only the wildcard star is escaped.
        assert_eq!(rule[0]["match"]["right"], json!("a\"b;+\\*"));
        assert_eq!(rule[2]["match"]["right"], json!({ "range": [80, 90] }));
        let elem = cmds
            .iter()
            .find_map(|c| c["add"]["element"]["elem"].as_array())
            .unwrap();
        assert_eq!(elem[0], json!("0.0.0.1"));
        assert_eq!(
            elem[1],
            json!({ "prefix": { "addr": "0.0.1.0", "len": 24 } })
        );
        assert_eq!(elem[2], json!({ "range": ["0.0.4.0", "0.0.4.6"] }));
    }

    #[test]
    fn removal_is_declare_then_delete() {
        let r = Transaction::removal();
        assert!(r.is_removal());
        assert_eq!(
            r.to_text(),
            "add table inet netwarden\ndelete table inet netwarden\n"
        );
        assert!(!Transaction::create(&table()).is_removal());
    }
}
