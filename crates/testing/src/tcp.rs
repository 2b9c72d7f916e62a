//! TCP from inside a namespace: listeners, connections (timed, or closed with a reset),
//! waiting for a fresh topology to pass packets, and the two verdicts a firewall test checks:
//! connects, or is refused (a reset, never a timeout: netwarden rejects, it does not drop).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::netns::in_netns;

/// How long [`connect`] waits for a handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A TCP listener on `addr` inside `ns`; its backlog completes handshakes without `accept`.
pub fn listen(ns: &Path, addr: &str) -> TcpListener {
    let addr: SocketAddr = addr.parse().expect("socket address");
    in_netns(ns, move || TcpListener::bind(addr)).unwrap_or_else(|e| panic!("bind {addr}: {e}"))
}

/// A TCP connection from inside `ns` to `addr` (3 s timeout).
pub fn connect(ns: &Path, addr: &str) -> std::io::Result<TcpStream> {
    connect_timed(ns, addr, CONNECT_TIMEOUT).0
}

/// A TCP connection from inside `ns` to `addr` within `timeout`, and how long the attempt
/// took (measured inside the namespace's thread): a refusal by reset takes far less than a
/// second, a drop the whole timeout.
pub fn connect_timed(
    ns: &Path,
    addr: &str,
    timeout: Duration,
) -> (std::io::Result<TcpStream>, Duration) {
    let addr: SocketAddr = addr.parse().expect("socket address");
    in_netns(ns, move || {
        let start = Instant::now();
        let r = TcpStream::connect_timeout(&addr, timeout);
        (r, start.elapsed())
    })
}

/// Closes `stream` with a reset (`SO_LINGER` 0) instead of a FIN.
///
/// For probes made without pause: a connection closed normally leaves a TIME_WAIT socket on the
/// side that closed first, and a later connection reusing the same ports can then be answered
/// with a reset by the peer's TCP stack — a refusal that no firewall made — or the ports run
/// out. Resetting leaves no TIME_WAIT anywhere.
pub fn close_with_reset(stream: TcpStream) -> std::io::Result<()> {
    let zero = nix::libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    nix::sys::socket::setsockopt(&stream, nix::sys::socket::sockopt::Linger, &zero)
        .map_err(std::io::Error::from)
}

/// One TCP connection from inside `ns` to `addr`, closed at once with a reset (see
/// [`close_with_reset`]).
pub fn probe(ns: &Path, addr: &str) -> std::io::Result<()> {
    close_with_reset(connect(ns, addr)?)
}

/// Waits (up to 60 s) until `ns` reaches `addr`: a fresh veth only passes packets once the
/// kernel's link watcher has activated it, which takes seconds when many namespaces are being
/// created at the same time. Later failures are then the test's, not the topology's.
pub fn wait_reachable(ns: &Path, addr: &str) {
    let start = Instant::now();
    loop {
        match connect(ns, addr) {
            Ok(_) => return,
            Err(e) if start.elapsed() > Duration::from_secs(60) => {
                panic!("{addr} never became reachable: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// `addr` must be refused from `ns`: a TCP reset, not a timeout.
pub fn assert_refused(ns: &Path, addr: &str, why: &str) {
    match connect(ns, addr) {
        Ok(_) => panic!("{why}: {addr} connected, must be refused"),
        Err(e) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "{why}: {addr}: {e} (a refusal, not a timeout)"
        ),
    }
}

/// [`assert_refused`], and within a second: the reset answers the first SYN (a refusal after
/// a retransmission is not the firewall's own reject).
pub fn assert_refused_fast(ns: &Path, addr: &str, why: &str) {
    let (result, took) = connect_timed(ns, addr, CONNECT_TIMEOUT);
    match result {
        Ok(_) => panic!("{why}: {addr} connected, must be refused"),
        Err(e) => {
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::ConnectionRefused,
                "{why}: {addr}: {e} (a refusal, not a timeout)"
            );
            assert!(
                took < Duration::from_secs(1),
                "{why}: {addr}: refused only after {took:?}"
            );
        }
    }
}

/// `addr` must connect from `ns`.
pub fn assert_connects(ns: &Path, addr: &str, why: &str) {
    if let Err(e) = connect(ns, addr) {
        panic!("{why}: {addr} must connect: {e}");
    }
}
