//! Fuzzing support for the NFLOG path: what the netlink parser ([`parse_netlink`]), the packet
//! decoder ([`decode_packet`]) and the event builder ([`build_event`]) must keep on arbitrary
//! bytes. [`check_nflog`] serves the libFuzzer target (`fuzz/fuzz_targets/nflog.rs`) and the CI
//! test (`tests/fuzz_nflog.rs`).
//!
//! Each input is looked at in two ways.
//! - **Raw**: the bytes as one received buffer, and as a packet payload under every family
//!   hint. Nothing panics; framing errors point inside the buffer; the decoder reads addresses
//!   at their fixed offsets, reports ports only for TCP/UDP/SCTP and only when the four port
//!   bytes are there (for IPv4 exactly the bytes at the header length), ICMP type and code only
//!   for ICMP; and a longer copy of the same packet never loses what a shorter one showed.
//! - **Described**: the bytes *describe* a buffer ([`Described`]): messages of every type,
//!   packet messages whose attributes are repeated, short, unknown, flagged, malformed or
//!   unpadded, payloads built from headers (IPv4 options and fragments, IPv6 extension header
//!   chains, any transport) cut at any point, and trailing garbage. The buffer is encoded here,
//!   independently of the crate's message builder, with the kernel's constants written anew;
//!   parsing it must give exactly the items the description implies — in particular ports
//!   exactly when the copy holds the first four bytes of a TCP/UDP/SCTP header that follows a
//!   complete chain of headers.
//!
//! Every packet record parsed either way then goes through [`build_event`] with a pod context
//! that knows two log keys: the event must be refused for the right reason or carry the
//! record's addresses, ports, protocol and the context's interface and direction, and its JSON
//! line must read back as the same event (the report reads these lines).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, SystemTime};

use netwarden_engine::{Direction, NetworkId, ObjectKey, PolicyKind, PolicyRef, StagedCause};
// Reading past the end gives zeros: every input describes a buffer.
use netwarden_fuzzbytes::Bytes;
use netwarden_render::{log_prefix, parse_log_prefix, LogAction, LogKey, LogKeyInfo};

use crate::decode::{decode_packet, Family, L4Protocol, PacketInfo};
use crate::event::{build_event, Event, EventAction, PodContext, Unrecognized};
use crate::nlmsg::{parse_netlink, parse_nflog_message, NflogRecord, NlItem, ParseError};
use crate::time::Timestamp;

// The kernel's numbers (`linux/netlink.h`, `linux/netfilter/nfnetlink_log.h`), written anew
// rather than imported from the parser, so a wrong constant there shows.
const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;
const NFULNL_MSG_PACKET: u16 = 4 << 8;
const NFULNL_MSG_CONFIG: u16 = (4 << 8) | 1;
const NFULA_PACKET_HDR: u16 = 1;
const NFULA_MARK: u16 = 2;
const NFULA_TIMESTAMP: u16 = 3;
const NFULA_IFINDEX_INDEV: u16 = 4;
const NFULA_IFINDEX_OUTDEV: u16 = 5;
const NFULA_HWADDR: u16 = 8;
const NFULA_PAYLOAD: u16 = 9;
const NFULA_PREFIX: u16 = 10;
const NFULA_UID: u16 = 11;
const NFULA_SEQ: u16 = 12;
const NLA_F_NESTED: u16 = 1 << 15;
const NLA_F_NET_BYTEORDER: u16 = 1 << 14;

fn has_ports(protocol: u8) -> bool {
    matches!(protocol, 6 | 17 | 132)
}

fn is_icmp(protocol: u8) -> bool {
    matches!(protocol, 1 | 58)
}

// ----- raw bytes --------------------------------------------------------------------------

/// Decodes `p` under `hint` and checks what the result says against the bytes.
fn check_decoded(p: &[u8], hint: Option<Family>) -> Option<PacketInfo> {
    let got = decode_packet(p, hint);
    let version = p.first().map(|b| b >> 4);
    let family = match (hint, version) {
        (Some(Family::Ipv4) | None, Some(4)) => Some(Family::Ipv4),
        (Some(Family::Ipv6) | None, Some(6)) => Some(Family::Ipv6),
        _ => None,
    };
    let ihl = usize::from(p.first().copied().unwrap_or(0) & 0x0f) * 4;
    let decodable = match family {
        Some(Family::Ipv4) => p.len() >= 20 && ihl >= 20,
        Some(Family::Ipv6) => p.len() >= 40,
        None => false,
    };
    let Some(info) = got else {
        assert!(
            !decodable,
            "a decodable header refused: {p:02x?} ({hint:?})"
        );
        return None;
    };
    assert!(
        decodable,
        "decoded what is no header: {p:02x?} ({hint:?}) -> {info:?}"
    );
    assert_eq!(
        info.sport.is_some(),
        info.dport.is_some(),
        "half a port pair"
    );
    if info.sport.is_some() {
        assert!(
            has_ports(info.protocol.number()),
            "ports for {:?}",
            info.protocol
        );
        assert!(info.icmp.is_none(), "ports and ICMP at once");
    }
    if info.icmp.is_some() {
        assert!(
            is_icmp(info.protocol.number()),
            "ICMP fields for {:?}",
            info.protocol
        );
    }
    let v4 =
        |r: std::ops::Range<usize>| IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&p[r]).unwrap()));
    let v6 = |r: std::ops::Range<usize>| {
        IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&p[r]).unwrap()))
    };
    match family {
        Some(Family::Ipv4) => {
            assert_eq!((info.src, info.dst), (v4(12..16), v4(16..20)));
            assert_eq!(info.protocol.number(), p[9]);
            // Exactly the four bytes at the header length, unless a later fragment.
            let first_fragment = u16::from_be_bytes([p[6], p[7]]) & 0x1fff == 0;
            let ports = (first_fragment && has_ports(p[9]))
                .then(|| p.get(ihl..ihl + 4))
                .flatten()
                .map(|h| {
                    (
                        u16::from_be_bytes([h[0], h[1]]),
                        u16::from_be_bytes([h[2], h[3]]),
                    )
                });
            assert_eq!(info.sport.zip(info.dport), ports, "IPv4 ports of {p:02x?}");
            let icmp = (first_fragment && is_icmp(p[9]))
                .then(|| p.get(ihl..ihl + 2))
                .flatten()
                .map(|h| (h[0], h[1]));
            assert_eq!(info.icmp, icmp, "IPv4 ICMP of {p:02x?}");
        }
        _ => {
            assert_eq!((info.src, info.dst), (v6(8..24), v6(24..40)));
            if info.sport.is_some() || info.icmp.is_some() {
                // At least the fixed header, and the transport bytes after it.
                assert!(p.len() >= 40 + if info.icmp.is_some() { 2 } else { 4 });
            }
        }
    }
    Some(info)
}

/// The raw view (see the module documentation).
fn check_raw(data: &[u8]) -> Vec<NflogRecord> {
    // As a payload, under every hint; and every shorter copy of it shows no more.
    for hint in [None, Some(Family::Ipv4), Some(Family::Ipv6)] {
        let full = check_decoded(data, hint);
        for cut in 0..data.len().min(160) {
            let Some(short) = check_decoded(&data[..cut], hint) else {
                continue;
            };
            let full = full.expect("a longer copy of a decodable packet decodes");
            assert_eq!((short.src, short.dst), (full.src, full.dst));
            if short.sport.is_some() || short.icmp.is_some() {
                assert_eq!(short, full, "a longer copy changed the transport fields");
            }
        }
    }
    // As a received buffer.
    let records = match parse_netlink(data) {
        Ok(items) => {
            assert!(items.len() <= data.len() / 16, "more messages than headers");
            items
                .into_iter()
                .filter_map(|i| match i {
                    NlItem::Packet(r) => Some(r),
                    _ => None,
                })
                .collect()
        }
        Err(ParseError::TruncatedHeader(at)) => {
            assert!(
                at < data.len() && data.len() - at < 16 && at % 4 == 0,
                "{at}"
            );
            Vec::new()
        }
        Err(ParseError::BadLength {
            offset,
            len,
            available,
        }) => {
            assert!(offset % 4 == 0 && available == data.len() - offset);
            assert!(len < 16 || len > available, "{len} {available}");
            Vec::new()
        }
    };
    for r in &records {
        if let Some(prefix) = &r.prefix {
            assert!(!prefix.contains('\0'), "a NUL in the prefix {prefix:?}");
        }
        if let Some(p) = &r.packet {
            match r.family {
                2 => assert!(p.src.is_ipv4(), "IPv6 packet in an IPv4 message"),
                10 => assert!(p.src.is_ipv6(), "IPv4 packet in an IPv6 message"),
                _ => {}
            }
        }
    }
    records
}

// ----- described buffers ------------------------------------------------------------------

/// An IPv6 extension header of a described packet.
#[derive(Debug, Clone)]
enum ExtHeader {
    /// Hop-by-hop (0), routing (43), destination options (60), mobility (135): `(len + 1) * 8`
    /// bytes.
    Options { kind: u8, len: u8 },
    /// Fragment (44): 8 bytes; a non-zero offset means no transport header follows.
    Fragment { offset: u16 },
    /// Authentication header (51): `(len + 2) * 4` bytes.
    Auth { len: u8 },
}

impl ExtHeader {
    fn kind(&self) -> u8 {
        match self {
            ExtHeader::Options { kind, .. } => *kind,
            ExtHeader::Fragment { .. } => 44,
            ExtHeader::Auth { .. } => 51,
        }
    }

    fn size(&self) -> usize {
        match self {
            ExtHeader::Options { len, .. } => (usize::from(*len) + 1) * 8,
            ExtHeader::Fragment { .. } => 8,
            ExtHeader::Auth { len } => (usize::from(*len) + 2) * 4,
        }
    }

    /// Bytes the decoder needs to read to step over it.
    fn needed(&self) -> usize {
        match self {
            ExtHeader::Fragment { .. } => 4,
            _ => 2,
        }
    }
}

/// A packet: network header, transport bytes, and where the kernel's copy ends.
#[derive(Debug, Clone)]
struct PacketDesc {
    /// The version nibble written (4 or 6, or another to be refused).
    version: u8,
    src: IpAddr,
    dst: IpAddr,
    /// IPv4: options (whole 32-bit words).
    options: Vec<u8>,
    /// IPv4: the header length field says less than 20 bytes.
    short_ihl: bool,
    /// IPv4: fragment offset (non-zero: no transport header).
    fragment_offset: u16,
    /// IPv6: the extension header chain.
    chain: Vec<ExtHeader>,
    protocol: u8,
    transport: Vec<u8>,
    /// The copy range: bytes kept of the encoded packet.
    copy: usize,
}

impl PacketDesc {
    fn generate(b: &mut Bytes) -> PacketDesc {
        let v6 = b.one_in(2);
        let version = match b.below(16) {
            0 => [0u8, 5, 15][b.below(3)],
            _ if v6 => 6,
            _ => 4,
        };
        let addr = |b: &mut Bytes| {
            if v6 {
                IpAddr::V6(Ipv6Addr::from(
                    (u128::from(b.u32()) << 96) | u128::from(b.u8()),
                ))
            } else {
                IpAddr::V4(Ipv4Addr::from(b.u32()))
            }
        };
        let (src, dst) = (addr(b), addr(b));
        let options = if !v6 && b.one_in(3) {
            let words = 1 + b.below(10);
            b.bytes(4 * words)
        } else {
            Vec::new()
        };
        let short_ihl = !v6 && b.one_in(16);
        let fragment_offset = if b.one_in(6) { 1 + b.u16() % 0x1fff } else { 0 };
        let mut chain = Vec::new();
        if v6 {
            let n = match b.below(8) {
                0..=3 => 0,
                4 => 8 + b.below(3),
                _ => 1 + b.below(3),
            };
            for _ in 0..n {
                chain.push(match b.below(6) {
                    0 => ExtHeader::Fragment {
                        offset: if b.one_in(3) { 1 + b.u16() % 0x1fff } else { 0 },
                    },
                    1 => ExtHeader::Auth { len: b.u8() % 8 },
                    k => ExtHeader::Options {
                        kind: [0, 43, 60, 135][k - 2],
                        // Sometimes longer than any copy (attributes stay below 64 KiB).
                        len: if b.one_in(8) { b.u8() % 32 } else { b.u8() % 3 },
                    },
                });
            }
        }
        let protocol = match b.below(8) {
            0 => 6,
            1 => 17,
            2 => 132,
            3 => 1,
            4 => 58,
            5 => 47,
            _ => b.u8(),
        };
        // After IPv6 headers, an extension header number would make the decoder walk on into
        // the transport bytes: "no next header" (59) instead.
        let protocol = if v6 && matches!(protocol, 0 | 43 | 44 | 51 | 60 | 135) {
            59
        } else {
            protocol
        };
        let transport_len = b.below(24);
        let transport = b.bytes(transport_len);
        let copy = match b.below(4) {
            0 => usize::from(b.u8()),
            1 => 20 + b.below(48),
            _ => usize::MAX,
        };
        PacketDesc {
            version,
            src,
            dst,
            options,
            short_ihl,
            fragment_offset,
            chain,
            protocol,
            transport,
            copy,
        }
    }

    /// The packet as the kernel copies it.
    fn encode(&self) -> Vec<u8> {
        let mut p = Vec::new();
        match (self.src, self.dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                let ihl = if self.short_ihl {
                    4
                } else {
                    5 + self.options.len() / 4
                };
                p.push((self.version << 4) | ihl as u8);
                p.push(0);
                let total = (20 + self.options.len() + self.transport.len()) as u16;
                p.extend_from_slice(&total.to_be_bytes());
                p.extend_from_slice(&[0x12, 0x34]);
                p.extend_from_slice(&self.fragment_offset.to_be_bytes());
                p.extend_from_slice(&[64, self.protocol, 0, 0]);
                p.extend_from_slice(&src.octets());
                p.extend_from_slice(&dst.octets());
                p.extend_from_slice(&self.options);
            }
            (IpAddr::V6(src), IpAddr::V6(dst)) => {
                p.extend_from_slice(&[self.version << 4, 0, 0, 0]);
                let rest: usize =
                    self.chain.iter().map(ExtHeader::size).sum::<usize>() + self.transport.len();
                p.extend_from_slice(&(rest as u16).to_be_bytes());
                p.push(self.chain.first().map_or(self.protocol, ExtHeader::kind));
                p.push(64);
                p.extend_from_slice(&src.octets());
                p.extend_from_slice(&dst.octets());
                for (i, h) in self.chain.iter().enumerate() {
                    let next = self.chain.get(i + 1).map_or(self.protocol, ExtHeader::kind);
                    let mut bytes = vec![0xa5; h.size()];
                    bytes[0] = next;
                    match h {
                        ExtHeader::Options { len, .. } | ExtHeader::Auth { len } => bytes[1] = *len,
                        ExtHeader::Fragment { offset } => {
                            bytes[1] = 0;
                            bytes[2..4].copy_from_slice(&((offset << 3) | 1).to_be_bytes());
                        }
                    }
                    p.extend_from_slice(&bytes);
                }
            }
            _ => unreachable!("both addresses of a described packet have its family"),
        }
        p.extend_from_slice(&self.transport);
        p.truncate(self.copy);
        p
    }

    /// What decoding the copy must give under `hint`, from the description alone.
    fn expected(&self, hint: Option<Family>) -> Option<PacketInfo> {
        let copied = self.encode().len();
        let family = match (hint, self.version) {
            (Some(Family::Ipv4) | None, 4) => Family::Ipv4,
            (Some(Family::Ipv6) | None, 6) => Family::Ipv6,
            _ => return None,
        };
        if copied == 0 {
            return None;
        }
        // Where the transport header starts, and the protocol found there.
        let (protocol, transport_at) = match family {
            Family::Ipv4 => {
                if copied < 20 || self.short_ihl {
                    return None;
                }
                let at = (self.fragment_offset == 0).then_some(20 + self.options.len());
                (self.protocol, at)
            }
            Family::Ipv6 => {
                if copied < 40 {
                    return None;
                }
                let mut at = 40;
                let mut found = (self.protocol, None);
                let mut walked = true;
                for (i, h) in self.chain.iter().enumerate() {
                    // The decoder gives up after eight extension headers.
                    if i == 8 || copied < at + h.needed() {
                        found = (h.kind(), None);
                        walked = false;
                        break;
                    }
                    if let ExtHeader::Fragment { offset } = h {
                        if *offset != 0 {
                            let next = self.chain.get(i + 1).map_or(self.protocol, ExtHeader::kind);
                            found = (next, None);
                            walked = false;
                            break;
                        }
                    }
                    at += h.size();
                }
                if walked {
                    found.1 = Some(at);
                }
                found
            }
        };
        // The version nibble matches the description's family (or the packet was refused).
        let (src, dst) = (self.src, self.dst);
        let transport = transport_at.filter(|at| *at <= copied).map(|at| {
            let end = copied.min(at + self.transport.len());
            let held = end.saturating_sub(at);
            &self.transport[..held]
        });
        let ports = transport
            .filter(|_| has_ports(protocol))
            .and_then(|t| t.get(0..4))
            .map(|h| {
                (
                    u16::from_be_bytes([h[0], h[1]]),
                    u16::from_be_bytes([h[2], h[3]]),
                )
            });
        let icmp = transport
            .filter(|_| is_icmp(protocol))
            .and_then(|t| t.get(0..2))
            .map(|h| (h[0], h[1]));
        Some(PacketInfo {
            src,
            dst,
            protocol: L4Protocol::from_number(protocol),
            sport: ports.map(|p| p.0),
            dport: ports.map(|p| p.1),
            icmp,
        })
    }
}

/// An attribute of a described packet message.
#[derive(Debug, Clone)]
enum Attr {
    /// Type (flag bits included) and value.
    Plain { ty: u16, value: Vec<u8> },
    /// A payload built from a description.
    Payload { ty: u16, packet: PacketDesc },
    /// A header with an impossible length (below 4, or past the message): the walk stops.
    Malformed { len: u16 },
}

/// A message of a described buffer.
#[derive(Debug, Clone)]
enum Message {
    Packet {
        family: u8,
        group: u16,
        attrs: Vec<Attr>,
        /// The last attribute's padding is left out of the message length.
        unpadded: bool,
    },
    /// A packet message too short for its `nfgenmsg`.
    ShortPacket {
        body: Vec<u8>,
    },
    Error {
        seq: u32,
        errno: Option<i32>,
    },
    Other {
        ty: u16,
        body: Vec<u8>,
    },
}

/// What ends a described buffer after its messages.
#[derive(Debug, Clone)]
enum Tail {
    None,
    /// Fewer bytes than a message header.
    Truncated(Vec<u8>),
    /// A header whose length is below the header size or past the buffer.
    BadLength {
        len: u32,
        extra: Vec<u8>,
    },
}

/// A received buffer described as messages (see the module documentation).
#[derive(Debug, Clone)]
pub struct Described {
    messages: Vec<Message>,
    tail: Tail,
}

fn prefix_value(b: &mut Bytes) -> Vec<u8> {
    let mut v = match b.below(6) {
        0 => log_prefix(LogAction::WouldDeny, LogKey(KEY_INGRESS)).into_bytes(),
        1 => log_prefix(LogAction::Deny, LogKey(KEY_EGRESS)).into_bytes(),
        2 => format!("nw:wd:{:08X}", KEY_EGRESS).into_bytes(),
        3 => log_prefix(LogAction::WouldDeny, LogKey(b.u32())).into_bytes(),
        _ => {
            let parts: [&[u8]; 8] = [b"nw", b":", b"wd", b"dn", b"0000abcd", b" ", b"\xff", b"\0"];
            (0..b.below(8))
                .flat_map(|_| parts[b.below(8)].to_vec())
                .collect()
        }
    };
    if b.one_in(2) {
        v.push(0);
    }
    v
}

impl Described {
    /// Decodes a description from arbitrary bytes (every input decodes).
    pub fn from_bytes(data: &[u8]) -> Described {
        let mut b = Bytes::new(data);
        let count = b.below(5);
        let mut messages = Vec::new();
        for _ in 0..count {
            messages.push(match b.below(10) {
                0 => Message::Error {
                    seq: b.u32(),
                    errno: (!b.one_in(4)).then(|| -(b.below(200) as i32)),
                },
                1 => {
                    let ty = [
                        NLMSG_NOOP,
                        NLMSG_DONE,
                        NLMSG_OVERRUN,
                        NFULNL_MSG_CONFIG,
                        b.u16(),
                    ][b.below(5)];
                    // Errors and packets have their own descriptions.
                    let ty = if matches!(ty, NLMSG_ERROR | NFULNL_MSG_PACKET) {
                        NLMSG_NOOP
                    } else {
                        ty
                    };
                    let n = b.below(12);
                    Message::Other {
                        ty,
                        body: b.bytes(n),
                    }
                }
                2 => {
                    let n = b.below(4);
                    Message::ShortPacket { body: b.bytes(n) }
                }
                _ => {
                    let family = [2, 10, 2, 10, 0, 7][b.below(6)];
                    let group = b.u16();
                    let mut attrs = Vec::new();
                    for _ in 0..b.below(10) {
                        let flags = [0, 0, 0, NLA_F_NESTED, NLA_F_NET_BYTEORDER][b.below(5)];
                        let short = b.one_in(8);
                        let sized = |b: &mut Bytes, n: usize| {
                            let n = if short { b.below(n) } else { n };
                            b.bytes(n)
                        };
                        let plain = |ty: u16, value: Vec<u8>| Attr::Plain {
                            ty: ty | flags,
                            value,
                        };
                        attrs.push(match b.below(12) {
                            0 => {
                                // The ethertype agrees with the payload mostly.
                                let hw: u16 = [0x0800, 0x86dd, 0x0806, b.u16()][b.below(4)];
                                let mut v = hw.to_be_bytes().to_vec();
                                v.extend_from_slice(&[b.u8(), 0]);
                                v.truncate(if short { b.below(4) } else { 4 });
                                plain(NFULA_PACKET_HDR, v)
                            }
                            1 => plain(NFULA_MARK, sized(&mut b, 4)),
                            2 => {
                                let mut v = Vec::new();
                                let sec = match b.below(4) {
                                    0 => b.u64(),
                                    1 => 253_402_300_800 + u64::from(b.u32()),
                                    _ => 1_700_000_000 + u64::from(b.u16()),
                                };
                                v.extend_from_slice(&sec.to_be_bytes());
                                let usec = if b.one_in(4) {
                                    b.u64()
                                } else {
                                    u64::from(b.u32() % 1_000_000)
                                };
                                v.extend_from_slice(&usec.to_be_bytes());
                                v.truncate(if short { b.below(16) } else { 16 });
                                plain(NFULA_TIMESTAMP, v)
                            }
                            3 => plain(NFULA_IFINDEX_INDEV, sized(&mut b, 4)),
                            4 => plain(NFULA_IFINDEX_OUTDEV, sized(&mut b, 4)),
                            5 => plain(NFULA_SEQ, sized(&mut b, 4)),
                            6 | 7 => {
                                let v = prefix_value(&mut b);
                                plain(NFULA_PREFIX, v)
                            }
                            8 => {
                                let ty = [NFULA_HWADDR, NFULA_UID, 0, 0x3fff][b.below(4)];
                                let n = b.below(12);
                                let v = b.bytes(n);
                                plain(ty, v)
                            }
                            9 if b.one_in(3) => Attr::Malformed {
                                len: [0, 1, 2, 3, 0xffff][b.below(5)],
                            },
                            _ => Attr::Payload {
                                ty: NFULA_PAYLOAD | flags,
                                packet: PacketDesc::generate(&mut b),
                            },
                        });
                    }
                    Message::Packet {
                        family,
                        group,
                        attrs,
                        unpadded: b.one_in(4),
                    }
                }
            });
        }
        let tail = match b.below(8) {
            0 => {
                let n = 1 + b.below(15);
                Tail::Truncated(b.bytes(n))
            }
            1 => {
                let n = b.below(8);
                let extra = b.bytes(n);
                // Below the header size, or past the buffer.
                let past = 16 + n as u32 + 1 + u32::from(b.u8());
                Tail::BadLength {
                    len: [0, 15, past, u32::MAX][b.below(4)],
                    extra,
                }
            }
            _ => Tail::None,
        };
        Described { messages, tail }
    }

    /// The buffer as the kernel would send it.
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        for m in &self.messages {
            encode_message(m, &mut buf);
        }
        match &self.tail {
            Tail::None => {}
            Tail::Truncated(bytes) => buf.extend_from_slice(bytes),
            Tail::BadLength { len, extra } => {
                buf.extend_from_slice(&len.to_ne_bytes());
                buf.extend_from_slice(&[0; 12]);
                buf.extend_from_slice(extra);
            }
        }
        buf
    }

    /// What parsing the buffer must give, from the description alone.
    fn expected(&self) -> Result<Vec<NlItem>, ParseError> {
        let mut items = Vec::new();
        let mut offset = 0;
        for m in &self.messages {
            items.push(match m {
                Message::Packet {
                    family,
                    group,
                    attrs,
                    ..
                } => NlItem::Packet(expected_record(*family, *group, attrs)),
                Message::ShortPacket { .. } => NlItem::Other(NFULNL_MSG_PACKET),
                Message::Error { seq, errno } => NlItem::Ack {
                    seq: *seq,
                    errno: errno.unwrap_or(0),
                },
                Message::Other { ty, .. } => match *ty {
                    NLMSG_OVERRUN => NlItem::Overrun,
                    ty => NlItem::Other(ty),
                },
            });
            let mut alone = Vec::new();
            encode_message(m, &mut alone);
            offset += alone.len();
        }
        match &self.tail {
            Tail::None => Ok(items),
            Tail::Truncated(_) => Err(ParseError::TruncatedHeader(offset)),
            Tail::BadLength { len, extra } => Err(ParseError::BadLength {
                offset,
                len: *len as usize,
                available: 16 + extra.len(),
            }),
        }
    }
}

/// Appends one message, padded to four bytes.
fn encode_message(m: &Message, buf: &mut Vec<u8>) {
    let start = buf.len();
    let header = |buf: &mut Vec<u8>, ty: u16, seq: u32| {
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(&ty.to_ne_bytes());
        buf.extend_from_slice(&0u16.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
    };
    let mut len_override = None;
    match m {
        Message::Packet {
            family,
            group,
            attrs,
            unpadded,
        } => {
            header(buf, NFULNL_MSG_PACKET, 0);
            buf.extend_from_slice(&[*family, 0]);
            buf.extend_from_slice(&group.to_be_bytes());
            let mut unpadded_end = None;
            for a in attrs {
                let (ty, value, len) = match a {
                    Attr::Plain { ty, value } => (*ty, value.clone(), 4 + value.len()),
                    Attr::Payload { ty, packet } => {
                        let v = packet.encode();
                        let len = 4 + v.len();
                        (*ty, v, len)
                    }
                    Attr::Malformed { len } => (NFULA_PREFIX, Vec::new(), usize::from(*len)),
                };
                buf.extend_from_slice(&(len as u16).to_ne_bytes());
                buf.extend_from_slice(&ty.to_ne_bytes());
                buf.extend_from_slice(&value);
                unpadded_end = Some(buf.len());
                buf.resize(buf.len().next_multiple_of(4), 0);
            }
            if *unpadded {
                len_override = unpadded_end;
            }
        }
        Message::ShortPacket { body } => {
            header(buf, NFULNL_MSG_PACKET, 0);
            buf.extend_from_slice(body);
        }
        Message::Error { seq, errno } => {
            header(buf, NLMSG_ERROR, *seq);
            if let Some(e) = errno {
                buf.extend_from_slice(&e.to_ne_bytes());
                buf.extend_from_slice(&[0; 16]);
            }
        }
        Message::Other { ty, body } => {
            header(buf, *ty, 0);
            buf.extend_from_slice(body);
        }
    }
    let len = len_override.unwrap_or(buf.len()) - start;
    buf[start..start + 4].copy_from_slice(&(len as u32).to_ne_bytes());
    buf.resize(buf.len().next_multiple_of(4), 0);
}

/// A described packet message's record: attributes in order up to the first malformed one,
/// each of the fixed-size ones replaced by every later one of its type (a short value gives
/// none), the timestamp only by a complete one, the payload decoded under the message family
/// or, without one, the ethertype of the last packet header.
fn expected_record(family: u8, group: u16, attrs: &[Attr]) -> NflogRecord {
    let mut r = NflogRecord {
        family,
        group,
        prefix: None,
        hw_protocol: None,
        hook: None,
        mark: None,
        indev: None,
        outdev: None,
        timestamp: None,
        seq: None,
        packet: None,
    };
    let be32 = |v: &[u8]| {
        v.get(0..4)
            .map(|b| u32::from_be_bytes(b.try_into().unwrap()))
    };
    let mut payload = None;
    for a in attrs {
        let (ty, value) = match a {
            Attr::Malformed { .. } => break,
            Attr::Payload { ty, packet } => {
                if ty & 0x3fff == NFULA_PAYLOAD {
                    payload = Some(packet);
                }
                continue;
            }
            Attr::Plain { ty, value } => (ty & 0x3fff, value),
        };
        match ty {
            NFULA_PACKET_HDR => {
                r.hw_protocol = value.get(0..2).map(|b| u16::from_be_bytes([b[0], b[1]]));
                r.hook = value.get(2).copied();
            }
            NFULA_MARK => r.mark = be32(value),
            NFULA_IFINDEX_INDEV => r.indev = be32(value),
            NFULA_IFINDEX_OUTDEV => r.outdev = be32(value),
            NFULA_SEQ => r.seq = be32(value),
            NFULA_TIMESTAMP if value.len() >= 16 => {
                let sec = u64::from_be_bytes(value[0..8].try_into().unwrap());
                let usec = u64::from_be_bytes(value[8..16].try_into().unwrap());
                r.timestamp = SystemTime::UNIX_EPOCH
                    .checked_add(Duration::from_secs(sec))
                    .and_then(|t| t.checked_add(Duration::from_micros(usec.min(999_999))));
            }
            NFULA_PREFIX => {
                let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
                r.prefix = Some(String::from_utf8_lossy(&value[..end]).into_owned());
            }
            _ => {}
        }
    }
    let hint = match family {
        2 => Some(Family::Ipv4),
        10 => Some(Family::Ipv6),
        _ => match r.hw_protocol {
            Some(0x0800) => Some(Family::Ipv4),
            Some(0x86dd) => Some(Family::Ipv6),
            _ => None,
        },
    };
    r.packet = payload.and_then(|p| p.expected(hint));
    r
}

// ----- events -----------------------------------------------------------------------------

const KEY_INGRESS: u32 = 0x0000_abcd;
const KEY_EGRESS: u32 = 0x1234_5678;

/// A pod context knowing two log keys (ingress on `eth0`, egress on `net1`), with object text
/// that needs escaping in JSON.
fn context() -> PodContext {
    let policy = |name: &str| PolicyRef {
        kind: PolicyKind::NetworkPolicy,
        key: ObjectKey::new("shop\"\n", name),
    };
    let info = |interface: &str, network, direction| LogKeyInfo {
        interface: interface.into(),
        network,
        direction,
        monitored_policies: vec![policy("new\u{7f}")],
        monitored_admin: Vec::new(),
        enforced_admin: Vec::new(),
        enforced_policies: vec![policy("old\\")],
        cause: StagedCause::NewIsolation,
    };
    PodContext {
        pod: ObjectKey::new("shop\"\n", "web\t"),
        node: "node-\u{e9}".into(),
        log_keys: BTreeMap::from([
            (
                KEY_INGRESS,
                info("eth0", NetworkId::Primary, Direction::Ingress),
            ),
            (
                KEY_EGRESS,
                info("net1", NetworkId::nad("shop", "storage"), Direction::Egress),
            ),
        ]),
    }
}

/// Builds the event of `record` and checks it (see the module documentation).
fn check_event(record: &NflogRecord, ctx: &PodContext) {
    let received = Timestamp(1_700_000_000_000_000);
    let peer = ObjectKey::new("peer", "pod");
    let resolve = |addr: IpAddr| addr.is_ipv4().then(|| peer.clone());
    let got = build_event(record, received, ctx, &resolve);
    let Some(prefix) = &record.prefix else {
        assert_eq!(got, Err(Unrecognized::NoPrefix));
        return;
    };
    let Some((action, key)) = parse_log_prefix(prefix) else {
        assert_eq!(got, Err(Unrecognized::ForeignPrefix(prefix.clone())));
        return;
    };
    let Some(info) = ctx.log_keys.get(&key.0) else {
        assert_eq!(got, Err(Unrecognized::UnknownKey(key.0)));
        return;
    };
    let Some(packet) = &record.packet else {
        assert_eq!(got, Err(Unrecognized::NoPacket));
        return;
    };
    let event: Event = got.expect("an event for a known key and a decoded packet");
    assert_eq!(event.action, EventAction::from(action));
    assert_eq!(
        (event.direction, &event.interface),
        (info.direction, &info.interface)
    );
    assert_eq!((event.src, event.dst), (packet.src, packet.dst));
    assert_eq!((event.sport, event.dport), (packet.sport, packet.dport));
    assert_eq!(event.protocol, packet.protocol.name());
    let peer_addr = match info.direction {
        Direction::Ingress => packet.src,
        Direction::Egress => packet.dst,
    };
    assert_eq!(event.peer.is_some(), peer_addr.is_ipv4());
    // The kernel's time when RFC 3339 can write it, else the receive time.
    let time = record
        .timestamp
        .map(Timestamp::from)
        .filter(|t| t.is_rfc3339())
        .unwrap_or(received);
    assert_eq!(event.time, time);
    // One line, and it reads back as the same event.
    let line = event.to_json_line();
    assert!(
        !line.contains('\n'),
        "a newline inside an event line: {line}"
    );
    match serde_json::from_str::<Event>(&line) {
        Ok(back) => assert_eq!(back, event, "the event line reads back differently: {line}"),
        Err(e) => panic!("the event line does not read back ({e}): {line}"),
    }
}

// ----- the checks -------------------------------------------------------------------------

/// Checks every invariant of the module documentation on `data`; panics on a violation.
pub fn check_nflog(data: &[u8]) {
    let ctx = context();
    for record in check_raw(data) {
        check_event(&record, &ctx);
    }
    let described = Described::from_bytes(data);
    let buf = described.encode();
    let expected = described.expected();
    let parsed = parse_netlink(&buf);
    assert_eq!(
        parsed, expected,
        "parsed differently from the description {described:#?}\nbuffer: {buf:02x?}"
    );
    let packets = parse_nflog_message(&buf);
    assert_eq!(
        packets.as_ref().map(Vec::len).ok(),
        expected.as_ref().ok().map(|items| items
            .iter()
            .filter(|i| matches!(i, NlItem::Packet(_)))
            .count()),
    );
    for record in packets.into_iter().flatten() {
        check_event(&record, &ctx);
    }
}
