//! Network namespaces the tests create, and commands run inside them: named namespaces with a
//! per-test prefix deleted on drop (also when the test panics), a scratch namespace for the
//! kernel's own tools, veth pairs between namespaces with their neighbours pinned, and `ip`.
//!
//! Everything goes through the system tools (`ip`) and `setns`, never through the netns code
//! of the crate under test. Nothing in the root namespace is touched: links are created inside
//! the namespaces they join.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::sched::{setns, CloneFlags};

use crate::root::root_or_skip;

/// Where `ip netns add` puts named namespaces.
const NETNS_DIR: &str = "/run/netns";

/// A name prefix unique to this process and `tag` (`<tag><pid>`): tests of one binary pick
/// different tags, test binaries running at the same time differ by pid.
pub fn unique_prefix(tag: &str) -> String {
    format!("{tag}{}", std::process::id())
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

/// Runs `f` on a new thread inside the netns at `ns` (`setns` switches one thread only); a
/// panic in `f` is the caller's.
pub fn in_netns<T: Send + 'static>(ns: &Path, f: impl FnOnce() -> T + Send + 'static) -> T {
    let file = File::open(ns).unwrap_or_else(|e| panic!("{}: {e}", ns.display()));
    std::thread::spawn(move || {
        setns(file.as_fd(), CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// Runs `program args` inside the netns at `ns` and returns what it did, failed or not
/// (`ip netns exec` needs a name, this works for any path).
pub fn run_in(ns: &Path, program: &str, args: &[&str]) -> Output {
    spawn_in(ns, program, args, None)
}

/// [`run_in`] with `input` on the program's stdin.
pub fn run_in_with_input(ns: &Path, program: &str, args: &[&str], input: &[u8]) -> Output {
    spawn_in(ns, program, args, Some(input.to_vec()))
}

fn spawn_in(ns: &Path, program: &str, args: &[&str], input: Option<Vec<u8>>) -> Output {
    let (program, args): (String, Vec<String>) = (
        program.to_string(),
        args.iter().map(|a| a.to_string()).collect(),
    );
    in_netns(ns, move || {
        let mut cmd = Command::new(&program);
        cmd.args(&args);
        let Some(input) = input else {
            // Stdin closed, stdout and stderr captured.
            return cmd.output().unwrap_or_else(|e| panic!("{program}: {e}"));
        };
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        // Written from another thread: a program that prints before it has read all of its
        // input must not block on a full pipe.
        let mut stdin = child.stdin.take().expect("piped stdin");
        let writer = std::thread::spawn(move || stdin.write_all(&input));
        let out = child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        // A program may exit without reading everything (a refused input): not our error.
        let _ = writer.join();
        out
    })
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
    /// Namespaces named `<tag><pid>-…` (see [`unique_prefix`]): unique to this test and
    /// process.
    pub fn new(tag: &str) -> Namespaces {
        Namespaces {
            prefix: unique_prefix(tag),
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

    /// The path of `short` (whether it exists or not).
    pub fn path(&self, short: &str) -> PathBuf {
        Path::new(NETNS_DIR).join(self.name(short))
    }

    /// Creates `<prefix>-<short>` (replacing a leftover of the same name), with `lo` up.
    pub fn create(&mut self, short: &str) -> PathBuf {
        let name = self.adopt(short);
        let path = self.path(short);
        if path.exists() {
            let _ = Command::new("ip").args(["netns", "del", &name]).output();
        }
        run("ip", &["netns", "add", &name]);
        ip(&path, &["link", "set", "lo", "up"]);
        path
    }

    /// The full name of `short`, deleted on drop like the ones [`Namespaces::create`] makes,
    /// but not created here: for a namespace the code under test creates.
    pub fn adopt(&mut self, short: &str) -> String {
        let name = self.name(short);
        if !self.names.contains(&name) {
            self.names.push(name.clone());
        }
        name
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

/// One throwaway netns to run the kernel's own tools in (`nft -c`, `iptables-restore
/// --test`, ...), so that no test ever looks at the root namespace's rules; deleted on drop.
pub struct ScratchNetns {
    path: PathBuf,
    _namespaces: Namespaces,
}

impl ScratchNetns {
    /// A fresh netns `<tag><pid>-<n>`; `None` when not root (see [`root_or_skip`]: with
    /// `CI=true` that fails the test).
    pub fn new(tag: &str) -> Option<ScratchNetns> {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        if !root_or_skip() {
            return None;
        }
        let mut namespaces = Namespaces::new(tag);
        let path = namespaces.create(&COUNTER.fetch_add(1, Ordering::Relaxed).to_string());
        Some(ScratchNetns {
            path,
            _namespaces: namespaces,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `program args` inside with `stdin`; returns (success, stdout, stderr).
    pub fn run(&self, program: &str, args: &[&str], stdin: &str) -> (bool, String, String) {
        let out = run_in_with_input(&self.path, program, args, stdin.as_bytes());
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `nft args` inside with `stdin`; returns (success, stdout, stderr).
    pub fn nft(&self, args: &[&str], stdin: &str) -> (bool, String, String) {
        self.run("nft", args, stdin)
    }
}

/// A veth from `a` (interface `a_if`) to the named netns at `b` (`b_if`), both ends up, with
/// addresses given with their prefix length (`10.0.0.1/24`, `fd00::1/64`; IPv6 ones without
/// duplicate address detection, so they are usable at once). The peer is created straight in
/// `b`, so both ends may have the same name, and the root namespace never holds the link.
pub fn veth(a: &Path, a_if: &str, a_addrs: &[&str], b: &Path, b_if: &str, b_addrs: &[&str]) {
    let b_path = b.to_str().expect("netns path");
    ip(
        a,
        &[
            "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", b_path,
        ],
    );
    for (ns, dev, addrs) in [(a, a_if, a_addrs), (b, b_if, b_addrs)] {
        for addr in addrs {
            add_address(ns, dev, addr);
        }
        ip(ns, &["link", "set", dev, "up"]);
    }
}

/// Adds `addr` (with its prefix length) to `dev` in `ns`; an IPv6 address skips duplicate
/// address detection.
pub fn add_address(ns: &Path, dev: &str, addr: &str) {
    if addr.contains(':') {
        ip(ns, &["addr", "add", addr, "dev", dev, "nodad"]);
    } else {
        ip(ns, &["addr", "add", addr, "dev", dev]);
    }
}

/// The MAC address of `dev` in `ns`.
pub fn mac_of(ns: &Path, dev: &str) -> String {
    brief(ns, &["link", "show", "dev", dev])
        .first()
        .cloned()
        .unwrap_or_else(|| panic!("no MAC address for {dev} in {}", ns.display()))
}

/// The addresses of `dev` in `ns`, without their prefix length and without IPv6 link-local
/// ones.
fn global_addresses(ns: &Path, dev: &str) -> Vec<String> {
    brief(ns, &["addr", "show", "dev", dev])
        .iter()
        .filter_map(|a| a.split('/').next())
        .filter(|a| !a.starts_with("fe80:"))
        .map(str::to_string)
        .collect()
}

/// The fields after name and state of `ip -br <args>`'s one line.
fn brief(ns: &Path, args: &[&str]) -> Vec<String> {
    let out = run_in(ns, "ip", &[&["-br"], args].concat());
    assert!(
        out.status.success(),
        "ip -br {args:?} in {}: {}",
        ns.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .skip(2)
        .map(str::to_string)
        .collect()
}

/// Permanent neighbour entries for both ends of the veth `a_if` (in `a`) – `b_if` (in `b`):
/// each end learns the other's addresses (as they are now) with its MAC.
///
/// The kernel's neighbour tables are shared by every netns of the host and count entries
/// globally (`gc_thresh3`), so a busy host (other labs, many namespaces) can refuse new dynamic
/// ARP/ND entries, and ARP replies do not make it across a veth on every test machine;
/// permanent entries are exempt from both. Tests are about firewalls, not address resolution.
pub fn pin_neighbours(a: &Path, a_if: &str, b: &Path, b_if: &str) {
    for ((ns, dev), (peer_ns, peer_dev)) in [((a, a_if), (b, b_if)), ((b, b_if), (a, a_if))] {
        let mac = mac_of(peer_ns, peer_dev);
        for addr in global_addresses(peer_ns, peer_dev) {
            ip(
                ns,
                &[
                    "neigh",
                    "replace",
                    &addr,
                    "lladdr",
                    &mac,
                    "dev",
                    dev,
                    "nud",
                    "permanent",
                ],
            );
        }
    }
}

/// The named netns (`ip netns list`) whose names start with `<prefix>-`: what is left of a
/// [`Namespaces`] or a lab with that prefix.
pub fn named_netns_with_prefix(prefix: &str) -> Vec<String> {
    let out = run("ip", &["netns", "list"]);
    let dash = format!("{prefix}-");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&dash))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::{assert_connects, listen};

    #[test]
    fn veth_with_pinned_neighbours_and_cleanup() {
        if !root_or_skip() {
            return;
        }
        let mut nss = Namespaces::new("nwtst");
        let prefix = nss.prefix().to_string();
        let (a, b) = (nss.create("a"), nss.create("b"));
        // Same name at both ends: the peer is created straight in `b`.
        veth(
            &a,
            "eth0",
            &["10.239.0.1/24", "fd39::1/64"],
            &b,
            "eth0",
            &["10.239.0.2/24", "fd39::2/64"],
        );
        pin_neighbours(&a, "eth0", &b, "eth0");
        let neigh =
            String::from_utf8_lossy(&run_in(&a, "ip", &["neigh", "show"]).stdout).into_owned();
        let b_mac = mac_of(&b, "eth0");
        for addr in ["10.239.0.2 ", "fd39::2 "] {
            assert!(
                neigh
                    .lines()
                    .any(|l| l.starts_with(addr) && l.contains(&b_mac) && l.contains("PERMANENT")),
                "{neigh}"
            );
        }
        assert!(!neigh.contains("fe80:"), "{neigh}");
        let _l = [listen(&b, "10.239.0.2:7"), listen(&b, "[fd39::2]:7")];
        assert_connects(&a, "10.239.0.2:7", "v4");
        assert_connects(&a, "[fd39::2]:7", "v6");
        assert_eq!(named_netns_with_prefix(&prefix).len(), 2);
        nss.delete("a");
        assert_eq!(named_netns_with_prefix(&prefix), [nss.name("b")]);
        drop(nss);
        assert!(named_netns_with_prefix(&prefix).is_empty());
    }

    #[test]
    fn scratch_netns_runs_with_input() {
        let Some(ns) = ScratchNetns::new("nwtss") else {
            return;
        };
        let big = "x".repeat(1 << 20);
        let (ok, out, _) = ns.run("cat", &[], &big);
        assert!(ok && out == big);
        let (ok, _, err) = ns.run("sh", &["-c", "echo no >&2; exit 3"], "");
        assert!(!ok && err == "no\n");
        let path = ns.path().to_owned();
        drop(ns);
        assert!(!path.exists());
    }
}
