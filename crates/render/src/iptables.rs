//! The iptables compatibility backend (SPEC 5, seed 004 "DANM Policer"): [`PodRules`] →
//! `ipset restore` text plus one `iptables-restore` / `ip6tables-restore` text per family.
//!
//! # Ownership
//!
//! In iptables mode netwarden owns the **filter table** of the pod netns, like DANM Policer did:
//! the v4 and v6 texts are full `*filter` tables (no `--noflush`), so one restore per family
//! replaces the whole table in one kernel transaction (legacy and nf_tables variants both commit
//! a table atomically). Chains of other tools in the pod's filter table do not survive; the nat,
//! mangle and raw tables are never touched.
//!
//! # Layout (per family; `V4` shown)
//!
//! ```text
//! INPUT:   -i lo ACCEPT · ctstate RELATED,ESTABLISHED ACCEPT · [v6: ICMPv6 RS/RA/NS/NA ACCEPT]
//!          · -j DANM_INGRESS_V4
//! OUTPUT:  -o lo ACCEPT · established ACCEPT · [v6: ND] · -j DANM_EGRESS_V4
//! FORWARD: REJECT (tcp-reset / port-unreachable) when an interface is isolated (enforced)
//! DANM_INGRESS_V4: the dispatch plan (crate::dispatch), by destination address first:
//!                  -d 10.0.0.1/32 -j DANM_IN_0   (an address of an interface isolated or
//!                                                 monitored: judged by its owner's chain
//!                                                 whatever interface it arrives on)
//!                  -d 10.1.0.1/32 -j ACCEPT      (an address of an open interface)
//!                  -i eth0 -j DANM_IN_0 · -i net1 -j ACCEPT   (other destinations)
//!                  REJECT                        (when any interface is enforced-isolated:
//!                                                 an interface netwarden does not know)
//! DANM_EGRESS_V4:  -o eth0 -j DANM_OUT_0 · -o net1 -j ACCEPT · REJECT (egress enforced)
//! DANM_IN_0:       [implicit DNS] allow rules … then deny log … then REJECT (monitor only:
//!                  ACCEPT, the entry chain goes on after the jump returns)
//! ```
//!
//! The seed puts its terminal REJECT in INPUT/OUTPUT after the jump; here each per-interface
//! chain ends with its own verdict and the entry chain accepts open interfaces by name before
//! its final REJECT, because a NetworkPolicy isolates only the primary interface and a
//! MultiNetworkPolicy only some networks: traffic of an open interface must pass. Outgoing
//! DNS without a rule (SPEC 3.1) is an allow rule of the view that implies it, at the top of the
//! interface's chain.
//!
//! Interface names are written as they are when they are plain (`[A-Za-z0-9_.@-]`), else in
//! double quotes with `\` and `"` escaped (iptables-restore's quoting). iptables reads a trailing
//! `+` as a wildcard and has no escape for it: a pod with such an interface (open ones
//! included: each gets an accept by name) is refused ([`RenderError`]), never programmed with a
//! rule that would match other interfaces or none.
//!
//! # Peers
//!
//! Peer addresses go into `hash:net` ipsets, one `-m set --match-set NAME src|dst` per clause,
//! so the rule count does not grow with the number of peers. `hash:net` takes no `/0`, so an
//! "everything" block is stored as its two halves (`0.0.0.0/1`, `128.0.0.0/1`; `::/1`,
//! `8000::/1`). A set's name is derived from its
//! content (`nw4-<the content hash of the CIDRs>`): a name always means the same addresses, so the sets of
//! a new ruleset can be created next to the old ones before the restore switches the rules over,
//! and no packet ever sees an old rule with new set content or the reverse. Each set is still
//! filled through a temporary (`nwt4-…`) and `swap`ped in, so a live set that somehow differs
//! (a crash mid-fill, a manual edit) is corrected atomically.
//!
//! # Monitor (seed 000)
//!
//! A direction with monitored policies evaluates both views with two mark bits: the chain clears
//! both, enforced allow rules set `allow_mark`, staged allow rules set `staged_mark`; a NEW
//! connection with allow-but-not-staged is logged (NFLOG, `nw:wd:<key>`), then allow-marked
//! packets are accepted and the rest rejected — so enforcement is exactly the enforced view.
//! Directions without monitoring carry no mark rules. The evidence counters of the `status`
//! records are rule counters marked with a comment naming them (`nw_cn_<key>` counts new
//! connections at the top of the chain, `nw_wd_<key>` every would-deny, `nw_wl_<key>` is the
//! log rule itself: what passed the limit). `-m limit` rules are per rule, and the
//! ruleset is per pod netns, so each limit is per pod, direction and family.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use ipnet::IpNet;
use netwarden_engine::{
    AddrSet, AdminAction, Direction, DirectionRules, Family, InterfaceRules, Isolation, PeerMatch,
    PodRules, PortMatch, PortRange, Protocol, TierRule,
};

use crate::dispatch::{self, Target};
use crate::logkey::{counter_name, log_key_for, log_prefix, CounterKind, LogAction, LogKey};
use crate::nft::RenderError;
use crate::options::RenderOptions;
use crate::tiers::tier_runs;
use netwarden_engine::hash::hash_bytes;

/// `-m comment --comment nw_cn_<key>`: marks a rule whose packet counter is evidence counter
/// `kind` (a rule with no target only counts). The comment is the name [`counter_name`]
/// gives, read back from `iptables-save -c`.
fn counter_comment(kind: CounterKind, key: u32) -> String {
    format!("-m comment --comment {}", counter_name(kind, LogKey(key)))
}

/// The fastest rate `-m limit` can hold: it counts in 1/10,000 s, so 10,000/s (600,000/min).
/// iptables-restore rejects the whole ruleset for a faster rate ("Rate too fast"), so a faster
/// asked rate is clamped: the closest the backend can do (nft has no such ceiling).
const LIMIT_MAX_PER_MINUTE: u32 = 600_000;
/// The largest `--limit-burst` iptables accepts (above it the restore fails).
const LIMIT_MAX_BURST: u32 = 10_000;

/// The entry chains of seed 004.
pub const INGRESS_V4: &str = "DANM_INGRESS_V4";
pub const EGRESS_V4: &str = "DANM_EGRESS_V4";
pub const INGRESS_V6: &str = "DANM_INGRESS_V6";
pub const EGRESS_V6: &str = "DANM_EGRESS_V6";

/// Prefix of every chain netwarden creates in iptables mode (how another backend's leftovers are
/// recognised).
pub const CHAIN_PREFIX: &str = "DANM_";

/// Prefixes of the ipsets netwarden owns (live and temporary, both families). Nothing else in a
/// pod netns is ever destroyed.
pub const OWNED_SET_PREFIXES: [&str; 4] = ["nw4-", "nw6-", "nwt4-", "nwt6-"];

/// Most ports one `multiport` match takes (a range counts twice).
const MULTIPORT_MAX: usize = 15;

/// Default `maxelem` of an ipset; larger sets get their size instead.
const IPSET_MAXELEM: usize = 65536;

/// One `hash:net` ipset the rules reference; its name is a function of family and content.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IpsetDef {
    pub name: String,
    pub family: Family,
    /// What the set holds, never a `/0` (see the module doc).
    pub cidrs: Vec<IpNet>,
}

impl IpsetDef {
    /// The temporary set the content is filled into before it is swapped in.
    pub fn temporary_name(&self) -> String {
        self.name.replacen("nw", "nwt", 1)
    }
}

/// What one pod netns is programmed with in iptables mode.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct IptablesRuleset {
    /// Every set the rules reference (sorted by name).
    pub sets: Vec<IpsetDef>,
    /// `iptables-restore` text: the whole filter table.
    pub v4: String,
    /// `ip6tables-restore` text: the whole filter table.
    pub v6: String,
    /// Whether the rules hold evidence counters (a direction is monitored): a restore resets
    /// rule counters, so the dataplane reads them before it replaces these rules.
    pub counted: bool,
}

impl IptablesRuleset {
    /// The ruleset of a pod nothing isolates: empty filter tables, no sets. Applying it removes
    /// everything netwarden had programmed (stale sets are destroyed after the restore).
    pub fn empty() -> Self {
        IptablesRuleset {
            sets: Vec::new(),
            v4: empty_filter_table(),
            v6: empty_filter_table(),
            counted: false,
        }
    }

    /// Names of the live sets the rules reference.
    pub fn set_names(&self) -> BTreeSet<String> {
        self.sets.iter().map(|s| s.name.clone()).collect()
    }

    /// `ipset restore` script: for each set, make sure the live set exists, fill a temporary,
    /// swap it in and destroy it. `maxelem` depends only on the content, so `create -exist` of
    /// an existing live set (same name, same content) is always accepted. Empty when there is
    /// no set.
    pub fn ipset_script(&self) -> String {
        let mut out = String::new();
        for set in &self.sets {
            let tmp = set.temporary_name();
            let spec = format!(
                "hash:net family {} maxelem {}",
                ipset_family(set.family),
                set.cidrs.len().max(IPSET_MAXELEM)
            );
            let _ = writeln!(out, "create {} {spec} -exist", set.name);
            let _ = writeln!(out, "create {tmp} {spec} -exist");
            let _ = writeln!(out, "flush {tmp}");
            for c in &set.cidrs {
                let _ = writeln!(out, "add {tmp} {c}");
            }
            let _ = writeln!(out, "swap {tmp} {}", set.name);
            let _ = writeln!(out, "destroy {tmp}");
        }
        out
    }
}

/// A filter table with the built-in chains accepting and no rule.
pub fn empty_filter_table() -> String {
    "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n"
        .to_string()
}

/// Whether netwarden owns the ipset `name` (by prefix).
pub fn is_owned_set(name: &str) -> bool {
    OWNED_SET_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Whether an interface name can be written into a rule as is, unquoted: `[A-Za-z0-9_.@-]`.
pub fn safe_interface_name(name: &str) -> bool {
    (1..=15).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'@' | b'-'))
}

/// An interface name as an iptables-restore argument matching exactly that interface, or why
/// there is none.
pub fn iptables_ifname(name: &str) -> Result<String, &'static str> {
    if name.is_empty() {
        return Err("an empty name matches nothing");
    }
    if name.ends_with('+') {
        return Err("iptables reads a trailing '+' as a wildcard and has no escape for it (the nft backend matches it)");
    }
    if safe_interface_name(name) {
        return Ok(name.to_string());
    }
    Ok(format!(
        "\"{}\"",
        name.replace('\\', "\\\\").replace('"', "\\\"")
    ))
}

fn entry_chain(family: Family, dir: Direction) -> &'static str {
    match (family, dir) {
        (Family::Ipv4, Direction::Ingress) => INGRESS_V4,
        (Family::Ipv4, Direction::Egress) => EGRESS_V4,
        (Family::Ipv6, Direction::Ingress) => INGRESS_V6,
        (Family::Ipv6, Direction::Egress) => EGRESS_V6,
    }
}

fn port_unreachable(family: Family) -> &'static str {
    match family {
        Family::Ipv4 => "icmp-port-unreachable",
        Family::Ipv6 => "icmp6-port-unreachable",
    }
}

fn ipset_family(family: Family) -> &'static str {
    match family {
        Family::Ipv4 => "inet",
        Family::Ipv6 => "inet6",
    }
}

fn family_tag(family: Family) -> &'static str {
    match family {
        Family::Ipv4 => "4",
        Family::Ipv6 => "6",
    }
}

/// The CIDRs of `set` in `family` as a `hash:net` set holds them: a `/0` becomes its two
/// halves. Empty: the set matches nothing in this family.
fn ipset_cidrs(family: Family, set: &AddrSet) -> Vec<IpNet> {
    let cidrs: Vec<IpNet> = match family {
        Family::Ipv4 => set.v4_cidrs().into_iter().map(IpNet::V4).collect(),
        Family::Ipv6 => set.v6_cidrs().into_iter().map(IpNet::V6).collect(),
    };
    cidrs
        .into_iter()
        .flat_map(|c| match c.prefix_len() {
            0 => c.subnets(1).expect("a /0 has /1 subnets").collect(),
            _ => vec![c],
        })
        .collect()
}

/// Whether a direction gets a chain of its own: isolated in the enforced or the staged view
/// (the same test as the nft backend's, [`dispatch::has_chain`]).
pub fn needs_chain(dr: &DirectionRules) -> bool {
    dispatch::has_chain(dr)
}

/// Per-interface chain name: generated, never from an object's name.
fn sub_chain(dir: Direction, index: usize) -> String {
    match dir {
        Direction::Ingress => format!("DANM_IN_{index}"),
        Direction::Egress => format!("DANM_OUT_{index}"),
    }
}

/// The sets referenced by a ruleset, by name; the name is a function of family and content.
#[derive(Default)]
struct SetRegistry {
    sets: BTreeMap<String, IpsetDef>,
}

impl SetRegistry {
    /// The set holding `cidrs` (non-empty), registering it on first use.
    fn name_for(&mut self, family: Family, cidrs: Vec<IpNet>) -> String {
        let listed: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
        let key = format!("{}|{}", family_tag(family), listed.join(","));
        let name = format!(
            "nw{}-{:016x}",
            family_tag(family),
            hash_bytes(key.as_bytes())
        );
        self.sets.entry(name.clone()).or_insert(IpsetDef {
            name: name.clone(),
            family,
            cidrs,
        });
        name
    }
}

/// The targets of a tier pipeline's decisions (see `FamilyRenderer::pipeline`).
struct TierTargets {
    allow: String,
    deny: String,
}

/// What the allow rules of a chain do.
#[derive(Clone, Copy)]
enum AllowAction {
    Accept,
    /// Set this mark bit (monitor bookkeeping).
    Mark(u32),
}

impl AllowAction {
    fn target(self) -> String {
        match self {
            AllowAction::Accept => "-j ACCEPT".to_string(),
            AllowAction::Mark(bit) => format!("-j MARK --set-xmark {bit:#x}/{bit:#x}"),
        }
    }
}

/// Port matches of one clause: one string per rule to emit (empty string = every protocol and
/// port). Several when protocols differ or more than [`MULTIPORT_MAX`] ports are listed.
fn port_matches(ports: &PortMatch) -> Vec<String> {
    let ranges = match ports {
        PortMatch::Any => return vec![String::new()],
        PortMatch::Only(ranges) => ranges,
    };
    let mut by_proto: BTreeMap<Protocol, Option<BTreeSet<(u16, u16)>>> = BTreeMap::new();
    for PortRange { protocol, ports } in ranges {
        let entry = by_proto
            .entry(*protocol)
            .or_insert_with(|| Some(BTreeSet::new()));
        match (ports, entry.as_mut()) {
            // Every port of the protocol subsumes any list.
            (None, _) => *entry = None,
            (Some(r), Some(list)) => {
                list.insert(*r);
            }
            (Some(_), None) => {}
        }
    }
    let mut out = Vec::new();
    for (proto, list) in by_proto {
        let p = proto.lower();
        let Some(list) = list else {
            out.push(format!("-p {p}"));
            continue;
        };
        let specs: Vec<(String, usize)> = list
            .into_iter()
            .map(|(lo, hi)| {
                if lo == hi {
                    (lo.to_string(), 1)
                } else {
                    (format!("{lo}:{hi}"), 2)
                }
            })
            .collect();
        if let [(one, _)] = specs.as_slice() {
            out.push(format!("-p {p} -m {p} --dport {one}"));
            continue;
        }
        let mut chunk: Vec<&str> = Vec::new();
        let mut weight = 0;
        for (spec, w) in &specs {
            if weight + w > MULTIPORT_MAX {
                out.push(format!("-p {p} -m multiport --dports {}", chunk.join(",")));
                chunk.clear();
                weight = 0;
            }
            chunk.push(spec);
            weight += w;
        }
        out.push(format!("-p {p} -m multiport --dports {}", chunk.join(",")));
    }
    out
}

/// Renders one family's filter table.
struct FamilyRenderer<'a> {
    family: Family,
    opts: &'a RenderOptions,
    sets: &'a mut SetRegistry,
    /// User chains, in declaration order.
    chains: Vec<String>,
    /// (chain, rule spec), in evaluation order within each chain.
    rules: Vec<(String, String)>,
}

impl FamilyRenderer<'_> {
    fn rule(&mut self, chain: &str, spec: &str) {
        self.rules.push((chain.to_string(), spec.to_string()));
    }

    fn reject(&mut self, chain: &str) {
        self.rule(chain, "-p tcp -j REJECT --reject-with tcp-reset");
        let unreachable = format!("-j REJECT --reject-with {}", port_unreachable(self.family));
        self.rule(chain, &unreachable);
    }

    fn log(&mut self, chain: &str, mark: Option<(u32, u32)>, action: LogAction, key: Option<u32>) {
        let Some(key) = key else { return };
        let o = self.opts;
        let mark = mark
            .map(|(v, m)| format!("-m mark --mark {v:#x}/{m:#x} "))
            .unwrap_or_default();
        // A would-deny log rule's packet counter is the `Logged` evidence counter.
        let counted = if action == LogAction::WouldDeny {
            format!("{} ", counter_comment(CounterKind::Logged, key))
        } else {
            String::new()
        };
        let spec = format!(
            "{mark}-m conntrack --ctstate NEW -m limit --limit {}/min --limit-burst {} {counted}-j NFLOG --nflog-group {} --nflog-prefix \"{}\"",
            o.log_rate_per_minute.min(LIMIT_MAX_PER_MINUTE),
            o.log_burst.min(LIMIT_MAX_BURST),
            o.nflog_group,
            log_prefix(action, LogKey(key)),
        );
        self.rule(chain, &spec);
    }

    /// The rules of `isolation` with `action` (preceded by outgoing DNS when `dns`); an open
    /// view allows everything.
    fn allow_rules(
        &mut self,
        chain: &str,
        dir: Direction,
        isolation: &Isolation,
        dns: bool,
        action: AllowAction,
    ) {
        self.allow_rules_to(chain, dir, isolation, dns, &action.target());
    }

    /// The peer match of a clause in this family (`Some("")` for any peer), `None` when the
    /// clause names no address of this family (it matches nothing here).
    fn peer_match(&mut self, dir: Direction, peers: &PeerMatch) -> Option<String> {
        let side = match dir {
            Direction::Ingress => "src",
            Direction::Egress => "dst",
        };
        match peers {
            PeerMatch::Any => Some(String::new()),
            PeerMatch::Addrs(set) => {
                let cidrs = ipset_cidrs(self.family, set);
                if cidrs.is_empty() {
                    return None;
                }
                Some(format!(
                    "-m set --match-set {} {side} ",
                    self.sets.name_for(self.family, cidrs)
                ))
            }
        }
    }

    /// A tier's rules (SPEC 8) in order, run by run ([`crate::tiers`]: consecutive rules of one
    /// action merged), each expansion with its action's target (`pass`: a Pass's; `None`: a
    /// Pass decides nothing here).
    fn tier_rules(
        &mut self,
        chain: &str,
        dir: Direction,
        tier: &[TierRule],
        outcome: &TierTargets,
        pass: Option<&str>,
    ) {
        for run in tier_runs(tier, pass.is_none()) {
            let target = match run.action {
                AdminAction::Allow => outcome.allow.as_str(),
                AdminAction::Deny => outcome.deny.as_str(),
                AdminAction::Pass => match pass {
                    Some(pass) => pass,
                    None => continue,
                },
            }
            .to_string();
            for clause in &run.clauses {
                let Some(peer) = self.peer_match(dir, &clause.peers) else {
                    continue;
                };
                for ports in port_matches(&clause.ports) {
                    let spec = if ports.is_empty() {
                        format!("{peer}{target}")
                    } else {
                        format!("{peer}{ports} {target}")
                    };
                    self.rule(chain, &spec);
                }
            }
        }
    }

    /// One view's tier pipeline, as the nft backend's (`Builder::pipeline` there): `entry`
    /// holds the Admin rules and hands over to `<entry>_NS` with a goto (`-g`), which holds the
    /// namespaced tier, or the Baseline rules and the default allow.
    fn pipeline(
        &mut self,
        entry: &str,
        dir: Direction,
        dr: &DirectionRules,
        staged: bool,
        outcome: &TierTargets,
    ) {
        let admin = dr.admin.view(staged);
        let namespaced = if admin.is_empty() {
            entry.to_string()
        } else {
            let ns = format!("{entry}_NS");
            self.chains.push(entry.to_string());
            let handover = format!("-g {ns}");
            self.tier_rules(entry, dir, admin, outcome, Some(&handover));
            self.rule(entry, &handover);
            ns
        };
        self.chains.push(namespaced.clone());
        match dr.isolation(staged) {
            iso @ Isolation::Isolated(_) => {
                let dns = dr.implicit_dns.in_view(staged);
                self.allow_rules_to(&namespaced, dir, iso, dns, &outcome.allow);
                self.rule(&namespaced, &outcome.deny);
            }
            Isolation::Open => {
                self.tier_rules(&namespaced, dir, dr.baseline.view(staged), outcome, None);
                self.rule(&namespaced, &outcome.allow);
            }
        }
    }

    /// The chains of one direction with admin policy rules (SPEC 8), as the nft backend's
    /// (`Builder::tier_chains` there): enforced only, the pipeline accepting or going to
    /// `<chain>_D` (log, reject); monitored, each view's pipeline records its allow in a mark
    /// bit (a goto to a one-rule chain that sets it; falling off its end returns) and the
    /// bookkeeping of [`FamilyRenderer::direction_chain`] follows.
    fn tier_chains(&mut self, chain: &str, dir: Direction, dr: &DirectionRules, key: Option<u32>) {
        let deny_key = if dr.log_denies { key } else { None };
        if !dr.has_monitor() {
            let deny = format!("{chain}_D");
            self.pipeline(
                chain,
                dir,
                dr,
                false,
                &TierTargets {
                    allow: "-j ACCEPT".into(),
                    deny: format!("-g {deny}"),
                },
            );
            self.chains.push(deny.clone());
            self.log(&deny, None, LogAction::Deny, deny_key);
            self.reject(&deny);
            return;
        }
        let (allow, staged) = (self.opts.allow_mark, self.opts.staged_mark);
        let both = allow | staged;
        self.chains.push(chain.to_string());
        if let Some(key) = key {
            let count = counter_comment(CounterKind::Connections, key);
            self.rule(chain, &format!("-m conntrack --ctstate NEW {count}"));
        }
        self.rule(chain, &format!("-j MARK --set-xmark 0x0/{both:#x}"));
        for (view, bit, tag) in [(true, staged, "S"), (false, allow, "E")] {
            let entry = format!("{chain}_{tag}");
            let marker = format!("{chain}_{tag}A");
            self.rule(chain, &format!("-j {entry}"));
            self.pipeline(
                &entry,
                dir,
                dr,
                view,
                &TierTargets {
                    allow: format!("-g {marker}"),
                    deny: "-j RETURN".into(),
                },
            );
            self.chains.push(marker.clone());
            self.rule(&marker, &format!("-j MARK --set-xmark {bit:#x}/{bit:#x}"));
        }
        if let Some(key) = key {
            let count = counter_comment(CounterKind::WouldDeny, key);
            self.rule(
                chain,
                &format!("-m mark --mark {allow:#x}/{both:#x} -m conntrack --ctstate NEW {count}"),
            );
        }
        self.log(chain, Some((allow, both)), LogAction::WouldDeny, key);
        self.rule(
            chain,
            &format!("-m mark --mark {allow:#x}/{allow:#x} -j ACCEPT"),
        );
        self.log(chain, None, LogAction::Deny, deny_key);
        self.reject(chain);
    }

    /// [`FamilyRenderer::allow_rules`] with any target.
    fn allow_rules_to(
        &mut self,
        chain: &str,
        dir: Direction,
        isolation: &Isolation,
        dns: bool,
        target: &str,
    ) {
        let rules = match isolation {
            Isolation::Open => {
                self.rule(chain, target);
                return;
            }
            Isolation::Isolated(rules) => rules,
        };
        if dns {
            for proto in ["udp", "tcp"] {
                self.rule(chain, &format!("-p {proto} -m {proto} --dport 53 {target}"));
            }
        }
        let mut seen = BTreeSet::new();
        for clause in rules.iter().flat_map(|r| &r.clauses) {
            let Some(peer) = self.peer_match(dir, &clause.peers) else {
                continue; // matches nothing in this family
            };
            for ports in port_matches(&clause.ports) {
                let spec = if ports.is_empty() {
                    format!("{peer}{target}")
                } else {
                    format!("{peer}{ports} {target}")
                };
                if seen.insert(spec.clone()) {
                    self.rule(chain, &spec);
                }
            }
        }
    }

    /// The per-interface chain of one isolated or monitored direction.
    fn direction_chain(
        &mut self,
        chain: &str,
        dir: Direction,
        dr: &DirectionRules,
        key: Option<u32>,
    ) {
        if dr.has_tiers() {
            self.tier_chains(chain, dir, dr, key);
            return;
        }
        self.chains.push(chain.to_string());
        let deny_key = if dr.log_denies && dr.enforced.is_isolated() {
            key
        } else {
            None
        };
        let dns = dr.implicit_dns;
        if !dr.has_monitor() {
            self.allow_rules(chain, dir, &dr.enforced, dns.enforced, AllowAction::Accept);
            self.log(chain, None, LogAction::Deny, deny_key);
            self.reject(chain);
            return;
        }
        let (allow, staged) = (self.opts.allow_mark, self.opts.staged_mark);
        let both = allow | staged;
        if let Some(key) = key {
            let count = counter_comment(CounterKind::Connections, key);
            self.rule(chain, &format!("-m conntrack --ctstate NEW {count}"));
        }
        self.rule(chain, &format!("-j MARK --set-xmark 0x0/{both:#x}"));
        self.allow_rules(
            chain,
            dir,
            &dr.enforced,
            dns.enforced,
            AllowAction::Mark(allow),
        );
        self.allow_rules(
            chain,
            dir,
            &dr.staged,
            dns.staged,
            AllowAction::Mark(staged),
        );
        // Would-deny: the enforced view allows, the staged view does not. Every one is counted;
        // the log rule's own counter says how many passed the rate limit.
        if let Some(key) = key {
            let count = counter_comment(CounterKind::WouldDeny, key);
            self.rule(
                chain,
                &format!("-m mark --mark {allow:#x}/{both:#x} -m conntrack --ctstate NEW {count}"),
            );
        }
        self.log(chain, Some((allow, both)), LogAction::WouldDeny, key);
        self.rule(
            chain,
            &format!("-m mark --mark {allow:#x}/{allow:#x} -j ACCEPT"),
        );
        if dr.enforced.is_isolated() {
            self.log(chain, None, LogAction::Deny, deny_key);
            self.reject(chain);
        } else {
            // Monitor only: the entry chain goes on after the jump returns (and may end in a
            // reject), so the chain decides itself.
            self.rule(chain, "-j ACCEPT");
        }
    }

    fn render(mut self, pod: &PodRules) -> Result<String, RenderError> {
        let v6 = self.family == Family::Ipv6;
        let fam = self.family;
        let (ingress, egress) = (
            entry_chain(fam, Direction::Ingress),
            entry_chain(fam, Direction::Egress),
        );
        self.chains.push(ingress.to_string());
        self.chains.push(egress.to_string());
        // Built-in chains: seed 004's "quality of life" rules, then the jump.
        let nd = ["133", "134", "135", "136"]; // router/neighbour solicitation/advertisement
        for (chain, lo, entry) in [("INPUT", "-i lo", ingress), ("OUTPUT", "-o lo", egress)] {
            self.rule(chain, &format!("{lo} -j ACCEPT"));
            self.rule(
                chain,
                "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            );
            if v6 {
                for t in nd {
                    self.rule(
                        chain,
                        &format!("-p ipv6-icmp -m icmp6 --icmpv6-type {t} -j ACCEPT"),
                    );
                }
            }
            self.rule(chain, &format!("-j {entry}"));
        }
        // Forwarding through an isolated pod is rejected; monitoring alone never changes what
        // is enforced, so only the enforced view counts here.
        let enforced_isolated = pod
            .interfaces
            .iter()
            .any(|i| i.ingress.enforced.is_isolated() || i.egress.enforced.is_isolated());
        if self.opts.reject_forward && enforced_isolated {
            self.reject("FORWARD");
        }
        // The dispatch plan (crate::dispatch): by the address a packet is sent to, then by
        // interface, then a reject that closes interfaces netwarden does not know.
        let ifaces: Vec<&InterfaceRules> = pod.interfaces.iter().collect();
        let plan = dispatch::plan(&ifaces);
        for (dir, p) in [
            (Direction::Ingress, &plan.input),
            (Direction::Egress, &plan.output),
        ] {
            let Some(p) = p else { continue };
            let entry = entry_chain(fam, dir);
            let (flag, addr_flag) = match dir {
                Direction::Ingress => ("-i", "-d"),
                Direction::Egress => ("-o", "-s"),
            };
            let target = |t: Target| match t {
                Target::Chain(n) => sub_chain(dir, n),
                Target::Accept => "ACCEPT".to_string(),
            };
            for &(addr, t) in &p.by_addr {
                let host = match (fam, addr) {
                    (Family::Ipv4, std::net::IpAddr::V4(a)) => format!("{a}/32"),
                    (Family::Ipv6, std::net::IpAddr::V6(a)) => format!("{a}/128"),
                    _ => continue,
                };
                self.rule(entry, &format!("{addr_flag} {host} -j {}", target(t)));
            }
            for (name, t) in &p.by_iface {
                let quoted =
                    iptables_ifname(name).map_err(|reason| RenderError::UnmatchableInterface {
                        pod: pod.pod.clone(),
                        name: name.clone(),
                        backend: "iptables",
                        reason,
                    })?;
                self.rule(entry, &format!("{flag} {quoted} -j {}", target(*t)));
            }
            if p.reject_rest {
                self.reject(entry);
            }
            for (index, iface) in ifaces.iter().enumerate() {
                let dr = iface.direction(dir);
                if !needs_chain(dr) {
                    continue;
                }
                let key = log_key_for(pod, &iface.name, dir).map(|k| k.0);
                self.direction_chain(&sub_chain(dir, index), dir, dr, key);
            }
        }
        let mut out = String::from(
            "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n",
        );
        for c in &self.chains {
            let _ = writeln!(out, ":{c} - [0:0]");
        }
        // Rules grouped by chain (built-ins first), as iptables-save prints them.
        let builtins = ["INPUT", "FORWARD", "OUTPUT"].map(String::from);
        for chain in builtins.iter().chain(&self.chains) {
            for (_, spec) in self.rules.iter().filter(|(c, _)| c == chain) {
                let _ = writeln!(out, "-A {chain} {spec}");
            }
        }
        out.push_str("COMMIT\n");
        Ok(out)
    }
}

/// Renders everything iptables mode programs into the pod's netns. A pod nothing isolates (in
/// either view) gets [`IptablesRuleset::empty`]; a pod with an interface iptables cannot match
/// exactly is refused, and so is a pod in learn mode ([`RenderError::LearnNeedsNft`]).
/// `opts` is assumed valid ([`RenderOptions::validate`]).
pub fn render_iptables(
    rules: &PodRules,
    opts: &RenderOptions,
) -> Result<IptablesRuleset, RenderError> {
    if rules.learn {
        return Err(RenderError::LearnNeedsNft {
            pod: rules.pod.clone(),
        });
    }
    if !rules.is_isolated() {
        return Ok(IptablesRuleset::empty());
    }
    let mut sets = SetRegistry::default();
    let mut family = |family| {
        FamilyRenderer {
            family,
            opts,
            sets: &mut sets,
            chains: Vec::new(),
            rules: Vec::new(),
        }
        .render(rules)
    };
    let v4 = family(Family::Ipv4)?;
    let v6 = family(Family::Ipv6)?;
    let counted = rules
        .interfaces
        .iter()
        .any(|i| i.ingress.has_monitor() || i.egress.has_monitor());
    Ok(IptablesRuleset {
        sets: sets.sets.into_values().collect(),
        v4,
        v6,
        counted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::{
        AllowRule, Clause, InterfaceRules, Mode, NetworkId, ObjectKey, PolicyKind, PolicyRef,
        RuleOrigin,
    };
    use std::sync::Arc;

    fn range(protocol: Protocol, lo: u16, hi: u16) -> PortRange {
        PortRange {
            protocol,
            ports: Some((lo, hi)),
        }
    }

    #[test]
    fn ports_split_by_protocol_and_multiport_weight() {
        assert_eq!(port_matches(&PortMatch::Any), vec![String::new()]);
        // 14 single ports + 2 ranges (weight 2 each) = 18 > 15: two rules (a range never straddles).
        let mut ranges: Vec<PortRange> = (1..=14).map(|p| range(Protocol::Tcp, p, p)).collect();
        ranges.push(range(Protocol::Tcp, 100, 200));
        ranges.push(range(Protocol::Tcp, 300, 400));
        ranges.push(range(Protocol::Udp, 53, 53));
        let got = port_matches(&PortMatch::Only(ranges));
        assert_eq!(
            got,
            vec![
                "-p tcp -m multiport --dports 1,2,3,4,5,6,7,8,9,10,11,12,13,14".to_string(),
                "-p tcp -m multiport --dports 100:200,300:400".to_string(),
                "-p udp -m udp --dport 53".to_string(),
            ]
        );
        // A protocol-only entry subsumes that protocol's port list, whatever the order.
        let all_sctp = PortMatch::Only(vec![
            range(Protocol::Sctp, 9, 9),
            PortRange {
                protocol: Protocol::Sctp,
                ports: None,
            },
            range(Protocol::Sctp, 10, 10),
        ]);
        assert_eq!(port_matches(&all_sctp), vec!["-p sctp".to_string()]);
    }

    #[test]
    fn interface_names_are_checked() {
        for plain in ["eth0", "net1", "vlan.10", "a-b_c@d", "x23456789012345"] {
            assert!(safe_interface_name(plain), "{plain}");
            assert_eq!(iptables_ifname(plain).unwrap(), plain);
        }
        // Kernel-legal names iptables must quote: matched exactly, never dropped.
        assert_eq!(iptables_ifname("a\"b;").unwrap(), r#""a\"b;""#);
        assert_eq!(iptables_ifname("x\\y*").unwrap(), r#""x\\y*""#);
        assert_eq!(iptables_ifname("#c").unwrap(), r##""#c""##);
        assert_eq!(iptables_ifname("-j").unwrap(), "-j");
        // A trailing '+' is a wildcard with no escape: refused.
        assert!(iptables_ifname("a\"b;+").is_err());
        assert!(iptables_ifname("eth+").is_err());
        assert!(iptables_ifname("").is_err());
    }

    fn isolated_pod(iface: &str) -> PodRules {
        let origin = RuleOrigin {
            policy: PolicyRef {
                kind: PolicyKind::NetworkPolicy,
                key: ObjectKey::new("ns", "p"),
            },
            direction: Direction::Ingress,
            index: 0,
            mode: Mode::Enforce,
        };
        let peers = AddrSet::from_addrs(["10.0.0.2".parse().unwrap()]);
        let rule = AllowRule {
            origin,
            clauses: vec![Clause {
                peers: PeerMatch::Addrs(Arc::new(peers)),
                ports: PortMatch::Any,
            }],
        };
        let mut ingress = DirectionRules::open();
        ingress.enforced = Isolation::Isolated(vec![rule].into());
        ingress.staged = ingress.enforced.clone();
        PodRules {
            pod: ObjectKey::new("ns", "pod"),
            netns: None,
            learn: false,
            interfaces: vec![InterfaceRules {
                name: iface.into(),
                network: NetworkId::Primary,
                ips: vec![],
                ingress,
                egress: DirectionRules::open(),
            }],
        }
    }

    #[test]
    fn unusual_interface_names_are_covered_or_refused() {
        let ok = render_iptables(&isolated_pod("eth0"), &RenderOptions::default()).unwrap();
        assert!(
            ok.v4.contains("-A DANM_INGRESS_V4 -i eth0 -j DANM_IN_0\n"),
            "{}",
            ok.v4
        );
        let quoted = render_iptables(&isolated_pod("we\"ird;"), &RenderOptions::default()).unwrap();
        assert!(
            quoted
                .v4
                .contains("-A DANM_INGRESS_V4 -i \"we\\\"ird;\" -j DANM_IN_0\n"),
            "{}",
            quoted.v4
        );
        let refused = render_iptables(&isolated_pod("a\"b;+"), &RenderOptions::default());
        assert!(
            matches!(refused, Err(RenderError::UnmatchableInterface { ref name, .. }) if name == "a\"b;+"),
            "{refused:?}"
        );
    }

    #[test]
    fn dispatch_by_address_then_interface_then_reject() {
        let mut pod = isolated_pod("eth0");
        pod.interfaces[0].ips = vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()];
        pod.interfaces.push(InterfaceRules {
            name: "net1".into(),
            network: NetworkId::nad("ns", "data"),
            ips: vec!["10.1.0.1".parse().unwrap()],
            ingress: DirectionRules::open(),
            egress: DirectionRules::open(),
        });
        let r = render_iptables(&pod, &RenderOptions::default()).unwrap();
        let entry: Vec<&str> =
            r.v4.lines()
                .filter(|l| l.starts_with("-A DANM_INGRESS_V4 "))
                .collect();
        assert_eq!(
            entry,
            [
                "-A DANM_INGRESS_V4 -d 10.0.0.1/32 -j DANM_IN_0",
                "-A DANM_INGRESS_V4 -d 10.1.0.1/32 -j ACCEPT",
                "-A DANM_INGRESS_V4 -i eth0 -j DANM_IN_0",
                "-A DANM_INGRESS_V4 -i net1 -j ACCEPT",
                "-A DANM_INGRESS_V4 -p tcp -j REJECT --reject-with tcp-reset",
                "-A DANM_INGRESS_V4 -j REJECT --reject-with icmp-port-unreachable",
            ]
        );
        assert!(
            r.v6.contains("-A DANM_INGRESS_V6 -d fd00::1/128 -j DANM_IN_0\n"),
            "{}",
            r.v6
        );
        // Nothing isolates egress: no egress dispatch, no reject there.
        assert!(!r.v4.contains("-A DANM_EGRESS_V4 "), "{}", r.v4);
        // An OPEN interface whose name iptables reads as a wildcard is refused too: its accept
        // would match other interfaces.
        pod.interfaces[1].name = "net+".into();
        let refused = render_iptables(&pod, &RenderOptions::default());
        assert!(
            matches!(refused, Err(RenderError::UnmatchableInterface { ref name, .. }) if name == "net+"),
            "{refused:?}"
        );
    }

    #[test]
    fn everything_blocks_are_stored_as_two_halves() {
        let mut pod = isolated_pod("eth0");
        let everything = AddrSet::everything();
        let rule = AllowRule {
            origin: RuleOrigin {
                policy: PolicyRef {
                    kind: PolicyKind::NetworkPolicy,
                    key: ObjectKey::new("ns", "all"),
                },
                direction: Direction::Ingress,
                index: 0,
                mode: Mode::Enforce,
            },
            clauses: vec![Clause {
                peers: PeerMatch::Addrs(Arc::new(everything)),
                ports: PortMatch::Any,
            }],
        };
        pod.interfaces[0].ingress.enforced = Isolation::Isolated(vec![rule].into());
        pod.interfaces[0].ingress.staged = pod.interfaces[0].ingress.enforced.clone();
        let r = render_iptables(&pod, &RenderOptions::default()).unwrap();
        let cidrs: Vec<String> = r
            .sets
            .iter()
            .flat_map(|s| s.cidrs.iter().map(ToString::to_string))
            .collect();
        assert_eq!(cidrs, ["0.0.0.0/1", "128.0.0.0/1", "::/1", "8000::/1"]);
        assert!(!r.ipset_script().contains("/0"), "{}", r.ipset_script());
    }

    #[test]
    fn set_names_and_ownership() {
        let r = render_iptables(&isolated_pod("eth0"), &RenderOptions::default()).unwrap();
        let names = r.set_names();
        assert_eq!(names.len(), 1);
        let name = names.iter().next().unwrap();
        assert!(name.starts_with("nw4-") && name.len() <= 31, "{name}");
        assert!(is_owned_set(name) && is_owned_set(&name.replacen("nw", "nwt", 1)));
        assert!(!is_owned_set("KUBE-SRC-ABC") && !is_owned_set("nw-other"));
        assert!(r
            .ipset_script()
            .contains(&format!("swap {} {name}\n", name.replacen("nw", "nwt", 1))));
        assert_eq!(
            render_iptables(
                &PodRules {
                    interfaces: vec![],
                    ..isolated_pod("x")
                },
                &RenderOptions::default()
            )
            .unwrap(),
            IptablesRuleset::empty()
        );
    }

    #[test]
    fn custom_marks_and_log_options_are_used() {
        let mut pod = isolated_pod("eth0");
        pod.interfaces[0]
            .ingress
            .monitored_policies
            .push(PolicyRef {
                kind: PolicyKind::NetworkPolicy,
                key: ObjectKey::new("ns", "m"),
            });
        pod.interfaces[0].ingress.staged = Isolation::Isolated(vec![].into());
        let opts = RenderOptions {
            nflog_group: 7,
            staged_mark: 0x100,
            allow_mark: 0x200,
            log_rate_per_minute: 3,
            log_burst: 4,
            ..RenderOptions::default()
        };
        let r = render_iptables(&pod, &opts).unwrap();
        assert!(
            r.v4.contains("-A DANM_IN_0 -j MARK --set-xmark 0x0/0x300\n"),
            "{}",
            r.v4
        );
        assert!(r.v4.contains("-m mark --mark 0x200/0x300 -m conntrack --ctstate NEW -m limit --limit 3/min --limit-burst 4 -m comment --comment nw_wl_"), "{}", r.v4);
        assert!(
            r.v4.contains(" -j NFLOG --nflog-group 7 --nflog-prefix \"nw:wd:"),
            "{}",
            r.v4
        );
        assert!(
            r.v4.contains("-A DANM_IN_0 -m mark --mark 0x200/0x200 -j ACCEPT\n"),
            "{}",
            r.v4
        );
        // Staged view isolated with no rule: no staged mark is ever set.
        assert!(!r.v4.contains("--set-xmark 0x100/0x100"), "{}", r.v4);
        // A rate or burst beyond what `-m limit` holds is clamped, not passed to a restore
        // that would reject the whole ruleset.
        let fast = RenderOptions {
            log_rate_per_minute: 1_000_000,
            log_burst: 1_000_000,
            ..opts
        };
        let r = render_iptables(&pod, &fast).unwrap();
        assert!(
            r.v4.contains("-m limit --limit 600000/min --limit-burst 10000 -m comment"),
            "{}",
            r.v4
        );
    }
}
