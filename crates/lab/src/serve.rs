//! The listeners that answer probes inside every pod netns.
//!
//! A socket belongs to the netns it was created in, so one thread enters each pod netns in turn
//! and creates that pod's sockets there; afterwards a single ordinary thread serves all of them
//! with `poll(2)`, however many pods there are. Each socket is bound to the wildcard `[::]` with
//! `IPV6_V6ONLY` off, so one socket answers IPv4 and IPv6 (plain `0.0.0.0` if the kernel has no
//! IPv6). TCP: accept, write one byte, close. UDP: echo every datagram to its sender.

use std::io::{ErrorKind, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use netwarden_dataplane::Netns;
use netwarden_engine::model::Protocol;
use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags};
use nix::sys::socket::{
    bind, listen, setsockopt, socket, sockopt, AddressFamily, Backlog, SockFlag, SockType,
    SockaddrStorage,
};

use crate::LabError;

pub(crate) enum Listener {
    Tcp(TcpListener),
    Udp(UdpSocket),
}

impl Listener {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Udp(s) => s.as_fd(),
        }
    }
}

/// Creates one listener per port in the **current thread's** netns.
pub(crate) fn listen_all(
    ports: &[(u16, Protocol)],
) -> Result<Vec<Listener>, (u16, Protocol, Errno)> {
    ports
        .iter()
        .map(|&(port, protocol)| {
            let fd = match bind_wildcard(port, protocol, true) {
                Err(Errno::EAFNOSUPPORT) => bind_wildcard(port, protocol, false),
                other => other,
            }
            .map_err(|e| (port, protocol, e))?;
            Ok(match protocol {
                Protocol::Tcp => Listener::Tcp(TcpListener::from(fd)),
                _ => Listener::Udp(UdpSocket::from(fd)),
            })
        })
        .collect()
}

fn bind_wildcard(port: u16, protocol: Protocol, v6: bool) -> Result<OwnedFd, Errno> {
    let (family, addr) = if v6 {
        (
            AddressFamily::Inet6,
            SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)),
        )
    } else {
        (
            AddressFamily::Inet,
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)),
        )
    };
    let kind = if protocol == Protocol::Tcp {
        SockType::Stream
    } else {
        SockType::Datagram
    };
    let fd = socket(
        family,
        kind,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    if v6 {
        // Dual stack whatever net.ipv6.bindv6only says in this netns.
        setsockopt(&fd, sockopt::Ipv6V6Only, &false)?;
    }
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
    if protocol == Protocol::Tcp {
        listen(&fd, Backlog::new(1024).unwrap_or(Backlog::MAXCONN))?;
    }
    Ok(fd)
}

/// Creates the listeners of every pod: one thread visits the pods' netns in turn.
pub(crate) fn listen_in_pods(
    pods: Vec<(String, Arc<Netns>)>,
    ports: Vec<(u16, Protocol)>,
) -> Result<Vec<Listener>, LabError> {
    if ports.is_empty() {
        return Ok(Vec::new());
    }
    let handle = std::thread::Builder::new()
        .name("lab-listen".into())
        .spawn(move || {
            let mut all = Vec::new();
            for (name, netns) in &pods {
                netns.enter_current_thread()?;
                let listeners =
                    listen_all(&ports).map_err(|(port, protocol, errno)| LabError::Listen {
                        netns: name.clone(),
                        port,
                        protocol,
                        source: errno,
                    })?;
                all.extend(listeners);
            }
            Ok(all)
        })
        .map_err(LabError::Thread)?;
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// The thread answering on every listener until stopped.
pub(crate) struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    pub fn start(listeners: Vec<Listener>) -> Result<Server, LabError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("lab-serve".into())
            .spawn(move || serve(listeners, &flag))
            .map_err(LabError::Thread)?;
        Ok(Server {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread and closes every socket (they hold references on the pod netns, which
    /// would otherwise outlive `ip netns del`).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How often the serving thread looks at its stop flag.
const STOP_POLL_MS: u16 = 50;

fn serve(listeners: Vec<Listener>, stop: &AtomicBool) {
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::SeqCst) {
        let ready: Vec<usize> = {
            let mut fds: Vec<PollFd> = listeners
                .iter()
                .map(|l| PollFd::new(l.fd(), PollFlags::POLLIN))
                .collect();
            match poll(&mut fds, STOP_POLL_MS) {
                Ok(0) | Err(Errno::EINTR) => continue,
                Ok(_) => {}
                Err(_) => {
                    std::thread::sleep(std::time::Duration::from_millis(STOP_POLL_MS.into()));
                    continue;
                }
            }
            fds.iter()
                .enumerate()
                .filter(|(_, fd)| fd.revents().is_some_and(|r| !r.is_empty()))
                .map(|(i, _)| i)
                .collect()
        };
        for i in ready {
            match &listeners[i] {
                Listener::Tcp(listener) => {
                    while let Ok((mut stream, _)) = listener.accept() {
                        // One byte tells a client that reads that it reached the listener.
                        let _ = stream.write(b"+");
                    }
                }
                Listener::Udp(socket) => {
                    // Bounded so that one busy socket cannot starve the others.
                    for _ in 0..1024 {
                        match socket.recv_from(&mut buf) {
                            Ok((n, peer)) => {
                                let _ = socket.send_to(&buf[..n], peer);
                            }
                            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                            // A queued ICMP error from an earlier reply: reading clears it.
                            Err(_) => continue,
                        }
                    }
                }
            }
        }
    }
}
