//! The few nfnetlink_log (NFLOG) messages we exchange with the kernel, framed with
//! `netlink-packet-core`.
//!
//! The protocol is small: a config message (`NFULNL_MSG_CONFIG`) to bind a group and set the
//! copy mode, and packet messages (`NFULNL_MSG_PACKET`) carrying attributes (prefix, payload,
//! interface indexes, timestamp, sequence number). The netlink framing (message headers, the
//! `nlmsgerr` code, attribute headers and alignment) is the crate the dataplane already uses for
//! rtnetlink, so the tree has one netlink parser; what NFLOG's attributes mean is here
//! ([`PacketAttr`]), since the crate has no NFLOG types. The parser runs on bytes that partly come
//! from the network: every length is checked (by `new_checked` before any field is read) and
//! nothing panics (proptests here and the fuzzing invariants check arbitrary input).
//!
//! Layout reminders (`linux/netlink.h`, `linux/netfilter/nfnetlink_log.h`): netlink headers and
//! attribute headers are in host byte order; NFLOG attribute *values* are big-endian.

use std::num::NonZeroI32;
use std::time::{Duration, SystemTime};

use netlink_packet_core::{
    parse_u16_be, parse_u32_be, parse_u64_be, DecodeError, DefaultNla, Emitable, ErrorBuffer,
    NetlinkBuffer, NetlinkHeader, NlaBuffer, NlasIterator, NLA_HEADER_SIZE, NLMSG_DONE,
    NLMSG_ERROR, NLMSG_OVERRUN,
};
pub(crate) use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST};

use crate::decode::{decode_packet, family_from_ethertype, family_from_nfproto, PacketInfo};

/// `NFNL_SUBSYS_ULOG << 8`.
const SUBSYS_ULOG: u16 = 4 << 8;
pub(crate) const MSG_PACKET: u16 = SUBSYS_ULOG;
pub(crate) const MSG_CONFIG: u16 = SUBSYS_ULOG | 1;

/// `sizeof(struct nlmsghdr)`: where a message's body starts (the crate keeps its own private).
const NLMSG_HDRLEN: usize = 16;
/// `sizeof(struct nfgenmsg)`: family, version, resource id (the group, big-endian).
const NFGENMSG_LEN: usize = 4;
/// `NFNETLINK_V0`.
const NFNETLINK_V0: u8 = 0;

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

/// The big-endian number at the start of an attribute value. A longer value is read by its
/// prefix and a shorter one gives `None`, as the kernel only ever sends the exact size.
fn be<T>(value: &[u8], parse: fn(&[u8]) -> Result<T, DecodeError>) -> Option<T> {
    value.get(..size_of::<T>()).and_then(|b| parse(b).ok())
}

/// Parses every netlink message in `buf` (one `recv`).
///
/// A malformed message header stops the walk with an error (the framing is lost); malformed
/// attributes inside a message only lose those attributes.
pub fn parse_netlink(buf: &[u8]) -> Result<Vec<NlItem>, ParseError> {
    let mut items = Vec::new();
    let mut offset = 0;
    while offset < buf.len() {
        let rest = &buf[offset..];
        let msg = NetlinkBuffer::new_checked(rest).map_err(|_| {
            // The crate's error is text; say which of the two framing faults it was.
            if rest.len() < NLMSG_HDRLEN {
                ParseError::TruncatedHeader(offset)
            } else {
                ParseError::BadLength {
                    offset,
                    len: NetlinkBuffer::new(rest).length() as usize,
                    available: rest.len(),
                }
            }
        })?;
        let body = msg.payload();
        items.push(match msg.message_type() {
            MSG_PACKET => match parse_packet(body) {
                Some(record) => NlItem::Packet(record),
                None => NlItem::Other(MSG_PACKET),
            },
            // A body too short for the code reads as an acknowledgement, as before the crate.
            NLMSG_ERROR => NlItem::Ack {
                seq: msg.sequence_number(),
                errno: ErrorBuffer::new_checked(body)
                    .ok()
                    .and_then(|e| e.code())
                    .map_or(0, NonZeroI32::get),
            },
            NLMSG_OVERRUN => NlItem::Overrun,
            NLMSG_DONE => NlItem::Other(NLMSG_DONE),
            other => NlItem::Other(other),
        });
        // Messages are 4-byte aligned; an aligned length past the end ends the walk.
        offset += (msg.length() as usize).next_multiple_of(4);
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

/// An attribute of an `NFULNL_MSG_PACKET` (`enum nfulnl_attr_type`), by what it means to us.
/// A value too short for its type gives `None` for that field alone (a short timestamp is
/// skipped instead, leaving an earlier one in place).
#[derive(Debug, Clone, PartialEq, Eq)]
enum PacketAttr<'a> {
    /// `struct nfulnl_msg_packet_hdr`: ethertype (big-endian), hook, padding.
    PacketHdr {
        hw_protocol: Option<u16>,
        hook: Option<u8>,
    },
    Mark(Option<u32>),
    /// `struct nfulnl_msg_packet_timestamp`: seconds and microseconds, each a big-endian u64
    /// (`None` when SystemTime cannot hold it).
    Timestamp(Option<SystemTime>),
    InDev(Option<u32>),
    OutDev(Option<u32>),
    /// The packet from its network header on.
    Payload(&'a [u8]),
    /// The rule's prefix, a C string.
    Prefix(String),
    Seq(Option<u32>),
    /// One we do not read (hardware address, uid, gid, conntrack, ...).
    Other,
}

impl<'a> PacketAttr<'a> {
    fn parse(nla: NlaBuffer<&'a [u8]>) -> PacketAttr<'a> {
        let kind = nla.kind();
        // `NlaBuffer::value` borrows the buffer wrapper; the payload must outlive it.
        let len = usize::from(nla.length());
        let value = &nla.into_inner()[NLA_HEADER_SIZE..len];
        match kind {
            NFULA_PACKET_HDR => PacketAttr::PacketHdr {
                hw_protocol: be(value, parse_u16_be),
                hook: value.get(2).copied(),
            },
            NFULA_MARK => PacketAttr::Mark(be(value, parse_u32_be)),
            NFULA_TIMESTAMP => match (
                be(value, parse_u64_be),
                value.get(8..).and_then(|v| be(v, parse_u64_be)),
            ) {
                // An instant past what SystemTime holds clears an earlier timestamp...
                (Some(sec), Some(usec)) => PacketAttr::Timestamp(
                    SystemTime::UNIX_EPOCH
                        .checked_add(Duration::from_secs(sec))
                        .and_then(|t| t.checked_add(Duration::from_micros(usec.min(999_999)))),
                ),
                // ...while one too short to hold seconds and microseconds is skipped.
                _ => PacketAttr::Other,
            },
            NFULA_IFINDEX_INDEV => PacketAttr::InDev(be(value, parse_u32_be)),
            NFULA_IFINDEX_OUTDEV => PacketAttr::OutDev(be(value, parse_u32_be)),
            NFULA_PAYLOAD => PacketAttr::Payload(value),
            NFULA_PREFIX => {
                // Up to the first NUL (the crate's `parse_string` only drops a last one, and
                // refuses what is not UTF-8: a prefix is kept, lossily, to say whose it is not).
                let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
                PacketAttr::Prefix(String::from_utf8_lossy(&value[..end]).into_owned())
            }
            NFULA_SEQ => PacketAttr::Seq(be(value, parse_u32_be)),
            _ => PacketAttr::Other,
        }
    }
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
    // The crate's iterator stops after the first malformed attribute header (yielding its
    // error), which loses that attribute and the ones after it, not the message.
    for nla in NlasIterator::new(&body[NFGENMSG_LEN..]).map_while(Result::ok) {
        match PacketAttr::parse(nla) {
            PacketAttr::PacketHdr { hw_protocol, hook } => {
                record.hw_protocol = hw_protocol;
                record.hook = hook;
            }
            PacketAttr::Mark(v) => record.mark = v,
            PacketAttr::Timestamp(v) => record.timestamp = v,
            PacketAttr::InDev(v) => record.indev = v,
            PacketAttr::OutDev(v) => record.outdev = v,
            PacketAttr::Payload(p) => payload = Some(p),
            PacketAttr::Prefix(p) => record.prefix = Some(p),
            PacketAttr::Seq(v) => record.seq = v,
            PacketAttr::Other => {}
        }
    }
    let hint = family_from_nfproto(record.family)
        .or_else(|| record.hw_protocol.and_then(family_from_ethertype));
    record.packet = payload.and_then(|p| decode_packet(p, hint));
    Some(record)
}

/// Builds one nfnetlink message: netlink header, `nfgenmsg`, then attributes (each emitted by
/// the crate, padding included).
pub(crate) struct MessageBuilder {
    header: NetlinkHeader,
    body: Vec<u8>,
}

impl MessageBuilder {
    pub(crate) fn new(ty: u16, flags: u16, seq: u32, family: u8, res_id: u16) -> Self {
        let mut header = NetlinkHeader::default();
        header.message_type = ty;
        header.flags = flags;
        header.sequence_number = seq;
        // The port id stays 0: the kernel fills it in.
        let mut body = Vec::with_capacity(48);
        body.extend_from_slice(&[family, NFNETLINK_V0]);
        body.extend_from_slice(&res_id.to_be_bytes());
        MessageBuilder { header, body }
    }

    pub(crate) fn attr(mut self, ty: u16, value: &[u8]) -> Self {
        let nla = DefaultNla::new(ty, value.to_vec());
        let start = self.body.len();
        self.body.resize(start + nla.buffer_len(), 0);
        nla.emit(&mut self.body[start..]);
        self
    }

    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.header.length = (self.header.buffer_len() + self.body.len()) as u32;
        let mut buf = vec![0; self.header.buffer_len()];
        self.header.emit(&mut buf);
        buf.extend_from_slice(&self.body);
        buf
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
        assert_eq!(NetlinkBuffer::new(&msg[..]).length() as usize, msg.len());
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
