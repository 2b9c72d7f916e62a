//! Privilege and exclusivity: the one root check every privileged test starts with, and the
//! lock that keeps heavy topologies (labs, floods, soaks) from running at the same time.
//!
//! The rule: without root a privileged test skips with a line on stderr, except when
//! `CI=true`, where a missing privilege fails the test (a CI run that skipped everything must
//! not look green).

use std::sync::{Mutex, MutexGuard};

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

/// One heavy topology at a time within a test binary (labs, floods, soaks): a lab is a whole
/// netns topology with listeners, its NFLOG listeners must see only its own traffic, and the
/// timing-sensitive tests need the CPU for their probes. A test that failed while holding the
/// lock does not block the others.
pub fn heavy_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}
