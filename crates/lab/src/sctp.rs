//! SCTP probes on a kernel without SCTP sockets (no `sctp` module): a raw SCTP INIT, and the
//! ICMP error that comes back says what happened to it.
//!
//! The INIT leaves the source pod's netns through its OUTPUT hook (egress rules) and enters the
//! destination's through INPUT (ingress rules), exactly as a real association's first packet.
//! Then:
//! - both sides let it through: the destination kernel has no SCTP to hand it to and answers
//!   *protocol unreachable* (ICMP 3/2; ICMPv6 parameter problem, unrecognised next header): the
//!   packet reached its destination, [`ProbeDetail::Connected`];
//! - a side REJECTs it (netwarden's deny): *port unreachable* (ICMP 3/3, ICMPv6 1/4),
//!   [`ProbeDetail::Refused`], as a UDP probe gets;
//! - nothing comes back: [`ProbeDetail::Timeout`] (a silent drop).
//!
//! The INIT is sent on an `IPPROTO_RAW` socket with its IP header written here: such a socket
//! never receives, whereas a raw SCTP socket would take a copy of every SCTP packet reaching
//! its netns — and a kernel that delivered a packet to a raw socket sends no protocol
//! unreachable, so concurrent probes (or a pod probing itself) would silence each other. Each
//! probe reads the ICMP errors of its source netns on a raw socket of its own and keeps only
//! the one quoting its packet (destination address, source and destination port). Source
//! ports come from a process-wide counter so that concurrent probes never share one.

use std::io::{ErrorKind, Read};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol as SockProtocol, Socket, Type};

use crate::probe::{ProbeDetail, ProbeSpec};

const IPPROTO_SCTP: i32 = 132;

/// Whether this kernel lacks SCTP sockets but lets raw SCTP packets be sent from this netns:
/// then SCTP ports are probed with [`probe`].
pub(crate) fn raw_probing_available() -> bool {
    let kernel_sctp = Socket::new(
        Domain::IPV4,
        Type::STREAM,
        Some(SockProtocol::from(IPPROTO_SCTP)),
    );
    kernel_sctp.is_err()
        && Socket::new(
            Domain::IPV4,
            Type::RAW,
            Some(SockProtocol::from(IPPROTO_SCTP)),
        )
        .is_ok()
}

/// CRC32c (Castagnoli, reflected, as SCTP's checksum: RFC 9260 appendix A).
pub(crate) fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// An SCTP packet holding one INIT chunk from `sport` to `dport`, checksummed.
pub(crate) fn init_packet(sport: u16, dport: u16, tag: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(32);
    p.extend_from_slice(&sport.to_be_bytes());
    p.extend_from_slice(&dport.to_be_bytes());
    p.extend_from_slice(&0u32.to_be_bytes()); // verification tag: 0 in an INIT
    p.extend_from_slice(&0u32.to_be_bytes()); // checksum, filled below
    p.push(1); // chunk type INIT
    p.push(0); // flags
    p.extend_from_slice(&20u16.to_be_bytes()); // chunk length
    p.extend_from_slice(&tag.to_be_bytes()); // initiate tag (non-zero)
    p.extend_from_slice(&65_535u32.to_be_bytes()); // advertised receiver window
    p.extend_from_slice(&1u16.to_be_bytes()); // outbound streams
    p.extend_from_slice(&1u16.to_be_bytes()); // inbound streams
    p.extend_from_slice(&1u32.to_be_bytes()); // initial TSN
                                              // The CRC goes on the wire least significant byte first (as Linux stores it).
    let crc = crc32c(&p);
    p[8..12].copy_from_slice(&crc.to_le_bytes());
    p
}

/// `sctp` behind an IP header from `src` (IPv4: unspecified = the kernel picks it, as it fills
/// the checksum and id) to `dst`, for an `IPPROTO_RAW` socket.
pub(crate) fn ip_packet(src: Option<IpAddr>, dst: IpAddr, sctp: &[u8]) -> Result<Vec<u8>, String> {
    let mut p = Vec::with_capacity(40 + sctp.len());
    match (src, dst) {
        (None | Some(IpAddr::V4(_)), IpAddr::V4(to)) => {
            let from = match src {
                Some(IpAddr::V4(a)) => a.octets(),
                _ => [0; 4],
            };
            let total = u16::try_from(20 + sctp.len()).map_err(|e| e.to_string())?;
            p.extend_from_slice(&[0x45, 0]);
            p.extend_from_slice(&total.to_be_bytes());
            p.extend_from_slice(&[0, 0, 0x40, 0, 64, 132, 0, 0]); // id, DF, TTL, SCTP, checksum
            p.extend_from_slice(&from);
            p.extend_from_slice(&to.octets());
        }
        (Some(IpAddr::V6(from)), IpAddr::V6(to)) => {
            let payload = u16::try_from(sctp.len()).map_err(|e| e.to_string())?;
            p.extend_from_slice(&[0x60, 0, 0, 0]);
            p.extend_from_slice(&payload.to_be_bytes());
            p.extend_from_slice(&[132, 64]); // next header SCTP, hop limit
            p.extend_from_slice(&from.octets());
            p.extend_from_slice(&to.octets());
        }
        (None, IpAddr::V6(_)) => return Err("an IPv6 SCTP probe needs its source address".into()),
        _ => {
            return Err(format!(
                "source {src:?} and destination {dst} differ in family"
            ))
        }
    }
    p.extend_from_slice(sctp);
    Ok(p)
}

/// What an ICMP error quoting our packet says, if `msg` is one (`ipv4`: `msg` starts with the
/// IPv4 header, as raw ICMP sockets read it; IPv6: with the ICMPv6 header).
pub(crate) fn classify(
    msg: &[u8],
    ipv4: bool,
    dst: IpAddr,
    sport: u16,
    dport: u16,
) -> Option<ProbeDetail> {
    let (icmp, quoted_ip) = if ipv4 {
        let ihl = usize::from(*msg.first()? & 0x0f) * 4;
        (msg.get(ihl..)?, msg.get(ihl + 8..)?)
    } else {
        (msg, msg.get(8..)?)
    };
    let (kind, code) = (*icmp.first()?, *icmp.get(1)?);
    // The quoted packet: our destination, protocol SCTP, our ports.
    let sctp = if ipv4 {
        let ihl = usize::from(*quoted_ip.first()? & 0x0f) * 4;
        let to: [u8; 4] = quoted_ip.get(16..20)?.try_into().ok()?;
        if *quoted_ip.get(9)? != 132 || IpAddr::from(to) != dst {
            return None;
        }
        quoted_ip.get(ihl..ihl + 4)?
    } else {
        let to: [u8; 16] = quoted_ip.get(24..40)?.try_into().ok()?;
        if *quoted_ip.get(6)? != 132 || IpAddr::from(to) != dst {
            return None;
        }
        quoted_ip.get(40..44)?
    };
    if u16::from_be_bytes([sctp[0], sctp[1]]) != sport
        || u16::from_be_bytes([sctp[2], sctp[3]]) != dport
    {
        return None;
    }
    Some(match (ipv4, kind, code) {
        (true, 3, 2) | (false, 4, 1) => ProbeDetail::Connected,
        (true, 3, 3) | (false, 1, 4) => ProbeDetail::Refused,
        (true, 3, _) | (false, 1, _) => ProbeDetail::Unreachable,
        _ => return None,
    })
}

/// A source port no other probe of this process uses at the same time.
fn next_source_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // 20000 ports, reused only after 20000 probes: long after this one ended.
    40_000 + (n % 20_000) as u16
}

/// Probes `spec` (SCTP) from the current thread's netns; waits at most `timeout` per attempt.
pub(crate) fn probe(spec: &ProbeSpec, timeout: Duration, attempts: u32) -> ProbeDetail {
    match try_probe(spec, timeout, attempts) {
        Ok(detail) => detail,
        Err((what, e)) => ProbeDetail::Error(format!("{what}: {e}")),
    }
}

fn try_probe(
    spec: &ProbeSpec,
    timeout: Duration,
    attempts: u32,
) -> Result<ProbeDetail, (&'static str, std::io::Error)> {
    let ipv4 = spec.dst_ip.is_ipv4();
    let (domain, icmp) = if ipv4 {
        (Domain::IPV4, SockProtocol::ICMPV4)
    } else {
        (Domain::IPV6, SockProtocol::ICMPV6)
    };
    // Listening first: the answer may come before `send_to` returns.
    let mut errors =
        Socket::new(domain, Type::RAW, Some(icmp)).map_err(|e| ("raw ICMP socket", e))?;
    // IPPROTO_RAW: send-only, header included (see the module doc).
    let sender = Socket::new(domain, Type::RAW, Some(SockProtocol::from(255)))
        .map_err(|e| ("raw IP socket", e))?;
    if let Some(src) = spec.src_ip {
        sender
            .bind(&SocketAddr::new(src, 0).into())
            .map_err(|e| ("bind source address", e))?;
    }
    let sport = next_source_port();
    let sctp = init_packet(sport, spec.port, 0x6e77_0000 | u32::from(sport));
    let packet = ip_packet(spec.src_ip, spec.dst_ip, &sctp)
        .map_err(|e| ("build the packet", std::io::Error::other(e)))?;
    let dst = SocketAddr::new(spec.dst_ip, 0).into();
    let mut buf = [0u8; 1500];
    for _ in 0..attempts.max(1) {
        match sender.send_to(&packet, &dst) {
            // EPERM: discarded in this netns's OUTPUT hook; a REJECT's answer is on its way.
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(1) => {}
            Err(e) => return Err(("send", e)),
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            errors
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .map_err(|e| ("set timeout", e))?;
            match errors.read(&mut buf) {
                Ok(n) => {
                    if let Some(detail) = classify(&buf[..n], ipv4, spec.dst_ip, sport, spec.port) {
                        return Ok(detail);
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(("receive ICMP", e)),
            }
        }
    }
    Ok(ProbeDetail::Timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_is_castagnoli() {
        // The standard check value of CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn ip_headers_carry_sctp_between_the_probe_addresses() {
        let sctp = init_packet(40_000, 9003, 1);
        let v4 = ip_packet(None, "10.0.0.2".parse().unwrap(), &sctp).unwrap();
        assert_eq!((v4[0], v4[9], v4.len()), (0x45, 132, 52));
        assert_eq!(&v4[2..4], &52u16.to_be_bytes());
        assert_eq!(&v4[12..20], &[0, 0, 0, 0, 10, 0, 0, 2]);
        assert_eq!(&v4[20..], &sctp[..]);
        let (from, to) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let v6 = ip_packet(Some(from), to, &sctp).unwrap();
        assert_eq!((v6[0], v6[6], v6.len()), (0x60, 132, 72));
        assert_eq!(&v6[4..6], &32u16.to_be_bytes());
        assert_eq!(v6[39], 2);
        assert!(ip_packet(None, to, &sctp).is_err());
        assert!(ip_packet(Some(from), "10.0.0.2".parse().unwrap(), &sctp).is_err());
    }

    #[test]
    fn init_packet_layout_and_checksum() {
        let p = init_packet(40_001, 9003, 0x6e77_9c41);
        assert_eq!(p.len(), 32);
        assert_eq!(&p[0..4], &[0x9c, 0x41, 0x23, 0x2b]);
        assert_eq!(p[12], 1, "an INIT chunk");
        let mut zeroed = p.clone();
        zeroed[8..12].copy_from_slice(&[0; 4]);
        assert_eq!(&p[8..12], &crc32c(&zeroed).to_le_bytes());
    }

    /// An ICMP error as a raw IPv4 socket reads it: outer IPv4 header, ICMP header, the quoted
    /// IPv4 header and the first bytes of the SCTP packet.
    fn icmp4(kind: u8, code: u8, dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut m = vec![
            0x45, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0, 10, 0, 0, 2, 10, 0, 0, 1,
        ];
        m.extend_from_slice(&[kind, code, 0, 0, 0, 0, 0, 0]);
        let mut quoted = vec![0x45, 0, 0, 52, 0, 0, 0, 0, 64, 132, 0, 0, 10, 0, 0, 1];
        quoted.extend_from_slice(&dst);
        m.extend_from_slice(&quoted);
        m.extend_from_slice(&sport.to_be_bytes());
        m.extend_from_slice(&dport.to_be_bytes());
        m.extend_from_slice(&[0; 4]);
        m
    }

    fn icmp6(kind: u8, code: u8, dst: IpAddr, sport: u16, dport: u16) -> Vec<u8> {
        let IpAddr::V6(dst) = dst else { panic!() };
        let mut m = vec![kind, code, 0, 0, 0, 0, 0, 0];
        let mut quoted = vec![0x60, 0, 0, 0, 0, 32, 132, 64];
        quoted.extend_from_slice(&[0; 16]);
        quoted.extend_from_slice(&dst.octets());
        m.extend_from_slice(&quoted);
        m.extend_from_slice(&sport.to_be_bytes());
        m.extend_from_slice(&dport.to_be_bytes());
        m
    }

    #[test]
    fn icmp_errors_say_reached_refused_or_unreachable_for_our_packet_only() {
        let dst: IpAddr = "10.0.0.2".parse().unwrap();
        let c = |m: &[u8]| classify(m, true, dst, 40_000, 9003);
        assert_eq!(
            c(&icmp4(3, 2, [10, 0, 0, 2], 40_000, 9003)),
            Some(ProbeDetail::Connected)
        );
        assert_eq!(
            c(&icmp4(3, 3, [10, 0, 0, 2], 40_000, 9003)),
            Some(ProbeDetail::Refused)
        );
        assert_eq!(
            c(&icmp4(3, 1, [10, 0, 0, 2], 40_000, 9003)),
            Some(ProbeDetail::Unreachable)
        );
        // Someone else's packet: another source port, destination or port; not an error.
        assert_eq!(c(&icmp4(3, 3, [10, 0, 0, 2], 40_001, 9003)), None);
        assert_eq!(c(&icmp4(3, 3, [10, 0, 0, 3], 40_000, 9003)), None);
        assert_eq!(c(&icmp4(3, 3, [10, 0, 0, 2], 40_000, 9005)), None);
        assert_eq!(c(&icmp4(0, 0, [10, 0, 0, 2], 40_000, 9003)), None);
        assert_eq!(c(&[0x45, 0]), None);

        let dst6: IpAddr = "fd00::2".parse().unwrap();
        let c6 = |m: &[u8]| classify(m, false, dst6, 40_000, 9003);
        assert_eq!(
            c6(&icmp6(4, 1, dst6, 40_000, 9003)),
            Some(ProbeDetail::Connected)
        );
        assert_eq!(
            c6(&icmp6(1, 4, dst6, 40_000, 9003)),
            Some(ProbeDetail::Refused)
        );
        assert_eq!(
            c6(&icmp6(1, 3, dst6, 40_000, 9003)),
            Some(ProbeDetail::Unreachable)
        );
        assert_eq!(
            c6(&icmp6(1, 4, "fd00::3".parse().unwrap(), 40_000, 9003)),
            None
        );
        assert_eq!(c6(&icmp6(4, 1, dst6, 40_000, 9005)), None);
    }
}
