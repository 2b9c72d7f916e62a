//! The framing the dataplane's conversations with netfilter share (`NETLINK_NETFILTER`:
//! ctnetlink for [`conntrack`](crate::conntrack), nf_tables for [`nft_netlink`](crate::nft_netlink)):
//! a request (netlink header, `nfgenmsg`, attributes), its replies read datagram by datagram
//! until `NLMSG_DONE` or an error, on a socket opened in the calling thread's netns and
//! connected to the kernel (a process in the pod cannot slip replies in).
//!
//! What the messages mean is each caller's; here only the headers are read. Parsing never
//! panics on any input: every length is checked by `netlink-packet-core` before a field is
//! read, and a malformed reply is an error, never a partial answer taken for a whole one.
//!
//! Layout reminders (`linux/netlink.h`, `linux/netfilter/nfnetlink.h`): netlink and attribute
//! headers are in host byte order; netfilter attribute *values* are big-endian.

use std::io;
use std::time::Duration;

use netlink_packet_core::{NetlinkBuffer, NLMSG_DONE, NLMSG_ERROR, NLM_F_DUMP_INTR};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
use nix::sys::socket::{setsockopt, sockopt::ReceiveTimeout};
use nix::sys::time::{TimeVal, TimeValLike};

/// `sizeof(struct nlmsghdr)`.
const NLMSG_HDRLEN: usize = 16;
/// `sizeof(struct nfgenmsg)`: family, version, resource id (big-endian).
pub const NFGENMSG_LEN: usize = 4;
/// `NFNETLINK_V0`.
const NFNETLINK_V0: u8 = 0;
/// The longest wait for one reply datagram (the kernel answers at once; this only keeps a
/// broken socket from stalling a sync).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// Receive buffer: dump datagrams are at most a few pages.
pub const DATAGRAM: usize = 64 << 10;

/// Why a conversation failed.
#[derive(Debug, thiserror::Error)]
pub enum NfnetlinkError {
    #[error("netfilter netlink socket ({step}): {source}")]
    Socket {
        step: &'static str,
        source: io::Error,
    },
    #[error("the kernel refused the {what}: {source}")]
    Kernel {
        what: &'static str,
        source: io::Error,
    },
    #[error("no reply to the {what} within {timeout:?}")]
    NoReply {
        what: &'static str,
        timeout: Duration,
    },
    #[error("unreadable netfilter netlink reply: {0}")]
    Malformed(String),
}

impl NfnetlinkError {
    /// The errno the kernel answered with, when it refused.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NfnetlinkError::Kernel { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// A request: netlink header (`kind` is `subsystem << 8 | message`), `nfgenmsg` of `family`,
/// then `attrs` (already encoded with [`attr`]).
pub fn request(kind: u16, flags: u16, seq: u32, family: u8, attrs: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDRLEN + NFGENMSG_LEN + attrs.len();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&(len as u32).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&[family, NFNETLINK_V0, 0, 0]);
    out.extend_from_slice(attrs);
    out
}

/// Appends one attribute (padded to 4 bytes).
pub fn attr(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    out.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len().next_multiple_of(4), 0);
}

/// How one reply datagram ended.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Ending {
    /// `NLMSG_DONE` (or the ack of a request) was in it.
    pub done: bool,
    /// The kernel flagged the dump interrupted (`NLM_F_DUMP_INTR`): it may miss entries.
    pub interrupted: bool,
    /// An `NLMSG_ERROR` with a non-zero code (a negative errno, as the kernel sends it).
    pub error: Option<i32>,
}

/// Reads one reply datagram to request `seq`: each message other than `NLMSG_DONE` and
/// `NLMSG_ERROR` goes to `each` with its type and payload (`nfgenmsg` first). Messages of
/// another sequence number are skipped (none come on a fresh connected socket).
pub fn read_datagram(
    bytes: &[u8],
    seq: u32,
    mut each: impl FnMut(u16, &[u8]) -> Result<(), String>,
) -> Result<Ending, String> {
    let mut out = Ending::default();
    let mut offset = 0;
    while offset < bytes.len() {
        let message = NetlinkBuffer::new_checked(&bytes[offset..])
            .map_err(|e| format!("netlink header: {e}"))?;
        let length = message.length() as usize;
        if message.sequence_number() == seq {
            if message.flags() & NLM_F_DUMP_INTR != 0 {
                out.interrupted = true;
            }
            match message.message_type() {
                NLMSG_DONE => out.done = true,
                NLMSG_ERROR => {
                    let code = message
                        .payload()
                        .get(..4)
                        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                        .ok_or("short error")?;
                    out.done = true;
                    if code != 0 {
                        out.error = Some(code);
                    }
                }
                kind => each(kind, message.payload())?,
            }
        }
        offset += length.next_multiple_of(4).max(NLMSG_HDRLEN);
    }
    Ok(out)
}

/// A `NETLINK_NETFILTER` socket in the calling thread's netns, connected to the kernel.
pub fn open_socket() -> Result<Socket, NfnetlinkError> {
    kernel_socket(NETLINK_NETFILTER, REPLY_TIMEOUT)
        .map_err(|(step, source)| NfnetlinkError::Socket { step, source })
}

/// A netlink socket of `protocol` in the calling thread's netns, connected to the kernel (port
/// 0: the kernel then refuses datagrams to it from any other sender, so a process in the pod
/// cannot slip forged replies in), each receive waiting at most `timeout`. On failure, the step
/// that failed.
pub fn kernel_socket(
    protocol: isize,
    timeout: Duration,
) -> Result<Socket, (&'static str, io::Error)> {
    let socket = Socket::new(protocol).map_err(|e| ("socket", e))?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(|e| ("connect", e))?;
    setsockopt(
        &socket,
        ReceiveTimeout,
        &TimeVal::milliseconds(timeout.as_millis() as i64),
    )
    .map_err(|e| ("SO_RCVTIMEO", io::Error::from(e)))?;
    Ok(socket)
}

/// Sends `request` (sequence number `seq`) and reads datagrams until the reply ends; each
/// message goes to `each` (see [`read_datagram`]). Whether the kernel flagged a dump
/// interrupted.
pub fn exchange(
    socket: &Socket,
    what: &'static str,
    request: &[u8],
    seq: u32,
    buffer: &mut [u8],
    mut each: impl FnMut(u16, &[u8]) -> Result<(), String>,
) -> Result<bool, NfnetlinkError> {
    socket
        .send(request, 0)
        .map_err(|source| NfnetlinkError::Socket {
            step: "send",
            source,
        })?;
    let mut interrupted = false;
    loop {
        let size = match socket.recv(&mut &mut buffer[..], 0) {
            Ok(size) => size,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(NfnetlinkError::NoReply {
                    what,
                    timeout: REPLY_TIMEOUT,
                })
            }
            Err(source) => {
                return Err(NfnetlinkError::Socket {
                    step: "receive",
                    source,
                })
            }
        };
        let ending = read_datagram(&buffer[..size.min(buffer.len())], seq, &mut each)
            .map_err(NfnetlinkError::Malformed)?;
        if let Some(code) = ending.error {
            return Err(NfnetlinkError::Kernel {
                what,
                source: io::Error::from_raw_os_error(-code),
            });
        }
        interrupted |= ending.interrupted;
        if ending.done {
            return Ok(interrupted);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A control message (`NLMSG_DONE`, `NLMSG_ERROR`): header, then `payload` as is.
    pub(crate) fn control(kind: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((16 + payload.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(payload);
        m
    }

    pub(crate) fn done(seq: u32) -> Vec<u8> {
        control(NLMSG_DONE, 2, seq, &0u32.to_ne_bytes())
    }

    #[test]
    fn errors_interruptions_and_other_sequences() {
        let none = |_: u16, _: &[u8]| -> Result<(), String> { panic!("no message") };
        let err = control(NLMSG_ERROR, 0, 4, &(-libc::EPERM).to_ne_bytes());
        let e = read_datagram(&err, 4, none).unwrap();
        assert_eq!((e.done, e.error), (true, Some(-libc::EPERM)));
        // An ack (error 0) ends a request without error.
        let ack = control(NLMSG_ERROR, 0, 4, &0i32.to_ne_bytes());
        assert_eq!(read_datagram(&ack, 4, none).unwrap().error, None);
        // Another request's messages are not this one's.
        let mut other = request(7, 2, 3, 0, &[]);
        other.extend(done(3));
        assert_eq!(read_datagram(&other, 4, none).unwrap(), Ending::default());
        let mut intr = done(4);
        intr[6..8].copy_from_slice(&(2 | NLM_F_DUMP_INTR).to_ne_bytes());
        assert!(read_datagram(&intr, 4, none).unwrap().interrupted);
        assert!(read_datagram(&err[..10], 4, none).is_err());
    }

    #[test]
    fn messages_reach_the_caller_with_their_type_and_payload() {
        let mut attrs = Vec::new();
        attr(&mut attrs, 1, b"abc");
        assert_eq!(attrs, [7, 0, 1, 0, b'a', b'b', b'c', 0]);
        let mut bytes = request(0x0a01, 2, 9, 1, &attrs);
        bytes.extend(done(9));
        let mut seen = Vec::new();
        let ending = read_datagram(&bytes, 9, |kind, payload| {
            seen.push((kind, payload.to_vec()));
            Ok(())
        })
        .unwrap();
        assert!(ending.done);
        let mut payload = vec![1, 0, 0, 0];
        payload.extend(&attrs);
        assert_eq!(seen, vec![(0x0a01, payload)]);
        // The caller's refusal is the datagram's.
        let refused = read_datagram(&bytes, 9, |_, _| Err("no".into()));
        assert_eq!(refused, Err("no".to_string()));
    }
}
