//! Real TCP/UDP probes between lab pods.
//!
//! A probe's socket is created in the source pod's netns: a bounded pool of threads (each one
//! spawned for this call and ending with it, so switching its netns is harmless) takes probes
//! sorted by source pod and `setns`es only when the source changes.
//!
//! TCP: non-blocking connect with a timeout. A reset (REJECT with tcp reset) fails the connect
//! with `ECONNREFUSED` at once: `Refused`; no answer: `Timeout`.
//! UDP: a connected socket sends a payload and waits for the echo; an ICMP port unreachable
//! comes back as `ECONNREFUSED` on the socket: `Refused`. A lost datagram is retried.
//!
//! A rule in the source netns's OUTPUT hook that discards a datagram makes `send` fail with
//! `EPERM` — for a REJECT and for a silent DROP alike. That error alone proves nothing: the
//! probe keeps waiting, and only the ICMP port unreachable a REJECT sends back to the socket
//! (`ECONNREFUSED`) makes it `Refused`; after a DROP nothing comes: `Timeout`. (TCP needs no
//! such care: the kernel ignores the local error of a SYN and waits for the REJECT's reset.)

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use netwarden_dataplane::Netns;
use netwarden_engine::model::{PodKey, Protocol};
use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    bind, connect, getsockopt, recv, send, socket, sockopt, AddressFamily, MsgFlags, SockFlag,
    SockType, SockaddrStorage,
};
use serde::Serialize;

/// One connection attempt to make.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ProbeSpec {
    pub from: PodKey,
    /// The destination pod (for the caller's bookkeeping; the probe dials `dst_ip`).
    pub to: PodKey,
    /// Source address to bind, e.g. to pick the interface of a secondary network.
    pub src_ip: Option<IpAddr>,
    pub dst_ip: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", content = "message", rename_all = "lowercase")]
pub enum ProbeDetail {
    Connected,
    /// TCP reset or ICMP port unreachable: what netwarden's REJECT produces.
    Refused,
    /// No answer within the timeout (dropped, or nothing routes back).
    Timeout,
    /// ICMP host/network unreachable or no route.
    Unreachable,
    /// The probe could not be made (unknown pod, bad source address, unsupported protocol...).
    Error(String),
}

impl std::fmt::Display for ProbeDetail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeDetail::Connected => f.write_str("connected"),
            ProbeDetail::Refused => f.write_str("refused"),
            ProbeDetail::Timeout => f.write_str("timeout"),
            ProbeDetail::Unreachable => f.write_str("unreachable"),
            ProbeDetail::Error(e) => write!(f, "error: {e}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProbeOutcome {
    pub spec: ProbeSpec,
    pub connected: bool,
    pub detail: ProbeDetail,
    #[serde(rename = "elapsed_ms", serialize_with = "as_millis")]
    pub elapsed: Duration,
}

fn as_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// Timeouts and parallelism of [`crate::Lab::probe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeConfig {
    pub tcp_timeout: Duration,
    /// Wait for one UDP echo; a probe waits at most `udp_timeout * udp_attempts`.
    pub udp_timeout: Duration,
    pub udp_attempts: u32,
    pub threads: usize,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            tcp_timeout: Duration::from_millis(1500),
            udp_timeout: Duration::from_millis(1000),
            udp_attempts: 2,
            threads: 32,
        }
    }
}

/// Runs `probes` from the netns in `sources`; outcomes come back in the order of `probes`.
pub(crate) fn run(
    sources: &BTreeMap<PodKey, &Netns>,
    probes: &[ProbeSpec],
    config: &ProbeConfig,
) -> Vec<ProbeOutcome> {
    let mut order: Vec<usize> = (0..probes.len()).collect();
    order.sort_by(|&a, &b| probes[a].from.cmp(&probes[b].from));
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<ProbeOutcome>>> = Mutex::new(vec![None; probes.len()]);
    let workers = config.threads.clamp(1, probes.len().max(1));

    std::thread::scope(|scope| {
        for _ in 0..workers {
            let spawned = std::thread::Builder::new()
                .name("lab-probe".into())
                .stack_size(256 * 1024)
                .spawn_scoped(scope, || {
                    let mut current: Option<&PodKey> = None;
                    loop {
                        let k = next.fetch_add(1, Ordering::SeqCst);
                        let Some(&i) = order.get(k) else { break };
                        let spec = &probes[i];
                        let start = Instant::now();
                        let detail = match sources.get(&spec.from) {
                            None => {
                                ProbeDetail::Error(format!("no lab netns for pod {}", spec.from))
                            }
                            Some(netns) if current != Some(&spec.from) => {
                                match netns.enter_current_thread() {
                                    Ok(()) => {
                                        current = Some(&spec.from);
                                        probe_here(spec, config)
                                    }
                                    Err(e) => {
                                        current = None;
                                        ProbeDetail::Error(e.to_string())
                                    }
                                }
                            }
                            Some(_) => probe_here(spec, config),
                        };
                        let outcome = ProbeOutcome {
                            spec: spec.clone(),
                            connected: detail == ProbeDetail::Connected,
                            detail,
                            elapsed: start.elapsed(),
                        };
                        results.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(outcome);
                    }
                });
            // Fewer threads than asked (resource limits) only makes probing slower.
            if spawned.is_err() {
                break;
            }
        }
    });

    results
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .zip(probes)
        .map(|(outcome, spec)| {
            outcome.unwrap_or_else(|| ProbeOutcome {
                spec: spec.clone(),
                connected: false,
                detail: ProbeDetail::Error("no probe thread could be started".into()),
                elapsed: Duration::ZERO,
            })
        })
        .collect()
}

/// Makes one probe from the current thread's netns.
pub(crate) fn probe_here(spec: &ProbeSpec, config: &ProbeConfig) -> ProbeDetail {
    let result = match spec.protocol {
        Protocol::Tcp => probe_tcp(spec, config.tcp_timeout),
        Protocol::Udp => probe_udp(spec, config.udp_timeout, config.udp_attempts.max(1)),
        Protocol::Sctp => {
            return crate::sctp::probe(spec, config.udp_timeout, config.udp_attempts.max(1))
        }
    };
    result.unwrap_or_else(|(what, errno)| classify(what, errno))
}

type Step<T> = Result<T, (&'static str, Errno)>;

fn classify(what: &'static str, errno: Errno) -> ProbeDetail {
    match errno {
        Errno::ECONNREFUSED => ProbeDetail::Refused,
        Errno::EHOSTUNREACH | Errno::ENETUNREACH => ProbeDetail::Unreachable,
        Errno::ETIMEDOUT => ProbeDetail::Timeout,
        other => ProbeDetail::Error(format!("{what}: {}", other.desc())),
    }
}

fn open_socket(spec: &ProbeSpec, kind: SockType) -> Step<OwnedFd> {
    let family = if spec.dst_ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket(
        family,
        kind,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| ("socket", e))?;
    if let Some(src) = spec.src_ip {
        bind(
            fd.as_raw_fd(),
            &SockaddrStorage::from(SocketAddr::new(src, 0)),
        )
        .map_err(|e| ("bind source address", e))?;
    }
    Ok(fd)
}

/// Waits until `fd` reports `events` (or an error) or `deadline` passes; false on timeout.
fn wait(fd: &OwnedFd, events: PollFlags, deadline: Instant) -> Step<bool> {
    use std::os::fd::AsFd;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let timeout =
            PollTimeout::try_from(left.max(Duration::from_millis(1))).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(fd.as_fd(), events)];
        match poll(&mut fds, timeout) {
            Ok(0) => continue,
            Ok(_) => return Ok(true),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(("poll", e)),
        }
    }
}

fn probe_tcp(spec: &ProbeSpec, timeout: Duration) -> Step<ProbeDetail> {
    let deadline = Instant::now() + timeout;
    let fd = open_socket(spec, SockType::Stream)?;
    let dst = SockaddrStorage::from(SocketAddr::new(spec.dst_ip, spec.port));
    match connect(fd.as_raw_fd(), &dst) {
        Ok(()) => return Ok(ProbeDetail::Connected),
        Err(Errno::EINPROGRESS) => {}
        Err(e) => return Err(("connect", e)),
    }
    if !wait(&fd, PollFlags::POLLOUT, deadline)? {
        return Ok(ProbeDetail::Timeout);
    }
    match getsockopt(&fd, sockopt::SocketError).map_err(|e| ("getsockopt", e))? {
        0 => Ok(ProbeDetail::Connected),
        errno => Err(("connect", Errno::from_raw(errno))),
    }
}

fn probe_udp(spec: &ProbeSpec, timeout: Duration, attempts: u32) -> Step<ProbeDetail> {
    let fd = open_socket(spec, SockType::Datagram)?;
    let dst = SockaddrStorage::from(SocketAddr::new(spec.dst_ip, spec.port));
    connect(fd.as_raw_fd(), &dst).map_err(|e| ("connect", e))?;
    let payload = format!("netwarden-lab probe {}:{}", spec.dst_ip, spec.port);
    let mut buf = [0u8; 512];
    for _ in 0..attempts {
        match send(fd.as_raw_fd(), payload.as_bytes(), MsgFlags::empty()) {
            // Discarded in this netns's OUTPUT hook: wait for the refusal a REJECT sends back.
            Ok(_) | Err(Errno::EPERM) => {}
            Err(e) => return Err(("send", e)),
        }
        let deadline = Instant::now() + timeout;
        while wait(&fd, PollFlags::POLLIN, deadline)? {
            match recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                // The socket is connected: only the destination's datagrams arrive here.
                Ok(n) if &buf[..n] == payload.as_bytes() => return Ok(ProbeDetail::Connected),
                Ok(_) | Err(Errno::EAGAIN) => continue,
                Err(e) => return Err(("recv", e)),
            }
        }
    }
    Ok(ProbeDetail::Timeout)
}
