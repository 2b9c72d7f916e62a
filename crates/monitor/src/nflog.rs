//! NFLOG listeners: one netlink socket per pod network namespace, all feeding one bounded queue.
//!
//! NFLOG groups are per network namespace, so the log rules in each pod netns deliver to a
//! socket created *in that netns*. A socket stays bound to the netns it was created in, so we
//! create it on a short-lived thread that entered the netns
//! ([`netwarden_dataplane::netns::run_in`]) and then serve it from an ordinary thread.
//!
//! The kernel side must never wait for us: records go into one bounded `sync_channel` with
//! `try_send`, and when the queue is full the record is dropped and counted. When the socket
//! buffer overflows the kernel drops whole batches and `recv` fails with ENOBUFS; we ask for
//! per-group sequence numbers (`NFULNL_CFG_F_SEQ`) so the gaps give the exact number of messages
//! lost. Memory is bounded by the queue length, one receive buffer per listener and the socket
//! buffer size, whatever the packet rate.
//!
//! A listener ends on its own when its netns goes away (the path is removed, or now names a
//! different namespace): holding the socket would otherwise keep a dead pod's netns alive.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use netwarden_dataplane::netns::{run_in, NetnsError, NetnsId};
use nix::errno::Errno;
use nix::sys::socket::{
    bind, recv, sendto, setsockopt, socket, sockopt, AddressFamily, MsgFlags, NetlinkAddr,
    SockFlag, SockProtocol, SockType,
};
use nix::sys::time::{TimeVal, TimeValLike};

use crate::event::PodContext;
use crate::metrics::Metrics;
use crate::nlmsg::{
    parse_netlink, MessageBuilder, NflogRecord, NlItem, MSG_CONFIG, NFULA_CFG_CMD, NFULA_CFG_FLAGS,
    NFULA_CFG_MODE, NFULA_CFG_QTHRESH, NFULA_CFG_TIMEOUT, NFULNL_CFG_CMD_BIND, NFULNL_CFG_F_SEQ,
    NFULNL_COPY_PACKET, NLM_F_ACK, NLM_F_REQUEST,
};
use crate::time::Timestamp;

/// The NFLOG group the rules log to by default.
pub const DEFAULT_GROUP: u16 = 100;

/// How a listener is set up.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    pub group: u16,
    /// Bytes of each packet copied to us: the IPv6 header with a few extension headers and
    /// the transport ports fit in 128.
    pub copy_range: u32,
    /// Socket receive buffer (SO_RCVBUFFORCE, falling back to SO_RCVBUF).
    pub rcvbuf: usize,
    /// The kernel sends a batch when this many packets are queued...
    pub queue_threshold: u32,
    /// ...or after this long.
    pub flush_timeout: Duration,
    /// How often a listener checks whether it should stop or its netns is gone.
    pub poll_interval: Duration,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig {
            group: DEFAULT_GROUP,
            copy_range: 128,
            rcvbuf: 1 << 20,
            queue_threshold: 16,
            flush_timeout: Duration::from_millis(100),
            poll_interval: Duration::from_millis(200),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NflogError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("cannot create the NFLOG netlink socket: {0}")]
    Socket(Errno),
    #[error("cannot configure the NFLOG socket ({what}): {errno}")]
    Setup { what: &'static str, errno: Errno },
    #[error("NFLOG group {group} is bound by another socket in this netns (or CAP_NET_ADMIN is missing)")]
    GroupBusy { group: u16 },
    #[error("the kernel refused NFLOG {what}: {errno}")]
    Kernel { what: &'static str, errno: Errno },
    #[error("no answer from the kernel to NFLOG {what}")]
    NoAck { what: &'static str },
    #[error("receiving from the NFLOG socket failed: {0}")]
    Recv(Errno),
    #[error("cannot start the listener thread: {0}")]
    Thread(std::io::Error),
    #[error("cannot inspect network namespace {path}: {source}")]
    NetnsPath { path: PathBuf, source: NetnsError },
}

/// What one `recv` gave.
#[derive(Debug)]
pub enum Received {
    Records(Vec<NflogRecord>),
    /// Nothing within the receive timeout.
    Timeout,
    /// ENOBUFS: the socket buffer overflowed and the kernel dropped messages.
    Overrun,
}

/// A bound NFLOG socket.
#[derive(Debug)]
pub struct NflogSocket {
    fd: OwnedFd,
    group: u16,
    seq: u32,
    buf: Vec<u8>,
    /// Records that arrived while we waited for a config acknowledgement.
    pending: Vec<NflogRecord>,
}

/// Large enough for any batch the kernel builds with the default `nlbufsiz`
/// (`NLMSG_GOODSIZE`) and for a single message of `copy_range` ≤ 64 KiB.
const RECV_BUFFER: usize = 64 * 1024 + 4096;
const ACK_TIMEOUT: Duration = Duration::from_secs(2);

fn new_socket() -> Result<OwnedFd, Errno> {
    socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkNetFilter,
    )
}

impl NflogSocket {
    /// Opens and binds a socket in the netns at `netns`, or in the caller's netns for `None`.
    pub fn open(netns: Option<&Path>, cfg: &ListenerConfig) -> Result<NflogSocket, NflogError> {
        let fd = match netns {
            Some(path) => run_in(path, new_socket)?,
            None => new_socket(),
        }
        .map_err(NflogError::Socket)?;
        let setup = |what| move |errno| NflogError::Setup { what, errno };
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(setup("bind"))?;
        // Forcing needs CAP_NET_ADMIN (the agent has it); otherwise net.core.rmem_max caps it.
        if setsockopt(&fd, sockopt::RcvBufForce, &cfg.rcvbuf).is_err() {
            setsockopt(&fd, sockopt::RcvBuf, &cfg.rcvbuf).map_err(setup("SO_RCVBUF"))?;
        }
        let poll = cfg.poll_interval.max(Duration::from_millis(10));
        setsockopt(
            &fd,
            sockopt::ReceiveTimeout,
            &TimeVal::milliseconds(poll.as_millis() as i64),
        )
        .map_err(setup("SO_RCVTIMEO"))?;
        let mut sock = NflogSocket {
            fd,
            group: cfg.group,
            seq: 0,
            buf: vec![0; RECV_BUFFER],
            pending: Vec::new(),
        };
        match sock.request("bind", |b| b.attr(NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND])) {
            // EPERM: an instance of another socket (port id) holds the group; EBUSY: a race
            // creating it.
            Err(NflogError::Kernel {
                errno: Errno::EPERM | Errno::EBUSY,
                ..
            }) => return Err(NflogError::GroupBusy { group: cfg.group }),
            other => other?,
        }
        let mut mode = cfg.copy_range.to_be_bytes().to_vec();
        mode.extend_from_slice(&[NFULNL_COPY_PACKET, 0]);
        let timeout_cs = u32::try_from(cfg.flush_timeout.as_millis() / 10).unwrap_or(u32::MAX);
        sock.request("config", |b| {
            b.attr(NFULA_CFG_MODE, &mode)
                .attr(NFULA_CFG_QTHRESH, &cfg.queue_threshold.max(1).to_be_bytes())
                .attr(NFULA_CFG_TIMEOUT, &timeout_cs.to_be_bytes())
                .attr(NFULA_CFG_FLAGS, &NFULNL_CFG_F_SEQ.to_be_bytes())
        })?;
        Ok(sock)
    }

    pub fn group(&self) -> u16 {
        self.group
    }

    /// Sends one config message and waits for its acknowledgement.
    fn request(
        &mut self,
        what: &'static str,
        attrs: impl FnOnce(MessageBuilder) -> MessageBuilder,
    ) -> Result<(), NflogError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        // AF_UNSPEC: the bind applies to every family (the inet table logs both).
        let msg = attrs(MessageBuilder::new(
            MSG_CONFIG,
            NLM_F_REQUEST | NLM_F_ACK,
            seq,
            0,
            self.group,
        ))
        .finish();
        sendto(
            self.fd.as_raw_fd(),
            &msg,
            &NetlinkAddr::new(0, 0),
            MsgFlags::empty(),
        )
        .map_err(|errno| NflogError::Setup {
            what: "send",
            errno,
        })?;
        let deadline = Instant::now() + ACK_TIMEOUT;
        while Instant::now() < deadline {
            let n = match recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::empty()) {
                Ok(n) => n,
                Err(Errno::EAGAIN | Errno::EINTR | Errno::ENOBUFS) => continue,
                Err(e) => return Err(NflogError::Recv(e)),
            };
            let Ok(items) = parse_netlink(&self.buf[..n]) else {
                continue;
            };
            for item in items {
                match item {
                    NlItem::Ack { seq: s, errno } if s == seq => {
                        return if errno == 0 {
                            Ok(())
                        } else {
                            Err(NflogError::Kernel {
                                what,
                                errno: Errno::from_raw(-errno),
                            })
                        };
                    }
                    NlItem::Packet(r) => self.pending.push(r),
                    _ => {}
                }
            }
        }
        Err(NflogError::NoAck { what })
    }

    /// Waits up to the poll interval for the next batch.
    pub fn recv(&mut self) -> Result<Received, NflogError> {
        if !self.pending.is_empty() {
            return Ok(Received::Records(std::mem::take(&mut self.pending)));
        }
        match recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::empty()) {
            Ok(n) => match parse_netlink(&self.buf[..n]) {
                Ok(items) => Ok(Received::Records(
                    items
                        .into_iter()
                        .filter_map(|i| match i {
                            NlItem::Packet(r) => Some(r),
                            _ => None,
                        })
                        .collect(),
                )),
                Err(e) => {
                    // Framing we cannot follow (should not happen with the kernel as peer):
                    // the batch is lost, the socket is still fine.
                    tracing::warn!("unparsable NFLOG message: {e}");
                    Ok(Received::Records(Vec::new()))
                }
            },
            Err(Errno::EAGAIN | Errno::EINTR) => Ok(Received::Timeout),
            Err(Errno::ENOBUFS) => Ok(Received::Overrun),
            Err(e) => Err(NflogError::Recv(e)),
        }
    }
}

/// A record as it leaves a listener.
#[derive(Debug, Clone)]
pub struct RawRecord {
    pub netns: Arc<Path>,
    /// The pod context current when the record was received.
    pub context: Arc<PodContext>,
    /// When we received it (events use the kernel timestamp when there is one).
    pub received: Timestamp,
    pub record: NflogRecord,
}

/// Why a listener thread ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenerExit {
    Stopped,
    /// The netns path disappeared or now names another namespace.
    NetnsGone,
    Failed(String),
}

struct ListenerHandle {
    stop: Arc<AtomicBool>,
    context: Arc<RwLock<Arc<PodContext>>>,
    identity: NetnsId,
    thread: JoinHandle<ListenerExit>,
}

/// What identifies the namespace behind a path (the dataplane's one identity type).
fn netns_identity(path: &Path) -> Result<NetnsId, NetnsError> {
    netwarden_dataplane::netns::netns_id(path)
}

/// Listeners for every managed netns, feeding one bounded queue.
pub struct Collector {
    config: ListenerConfig,
    metrics: Arc<Metrics>,
    tx: SyncSender<RawRecord>,
    listeners: HashMap<PathBuf, ListenerHandle>,
}

impl Collector {
    /// A collector whose listeners push into a queue of `queue_len` records; read them from the
    /// returned receiver.
    pub fn new(
        config: ListenerConfig,
        queue_len: usize,
        metrics: Arc<Metrics>,
    ) -> (Collector, Receiver<RawRecord>) {
        let (tx, rx) = sync_channel(queue_len.max(1));
        (
            Collector {
                config,
                metrics,
                tx,
                listeners: HashMap::new(),
            },
            rx,
        )
    }

    /// Starts listening in `netns` for the pod of `context`. If a listener is already running
    /// there, only its context is replaced (the pod's rules changed).
    pub fn open(&mut self, netns: &Path, context: PodContext) -> Result<(), NflogError> {
        let identity = netns_identity(netns).map_err(|source| NflogError::NetnsPath {
            path: netns.to_owned(),
            source,
        })?;
        if let Some(h) = self.listeners.get(netns) {
            // Same path, same namespace, still running: the pod's rules changed.
            if h.identity == identity && !h.thread.is_finished() {
                *h.context.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(context);
                return Ok(());
            }
        }
        // Ended, or the path now names another namespace (pod recreated): start afresh.
        if let Some(old) = self.listeners.remove(netns) {
            old.stop.store(true, Ordering::Relaxed);
            join(old.thread);
        }
        let sock = NflogSocket::open(Some(netns), &self.config)?;
        let stop = Arc::new(AtomicBool::new(false));
        let context = Arc::new(RwLock::new(Arc::new(context)));
        let listener = Listener {
            sock,
            path: Arc::from(netns),
            identity,
            poll: self.config.poll_interval,
            stop: stop.clone(),
            context: context.clone(),
            tx: self.tx.clone(),
            metrics: self.metrics.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("nflog".into())
            .stack_size(256 * 1024)
            .spawn(move || listener.run())
            .map_err(NflogError::Thread)?;
        self.listeners.insert(
            netns.to_owned(),
            ListenerHandle {
                stop,
                context,
                identity,
                thread,
            },
        );
        Ok(())
    }

    /// Replaces the pod context of a running listener; false when there is none.
    pub fn set_context(&self, netns: &Path, context: PodContext) -> bool {
        match self.listeners.get(netns) {
            Some(h) => {
                *h.context.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(context);
                true
            }
            None => false,
        }
    }

    /// Stops the listener of `netns` (waits up to one poll interval). Returns how it ended, or
    /// `None` when there was none.
    pub fn close(&mut self, netns: &Path) -> Option<ListenerExit> {
        let h = self.listeners.remove(netns)?;
        h.stop.store(true, Ordering::Relaxed);
        Some(join(h.thread))
    }

    /// Stops every listener (in parallel: all are told first, then joined).
    pub fn close_all(&mut self) {
        for h in self.listeners.values() {
            h.stop.store(true, Ordering::Relaxed);
        }
        for (_, h) in self.listeners.drain() {
            join(h.thread);
        }
    }

    /// Removes the listeners that ended by themselves (netns gone, error) and says why.
    pub fn reap(&mut self) -> Vec<(PathBuf, ListenerExit)> {
        let done: Vec<PathBuf> = self
            .listeners
            .iter()
            .filter(|(_, h)| h.thread.is_finished())
            .map(|(p, _)| p.clone())
            .collect();
        done.into_iter()
            .filter_map(|p| self.listeners.remove(&p).map(|h| (p, join(h.thread))))
            .collect()
    }

    /// Whether a listener is running for `netns`.
    pub fn is_listening(&self, netns: &Path) -> bool {
        self.listeners
            .get(netns)
            .is_some_and(|h| !h.thread.is_finished())
    }

    /// The netns paths with a listener (running or ended but not yet reaped), sorted.
    pub fn netns_paths(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self.listeners.keys().cloned().collect();
        v.sort();
        v
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.close_all();
    }
}

fn join(thread: JoinHandle<ListenerExit>) -> ListenerExit {
    thread
        .join()
        .unwrap_or_else(|_| ListenerExit::Failed("listener thread panicked".into()))
}

/// The state of one listener thread.
struct Listener {
    sock: NflogSocket,
    path: Arc<Path>,
    /// What `path` named when the listener was opened.
    identity: NetnsId,
    poll: Duration,
    stop: Arc<AtomicBool>,
    context: Arc<RwLock<Arc<PodContext>>>,
    tx: SyncSender<RawRecord>,
    metrics: Arc<Metrics>,
}

impl Listener {
    fn run(mut self) -> ListenerExit {
        self.metrics.listeners_add(1);
        let exit = self.serve();
        self.metrics.listeners_add(-1);
        let netns = self.path.display();
        match &exit {
            ListenerExit::Stopped => {}
            ListenerExit::NetnsGone => tracing::warn!(%netns, "netns gone, NFLOG listener ended"),
            ListenerExit::Failed(e) => tracing::error!(%netns, "NFLOG listener failed: {e}"),
        }
        exit
    }

    fn serve(&mut self) -> ListenerExit {
        let mut last_seq: Option<u32> = None;
        let mut last_check = Instant::now();
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return ListenerExit::Stopped;
            }
            match self.sock.recv() {
                Ok(Received::Records(records)) => {
                    let ctx = self
                        .context
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone();
                    let received = Timestamp::now();
                    for record in records {
                        if let Some(seq) = record.seq {
                            if let Some(prev) = last_seq {
                                let gap = seq.wrapping_sub(prev).wrapping_sub(1);
                                // A huge "gap" would be a reordering or a rebind: not a loss.
                                if gap > 0 && gap < 1 << 30 {
                                    self.metrics.add_nflog_dropped_kernel(u64::from(gap));
                                    self.metrics.add_nflog_dropped_pod(
                                        &ctx.pod.to_string(),
                                        u64::from(gap),
                                    );
                                }
                            }
                            last_seq = Some(seq);
                        }
                        let raw = RawRecord {
                            netns: self.path.clone(),
                            context: ctx.clone(),
                            received,
                            record,
                        };
                        match self.tx.try_send(raw) {
                            Ok(()) => {}
                            Err(TrySendError::Full(_)) => {
                                self.metrics.add_nflog_dropped_queue(1);
                                self.metrics.add_nflog_dropped_pod(&ctx.pod.to_string(), 1);
                            }
                            // Nobody reads any more: the collector is going away.
                            Err(TrySendError::Disconnected(_)) => return ListenerExit::Stopped,
                        }
                    }
                }
                Ok(Received::Timeout) => {}
                Ok(Received::Overrun) => self.metrics.add_nflog_overrun(),
                Err(e) => return ListenerExit::Failed(e.to_string()),
            }
            if last_check.elapsed() >= self.poll {
                last_check = Instant::now();
                match netns_identity(&self.path) {
                    Ok(id) if id == self.identity => {}
                    _ => return ListenerExit::NetnsGone,
                }
            }
        }
    }
}
