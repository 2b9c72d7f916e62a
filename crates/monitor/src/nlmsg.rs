//! The few nfnetlink_log (NFLOG) messages we exchange with the kernel, built and parsed by hand.
//!
//! The protocol is small: a config message (`NFULNL_MSG_CONFIG`) to bind a group and set the
//! copy mode, and packet messages (`NFULNL_MSG_PACKET`) carrying attributes (prefix, payload,
//! interface indexes, timestamp, sequence number). Writing these few dozen lines is leaner than a
//! netlink framework and keeps the parser under our control: it runs on bytes that partly come
//! from the network, so every length is checked and nothing panics (a proptest checks arbitrary
//! input).
//!
//! Layout reminders (`linux/netlink.h`, `linux/netfilter/nfnetlink_log.h`): netlink headers and
//! attribute headers are in host byte order; NFLOG attribute *values* are big-endian.

use std::time::{Duration, SystemTime};

use crate::decode::{decode_packet, family_from_ethertype, family_from_nfproto, PacketInfo};

/// `NFNL_SUBSYS_ULOG << 8`.
const SUBSYS_ULOG: u16 = 4 << 8;
pub(crate) const MSG_PACKET: u16 = SUBSYS_ULOG;
pub(crate) const MSG_CONFIG: u16 = SUBSYS_ULOG | 1;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;

pub(crate) const NLM_F_REQUEST: u16 = 1;
pub(crate) const NLM_F_ACK: u16 = 4;

const NLMSG_HDRLEN: usize = 16;
const NFGENMSG_LEN: usize = 4;
const NLA_HDRLEN: usize = 4;
/// Attribute type bits (the top two are the nested / byte-order flags).
const NLA_TYPE_MASK: u16 = 0x3fff;

// Config attributes.
pub(crate) const NFULA_CFG_CMD: u16 = 1;
pub(crate) const NFULA_CFG_MODE: u16 = 2;
pub(crate) const NFULA_CFG_TIMEOUT: u16 = 4;
pub(crate) const NFULA_CFG_QTHRESH: u16 = 5;
pub(crate) const NFULA_CFG_FLAGS: u16 = 6;
pub(crate) const NFULNL_CFG_CMD_BIND: u8 = 1;
pub(crate) const NFULNL_COPY_PACKET: u8 = 2;
/// Ask for `NFULA_SEQ`: a per-group sequence number, whose gaps count the messages the kernel
/// could not deliver (socket buffer full).
pub(crate) const NFULNL_CFG_F_SEQ: u16 = 1;

// Packet attributes.
const NFULA_PACKET_HDR: u16 = 1;
const NFULA_MARK: u16 = 2;
const NFULA_TIMESTAMP: u16 = 3;
const NFULA_IFINDEX_INDEV: u16 = 4;
const NFULA_IFINDEX_OUTDEV: u16 = 5;
const NFULA_PAYLOAD: u16 = 9;
const NFULA_PREFIX: u16 = 10;
const NFULA_SEQ: u16 = 12;

/// Why a buffer could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("netlink message header truncated at byte {0}")]
    TruncatedHeader(usize),
    #[error("netlink message at byte {offset} claims length {len}, buffer has {available}")]
    BadLength {
        offset: usize,
        len: usize,
        available: usize,
    },
}

/// One logged packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NflogRecord {
    /// `nfgen_family`: 2 (IPv4) or 10 (IPv6) for the inet hooks.
    pub family: u8,
    /// The NFLOG group (`res_id`).
    pub group: u16,
    /// The rule's log prefix, without the C string terminator.
    pub prefix: Option<String>,
    /// Ethertype from `NFULA_PACKET_HDR`.
    pub hw_protocol: Option<u16>,
    /// Netfilter hook number from `NFULA_PACKET_HDR`.
    pub hook: Option<u8>,
    pub mark: Option<u32>,
    pub indev: Option<u32>,
    pub outdev: Option<u32>,
    /// When the packet was received (present for packets that came in through an interface).
    pub timestamp: Option<SystemTime>,
    /// Per-group sequence number (`NFULNL_CFG_F_SEQ`).
    pub seq: Option<u32>,
    /// Decoded headers of the payload, when there was a decodable one.
    pub packet: Option<PacketInfo>,
}

/// One netlink message of a received buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NlItem {
    Packet(NflogRecord),
    /// `NLMSG_ERROR`: `errno` 0 is an acknowledgement, otherwise a negative errno.
    Ack {
        seq: u32,
        errno: i32,
    },
    /// The kernel's receive queue overflowed (rarely sent; usually ENOBUFS on `recv`).
    Overrun,
    /// Anything else (`NLMSG_DONE`, noop, other nfnetlink messages): ignored.
    Other(u16),
}

fn u16_ne(b: &[u8]) -> u16 {
    u16::from_ne_bytes([b[0], b[1]])
}
fn u32_ne(b: &[u8]) -> u32 {
    u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
}
fn be_u16(b: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(0..2)?.try_into().ok()?))
}
fn be_u32(b: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(0..4)?.try_into().ok()?))
}
fn be_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(0..8)?.try_into().ok()?))
}
fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Parses every netlink message in `buf` (one `recv`).
///
/// A malformed message header stops the walk with an error (the framing is lost); malformed
/// attributes inside a message only lose those attributes.
pub fn parse_netlink(buf: &[u8]) -> Result<Vec<NlItem>, ParseError> {
    let mut items = Vec::new();
    let mut offset = 0;
    while offset < buf.len() {
        let Some(hdr) = buf.get(offset..offset + NLMSG_HDRLEN) else {
            return Err(ParseError::TruncatedHeader(offset));
        };
        let len = u32_ne(&hdr[0..4]) as usize;
        let ty = u16_ne(&hdr[4..6]);
        let seq = u32_ne(&hdr[8..12]);
        let available = buf.len() - offset;
        if len < NLMSG_HDRLEN || len > available {
            return Err(ParseError::BadLength {
                offset,
                len,
                available,
            });
        }
        let body = &buf[offset + NLMSG_HDRLEN..offset + len];
        items.push(match ty {
            MSG_PACKET => match parse_packet(body) {
                Some(record) => NlItem::Packet(record),
                None => NlItem::Other(ty),
            },
            NLMSG_ERROR => {
                let errno = body.get(0..4).map(|b| u32_ne(b) as i32).unwrap_or(0);
                NlItem::Ack { seq, errno }
            }
            NLMSG_OVERRUN => NlItem::Overrun,
            NLMSG_DONE => NlItem::Other(ty),
            other => NlItem::Other(other),
        });
        offset += align4(len).max(NLMSG_HDRLEN);
    }
    Ok(items)
}

/// The packet records of one received buffer (other messages are skipped).
pub fn parse_nflog_message(buf: &[u8]) -> Result<Vec<NflogRecord>, ParseError> {
    Ok(parse_netlink(buf)?
        .into_iter()
        .filter_map(|item| match item {
            NlItem::Packet(r) => Some(r),
            _ => None,
        })
        .collect())
}

/// Walks `nlattr`s: yields (type, value) for every well-formed attribute, stopping at the first
/// malformed header.
fn attributes(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let hdr = buf.get(0..NLA_HDRLEN)?;
        let len = usize::from(u16_ne(&hdr[0..2]));
        let ty = u16_ne(&hdr[2..4]) & NLA_TYPE_MASK;
        if len < NLA_HDRLEN || len > buf.len() {
            buf = &[];
            return None;
        }
        let value = &buf[NLA_HDRLEN..len];
        buf = buf.get(align4(len)..).unwrap_or(&[]);
        Some((ty, value))
    })
}

fn parse_packet(body: &[u8]) -> Option<NflogRecord> {
    let gen = body.get(0..NFGENMSG_LEN)?;
    let mut record = NflogRecord {
        family: gen[0],
        group: u16::from_be_bytes([gen[2], gen[3]]),
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
    let mut payload: Option<&[u8]> = None;
    for (ty, value) in attributes(&body[NFGENMSG_LEN..]) {
        match ty {
            NFULA_PACKET_HDR => {
                record.hw_protocol = be_u16(value);
                record.hook = value.get(2).copied();
            }
            NFULA_MARK => record.mark = be_u32(value),
            NFULA_TIMESTAMP => {
                if let (Some(sec), Some(usec)) = (be_u64(value), value.get(8..).and_then(be_u64)) {
                    record.timestamp = SystemTime::UNIX_EPOCH
                        .checked_add(Duration::from_secs(sec))
                        .and_then(|t| t.checked_add(Duration::from_micros(usec.min(999_999))));
                }
            }
            NFULA_IFINDEX_INDEV => record.indev = be_u32(value),
            NFULA_IFINDEX_OUTDEV => record.outdev = be_u32(value),
            NFULA_PAYLOAD => payload = Some(value),
            NFULA_PREFIX => {
                let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
                record.prefix = Some(String::from_utf8_lossy(&value[..end]).into_owned());
            }
            NFULA_SEQ => record.seq = be_u32(value),
            _ => {}
        }
    }
    let hint = family_from_nfproto(record.family)
        .or_else(|| record.hw_protocol.and_then(family_from_ethertype));
    record.packet = payload.and_then(|p| decode_packet(p, hint));
    Some(record)
}

/// Builds one nfnetlink message: netlink header, `nfgenmsg`, then attributes.
pub(crate) struct MessageBuilder {
    buf: Vec<u8>,
}

impl MessageBuilder {
    pub(crate) fn new(ty: u16, flags: u16, seq: u32, family: u8, res_id: u16) -> Self {
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, patched in finish()
        buf.extend_from_slice(&ty.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it in
        buf.push(family);
        buf.push(0); // NFNETLINK_V0
        buf.extend_from_slice(&res_id.to_be_bytes());
        MessageBuilder { buf }
    }

    pub(crate) fn attr(mut self, ty: u16, value: &[u8]) -> Self {
        let len = (NLA_HDRLEN + value.len()) as u16;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.buf.resize(align4(self.buf.len()), 0);
        self
    }

    pub(crate) fn finish(mut self) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf
    }
}

/// Builders of kernel-style packet messages, for tests.
#[cfg(test)]
pub(crate) mod build {
    use super::*;

    #[derive(Default)]
    pub struct PacketMsg<'a> {
        pub family: u8,
        pub group: u16,
        pub prefix: Option<&'a str>,
        pub payload: Option<&'a [u8]>,
        pub seq: Option<u32>,
        pub indev: Option<u32>,
        pub timestamp: Option<(u64, u64)>,
    }

    pub fn packet(m: &PacketMsg) -> Vec<u8> {
        let mut b = MessageBuilder::new(MSG_PACKET, 0, 0, m.family, m.group);
        let hw: u16 = if m.family == 10 { 0x86dd } else { 0x0800 };
        let mut hdr = hw.to_be_bytes().to_vec();
        hdr.extend_from_slice(&[1, 0]);
        b = b.attr(NFULA_PACKET_HDR, &hdr);
        if let Some(i) = m.indev {
            b = b.attr(NFULA_IFINDEX_INDEV, &i.to_be_bytes());
        }
        if let Some((s, us)) = m.timestamp {
            let mut ts = s.to_be_bytes().to_vec();
            ts.extend_from_slice(&us.to_be_bytes());
            b = b.attr(NFULA_TIMESTAMP, &ts);
        }
        if let Some(p) = m.prefix {
            let mut v = p.as_bytes().to_vec();
            v.push(0);
            b = b.attr(NFULA_PREFIX, &v);
        }
        if let Some(s) = m.seq {
            b = b.attr(NFULA_SEQ, &s.to_be_bytes());
        }
        if let Some(p) = m.payload {
            b = b.attr(NFULA_PAYLOAD, p);
        }
        b.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;
    use crate::decode::build as pkt;
    use crate::decode::L4Protocol;
    use proptest::prelude::*;
    use std::net::{IpAddr, Ipv4Addr};

    fn sample() -> Vec<u8> {
        let payload = pkt::ipv4(
            [10, 0, 0, 1].into(),
            [10, 0, 0, 2].into(),
            6,
            &pkt::tcp(1234, 9),
        );
        packet(&PacketMsg {
            family: 2,
            group: 100,
            prefix: Some("nw:wd:0000abcd "),
            payload: Some(&payload),
            seq: Some(7),
            indev: Some(3),
            timestamp: Some((1_700_000_000, 250_000)),
        })
    }

    #[test]
    fn parses_a_packet_message() {
        let recs = parse_nflog_message(&sample()).unwrap();
        assert_eq!(recs.len(), 1);
        let r = &recs[0];
        assert_eq!((r.family, r.group), (2, 100));
        assert_eq!(r.prefix.as_deref(), Some("nw:wd:0000abcd "));
        assert_eq!(
            (r.seq, r.indev, r.outdev, r.hw_protocol),
            (Some(7), Some(3), None, Some(0x0800))
        );
        assert_eq!(
            r.timestamp,
            Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250))
        );
        let p = r.packet.unwrap();
        assert_eq!(p.src, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(
            (p.protocol, p.sport, p.dport),
            (L4Protocol::Tcp, Some(1234), Some(9))
        );
    }

    #[test]
    fn several_messages_and_acks_in_one_buffer() {
        let mut buf = sample();
        buf.extend_from_slice(&sample());
        // An NLMSG_ERROR carrying -EBUSY for request 5.
        let mut err = Vec::new();
        err.extend_from_slice(&36u32.to_ne_bytes());
        err.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        err.extend_from_slice(&0u16.to_ne_bytes());
        err.extend_from_slice(&5u32.to_ne_bytes());
        err.extend_from_slice(&0u32.to_ne_bytes());
        err.extend_from_slice(&(-16i32).to_ne_bytes());
        err.extend_from_slice(&[0; 16]); // the echoed request header
        buf.extend_from_slice(&err);
        let items = parse_netlink(&buf).unwrap();
        assert_eq!(items.len(), 3);
        assert!(matches!(items[0], NlItem::Packet(_)));
        assert_eq!(items[2], NlItem::Ack { seq: 5, errno: -16 });
        assert_eq!(parse_nflog_message(&buf).unwrap().len(), 2);
    }

    #[test]
    fn malformed_framing_is_an_error() {
        let buf = sample();
        assert_eq!(
            parse_netlink(&buf[..10]),
            Err(ParseError::TruncatedHeader(0))
        );
        assert!(matches!(
            parse_netlink(&buf[..buf.len() - 1]),
            Err(ParseError::BadLength { .. })
        ));
        let mut zero = buf.clone();
        zero[0..4].copy_from_slice(&0u32.to_ne_bytes());
        assert!(matches!(
            parse_netlink(&zero),
            Err(ParseError::BadLength { .. })
        ));
        assert_eq!(parse_netlink(&[]), Ok(vec![]));
    }

    #[test]
    fn malformed_attributes_lose_only_themselves() {
        let mut buf = sample();
        // Corrupt the first attribute's length to exceed the message: the walk stops there.
        buf[NLMSG_HDRLEN + NFGENMSG_LEN..NLMSG_HDRLEN + NFGENMSG_LEN + 2]
            .copy_from_slice(&0xffffu16.to_ne_bytes());
        let recs = parse_nflog_message(&buf).unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].prefix, None);
        assert_eq!(recs[0].packet, None);
    }

    #[test]
    fn builder_frames_config() {
        let msg = MessageBuilder::new(MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK, 9, 0, 100)
            .attr(NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND])
            .finish();
        assert_eq!(msg.len(), 16 + 4 + 8);
        assert_eq!(u32_ne(&msg[0..4]) as usize, msg.len());
        assert_eq!(&msg[18..20], &[0u8, 100]); // res_id is big-endian
    }

    proptest! {
        #[test]
        fn arbitrary_buffers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = parse_netlink(&bytes);
        }

        #[test]
        fn mutated_messages_never_panic(pos in 0usize..200, val in any::<u8>(), cut in 0usize..200) {
            let mut buf = sample();
            let n = buf.len();
            buf[pos % n] = val;
            buf.truncate(n - cut.min(n));
            let _ = parse_netlink(&buf);
        }
    }
}
