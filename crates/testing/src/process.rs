//! Processes: the binary under test and the agent as a child process (killed on drop, with its
//! log), what a process holds (for leak checks), a test binary re-running one of its own tests
//! in a child, and polling for a condition.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `netwarden` binary under test, as a `String`: `NETWARDEN_BIN` when set (to run a suite
/// against another build, e.g. the one before a fix), else the one Cargo built. Only for
/// netwarden's own integration tests (it names `CARGO_BIN_EXE_netwarden`).
#[macro_export]
macro_rules! netwarden_bin {
    () => {
        ::std::env::var("NETWARDEN_BIN")
            .unwrap_or_else(|_| ::std::string::String::from(env!("CARGO_BIN_EXE_netwarden")))
    };
}

/// Polls `cond` every 50 ms until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `cmd` with stdout and stderr captured, like [`Command::output`], but kills it and
/// panics when it has not exited within `limit`: for commands that must end at once, where a
/// hang is the defect (`what` names the command in the message).
///
/// Both pipes are drained by threads while the command runs: a command that writes more than
/// a pipe holds (64 KiB) would otherwise block on its write and never exit.
pub fn output_within(cmd: &mut Command, limit: Duration, what: &str) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<_>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<_>));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

/// This test binary, set to run only its test `name` (exactly, on one thread, output not
/// captured): for a test that needs a fresh process (process-wide settings) or one it can kill
/// or interrupt. Add what tells the child it is the child (an environment variable) and start
/// it.
pub fn this_test_in_a_child(name: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"]);
    cmd
}

/// The `netwarden` agent (or any long-running command) as a child process, killed on drop.
pub struct AgentProcess {
    pub child: Child,
    pub log: PathBuf,
}

impl AgentProcess {
    /// Starts `bin args…`, its stderr into `log` (appended, so restarts keep one log).
    pub fn start(bin: &str, args: &[&str], log: &Path) -> AgentProcess {
        AgentProcess::start_with_env(bin, args, &[], log)
    }

    /// [`AgentProcess::start`] with `env` added to the environment (`RUST_LOG`, ...).
    pub fn start_with_env(
        bin: &str,
        args: &[&str],
        env: &[(&str, &str)],
        log: &Path,
    ) -> AgentProcess {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("agent log");
        let child = Command::new(bin)
            .args(args)
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
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

    /// Fails if the process exited (it must run until killed).
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().expect("try_wait") {
            panic!("exited ({status}); its log:\n{}", self.log());
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

/// The arguments of `netwarden run --kube` as the end-to-end tests start it: node `node`, the
/// cluster of `kubeconfig` (the fake API server's), polling every 200 ms, no events on stdout,
/// `/metrics` and `/readyz` on `metrics`. Add what a test needs after them.
pub fn kube_agent_args(kubeconfig: &Path, node: &str, metrics: SocketAddr) -> Vec<String> {
    [
        "run",
        "--kube",
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--node-name",
        node,
        "--interval",
        "200ms",
        "--no-events-stdout",
        "--metrics-addr",
        &metrics.to_string(),
    ]
    .map(String::from)
    .to_vec()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_within_returns_or_kills() {
        let out = output_within(
            Command::new("sh").args(["-c", "echo hi"]),
            Duration::from_secs(20),
            "echo",
        );
        assert!(out.status.success() && out.stdout == b"hi\n");
        // More than a pipe holds, on both streams: read while the command runs.
        let big = output_within(
            Command::new("sh").args([
                "-c",
                "head -c 1000000 /dev/zero; head -c 300000 /dev/zero >&2",
            ]),
            Duration::from_secs(20),
            "big output",
        );
        assert!(big.status.success());
        assert_eq!((big.stdout.len(), big.stderr.len()), (1_000_000, 300_000));
        let hung = std::panic::catch_unwind(|| {
            output_within(
                Command::new("sleep").arg("30"),
                Duration::from_millis(200),
                "sleep",
            )
        });
        let message = *hung.unwrap_err().downcast::<String>().unwrap();
        assert!(
            message.starts_with("sleep: still running after"),
            "{message}"
        );
    }

    #[test]
    fn stats_of_this_process() {
        let s = ProcessStats::of(std::process::id());
        assert!(s.fds >= 3 && s.threads >= 1 && s.rss_kib > 0, "{s:?}");
    }
}
