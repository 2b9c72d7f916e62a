//! Privilege and exclusivity: the one root check every privileged test starts with, and the
//! lock that keeps heavy topologies (labs, floods, soaks) from running at the same time.
//!
//! The rule: without root a privileged test skips with a line on stderr, except when
//! `CI=true`, where a missing privilege fails the test (a CI run that skipped everything must
//! not look green).

use std::sync::{Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Whether this process runs as root (effective user id 0).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether the test can run: it needs root for network namespaces. With `CI=true` a missing
/// root is a failure, never a silent skip.
pub fn root_or_skip() -> bool {
    if is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("this test needs root (network namespaces), and CI=true: refusing to skip");
    }
    eprintln!("skipped: needs root");
    false
}

/// Heavy work within a test binary: a heavy test runs alone (labs with timing-sensitive
/// probes, floods, soaks: they need the CPU for their probes), lab steps that mostly wait run
/// two at a time ([`lab_slot`]). A test that failed while holding it does not block the
/// others.
static HEAVY: RwLock<()> = RwLock::new(());

/// One heavy topology at a time within a test binary (labs, floods, soaks): the
/// timing-sensitive tests need the CPU for their probes. Excludes [`lab_slot`]s too.
pub fn heavy_lock() -> RwLockWriteGuard<'static, ()> {
    HEAVY.write().unwrap_or_else(|p| p.into_inner())
}

/// How many [`lab_slot`]s may be held at once.
pub const LAB_SLOTS: usize = 2;

/// A place for one `netwarden lab check` step (a subprocess building its own netns, probing,
/// and waiting for the kernel's log to go quiet): such a step spends ~0.05 s of CPU in ~0.9 s,
/// so two run side by side ([`LAB_SLOTS`]), never beside a [`heavy_lock`] holder. Each lab
/// has netns of its own, so its NFLOG listeners see only its own traffic.
pub fn lab_slot() -> LabSlot {
    static USED: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());
    let mut used = USED.0.lock().unwrap_or_else(|p| p.into_inner());
    while *used >= LAB_SLOTS {
        used = USED.1.wait(used).unwrap_or_else(|p| p.into_inner());
    }
    *used += 1;
    drop(used);
    LabSlot {
        _shared: HEAVY.read().unwrap_or_else(|p| p.into_inner()),
        release: || {
            let mut used = USED.0.lock().unwrap_or_else(|p| p.into_inner());
            *used -= 1;
            USED.1.notify_one();
        },
    }
}

/// Held while a lab step runs ([`lab_slot`]).
pub struct LabSlot {
    _shared: RwLockReadGuard<'static, ()>,
    release: fn(),
}

impl Drop for LabSlot {
    fn drop(&mut self) {
        (self.release)();
    }
}

/// Runs `run` once per backend, the backends side by side on threads of their own (a lab step
/// mostly waits, see [`lab_slot`]); the results in the order of `backends`. A panic in one run
/// is the test's panic.
pub fn per_backend<'a, T: Send>(backends: &[&'a str], run: impl Fn(&'a str) -> T + Sync) -> Vec<T> {
    std::thread::scope(|scope| {
        let runs: Vec<_> = backends
            .iter()
            .map(|&backend| {
                let run = &run;
                scope.spawn(move || run(backend))
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Fails the test listing every failure, when there are any.
pub fn assert_no_failures(what: &str, failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} {what}:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}
