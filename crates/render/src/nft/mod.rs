//! The nftables renderer: the table `inet netwarden` one pod netns needs, as a typed value
//! ([`Table`] of [`Chain`]s of [`Rule`]s, in the spirit of knftables), and the transactions that
//! bring a netns to it ([`transaction`]), printed only at the edge: as nft syntax for people
//! (`netwarden render`, golden tests) and as libnftables JSON for the kernel.
//!
//! The [`tracer`](crate::tracer) walks the same [`Table`], so table-driven verdict tests exercise
//! exactly what is applied.
//!
//! Layout of the table (only what a pod needs is emitted):
//!
//! ```text
//! input   (hook input)   lo, established/related, ICMPv6 ND → accept; then the dispatch plan
//!                        (crate::dispatch), by the address a packet is sent to first:
//!                          ip daddr A jump in_<n>   A on interface n, ingress-isolated (either view)
//!                          ip daddr A accept        A on an open interface
//!                          iifname "X" jump in_<n>  other destinations, by arrival interface
//!                          iifname "Y" accept       … on an open interface
//!                          reject                   when any interface is enforced-isolated:
//!                                                   interfaces netwarden does not know are closed
//! output  (hook output)  lo, established/related, ICMPv6 ND → accept; oifname "X" jump out_<n>,
//!                        oifname "Y" accept for open ones, reject when egress is
//!                        enforced-isolated anywhere
//! forward (hook forward) reject everything (when an interface is enforced-isolated)
//!   (learn mode: after established/related, per interface, family and protocol, the learn
//!    rules described below; they only log, so both base chains exist for a learning pod)
//! in_<n> / out_<n>       one chain per isolated (interface, direction), each ending with a
//!                        verdict (the base chain goes on after a jump returns):
//!   enforce only:  [implicit DNS] <allow clause> accept … [deny log] reject
//!   with monitor:  count new (nw_cn_<key>); clear bits; <staged clause> mark|=STAGED …;
//!                  <enforced clause> mark|=ALLOW …;
//!                  when mark&(STAGED|ALLOW)==ALLOW and new: count (nw_wd_<key>), then under
//!                  the rate limit count (nw_wl_<key>) and log;
//!                  mark&ALLOW==ALLOW → clear bits, accept; then [deny log] reject when
//!                  enforced-isolated, else (monitor only) accept
//! ```
//!
//! A packet for the pod's primary address that a peer routes in through a secondary interface
//! is judged by the primary interface's chain, and a packet on an interface created after the
//! last apply (or one without an address) is rejected in an isolated pod: see
//! [`crate::dispatch`].
//!
//! The three named counters of a monitored chain are the kernel's evidence for the `status`
//! records ([`CounterKind`]): connections the monitored policies judged, would-denies, and
//! would-denies logged (the difference is what the rate limit suppressed). Named counters
//! outlive the chain refills of later applies (`add counter` keeps the value).
//!
//! # Learn mode
//!
//! A learning pod logs each distinct new flow once per window, deduplicated in the kernel: one
//! dynamic set per family and direction (`lrn4_in_<hash>` …, `flags dynamic,timeout`, the
//! window as its `timeout`, bounded by `size`), keyed `ifname . addr . l4proto . dport` (the
//! peer's address: source on ingress, destination on egress). Per interface, family and
//! protocol (TCP, UDP, SCTP: the protocols with ports) the base chain gets
//!
//! ```text
//! ct state new iifname "eth0" meta l4proto tcp iifname . ip saddr . meta l4proto . th dport != @S
//!     add @S { iifname . ip saddr . meta l4proto . th dport } log group G prefix "nw:ob:<key> "
//! ct state new iifname "eth0" meta l4proto tcp iifname . ip saddr . meta l4proto . th dport != @S
//!     counter name "lrn_full"
//! ```
//!
//! The first rule logs a flow its set does not hold and adds it; the kernel's `add` fails when
//! the set is full, which ends the rule before the log (nft_dynset breaks), so the flow is
//! still absent and the second rule counts it in the named counter `lrn_full` (it outlives
//! rule refills). The rules sit in the base chains after loopback and established/related and
//! before the dispatch to the policy chains: they see every new flow of the pod, allowed,
//! would-denied or denied alike, and have no verdict, so enforcement is what it was without
//! them. There is no rate limit: the set already bounds the messages to `size` per window.
//! Learn sets are named by their parameters, so a new window or size is a new set and the old
//! one is collected by the planner like a stale peer set.
//!
//! Outgoing DNS without a rule (SPEC 3.1) is part of a view's allow clauses, in the chain of the
//! interface whose isolating policies imply it (the engine decides: DanmNetworkPolicy by
//! default), so it takes part in the monitor bookkeeping like any other allow.
//!
//! Peer addresses live in named interval sets shared by every rule with the same content, so
//! the rule count does not grow with the number of peers. Chain, set and limit names are
//! generated; the only outside strings in a rule are interface names, matched exactly (see
//! [`ifname_match_error`]).
//!
//! # Why the transaction looks the way it does
//!
//! nf_tables commits a transaction by flipping a generation bit. Rules are switched per chain
//! as a whole (a packet that started on the old rules keeps walking old rules, even across
//! jumps), but a set lookup checks the element against the generation *current at lookup
//! time*: a packet still walking an old rule that looks into a set this transaction deletes or
//! empties finds nothing. Replacing the whole table therefore opened a window in which an
//! allowed connection could be refused (peer set miss) or a denied one accepted (dispatch map
//! miss → `policy accept`). So a transaction never removes an element an old rule may look up:
//!
//! - the table is never deleted while the pod stays isolated: `add table`, then every chain is
//!   `add chain` (idempotent) + `flush chain` + its rules;
//! - no anonymous sets or maps at all: dispatch is one `ip daddr 10.0.0.1 jump in_0` rule per
//!   address and one `iifname "eth0" jump in_0` rule per interface, ICMPv6 ND one rule per
//!   type, ports explicit `th dport` matches (one rule per port range; still independent of
//!   the number of peers);
//! - peer sets are named by their content (`p4_<hash>`, `p6_<hash>`): `add set` + `add element`
//!   of identical content is a no-op on a set that already exists, and a changed peer list is a
//!   new set, so the sets old rules use are left untouched.
//!
//! Deleting what is no longer used (sets two applies stale, chains of interfaces that left)
//! depends on what the kernel holds: the dataplane's planner adds it to the transaction.

pub mod transaction;

use std::collections::{BTreeMap, HashSet};
use std::hash::Hasher;

use netwarden_engine::{
    AddrSet, AdminAction, Clause, Direction, DirectionRules, Family, Isolation, PeerMatch, PodKey,
    PodRules, PortMatch, PortRange, Protocol, RuleOrigin, TierRule,
};

use crate::dispatch;
use crate::logkey::{assign_keys, counter_name, CounterKind, LogAction, LogKey};
use crate::options::RenderOptions;
use crate::tiers::tier_runs;
use netwarden_engine::hash::StableHasher;

pub use transaction::{Command, Transaction};

/// The table netwarden owns in every pod netns; nothing else is ever touched.
pub const TABLE_FAMILY: &str = "inet";
pub const TABLE_NAME: &str = "netwarden";

/// A table name for netwarden's rules in a netns where [`TABLE_NAME`] cannot be used: a pod
/// with `CAP_NET_ADMIN` deleted it and created its own of that name with the `owner` flag,
/// which no other process may change or delete while the pod's netlink socket lives. The
/// suffix is random (`seed`) so that a pod cannot take the next name in advance.
pub fn fallback_table_name(seed: u64) -> String {
    format!("{TABLE_NAME}_{:016x}", seed)
}

/// Whether `name` is [`TABLE_NAME`] or one of its [`fallback_table_name`]s.
pub fn is_netwarden_table_name(name: &str) -> bool {
    name == TABLE_NAME
        || name.strip_prefix(TABLE_NAME).is_some_and(|rest| {
            rest.len() == 17
                && rest.starts_with('_')
                && rest[1..].bytes().all(|b| b.is_ascii_hexdigit())
        })
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

    pub fn as_str(self) -> &'static str {
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
    /// `iifname "lo"` (a name compare: `iif` would resolve the name through libnftables'
    /// process-wide interface cache).
    IifLoopback,
    /// `oifname "lo"`
    OifLoopback,
    Ct(CtMatch),
    /// `icmpv6 type nd-neighbor-solicit` etc.
    Icmpv6Nd(NdType),
    /// `meta l4proto tcp`
    L4Proto(Protocol),
    /// `th dport 80` / `th dport 1000-2000` (inclusive; always after an `L4Proto`).
    DPort(u16, u16),
    /// `iifname "eth0"` / `oifname "eth0"`: the interface a base chain dispatches on, matched
    /// exactly (the printers escape what nft would read as a wildcard).
    IfName {
        by: IfBy,
        name: String,
    },
    /// `ip daddr 10.0.0.1` / `ip6 daddr fd00::1`: one address of the pod itself (the
    /// destination of an incoming packet), the base chain's dispatch by owner
    /// ([`crate::dispatch`]). The family is the address's.
    AddrIs {
        end: AddrEnd,
        addr: std::net::IpAddr,
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
    /// `iifname . ip saddr . meta l4proto . th dport != @lrn4_in_…`: a flow the learn set does
    /// not hold (yet, or any more: its element timed out).
    NotLearned(LearnKey),
}

/// The flow key of a learn set and the set it lives in: the interface of `direction`, the
/// peer's address of `family`, the protocol and the destination port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LearnKey {
    pub family: Family,
    pub direction: Direction,
    pub set: String,
}

impl LearnKey {
    /// The address end holding the peer.
    pub fn end(&self) -> AddrEnd {
        match self.direction {
            Direction::Ingress => AddrEnd::Src,
            Direction::Egress => AddrEnd::Dst,
        }
    }

    /// The interface keyword's side.
    pub fn by(&self) -> IfBy {
        match self.direction {
            Direction::Ingress => IfBy::In,
            Direction::Egress => IfBy::Out,
        }
    }
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
    /// `add @lrn4_in_… { iifname . ip saddr . meta l4proto . th dport }` (with the set's
    /// timeout); ends the rule when the set is full.
    Learn(LearnKey),
    /// `counter name "lrn_full"`
    Counter(String),
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
    /// `goto in_0_ns`: run that chain instead of the rest of this one; when it returns, this
    /// chain's caller goes on (the hand-off of an admin Pass and of the tiers, SPEC 8).
    Goto(String),
    /// `return`: back to the calling chain (a monitored pipeline's decision, recorded in the
    /// mark).
    Return,
}

impl Verdict {
    /// The chain this verdict runs, if any.
    pub fn target(&self) -> Option<&str> {
        match self {
            Verdict::Jump(chain) | Verdict::Goto(chain) => Some(chain),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    pub matches: Vec<Match>,
    pub stmts: Vec<Stmt>,
    pub verdict: Verdict,
    /// The policy rule this comes from (not printed: object names stay out of the rules; the
    /// tracer reports it). `None` for rules no policy rule stands behind (loopback, implicit
    /// DNS, rejects).
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
    pub fn as_str(self) -> &'static str {
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
    /// Sorted, disjoint inclusive ranges (IPv4 widened to `u128`); the printers turn each into
    /// an address, a prefix or a range ([`SetElement`]).
    pub ranges: Vec<(u128, u128)>,
}

impl AddrSetDef {
    /// The elements as nft writes them.
    pub fn elements(&self) -> impl Iterator<Item = SetElement> + '_ {
        let family = self.family;
        self.ranges
            .iter()
            .map(move |&(lo, hi)| SetElement::of_range(family, lo, hi))
    }
}

/// One element of an interval set, in the shortest form nft accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetElement {
    Addr(std::net::IpAddr),
    Prefix(std::net::IpAddr, u8),
    Range(std::net::IpAddr, std::net::IpAddr),
}

impl SetElement {
    /// A single address, a prefix when the range is exactly one, else `lo-hi`.
    pub fn of_range(family: Family, lo: u128, hi: u128) -> SetElement {
        let addr = |x: u128| match family {
            Family::Ipv4 => std::net::IpAddr::from(std::net::Ipv4Addr::from(x as u32)),
            Family::Ipv6 => std::net::IpAddr::from(std::net::Ipv6Addr::from(x)),
        };
        let bits = match family {
            Family::Ipv4 => 32,
            Family::Ipv6 => 128,
        };
        if lo == hi {
            return SetElement::Addr(addr(lo));
        }
        let span = hi - lo;
        // A prefix: span is 2^k - 1 and lo is aligned to it.
        if span.count_ones() == 128 - span.leading_zeros() && lo & span == 0 {
            let host_bits = 128 - span.leading_zeros();
            return SetElement::Prefix(addr(lo), (bits - host_bits) as u8);
        }
        SetElement::Range(addr(lo), addr(hi))
    }
}

impl std::fmt::Display for SetElement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetElement::Addr(a) => write!(f, "{a}"),
            SetElement::Prefix(a, len) => write!(f, "{a}/{len}"),
            SetElement::Range(lo, hi) => write!(f, "{lo}-{hi}"),
        }
    }
}

/// A named rate limit (one per direction of the pod).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LimitDef {
    pub name: String,
    pub per_minute: u32,
    pub burst: u32,
}

/// A learn set: the flows seen on one family and direction in the current window (see
/// the module doc, "Learn mode"). Named by its parameters ([`learn_set_name`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LearnSetDef {
    pub name: String,
    pub family: Family,
    pub direction: Direction,
    pub timeout_secs: u64,
    pub size: u32,
}

/// The named counter of flows learn mode could not log because their set was full.
pub const LEARN_FULL_COUNTER: &str = "lrn_full";

/// The whole `inet netwarden` table of one pod.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Table {
    pub limits: Vec<LimitDef>,
    pub sets: Vec<AddrSetDef>,
    /// Learn mode's dynamic sets (empty unless the pod learns).
    pub learn_sets: Vec<LearnSetDef>,
    /// Named counters: the monitored chains' evidence counters ([`CounterKind`]), learn
    /// mode's [`LEARN_FULL_COUNTER`].
    pub counters: Vec<String>,
    pub chains: Vec<Chain>,
}

impl Table {
    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.iter().find(|c| c.name == name)
    }

    pub fn set(&self, name: &str) -> Option<&AddrSetDef> {
        self.sets.iter().find(|s| s.name == name)
    }

    pub fn learn_set(&self, name: &str) -> Option<&LearnSetDef> {
        self.learn_sets.iter().find(|s| s.name == name)
    }

    pub fn base_chain(&self, hook: Hook) -> Option<&Chain> {
        self.chains.iter().find(|c| c.hook == Some(hook))
    }

    /// Number of rules in every chain.
    pub fn rule_count(&self) -> usize {
        self.chains.iter().map(|c| c.rules.len()).sum()
    }
}

/// Why a pod's rules cannot be rendered. The pod is then refused (its netns keeps what it had)
/// and the error is reported: nothing is applied that would leave an interface uncovered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error(
        "{pod}: interface {name:?} cannot be matched exactly by the {backend} backend: {reason}"
    )]
    UnmatchableInterface {
        pod: PodKey,
        name: String,
        backend: &'static str,
        reason: &'static str,
    },
    /// Learn mode deduplicates flows in nft dynamic sets; iptables has no equivalent that keeps
    /// one message per distinct flow per window (`hashlimit` counts packets, not flows, and
    /// `recent` keys on an address only), so the iptables backend refuses the pod.
    #[error(
        "{pod}: learn mode (netwarden.io/learn or --learn) needs the nft backend; the iptables backend refuses this pod (use --backend nft, or stop learning on it)"
    )]
    LearnNeedsNft { pod: PodKey },
    /// The admin policies' tiers (SPEC 8) are compiled for the nft backend only so far: the
    /// iptables backend refuses a pod they apply to rather than leave their rules out.
    #[error(
        "{pod}: admin policies (ClusterNetworkPolicy, AdminNetworkPolicy, BaselineAdminNetworkPolicy) apply to this pod and need the nft backend; the iptables backend refuses it (use --backend nft)"
    )]
    AdminNeedsNft { pod: PodKey },
}

/// Why nftables cannot match interface `name` exactly, if it cannot.
///
/// Any kernel interface name can be written in a libnftables JSON string. nft reads a trailing
/// `*` as a wildcard (a prefix match); the printers escape it as `\*`, but then nft also drops
/// every other backslash of the name (it unescapes the whole string), so a name that ends with
/// `*` and contains `\` has no exact spelling.
pub fn ifname_match_error(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("an empty name matches nothing");
    }
    if name.ends_with('*') && name.contains('\\') {
        return Some("a name ending with '*' that contains '\\' has no exact spelling in nft");
    }
    None
}

fn limit_name(direction: Direction) -> String {
    match direction {
        Direction::Ingress => "lim_in".into(),
        Direction::Egress => "lim_out".into(),
    }
}

/// The content-derived name of a peer set: `p4_`/`p6_` and 16 hex digits of a hash of the
/// family and the (sorted, merged) ranges.
pub fn set_name(family: Family, ranges: &[(u128, u128)]) -> String {
    let (tag, prefix) = match family {
        Family::Ipv4 => (4u8, "p4"),
        Family::Ipv6 => (6u8, "p6"),
    };
    let mut h = StableHasher::default();
    h.write(&[tag]);
    for &(lo, hi) in ranges {
        h.write(&lo.to_be_bytes());
        h.write(&hi.to_be_bytes());
    }
    format!("{prefix}_{:016x}", h.finish())
}

/// The parameter-derived name of a learn set: `lrn4_in_`/`lrn6_out_`… and 16 hex digits of a
/// hash of its window and size.
pub fn learn_set_name(
    family: Family,
    direction: Direction,
    timeout_secs: u64,
    size: u32,
) -> String {
    let f = match family {
        Family::Ipv4 => 4,
        Family::Ipv6 => 6,
    };
    let d = match direction {
        Direction::Ingress => "in",
        Direction::Egress => "out",
    };
    let mut h = StableHasher::default();
    h.write(&timeout_secs.to_be_bytes());
    h.write(&size.to_be_bytes());
    format!("lrn{f}_{d}_{:016x}", h.finish())
}

/// The families learn mode watches on an interface: those of its addresses, both when it has
/// none (nothing then says which family its traffic uses).
fn learn_families(ips: &[std::net::IpAddr]) -> Vec<Family> {
    let v4 = ips.iter().any(|ip| ip.is_ipv4());
    let v6 = ips.iter().any(|ip| ip.is_ipv6());
    match (v4, v6) {
        (true, false) => vec![Family::Ipv4],
        (false, true) => vec![Family::Ipv6],
        _ => vec![Family::Ipv4, Family::Ipv6],
    }
}

/// The learn rules of one (interface, direction) and the learn sets they use (see the module
/// doc, "Learn mode").
fn learn_rules(
    iface: &netwarden_engine::InterfaceRules,
    direction: Direction,
    key: LogKey,
    opts: &RenderOptions,
    sets: &mut Vec<LearnSetDef>,
) -> Vec<Rule> {
    let by = match direction {
        Direction::Ingress => IfBy::In,
        Direction::Egress => IfBy::Out,
    };
    let mut out = Vec::new();
    for family in learn_families(&iface.ips) {
        let name = learn_set_name(
            family,
            direction,
            opts.learn_window_secs,
            opts.learn_set_size,
        );
        if !sets.iter().any(|s| s.name == name) {
            sets.push(LearnSetDef {
                name: name.clone(),
                family,
                direction,
                timeout_secs: opts.learn_window_secs,
                size: opts.learn_set_size,
            });
        }
        let lk = LearnKey {
            family,
            direction,
            set: name,
        };
        for protocol in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
            let matches = vec![
                Match::Ct(CtMatch::New),
                Match::IfName {
                    by,
                    name: iface.name.clone(),
                },
                Match::L4Proto(protocol),
                Match::NotLearned(lk.clone()),
            ];
            out.push(Rule::new(
                matches.clone(),
                vec![
                    Stmt::Learn(lk.clone()),
                    Stmt::Log {
                        group: opts.nflog_group,
                        action: LogAction::Observed,
                        key,
                    },
                ],
                Verdict::Continue,
            ));
            out.push(Rule::new(
                matches,
                vec![Stmt::Counter(LEARN_FULL_COUNTER.into())],
                Verdict::Continue,
            ));
        }
    }
    out
}

/// Builds the IR, deduplicating address sets by content.
struct Builder<'a> {
    opts: &'a RenderOptions,
    sets: BTreeMap<(Family, Vec<(u128, u128)>), String>,
    set_defs: Vec<AddrSetDef>,
    used_limits: [bool; 2],
    /// The evidence counters the monitored chains use ([`CounterKind`]), in order of use.
    counters: Vec<String>,
}

/// What a tier pipeline does with its decision: accept or go to the deny chain (enforced
/// only), or record it in a mark bit and return (monitored).
struct TierOutcome {
    allow_stmts: Vec<Stmt>,
    allow: Verdict,
    deny: Verdict,
}

/// The clause outgoing DNS is allowed by when a view implies it (SPEC 3.1).
fn dns_clause() -> Clause {
    Clause {
        peers: PeerMatch::Any,
        ports: PortMatch::Only(vec![
            PortRange {
                protocol: Protocol::Tcp,
                ports: Some((53, 53)),
            },
            PortRange {
                protocol: Protocol::Udp,
                ports: Some((53, 53)),
            },
        ]),
    }
}

impl Builder<'_> {
    fn set_for(&mut self, family: Family, ranges: Vec<(u128, u128)>) -> String {
        if let Some(name) = self.sets.get(&(family, ranges.clone())) {
            return name.clone();
        }
        let mut name = set_name(family, &ranges);
        // Two contents with one hash in one table would merge into one set: astronomically
        // unlikely, but then the second gets a suffix rather than the union of both.
        let base = name.clone();
        let mut n = 1;
        while self.set_defs.iter().any(|d| d.name == name) {
            name = format!("{base}_{n}");
            n += 1;
        }
        self.set_defs.push(AddrSetDef {
            name: name.clone(),
            family,
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
                for (family, ranges) in [
                    (Family::Ipv4, v4_ranges(set)),
                    (Family::Ipv6, v6_ranges(set)),
                ] {
                    if ranges.is_empty() {
                        continue;
                    }
                    let name = self.set_for(family, ranges);
                    out.push(Some(Match::Addr {
                        family,
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
                // Ports first: a port compare is cheaper than a set lookup, and a rule whose
                // port does not match (most, for a given connection) skips the lookup.
                let mut m = Vec::new();
                m.extend(q.iter().cloned());
                m.extend(p.clone());
                out.push(m);
            }
        }
        out
    }

    /// One rule per expanded clause of `iso` (preceded by the implicit DNS clause when `dns`),
    /// each with `stmts` and `verdict`; an open view gives one unconditional rule.
    fn view_rules(
        &mut self,
        iso: &Isolation,
        dns: bool,
        end: AddrEnd,
        stmts: &[Stmt],
        verdict: &Verdict,
    ) -> Vec<Rule> {
        let mut out: Vec<Rule> = Vec::new();
        let mut seen: HashSet<Vec<Match>> = HashSet::new();
        let rules = match iso {
            Isolation::Open => {
                out.push(Rule::new(vec![], stmts.to_vec(), verdict.clone()));
                return out;
            }
            Isolation::Isolated(rules) => rules,
        };
        let implicit = dns.then(dns_clause);
        let clauses = implicit.iter().map(|c| (c, None)).chain(
            rules
                .iter()
                .flat_map(|r| r.clauses.iter().map(move |c| (c, Some(r.origin.clone())))),
        );
        for (clause, origin) in clauses {
            for matches in self.clause_matches(clause, end) {
                // Two clauses can expand to the same rule: keep the first.
                if !seen.insert(matches.clone()) {
                    continue;
                }
                out.push(Rule {
                    matches,
                    stmts: stmts.to_vec(),
                    verdict: verdict.clone(),
                    origin: origin.clone(),
                });
            }
        }
        out
    }

    /// A log rule of new connections matching `pre`, under the direction's rate limit; a
    /// would-deny one also counts what it logs (`Logged`, after the limit).
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
        let mut stmts = Vec::new();
        if action == LogAction::WouldDeny {
            stmts.push(Stmt::Counter(self.counter(CounterKind::Logged, key)));
        }
        stmts.push(Stmt::Log {
            group: self.opts.nflog_group,
            action,
            key,
        });
        Rule::new(matches, stmts, Verdict::Continue)
    }

    /// The name of evidence counter `kind` of `key`, declared in the table.
    fn counter(&mut self, kind: CounterKind, key: LogKey) -> String {
        let name = counter_name(kind, key);
        if !self.counters.contains(&name) {
            self.counters.push(name.clone());
        }
        name
    }

    /// `[matches] ct state new counter name "<kind counter of key>"`: counts, decides nothing.
    fn count_new(&mut self, mut matches: Vec<Match>, kind: CounterKind, key: LogKey) -> Rule {
        matches.push(Match::Ct(CtMatch::New));
        let counter = self.counter(kind, key);
        Rule::new(matches, vec![Stmt::Counter(counter)], Verdict::Continue)
    }

    /// The rules of `tier` (an Admin or Baseline view) as the first-match list SPEC 8 asks
    /// for, run by run ([`crate::tiers`]: consecutive rules of one action merged), each with
    /// the verdict of its action (`pass`: what a Pass does here; `None`: it decides nothing,
    /// the Baseline tier).
    fn tier_rules(
        &mut self,
        tier: &[TierRule],
        end: AddrEnd,
        outcome: &TierOutcome,
        pass: Option<&Verdict>,
    ) -> Vec<Rule> {
        let mut out = Vec::new();
        for run in tier_runs(tier, pass.is_none()) {
            let (stmts, verdict) = match (run.action, pass) {
                (AdminAction::Allow, _) => (outcome.allow_stmts.clone(), outcome.allow.clone()),
                (AdminAction::Deny, _) => (Vec::new(), outcome.deny.clone()),
                (AdminAction::Pass, Some(pass)) => (Vec::new(), pass.clone()),
                (AdminAction::Pass, None) => continue,
            };
            for clause in &run.clauses {
                for matches in self.clause_matches(clause, end) {
                    out.push(Rule::new(matches, stmts.clone(), verdict.clone()));
                }
            }
        }
        out
    }

    /// One view's tier pipeline (SPEC 8) as chains: `entry` holds the Admin tier's rules and
    /// hands over to `<entry>_ns` (a Pass, or no Admin rule matched) with a `goto`; that chain
    /// holds the namespaced tier when a namespaced policy isolates the direction, else the
    /// Baseline tier's rules and the default allow. Every path ends in `outcome`.
    fn pipeline(
        &mut self,
        dr: &DirectionRules,
        staged: bool,
        end: AddrEnd,
        outcome: &TierOutcome,
        entry: &str,
    ) -> Vec<Chain> {
        let mut namespaced = match dr.isolation(staged) {
            iso @ Isolation::Isolated(_) => {
                let dns = dr.implicit_dns.in_view(staged);
                let mut rules =
                    self.view_rules(iso, dns, end, &outcome.allow_stmts, &outcome.allow);
                rules.push(Rule::new(vec![], vec![], outcome.deny.clone()));
                rules
            }
            Isolation::Open => {
                // Pass is refused in the Baseline tier at the edge; were one here, it would
                // decide nothing (left out).
                let mut rules = self.tier_rules(dr.baseline.view(staged), end, outcome, None);
                rules.push(Rule::new(
                    vec![],
                    outcome.allow_stmts.clone(),
                    outcome.allow.clone(),
                ));
                rules
            }
        };
        let admin = dr.admin.view(staged);
        if admin.is_empty() {
            return vec![Chain {
                name: entry.to_string(),
                hook: None,
                rules: std::mem::take(&mut namespaced),
            }];
        }
        let handover = Verdict::Goto(format!("{entry}_ns"));
        let mut rules = self.tier_rules(admin, end, outcome, Some(&handover));
        rules.push(Rule::new(vec![], vec![], handover));
        vec![
            Chain {
                name: entry.to_string(),
                hook: None,
                rules,
            },
            Chain {
                name: format!("{entry}_ns"),
                hook: None,
                rules: namespaced,
            },
        ]
    }

    /// The chains of one (interface, direction) with admin policy rules (SPEC 8), `name`
    /// first (the one the base chain jumps to). Enforced only: the pipeline itself, accepting
    /// or going to `<name>_deny` (log, reject). With a monitored view: the staged and the
    /// enforced pipelines each record their decision in a mark bit and return, then the
    /// monitor bookkeeping of [`Builder::direction_chain`] and the enforced decision.
    fn tier_chains(
        &mut self,
        dr: &DirectionRules,
        direction: Direction,
        key: LogKey,
        name: &str,
    ) -> Vec<Chain> {
        let end = match direction {
            Direction::Ingress => AddrEnd::Src,
            Direction::Egress => AddrEnd::Dst,
        };
        let mut deny = Vec::new();
        if dr.log_denies {
            deny.push(self.log_rule(direction, vec![], LogAction::Deny, key));
        }
        deny.extend(Self::reject_rules());
        if !dr.has_monitor() {
            let deny_chain = format!("{name}_deny");
            let outcome = TierOutcome {
                allow_stmts: Vec::new(),
                allow: Verdict::Accept,
                deny: Verdict::Goto(deny_chain.clone()),
            };
            let mut chains = self.pipeline(dr, false, end, &outcome, name);
            chains.push(Chain {
                name: deny_chain,
                hook: None,
                rules: deny,
            });
            return chains;
        }
        let staged = self.opts.staged_mark;
        let allow = self.opts.allow_mark;
        let bits = self.opts.monitor_bits();
        let recorded = |bit: u32| TierOutcome {
            allow_stmts: vec![Stmt::SetMark(bit)],
            allow: Verdict::Return,
            deny: Verdict::Return,
        };
        let (staged_entry, enforced_entry) = (format!("{name}_s"), format!("{name}_e"));
        let mut rules = vec![
            self.count_new(vec![], CounterKind::Connections, key),
            Rule::new(vec![], vec![Stmt::ClearMark(bits)], Verdict::Continue),
            Rule::new(vec![], vec![], Verdict::Jump(staged_entry.clone())),
            Rule::new(vec![], vec![], Verdict::Jump(enforced_entry.clone())),
        ];
        let would_deny = Match::Mark {
            mask: bits,
            value: allow,
        };
        rules.push(self.count_new(vec![would_deny.clone()], CounterKind::WouldDeny, key));
        rules.push(self.log_rule(direction, vec![would_deny], LogAction::WouldDeny, key));
        rules.push(Rule::new(
            vec![Match::Mark {
                mask: allow,
                value: allow,
            }],
            vec![Stmt::ClearMark(bits)],
            Verdict::Accept,
        ));
        rules.extend(deny);
        let mut chains = vec![Chain {
            name: name.to_string(),
            hook: None,
            rules,
        }];
        chains.extend(self.pipeline(dr, true, end, &recorded(staged), &staged_entry));
        chains.extend(self.pipeline(dr, false, end, &recorded(allow), &enforced_entry));
        chains
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
        let dns = dr.implicit_dns;
        let enforced_isolated = dr.enforced.is_isolated();
        let mut rules = Vec::new();
        if !dr.has_monitor() {
            rules.extend(self.view_rules(&dr.enforced, dns.enforced, end, &[], &Verdict::Accept));
        } else {
            let staged = self.opts.staged_mark;
            let allow = self.opts.allow_mark;
            let bits = self.opts.monitor_bits();
            rules.push(self.count_new(vec![], CounterKind::Connections, key));
            rules.push(Rule::new(
                vec![],
                vec![Stmt::ClearMark(bits)],
                Verdict::Continue,
            ));
            rules.extend(self.view_rules(
                &dr.staged,
                dns.staged,
                end,
                &[Stmt::SetMark(staged)],
                &Verdict::Continue,
            ));
            rules.extend(self.view_rules(
                &dr.enforced,
                dns.enforced,
                end,
                &[Stmt::SetMark(allow)],
                &Verdict::Continue,
            ));
            let would_deny = Match::Mark {
                mask: bits,
                value: allow,
            };
            // Every would-deny is counted; the log rule counts what passes its rate limit.
            rules.push(self.count_new(vec![would_deny.clone()], CounterKind::WouldDeny, key));
            let wd = self.log_rule(direction, vec![would_deny], LogAction::WouldDeny, key);
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
        } else {
            // Monitor only: the base chain goes on after the jump returns (and may end in a
            // reject), so the chain decides itself.
            rules.push(Rule::new(vec![], vec![], Verdict::Accept));
        }
        rules
    }
}

fn v4_ranges(set: &AddrSet) -> Vec<(u128, u128)> {
    set.v4_ranges()
        .map(|(lo, hi)| (u128::from(u32::from(lo)), u128::from(u32::from(hi))))
        .collect()
}

fn v6_ranges(set: &AddrSet) -> Vec<(u128, u128)> {
    set.v6_ranges()
        .map(|(lo, hi)| (u128::from(lo), u128::from(hi)))
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

/// Builds the table for a pod: `Ok(None)` when nothing is isolated and the pod does not learn
/// (the table must then be absent), an error when an interface that needs a rule cannot be
/// matched exactly.
pub fn build_table(rules: &PodRules, opts: &RenderOptions) -> Result<Option<Table>, RenderError> {
    if !rules.needs_rules() {
        return Ok(None);
    }
    let keys = assign_keys(rules);
    let mut b = Builder {
        opts,
        sets: BTreeMap::new(),
        set_defs: Vec::new(),
        used_limits: [false, false],
        counters: Vec::new(),
    };
    // Sorted by name so chain numbering does not depend on the engine's interface order.
    let mut ifaces: Vec<_> = rules.interfaces.iter().collect();
    ifaces.sort_by(|a, b| a.name.cmp(&b.name));

    let mut chains = Vec::new();
    let mut any_enforced = false;
    let mut learn_sets = Vec::new();
    let mut learn_in = Vec::new();
    let mut learn_out = Vec::new();
    let unmatchable = |name: &str| {
        ifname_match_error(name).map(|reason| RenderError::UnmatchableInterface {
            pod: rules.pod.clone(),
            name: name.to_string(),
            backend: "nft",
            reason,
        })
    };
    if rules.learn {
        for iface in &ifaces {
            if let Some(e) = unmatchable(&iface.name) {
                return Err(e);
            }
            for (direction, out) in [
                (Direction::Ingress, &mut learn_in),
                (Direction::Egress, &mut learn_out),
            ] {
                let key = keys[&(iface.name.clone(), direction)];
                out.extend(learn_rules(iface, direction, key, opts, &mut learn_sets));
            }
        }
    }
    let plan = dispatch::plan(&ifaces);
    // Every interface the plan names is matched by name, open ones included.
    for p in [&plan.input, &plan.output].into_iter().flatten() {
        for (name, _) in &p.by_iface {
            if let Some(e) = unmatchable(name) {
                return Err(e);
            }
        }
    }
    let chain_name = |direction: Direction, n: usize| match direction {
        Direction::Ingress => format!("in_{n}"),
        Direction::Egress => format!("out_{n}"),
    };
    for (n, iface) in ifaces.iter().enumerate() {
        for direction in [Direction::Ingress, Direction::Egress] {
            let dr = iface.direction(direction);
            if !dispatch::has_chain(dr) {
                continue;
            }
            any_enforced |= dr.enforced.is_isolated();
            let key = keys[&(iface.name.clone(), direction)];
            if dr.has_tiers() {
                chains.extend(b.tier_chains(dr, direction, key, &chain_name(direction, n)));
                continue;
            }
            let chain_rules = b.direction_chain(dr, direction, key);
            chains.push(Chain {
                name: chain_name(direction, n),
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
    // The dispatch plan as rules: `ip daddr A jump in_0`, `iifname "X" jump in_0` (string and
    // address compares, no map lookup), `… accept` for open interfaces, then the reject that
    // closes what is not known.
    let dispatch = |direction: Direction, by: IfBy, p: &dispatch::DirectionPlan| {
        let verdict = |t: dispatch::Target| match t {
            dispatch::Target::Chain(n) => Verdict::Jump(chain_name(direction, n)),
            dispatch::Target::Accept => Verdict::Accept,
        };
        let end = match direction {
            Direction::Ingress => AddrEnd::Dst,
            Direction::Egress => AddrEnd::Src,
        };
        let mut out: Vec<Rule> = p
            .by_addr
            .iter()
            .map(|&(addr, t)| Rule::new(vec![Match::AddrIs { end, addr }], vec![], verdict(t)))
            .collect();
        out.extend(p.by_iface.iter().map(|(name, t)| {
            Rule::new(
                vec![Match::IfName {
                    by,
                    name: name.clone(),
                }],
                vec![],
                verdict(*t),
            )
        }));
        if p.reject_rest {
            out.extend(Builder::reject_rules());
        }
        out
    };
    let established = || {
        Rule::new(
            vec![Match::Ct(CtMatch::EstablishedRelated)],
            vec![],
            Verdict::Accept,
        )
    };
    let mut base = Vec::new();
    for (hook, lo, p, learn, by, direction) in [
        (
            Hook::Input,
            Match::IifLoopback,
            &plan.input,
            learn_in,
            IfBy::In,
            Direction::Ingress,
        ),
        (
            Hook::Output,
            Match::OifLoopback,
            &plan.output,
            learn_out,
            IfBy::Out,
            Direction::Egress,
        ),
    ] {
        if p.is_none() && learn.is_empty() {
            continue;
        }
        let mut r = vec![Rule::new(vec![lo], vec![], Verdict::Accept), established()];
        // Learn rules see every new flow before any policy chain decides (module doc).
        r.extend(learn);
        r.extend(nd());
        if let Some(p) = p {
            r.extend(dispatch(direction, by, p));
        }
        base.push(Chain {
            name: hook.as_str().into(),
            hook: Some(hook),
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
    let mut counters = b.counters;
    if !learn_sets.is_empty() {
        counters.push(LEARN_FULL_COUNTER.to_string());
    }
    Ok(Some(Table {
        limits,
        sets: b.set_defs,
        learn_sets,
        counters,
        chains: base,
    }))
}

/// The nft text that brings an empty netns to the pod's table (what `netwarden render`
/// prints), or that removes the table when nothing is isolated.
pub fn render_nft(rules: &PodRules, opts: &RenderOptions) -> Result<String, RenderError> {
    Ok(match build_table(rules, opts)? {
        Some(table) => Transaction::create(&table).to_text(),
        None => Transaction::removal().to_text(),
    })
}

/// Prints one rule as it appears in nft text.
pub fn render_rule(rule: &Rule) -> String {
    transaction::rule_text(rule)
}

/// Number of rules in nft text: ours (`add rule` lines) or `nft list` output (the lines
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
