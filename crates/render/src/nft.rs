//! The nftables renderer: one `nft -f` transaction per pod netns that brings table
//! `inet netwarden` to the desired rules in place, with no window (SPEC 5).
//!
//! The rules are first built as a small intermediate representation ([`Table`] of [`Chain`]s of
//! [`Rule`]s, in the spirit of knftables), then printed. The [`tracer`](crate::tracer) walks the
//! same IR, so table-driven verdict tests exercise exactly what is printed.
//!
//! Layout of the table (only what a pod needs is emitted):
//!
//! ```text
//! input   (hook input)   lo, established/related, ICMPv6 ND → accept; iifname "X" jump in_<n>
//! output  (hook output)  lo, established/related, ICMPv6 ND, DNS → accept; oifname "X" jump out_<n>
//! forward (hook forward) reject everything (when an interface is enforced-isolated)
//! in_<n> / out_<n>       one chain per isolated (interface, direction):
//!   enforce only:  <allow clause> accept … [deny log] reject
//!   with monitor:  clear bits; <staged clause> mark|=STAGED …; <enforced clause> mark|=ALLOW …;
//!                  would-deny log when mark&(STAGED|ALLOW)==ALLOW;
//!                  mark&ALLOW==ALLOW → clear bits, accept; [deny log] reject
//! ```
//!
//! Peer addresses live in named interval sets shared by every rule with the same content, so
//! the rule count does not grow with the number of peers. Chain, set and limit names are
//! generated; the only outside strings in the text are interface names (validated as kernel
//! ifnames at the edge) and they are always quoted.
//!
//! # Why the transaction looks the way it does
//!
//! nf_tables commits a transaction by flipping a generation bit. Rules are switched per chain
//! as a whole (a packet that started on the old rules keeps walking old rules, even across
//! jumps), but a set lookup checks the element against the generation *current at lookup
//! time*: a packet still walking an old rule that looks into a set this transaction deletes or
//! empties finds nothing. Replacing the whole table therefore opened a window in which an
//! allowed connection could be refused (peer set miss) or a denied one accepted (dispatch map
//! miss → `policy accept`). So the transaction never removes an element an old rule may look
//! up:
//!
//! - the table is never deleted while the pod stays isolated: `add table`, then every chain is
//!   `add chain` (idempotent) + `flush chain` + its rules;
//! - no anonymous sets or maps at all: dispatch is one `iifname "eth0" jump in_0` rule per
//!   interface, ICMPv6 ND one rule per type, ports explicit `th dport` matches (one rule per
//!   port range; still independent of the number of peers);
//! - peer sets are named by their content (`p4_<hash>`, `p6_<hash>`): `add set` + `add element`
//!   of identical content is a no-op on a set that already exists, and a changed peer list is a
//!   new set, so the sets old rules use are left untouched.
//!
//! The text is valid whether the table exists or not. Deleting what is no longer used (sets two
//! applies stale, chains of interfaces that left) is the dataplane's part (it knows what the
//! kernel holds): see `netwarden_dataplane::nft_apply`.

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

/// The ICMPv6 neighbour-discovery types accepted before any policy (one rule each: a set of
/// types would be an anonymous set, see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NdType {
    NeighborSolicit,
    NeighborAdvert,
    RouterSolicit,
    RouterAdvert,
}

impl NdType {
    pub const ALL: [NdType; 4] = [
        NdType::NeighborSolicit,
        NdType::NeighborAdvert,
        NdType::RouterSolicit,
        NdType::RouterAdvert,
    ];

    fn as_str(self) -> &'static str {
        match self {
            NdType::NeighborSolicit => "nd-neighbor-solicit",
            NdType::NeighborAdvert => "nd-neighbor-advert",
            NdType::RouterSolicit => "nd-router-solicit",
            NdType::RouterAdvert => "nd-router-advert",
        }
    }
}

/// One condition of a rule; all of a rule's matches must hold. None of them is a set or map
/// lookup except [`Match::Addr`], whose sets are named by content (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Match {
    /// `iif "lo"`
    IifLoopback,
    /// `oif "lo"`
    OifLoopback,
    Ct(CtMatch),
    /// `icmpv6 type nd-neighbor-solicit` etc.
    Icmpv6Nd(NdType),
    /// `meta l4proto tcp`
    L4Proto(Protocol),
    /// `th dport 80` / `th dport 1000-2000` (inclusive; always after an `L4Proto`).
    DPort(u16, u16),
    /// `iifname "eth0"` / `oifname "eth0"`: the interface a base chain dispatches on.
    IfName {
        by: IfBy,
        name: String,
    },
    /// `ip saddr @p4_<hash>` etc.
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
    /// `jump in_0`: run that chain, then go on here unless it decided.
    Jump(String),
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

/// A named interval set of peer addresses. Its name is derived from its content
/// ([`set_name`]), so the same peers always give the same set, in every apply.
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

/// FNV-1a, 64 bits: a hash that is the same in every build and process (set names outlive
/// the agent that created them), unlike `std`'s hasher.
fn fnv1a64(bytes: impl IntoIterator<Item = u8>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The content-derived name of a peer set: `p4_`/`p6_` and 16 hex digits of a hash of the
/// family and the (sorted, merged) ranges.
pub fn set_name(family: Family, ranges: &[(u128, u128)]) -> String {
    let (tag, prefix) = match family {
        Family::V4 => (4u8, "p4"),
        Family::V6 => (6u8, "p6"),
    };
    let bytes = std::iter::once(tag).chain(
        ranges
            .iter()
            .flat_map(|&(lo, hi)| lo.to_be_bytes().into_iter().chain(hi.to_be_bytes())),
    );
    format!("{prefix}_{:016x}", fnv1a64(bytes))
}

/// Builds the IR, deduplicating address sets by content.
struct Builder<'a> {
    opts: &'a RenderOptions,
    sets: BTreeMap<(Family, Vec<(u128, u128)>), String>,
    set_defs: Vec<AddrSetDef>,
    used_limits: [bool; 2],
}

impl<'a> Builder<'a> {
    fn set_for(&mut self, family: Family, ranges: Vec<(u128, u128)>) -> String {
        if let Some(name) = self.sets.get(&(family, ranges.clone())) {
            return name.clone();
        }
        let bits = match family {
            Family::V4 => 32,
            Family::V6 => 128,
        };
        let mut name = set_name(family, &ranges);
        // Two contents with one hash in one table would merge into one set: astronomically
        // unlikely, but then the second gets a suffix rather than the union of both.
        let base = name.clone();
        let mut n = 1;
        while self.set_defs.iter().any(|d| d.name == name) {
            name = format!("{base}_{n}");
            n += 1;
        }
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
                vec![Match::L4Proto(Protocol::Tcp)],
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
/// either just the protocol (all its ports) or the protocol and one merged port range per
/// alternative (explicit ranges, not an anonymous set: see the module doc).
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
    let mut out = Vec::new();
    for (proto, ports) in per_proto {
        match ports {
            None => out.push(vec![Match::L4Proto(proto)]),
            Some(list) => out.extend(
                merge_ports(list)
                    .into_iter()
                    .map(|(lo, hi)| vec![Match::L4Proto(proto), Match::DPort(lo, hi)]),
            ),
        }
    }
    out
}

/// Sorts and merges overlapping or adjacent port ranges (fewer rules, and merged ranges are
/// what a reader expects).
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
        NdType::ALL
            .into_iter()
            .map(|t| Rule::new(vec![Match::Icmpv6Nd(t)], vec![], Verdict::Accept))
    };
    // One `iifname "X" jump chain` rule per interface: a string compare, no map lookup.
    let dispatch = |by: IfBy, entries: Vec<(String, String)>| {
        entries.into_iter().map(move |(name, chain)| {
            Rule::new(
                vec![Match::IfName { by, name }],
                vec![],
                Verdict::Jump(chain),
            )
        })
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
        let mut r = vec![
            Rule::new(vec![Match::IifLoopback], vec![], Verdict::Accept),
            established(),
        ];
        r.extend(nd());
        r.extend(dispatch(IfBy::In, dispatch_in));
        base.push(Chain {
            name: "input".into(),
            hook: Some(Hook::Input),
            rules: r,
        });
    }
    if !dispatch_out.is_empty() {
        let mut r = vec![
            Rule::new(vec![Match::OifLoopback], vec![], Verdict::Accept),
            established(),
        ];
        r.extend(nd());
        if opts.allow_dns {
            // Before the dispatch, so DNS passes in both the enforced and the staged view.
            for proto in [Protocol::Tcp, Protocol::Udp] {
                r.push(Rule::new(
                    vec![Match::L4Proto(proto), Match::DPort(53, 53)],
                    vec![],
                    Verdict::Accept,
                ));
            }
        }
        r.extend(dispatch(IfBy::Out, dispatch_out));
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
        Match::Icmpv6Nd(t) => {
            let _ = write!(out, "icmpv6 type {}", t.as_str());
        }
        Match::L4Proto(p) => {
            let _ = write!(out, "meta l4proto {}", proto_name(*p));
        }
        Match::DPort(lo, hi) => {
            if lo == hi {
                let _ = write!(out, "th dport {lo}");
            } else {
                let _ = write!(out, "th dport {lo}-{hi}");
            }
        }
        Match::IfName { by, name } => {
            let key = match by {
                IfBy::In => "iifname",
                IfBy::Out => "oifname",
            };
            let _ = write!(out, "{key} {}", quote_ifname(name));
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
        Verdict::Jump(chain) => {
            let _ = write!(out, "jump {chain}");
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

/// The lines that remove the table whether it exists or not: an empty declaration then its
/// deletion, in one transaction.
fn preamble(out: &mut String) {
    let _ = writeln!(out, "table {TABLE_FAMILY} {TABLE_NAME} {{}}");
    let _ = writeln!(out, "delete table {TABLE_FAMILY} {TABLE_NAME}");
}

/// Prints a table as an `nft -f` transaction that updates the table in place, whether it
/// exists or not (see the module doc for why nothing is deleted here):
///
/// ```text
/// add table inet netwarden
/// add limit inet netwarden lim_in { rate 10/minute burst 10 packets }
/// add set inet netwarden p4_<hash> { type ipv4_addr; flags interval; }
/// add element inet netwarden p4_<hash> { 10.0.0.2, 10.0.1.0/24 }
/// add chain inet netwarden input { type filter hook input priority filter; policy accept; }
/// add chain inet netwarden in_0
/// flush chain inet netwarden input
/// add rule inet netwarden input iifname "eth0" jump in_0
/// flush chain inet netwarden in_0
/// add rule inet netwarden in_0 ip saddr @p4_<hash> meta l4proto tcp th dport 80 accept
/// ```
///
/// Every chain is declared before any rule, so a `jump` never names a chain not yet declared.
pub fn render_table(table: &Table) -> String {
    let t = format!("{TABLE_FAMILY} {TABLE_NAME}");
    let mut out = String::new();
    let _ = writeln!(out, "add table {t}");
    for l in &table.limits {
        let _ = writeln!(
            out,
            "add limit {t} {} {{ rate {}/minute burst {} packets }}",
            l.name, l.per_minute, l.burst
        );
    }
    for s in &table.sets {
        let ty = match s.family {
            Family::V4 => "ipv4_addr",
            Family::V6 => "ipv6_addr",
        };
        let _ = writeln!(
            out,
            "add set {t} {} {{ type {ty}; flags interval; }}",
            s.name
        );
        let _ = writeln!(
            out,
            "add element {t} {} {{ {} }}",
            s.name,
            s.elements.join(", ")
        );
    }
    for c in &table.chains {
        match c.hook {
            Some(hook) => {
                let _ = writeln!(
                    out,
                    "add chain {t} {} {{ type filter hook {} priority filter; policy accept; }}",
                    c.name,
                    hook.as_str()
                );
            }
            None => {
                let _ = writeln!(out, "add chain {t} {}", c.name);
            }
        }
    }
    for c in &table.chains {
        let _ = writeln!(out, "flush chain {t} {}", c.name);
        for r in &c.rules {
            let _ = writeln!(out, "add rule {t} {} {}", c.name, render_rule(r));
        }
    }
    out
}

/// The complete `nft -f` transaction for one pod netns (the desired state; the dataplane adds
/// the deletion of what became unused). For a pod with nothing isolated it only deletes the
/// table (if present): the pod is open then, so no packet depends on what goes.
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

/// Number of rules in an nft text, ours (`add rule` lines) or `nft list` output (the lines
/// inside chain blocks that are not the base-chain header).
pub fn rule_count(text: &str) -> usize {
    let mut in_chain = false;
    let mut count = 0;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with("add rule ") {
            count += 1;
            continue;
        }
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
