//! Connection tracking in a pod netns over ctnetlink: listing the tracked connections and
//! ending those a new ruleset refuses (revocation, SPEC 5).
//!
//! netwarden's base chains accept `ct state established,related` before any policy rule, so a
//! connection the rules allowed when it started keeps passing after an apply that denies it.
//! Deleting its conntrack entry ends that: the connection's next packet finds no entry, the
//! kernel tracks it anew (TCP's mid-stream pickup, `nf_conntrack_tcp_loose`, on by default:
//! `ct state new`; with pickup off: `invalid`, which the chains do not accept either) and it
//! walks the policy rules, which reject it (a TCP reset, ICMP port unreachable otherwise).
//! Nothing is added to the packet path: the cost is one dump of the table per changed netns
//! and a message or two per connection ended.
//!
//! # TCP tombstones
//!
//! Deleting alone is not enough for TCP (measured on Linux 6.18, both backends, see
//! `tests/revoke_root.rs`). When the **pod's** side sends the next packet, the pickup tracks
//! the connection with the pod as its originator, judged by the pod's other direction: a pod
//! isolated in ingress only (the common case) has its egress open, the packet is accepted, the
//! entry confirmed — and the peer's packets, replies now, are accepted as established. The
//! revoked connection lives on, for as long as the pod speaks first after each idle spell.
//!
//! So a revoked TCP entry is replaced by a **tombstone**: an entry with the same tuples (and
//! zone), created over ctnetlink in state SYN_SENT with no status bit, living as long as the
//! deleted entry had left (at least [`MIN_TOMBSTONE_SECS`]). With it in place there is no
//! pickup, and conntrack's TCP state machine does the rest: any packet from the original
//! side other than a SYN is invalid in SYN_SENT, and an unreplied entry's packets are `new`
//! anyway, so every one of them walks the rules, which refuse it with a reset; a packet from
//! the pod's side is let through (ignored by the state machine) and its answer from the peer
//! is refused the same way. A new connection the peer opens on the same ports (a SYN) is
//! `new` and judged by the rules like any other. The tombstone of a connection that really
//! ended simply expires. UDP and other protocols have no mid-stream state: a datagram the pod
//! sends after the revocation starts a new flow that its own egress rules judge (and allow
//! only if they allow the pod to send to that peer), so their entries are deleted only.
//!
//! # Messages
//!
//! The messages (`linux/netfilter/nfnetlink_conntrack.h`) are built and read here by hand, a
//! few attributes only, rather than through a netlink crate for netfilter: a dump request
//! (`IPCTNL_MSG_CT_GET`, `NLM_F_DUMP`, family `AF_UNSPEC`: every family), its replies (one
//! `IPCTNL_MSG_CT_NEW` per connection, of which the tuples, the timeout, the TCP state and the
//! zone are read), a delete (`IPCTNL_MSG_CT_DELETE`) that hands the kernel the tuple and zone
//! exactly as it listed them, and the tombstone's create (`IPCTNL_MSG_CT_NEW`,
//! `NLM_F_CREATE | NLM_F_EXCL`). Parsing is pure ([`parse_datagram`]) and never panics on any
//! input; the I/O ([`list_here`], [`delete_here`], [`revoke`]) runs on a thread inside the pod
//! netns, on a socket connected to the kernel (a process in the pod cannot slip replies in).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{
    NlasIterator, NLA_F_NESTED, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST,
};
use netlink_sys::Socket;
use netwarden_engine::TrackedFlow;

use crate::netns::{Netns, NetnsError};
use crate::nfnetlink::{
    attr, exchange, open_socket, read_datagram, NfnetlinkError, DATAGRAM, NFGENMSG_LEN,
};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const AF_UNSPEC: u8 = 0;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_STATUS: u16 = 3;
const CTA_PROTOINFO: u16 = 4;
const CTA_TIMEOUT: u16 = 7;
/// `IPS_SEEN_REPLY`: packets went both ways.
const IPS_SEEN_REPLY: u32 = 1 << 1;
const CTA_ZONE: u16 = 18;
const CTA_FILTER: u16 = 25;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
/// `CTA_FILTER_FLAG(CTA_IP_SRC)`, `CTA_FILTER_FLAG(CTA_IP_DST)` (`net/netfilter/nf_internals.h`).
const CTA_FILTER_F_CTA_IP_SRC: u32 = 1 << 0;
const CTA_FILTER_F_CTA_IP_DST: u32 = 1 << 1;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_STATE: u16 = 1;
/// `TCP_CONNTRACK_SYN_SENT`: the state of a tombstone (see the module doc).
const TCP_CONNTRACK_SYN_SENT: u8 = 1;
/// The shortest life of a tombstone, whatever was left of the entry it replaces. Far above the
/// kernel's SYN_SENT timeout (`nf_conntrack_tcp_timeout_syn_sent`, 120 s), so that a later
/// revocation tells a tombstone from a handshake under way ([`Connection::is_tombstone`]).
const MIN_TOMBSTONE_SECS: u32 = 3600;
/// A SYN_SENT entry without a reply that has more than this left is a tombstone.
const TOMBSTONE_AFTER_SECS: u32 = 600;
/// Attempts at replacing an entry with its tombstone when a packet re-creates the entry in
/// between.
const TOMBSTONE_ATTEMPTS: usize = 3;

/// One tracked connection as the kernel listed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// `AF_INET` or `AF_INET6` (from the message header).
    pub family: u8,
    /// The original-direction tuple, parsed.
    pub flow: TrackedFlow,
    /// The TCP state (`enum tcp_conntrack`: 3 is ESTABLISHED), when the kernel said.
    pub tcp_state: Option<u8>,
    /// Seconds left before the entry expires, when the kernel said.
    pub timeout: Option<u32>,
    /// `CTA_STATUS` (`IPS_*` bits), when the kernel said.
    pub status: Option<u32>,
    /// `CTA_TUPLE_ORIG`'s payload as listed: handed back verbatim to delete the entry.
    orig_tuple: Vec<u8>,
    /// `CTA_TUPLE_REPLY`'s payload as listed (a tombstone is created with both tuples).
    reply_tuple: Vec<u8>,
    /// `CTA_ZONE`'s payload as listed (entries in a non-default zone carry it).
    zone: Option<Vec<u8>>,
}

/// Why the table could not be listed or an entry not deleted.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("conntrack: {0}")]
    Netlink(#[from] NfnetlinkError),
}

impl ConntrackError {
    /// Whether the netns no longer exists (the pod is gone, its connections with it).
    pub fn netns_gone(&self) -> bool {
        matches!(self, ConntrackError::Netns(e) if crate::netns::netns_gone(e))
    }
}

/// One reply datagram, read: the connections it lists and whether the reply ended.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Datagram {
    pub connections: Vec<Connection>,
    /// `NLMSG_DONE` (or the ack of a request) was in it.
    pub done: bool,
    /// The kernel flagged the dump interrupted (`NLM_F_DUMP_INTR`): the listing may miss
    /// entries.
    pub interrupted: bool,
    /// An `NLMSG_ERROR` with a non-zero code (a negative errno, as the kernel sends it).
    pub error: Option<i32>,
}

fn message_type(msg: u16) -> u16 {
    (NFNL_SUBSYS_CTNETLINK << 8) | msg
}

/// A ctnetlink request (see [`crate::nfnetlink::request`]).
fn message(msg: u16, flags: u16, seq: u32, family: u8, attrs: &[u8]) -> Vec<u8> {
    crate::nfnetlink::request(message_type(msg), flags, seq, family, attrs)
}

/// Which tracked connections a dump asks the kernel for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpFilter {
    /// Every connection of every family.
    All,
    /// Those whose original source is this address (incoming connections from a peer).
    OrigSource(IpAddr),
    /// Those whose original destination is this address (outgoing connections to a peer).
    OrigDestination(IpAddr),
}

/// The request to list (at least) the tracked connections `filter` names. A filtered dump is
/// the kernel's (`CTA_FILTER`, Linux 5.9): it still walks the table, but builds and sends only
/// the entries that match — the cost of a dump is mostly the messages. Callers judge every
/// entry listed, so a kernel that sends more (one without `CTA_FILTER` ignores it and sends
/// the family's entries) costs time, never correctness.
///
/// IPv6 addresses are asked for by family only: the kernel's IPv6 tuple filter is inverted
/// (`ctnetlink_filter_match_tuple` tests `!ipv6_addr_cmp(..)`, true when the addresses are
/// *equal*, and skips the entry; Linux 6.18 here: a filter by an IPv6 source listed every
/// IPv6 entry but that source's). Trusting it would miss exactly the connections to revoke.
pub fn dump_request(filter: DumpFilter, seq: u32) -> Vec<u8> {
    let dump = |family: u8, attrs: &[u8]| {
        message(
            IPCTNL_MSG_CT_GET,
            NLM_F_REQUEST | NLM_F_DUMP,
            seq,
            family,
            attrs,
        )
    };
    let (addr, flag, src) = match filter {
        DumpFilter::All => return dump(AF_UNSPEC, &[]),
        DumpFilter::OrigSource(IpAddr::V6(_)) | DumpFilter::OrigDestination(IpAddr::V6(_)) => {
            return dump(AF_INET6, &[])
        }
        DumpFilter::OrigSource(IpAddr::V4(addr)) => (addr, CTA_FILTER_F_CTA_IP_SRC, true),
        DumpFilter::OrigDestination(IpAddr::V4(addr)) => (addr, CTA_FILTER_F_CTA_IP_DST, false),
    };
    let kind = if src { CTA_IP_V4_SRC } else { CTA_IP_V4_DST };
    let mut ip = Vec::new();
    attr(&mut ip, kind, &addr.octets());
    let mut tuple = Vec::new();
    attr(&mut tuple, CTA_TUPLE_IP | NLA_F_NESTED, &ip);
    let mut flags = Vec::new();
    // NLA_U32 in host order (`nla_get_u32`), unlike the conntrack values.
    attr(&mut flags, CTA_FILTER_ORIG_FLAGS, &flag.to_ne_bytes());
    let mut attrs = Vec::new();
    attr(&mut attrs, CTA_TUPLE_ORIG | NLA_F_NESTED, &tuple);
    attr(&mut attrs, CTA_FILTER | NLA_F_NESTED, &flags);
    dump(AF_INET, &attrs)
}

/// The request to delete `connection` (acknowledged).
pub fn delete_request(connection: &Connection, seq: u32) -> Vec<u8> {
    let mut attrs = Vec::new();
    attr(
        &mut attrs,
        CTA_TUPLE_ORIG | NLA_F_NESTED,
        &connection.orig_tuple,
    );
    if let Some(zone) = &connection.zone {
        attr(&mut attrs, CTA_ZONE, zone);
    }
    message(
        IPCTNL_MSG_CT_DELETE,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        connection.family,
        &attrs,
    )
}

/// The request to create the tombstone of TCP `connection` (acknowledged; refused if an
/// entry with its tuples exists): the same tuples and zone, state SYN_SENT, no status bit (in
/// particular not `IPS_SEEN_REPLY`), living as long as the entry had left (at least
/// [`MIN_TOMBSTONE_SECS`]).
pub fn tombstone_request(connection: &Connection, seq: u32) -> Vec<u8> {
    let mut attrs = Vec::new();
    attr(
        &mut attrs,
        CTA_TUPLE_ORIG | NLA_F_NESTED,
        &connection.orig_tuple,
    );
    attr(
        &mut attrs,
        CTA_TUPLE_REPLY | NLA_F_NESTED,
        &connection.reply_tuple,
    );
    let secs = connection.timeout.unwrap_or(0).max(MIN_TOMBSTONE_SECS);
    attr(&mut attrs, CTA_TIMEOUT, &secs.to_be_bytes());
    let mut state = Vec::new();
    attr(
        &mut state,
        CTA_PROTOINFO_TCP_STATE,
        &[TCP_CONNTRACK_SYN_SENT],
    );
    let mut tcp = Vec::new();
    attr(&mut tcp, CTA_PROTOINFO_TCP | NLA_F_NESTED, &state);
    attr(&mut attrs, CTA_PROTOINFO | NLA_F_NESTED, &tcp);
    if let Some(zone) = &connection.zone {
        attr(&mut attrs, CTA_ZONE, zone);
    }
    message(
        IPCTNL_MSG_CT_NEW,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        seq,
        connection.family,
        &attrs,
    )
}

/// Reads one reply datagram to request `seq`. Messages of another sequence number are
/// skipped (none come on a fresh connected socket; kept for robustness).
pub fn parse_datagram(bytes: &[u8], seq: u32) -> Result<Datagram, ConntrackError> {
    let mut connections = Vec::new();
    let ending = read_datagram(bytes, seq, |kind, payload| {
        if kind == message_type(IPCTNL_MSG_CT_NEW) {
            connections.extend(parse_connection(payload)?);
        }
        Ok(())
    })
    .map_err(NfnetlinkError::Malformed)?;
    Ok(Datagram {
        connections,
        done: ending.done,
        interrupted: ending.interrupted,
        error: ending.error,
    })
}

/// One `IPCTNL_MSG_CT_NEW` payload (nfgenmsg + attributes). `None` for a family other than
/// IPv4 and IPv6 (nothing netwarden judges).
fn parse_connection(payload: &[u8]) -> Result<Option<Connection>, String> {
    let bad = |what: &str| what.to_string();
    let family = *payload.first().ok_or_else(|| bad("empty message"))?;
    if family != AF_INET && family != AF_INET6 {
        return Ok(None);
    }
    let attrs = payload
        .get(NFGENMSG_LEN..)
        .ok_or_else(|| bad("short nfgenmsg"))?;
    let mut orig = None;
    let mut reply = None;
    let mut timeout = None;
    let mut status = None;
    let mut zone = None;
    let mut tcp_state = None;
    for nla in NlasIterator::new(attrs) {
        let nla = nla.map_err(|e| bad(&format!("attribute: {e}")))?;
        match nla.kind() {
            CTA_TUPLE_ORIG => orig = Some(nla.value().to_vec()),
            CTA_TUPLE_REPLY => reply = Some(nla.value().to_vec()),
            CTA_TIMEOUT => timeout = be_u32(nla.value()),
            CTA_STATUS => status = be_u32(nla.value()),
            CTA_ZONE => zone = Some(nla.value().to_vec()),
            CTA_PROTOINFO => tcp_state = tcp_state_of(nla.value()),
            _ => {}
        }
    }
    let orig = orig.ok_or_else(|| bad("no original tuple"))?;
    let reply = reply.ok_or_else(|| bad("no reply tuple"))?;
    let flow = parse_tuple(&orig)?;
    Ok(Some(Connection {
        family,
        flow,
        tcp_state,
        timeout,
        status,
        orig_tuple: orig,
        reply_tuple: reply,
        zone,
    }))
}

fn be_u32(value: &[u8]) -> Option<u32> {
    <[u8; 4]>::try_from(value).ok().map(u32::from_be_bytes)
}

impl Connection {
    /// Whether this entry is a tombstone a revocation left (see the module doc): TCP in
    /// SYN_SENT, never replied, with far more time left than a real handshake gets. Such an
    /// entry already refuses the connection; it is not revoked again.
    pub fn is_tombstone(&self) -> bool {
        self.flow.protocol == netwarden_engine::judge::IPPROTO_TCP
            && self.tcp_state == Some(TCP_CONNTRACK_SYN_SENT)
            && self.status.is_some_and(|s| s & IPS_SEEN_REPLY == 0)
            && self.timeout.is_some_and(|t| t > TOMBSTONE_AFTER_SECS)
    }
}

fn tcp_state_of(protoinfo: &[u8]) -> Option<u8> {
    let tcp = NlasIterator::new(protoinfo)
        .filter_map(Result::ok)
        .find(|n| n.kind() == CTA_PROTOINFO_TCP)?;
    let state = NlasIterator::new(tcp.value())
        .filter_map(Result::ok)
        .find(|n| n.kind() == CTA_PROTOINFO_TCP_STATE)?;
    state.value().first().copied()
}

/// A tuple: addresses, protocol number and (for protocols with ports) the ports, big-endian.
fn parse_tuple(tuple: &[u8]) -> Result<TrackedFlow, String> {
    let bad = |what: &str| what.to_string();
    let (mut src, mut dst, mut protocol) = (None, None, None);
    let (mut sport, mut dport) = (0u16, 0u16);
    for nla in NlasIterator::new(tuple) {
        let nla = nla.map_err(|e| bad(&format!("tuple attribute: {e}")))?;
        match nla.kind() {
            CTA_TUPLE_IP => {
                for ip in NlasIterator::new(nla.value()) {
                    let ip = ip.map_err(|e| bad(&format!("address attribute: {e}")))?;
                    let v = ip.value();
                    let addr = match (ip.kind(), v.len()) {
                        (CTA_IP_V4_SRC | CTA_IP_V4_DST, 4) => {
                            IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(v).unwrap_or_default()))
                        }
                        (CTA_IP_V6_SRC | CTA_IP_V6_DST, 16) => {
                            IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(v).unwrap_or_default()))
                        }
                        _ => return Err(bad("address of unexpected kind or length")),
                    };
                    match ip.kind() {
                        CTA_IP_V4_SRC | CTA_IP_V6_SRC => src = Some(addr),
                        _ => dst = Some(addr),
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for p in NlasIterator::new(nla.value()) {
                    let p = p.map_err(|e| bad(&format!("protocol attribute: {e}")))?;
                    let port = || -> Result<u16, String> {
                        let v: [u8; 2] = p.value().try_into().map_err(|_| bad("port length"))?;
                        Ok(u16::from_be_bytes(v))
                    };
                    match p.kind() {
                        CTA_PROTO_NUM => protocol = p.value().first().copied(),
                        CTA_PROTO_SRC_PORT => sport = port()?,
                        CTA_PROTO_DST_PORT => dport = port()?,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    match (src, dst, protocol) {
        (Some(src), Some(dst), Some(protocol)) => Ok(TrackedFlow {
            src,
            dst,
            protocol,
            sport,
            dport,
        }),
        _ => Err(bad("incomplete tuple")),
    }
}

/// Sends `request` and reads its reply; `on` sees each connection listed.
fn talk(
    socket: &Socket,
    what: &'static str,
    request: &[u8],
    seq: u32,
    buffer: &mut [u8],
    mut on: impl FnMut(Connection),
) -> Result<(), ConntrackError> {
    exchange(socket, what, request, seq, buffer, |kind, payload| {
        if kind == message_type(IPCTNL_MSG_CT_NEW) {
            parse_connection(payload)?.into_iter().for_each(&mut on);
        }
        Ok(())
    })?;
    Ok(())
}

/// The tracked connections `filter` names in the calling thread's netns (run it on a
/// [`Netns::run`] thread). A netns without conntrack (no rule there ever used it) lists nothing.
pub fn list_here(filter: DumpFilter) -> Result<Vec<Connection>, ConntrackError> {
    let mut all = Vec::new();
    scan_here(filter, |c| all.push(c))?;
    Ok(all)
}

/// Dumps the calling thread's conntrack table, handing each connection to `each` as its
/// datagram is read (a large table is never held whole); the number listed.
fn scan_here(
    filter: DumpFilter,
    mut each: impl FnMut(Connection),
) -> Result<usize, ConntrackError> {
    let socket = open_socket()?;
    let mut buffer = vec![0; DATAGRAM];
    let mut listed = 0;
    talk(
        &socket,
        "conntrack dump",
        &dump_request(filter, 1),
        1,
        &mut buffer,
        |c| {
            listed += 1;
            each(c);
        },
    )?;
    Ok(listed)
}

/// Ends `connections` in the calling thread's netns: deletes each entry and, for TCP, puts
/// its tombstone in its place (see the module doc); the number ended. An entry gone meanwhile
/// (the connection ended by itself) is not an error.
pub fn delete_here(connections: &[Connection]) -> Result<usize, ConntrackError> {
    let socket = open_socket()?;
    let mut buffer = vec![0; DATAGRAM];
    let mut seq = 1u32;
    let mut request = |what: &'static str, bytes: &dyn Fn(u32) -> Vec<u8>| {
        seq = seq.wrapping_add(1);
        talk(&socket, what, &bytes(seq), seq, &mut buffer, |_| {})
    };
    let errno = |e: &ConntrackError| match e {
        ConntrackError::Netlink(e) => e.errno(),
        _ => None,
    };
    let mut ended = 0;
    for c in connections {
        match request("conntrack delete", &|seq| delete_request(c, seq)) {
            Ok(()) => ended += 1,
            Err(e) if errno(&e) == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        if c.flow.protocol != netwarden_engine::judge::IPPROTO_TCP {
            continue;
        }
        for attempt in 1..=TOMBSTONE_ATTEMPTS {
            match request("conntrack tombstone", &|seq| tombstone_request(c, seq)) {
                Ok(()) => break,
                // A packet of the connection re-created the entry in between: again.
                Err(e) if errno(&e) == Some(libc::EEXIST) && attempt < TOMBSTONE_ATTEMPTS => {
                    match request("conntrack delete", &|seq| delete_request(c, seq)) {
                        Ok(()) => {}
                        Err(e) if errno(&e) == Some(libc::ENOENT) => {}
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(ended)
}

/// What [`revoke`] did in one netns.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Revoked {
    /// Connections listed.
    pub listed: usize,
    /// The connections `deny` refused, each deleted (or gone by itself meanwhile).
    pub flows: Vec<TrackedFlow>,
    /// How many of them were deleted by this call.
    pub deleted: usize,
}

/// Lists the tracked connections of `netns` that `filters` name (one dump each) and deletes
/// those `deny` refuses, from one thread inside it. A filtered dump the kernel refuses (older
/// than 5.9) gives way to the whole table.
pub fn revoke(
    netns: &Netns,
    filters: Vec<DumpFilter>,
    deny: impl Fn(&TrackedFlow) -> bool + Send + 'static,
) -> Result<Revoked, ConntrackError> {
    netns.run(move || {
        let mut doomed = Vec::new();
        let mut judge = |c: Connection| {
            if !c.is_tombstone() && deny(&c.flow) {
                doomed.push(c);
            }
        };
        let mut listed = 0;
        let mut filtered = || -> Result<usize, ConntrackError> {
            let mut listed = 0;
            for filter in &filters {
                listed += scan_here(*filter, &mut judge)?;
            }
            Ok(listed)
        };
        match filtered() {
            Ok(n) => listed += n,
            Err(ConntrackError::Netlink(e)) if e.errno().is_some() => {
                listed += scan_here(DumpFilter::All, &mut judge)?;
            }
            Err(e) => return Err(e),
        }
        // One connection can be named by two filters (from one peer to another).
        doomed.sort_by_key(|c| (c.orig_tuple.clone(), c.zone.clone()));
        doomed.dedup_by(|a, b| a.orig_tuple == b.orig_tuple && a.zone == b.zone);
        let deleted = delete_here(&doomed)?;
        Ok(Revoked {
            listed,
            flows: doomed.into_iter().map(|c| c.flow).collect(),
            deleted,
        })
    })?
}

#[cfg(test)]
mod tests {
    //! Replies in the layout the kernel sends (`ctnetlink_fill_info`: nfgenmsg, then nested
    //! tuples, status, timeout, protoinfo...), built here attribute by attribute; the kernel
    //! tests (`tests/revoke_root.rs`) read real dumps with the same parser.
    use super::*;
    use crate::nfnetlink::tests::{control, done};
    use netlink_packet_core::{NetlinkBuffer, NLMSG_ERROR, NLM_F_DUMP_INTR};

    fn nested(kind: u16, inner: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        attr(&mut out, kind | NLA_F_NESTED, inner);
        out
    }

    fn tuple(src: IpAddr, dst: IpAddr, proto: u8, sport: u16, dport: u16) -> Vec<u8> {
        let mut ip = Vec::new();
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                attr(&mut ip, CTA_IP_V4_SRC, &s.octets());
                attr(&mut ip, CTA_IP_V4_DST, &d.octets());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                attr(&mut ip, CTA_IP_V6_SRC, &s.octets());
                attr(&mut ip, CTA_IP_V6_DST, &d.octets());
            }
            _ => unreachable!(),
        }
        let mut p = Vec::new();
        attr(&mut p, CTA_PROTO_NUM, &[proto]);
        attr(&mut p, CTA_PROTO_SRC_PORT, &sport.to_be_bytes());
        attr(&mut p, CTA_PROTO_DST_PORT, &dport.to_be_bytes());
        let mut t = nested(CTA_TUPLE_IP, &ip);
        t.extend(nested(CTA_TUPLE_PROTO, &p));
        t
    }

    fn entry(family: u8, seq: u32, orig: &[u8], reply: &[u8], extra: &[u8]) -> Vec<u8> {
        let mut attrs = nested(CTA_TUPLE_ORIG, orig);
        attrs.extend(nested(2, reply));
        // CTA_STATUS (IPS_CONFIRMED | IPS_ASSURED | IPS_SEEN_REPLY), CTA_TIMEOUT: skipped.
        attr(&mut attrs, 3, &0x0eu32.to_be_bytes());
        attr(&mut attrs, 7, &431999u32.to_be_bytes());
        attrs.extend_from_slice(extra);
        let mut m = message(IPCTNL_MSG_CT_NEW, 2, seq, family, &attrs);
        m.resize(m.len().next_multiple_of(4), 0);
        m
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_dump_reply_lists_original_tuples_and_tcp_state() {
        let orig = tuple(ip("10.98.0.1"), ip("10.98.0.2"), 6, 32808, 80);
        let reply = tuple(ip("10.98.0.2"), ip("10.98.0.1"), 6, 80, 32808);
        let mut tcp = Vec::new();
        attr(&mut tcp, CTA_PROTOINFO_TCP_STATE, &[3]);
        let protoinfo = nested(CTA_PROTOINFO, &nested(CTA_PROTOINFO_TCP, &tcp));
        let mut bytes = entry(AF_INET, 7, &orig, &reply, &protoinfo);
        let o6 = tuple(ip("fd00::1"), ip("fd00::2"), 17, 5353, 53);
        let r6 = tuple(ip("fd00::2"), ip("fd00::1"), 17, 53, 5353);
        bytes.extend(entry(AF_INET6, 7, &o6, &r6, &[]));
        bytes.extend(done(7));
        let d = parse_datagram(&bytes, 7).unwrap();
        assert!(d.done && !d.interrupted && d.error.is_none());
        assert_eq!(d.connections.len(), 2);
        let tcp = &d.connections[0];
        assert_eq!(
            tcp.flow,
            TrackedFlow {
                src: ip("10.98.0.1"),
                dst: ip("10.98.0.2"),
                protocol: 6,
                sport: 32808,
                dport: 80
            }
        );
        assert_eq!(tcp.tcp_state, Some(3));
        assert_eq!(tcp.orig_tuple, orig);
        let udp = &d.connections[1];
        assert_eq!(
            (udp.family, udp.flow.protocol, udp.flow.dport),
            (AF_INET6, 17, 53)
        );
        assert_eq!(udp.flow.dst, ip("fd00::2"));
        assert_eq!(udp.tcp_state, None);
    }

    #[test]
    fn a_delete_hands_back_the_listed_tuple_and_zone() {
        let orig = tuple(ip("10.98.0.1"), ip("10.98.0.2"), 6, 32808, 80);
        let reply = tuple(ip("10.98.0.2"), ip("10.98.0.1"), 6, 80, 32808);
        let mut zone = Vec::new();
        attr(&mut zone, CTA_ZONE, &5u16.to_be_bytes());
        let bytes = entry(AF_INET, 1, &orig, &reply, &zone);
        let c = parse_datagram(&bytes, 1).unwrap().connections.remove(0);
        let request = delete_request(&c, 9);
        let header = NetlinkBuffer::new_checked(&request[..]).unwrap();
        assert_eq!(header.message_type(), (1 << 8) | 2);
        assert_eq!(header.flags(), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(header.sequence_number(), 9);
        assert_eq!(header.length() as usize, request.len());
        let payload = header.payload();
        assert_eq!(payload[..4], [AF_INET, 0, 0, 0]);
        let attrs: Vec<_> = NlasIterator::new(&payload[4..])
            .map(Result::unwrap)
            .collect();
        assert_eq!(attrs.len(), 2);
        assert_eq!(attrs[0].kind(), CTA_TUPLE_ORIG);
        assert!(attrs[0].nested_flag());
        assert_eq!(attrs[0].value(), &orig[..]);
        assert_eq!(
            (attrs[1].kind(), attrs[1].value()),
            (CTA_ZONE, &[0u8, 5][..])
        );
    }

    #[test]
    fn a_tombstone_has_both_tuples_state_syn_sent_and_the_time_left() {
        let orig = tuple(ip("10.98.0.1"), ip("10.98.0.2"), 6, 32808, 80);
        let reply = tuple(ip("10.98.0.2"), ip("10.98.0.1"), 6, 80, 32808);
        let c = parse_datagram(&entry(AF_INET, 1, &orig, &reply, &[]), 1)
            .unwrap()
            .connections
            .remove(0);
        assert_eq!(c.timeout, Some(431999));
        let request = tombstone_request(&c, 3);
        let header = NetlinkBuffer::new_checked(&request[..]).unwrap();
        assert_eq!(header.message_type(), 1 << 8);
        assert_eq!(
            header.flags(),
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
        );
        let attrs: Vec<_> = NlasIterator::new(&header.payload()[4..])
            .map(Result::unwrap)
            .collect();
        let kinds: Vec<u16> = attrs.iter().map(|a| a.kind()).collect();
        assert_eq!(
            kinds,
            [CTA_TUPLE_ORIG, CTA_TUPLE_REPLY, CTA_TIMEOUT, CTA_PROTOINFO]
        );
        assert_eq!(attrs[0].value(), &orig[..]);
        assert_eq!(attrs[1].value(), &reply[..]);
        assert_eq!(attrs[2].value(), &431999u32.to_be_bytes());
        assert_eq!(tcp_state_of(attrs[3].value()), Some(TCP_CONNTRACK_SYN_SENT));
        // No status attribute: IPS_SEEN_REPLY stays clear.
        assert!(!c.is_tombstone(), "an established entry");
        let listed_back = Connection {
            tcp_state: Some(TCP_CONNTRACK_SYN_SENT),
            status: Some(0x8), // IPS_CONFIRMED only
            timeout: Some(MIN_TOMBSTONE_SECS - 1),
            ..c.clone()
        };
        assert!(listed_back.is_tombstone());
        let handshake = Connection {
            timeout: Some(119),
            ..listed_back
        };
        assert!(
            !handshake.is_tombstone(),
            "a SYN_SENT entry of a real handshake"
        );
        let short = Connection {
            timeout: Some(3),
            ..c
        };
        let request = tombstone_request(&short, 4);
        assert!(request
            .windows(4)
            .any(|w| w == MIN_TOMBSTONE_SECS.to_be_bytes()));
    }

    #[test]
    fn errors_interruptions_and_other_sequences() {
        let err = control(NLMSG_ERROR, 0, 4, &(-libc::EPERM).to_ne_bytes());
        let d = parse_datagram(&err, 4).unwrap();
        assert_eq!((d.done, d.error), (true, Some(-libc::EPERM)));
        // An ack (error 0) ends a delete without error.
        let ack = control(NLMSG_ERROR, 0, 4, &0i32.to_ne_bytes());
        assert_eq!(parse_datagram(&ack, 4).unwrap().error, None);
        // Another request's messages are not this one's.
        assert_eq!(parse_datagram(&done(3), 4).unwrap(), Datagram::default());
        let mut intr = done(4);
        intr[6..8].copy_from_slice(&(2 | NLM_F_DUMP_INTR).to_ne_bytes());
        assert!(parse_datagram(&intr, 4).unwrap().interrupted);
    }

    #[test]
    fn the_dump_request_asks_for_every_family() {
        let r = dump_request(DumpFilter::All, 1);
        let h = NetlinkBuffer::new_checked(&r[..]).unwrap();
        assert_eq!(h.message_type(), (1 << 8) | 1);
        assert_eq!(h.flags(), NLM_F_REQUEST | NLM_F_DUMP);
        assert_eq!(h.payload(), &[AF_UNSPEC, 0, 0, 0]);
    }

    #[test]
    fn a_filtered_dump_names_the_family_the_address_and_the_field() {
        let r = dump_request(DumpFilter::OrigSource(ip("10.98.0.7")), 2);
        let h = NetlinkBuffer::new_checked(&r[..]).unwrap();
        assert_eq!(h.flags(), NLM_F_REQUEST | NLM_F_DUMP);
        let payload = h.payload();
        assert_eq!(payload[..4], [AF_INET, 0, 0, 0]);
        let mut expected = Vec::new();
        let mut ip_attr = Vec::new();
        attr(&mut ip_attr, CTA_IP_V4_SRC, &[10, 98, 0, 7]);
        let tuple = nested(CTA_TUPLE_IP, &ip_attr);
        expected.extend(nested(CTA_TUPLE_ORIG, &tuple));
        let mut flags = Vec::new();
        attr(&mut flags, CTA_FILTER_ORIG_FLAGS, &1u32.to_ne_bytes());
        expected.extend(nested(CTA_FILTER, &flags));
        assert_eq!(payload[4..], expected[..]);
        // IPv4 destination: the other flag.
        let r = dump_request(DumpFilter::OrigDestination(ip("10.98.0.7")), 3);
        assert!(r[20..].windows(4).any(|w| w == 2u32.to_ne_bytes()));
        // IPv6: the family only (the kernel's IPv6 filter is inverted, see `dump_request`).
        let r = dump_request(DumpFilter::OrigDestination(ip("fd00::7")), 3);
        assert_eq!(r[16..], [AF_INET6, 0, 0, 0]);
    }

    #[test]
    fn any_bytes_give_connections_or_an_error_never_a_panic() {
        let orig = tuple(ip("10.98.0.1"), ip("10.98.0.2"), 6, 32808, 80);
        let reply = tuple(ip("10.98.0.2"), ip("10.98.0.1"), 6, 80, 32808);
        let bytes = entry(AF_INET, 1, &orig, &reply, &[]);
        for cut in 0..bytes.len() {
            let _ = parse_datagram(&bytes[..cut], 1);
            let mut flipped = bytes.clone();
            flipped[cut] ^= 0xff;
            let _ = parse_datagram(&flipped, 1);
        }
    }
}
