//! The HTTP server of `/metrics`, `/healthz` and `/readyz`: hyper 1 (HTTP/1.1) on a tokio
//! runtime of its own thread, answering what [`crate::metrics`] says.
//!
//! The kubelet's probes must be answered even while someone else holds connections open: the
//! server this replaces (a thread per client, at most 32, 5 s per read and no deadline) was
//! kept busy by 34 clients sending one byte every 2 s, and every probe timed out. Here:
//! - the request head must arrive whole within [`HEADER_READ_TIMEOUT`], however it dribbles;
//! - it may be [`MAX_HEADER_BYTES`] long at most (431 above that);
//! - a connection lives [`CONNECTION_DEADLINE`] at most, and carries one request;
//! - at most [`MAX_CONNECTIONS`] are served at once (waiting ones cost a task, not a thread),
//!   more wait in the listen backlog — so slow clients hold a place for a few seconds at
//!   most and never starve a probe.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use crate::metrics::{respond, Metrics};

/// The whole request head (request line and headers) must arrive within this.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(3);
/// The longest request head read; a longer one is answered 431.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// The longest a connection is kept, request and answer included.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 512;

/// Binds `addr` and serves on a background thread (forever).
pub fn serve_metrics(addr: SocketAddr, metrics: Arc<Metrics>) -> io::Result<JoinHandle<()>> {
    let listener = std::net::TcpListener::bind(addr)?;
    serve_metrics_on(listener, metrics)
}

/// Binds `addr` and serves as tasks of `runtime` (the node agent's one runtime), forever.
pub fn serve_metrics_in(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    runtime: &tokio::runtime::Handle,
) -> io::Result<()> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    // Registered with the runtime's reactor: entered, since this thread is not one of its.
    let listener = {
        let _entered = runtime.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    runtime.spawn(accept_loop(listener, metrics));
    Ok(())
}

/// Serves on an already bound listener (tests bind port 0 and read the address).
pub fn serve_metrics_on(
    listener: std::net::TcpListener,
    metrics: Arc<Metrics>,
) -> io::Result<JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    // One thread is plenty: every connection is a task, and rendering the metrics is the
    // only work (milliseconds).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => accept_loop(listener, metrics).await,
                    Err(e) => tracing::warn!("metrics listener: {e}"),
                }
            });
        })
}

async fn accept_loop(listener: tokio::net::TcpListener, metrics: Arc<Metrics>) {
    let places = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        // A place first: past the cap, new clients wait in the backlog (at most
        // CONNECTION_DEADLINE for one to free up).
        let Ok(place) = places.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, say: wait rather than spin.
                tracing::warn!("metrics listener accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| answer(req, metrics.clone()));
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(MAX_HEADER_BYTES)
                // One request per connection, closed after the answer (as before: probes and
                // scrapers open one each time).
                .keep_alive(false)
                // `Content-Type`, not `content-type`: what the server this replaced sent.
                .title_case_headers(true)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_DEADLINE, connection).await {
                Ok(Err(e)) => tracing::debug!("metrics client: {e}"),
                Err(_) => tracing::debug!("metrics client cut after {CONNECTION_DEADLINE:?}"),
                Ok(Ok(())) => {}
            }
            drop(place);
        });
    }
}

async fn answer(
    req: Request<Incoming>,
    metrics: Arc<Metrics>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path_and_query().map_or("", |p| p.as_str());
    let (status, content_type, body) = respond(&metrics, req.method().as_str(), path);
    let response = Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    fn serve() -> (SocketAddr, Arc<Metrics>) {
        let m = Arc::new(Metrics::new());
        m.health().tick();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        serve_metrics_on(listener, m.clone()).unwrap();
        (addr, m)
    }

    fn request(addr: SocketAddr, text: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(text).unwrap();
        let mut resp = Vec::new();
        let _ = s.read_to_end(&mut resp);
        String::from_utf8_lossy(&resp).into_owned()
    }

    fn probe(addr: SocketAddr) -> String {
        request(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    }

    /// Issue 20, defect 10: 40 clients dribbling a byte every 500 ms (more than the 32 the
    /// old server took at once) and probes are still answered at once.
    #[test]
    fn probes_are_answered_while_slow_clients_dribble() {
        let (addr, _m) = serve();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let slow: Vec<_> = (0..40)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut s = TcpStream::connect(addr).unwrap();
                    let mut sent = 0;
                    for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: ".iter().cycle() {
                        if stop.load(std::sync::atomic::Ordering::Relaxed)
                            || s.write_all(&[*byte]).is_err()
                        {
                            break;
                        }
                        sent += 1;
                        std::thread::sleep(Duration::from_millis(500));
                    }
                    sent
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1500));
        let mut slowest = Duration::ZERO;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            let t = Instant::now();
            let resp = probe(addr);
            slowest = slowest.max(t.elapsed());
            assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
            std::thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let sent: Vec<usize> = slow.into_iter().map(|t| t.join().unwrap()).collect();
        eprintln!(
            "40 dribbling clients: slowest probe {slowest:?}; bytes each sent before cut {sent:?}"
        );
        assert!(
            slowest < Duration::from_millis(500),
            "a probe took {slowest:?}"
        );
        // Each slow client was cut when its head was not whole after 3 s (6 bytes or so).
        assert!(
            sent.iter().all(|&n| n <= 10),
            "slow clients kept their connection: bytes sent {sent:?}"
        );
    }

    #[test]
    fn an_oversized_head_is_refused_with_431() {
        let (addr, _m) = serve();
        let big = format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(20 * 1024)
        );
        let resp = request(addr, big.as_bytes());
        assert!(resp.starts_with("HTTP/1.1 431"), "{resp:.200}");
        // Just under the limit is fine.
        let fits = format!(
            "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(12 * 1024)
        );
        assert!(request(addr, fits.as_bytes()).starts_with("HTTP/1.1 200"));
    }

    #[test]
    fn a_hundred_concurrent_clients_are_answered() {
        let (addr, _m) = serve();
        let start = Instant::now();
        let clients: Vec<_> = (0..100)
            .map(|i| {
                std::thread::spawn(move || {
                    let path = ["/metrics", "/healthz", "/readyz"][i % 3];
                    request(
                        addr,
                        format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
                    )
                })
            })
            .collect();
        let answered = clients.len();
        for client in clients {
            let resp = client.join().unwrap();
            assert!(
                resp.starts_with("HTTP/1.1 200") || resp.starts_with("HTTP/1.1 503"),
                "{resp}"
            );
        }
        eprintln!(
            "{answered} concurrent clients answered in {:?}",
            start.elapsed()
        );
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn head_other_methods_and_queries() {
        let (addr, _m) = serve();
        let head = request(addr, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(head.ends_with("\r\n\r\n"), "no body: {head}");
        let post = request(
            addr,
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        );
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let query = request(addr, b"GET /healthz?verbose HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(query.starts_with("HTTP/1.1 200"), "{query}");
    }
}
