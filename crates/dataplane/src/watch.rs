//! Following the kernel's changes to pod network namespaces as it reports them, instead of
//! reading every namespace again at the next tick.
//!
//! One machinery ([`Watch`]: a socket per netns, one polling thread, a callback) serves two
//! listeners: [`Links`] ([`InterfaceWatch`]: interfaces and addresses, for placement) and
//! [`Rules`] ([`RulesWatch`]: nf_tables changes, for tamper repair; see [`Rules`]).
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use netlink_packet_core::{NetlinkBuffer, NlasIterator};
use netlink_sys::{
    protocols::{NETLINK_NETFILTER, NETLINK_ROUTE},
    Socket, SocketAddr,
};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::netns::{Netns, NetnsError, NetnsId};

/// rtnetlink multicast groups (`RTMGRP_*` of `linux/rtnetlink.h`): links, IPv4 and IPv6
/// addresses.
const RTMGRP_LINK: u32 = 0x1;
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
const RTMGRP_IPV6_IFADDR: u32 = 0x100;

/// The shortest time between two calls of the owner's callback, for interface changes
/// ([`Listen::MIN_GAP`] of [`Links`]).
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
    #[error("{}: {what} notification socket ({step}): {source}", path.display())]
    Socket {
        path: PathBuf,
        what: &'static str,
        step: &'static str,
        #[source]
        source: io::Error,
    },
}

/// What a [`Watch`] subscribes to in each netns and makes of what the kernel sends there.
pub trait Listen: Send + Sync + 'static {
    /// What is gathered per netns between two takes.
    type News: Default + Send + 'static;
    /// For errors: which notifications.
    const WHAT: &'static str;
    /// The netlink protocol and multicast groups (a bind mask) of the socket.
    const PROTOCOL: isize;
    const GROUPS: u32;
    /// The shortest time between two calls of the owner's callback (see the module doc).
    const MIN_GAP: Duration;
    /// Reads one datagram of notifications into `news`; whether the owner must be told.
    fn read(&self, datagram: &[u8], news: &mut Self::News) -> bool;
    /// The kernel dropped notifications for want of room: `news` must say so.
    fn overrun(&self, news: &mut Self::News);
}

/// One watched netns.
struct Watched {
    id: NetnsId,
    socket: Arc<Socket>,
}

struct Shared<L: Listen> {
    listen: L,
    watched: Mutex<HashMap<PathBuf, Watched>>,
    changed: Mutex<BTreeMap<PathBuf, L::News>>,
    notify: Box<dyn Fn() + Send + Sync>,
    stop: AtomicBool,
    /// Notifications drained, and overruns seen (for metrics and tests).
    messages: AtomicU64,
    overruns: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The notifications of a set of network namespaces, read by `L` (see the module doc).
pub struct Watch<L: Listen> {
    shared: Arc<Shared<L>>,
    poller: Option<std::thread::JoinHandle<()>>,
}

/// Interface and address changes.
pub type InterfaceWatch = Watch<Links>;
/// nf_tables changes.
pub type RulesWatch = Watch<Rules>;

impl InterfaceWatch {
    /// Starts the polling thread; `notify` is called (from it) when a watched netns changed.
    pub fn start(notify: impl Fn() + Send + Sync + 'static) -> io::Result<InterfaceWatch> {
        Watch::start_with(Links, notify)
    }

    /// The watched netns that changed since the last call.
    pub fn take_changed(&self) -> BTreeSet<PathBuf> {
        self.take_news().into_keys().collect()
    }
}

impl<L: Listen> Watch<L> {
    /// Starts the polling thread of `listen`; `notify` is called (from it) when a watched
    /// netns has news.
    pub fn start_with(listen: L, notify: impl Fn() + Send + Sync + 'static) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            listen,
            watched: Mutex::new(HashMap::new()),
            changed: Mutex::new(BTreeMap::new()),
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
        Ok(Watch {
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
        let socket = netns.run(move || subscribe::<L>(&socket_path))??;
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

    /// The watched netns with news since the last call, with their news.
    pub fn take_news(&self) -> BTreeMap<PathBuf, L::News> {
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

impl<L: Listen> Drop for Watch<L> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(poller) = self.poller.take() {
            let _ = poller.join();
        }
    }
}

/// A socket subscribed to `L`'s groups in the calling thread's netns.
fn subscribe<L: Listen>(path: &Path) -> Result<Socket, WatchError> {
    let err = |step| {
        move |source| WatchError::Socket {
            path: path.to_path_buf(),
            what: L::WHAT,
            step,
            source,
        }
    };
    let mut socket = Socket::new(L::PROTOCOL).map_err(err("socket"))?;
    socket
        .bind(&SocketAddr::new(0, L::GROUPS))
        .map_err(err("bind"))?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(err("connect"))?;
    socket.set_non_blocking(true).map_err(err("non-blocking"))?;
    nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBuf, &RECEIVE_BUFFER)
        .map_err(|e| err("SO_RCVBUF")(io::Error::from(e)))?;
    Ok(socket)
}

/// Interfaces and addresses (rtnetlink): the messages are never trusted, only drained — they
/// say *that* a netns changed; the owner reads *what* over a fresh dump.
pub struct Links;

impl Listen for Links {
    type News = ();
    const WHAT: &'static str = "rtnetlink";
    const PROTOCOL: isize = NETLINK_ROUTE;
    const GROUPS: u32 = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
    const MIN_GAP: Duration = MIN_GAP;

    fn read(&self, _datagram: &[u8], _news: &mut ()) -> bool {
        true
    }

    fn overrun(&self, _news: &mut ()) {}
}

/// nf_tables changes (tamper repair, SPEC 5): one `NETLINK_NETFILTER` socket per netns in the
/// `NFNLGRP_NFTABLES` group, which the kernel tells of every committed change to any table of
/// that netns — also those made by `iptables-nft`, whose filter tables are nf_tables tables.
///
/// Unlike [`Links`], the messages are read, but only to decide *what to compare*, never what
/// the kernel holds: a change to one of the `tables` marks its objects and rules for
/// comparison; a set element added or removed marks that set's elements (unless the set was
/// created in the same transaction: its elements came with it, and if it existed before,
/// someone's elements went into an existing set, which is compared). Changes to other tables
/// (the pod's own) are not ours. A message that cannot be read, or an overrun, marks
/// everything. The agent's own applies are notified like anyone's: the comparison that
/// follows finds nothing, which is what tells them apart.
pub struct Rules {
    /// The tables whose changes matter, as (nfproto family, name): `(1, "netwarden")` (inet)
    /// for the nft backend; `(2, "filter")` and `(10, "filter")` for iptables-nft. A name
    /// matches its variants `NAME_…` too: netwarden's table moves to one in a netns where a pod
    /// holds a table of its name (see `nft_apply`).
    pub tables: Vec<(u8, String)>,
}

impl Rules {
    /// Whether changes to table `name` of `family` matter.
    fn watches(&self, family: u8, name: &str) -> bool {
        self.tables.iter().any(|(f, t)| {
            *f == family
                && name
                    .strip_prefix(t.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('_'))
        })
    }
}

/// What a netns's notifications asked to compare since the owner last took them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RulesNews {
    pub scope: crate::tamper::VerifyScope,
    /// Sets created by the transaction being read (until its `NEWGEN`).
    created: BTreeSet<String>,
}

/// `NFNL_SUBSYS_NFTABLES` and the message kinds of `linux/netfilter/nf_tables.h` used here.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_DESTROYSETELEM: u16 = 30;
/// `NFNLGRP_NFTABLES` (7) as a bind mask.
const NFNLGRP_NFTABLES_MASK: u32 = 1 << (7 - 1);
/// Attribute 1 of every table-scoped message is the table's name; attribute 2 of set and
/// set element messages is the set's.
const ATTR_TABLE: u16 = 1;
const ATTR_SET: u16 = 2;

impl Listen for Rules {
    type News = RulesNews;
    const WHAT: &'static str = "nf_tables";
    const PROTOCOL: isize = NETLINK_NETFILTER;
    const GROUPS: u32 = NFNLGRP_NFTABLES_MASK;
    /// Short: each notification may be a tamper the agent repairs at once (it paces the
    /// repairs of one netns itself, 10 ms apart at least); this only bounds the wake-ups.
    const MIN_GAP: Duration = Duration::from_millis(5);

    fn read(&self, datagram: &[u8], news: &mut RulesNews) -> bool {
        let mut tell = false;
        let mut offset = 0;
        while offset < datagram.len() {
            let Ok(message) = NetlinkBuffer::new_checked(&datagram[offset..]) else {
                self.overrun(news);
                return true;
            };
            let length = message.length() as usize;
            match self.message(message.message_type(), message.payload(), news) {
                Some(matters) => tell |= matters,
                None => {
                    self.overrun(news);
                    return true;
                }
            }
            // Messages are 4-byte aligned in a datagram.
            offset += (length + 3) & !3;
        }
        tell
    }

    fn overrun(&self, news: &mut RulesNews) {
        news.scope.all = true;
    }
}

impl Rules {
    /// One message; whether it matters (`None`: unreadable).
    fn message(&self, kind: u16, payload: &[u8], news: &mut RulesNews) -> Option<bool> {
        if kind >> 8 != NFNL_SUBSYS_NFTABLES {
            // Not an nf_tables message (the socket hears only its group: a done or error).
            return Some(false);
        }
        let msg = kind & 0xff;
        if msg == NFT_MSG_NEWGEN {
            news.created.clear();
            return Some(false);
        }
        let family = *payload.first()?;
        let attrs = payload.get(4..)?;
        let mut table = None;
        let mut set = None;
        for nla in NlasIterator::new(attrs) {
            let nla = nla.ok()?;
            let value = nla.value();
            let text = || {
                std::str::from_utf8(value.strip_suffix(&[0]).unwrap_or(value))
                    .ok()
                    .map(str::to_string)
            };
            match nla.kind() {
                ATTR_TABLE => table = Some(text()?),
                ATTR_SET => set = text(),
                _ => {}
            }
        }
        let Some(table) = table else {
            // Every table-scoped message names its table: one that does not is unknown.
            return None;
        };
        if !self.watches(family, &table) {
            return Some(false);
        }
        match (msg, set) {
            (NFT_MSG_NEWSET, Some(set)) => {
                news.created.insert(set);
                news.scope.rules = true;
            }
            (NFT_MSG_NEWSETELEM, Some(set)) if news.created.contains(&set) => {}
            (NFT_MSG_NEWSETELEM | NFT_MSG_DELSETELEM | NFT_MSG_DESTROYSETELEM, Some(set)) => {
                news.scope.sets.insert(set);
            }
            _ => news.scope.rules = true,
        }
        Some(true)
    }
}

fn poll_loop<L: Listen>(shared: &Shared<L>) {
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
            (true, Some(at)) => L::MIN_GAP.saturating_sub(at.elapsed()).min(POLL_EVERY),
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
                if ready && drain(path, socket, &mut buffer, shared) {
                    pending = true;
                }
            }
        }
        if pending && last_notified.is_none_or(|at| at.elapsed() >= L::MIN_GAP) {
            pending = false;
            last_notified = Some(Instant::now());
            (shared.notify)();
        }
    }
}

/// Reads everything queued on `socket` into the news of `path`; whether the owner must be
/// told.
fn drain<L: Listen>(path: &Path, socket: &Socket, buffer: &mut [u8], shared: &Shared<L>) -> bool {
    let news = |f: &mut dyn FnMut(&L, &mut L::News) -> bool| -> bool {
        let mut changed = lock(&shared.changed);
        f(
            &shared.listen,
            changed.entry(path.to_path_buf()).or_default(),
        )
    };
    let mut tell = false;
    loop {
        match socket.recv(&mut &mut buffer[..], 0) {
            Ok(0) => return tell,
            Ok(n) => {
                shared.messages.fetch_add(1, Ordering::Relaxed);
                tell |= news(&mut |listen, news| listen.read(&buffer[..n], news));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return tell,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // The kernel dropped notifications for want of room: whatever they said, the
            // listener treats the netns as changed in every way.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                shared.overruns.fetch_add(1, Ordering::Relaxed);
                news(&mut |listen, news| {
                    listen.overrun(news);
                    true
                });
                tell = true;
            }
            Err(e) => {
                tracing::warn!("netns notification socket: {e}");
                news(&mut |listen, news| {
                    listen.overrun(news);
                    true
                });
                return true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One nf_tables notification: `msg` on table `table` of `family`, naming `set`.
    fn message(msg: u16, family: u8, table: &str, set: Option<&str>) -> Vec<u8> {
        let mut attrs = Vec::new();
        let mut attr = |kind: u16, text: &str| {
            let value: Vec<u8> = text.bytes().chain([0]).collect();
            let len = 4 + value.len();
            attrs.extend((len as u16).to_ne_bytes());
            attrs.extend(kind.to_ne_bytes());
            attrs.extend(&value);
            attrs.resize((attrs.len() + 3) & !3, 0);
        };
        attr(ATTR_TABLE, table);
        if let Some(set) = set {
            attr(ATTR_SET, set);
        }
        let mut out = Vec::new();
        let len = 16 + 4 + attrs.len();
        out.extend((len as u32).to_ne_bytes());
        out.extend(((NFNL_SUBSYS_NFTABLES << 8) | msg).to_ne_bytes());
        out.extend([0u8; 10]);
        out.extend([family, 0, 0, 0]);
        out.extend(attrs);
        out
    }

    fn gen() -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(20u32.to_ne_bytes());
        out.extend(((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN).to_ne_bytes());
        out.extend([0u8; 10]);
        out.extend([0u8; 4]);
        out
    }

    fn nft() -> Rules {
        Rules {
            tables: vec![(1, "netwarden".into())],
        }
    }

    #[test]
    fn changes_to_our_table_mark_what_to_compare() {
        let rules = nft();
        let mut news = RulesNews::default();
        // The pod's own table: not ours.
        assert!(!rules.read(&message(6, 1, "mine", None), &mut news));
        assert!(!rules.read(&message(6, 2, "netwarden", None), &mut news));
        assert!(!rules.read(&message(6, 1, "netwardenx", None), &mut news));
        assert!(news.scope.is_empty());
        // Ours under another name (a pod holds "netwarden"): ours.
        assert!(rules.read(
            &message(6, 1, "netwarden_0123456789abcdef", None),
            &mut news
        ));
        let mut news = RulesNews::default();
        // A rule added to ours.
        assert!(rules.read(&message(6, 1, "netwarden", None), &mut news));
        assert!(news.scope.rules && news.scope.sets.is_empty());
        // An element removed from one of our sets, in one datagram with the generation.
        let mut datagram = message(14, 1, "netwarden", Some("p4_a"));
        datagram.extend(gen());
        let mut news = RulesNews::default();
        assert!(rules.read(&datagram, &mut news));
        assert_eq!(news.scope.sets, ["p4_a".to_string()].into());
        assert!(!news.scope.rules && !news.scope.all);
    }

    #[test]
    fn elements_of_a_set_created_in_the_same_transaction_are_not_compared() {
        let rules = nft();
        let mut news = RulesNews::default();
        let mut datagram = message(NFT_MSG_NEWSET, 1, "netwarden", Some("p4_new"));
        datagram.extend(message(NFT_MSG_NEWSETELEM, 1, "netwarden", Some("p4_new")));
        datagram.extend(gen());
        // An element added to that set by a later transaction is.
        datagram.extend(message(NFT_MSG_NEWSETELEM, 1, "netwarden", Some("p4_new")));
        assert!(rules.read(&datagram, &mut news));
        assert!(news.scope.rules);
        assert_eq!(news.scope.sets, ["p4_new".to_string()].into());
    }

    #[test]
    fn unreadable_messages_and_overruns_compare_everything() {
        let rules = nft();
        let mut news = RulesNews::default();
        assert!(rules.read(&[1, 2, 3], &mut news));
        assert!(news.scope.all);
        let mut news = RulesNews::default();
        let mut nameless = message(6, 1, "netwarden", None);
        nameless.truncate(20);
        nameless[..4].copy_from_slice(&20u32.to_ne_bytes());
        assert!(rules.read(&nameless, &mut news));
        assert!(news.scope.all);
        let mut news = RulesNews::default();
        rules.overrun(&mut news);
        assert!(news.scope.all);
    }
}
