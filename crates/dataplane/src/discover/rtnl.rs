//! The rtnetlink messages of discovery: the two dump requests (links, addresses), and the
//! parsing of their replies into link and address records. No I/O here, so any byte sequence
//! can be fed in a test without root — and any input yields records or an error, never a panic.
//!
//! Only what discovery needs is read: the fixed headers (`ifinfomsg`, `ifaddrmsg`, through
//! netlink-packet-route's header parsers) and three attributes, found by walking the attribute
//! list: `IFLA_IFNAME`, `IFA_LOCAL`, `IFA_ADDRESS`. Parsing whole messages into the crate's typed
//! model would make discovery fail on anything that model cannot hold (an interface *alias*
//! that is not UTF-8, an attribute a newer kernel encodes differently), and it would turn a
//! *name* that is not UTF-8 into an anonymous parse error instead of
//! [`super::DiscoverError::UnsupportedName`] for that interface.
//!
//! A dump reply is a series of datagrams, each holding one or more netlink messages flagged
//! `NLM_F_MULTI`, and ends with `NLMSG_DONE` (or `NLMSG_ERROR`). When the table changed while it
//! was being dumped the kernel flags messages `NLM_F_DUMP_INTR`: the records may be incomplete,
//! so the caller dumps again.

use std::net::IpAddr;

use netlink_packet_core::{
    DoneBuffer, ErrorBuffer, NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    NlaBuffer, NlasIterator, NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP, NLMSG_OVERRUN, NLM_F_DUMP,
    NLM_F_DUMP_INTR, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressHeader, AddressMessage};
use netlink_packet_route::link::{
    LinkAttribute, LinkExtentMask, LinkFlags, LinkHeader, LinkMessage,
};
use netlink_packet_route::RouteNetlinkMessage;

/// `sizeof(struct ifinfomsg)`: where a link message's attributes start.
const LINK_HEADER_LEN: usize = 16;
/// `sizeof(struct ifaddrmsg)`: where an address message's attributes start.
const ADDRESS_HEADER_LEN: usize = 8;
/// Records one dump may hold (links or addresses): memory stays bounded whatever the kernel
/// (or a corrupted reply) sends. A pod netns has a handful.
pub const MAX_RECORDS: usize = 1 << 16;

/// Which table a dump reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dump {
    /// `RTM_GETLINK`: every interface.
    Links,
    /// `RTM_GETADDR`, family `AF_UNSPEC`: every address of every family.
    Addresses,
}

impl std::fmt::Display for Dump {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Dump::Links => "link dump",
            Dump::Addresses => "address dump",
        })
    }
}

/// The request for `dump`, numbered `seq` (replies carry it back).
pub fn request(dump: Dump, seq: u32) -> Vec<u8> {
    let payload = match dump {
        Dump::Links => {
            let mut message = LinkMessage::default();
            // Counters are not needed and make up most of each link message.
            message
                .attributes
                .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
            RouteNetlinkMessage::GetLink(message)
        }
        Dump::Addresses => RouteNetlinkMessage::GetAddress(AddressMessage::default()),
    };
    let mut message = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::from(payload));
    message.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    message.header.sequence_number = seq;
    message.finalize();
    let mut bytes = vec![0; message.buffer_len()];
    message.serialize(&mut bytes);
    bytes
}

/// An interface as the link dump describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkRecord {
    pub index: u32,
    /// The name as the kernel holds it: bytes, not necessarily UTF-8.
    pub name: Vec<u8>,
    /// `IFF_UP`.
    pub up: bool,
}

/// An IPv4 or IPv6 address as the address dump describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressRecord {
    /// The interface it is on.
    pub index: u32,
    /// `IFA_LOCAL`, or `IFA_ADDRESS` when there is no `IFA_LOCAL` (as `ip addr` shows it: on a
    /// point-to-point address `IFA_ADDRESS` is the peer; IPv6 sends only `IFA_ADDRESS`).
    pub addr: IpAddr,
    pub prefix_len: u8,
}

/// Why a reply was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyError {
    /// The kernel answered with an error (`errno`, positive).
    Kernel(i32),
    /// The reply does not read as an answer to the request; says why.
    Malformed(String),
    /// More than [`MAX_RECORDS`] records.
    TooManyRecords,
}

/// What a dump has received so far.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DumpReply {
    pub links: Vec<LinkRecord>,
    pub addresses: Vec<AddressRecord>,
    /// `NLMSG_DONE` was seen: the dump is complete.
    pub done: bool,
    /// The kernel flagged the dump inconsistent (`NLM_F_DUMP_INTR`): dump again.
    pub interrupted: bool,
}

impl DumpReply {
    /// Adds the messages of one received datagram, which must answer request `seq` of kind
    /// `dump`. Anything after `NLMSG_DONE` is ignored.
    pub fn add_datagram(
        &mut self,
        dump: Dump,
        seq: u32,
        datagram: &[u8],
    ) -> Result<(), ReplyError> {
        let malformed = ReplyError::Malformed;
        let mut offset = 0;
        while offset < datagram.len() && !self.done {
            let message = NetlinkBuffer::new_checked(&datagram[offset..])
                .map_err(|e| malformed(format!("bad netlink header at byte {offset}: {e}")))?;
            if message.sequence_number() != seq {
                return Err(malformed(format!(
                    "message for request {} in the reply to request {seq}",
                    message.sequence_number()
                )));
            }
            if message.flags() & NLM_F_DUMP_INTR != 0 {
                self.interrupted = true;
            }
            let payload = message.payload();
            match (message.message_type(), dump) {
                (NLMSG_NOOP, _) => {}
                (NLMSG_DONE, _) => {
                    // A dump that failed half-way ends with NLMSG_DONE carrying -errno.
                    let code = DoneBuffer::new_checked(payload)
                        .map(|done| done.code())
                        .unwrap_or(0);
                    if code < 0 {
                        return Err(ReplyError::Kernel(code.saturating_neg()));
                    }
                    self.done = true;
                }
                (NLMSG_ERROR, _) => {
                    let error = ErrorBuffer::new_checked(payload)
                        .map_err(|e| malformed(format!("bad NLMSG_ERROR: {e}")))?;
                    return Err(match error.code() {
                        Some(code) => ReplyError::Kernel(code.get().saturating_abs()),
                        None => malformed("an acknowledgement instead of a dump".into()),
                    });
                }
                (NLMSG_OVERRUN, _) => return Err(malformed("NLMSG_OVERRUN".into())),
                (libc::RTM_NEWLINK, Dump::Links) => {
                    if self.links.len() >= MAX_RECORDS {
                        return Err(ReplyError::TooManyRecords);
                    }
                    self.links.push(parse_link(payload).map_err(malformed)?);
                }
                (libc::RTM_NEWADDR, Dump::Addresses) => {
                    if self.addresses.len() >= MAX_RECORDS {
                        return Err(ReplyError::TooManyRecords);
                    }
                    if let Some(address) = parse_address(payload).map_err(malformed)? {
                        self.addresses.push(address);
                    }
                }
                (other, _) => {
                    return Err(malformed(format!(
                        "unexpected message type {other} in a {dump}"
                    )))
                }
            }
            // `new_checked` guarantees 16 <= length <= what is left; messages are 4-aligned.
            offset += (message.length() as usize + 3) & !3;
        }
        Ok(())
    }
}

/// The value of an attribute, borrowed from the datagram (not from the `NlaBuffer`).
fn value_of(attribute: NlaBuffer<&[u8]>) -> &[u8] {
    let length = usize::from(attribute.length());
    // `NlasIterator` only yields attributes whose 4 <= length <= the bytes left.
    attribute.into_inner().get(4..length).unwrap_or_default()
}

/// One `RTM_NEWLINK` payload.
fn parse_link(payload: &[u8]) -> Result<LinkRecord, String> {
    let header = LinkHeader::parse(payload).map_err(|e| format!("bad link header: {e}"))?;
    let mut name = None;
    for attribute in NlasIterator::new(payload.get(LINK_HEADER_LEN..).unwrap_or_default()) {
        let attribute =
            attribute.map_err(|e| format!("bad attribute of link {}: {e}", header.index))?;
        if attribute.kind() == libc::IFLA_IFNAME {
            // A C string: what precedes the first NUL.
            let value = value_of(attribute);
            let len = value.iter().position(|b| *b == 0).unwrap_or(value.len());
            name = Some(value[..len].to_vec());
        }
    }
    let name = name
        .filter(|name| !name.is_empty())
        .ok_or_else(|| format!("link {} has no name", header.index))?;
    Ok(LinkRecord {
        index: header.index,
        name,
        up: header.flags.contains(LinkFlags::Up),
    })
}

/// One `RTM_NEWADDR` payload: `None` for a family other than IPv4 and IPv6, or an entry without
/// an address.
fn parse_address(payload: &[u8]) -> Result<Option<AddressRecord>, String> {
    let header = AddressHeader::parse(payload).map_err(|e| format!("bad address header: {e}"))?;
    let family = i32::from(u8::from(header.family));
    if family != libc::AF_INET && family != libc::AF_INET6 {
        return Ok(None);
    }
    let (mut local, mut address) = (None, None);
    for attribute in NlasIterator::new(payload.get(ADDRESS_HEADER_LEN..).unwrap_or_default()) {
        let attribute = attribute
            .map_err(|e| format!("bad attribute of an address of link {}: {e}", header.index))?;
        match attribute.kind() {
            libc::IFA_LOCAL => local = Some(value_of(attribute)),
            libc::IFA_ADDRESS => address = Some(value_of(attribute)),
            _ => {}
        }
    }
    let Some(bytes) = local.or(address) else {
        return Ok(None);
    };
    let addr = if family == libc::AF_INET {
        <[u8; 4]>::try_from(bytes).map(IpAddr::from)
    } else {
        <[u8; 16]>::try_from(bytes).map(IpAddr::from)
    }
    .map_err(|_| {
        format!(
            "an address of link {} has {} bytes, not an {} address",
            header.index,
            bytes.len(),
            if family == libc::AF_INET {
                "IPv4"
            } else {
                "IPv6"
            }
        )
    })?;
    Ok(Some(AddressRecord {
        index: header.index,
        addr,
        prefix_len: header.prefix_len,
    }))
}
