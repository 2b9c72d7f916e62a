//! A packet tracer over the nft IR: "this packet → this verdict" without a kernel.
//!
//! It walks the very [`Table`](crate::nft::Table) the nft text is printed from, with netfilter's
//! evaluation rules (rules in order; matches, then statements, then the verdict; a jump returns
//! at the end of the called chain; a base chain ends with its policy, accept). Tests use it for
//! what the lab kernel cannot show: SCTP (no SCTP sockets here), the mark bookkeeping of the
//! monitor evaluation, and which log message a packet produces.
//!
//! Rate limits are assumed not exceeded: the tracer answers "would this packet be logged".

use std::net::IpAddr;

use netwarden_engine::{Direction, PodRules, Protocol, RuleOrigin};

use crate::logkey::{log_prefix, LogAction};
use crate::nft::{
    build_table, AddrEnd, Chain, CtMatch, Hook, IfBy, Match, RenderError, Rule, Stmt, Table,
    Verdict,
};
use crate::options::RenderOptions;
use netwarden_engine::Family;

/// The L4 part of a traced packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceProtocol {
    L4(Protocol),
    /// ICMP or ICMPv6 (per the peer's family), not neighbour discovery.
    Icmp,
    /// ICMPv6 neighbour/router solicitation or advertisement.
    NeighborDiscovery,
}

/// A packet as seen by the pod netns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracePacket {
    /// Ingress: received on `interface` from `peer`; egress: sent on `interface` to `peer`.
    pub direction: Direction,
    pub interface: String,
    pub peer: IpAddr,
    /// The pod's own end: the destination of an incoming packet, the source of an outgoing
    /// one. `None`: an address no rule names (broadcast, multicast, an address the pod's
    /// interfaces do not hold as far as netwarden knows). Incoming packets are dispatched by
    /// it first ([`crate::dispatch`]), so a packet for eth0's address that arrives on net1 is
    /// traced with `interface: "net1"` and `local: Some(<eth0's address>)`.
    pub local: Option<IpAddr>,
    pub protocol: TraceProtocol,
    /// Destination port (ignored for ICMP).
    pub port: u16,
    /// conntrack NEW (else ESTABLISHED).
    pub new_connection: bool,
    /// Sent or received over `lo` (the pod talking to itself).
    pub loopback: bool,
    /// Routed through the pod netns (forward hook) instead of to/from the pod.
    pub forwarded: bool,
    /// The packet mark before the table runs.
    pub mark: u32,
}

impl TracePacket {
    /// A new TCP/UDP/SCTP connection's first packet on `interface`.
    pub fn new(
        direction: Direction,
        interface: &str,
        peer: IpAddr,
        protocol: Protocol,
        port: u16,
    ) -> Self {
        TracePacket {
            direction,
            interface: interface.to_string(),
            peer,
            local: None,
            protocol: TraceProtocol::L4(protocol),
            port,
            new_connection: true,
            loopback: false,
            forwarded: false,
            mark: 0,
        }
    }

    /// The same packet with the pod's own end at `local` (see [`TracePacket::local`]).
    pub fn with_local(mut self, local: IpAddr) -> Self {
        self.local = Some(local);
        self
    }
}

/// How the packet left the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceVerdict {
    Accept,
    RejectTcpReset,
    RejectPortUnreachable,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceResult {
    pub accepted: bool,
    pub verdict: TraceVerdict,
    /// The last log message the packet produced (a packet logs at most once per chain walk).
    pub logged: Option<LogAction>,
    /// The exact prefix of that message.
    pub log_prefix: Option<String>,
    /// The learn-mode message the packet produced (`nw:ob:…`), the learn sets taken as not
    /// yet holding its flow (the tracer keeps no state between packets).
    pub observed: Option<String>,
    /// The mark when the packet left the table.
    pub mark: u32,
    /// Origins of the allow rules that matched (accepted or marked), in chain order.
    pub matched: Vec<RuleOrigin>,
    /// The chains walked, in order.
    pub chains: Vec<String>,
}

/// Traces `packet` through the rules rendered for `rules`.
pub fn trace(
    rules: &PodRules,
    opts: &RenderOptions,
    packet: &TracePacket,
) -> Result<TraceResult, RenderError> {
    Ok(match build_table(rules, opts)? {
        Some(table) => trace_table(&table, packet),
        None => TraceResult {
            accepted: true,
            verdict: TraceVerdict::Accept,
            logged: None,
            log_prefix: None,
            observed: None,
            mark: packet.mark,
            matched: Vec::new(),
            chains: Vec::new(),
        },
    })
}

struct State<'a> {
    table: &'a Table,
    packet: &'a TracePacket,
    mark: u32,
    logged: Option<(LogAction, String)>,
    observed: Option<String>,
    matched: Vec<RuleOrigin>,
    chains: Vec<String>,
}

enum Outcome {
    /// Fell off the end of the chain (return to the caller / base-chain policy).
    Return,
    Final(TraceVerdict),
}

/// Traces `packet` through an already built table.
pub fn trace_table(table: &Table, packet: &TracePacket) -> TraceResult {
    let hook = if packet.forwarded {
        Hook::Forward
    } else {
        match packet.direction {
            Direction::Ingress => Hook::Input,
            Direction::Egress => Hook::Output,
        }
    };
    let mut st = State {
        table,
        packet,
        mark: packet.mark,
        logged: None,
        observed: None,
        matched: Vec::new(),
        chains: Vec::new(),
    };
    let verdict = match table.base_chain(hook) {
        Some(chain) => match run_chain(&mut st, chain, 0) {
            Outcome::Final(v) => v,
            Outcome::Return => TraceVerdict::Accept, // policy accept
        },
        None => TraceVerdict::Accept,
    };
    let (logged, log_prefix) = match st.logged {
        Some((a, p)) => (Some(a), Some(p)),
        None => (None, None),
    };
    TraceResult {
        accepted: verdict == TraceVerdict::Accept,
        verdict,
        logged,
        log_prefix,
        observed: st.observed,
        mark: st.mark,
        matched: st.matched,
        chains: st.chains,
    }
}

fn run_chain(st: &mut State<'_>, chain: &Chain, depth: usize) -> Outcome {
    // The kernel limits jump depth too; our tables are two levels deep.
    assert!(depth < 16, "jump loop in chain {}", chain.name);
    st.chains.push(chain.name.clone());
    for rule in &chain.rules {
        if !rule.matches.iter().all(|m| matches(st, m)) {
            continue;
        }
        apply_stmts(st, rule);
        match &rule.verdict {
            Verdict::Continue => {}
            Verdict::Accept => return Outcome::Final(TraceVerdict::Accept),
            Verdict::RejectTcpReset => return Outcome::Final(TraceVerdict::RejectTcpReset),
            Verdict::RejectPortUnreachable => {
                return Outcome::Final(TraceVerdict::RejectPortUnreachable)
            }
            Verdict::Jump(target) => {
                let target = st
                    .table
                    .chain(target)
                    .unwrap_or_else(|| panic!("jump to missing chain {target}"));
                if let Outcome::Final(v) = run_chain(st, target, depth + 1) {
                    return Outcome::Final(v);
                }
            }
            // The rest of this chain is skipped: what the target returns, this chain returns.
            Verdict::Goto(target) => {
                let target = st
                    .table
                    .chain(target)
                    .unwrap_or_else(|| panic!("goto to missing chain {target}"));
                return run_chain(st, target, depth + 1);
            }
            Verdict::Return => return Outcome::Return,
        }
    }
    Outcome::Return
}

fn apply_stmts(st: &mut State<'_>, rule: &Rule) {
    for s in &rule.stmts {
        match s {
            Stmt::ClearMark(bits) => st.mark &= !bits,
            Stmt::SetMark(bits) => {
                st.mark |= bits;
                if let Some(o) = &rule.origin {
                    st.matched.push(o.clone());
                }
            }
            Stmt::Log {
                action: LogAction::Observed,
                key,
                ..
            } => st.observed = Some(log_prefix(LogAction::Observed, *key)),
            Stmt::Log { action, key, .. } => st.logged = Some((*action, log_prefix(*action, *key))),
            // The learn set and the full counter hold no state here (module doc).
            Stmt::Learn(_) | Stmt::Counter(_) => {}
        }
    }
    if rule.verdict == Verdict::Accept {
        if let Some(o) = &rule.origin {
            st.matched.push(o.clone());
        }
    }
}

fn matches(st: &State<'_>, m: &Match) -> bool {
    let p = st.packet;
    match m {
        Match::IifLoopback => p.loopback && p.direction == Direction::Ingress && !p.forwarded,
        Match::OifLoopback => p.loopback && p.direction == Direction::Egress && !p.forwarded,
        Match::Ct(CtMatch::EstablishedRelated) => !p.new_connection,
        Match::Ct(CtMatch::New) => p.new_connection,
        // The traced packet is "some ND message": each of the four type rules accepts it, so the
        // first one stands for all.
        Match::Icmpv6Nd(_) => p.protocol == TraceProtocol::NeighborDiscovery && p.peer.is_ipv6(),
        Match::L4Proto(proto) => p.protocol == TraceProtocol::L4(*proto),
        Match::DPort(lo, hi) => p.port >= *lo && p.port <= *hi,
        Match::IfName { by, name } => {
            // A packet has one interface: lo for the pod talking to itself. `iifname` is only
            // set on the way in, `oifname` on the way out (both when forwarded).
            let ifname = if p.loopback {
                "lo"
            } else {
                p.interface.as_str()
            };
            let applies = p.forwarded
                || match by {
                    IfBy::In => p.direction == Direction::Ingress,
                    IfBy::Out => p.direction == Direction::Egress,
                };
            applies && ifname == name
        }
        Match::AddrIs { end, addr } => {
            let (src, dst) = match p.direction {
                Direction::Ingress => (Some(p.peer), p.local),
                Direction::Egress => (p.local, Some(p.peer)),
            };
            let at = match end {
                AddrEnd::Src => src,
                AddrEnd::Dst => dst,
            };
            // Loopback traffic is accepted before any dispatch; a forwarded packet's ends are
            // not the pod's.
            !p.forwarded && at == Some(*addr)
        }
        Match::Addr { family, end, set } => {
            // The tracer only knows the peer; the other end is the pod itself.
            let expected_end = match p.direction {
                Direction::Ingress => AddrEnd::Src,
                Direction::Egress => AddrEnd::Dst,
            };
            if *end != expected_end {
                return false;
            }
            let x = match (family, p.peer) {
                (Family::Ipv4, IpAddr::V4(a)) => u128::from(u32::from(a)),
                (Family::Ipv6, IpAddr::V6(a)) => u128::from(a),
                _ => return false,
            };
            let def = st
                .table
                .set(set)
                .unwrap_or_else(|| panic!("rule uses missing set {set}"));
            def.ranges.iter().any(|&(lo, hi)| x >= lo && x <= hi)
        }
        Match::Mark { mask, value } => st.mark & mask == *value,
        Match::NotLearned(k) => {
            assert!(
                st.table.learn_set(&k.set).is_some(),
                "rule uses missing learn set {}",
                k.set
            );
            let family = if p.peer.is_ipv4() {
                Family::Ipv4
            } else {
                Family::Ipv6
            };
            k.family == family && k.direction == p.direction
        }
        Match::Limit(name) => {
            assert!(
                st.table.limits.iter().any(|l| &l.name == name),
                "rule uses missing limit {name}"
            );
            true
        }
    }
}
