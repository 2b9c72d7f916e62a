//! Following the kernel's changes to pod network namespaces as it reports them, instead of
//! reading every namespace again at the next tick.
//!
//! [`InterfaceWatch`] holds one rtnetlink socket per watched netns, created inside that netns
//! (a netlink socket belongs to the netns of the thread that creates it) and subscribed to the
//! link and address groups of both families. One thread polls them all; when a socket has
//! news, its netns is marked changed and the owner is told (a callback: the agent's loop wakes
//! and reads that netns again). The messages themselves are never trusted, only drained: they
//! say *that* something changed, the owner reads *what* over a fresh dump
//! ([`crate::discover`]). So a forged or garbled message can cost a read, never a wrong view.
//!
//! - No change is lost between the owner's read and the subscription: [`InterfaceWatch::watch`]
//!   binds the socket before it returns, and the owner reads the netns after it (the kernel
//!   queues what happens meanwhile in the socket).
//! - A socket whose buffer overran (`ENOBUFS`: the kernel dropped notifications) marks its
//!   netns changed: a lost notification is a full read, never ignored.
//! - A pod with `CAP_NET_ADMIN` in its netns can make the kernel notify as fast as it can change
//!   links: the owner is told at most once per [`MIN_GAP`] (changes meanwhile are merged into
//!   the next call), so a flapping interface costs a bounded number of reads.
//! - The socket is connected to the kernel (port 0): unicast datagrams from processes in the
//!   pod are refused by the kernel.
//! - A socket pins its netns (as the dataplane's open handles do): [`InterfaceWatch::unwatch`]
//!   when the pod goes.
//!
//! Until the owner has read the new state, the rules in place still name only the interfaces
//! known before; an interface netwarden does not know is rejected by them (SPEC 3.1), so the
//! time to the next read is an outage of that interface, never an opening.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::netns::{Netns, NetnsError, NetnsId};

/// rtnetlink multicast groups (`RTMGRP_*` of `linux/rtnetlink.h`): links, IPv4 and IPv6
/// addresses.
const RTMGRP_LINK: u32 = 0x1;
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
const RTMGRP_IPV6_IFADDR: u32 = 0x100;

/// The shortest time between two calls of the owner's callback.
pub const MIN_GAP: Duration = Duration::from_millis(50);
/// How long one poll waits before looking for sockets added meanwhile (their notifications
/// are queued in the socket until then: nothing is lost, only a little late).
const POLL_EVERY: Duration = Duration::from_millis(100);
/// Receive buffer of each socket: room for a burst of notifications (a link with its
/// addresses is a few hundred bytes).
const RECEIVE_BUFFER: usize = 256 << 10;

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("{}: rtnetlink notification socket ({step}): {source}", path.display())]
    Socket {
        path: PathBuf,
        step: &'static str,
        #[source]
        source: io::Error,
    },
}

/// One watched netns.
struct Watched {
    id: NetnsId,
    socket: Arc<Socket>,
}

struct Shared {
    watched: Mutex<HashMap<PathBuf, Watched>>,
    changed: Mutex<BTreeSet<PathBuf>>,
    notify: Box<dyn Fn() + Send + Sync>,
    stop: AtomicBool,
    /// Notifications drained, and overruns seen (for metrics and tests).
    messages: AtomicU64,
    overruns: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The interface and address changes of a set of network namespaces (see the module doc).
pub struct InterfaceWatch {
    shared: Arc<Shared>,
    poller: Option<std::thread::JoinHandle<()>>,
}

impl InterfaceWatch {
    /// Starts the polling thread; `notify` is called (from it) when a watched netns changed.
    pub fn start(notify: impl Fn() + Send + Sync + 'static) -> io::Result<InterfaceWatch> {
        let shared = Arc::new(Shared {
            watched: Mutex::new(HashMap::new()),
            changed: Mutex::new(BTreeSet::new()),
            notify: Box::new(notify),
            stop: AtomicBool::new(false),
            messages: AtomicU64::new(0),
            overruns: AtomicU64::new(0),
        });
        let poller = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("netns-watch".into())
                .spawn(move || poll_loop(&shared))?
        };
        Ok(InterfaceWatch {
            shared,
            poller: Some(poller),
        })
    }

    /// Watches the netns `netns` is a handle of (under its path). Watching a path again whose
    /// namespace is the same does nothing; a path that now names another namespace (a
    /// recreated sandbox) is watched anew. Returns once subscribed: read the netns after it.
    pub fn watch(&self, netns: &Netns) -> Result<(), WatchError> {
        let path = netns.path().to_path_buf();
        if lock(&self.shared.watched)
            .get(&path)
            .is_some_and(|w| w.id == netns.id())
        {
            return Ok(());
        }
        let socket_path = path.clone();
        let socket = netns.run(move || subscribe(&socket_path))??;
        lock(&self.shared.watched).insert(
            path,
            Watched {
                id: netns.id(),
                socket: Arc::new(socket),
            },
        );
        Ok(())
    }

    /// Stops watching `path` (its pod is gone): its socket is closed, which lets its netns go.
    pub fn unwatch(&self, path: &Path) {
        lock(&self.shared.watched).remove(path);
        lock(&self.shared.changed).remove(path);
    }

    /// The paths watched now.
    pub fn paths(&self) -> Vec<PathBuf> {
        lock(&self.shared.watched).keys().cloned().collect()
    }

    /// The watched netns that changed since the last call.
    pub fn take_changed(&self) -> BTreeSet<PathBuf> {
        std::mem::take(&mut *lock(&self.shared.changed))
    }

    /// Notifications drained so far, and buffer overruns among them.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.shared.messages.load(Ordering::Relaxed),
            self.shared.overruns.load(Ordering::Relaxed),
        )
    }
}

impl Drop for InterfaceWatch {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(poller) = self.poller.take() {
            let _ = poller.join();
        }
    }
}

/// A socket subscribed to the link and address groups of the calling thread's netns.
fn subscribe(path: &Path) -> Result<Socket, WatchError> {
    let err = |step| {
        move |source| WatchError::Socket {
            path: path.to_path_buf(),
            step,
            source,
        }
    };
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(err("socket"))?;
    socket
        .bind(&SocketAddr::new(
            0,
            RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR,
        ))
        .map_err(err("bind"))?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(err("connect"))?;
    socket.set_non_blocking(true).map_err(err("non-blocking"))?;
    nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBuf, &RECEIVE_BUFFER)
        .map_err(|e| err("SO_RCVBUF")(io::Error::from(e)))?;
    Ok(socket)
}

fn poll_loop(shared: &Shared) {
    let mut buffer = vec![0u8; 64 << 10];
    let mut last_notified: Option<Instant> = None;
    let mut pending = false;
    while !shared.stop.load(Ordering::Relaxed) {
        // The sockets are taken out of the lock for the wait: watch/unwatch never wait for
        // a poll, and a socket unwatched meanwhile lives until this round ends.
        let sockets: Vec<(PathBuf, Arc<Socket>)> = lock(&shared.watched)
            .iter()
            .map(|(path, w)| (path.clone(), w.socket.clone()))
            .collect();
        let wait = match (pending, last_notified) {
            (true, Some(at)) => MIN_GAP.saturating_sub(at.elapsed()).min(POLL_EVERY),
            _ => POLL_EVERY,
        };
        if sockets.is_empty() {
            std::thread::sleep(wait);
        } else {
            let mut fds: Vec<PollFd<'_>> = sockets
                .iter()
                .map(|(_, s)| PollFd::new(s.as_fd(), PollFlags::POLLIN))
                .collect();
            let millis = u16::try_from(wait.as_millis()).unwrap_or(u16::MAX);
            match poll(&mut fds, PollTimeout::from(millis)) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!("polling the netns notification sockets failed: {e}");
                    std::thread::sleep(POLL_EVERY);
                    continue;
                }
            }
            let ready: Vec<bool> = fds
                .iter()
                .map(|fd| fd.revents().is_some_and(|r| !r.is_empty()))
                .collect();
            drop(fds);
            for ((path, socket), ready) in sockets.iter().zip(ready) {
                if ready && drain(socket, &mut buffer, shared) {
                    lock(&shared.changed).insert(path.clone());
                    pending = true;
                }
            }
        }
        if pending && last_notified.is_none_or(|at| at.elapsed() >= MIN_GAP) {
            pending = false;
            last_notified = Some(Instant::now());
            (shared.notify)();
        }
    }
}

/// Reads everything queued on `socket`; whether anything (or an overrun) was there.
fn drain(socket: &Socket, buffer: &mut [u8], shared: &Shared) -> bool {
    let mut any = false;
    loop {
        match socket.recv(&mut &mut buffer[..], 0) {
            Ok(0) => return any,
            Ok(_) => {
                shared.messages.fetch_add(1, Ordering::Relaxed);
                any = true;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return any,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // The kernel dropped notifications for want of room: whatever they said, the
            // netns is read again in full.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                shared.overruns.fetch_add(1, Ordering::Relaxed);
                any = true;
            }
            Err(e) => {
                tracing::warn!("netns notification socket: {e}");
                return true;
            }
        }
    }
}
