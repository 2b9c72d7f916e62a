//! The nftables renderer: one `nft -f` transaction per pod netns that atomically replaces table
//! `inet netwarden`.
//!
//! The rules are first built as a small intermediate representation ([`Table`] of [`Chain`]s of
//! [`Rule`]s, in the spirit of knftables), then printed. The [`tracer`](crate::tracer) walks the
//! same IR, so table-driven verdict tests exercise exactly what is printed.
//!
//! Layout of the table (only what a pod needs is emitted):
//!
//! ```text
//! input   (hook input)   lo, established/related, ICMPv6 ND → accept; iifname vmap → in_<n>
//! output  (hook output)  lo, established/related, ICMPv6 ND, DNS → accept; oifname vmap → out_<n>
//! forward (hook forward) reject everything (when an interface is enforced-isolated)
//! in_<n> / out_<n>       one chain per isolated (interface, direction):
//!   enforce only:  <allow clause> accept … [deny log] reject
//!   with monitor:  clear bits; <staged clause> mark|=STAGED …; <enforced clause> mark|=ALLOW …;
//!                  would-deny log when mark&(STAGED|ALLOW)==ALLOW;
//!                  mark&ALLOW==ALLOW → clear bits, accept; [deny log] reject
//! ```
//!
//! Peer addresses live in named interval sets (`p4_<n>`, `p6_<n>`) shared by every rule with
//! the same content, so the rule count does not grow with the number of peers. Chain, set and
//! limit names are generated; the only outside strings in the text are interface names (validated
//! as kernel ifnames at the edge) and they are always quoted.
//!
//! The first two lines (`table inet netwarden {}` + `delete table inet netwarden`) make the file
//! work whether the table exists or not: `nft -f` runs the whole file as one transaction, so the
//! old table is replaced atomically and a failure leaves it untouched.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr};

use netwarden_engine::{
    AddrSet, Clause, Direction, DirectionRules, Isolation, PeerMatch, PodRules, PortMatch,
    Protocol, RuleOrigin,
};

use crate::logkey::{assign_keys, log_prefix, LogAction, LogKey};
use crate::options::RenderOptions;

/// The table netwarden owns in every pod netns; nothing else is ever touched.
pub const TABLE_FAMILY: &str = "inet";
pub const TABLE_NAME: &str = "netwarden";

/// Address family of a set or an address match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

/// Which address of the packet is matched: the peer is the source on ingress, the destination
/// on egress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddrEnd {
    Src,
    Dst,
}

/// Conntrack states the rules test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtMatch {
    /// `ct state established,related`
    EstablishedRelated,
    /// `ct state new`
    New,
}

/// Which interface a base chain dispatches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IfBy {
    /// `iifname` (input)
    In,
    /// `oifname` (output)
    Out,
}

/// One condition of a rule; all of a rule's matches must hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Match {
    /// `iif "lo"`
    IifLoopback,
    /// `oif "lo"`
    OifLoopback,
    Ct(CtMatch),
    /// `icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, nd-router-advert }`
    Icmpv6NeighborDiscovery,
    /// `meta l4proto tcp` / `meta l4proto { tcp, udp }`
    L4Proto(Vec<Protocol>),
    /// `th dport 80` / `th dport { 80, 1000-2000 }` (always after an `L4Proto`), sorted and
    /// merged ranges.
    DPort(Vec<(u16, u16)>),
    /// `ip saddr @p4_0` etc.
    Addr {
        family: Family,
        end: AddrEnd,
        set: String,
    },
    /// `meta mark and MASK == VALUE`
    Mark {
        mask: u32,
        value: u32,
    },
    /// `limit name "lim_in"`: passes while under the named limit's rate.
    Limit(String),
}

/// Non-terminal actions, run in order after the matches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Stmt {
    /// `meta mark set meta mark and ~BITS`
    ClearMark(u32),
    /// `meta mark set meta mark or BITS`
    SetMark(u32),
    /// `log group G prefix "..."`
    Log {
        group: u16,
        action: LogAction,
        key: LogKey,
    },
}

/// What happens to a packet when the rule matches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Go on with the next rule.
    Continue,
    Accept,
    /// `reject with tcp reset` (only in rules that match TCP).
    RejectTcpReset,
    /// `reject with icmpx type port-unreachable` (ICMP or ICMPv6, whichever the packet needs).
    RejectPortUnreachable,
    /// `iifname vmap { "eth0" : jump in_0 }`: jump to the chain of the packet's interface, or go
    /// on when it has none.
    Dispatch {
        by: IfBy,
        entries: Vec<(String, String)>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    pub matches: Vec<Match>,
    pub stmts: Vec<Stmt>,
    pub verdict: Verdict,
    /// The policy rule this comes from (not printed: object names stay out of the text; the
    /// tracer reports it).
    pub origin: Option<RuleOrigin>,
}

impl Rule {
    fn new(matches: Vec<Match>, stmts: Vec<Stmt>, verdict: Verdict) -> Rule {
        Rule {
            matches,
            stmts,
            verdict,
            origin: None,
        }
    }
}

/// The netfilter hook of a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    Input,
    Output,
    Forward,
}

impl Hook {
    fn as_str(self) -> &'static str {
        match self {
            Hook::Input => "input",
            Hook::Output => "output",
            Hook::Forward => "forward",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Chain {
    pub name: String,
    /// `Some` for base chains (priority filter, policy accept).
    pub hook: Option<Hook>,
    pub rules: Vec<Rule>,
}

/// A named interval set of peer addresses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AddrSetDef {
    pub name: String,
    pub family: Family,
    /// Inclusive ranges as printed elements (`10.0.0.1`, `10.0.1.0/24`, `10.0.2.0-10.0.2.9`).
    pub elements: Vec<String>,
    /// The same ranges as integers (IPv4 widened), for the tracer.
    pub ranges: Vec<(u128, u128)>,
}

/// A named rate limit (one per direction of the pod).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LimitDef {
    pub name: String,
    pub per_minute: u32,
    pub burst: u32,
}

/// The whole `inet netwarden` table of one pod.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Table {
    pub limits: Vec<LimitDef>,
    pub sets: Vec<AddrSetDef>,
    pub chains: Vec<Chain>,
}

impl Table {
    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.iter().find(|c| c.name == name)
    }

    pub fn set(&self, name: &str) -> Option<&AddrSetDef> {
        self.sets.iter().find(|s| s.name == name)
    }

    pub fn base_chain(&self, hook: Hook) -> Option<&Chain> {
        self.chains.iter().find(|c| c.hook == Some(hook))
    }
}

fn limit_name(direction: Direction) -> String {
    match direction {
        Direction::Ingress => "lim_in".into(),
        Direction::Egress => "lim_out".into(),
    }
}

/// Prints an inclusive range of `bits`-wide addresses as one set element: a single address, a
/// prefix when the range is exactly one, else `lo-hi`.
fn element(lo: u128, hi: u128, bits: u32, show: impl Fn(u128) -> String) -> String {
    if lo == hi {
        return show(lo);
    }
    let span = hi - lo;
    // A prefix: span is 2^k - 1 and lo is aligned to it.
    if span.count_ones() == 128 - span.leading_zeros() && lo & span == 0 {
        let host_bits = 128 - span.leading_zeros();
        return format!("{}/{}", show(lo), bits - host_bits);
    }
    format!("{}-{}", show(lo), show(hi))
}

/// Builds the IR, deduplicating address sets by content.
struct Builder<'a> {
    opts: &'a RenderOptions,
    sets: BTreeMap<(Family, Vec<(u128, u128)>), String>,
    set_defs: Vec<AddrSetDef>,
    counters: [usize; 2],
    used_limits: [bool; 2],
}

impl<'a> Builder<'a> {
    fn set_for(&mut self, family: Family, ranges: Vec<(u128, u128)>) -> String {
        if let Some(name) = self.sets.get(&(family, ranges.clone())) {
            return name.clone();
        }
        let (idx, prefix, bits) = match family {
            Family::V4 => (0, "p4", 32),
            Family::V6 => (1, "p6", 128),
        };
        let name = format!("{prefix}_{}", self.counters[idx]);
        self.counters[idx] += 1;
        let elements = ranges
            .iter()
            .map(|&(lo, hi)| match family {
                Family::V4 => element(lo, hi, bits, |x| Ipv4Addr::from(x as u32).to_string()),
                Family::V6 => element(lo, hi, bits, |x| Ipv6Addr::from(x).to_string()),
            })
            .collect();
        self.set_defs.push(AddrSetDef {
            name: name.clone(),
            family,
            elements,
            ranges: ranges.clone(),
        });
        self.sets.insert((family, ranges), name.clone());
        name
    }

    /// The address alternatives of a clause: none needed (`Any`), or one match per family
    /// present in the set (an empty family emits no rule).
    fn peer_alternatives(&mut self, peers: &PeerMatch, end: AddrEnd) -> Vec<Option<Match>> {
        match peers {
            PeerMatch::Any => vec![None],
            PeerMatch::Addrs(set) => {
                let mut out = Vec::new();
                let v4: Vec<(u128, u128)> = v4_ranges(set);
                if !v4.is_empty() {
                    let name = self.set_for(Family::V4, v4);
                    out.push(Some(Match::Addr {
                        family: Family::V4,
                        end,
                        set: name,
                    }));
                }
                let v6: Vec<(u128, u128)> = set
                    .v6_ranges()
                    .map(|(lo, hi)| (u128::from(lo), u128::from(hi)))
                    .collect();
                if !v6.is_empty() {
                    let name = self.set_for(Family::V6, v6);
                    out.push(Some(Match::Addr {
                        family: Family::V6,
                        end,
                        set: name,
                    }));
                }
                out
            }
        }
    }

    /// The rules (matches only) a clause expands to: addresses × protocols.
    fn clause_matches(&mut self, clause: &Clause, end: AddrEnd) -> Vec<Vec<Match>> {
        let peers = self.peer_alternatives(&clause.peers, end);
        let ports = port_alternatives(&clause.ports);
        let mut out = Vec::new();
        for p in &peers {
            for q in &ports {
                let mut m = Vec::new();
                m.extend(p.clone());
                m.extend(q.iter().cloned());
                out.push(m);
            }
        }
        out
    }

    /// One rule per expanded clause of `iso`, each with `stmts` and `verdict`; an open view
    /// gives one unconditional rule.
    fn view_rules(
        &mut self,
        iso: &Isolation,
        end: AddrEnd,
        stmts: &[Stmt],
        verdict: &Verdict,
    ) -> Vec<Rule> {
        let mut out: Vec<Rule> = Vec::new();
        let mut seen: HashSet<Vec<Match>> = HashSet::new();
        match iso {
            Isolation::Open => out.push(Rule::new(vec![], stmts.to_vec(), verdict.clone())),
            Isolation::Isolated(rules) => {
                for rule in rules {
                    for clause in &rule.clauses {
                        for matches in self.clause_matches(clause, end) {
                            // Two clauses can expand to the same rule: keep the first.
                            if !seen.insert(matches.clone()) {
                                continue;
                            }
                            out.push(Rule {
                                matches,
                                stmts: stmts.to_vec(),
                                verdict: verdict.clone(),
                                origin: Some(rule.origin.clone()),
                            });
                        }
                    }
                }
            }
        }
        out
    }

    fn log_rule(
        &mut self,
        direction: Direction,
        pre: Vec<Match>,
        action: LogAction,
        key: LogKey,
    ) -> Rule {
        self.used_limits[direction as usize] = true;
        let mut matches = pre;
        matches.push(Match::Ct(CtMatch::New));
        matches.push(Match::Limit(limit_name(direction)));
        Rule::new(
            matches,
            vec![Stmt::Log {
                group: self.opts.nflog_group,
                action,
                key,
            }],
            Verdict::Continue,
        )
    }

    fn reject_rules() -> Vec<Rule> {
        vec![
            Rule::new(
                vec![Match::L4Proto(vec![Protocol::Tcp])],
                vec![],
                Verdict::RejectTcpReset,
            ),
            Rule::new(vec![], vec![], Verdict::RejectPortUnreachable),
        ]
    }

    /// The rules of one (interface, direction) chain.
    fn direction_chain(
        &mut self,
        dr: &DirectionRules,
        direction: Direction,
        key: LogKey,
    ) -> Vec<Rule> {
        let end = match direction {
            Direction::Ingress => AddrEnd::Src,
            Direction::Egress => AddrEnd::Dst,
        };
        let enforced_isolated = dr.enforced.is_isolated();
        let mut rules = Vec::new();
        if !dr.has_monitor() {
            rules.extend(self.view_rules(&dr.enforced, end, &[], &Verdict::Accept));
        } else {
            let staged = self.opts.staged_mark;
            let allow = self.opts.allow_mark;
            let bits = self.opts.monitor_bits();
            rules.push(Rule::new(
                vec![],
                vec![Stmt::ClearMark(bits)],
                Verdict::Continue,
            ));
            rules.extend(self.view_rules(
                &dr.staged,
                end,
                &[Stmt::SetMark(staged)],
                &Verdict::Continue,
            ));
            rules.extend(self.view_rules(
                &dr.enforced,
                end,
                &[Stmt::SetMark(allow)],
                &Verdict::Continue,
            ));
            let wd = self.log_rule(
                direction,
                vec![Match::Mark {
                    mask: bits,
                    value: allow,
                }],
                LogAction::WouldDeny,
                key,
            );
            rules.push(wd);
            // Accept with our bits cleared, so the mark is left as the packet came in.
            rules.push(Rule::new(
                vec![Match::Mark {
                    mask: allow,
                    value: allow,
                }],
                vec![Stmt::ClearMark(bits)],
                Verdict::Accept,
            ));
        }
        if enforced_isolated {
            if dr.log_denies {
                let dn = self.log_rule(direction, vec![], LogAction::Deny, key);
                rules.push(dn);
            }
            rules.extend(Self::reject_rules());
        }
        rules
    }
}

fn v4_ranges(set: &AddrSet) -> Vec<(u128, u128)> {
    set.v4_ranges()
        .map(|(lo, hi)| (u128::from(u32::from(lo)), u128::from(u32::from(hi))))
        .collect()
}

/// The port alternatives of a clause: nothing (`Any`), or per protocol (TCP, UDP, SCTP order)
/// either just the protocol (all its ports) or the protocol and merged port ranges.
fn port_alternatives(ports: &PortMatch) -> Vec<Vec<Match>> {
    let ranges = match ports {
        PortMatch::Any => return vec![vec![]],
        PortMatch::Only(ranges) => ranges,
    };
    let mut per_proto: BTreeMap<Protocol, Option<Vec<(u16, u16)>>> = BTreeMap::new();
    for r in ranges {
        let entry = per_proto
            .entry(r.protocol)
            .or_insert_with(|| Some(Vec::new()));
        match (entry.as_mut(), r.ports) {
            (_, None) => *entry = None,
            (Some(list), Some(range)) => list.push(range),
            (None, Some(_)) => {}
        }
    }
    per_proto
        .into_iter()
        .map(|(proto, ports)| {
            let mut m = vec![Match::L4Proto(vec![proto])];
            if let Some(list) = ports {
                m.push(Match::DPort(merge_ports(list)));
            }
            m
        })
        .collect()
}

/// Sorts and merges overlapping or adjacent port ranges (nft refuses overlapping intervals in a
/// set, and merged ranges are what a reader expects).
pub(crate) fn merge_ports(mut list: Vec<(u16, u16)>) -> Vec<(u16, u16)> {
    list.sort_unstable();
    let mut out: Vec<(u16, u16)> = Vec::with_capacity(list.len());
    for (lo, hi) in list {
        let (lo, hi) = (lo.min(hi), lo.max(hi));
        if let Some(last) = out.last_mut() {
            if u32::from(lo) <= u32::from(last.1) + 1 {
                last.1 = last.1.max(hi);
                continue;
            }
        }
        out.push((lo, hi));
    }
    out
}

/// Builds the table for a pod; `None` when nothing is isolated (the table must then be absent).
pub fn build_table(rules: &PodRules, opts: &RenderOptions) -> Option<Table> {
    if !rules.is_isolated() {
        return None;
    }
    let keys = assign_keys(rules);
    let mut b = Builder {
        opts,
        sets: BTreeMap::new(),
        set_defs: Vec::new(),
        counters: [0, 0],
        used_limits: [false, false],
    };
    // Sorted by name so chain numbering does not depend on the engine's interface order.
    let mut ifaces: Vec<_> = rules.interfaces.iter().collect();
    ifaces.sort_by(|a, b| a.name.cmp(&b.name));

    let mut chains = Vec::new();
    let mut dispatch_in = Vec::new();
    let mut dispatch_out = Vec::new();
    let mut any_enforced = false;
    for (n, iface) in ifaces.iter().enumerate() {
        for direction in [Direction::Ingress, Direction::Egress] {
            let dr = iface.direction(direction);
            if !dr.enforced.is_isolated() && !dr.staged.is_isolated() {
                continue;
            }
            any_enforced |= dr.enforced.is_isolated();
            let key = keys[&(iface.name.clone(), direction)];
            let (name, dispatch) = match direction {
                Direction::Ingress => (format!("in_{n}"), &mut dispatch_in),
                Direction::Egress => (format!("out_{n}"), &mut dispatch_out),
            };
            let chain_rules = b.direction_chain(dr, direction, key);
            dispatch.push((iface.name.clone(), name.clone()));
            chains.push(Chain {
                name,
                hook: None,
                rules: chain_rules,
            });
        }
    }

    let nd = || {
        Rule::new(
            vec![Match::Icmpv6NeighborDiscovery],
            vec![],
            Verdict::Accept,
        )
    };
    let established = || {
        Rule::new(
            vec![Match::Ct(CtMatch::EstablishedRelated)],
            vec![],
            Verdict::Accept,
        )
    };
    let mut base = Vec::new();
    if !dispatch_in.is_empty() {
        base.push(Chain {
            name: "input".into(),
            hook: Some(Hook::Input),
            rules: vec![
                Rule::new(vec![Match::IifLoopback], vec![], Verdict::Accept),
                established(),
                nd(),
                Rule::new(
                    vec![],
                    vec![],
                    Verdict::Dispatch {
                        by: IfBy::In,
                        entries: dispatch_in,
                    },
                ),
            ],
        });
    }
    if !dispatch_out.is_empty() {
        let mut r = vec![
            Rule::new(vec![Match::OifLoopback], vec![], Verdict::Accept),
            established(),
            nd(),
        ];
        if opts.allow_dns {
            // Before the dispatch, so DNS passes in both the enforced and the staged view.
            r.push(Rule::new(
                vec![
                    Match::L4Proto(vec![Protocol::Tcp, Protocol::Udp]),
                    Match::DPort(vec![(53, 53)]),
                ],
                vec![],
                Verdict::Accept,
            ));
        }
        r.push(Rule::new(
            vec![],
            vec![],
            Verdict::Dispatch {
                by: IfBy::Out,
                entries: dispatch_out,
            },
        ));
        base.push(Chain {
            name: "output".into(),
            hook: Some(Hook::Output),
            rules: r,
        });
    }
    // Forwarding is rejected only when an interface is isolated in the ENFORCED view: a pod
    // touched only by monitored policies must keep forwarding (monitoring never changes what
    // enforcement decides, SPEC 4).
    if opts.reject_forward && any_enforced {
        base.push(Chain {
            name: "forward".into(),
            hook: Some(Hook::Forward),
            rules: Builder::reject_rules(),
        });
    }
    base.extend(chains);

    let limits = [Direction::Ingress, Direction::Egress]
        .into_iter()
        .filter(|d| b.used_limits[*d as usize])
        .map(|d| LimitDef {
            name: limit_name(d),
            per_minute: opts.log_rate_per_minute,
            burst: opts.log_burst,
        })
        .collect();
    Some(Table {
        limits,
        sets: b.set_defs,
        chains: base,
    })
}

fn proto_name(p: Protocol) -> &'static str {
    p.lower()
}

fn render_match(m: &Match, out: &mut String) {
    match m {
        Match::IifLoopback => out.push_str("iif \"lo\""),
        Match::OifLoopback => out.push_str("oif \"lo\""),
        Match::Ct(CtMatch::EstablishedRelated) => out.push_str("ct state established,related"),
        Match::Ct(CtMatch::New) => out.push_str("ct state new"),
        Match::Icmpv6NeighborDiscovery => out.push_str(
            "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, nd-router-advert }",
        ),
        Match::L4Proto(protos) => {
            if let [p] = protos.as_slice() {
                let _ = write!(out, "meta l4proto {}", proto_name(*p));
            } else {
                let list: Vec<&str> = protos.iter().map(|p| proto_name(*p)).collect();
                let _ = write!(out, "meta l4proto {{ {} }}", list.join(", "));
            }
        }
        Match::DPort(ranges) => {
            let items: Vec<String> = ranges
                .iter()
                .map(|&(lo, hi)| if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") })
                .collect();
            if items.len() == 1 {
                let _ = write!(out, "th dport {}", items[0]);
            } else {
                let _ = write!(out, "th dport {{ {} }}", items.join(", "));
            }
        }
        Match::Addr { family, end, set } => {
            let fam = match family {
                Family::V4 => "ip",
                Family::V6 => "ip6",
            };
            let e = match end {
                AddrEnd::Src => "saddr",
                AddrEnd::Dst => "daddr",
            };
            let _ = write!(out, "{fam} {e} @{set}");
        }
        Match::Mark { mask, value } => {
            let _ = write!(out, "meta mark and {mask:#010x} == {value:#010x}");
        }
        Match::Limit(name) => {
            let _ = write!(out, "limit name \"{name}\"");
        }
    }
}

fn render_stmt(s: &Stmt, out: &mut String) {
    match s {
        Stmt::ClearMark(bits) => {
            let _ = write!(out, "meta mark set meta mark and {:#010x}", !bits);
        }
        Stmt::SetMark(bits) => {
            let _ = write!(out, "meta mark set meta mark or {bits:#010x}");
        }
        Stmt::Log { group, action, key } => {
            let _ = write!(
                out,
                "log group {group} prefix \"{}\"",
                log_prefix(*action, *key)
            );
        }
    }
}

fn render_verdict(v: &Verdict, out: &mut String) {
    match v {
        Verdict::Continue => {}
        Verdict::Accept => out.push_str("accept"),
        Verdict::RejectTcpReset => out.push_str("reject with tcp reset"),
        Verdict::RejectPortUnreachable => out.push_str("reject with icmpx type port-unreachable"),
        Verdict::Dispatch { by, entries } => {
            let key = match by {
                IfBy::In => "iifname",
                IfBy::Out => "oifname",
            };
            let items: Vec<String> = entries
                .iter()
                .map(|(ifname, chain)| format!("{} : jump {chain}", quote_ifname(ifname)))
                .collect();
            let _ = write!(out, "{key} vmap {{ {} }}", items.join(", "));
        }
    }
}

/// Quotes an interface name. Names are validated at the edge (at most 15 characters, no quotes,
/// slashes or whitespace); anything else is still escaped into a harmless form here, so a bug
/// upstream cannot turn a name into nft syntax.
fn quote_ifname(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@' | ':') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("\"{safe}\"")
}

/// Prints one rule as it appears in the text.
pub fn render_rule(rule: &Rule) -> String {
    let mut out = String::new();
    let sep = |out: &mut String| {
        if !out.is_empty() {
            out.push(' ');
        }
    };
    for m in &rule.matches {
        sep(&mut out);
        render_match(m, &mut out);
    }
    for s in &rule.stmts {
        sep(&mut out);
        render_stmt(s, &mut out);
    }
    if rule.verdict != Verdict::Continue {
        sep(&mut out);
        render_verdict(&rule.verdict, &mut out);
    }
    out
}

/// The lines that (re)create the table whether it exists or not: an empty declaration then its
/// deletion, in the same transaction as what follows.
fn preamble(out: &mut String) {
    let _ = writeln!(out, "table {TABLE_FAMILY} {TABLE_NAME} {{}}");
    let _ = writeln!(out, "delete table {TABLE_FAMILY} {TABLE_NAME}");
}

/// Prints a table as an `nft -f` transaction (with the replacing preamble).
pub fn render_table(table: &Table) -> String {
    let mut out = String::new();
    preamble(&mut out);
    let _ = writeln!(out, "table {TABLE_FAMILY} {TABLE_NAME} {{");
    for l in &table.limits {
        let _ = writeln!(
            out,
            "\tlimit {} {{ rate {}/minute burst {} packets }}",
            l.name, l.per_minute, l.burst
        );
    }
    for s in &table.sets {
        let ty = match s.family {
            Family::V4 => "ipv4_addr",
            Family::V6 => "ipv6_addr",
        };
        let _ = writeln!(out, "\tset {} {{", s.name);
        let _ = writeln!(out, "\t\ttype {ty}");
        let _ = writeln!(out, "\t\tflags interval");
        let _ = writeln!(out, "\t\telements = {{ {} }}", s.elements.join(", "));
        let _ = writeln!(out, "\t}}");
    }
    for c in &table.chains {
        let _ = writeln!(out, "\tchain {} {{", c.name);
        if let Some(hook) = c.hook {
            let _ = writeln!(
                out,
                "\t\ttype filter hook {} priority filter; policy accept;",
                hook.as_str()
            );
        }
        for r in &c.rules {
            let _ = writeln!(out, "\t\t{}", render_rule(r));
        }
        let _ = writeln!(out, "\t}}");
    }
    let _ = writeln!(out, "}}");
    out
}

/// The complete `nft -f` transaction for one pod netns. For a pod with nothing isolated it only
/// deletes the table (if present).
pub fn render_nft(rules: &PodRules, opts: &RenderOptions) -> String {
    match build_table(rules, opts) {
        Some(table) => render_table(&table),
        None => render_removal(),
    }
}

/// The transaction that removes the table whether it exists or not.
pub fn render_removal() -> String {
    let mut out = String::new();
    preamble(&mut out);
    out
}

/// Whether a rendered transaction only removes the table (nothing isolated).
pub fn is_removal(text: &str) -> bool {
    text == render_removal()
}

/// Number of rules in an nft text (ours or `nft list` output): the lines inside chain blocks
/// that are not the base-chain header.
pub fn rule_count(text: &str) -> usize {
    let mut in_chain = false;
    let mut count = 0;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with("chain ") && l.ends_with('{') {
            in_chain = true;
            continue;
        }
        if !in_chain {
            continue;
        }
        if l == "}" {
            in_chain = false;
        } else if !l.is_empty() && !l.starts_with("type ") && !l.starts_with('#') {
            count += 1;
        }
    }
    count
}
