//! What netwarden's privileged tests share, so that each test file does not carry its own copy:
//!
//! - [`root_or_skip`]: the one root check (with `CI=true`, a missing root fails the test);
//! - [`Namespaces`]: named network namespaces with a per-test prefix, deleted on drop (also when
//!   the test panics), and [`veth`] pairs between them;
//! - [`listen`], [`connect`], [`wait_reachable`], [`assert_connects`], [`assert_refused`]: TCP
//!   from inside a namespace (a refusal must be a reset, never a timeout);
//! - [`TempDir`]: a directory of manifests, written atomically, removed on drop;
//! - [`AgentProcess`]: `netwarden run` as a child process, killed on drop, with its log;
//! - [`ProcessStats`]: what a process holds (file descriptors by kind, threads, children, RSS),
//!   for leak checks.
//!
//! It depends on no netwarden crate: it drives the system (`ip`) and the binary under test, so
//! the tests check netwarden from the outside. Traffic only flows between namespaces a test
//! created.

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sched::{setns, CloneFlags};

/// Whether the test can run: it needs root for network namespaces. With `CI=true` a missing
/// root is a failure, never a silent skip.
pub fn root_or_skip() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("this test needs root (network namespaces), and CI=true: refusing to skip");
    }
    eprintln!("skipped: needs root");
    false
}

/// One heavy topology at a time within a test binary (labs, floods, soaks).
pub fn heavy_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs a command; panics with its stderr when it fails.
pub fn run(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `program args` inside the netns at `ns` (`nsenter`-free: `ip netns exec` needs a name,
/// this works for any path).
pub fn run_in(ns: &Path, program: &str, args: &[&str]) -> Output {
    let ns = ns.to_owned();
    let (program, args): (String, Vec<String>) = (
        program.to_string(),
        args.iter().map(|a| a.to_string()).collect(),
    );
    in_netns(&ns, move || {
        Command::new(&program)
            .args(&args)
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"))
    })
}

/// Runs `f` on a new thread inside the netns at `ns` (`setns` switches one thread only).
pub fn in_netns<T: Send + 'static>(ns: &Path, f: impl FnOnce() -> T + Send + 'static) -> T {
    let file = File::open(ns).unwrap_or_else(|e| panic!("{}: {e}", ns.display()));
    std::thread::spawn(move || {
        setns(file.as_fd(), CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// `ip <args>` inside `ns`; panics on failure.
pub fn ip(ns: &Path, args: &[&str]) {
    let out = run_in(ns, "ip", args);
    assert!(
        out.status.success(),
        "ip {args:?} in {}: {}",
        ns.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Named network namespaces (`/run/netns/<prefix>-<name>`), deleted when dropped.
pub struct Namespaces {
    prefix: String,
    names: Vec<String>,
}

impl Namespaces {
    /// Namespaces named `<tag><pid>-…`: unique to this test and process.
    pub fn new(tag: &str) -> Namespaces {
        Namespaces {
            prefix: format!("{tag}{}", std::process::id()),
            names: Vec::new(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The full name of `short`.
    pub fn name(&self, short: &str) -> String {
        format!("{}-{short}", self.prefix)
    }

    /// Creates `<prefix>-<short>` (replacing a leftover of the same name), with `lo` up.
    pub fn create(&mut self, short: &str) -> PathBuf {
        let name = self.name(short);
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run("ip", &["netns", "add", &name]);
        let path = PathBuf::from("/run/netns").join(&name);
        ip(&path, &["link", "set", "lo", "up"]);
        if !self.names.contains(&name) {
            self.names.push(name);
        }
        path
    }

    /// Deletes `<prefix>-<short>` now.
    pub fn delete(&mut self, short: &str) {
        let name = self.name(short);
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        self.names.retain(|n| *n != name);
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

/// A veth from `a` (`a_if`, `a_addr`) to the netns named `b_name` at `b` (`b_if`, `b_addr`);
/// addresses with their prefix length (`10.0.0.1/24`). Nothing in the root namespace is touched.
pub fn veth(a: &Path, a_if: &str, a_addr: &str, b: &Path, b_name: &str, b_if: &str, b_addr: &str) {
    ip(
        a,
        &["link", "add", a_if, "type", "veth", "peer", "name", b_if],
    );
    ip(a, &["link", "set", b_if, "netns", b_name]);
    ip(a, &["addr", "add", a_addr, "dev", a_if]);
    ip(a, &["link", "set", a_if, "up"]);
    ip(b, &["addr", "add", b_addr, "dev", b_if]);
    ip(b, &["link", "set", b_if, "up"]);
}

/// A TCP listener on `addr` inside `ns`.
pub fn listen(ns: &Path, addr: &str) -> TcpListener {
    let addr: SocketAddr = addr.parse().expect("socket address");
    in_netns(ns, move || TcpListener::bind(addr)).unwrap_or_else(|e| panic!("bind {addr}: {e}"))
}

/// A TCP connection from inside `ns` to `addr` (3 s timeout).
pub fn connect(ns: &Path, addr: &str) -> std::io::Result<TcpStream> {
    let addr: SocketAddr = addr.parse().expect("socket address");
    in_netns(ns, move || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(3))
    })
}

/// One TCP connection from inside `ns` to `addr`, closed at once with a reset (`SO_LINGER` 0).
///
/// For probes made without pause: a connection closed normally leaves a TIME_WAIT socket on the
/// side that closed first, and a later connection reusing the same ports can then be answered
/// with a reset by the peer's TCP stack — a refusal that no firewall made. Resetting leaves no
/// TIME_WAIT anywhere.
pub fn probe(ns: &Path, addr: &str) -> std::io::Result<()> {
    let stream = connect(ns, addr)?;
    let linger = nix::sys::socket::sockopt::Linger;
    let zero = nix::libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    nix::sys::socket::setsockopt(&stream, linger, &zero).map_err(std::io::Error::from)?;
    Ok(())
}

/// Waits (up to 60 s) until `ns` reaches `addr`: a fresh veth takes a moment to pass packets.
pub fn wait_reachable(ns: &Path, addr: &str) {
    let start = Instant::now();
    while connect(ns, addr).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{addr} never became reachable"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `addr` must be refused from `ns`: a TCP reset, not a timeout.
pub fn assert_refused(ns: &Path, addr: &str, why: &str) {
    match connect(ns, addr) {
        Ok(_) => panic!("{why}: {addr} connected, must be refused"),
        Err(e) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "{why}: {addr}: {e} (a refusal, not a timeout)"
        ),
    }
}

/// `addr` must connect from `ns`.
pub fn assert_connects(ns: &Path, addr: &str, why: &str) {
    if let Err(e) = connect(ns, addr) {
        panic!("{why}: {addr} must connect: {e}");
    }
}

/// A temporary directory, removed when dropped (also when the test panics).
pub struct TempDir {
    pub path: PathBuf,
}

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("netwarden-test-{}-{n}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path }
    }

    /// Writes `name` atomically (temp file + rename), so a reader never sees half a file.
    pub fn write(&self, name: &str, text: &str) {
        let tmp = self.path.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).expect("write temp file");
        std::fs::rename(&tmp, self.path.join(name)).expect("rename temp file");
    }

    /// Writes `name` in place, as an editor that truncates then writes would leave it midway.
    pub fn write_in_place(&self, name: &str, text: &str) {
        std::fs::write(self.path.join(name), text).expect("write file");
    }

    pub fn remove(&self, name: &str) {
        std::fs::remove_file(self.path.join(name)).expect("remove file");
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The `netwarden` agent (or any long-running command) as a child process, killed on drop.
pub struct AgentProcess {
    pub child: Child,
    pub log: PathBuf,
}

impl AgentProcess {
    /// Starts `bin args…`, its stderr into `log` (appended, so restarts keep one log).
    pub fn start(bin: &str, args: &[&str], log: &Path) -> AgentProcess {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("agent log");
        let child = Command::new(bin)
            .args(args)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("start {bin}: {e}"));
        AgentProcess {
            child,
            log: log.to_owned(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to `within` for `cond`; panics with the log when the process exits or time
    /// runs out.
    pub fn wait_for(&mut self, what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!("exited ({status}) waiting for {what}:\n{}", self.log());
            }
            assert!(
                start.elapsed() < within,
                "timed out waiting for {what}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a process holds, read from `/proc/PID`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessStats {
    /// Open file descriptors.
    pub fds: usize,
    /// Descriptors that are network namespaces (`net:[…]`): each keeps a netns alive.
    pub netns_fds: usize,
    /// Descriptors that are sockets.
    pub sockets: usize,
    pub threads: usize,
    /// Processes whose parent is this one.
    pub children: usize,
    /// Resident set size, KiB.
    pub rss_kib: u64,
}

impl ProcessStats {
    pub fn of(pid: u32) -> ProcessStats {
        use std::os::unix::fs::MetadataExt;
        let mut s = ProcessStats::default();
        // A namespace file lives on nsfs: same device as this process's own netns file (a
        // bind-mounted one reads back as its mount path, so the link text does not tell).
        let nsfs = std::fs::metadata("/proc/self/ns/net").map(|m| m.dev()).ok();
        if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
            for fd in fds.flatten() {
                s.fds += 1;
                let target = std::fs::read_link(fd.path()).unwrap_or_default();
                if target.to_string_lossy().starts_with("socket:[") {
                    s.sockets += 1;
                } else if std::fs::metadata(fd.path()).is_ok_and(|m| Some(m.dev()) == nsfs) {
                    s.netns_fds += 1;
                }
            }
        }
        s.threads = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.count())
            .unwrap_or(0);
        s.children = std::fs::read_dir("/proc")
            .map(|d| {
                d.flatten()
                    .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
                    .filter(|stat| {
                        // "pid (comm) state ppid ...": the ppid follows the last ')'.
                        stat.rsplit(')')
                            .next()
                            .and_then(|rest| rest.split_whitespace().nth(1))
                            .and_then(|ppid| ppid.parse::<u32>().ok())
                            == Some(pid)
                    })
                    .count()
            })
            .unwrap_or(0);
        s.rss_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|st| {
                st.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.split_whitespace().next()?.parse().ok())
            })
            .unwrap_or(0);
        s
    }
}

/// The named netns whose names start with `prefix`.
pub fn named_netns_with_prefix(prefix: &str) -> Vec<String> {
    let out = run("ip", &["netns", "list"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_this_process() {
        let s = ProcessStats::of(std::process::id());
        assert!(s.fds >= 3 && s.threads >= 1 && s.rss_kib > 0, "{s:?}");
    }

    #[test]
    fn temp_dirs_clean_up() {
        let path = {
            let d = TempDir::new("t");
            d.write("a.yaml", "x");
            assert_eq!(std::fs::read_to_string(d.path.join("a.yaml")).unwrap(), "x");
            d.path.clone()
        };
        assert!(!path.exists());
    }
}
