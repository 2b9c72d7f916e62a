//! Decoding the packet headers NFLOG hands us (the first `copy_range` bytes of the packet, which
//! starts at the network header for the inet hooks).
//!
//! Everything here is a pure function over untrusted bytes: the payload is whatever a pod put on
//! the wire, truncated by the kernel at an arbitrary point. Every read is bounds-checked; a
//! truncated transport header gives a partial result (addresses without ports) and a truncated
//! network header gives `None`. Nothing panics (a proptest checks arbitrary input).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub use netwarden_engine::Family;

/// The address family of a logged packet from `nfgen_family` (`AF_INET` = 2, `AF_INET6` = 10).
/// Others (`NFPROTO_INET` is never reported: the kernel logs with the packet's real family)
/// give `None`.
pub fn family_from_nfproto(family: u8) -> Option<Family> {
    match family {
        2 => Some(Family::Ipv4),
        10 => Some(Family::Ipv6),
        _ => None,
    }
}

/// The address family from an ethertype (`NFULA_PACKET_HDR.hw_protocol`).
pub fn family_from_ethertype(ethertype: u16) -> Option<Family> {
    match ethertype {
        0x0800 => Some(Family::Ipv4),
        0x86dd => Some(Family::Ipv6),
        _ => None,
    }
}

/// The transport protocol of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum L4Protocol {
    Tcp,
    Udp,
    Sctp,
    Icmp,
    Icmpv6,
    /// Any other IP protocol number (or the IPv6 next header where the walk stopped).
    Other(u8),
}

impl L4Protocol {
    pub fn from_number(n: u8) -> L4Protocol {
        match n {
            6 => L4Protocol::Tcp,
            17 => L4Protocol::Udp,
            132 => L4Protocol::Sctp,
            1 => L4Protocol::Icmp,
            58 => L4Protocol::Icmpv6,
            other => L4Protocol::Other(other),
        }
    }

    pub fn number(self) -> u8 {
        match self {
            L4Protocol::Tcp => 6,
            L4Protocol::Udp => 17,
            L4Protocol::Sctp => 132,
            L4Protocol::Icmp => 1,
            L4Protocol::Icmpv6 => 58,
            L4Protocol::Other(n) => n,
        }
    }

    /// Whether the first four bytes of the transport header are source and destination ports.
    fn has_ports(self) -> bool {
        matches!(self, L4Protocol::Tcp | L4Protocol::Udp | L4Protocol::Sctp)
    }

    /// The spelling used in events (SPEC 6): `TCP`, `UDP`, `SCTP`, `ICMP`, `ICMPv6`, or the
    /// protocol number for anything else.
    pub fn name(self) -> std::borrow::Cow<'static, str> {
        match self {
            L4Protocol::Tcp => "TCP".into(),
            L4Protocol::Udp => "UDP".into(),
            L4Protocol::Sctp => "SCTP".into(),
            L4Protocol::Icmp => "ICMP".into(),
            L4Protocol::Icmpv6 => "ICMPv6".into(),
            L4Protocol::Other(n) => n.to_string().into(),
        }
    }
}

impl fmt::Display for L4Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// What the headers of a logged packet say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketInfo {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub protocol: L4Protocol,
    /// Ports for TCP/UDP/SCTP when the transport header is present (not for a non-first
    /// fragment, nor when the copy was cut short).
    pub sport: Option<u16>,
    pub dport: Option<u16>,
    /// ICMP/ICMPv6 type and code, when present.
    pub icmp: Option<(u8, u8)>,
}

/// IPv6 extension headers we walk over to find the transport header.
const IPV6_HOP_BY_HOP: u8 = 0;
const IPV6_ROUTING: u8 = 43;
const IPV6_FRAGMENT: u8 = 44;
const IPV6_AH: u8 = 51;
const IPV6_DEST_OPTS: u8 = 60;
const IPV6_MOBILITY: u8 = 135;
/// More than this many extension headers is not a packet anyone sends legitimately; we stop
/// walking (bounded work per packet whatever the input).
const MAX_EXTENSION_HEADERS: usize = 8;

/// Decodes the network and transport headers of `payload`.
///
/// `family_hint` (from the netlink message) wins over the version nibble when given, but a
/// payload whose version nibble contradicts it is rejected rather than misread.
pub fn decode_packet(payload: &[u8], family_hint: Option<Family>) -> Option<PacketInfo> {
    let version = payload.first()? >> 4;
    let family = match (family_hint, version) {
        (Some(Family::Ipv4), 4) | (None, 4) => Family::Ipv4,
        (Some(Family::Ipv6), 6) | (None, 6) => Family::Ipv6,
        _ => return None,
    };
    match family {
        Family::Ipv4 => decode_ipv4(payload),
        Family::Ipv6 => decode_ipv6(payload),
    }
}

fn decode_ipv4(p: &[u8]) -> Option<PacketInfo> {
    let ihl = usize::from(p.first()? & 0x0f) * 4;
    if ihl < 20 || p.len() < 20 {
        return None;
    }
    let src = Ipv4Addr::from(<[u8; 4]>::try_from(p.get(12..16)?).ok()?);
    let dst = Ipv4Addr::from(<[u8; 4]>::try_from(p.get(16..20)?).ok()?);
    let protocol = L4Protocol::from_number(p[9]);
    let frag_offset = u16::from_be_bytes([p[6], p[7]]) & 0x1fff;
    // A non-first fragment carries no transport header; options may also be cut off by the
    // copy range, in which case `get` below yields no ports.
    let l4 = if frag_offset == 0 { p.get(ihl..) } else { None };
    Some(with_transport(
        IpAddr::V4(src),
        IpAddr::V4(dst),
        protocol,
        l4,
    ))
}

fn decode_ipv6(p: &[u8]) -> Option<PacketInfo> {
    if p.len() < 40 {
        return None;
    }
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(&p[8..24]).ok()?);
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&p[24..40]).ok()?);
    let mut next = p[6];
    let mut offset = 40usize;
    let mut l4_present = true;
    for _ in 0..MAX_EXTENSION_HEADERS {
        match next {
            IPV6_HOP_BY_HOP | IPV6_ROUTING | IPV6_DEST_OPTS | IPV6_MOBILITY => {
                let Some(hdr) = p.get(offset..offset + 2) else {
                    l4_present = false;
                    break;
                };
                next = hdr[0];
                offset += (usize::from(hdr[1]) + 1) * 8;
            }
            IPV6_FRAGMENT => {
                let Some(hdr) = p.get(offset..offset + 4) else {
                    l4_present = false;
                    break;
                };
                next = hdr[0];
                if u16::from_be_bytes([hdr[2], hdr[3]]) >> 3 != 0 {
                    // Non-first fragment: no transport header follows.
                    l4_present = false;
                }
                offset += 8;
                if !l4_present {
                    break;
                }
            }
            IPV6_AH => {
                let Some(hdr) = p.get(offset..offset + 2) else {
                    l4_present = false;
                    break;
                };
                next = hdr[0];
                offset += (usize::from(hdr[1]) + 2) * 4;
            }
            _ => break,
        }
    }
    let protocol = L4Protocol::from_number(next);
    let l4 = if l4_present { p.get(offset..) } else { None };
    Some(with_transport(
        IpAddr::V6(src),
        IpAddr::V6(dst),
        protocol,
        l4,
    ))
}

fn with_transport(src: IpAddr, dst: IpAddr, protocol: L4Protocol, l4: Option<&[u8]>) -> PacketInfo {
    let mut info = PacketInfo {
        src,
        dst,
        protocol,
        sport: None,
        dport: None,
        icmp: None,
    };
    let Some(l4) = l4 else { return info };
    if protocol.has_ports() {
        if let Some(h) = l4.get(0..4) {
            info.sport = Some(u16::from_be_bytes([h[0], h[1]]));
            info.dport = Some(u16::from_be_bytes([h[2], h[3]]));
        }
    } else if matches!(protocol, L4Protocol::Icmp | L4Protocol::Icmpv6) {
        if let Some(h) = l4.get(0..2) {
            info.icmp = Some((h[0], h[1]));
        }
    }
    info
}

/// Builders of well-formed packets, for tests here and in the other modules.
#[cfg(test)]
pub(crate) mod build {
    use std::net::{Ipv4Addr, Ipv6Addr};

    pub fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4: &[u8]) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, proto, 0, 0];
        let total = (20 + l4.len()) as u16;
        p[2..4].copy_from_slice(&total.to_be_bytes());
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        p.extend_from_slice(l4);
        p
    }

    pub fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, rest: &[u8]) -> Vec<u8> {
        let mut p = vec![0x60, 0, 0, 0];
        p.extend_from_slice(&(rest.len() as u16).to_be_bytes());
        p.push(next);
        p.push(64);
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        p.extend_from_slice(rest);
        p
    }

    /// A TCP SYN header (20 bytes).
    pub fn tcp(sport: u16, dport: u16) -> Vec<u8> {
        let mut h = Vec::with_capacity(20);
        h.extend_from_slice(&sport.to_be_bytes());
        h.extend_from_slice(&dport.to_be_bytes());
        h.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
        h
    }

    pub fn udp(sport: u16, dport: u16) -> Vec<u8> {
        let mut h = Vec::with_capacity(8);
        h.extend_from_slice(&sport.to_be_bytes());
        h.extend_from_slice(&dport.to_be_bytes());
        h.extend_from_slice(&[0, 8, 0, 0]);
        h
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;
    use proptest::prelude::*;

    const A4: Ipv4Addr = Ipv4Addr::new(10, 1, 2, 3);
    const B4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 9);

    fn a6() -> Ipv6Addr {
        "fd00::1".parse().unwrap()
    }
    fn b6() -> Ipv6Addr {
        "2001:db8::abcd".parse().unwrap()
    }

    #[test]
    fn ipv4_tcp_udp_sctp() {
        let p = decode_packet(&ipv4(A4, B4, 6, &tcp(40000, 80)), Some(Family::Ipv4)).unwrap();
        assert_eq!(
            p,
            PacketInfo {
                src: A4.into(),
                dst: B4.into(),
                protocol: L4Protocol::Tcp,
                sport: Some(40000),
                dport: Some(80),
                icmp: None
            }
        );
        let p = decode_packet(&ipv4(A4, B4, 17, &udp(5353, 53)), None).unwrap();
        assert_eq!(
            (p.protocol, p.sport, p.dport),
            (L4Protocol::Udp, Some(5353), Some(53))
        );
        // SCTP common header: ports, verification tag, checksum.
        let sctp = [0x0b, 0xb8, 0x0e, 0xd8, 1, 2, 3, 4, 0, 0, 0, 0];
        let p = decode_packet(&ipv4(A4, B4, 132, &sctp), None).unwrap();
        assert_eq!(
            (p.protocol, p.sport, p.dport),
            (L4Protocol::Sctp, Some(3000), Some(3800))
        );
        assert_eq!(p.protocol.name(), "SCTP");
    }

    #[test]
    fn ipv4_icmp_and_other() {
        let p = decode_packet(&ipv4(A4, B4, 1, &[8, 0, 0, 0, 0, 1, 0, 1]), None).unwrap();
        assert_eq!(
            (p.protocol, p.icmp, p.sport),
            (L4Protocol::Icmp, Some((8, 0)), None)
        );
        let p = decode_packet(&ipv4(A4, B4, 47, &[0; 8]), None).unwrap();
        assert_eq!(p.protocol, L4Protocol::Other(47));
        assert_eq!(p.protocol.name(), "47");
        assert_eq!((p.sport, p.dport, p.icmp), (None, None, None));
    }

    #[test]
    fn ipv4_options_are_skipped() {
        let mut pkt = ipv4(A4, B4, 6, &[]);
        pkt[0] = 0x46; // IHL 6: one 4-byte option word
        pkt.extend_from_slice(&[1, 1, 1, 0]); // NOPs + EOL
        pkt.extend_from_slice(&tcp(1234, 443));
        let p = decode_packet(&pkt, None).unwrap();
        assert_eq!((p.sport, p.dport), (Some(1234), Some(443)));
    }

    #[test]
    fn ipv4_fragments_have_no_ports() {
        let mut pkt = ipv4(A4, B4, 17, &udp(1, 2));
        pkt[6] = 0x00;
        pkt[7] = 0x10; // offset 16 * 8 bytes
        let p = decode_packet(&pkt, None).unwrap();
        assert_eq!(
            (p.protocol, p.sport, p.dport),
            (L4Protocol::Udp, None, None)
        );
    }

    #[test]
    fn ipv6_tcp_udp_icmpv6() {
        let p = decode_packet(&ipv6(a6(), b6(), 6, &tcp(50000, 8080)), Some(Family::Ipv6)).unwrap();
        assert_eq!(p.src, IpAddr::V6(a6()));
        assert_eq!(p.dst, IpAddr::V6(b6()));
        assert_eq!(
            (p.protocol, p.sport, p.dport),
            (L4Protocol::Tcp, Some(50000), Some(8080))
        );
        let p = decode_packet(&ipv6(a6(), b6(), 17, &udp(1000, 9)), None).unwrap();
        assert_eq!(
            (p.protocol, p.sport, p.dport),
            (L4Protocol::Udp, Some(1000), Some(9))
        );
        let p = decode_packet(&ipv6(a6(), b6(), 58, &[128, 0, 0, 0]), None).unwrap();
        assert_eq!((p.protocol, p.icmp), (L4Protocol::Icmpv6, Some((128, 0))));
        assert_eq!(p.protocol.name(), "ICMPv6");
    }

    #[test]
    fn ipv6_extension_headers_are_walked() {
        // Hop-by-hop (8 bytes) -> destination options (16 bytes) -> fragment (first) -> UDP.
        let mut rest = vec![IPV6_DEST_OPTS, 0, 1, 4, 0, 0, 0, 0];
        rest.extend_from_slice(&[IPV6_FRAGMENT, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        rest.extend_from_slice(&[17, 0, 0x00, 0x01, 0, 0, 0, 7]); // offset 0, M flag
        rest.extend_from_slice(&udp(4444, 5555));
        let p = decode_packet(&ipv6(a6(), b6(), IPV6_HOP_BY_HOP, &rest), None).unwrap();
        assert_eq!(
            (p.protocol, p.sport, p.dport),
            (L4Protocol::Udp, Some(4444), Some(5555))
        );

        // Non-first fragment: protocol known, no ports.
        let mut rest = vec![6, 0, 0x00, 0x08, 0, 0, 0, 7];
        rest.extend_from_slice(&tcp(1, 2));
        let p = decode_packet(&ipv6(a6(), b6(), IPV6_FRAGMENT, &rest), None).unwrap();
        assert_eq!((p.protocol, p.sport), (L4Protocol::Tcp, None));

        // AH: length in 4-byte units minus 2.
        let mut rest = vec![
            6, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        rest.extend_from_slice(&tcp(7, 8));
        let p = decode_packet(&ipv6(a6(), b6(), IPV6_AH, &rest), None).unwrap();
        assert_eq!((p.sport, p.dport), (Some(7), Some(8)));
    }

    #[test]
    fn ipv6_extension_chain_is_bounded() {
        // Nine hop-by-hop headers in a row: the walk stops and reports what it reached.
        let mut rest = Vec::new();
        for _ in 0..9 {
            rest.extend_from_slice(&[IPV6_HOP_BY_HOP, 0, 0, 0, 0, 0, 0, 0]);
        }
        let p = decode_packet(&ipv6(a6(), b6(), IPV6_HOP_BY_HOP, &rest), None).unwrap();
        assert_eq!(p.protocol, L4Protocol::Other(0));
    }

    #[test]
    fn truncated_and_malformed() {
        let full = ipv4(A4, B4, 6, &tcp(40000, 80));
        // Cut inside the IP header: nothing.
        for n in 0..20 {
            assert_eq!(decode_packet(&full[..n], None), None, "len {n}");
        }
        // Cut inside the ports: addresses without ports.
        for n in 20..24 {
            let p = decode_packet(&full[..n], None).unwrap();
            assert_eq!((p.src, p.sport, p.dport), (IpAddr::V4(A4), None, None));
        }
        assert_eq!(decode_packet(&full[..24], None).unwrap().dport, Some(80));
        // IHL below 5, or pointing past the copy.
        let mut bad = full.clone();
        bad[0] = 0x44;
        assert_eq!(decode_packet(&bad, None), None);
        let mut far = full.clone();
        far[0] = 0x4f;
        assert_eq!(decode_packet(&far, None).unwrap().sport, None);
        // Version contradicting the hint, or unknown.
        assert_eq!(decode_packet(&full, Some(Family::Ipv6)), None);
        let mut v5 = full;
        v5[0] = 0x55;
        assert_eq!(decode_packet(&v5, None), None);
        let v6 = ipv6(a6(), b6(), 6, &tcp(1, 2));
        for n in 0..40 {
            assert_eq!(decode_packet(&v6[..n], None), None);
        }
        assert_eq!(decode_packet(&v6[..42], None).unwrap().sport, None);
        // Extension header cut off.
        let p = decode_packet(&ipv6(a6(), b6(), IPV6_ROUTING, &[6]), None).unwrap();
        assert_eq!(
            (p.protocol, p.sport),
            (L4Protocol::Other(IPV6_ROUTING), None)
        );
    }

    #[test]
    fn family_sources() {
        assert_eq!(family_from_nfproto(2), Some(Family::Ipv4));
        assert_eq!(family_from_nfproto(10), Some(Family::Ipv6));
        assert_eq!(family_from_nfproto(1), None);
        assert_eq!(family_from_ethertype(0x86dd), Some(Family::Ipv6));
        assert_eq!(family_from_ethertype(0x0806), None);
        for n in 0..=255u8 {
            assert_eq!(L4Protocol::from_number(n).number(), n);
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200),
                                       hint in 0u8..3) {
            let hint = match hint { 0 => None, 1 => Some(Family::Ipv4), _ => Some(Family::Ipv6) };
            let _ = decode_packet(&bytes, hint);
        }

        #[test]
        fn ip_like_bytes_never_panic(version in prop_oneof![Just(0x45u8), Just(0x4fu8), Just(0x60u8)],
                                     rest in proptest::collection::vec(any::<u8>(), 0..160)) {
            let mut bytes = vec![version];
            bytes.extend_from_slice(&rest);
            let _ = decode_packet(&bytes, None);
        }
    }
}
