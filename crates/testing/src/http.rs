//! The agent's HTTP endpoints (`/healthz`, `/readyz`, `/metrics`) as a test reads them: one
//! plain HTTP/1.1 GET per call, no client library, bounded waits.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// The whole response (status line, headers, body) to `GET path`, or `None` when nothing
/// answers within a second (or the answer takes more than five).
pub fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    Some(resp)
}

/// Whether `/readyz` answers 200.
pub fn ready(addr: SocketAddr) -> bool {
    http_get(addr, "/readyz").is_some_and(|r| r.starts_with("HTTP/1.1 200"))
}

/// The value of an unlabelled metric (`name value`), if `/metrics` serves it.
pub fn metric(addr: SocketAddr, name: &str) -> Option<f64> {
    let text = http_get(addr, "/metrics")?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A loopback address with a port free right now, for an agent's `--metrics`.
pub fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("its address")
}
