//! Opening a path as a network namespace, and refusing anything else.
//!
//! A netns path comes from outside (a pod annotation, a CRI answer, a DanmEp), so it may name
//! anything. [`open_checked`] accepts only a real network-namespace file and, unless allowed,
//! refuses the agent's own network namespace — programming that one would firewall the node.
//!
//! How a path is opened, and why:
//! 1. `open(path, O_PATH | O_CLOEXEC)`: this names the file without opening it for I/O, so a
//!    FIFO cannot block us (an `O_RDONLY` open of a FIFO waits for a writer) and a device's open
//!    handler never runs (opening `/dev/watchdog` arms it; a tape rewinds). Path resolution —
//!    symlinks, `..`, `/proc/PID/ns/net` magic links — is the kernel's; we judge what it found.
//! 2. `fstatfs` on that fd must report nsfs (`NSFS_MAGIC`): every namespace file, whether
//!    reached through `/proc/PID/ns/*` or an `ip netns add` bind mount, lives there. Anything
//!    else is refused by what `fstat` says it is (FIFO, socket, device, directory, file).
//! 3. The same inode is reopened through `/proc/thread-self/fd/N` with
//!    `O_RDONLY | O_NONBLOCK | O_CLOEXEC` (through the fd, not the path: the path may name
//!    something else by now), and `ioctl(NS_GET_NSTYPE)` must answer `CLONE_NEWNET` (a uts or
//!    mount namespace file is nsfs too, and `setns` needs a readable fd anyway).
//! 4. Its identity `(st_dev, st_ino)` is compared with the agent's own netns ([`own_netns_id`]).
//!
//! This file holds the crate's only `unsafe` code: one `ioctl` that takes no argument.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::OnceLock;

use nix::sys::statfs::{fstatfs, NSFS_MAGIC};

use super::NetnsError;

/// The identity of a network namespace: device and inode of its nsfs file. Two paths name the
/// same namespace iff their identities are equal (`/run/netns/NAME` bind mounts and
/// `/proc/PID/ns/net` links alike). Displayed like `readlink /proc/PID/ns/net` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetnsId {
    pub dev: u64,
    pub ino: u64,
}

impl std::fmt::Display for NetnsId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "net:[{}] (dev {})", self.ino, self.dev)
    }
}

/// What a path named instead of a network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotNetns {
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
    Directory,
    RegularFile,
    /// A file of some other kind outside nsfs (the `st_mode` file type bits).
    Other(u32),
    /// A namespace file of another type: the `CLONE_NEW*` value `NS_GET_NSTYPE` answered.
    Namespace(i32),
}

impl std::fmt::Display for NotNetns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotNetns::Fifo => f.write_str("a FIFO"),
            NotNetns::Socket => f.write_str("a socket"),
            NotNetns::CharDevice => f.write_str("a character device"),
            NotNetns::BlockDevice => f.write_str("a block device"),
            NotNetns::Directory => f.write_str("a directory"),
            NotNetns::RegularFile => f.write_str("a regular file"),
            NotNetns::Other(mode) => write!(f, "a file of type {:#o}", mode),
            NotNetns::Namespace(nstype) => match namespace_type_name(*nstype) {
                Some(name) => write!(f, "a {name} namespace"),
                None => write!(f, "a namespace of unknown type {nstype:#x}"),
            },
        }
    }
}

/// The name `/proc/PID/ns/` gives a namespace type (`None`: not a type this libc knows).
fn namespace_type_name(nstype: i32) -> Option<&'static str> {
    Some(match nstype {
        libc::CLONE_NEWNET => "net",
        libc::CLONE_NEWUTS => "uts",
        libc::CLONE_NEWIPC => "ipc",
        libc::CLONE_NEWNS => "mnt",
        libc::CLONE_NEWPID => "pid",
        libc::CLONE_NEWUSER => "user",
        libc::CLONE_NEWCGROUP => "cgroup",
        libc::CLONE_NEWTIME => "time",
        _ => return None,
    })
}

/// What a caller allows [`open_checked`] to open besides ordinary pod namespaces.
///
/// The default refuses the agent's own network namespace: a pod whose netns path resolves to
/// the node's (by mistake, or through `/proc/self/ns/net` or `..` tricks in an annotation)
/// would otherwise get the node firewalled. Only a deliberate choice (the CLI's
/// `--allow-host-netns`, for a test bed where the agent runs inside the "pod" netns) opens it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NetnsAccess {
    /// Accept the network namespace this process started in.
    pub allow_own: bool,
}

impl NetnsAccess {
    /// Refuses the agent's own netns (the default).
    pub const STRICT: NetnsAccess = NetnsAccess { allow_own: false };
    /// Accepts the agent's own netns too.
    pub const ALLOW_OWN: NetnsAccess = NetnsAccess { allow_own: true };
}

/// The access every [`super::Netns::open`] uses, fixed once for the process (see
/// [`set_process_access`]).
static PROCESS_ACCESS: OnceLock<NetnsAccess> = OnceLock::new();

/// Fixes the access that [`super::Netns::open`] (and so `run_in`, `exec_in`, discovery and
/// both backends) uses for the rest of the process. Call it once at startup, before any netns
/// is opened: the first open fixes the default ([`NetnsAccess::STRICT`]), and a later call
/// that would change the value fails — the setting cannot flip while pods are being programmed.
///
/// A process-wide setting rather than a parameter: it answers "may this process program its
/// own netns", one answer per process, and every path into a netns (the `Dataplane`
/// implementations, nft sessions, NFLOG listeners, discovery) then obeys it without each
/// carrying it. Code that wants a different answer for one open uses
/// [`super::Netns::open_with`].
pub fn set_process_access(access: NetnsAccess) -> Result<(), NetnsError> {
    let fixed = *PROCESS_ACCESS.get_or_init(|| access);
    if fixed == access {
        Ok(())
    } else {
        Err(NetnsError::AccessAlreadyFixed { fixed })
    }
}

/// The access fixed for this process ([`NetnsAccess::STRICT`] unless
/// [`set_process_access`] said otherwise first).
pub fn process_access() -> NetnsAccess {
    *PROCESS_ACCESS.get_or_init(NetnsAccess::default)
}

/// The identity of the network namespace this process started in.
static OWN_NETNS: OnceLock<NetnsId> = OnceLock::new();

/// The identity of the agent's own network namespace, read once (at first use) from
/// `/proc/self/ns/net`.
///
/// `/proc/self` is the thread group leader — the main thread — whatever thread asks; the
/// calling thread's netns would be `/proc/thread-self/ns/net` and may be a pod's (a thread of
/// [`super::Netns::run`]). What this relies on: the main thread never calls `setns`, so its
/// netns is the one the process started in. Nothing in netwarden switches the main thread
/// ([`super::Netns::run`] always spawns a thread; `enter_current_thread` is documented for
/// spawned threads only). A failed read is not cached: the next open tries again.
pub fn own_netns_id() -> Result<NetnsId, NetnsError> {
    if let Some(id) = OWN_NETNS.get() {
        return Ok(*id);
    }
    let path = Path::new("/proc/self/ns/net");
    let meta = std::fs::metadata(path).map_err(|source| NetnsError::OwnNetnsUnknown {
        path: path.to_owned(),
        source,
    })?;
    let id = NetnsId {
        dev: meta.dev(),
        ino: meta.ino(),
    };
    Ok(*OWN_NETNS.get_or_init(|| id))
}

/// Opens `path` if, and only if, it is a network namespace that `access` allows; returns a
/// readable fd on it (for `setns`) and its identity. See the module doc for the steps.
pub fn open_checked(path: &Path, access: NetnsAccess) -> Result<(File, NetnsId), NetnsError> {
    let inspect_err = |step: &'static str| {
        let path = path.to_owned();
        move |source: io::Error| NetnsError::Inspect { path, step, source }
    };
    let located = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)
        .map_err(|source| NetnsError::Open {
            path: path.to_owned(),
            source,
        })?;
    let meta = located.metadata().map_err(inspect_err("fstat"))?;
    let fs = fstatfs(&located).map_err(|e| inspect_err("fstatfs")(e.into()))?;
    if fs.filesystem_type() != NSFS_MAGIC {
        return Err(NetnsError::NotANetns {
            path: path.to_owned(),
            what: file_kind(&meta),
        });
    }
    let id = NetnsId {
        dev: meta.dev(),
        ino: meta.ino(),
    };
    // Reopen the inode we judged, through our fd: the path may name something else by now.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/thread-self/fd/{}", located.as_raw_fd()))
        .map_err(inspect_err("reopen"))?;
    let reopened = file.metadata().map_err(inspect_err("fstat"))?;
    if (reopened.dev(), reopened.ino()) != (id.dev, id.ino) {
        return Err(inspect_err("reopen")(io::Error::other(
            "the reopened file is not the one inspected",
        )));
    }
    let nstype = namespace_type(&file).map_err(inspect_err("NS_GET_NSTYPE"))?;
    if nstype != libc::CLONE_NEWNET {
        return Err(NetnsError::NotANetns {
            path: path.to_owned(),
            what: NotNetns::Namespace(nstype),
        });
    }
    if !access.allow_own && id == own_netns_id()? {
        return Err(NetnsError::OwnNetns {
            path: path.to_owned(),
        });
    }
    Ok((file, id))
}

/// What a non-nsfs file is, from its `fstat`.
fn file_kind(meta: &std::fs::Metadata) -> NotNetns {
    let kind = meta.file_type();
    if kind.is_fifo() {
        NotNetns::Fifo
    } else if kind.is_socket() {
        NotNetns::Socket
    } else if kind.is_char_device() {
        NotNetns::CharDevice
    } else if kind.is_block_device() {
        NotNetns::BlockDevice
    } else if kind.is_dir() {
        NotNetns::Directory
    } else if kind.is_file() {
        NotNetns::RegularFile
    } else {
        NotNetns::Other(meta.mode() & libc::S_IFMT)
    }
}

/// `ioctl(fd, NS_GET_NSTYPE)`: the `CLONE_NEW*` type of the namespace `file` refers to (Linux
/// 4.11+; `ENOTTY` when `file` is not a namespace file).
#[allow(unsafe_code)]
fn namespace_type(file: &File) -> io::Result<i32> {
    // SAFETY: NS_GET_NSTYPE (`_IO(0xb7, 0x3)`) takes no argument: the kernel reads nothing from
    // and writes nothing to our memory, it only looks at the namespace behind the fd. The fd
    // is valid for the whole call because `file` is borrowed.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), libc::NS_GET_NSTYPE) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_found_reads_well() {
        assert_eq!(NotNetns::Fifo.to_string(), "a FIFO");
        assert_eq!(
            NotNetns::Namespace(libc::CLONE_NEWUTS).to_string(),
            "a uts namespace"
        );
        assert_eq!(
            NotNetns::Namespace(0x4).to_string(),
            "a namespace of unknown type 0x4"
        );
        let id = NetnsId {
            dev: 4,
            ino: 4026531833,
        };
        assert_eq!(id.to_string(), "net:[4026531833] (dev 4)");
    }

    #[test]
    fn namespace_files_are_told_apart() {
        // Unprivileged: any process may inspect its own namespace files.
        let own = own_netns_id().unwrap();
        let (_, id) = open_checked(Path::new("/proc/self/ns/net"), NetnsAccess::ALLOW_OWN).unwrap();
        assert_eq!(id, own);
        let err = open_checked(Path::new("/proc/self/ns/net"), NetnsAccess::STRICT).unwrap_err();
        assert!(matches!(err, NetnsError::OwnNetns { .. }), "{err:?}");
        let err = open_checked(Path::new("/proc/self/ns/uts"), NetnsAccess::ALLOW_OWN).unwrap_err();
        assert!(
            matches!(
                err,
                NetnsError::NotANetns {
                    what: NotNetns::Namespace(libc::CLONE_NEWUTS),
                    ..
                }
            ),
            "{err:?}"
        );
        let err = open_checked(Path::new("/dev/null"), NetnsAccess::ALLOW_OWN).unwrap_err();
        assert!(
            matches!(
                err,
                NetnsError::NotANetns {
                    what: NotNetns::CharDevice,
                    ..
                }
            ),
            "{err:?}"
        );
    }
}
