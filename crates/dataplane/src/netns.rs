//! Entering network namespaces and running code or commands inside them.
//!
//! A network namespace is named by a path: `/run/netns/NAME` (made by `ip netns add`) or
//! `/proc/PID/ns/net`. `setns(2)` switches the namespace of the *calling thread only*, so code that
//! must run inside a pod's netns always gets a thread of its own ([`run_in`], [`exec_in`]): doing it
//! on a shared thread (a tokio worker, the main thread) would leave that thread in the wrong
//! namespace for whatever it runs next.
//!
//! Two facts make the per-thread switch enough:
//! - a socket belongs to the netns it was created in, whichever thread uses it afterwards;
//! - a child process inherits the netns of the thread that forked it, so `nft -f -`,
//!   `iptables-restore` or `ipset restore` spawned from a switched thread act on that netns.
//!
//! Every way in ([`Netns::open`], [`run_in`], [`exec_in`], discovery) goes through one check
//! (the `check` submodule): only a real network-namespace file is opened, without blocking on
//! a FIFO, and the agent's own netns is refused unless the process allowed it
//! ([`set_process_access`]).
//!
//! Commands are always run with an argv (never through a shell), so nothing in an argument can be
//! interpreted as shell syntax.

mod check;

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};

use nix::sched::{setns, CloneFlags};

pub use check::{own_netns_id, process_access, set_process_access, NetnsAccess, NetnsId, NotNetns};

/// Whether `e` says the netns no longer exists (the pod is gone, and its rules with it).
pub(crate) fn netns_gone(e: &NetnsError) -> bool {
    matches!(e, NetnsError::Open { source, .. } if source.kind() == io::ErrorKind::NotFound)
}

/// Where `ip netns add` puts its namespaces.
pub const NAMED_NETNS_DIR: &str = "/run/netns";

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("cannot open network namespace {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("refusing {path} as a network namespace: it is {what}")]
    NotANetns { path: PathBuf, what: NotNetns },
    #[error(
        "refusing {path}: it is the agent's own network namespace; \
         pass --allow-host-netns to allow it"
    )]
    OwnNetns { path: PathBuf },
    #[error("cannot check that {path} is a network namespace ({step}): {source}")]
    Inspect {
        path: PathBuf,
        step: &'static str,
        source: io::Error,
    },
    #[error("cannot read the agent's own network namespace from {path}: {source}")]
    OwnNetnsUnknown { path: PathBuf, source: io::Error },
    #[error("the netns access of this process is already fixed ({fixed:?})")]
    AccessAlreadyFixed { fixed: NetnsAccess },
    #[error("cannot enter network namespace {path}: {source}")]
    Setns { path: PathBuf, source: nix::Error },
    #[error("cannot start a thread for network namespace {path}: {source}")]
    Thread { path: PathBuf, source: io::Error },
    #[error("cannot run {program}: {source}")]
    Spawn { program: String, source: io::Error },
    #[error("{program} {} failed ({status}): {}", args.join(" "), stderr.trim_end())]
    Command {
        program: String,
        args: Vec<String>,
        status: ExitStatus,
        stderr: String,
    },
    #[error("invalid network namespace name {0:?} (allowed: 1-64 of A-Z a-z 0-9 _ . -, not starting with - or .)")]
    InvalidName(String),
    #[error("cannot list {dir}: {source}")]
    List { dir: PathBuf, source: io::Error },
}

/// An open handle on a network namespace, checked to be one (see the `check` submodule).
///
/// Holding the file keeps the namespace alive and lets a thread enter it repeatedly (a probe pool
/// thread switches between pods) without re-opening the path.
#[derive(Debug)]
pub struct Netns {
    path: PathBuf,
    file: File,
    id: NetnsId,
}

impl Netns {
    /// Opens the network namespace at `path` with the process's access ([`process_access`]):
    /// anything but a network namespace, and the agent's own netns unless allowed, is refused.
    pub fn open(path: &Path) -> Result<Netns, NetnsError> {
        Netns::open_with(path, process_access())
    }

    /// Like [`Netns::open`] with an explicit `access` instead of the process's.
    pub fn open_with(path: &Path, access: NetnsAccess) -> Result<Netns, NetnsError> {
        let (file, id) = check::open_checked(path, access)?;
        Ok(Netns {
            path: path.to_owned(),
            file,
            id,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The namespace's identity, as it was when opened (what the handle refers to, whatever
    /// the path names later).
    pub fn id(&self) -> NetnsId {
        self.id
    }

    /// Moves the **calling thread** into this namespace.
    ///
    /// Only call this on a thread you spawned for the purpose and that ends (or switches again)
    /// when done; see the module doc. Never on the main thread: [`own_netns_id`] relies on it
    /// staying in the netns the process started in.
    pub fn enter_current_thread(&self) -> Result<(), NetnsError> {
        setns(&self.file, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Setns {
            path: self.path.clone(),
            source,
        })
    }

    /// Runs `f` on a new thread that has entered this namespace, and returns its result.
    pub fn run<T, F>(&self, f: F) -> Result<T, NetnsError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let file = self.file.try_clone().map_err(|source| NetnsError::Open {
            path: self.path.clone(),
            source,
        })?;
        let path = self.path.clone();
        let thread_path = path.clone();
        let handle = std::thread::Builder::new()
            .name("netns".into())
            .spawn(move || {
                setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Setns {
                    path: thread_path,
                    source,
                })?;
                Ok(f())
            })
            .map_err(|source| NetnsError::Thread { path, source })?;
        match handle.join() {
            Ok(result) => result,
            // A panic in `f` is a bug of the caller: let it surface as a panic, not an error.
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// The identity of the network namespace at `path`, after the same checks as [`Netns::open`]
/// (so it fails for what `open` refuses), without entering it.
pub fn netns_id(path: &Path) -> Result<NetnsId, NetnsError> {
    Netns::open(path).map(|netns| netns.id())
}

/// Runs `f` on a dedicated thread inside the network namespace at `path`.
pub fn run_in<T: Send + 'static>(
    path: &Path,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, NetnsError> {
    Netns::open(path)?.run(f)
}

/// Runs `program args...` inside the namespace at `path`, feeding it `stdin`; fails with
/// [`NetnsError::Command`] when it exits non-zero.
pub fn exec_in(
    path: &Path,
    program: &str,
    args: &[&str],
    stdin: Option<&[u8]>,
) -> Result<Output, NetnsError> {
    check(
        program,
        args,
        exec_in_unchecked(path, program, args, stdin)?,
    )
}

/// Like [`exec_in`] but returns the output whatever the exit status (for commands whose failure
/// is an answer, e.g. `nft list table` of a table that does not exist).
pub fn exec_in_unchecked(
    path: &Path,
    program: &str,
    args: &[&str],
    stdin: Option<&[u8]>,
) -> Result<Output, NetnsError> {
    let program_owned = program.to_owned();
    let args_owned: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let stdin_owned = stdin.map(<[u8]>::to_vec);
    run_in(path, move || {
        spawn_and_wait(&program_owned, &args_owned, stdin_owned.as_deref())
    })?
}

/// Runs a command in the caller's own namespace (used for `ip netns add/del`, which work from
/// the root namespace); fails when it exits non-zero.
pub fn exec(program: &str, args: &[&str], stdin: Option<&[u8]>) -> Result<Output, NetnsError> {
    let args_owned: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    check(program, args, spawn_and_wait(program, &args_owned, stdin)?)
}

fn check(program: &str, args: &[&str], output: Output) -> Result<Output, NetnsError> {
    if output.status.success() {
        Ok(output)
    } else {
        Err(NetnsError::Command {
            program: program.to_owned(),
            args: args.iter().map(|a| a.to_string()).collect(),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

fn spawn_and_wait(
    program: &str,
    args: &[String],
    stdin: Option<&[u8]>,
) -> Result<Output, NetnsError> {
    let spawn_err = |source| NetnsError::Spawn {
        program: program.to_owned(),
        source,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;
    // Feed stdin from another thread while this one drains stdout/stderr: with large rule sets
    // both pipes can fill up, and writing everything first would deadlock.
    let writer = match (stdin, child.stdin.take()) {
        (Some(data), Some(mut pipe)) => {
            let data = data.to_vec();
            Some(std::thread::spawn(move || pipe.write_all(&data)))
        }
        _ => None,
    };
    let output = child.wait_with_output().map_err(spawn_err)?;
    if let Some(writer) = writer {
        match writer.join() {
            // EPIPE: the program exited without reading everything; its status tells why.
            Ok(Err(e)) if e.kind() != io::ErrorKind::BrokenPipe => return Err(spawn_err(e)),
            Ok(_) => {}
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
    Ok(output)
}

/// Whether `name` is acceptable as a named netns: `[A-Za-z0-9_.-]{1,64}`, not starting with `-`
/// (it would read as an option of `ip`) nor `.` (hidden files, `.`, `..`).
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && !name.starts_with(['-', '.'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// `/run/netns/NAME` for a valid name.
pub fn named_path(name: &str) -> Result<PathBuf, NetnsError> {
    if !valid_name(name) {
        return Err(NetnsError::InvalidName(name.to_owned()));
    }
    Ok(Path::new(NAMED_NETNS_DIR).join(name))
}

/// Creates the named namespace `name` (`ip netns add`) and returns its path.
pub fn create_named(name: &str) -> Result<PathBuf, NetnsError> {
    let path = named_path(name)?;
    exec("ip", &["netns", "add", name], None)?;
    Ok(path)
}

/// Deletes the named namespace `name` (`ip netns del`). Interfaces inside it (veth ends
/// included) go away with it.
pub fn delete_named(name: &str) -> Result<(), NetnsError> {
    named_path(name)?;
    exec("ip", &["netns", "del", name], None)?;
    Ok(())
}

/// The names of the existing named namespaces, sorted.
pub fn list_named() -> Result<Vec<String>, NetnsError> {
    let dir = Path::new(NAMED_NETNS_DIR);
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(NetnsError::List {
                dir: dir.to_owned(),
                source,
            })
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| NetnsError::List {
            dir: dir.to_owned(),
            source,
        })?;
        if let Some(name) = entry.file_name().to_str() {
            names.push(name.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Whether this process may create namespaces (tests skip or fail on this).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!(valid_name("nwlab-0a1b2c-12"));
        assert!(valid_name("a.b_c"));
        for bad in [
            "",
            ".",
            "..",
            "-n",
            ".x",
            "a/b",
            "a b",
            "x;rm",
            "ü",
            &"x".repeat(65),
        ] {
            assert!(!valid_name(bad), "{bad:?}");
            assert!(matches!(named_path(bad), Err(NetnsError::InvalidName(_))));
        }
        assert_eq!(named_path("ok").unwrap(), Path::new("/run/netns/ok"));
    }

    #[test]
    fn exec_reports_failure_and_stdin_round_trips() {
        let out = exec("cat", &[], Some(b"hello")).unwrap();
        assert_eq!(out.stdout, b"hello");
        // A large input must not deadlock against a large output.
        let big = vec![b'x'; 4 << 20];
        let out = exec("cat", &[], Some(&big)).unwrap();
        assert_eq!(out.stdout.len(), big.len());
        let err = exec("sh", &["-c", "echo nope >&2; exit 3"], None).unwrap_err();
        match err {
            NetnsError::Command { status, stderr, .. } => {
                assert_eq!(status.code(), Some(3));
                assert_eq!(stderr, "nope\n");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            exec("/nonexistent/program", &[], None),
            Err(NetnsError::Spawn { .. })
        ));
    }

    #[test]
    fn open_missing_path_fails() {
        let err = run_in(Path::new("/nonexistent/netns"), || ()).unwrap_err();
        assert!(matches!(err, NetnsError::Open { .. }));
    }

    #[test]
    fn entering_a_non_netns_file_fails() {
        // /proc/self/ns/uts is a namespace file of another type: refused before any setns.
        let err = run_in(Path::new("/proc/self/ns/uts"), || ()).unwrap_err();
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
        assert!(err.to_string().contains("is a uts namespace"), "{err}");
    }
}
