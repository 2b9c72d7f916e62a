//! Discovering a pod's interfaces from inside its network namespace.
//!
//! SPEC section 2 (seed 004): a pod interface is any kernel interface in the pod's netns that has
//! an L3 address, except `lo`. The kernel is asked directly over rtnetlink, from a thread inside
//! the netns ([`Netns::run`]): one dump of the links (index, name, `IFF_UP`), one of the
//! addresses of every family; the `rtnl` submodule builds the requests and reads the replies.
//! (This replaced running `ip -j addr show` per pod: a process per pod and round, and JSON,
//! which cannot carry an interface name that is not UTF-8 — one such name, even on an
//! interface without an address, made the whole netns unreadable.)
//!
//! IPv6 link-local addresses (`fe80::/10`) exist on every IPv6-enabled interface, so they do not
//! make an interface a pod interface, and they never identify a pod to policy. They are kept apart
//! in [`DiscoveredInterface::link_local`]: an interface whose only addresses are link-local is not
//! returned at all, and `addrs` holds only the addresses that count. Interfaces come in kernel
//! (link dump) order, their addresses in address dump order — what `ip addr show` prints.
//!
//! Names are bytes to the kernel. A pod interface whose name is not UTF-8 is an error
//! ([`DiscoverError::UnsupportedName`]), never dropped or mangled: the caller must refuse the pod
//! loudly rather than program it without that interface. Unusual but valid names (`a"b;+`) are
//! returned as they are; making them safe in rule text is the renderer's job. An interface that
//! is not a pod interface (no address that counts) cannot fail discovery by its name.
//!
//! The two dumps are two snapshots. When the kernel flags a dump as interrupted by a change
//! (`NLM_F_DUMP_INTR`), or an address names a link the link dump did not show (it appeared in
//! between), discovery starts over — at most [`MAX_ATTEMPTS`] times — instead of returning a
//! partial picture.

mod rtnl;

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use ipnet::IpNet;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket};

use crate::netns::{Netns, NetnsError};
pub use rtnl::Dump;
use rtnl::{AddressRecord, DumpReply, LinkRecord, ReplyError, MAX_RECORDS};

/// Discovery starts over at most this many times when the interfaces change while it reads them.
pub const MAX_ATTEMPTS: usize = 5;
/// The longest wait for one reply datagram. The kernel answers a dump at once; this only keeps
/// a broken socket from stalling the agent forever.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// Receive buffer: larger than the datagrams the kernel builds for a dump (up to 32 KiB), so
/// one `recv` takes one whole datagram. A larger one (a link with huge attributes) makes the
/// attempt start over with a buffer of its size, up to [`MAX_DATAGRAM`].
const INITIAL_DATAGRAM: usize = 64 << 10;
const MAX_DATAGRAM: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredInterface {
    pub name: String,
    pub index: u32,
    /// The addresses that count for policy (IPv4 of any scope, IPv6 except link-local), with
    /// their prefix lengths, in kernel order.
    pub addrs: Vec<IpNet>,
    /// IPv6 link-local addresses, kept for information only (see the module doc).
    pub link_local: Vec<IpNet>,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
}

impl DiscoveredInterface {
    pub fn ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.addrs.iter().map(IpNet::addr)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("rtnetlink socket ({step}): {source}")]
    Socket {
        step: &'static str,
        source: io::Error,
    },
    #[error("the kernel refused the {dump}: {source}")]
    Kernel { dump: Dump, source: io::Error },
    #[error("no reply to the {dump} within {timeout:?}")]
    NoReply { dump: Dump, timeout: Duration },
    #[error("unreadable reply to the {dump}: {reason}")]
    Malformed { dump: Dump, reason: String },
    #[error("the {dump} holds more than {max} records")]
    TooManyRecords { dump: Dump, max: usize },
    #[error("a reply datagram of {size} bytes to the {dump} is larger than {max}")]
    DatagramTooLarge { dump: Dump, size: usize, max: usize },
    #[error(
        "interface {index} has a name that is not UTF-8 (\"{}\"): it cannot be named in policy",
        bytes.escape_ascii()
    )]
    UnsupportedName { index: u32, bytes: Vec<u8> },
    #[error("interface {index}: bad address {addr}/{prefix_len}")]
    BadAddress {
        index: u32,
        addr: IpAddr,
        prefix_len: u8,
    },
    #[error("the interfaces kept changing during {attempts} attempts to list them")]
    Unstable { attempts: usize },
}

/// The interfaces with an L3 address in the netns at `path`, except `lo` (see the module doc).
/// The path goes through the checks of [`Netns::open`].
pub fn interfaces(path: &Path) -> Result<Vec<DiscoveredInterface>, DiscoverError> {
    interfaces_of(&Netns::open(path)?)
}

/// [`interfaces`] of a netns already opened (and checked).
pub fn interfaces_of(netns: &Netns) -> Result<Vec<DiscoveredInterface>, DiscoverError> {
    netns.run(interfaces_here)?
}

/// [`interfaces`] of the calling thread's netns: only ever run on a thread of [`Netns::run`]
/// (a netlink socket belongs to the netns of the thread that creates it).
fn interfaces_here() -> Result<Vec<DiscoveredInterface>, DiscoverError> {
    let mut buffer = vec![0; INITIAL_DATAGRAM];
    for _ in 0..MAX_ATTEMPTS {
        // A fresh socket per attempt: an abandoned dump may still have datagrams in flight.
        let socket = RouteSocket::open()?;
        let Some(links) = socket.dump(Dump::Links, 1, &mut buffer)? else {
            continue;
        };
        let Some(addresses) = socket.dump(Dump::Addresses, 2, &mut buffer)? else {
            continue;
        };
        if let Some(found) = assemble(&links.links, &addresses.addresses)? {
            return Ok(found);
        }
    }
    Err(DiscoverError::Unstable {
        attempts: MAX_ATTEMPTS,
    })
}

/// The pod interfaces, from the two dumps; `None` when an address names a link the link dump
/// did not show (it appeared in between: start over).
fn assemble(
    links: &[LinkRecord],
    addresses: &[AddressRecord],
) -> Result<Option<Vec<DiscoveredInterface>>, DiscoverError> {
    // index -> (addresses that count, link-local addresses)
    let mut by_index: HashMap<u32, (Vec<IpNet>, Vec<IpNet>)> = links
        .iter()
        .map(|link| (link.index, Default::default()))
        .collect();
    for address in addresses {
        let Some((addrs, link_local)) = by_index.get_mut(&address.index) else {
            return Ok(None);
        };
        let net = IpNet::new(address.addr, address.prefix_len).map_err(|_| {
            DiscoverError::BadAddress {
                index: address.index,
                addr: address.addr,
                prefix_len: address.prefix_len,
            }
        })?;
        match address.addr {
            IpAddr::V6(v6) if v6.is_unicast_link_local() => link_local.push(net),
            _ => addrs.push(net),
        }
    }
    let mut found = Vec::new();
    for link in links {
        if link.name == b"lo" {
            continue;
        }
        let (addrs, link_local) = by_index.remove(&link.index).unwrap_or_default();
        if addrs.is_empty() {
            continue;
        }
        let name =
            String::from_utf8(link.name.clone()).map_err(|e| DiscoverError::UnsupportedName {
                index: link.index,
                bytes: e.into_bytes(),
            })?;
        found.push(DiscoveredInterface {
            name,
            index: link.index,
            addrs,
            link_local,
            up: link.up,
        });
    }
    Ok(Some(found))
}

/// A `NETLINK_ROUTE` socket in the calling thread's netns.
struct RouteSocket(Socket);

impl RouteSocket {
    fn open() -> Result<RouteSocket, DiscoverError> {
        crate::nfnetlink::kernel_socket(NETLINK_ROUTE, REPLY_TIMEOUT)
            .map(RouteSocket)
            .map_err(|(step, source)| DiscoverError::Socket { step, source })
    }

    /// Sends the request for `dump` and reads the reply to its end. `None`: start over (the
    /// kernel flagged the dump interrupted, or a datagram did not fit `buffer`, which has
    /// been grown to fit it).
    fn dump(
        &self,
        dump: Dump,
        seq: u32,
        buffer: &mut Vec<u8>,
    ) -> Result<Option<DumpReply>, DiscoverError> {
        self.0
            .send(&rtnl::request(dump, seq), 0)
            .map_err(|source| DiscoverError::Socket {
                step: "send",
                source,
            })?;
        let mut reply = DumpReply::default();
        while !reply.done {
            // MSG_TRUNC: the size of the datagram is returned even when it did not fit.
            let size = match self.0.recv(&mut &mut buffer[..], libc::MSG_TRUNC) {
                Ok(size) => size,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(DiscoverError::NoReply {
                        dump,
                        timeout: REPLY_TIMEOUT,
                    })
                }
                Err(source) => {
                    return Err(DiscoverError::Socket {
                        step: "receive",
                        source,
                    })
                }
            };
            if size > buffer.len() {
                if size > MAX_DATAGRAM {
                    return Err(DiscoverError::DatagramTooLarge {
                        dump,
                        size,
                        max: MAX_DATAGRAM,
                    });
                }
                buffer.resize(size, 0);
                return Ok(None);
            }
            reply
                .add_datagram(dump, seq, &buffer[..size])
                .map_err(|e| match e {
                    ReplyError::Kernel(errno) => DiscoverError::Kernel {
                        dump,
                        source: io::Error::from_raw_os_error(errno),
                    },
                    ReplyError::Malformed(reason) => DiscoverError::Malformed { dump, reason },
                    ReplyError::TooManyRecords => DiscoverError::TooManyRecords {
                        dump,
                        max: MAX_RECORDS,
                    },
                })?;
        }
        Ok((!reply.interrupted).then_some(reply))
    }
}

#[cfg(test)]
mod tests {
    //! Replies are built with netlink-packet-route's emitters (what the kernel would send) and
    //! fed to the parser: every rule of discovery is checked here without a netns.

    use std::num::NonZeroI32;

    use netlink_packet_core::{
        DefaultNla, DoneMessage, ErrorMessage, NetlinkHeader, NetlinkMessage, NetlinkPayload,
        NLM_F_DUMP_INTR, NLM_F_MULTIPART,
    };
    use netlink_packet_route::address::{AddressAttribute, AddressMessage};
    use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
    use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
    use proptest::prelude::*;

    use super::*;

    const SEQ: u32 = 7;

    fn emit(flags: u16, payload: NetlinkPayload<RouteNetlinkMessage>) -> Vec<u8> {
        let mut message = NetlinkMessage::new(NetlinkHeader::default(), payload);
        message.header.flags = flags;
        message.header.sequence_number = SEQ;
        message.finalize();
        let mut bytes = vec![0; message.buffer_len()];
        message.serialize(&mut bytes);
        bytes
    }

    /// An `RTM_NEWLINK` as a dump sends it; the name goes in raw (NUL-terminated, like the
    /// kernel's), so it need not be UTF-8.
    fn link(index: u32, name: &[u8], up: bool) -> Vec<u8> {
        let mut message = LinkMessage::default();
        message.header.index = index;
        if up {
            message.header.flags = LinkFlags::Up | LinkFlags::Running;
        }
        let mut raw_name = name.to_vec();
        raw_name.push(0);
        message.attributes = vec![
            LinkAttribute::Mtu(1500),
            LinkAttribute::Other(DefaultNla::new(libc::IFLA_IFNAME, raw_name)),
            LinkAttribute::IfAlias("whatever".into()),
        ];
        emit(
            NLM_F_MULTIPART,
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(message)),
        )
    }

    fn address(index: u32, net: &str, peer: Option<&str>) -> Vec<u8> {
        let net: IpNet = net.parse().unwrap();
        let mut message = AddressMessage::default();
        message.header.index = index;
        message.header.prefix_len = net.prefix_len();
        message.header.family = match net {
            IpNet::V4(_) => AddressFamily::Inet,
            IpNet::V6(_) => AddressFamily::Inet6,
        };
        message.attributes = match peer {
            // What the kernel sends for `ip addr add LOCAL peer PEER`.
            Some(peer) => vec![
                AddressAttribute::Address(peer.parse().unwrap()),
                AddressAttribute::Local(net.addr()),
            ],
            None if net.addr().is_ipv4() => vec![
                AddressAttribute::Address(net.addr()),
                AddressAttribute::Local(net.addr()),
                AddressAttribute::Label("x".into()),
            ],
            None => vec![AddressAttribute::Address(net.addr())],
        };
        emit(
            NLM_F_MULTIPART,
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewAddress(message)),
        )
    }

    fn done(code: i32) -> Vec<u8> {
        let mut message = DoneMessage::default();
        message.code = code;
        emit(NLM_F_MULTIPART, NetlinkPayload::Done(message))
    }

    fn error(code: i32) -> Vec<u8> {
        let mut message = ErrorMessage::default();
        message.code = NonZeroI32::new(code);
        message.header = rtnl::request(Dump::Links, SEQ)[..16].to_vec();
        emit(0, NetlinkPayload::Error(message))
    }

    /// Feeds `datagrams` (each a concatenation of messages) as the reply to a `dump`.
    fn receive(dump: Dump, datagrams: &[Vec<u8>]) -> Result<DumpReply, ReplyError> {
        let mut reply = DumpReply::default();
        for datagram in datagrams {
            reply.add_datagram(dump, SEQ, datagram)?;
        }
        Ok(reply)
    }

    fn discover(links: &[Vec<u8>], addresses: &[Vec<u8>]) -> Vec<DiscoveredInterface> {
        let links = receive(Dump::Links, links).unwrap();
        let addresses = receive(Dump::Addresses, addresses).unwrap();
        assert!(links.done && addresses.done);
        assemble(&links.links, &addresses.addresses)
            .unwrap()
            .expect("consistent dumps")
    }

    fn nets(texts: &[&str]) -> Vec<IpNet> {
        texts.iter().map(|t| t.parse().unwrap()).collect()
    }

    #[test]
    fn keeps_l3_interfaces_except_lo_and_link_local_only_in_kernel_order() {
        // Several messages per datagram, the dump spread over datagrams, DONE on its own.
        let links = [
            [link(1, b"lo", true), link(2, b"eth0", true)].concat(),
            [link(3, b"net1", false), link(4, b"ll-only", true)].concat(),
            [link(5, b"bare", true), link(6, b"ptp", true)].concat(),
            done(0),
        ];
        // An AF_UNSPEC dump: every IPv4 address, then every IPv6 one.
        let addresses = [
            [
                address(1, "127.0.0.1/8", None),
                address(2, "10.0.0.5/24", None),
                address(3, "192.168.7.2/28", None),
                address(6, "10.5.0.1/32", Some("10.5.0.2")),
            ]
            .concat(),
            [
                address(1, "::1/128", None),
                address(2, "fd00::5/64", None),
                address(2, "fe80::1/64", None),
                address(4, "fe80::2/64", None),
                address(2, "10.0.0.6/24", None),
                done(0),
            ]
            .concat(),
        ];
        let found = discover(&links, &addresses);
        let names: Vec<&str> = found.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["eth0", "net1", "ptp"]);
        let eth0 = &found[0];
        assert_eq!((eth0.index, eth0.up), (2, true));
        assert_eq!(
            eth0.addrs,
            nets(&["10.0.0.5/24", "fd00::5/64", "10.0.0.6/24"])
        );
        assert_eq!(eth0.link_local, nets(&["fe80::1/64"]));
        assert_eq!(
            eth0.ips().collect::<Vec<_>>(),
            vec![
                "10.0.0.5".parse::<IpAddr>().unwrap(),
                "fd00::5".parse().unwrap(),
                "10.0.0.6".parse().unwrap()
            ]
        );
        assert!(!found[1].up);
        assert_eq!(found[1].addrs, nets(&["192.168.7.2/28"]));
        // IFA_LOCAL, not the peer in IFA_ADDRESS.
        assert_eq!(found[2].addrs, nets(&["10.5.0.1/32"]));
    }

    #[test]
    fn unusual_names_are_returned_as_they_are() {
        let names: [&[u8]; 3] = [b"a\"b;+", b"x\\y*", "é{}".as_bytes()];
        let links: Vec<Vec<u8>> = names
            .iter()
            .enumerate()
            .map(|(i, name)| link(i as u32 + 2, name, true))
            .chain([done(0)])
            .collect();
        let addresses: Vec<Vec<u8>> = (0..names.len())
            .map(|i| address(i as u32 + 2, &format!("10.0.{i}.1/24"), None))
            .chain([done(0)])
            .collect();
        let found = discover(&links, &addresses);
        let got: Vec<&str> = found.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(got, ["a\"b;+", "x\\y*", "é{}"]);
    }

    #[test]
    fn a_pod_interface_whose_name_is_not_utf8_is_an_error() {
        let links = [
            [link(2, b"eth0", true), link(3, b"x\xffy", true)].concat(),
            done(0),
        ];
        let with_address = [
            [
                address(2, "10.0.0.1/24", None),
                address(3, "10.0.1.1/24", None),
            ]
            .concat(),
            done(0),
        ];
        let links = receive(Dump::Links, &links).unwrap();
        let addresses = receive(Dump::Addresses, &with_address).unwrap();
        let err = assemble(&links.links, &addresses.addresses).unwrap_err();
        assert!(
            matches!(&err, DiscoverError::UnsupportedName { index: 3, bytes } if bytes == b"x\xffy"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "interface 3 has a name that is not UTF-8 (\"x\\xffy\"): it cannot be named in policy"
        );
        // Without an address that counts it is no pod interface: nothing to refuse.
        let only_eth0 = [
            [
                address(2, "10.0.0.1/24", None),
                address(3, "fe80::1/64", None),
            ]
            .concat(),
            done(0),
        ];
        let addresses = receive(Dump::Addresses, &only_eth0).unwrap();
        let found = assemble(&links.links, &addresses.addresses)
            .unwrap()
            .unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].name, "eth0");
    }

    #[test]
    fn an_address_of_a_link_not_dumped_means_start_over() {
        let links = receive(Dump::Links, &[link(2, b"eth0", true), done(0)]).unwrap();
        let addresses =
            receive(Dump::Addresses, &[address(9, "10.0.0.1/24", None), done(0)]).unwrap();
        assert_eq!(assemble(&links.links, &addresses.addresses).unwrap(), None);
    }

    #[test]
    fn an_interrupted_dump_is_flagged() {
        let mut interrupted = link(2, b"eth0", true);
        // nlmsg_flags: bytes 6..8.
        let flags = u16::from_ne_bytes([interrupted[6], interrupted[7]]) | NLM_F_DUMP_INTR;
        interrupted[6..8].copy_from_slice(&flags.to_ne_bytes());
        let reply = receive(Dump::Links, &[interrupted, done(0)]).unwrap();
        assert!(reply.interrupted && reply.done);
        assert!(
            !receive(Dump::Links, &[link(2, b"eth0", true)])
                .unwrap()
                .done
        );
    }

    #[test]
    fn kernel_errors_are_errors() {
        assert_eq!(
            receive(Dump::Links, &[error(-libc::EPERM)]),
            Err(ReplyError::Kernel(libc::EPERM))
        );
        // A dump that failed half-way.
        assert_eq!(
            receive(
                Dump::Addresses,
                &[address(2, "10.0.0.1/24", None), done(-libc::EINTR)]
            ),
            Err(ReplyError::Kernel(libc::EINTR))
        );
        assert!(matches!(
            receive(Dump::Links, &[error(0)]),
            Err(ReplyError::Malformed(_))
        ));
    }

    #[test]
    fn replies_that_do_not_answer_the_request_are_malformed() {
        let malformed = |dump, datagram: Vec<u8>| {
            let got = receive(dump, &[datagram]);
            assert!(matches!(got, Err(ReplyError::Malformed(_))), "{got:?}");
        };
        // Another request's sequence number.
        let mut other = link(2, b"eth0", true);
        other[8..12].copy_from_slice(&(SEQ + 1).to_ne_bytes());
        malformed(Dump::Links, other);
        // A message of the other dump.
        malformed(Dump::Links, address(2, "10.0.0.1/24", None));
        malformed(Dump::Addresses, link(2, b"eth0", true));
        // Cut short: the header says more than the datagram holds.
        let whole = link(2, b"eth0", true);
        malformed(Dump::Links, whole[..whole.len() - 4].to_vec());
        malformed(Dump::Links, whole[..10].to_vec());
        // A link without a name; an IPv4 address of 3 bytes.
        let mut nameless = LinkMessage::default();
        nameless.header.index = 4;
        malformed(
            Dump::Links,
            emit(
                NLM_F_MULTIPART,
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(nameless)),
            ),
        );
        let mut short = AddressMessage::default();
        short.header.family = AddressFamily::Inet;
        short.attributes = vec![AddressAttribute::Other(DefaultNla::new(
            libc::IFA_LOCAL,
            vec![10, 0, 0],
        ))];
        malformed(
            Dump::Addresses,
            emit(
                NLM_F_MULTIPART,
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewAddress(short)),
            ),
        );
        // An attribute whose length runs past the message.
        let mut bad_attribute = link(2, b"eth0", true);
        bad_attribute[16 + 16..16 + 18].copy_from_slice(&200u16.to_ne_bytes());
        malformed(Dump::Links, bad_attribute);
    }

    #[test]
    fn addresses_of_other_families_are_skipped_and_bad_prefixes_refused() {
        let mut mpls = AddressMessage::default();
        mpls.header.family = AddressFamily::Mpls;
        mpls.header.index = 2;
        mpls.attributes = vec![AddressAttribute::Other(DefaultNla::new(
            libc::IFA_ADDRESS,
            vec![1, 2],
        ))];
        let other_family = emit(
            NLM_F_MULTIPART,
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewAddress(mpls)),
        );
        let reply = receive(Dump::Addresses, &[other_family, done(0)]).unwrap();
        assert!(reply.addresses.is_empty());

        let links = receive(Dump::Links, &[link(2, b"eth0", true), done(0)]).unwrap();
        let too_long = AddressRecord {
            index: 2,
            addr: "10.0.0.1".parse().unwrap(),
            prefix_len: 40,
        };
        let err = assemble(&links.links, &[too_long]).unwrap_err();
        assert!(
            matches!(
                err,
                DiscoverError::BadAddress {
                    index: 2,
                    prefix_len: 40,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn records_are_bounded() {
        let one = link(2, b"eth0", true);
        let datagram = one.repeat(1024);
        let mut reply = DumpReply::default();
        let mut result = Ok(());
        for _ in 0..=MAX_RECORDS / 1024 {
            result = reply.add_datagram(Dump::Links, SEQ, &datagram);
            if result.is_err() {
                break;
            }
        }
        assert_eq!(result, Err(ReplyError::TooManyRecords));
        assert_eq!(reply.links.len(), MAX_RECORDS);
    }

    #[test]
    fn requests_are_dumps_of_the_right_table() {
        for (dump, kind) in [
            (Dump::Links, libc::RTM_GETLINK),
            (Dump::Addresses, libc::RTM_GETADDR),
        ] {
            let bytes = rtnl::request(dump, 42);
            let message = netlink_packet_core::NetlinkBuffer::new_checked(&bytes[..]).unwrap();
            assert_eq!(message.length() as usize, bytes.len());
            assert_eq!(message.message_type(), kind);
            assert_eq!(
                message.flags(),
                netlink_packet_core::NLM_F_REQUEST | netlink_packet_core::NLM_F_DUMP
            );
            assert_eq!(message.sequence_number(), 42);
            // Family AF_UNSPEC: every family.
            assert_eq!(message.payload()[0], libc::AF_UNSPEC as u8);
        }
    }

    /// A valid two-link reply, for the mutation property.
    fn valid_reply() -> Vec<u8> {
        [link(1, b"lo", true), link(2, b"eth0", true), done(0)].concat()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            for dump in [Dump::Links, Dump::Addresses] {
                let mut reply = DumpReply::default();
                let _ = reply.add_datagram(dump, SEQ, &bytes);
                prop_assert!(reply.links.len() + reply.addresses.len() <= bytes.len() / 16);
            }
        }

        #[test]
        fn corrupted_replies_never_panic(
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut bytes = valid_reply();
            for (at, value) in edits {
                let at = at.index(bytes.len());
                bytes[at] = value;
            }
            let len = bytes.len();
            bytes.truncate(cut.index(len + 1).max(1));
            for dump in [Dump::Links, Dump::Addresses] {
                let mut reply = DumpReply::default();
                if reply.add_datagram(dump, SEQ, &bytes).is_ok() {
                    let _ = assemble(&reply.links, &reply.addresses);
                }
            }
        }
    }
}
