//! UDP "connections" between namespaces, for tests of what happens to live flows: a server
//! socket in one netns, connected client sockets in others, and whether a datagram passes both
//! ways. UDP has no reset: a flow that a firewall ends simply stops passing datagrams.
//!
//! Every check sends a request and answers it, so the flow is a replied one in conntrack (an
//! unreplied flow's packets are all `new` and walk the rules anyway, whatever an agent did to
//! its entry).

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::netns::in_netns;

/// How long one check waits for the request to arrive.
const WAIT: Duration = Duration::from_millis(300);

/// A UDP socket bound to `addr` inside `ns`, shared by the flows to it.
pub fn udp_server(ns: &Path, addr: &str) -> Arc<UdpSocket> {
    let addr: SocketAddr = addr.parse().expect("socket address");
    let socket =
        in_netns(ns, move || UdpSocket::bind(addr)).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    Arc::new(socket)
}

/// One UDP flow: a client socket in its netns, connected to a server socket.
pub struct UdpFlow {
    pub what: String,
    client: UdpSocket,
    server: Arc<UdpSocket>,
}

impl UdpFlow {
    /// A client socket bound to `from_addr` (`ip:port`, port 0 for any) inside `from`,
    /// connected to `server`.
    pub fn open(what: &str, from: &Path, from_addr: &str, server: &Arc<UdpSocket>) -> UdpFlow {
        let src: SocketAddr = from_addr.parse().expect("socket address");
        let dst = server.local_addr().expect("server address");
        let client = in_netns(from, move || {
            let s = UdpSocket::bind(src)?;
            s.connect(dst)?;
            Ok::<_, std::io::Error>(s)
        })
        .unwrap_or_else(|e| panic!("{what}: {src} → {dst}: {e}"));
        client.set_read_timeout(Some(WAIT)).unwrap();
        UdpFlow {
            what: what.into(),
            client,
            server: Arc::clone(server),
        }
    }

    /// One datagram each way: whether the request arrived (then its reply must come back).
    /// Datagrams on the shared server socket from other clients are read and dropped.
    pub fn passes(&self) -> bool {
        let me = self.client.local_addr().expect("client address");
        // A refusal (ICMP port unreachable) shows as an error on this or the next send.
        let _ = self.client.send(b"dgram");
        let start = Instant::now();
        let mut buf = [0u8; 16];
        let from = loop {
            let left = WAIT.saturating_sub(start.elapsed());
            if left.is_zero() {
                return false;
            }
            self.server.set_read_timeout(Some(left)).unwrap();
            match self.server.recv_from(&mut buf) {
                Ok((_, from)) if from == me => break from,
                Ok(_) => continue,
                Err(_) => return false,
            }
        };
        let _ = self.server.send_to(b"reply", from);
        match self.client.recv(&mut buf) {
            Ok(_) => true,
            Err(e) => panic!("{}: the request arrived, its reply did not: {e}", self.what),
        }
    }
}

/// A UDP flow from `from_ip` inside `from` (source port 40000 + `port`) to a socket bound to
/// `to_ip:port` inside `to`, the only one on that socket.
pub fn udp_flow(from: &Path, from_ip: &str, to: &Path, to_ip: &str, port: u16) -> UdpFlow {
    let addr = |ip: &str, port: u16| {
        if ip.contains(':') {
            format!("[{ip}]:{port}")
        } else {
            format!("{ip}:{port}")
        }
    };
    let server = udp_server(to, &addr(to_ip, port));
    UdpFlow::open(
        &format!("UDP {from_ip} → {to_ip}:{port}"),
        from,
        &addr(from_ip, 40000 + port),
        &server,
    )
}
