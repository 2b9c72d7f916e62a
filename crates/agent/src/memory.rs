//! Handing memory the agent freed back to the kernel, and not holding more than it uses.
//!
//! Transparent huge pages are off for the whole process ([`no_transparent_huge_pages`]):
//! mimalloc asks for them on its arenas (`madvise(MADV_HUGEPAGE)`), and a 2 MiB page stays
//! resident while any of its 4 KiB is live. The agent's heap is many small objects of long and
//! short lives, so huge pages kept ~35 MiB more resident than regular ones on the 10,000-pod
//! agent benchmark (at rest: 178.6 MiB with them, 145.6 MiB without).
//!
//! Rust allocations go to mimalloc (the binary's global allocator), which returns freed pages
//! by itself. libnftables still allocates through glibc's malloc — its caches of each context's
//! ruleset, every set element included, freed when a context is closed — and glibc keeps freed
//! memory in its arenas, returning only the free top of the main heap on its own. So after
//! work the agent trims glibc's arenas. Measured on the 10,000-pod agent benchmark (glibc
//! alone then): 243 MiB resident after the initial sync, 177 MiB after one `malloc_trim(0)`.

// The one C call of the crate: `malloc_trim` takes an integer and touches only the allocator's
// own state, under its own locks, from any thread.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

extern "C" {
    fn malloc_trim(pad: usize) -> std::os::raw::c_int;
}

/// Turns transparent huge pages off for this process (`prctl(PR_SET_THP_DISABLE)`), whatever
/// the node's setting (`always` or `madvise`) and whoever asks for them: see the
/// [module documentation](self). Failure (a kernel without the call) only costs memory.
pub fn no_transparent_huge_pages() {
    if let Err(e) = nix::sys::prctl::set_thp_disable(true) {
        tracing::debug!("transparent huge pages stay on: prctl: {e}");
    }
}

/// Returns every whole free page of every arena to the kernel (`madvise(MADV_DONTNEED)`).
pub fn release_free_memory() {
    // SAFETY: glibc's malloc_trim has no preconditions; pad 0 keeps nothing spare.
    unsafe {
        malloc_trim(0);
    }
}

/// When to trim: once work was done, at most once per `every` (a trim walks every arena: a few
/// milliseconds on a large heap, not worth paying at every event). Work done within the period
/// is trimmed at the first pass after it, idle or not, so an agent at rest settles at its live
/// size.
#[derive(Debug)]
pub struct Trimmer {
    every: Duration,
    last: Option<Instant>,
    pending: bool,
}

impl Trimmer {
    pub fn new(every: Duration) -> Trimmer {
        Trimmer {
            every,
            last: None,
            pending: false,
        }
    }

    /// Work was done: memory was allocated and freed.
    pub fn worked(&mut self) {
        self.pending = true;
    }

    /// Trims if work was done since the last trim and the period has passed; whether it did.
    pub fn maybe_trim(&mut self) -> bool {
        if !self.pending || self.last.is_some_and(|t| t.elapsed() < self.every) {
            return false;
        }
        release_free_memory();
        self.last = Some(Instant::now());
        self.pending = false;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_after_work_at_most_once_per_period() {
        let mut t = Trimmer::new(Duration::from_secs(3600));
        assert!(!t.maybe_trim(), "no work, no trim");
        t.worked();
        assert!(t.maybe_trim(), "the first work trims");
        t.worked();
        assert!(!t.maybe_trim(), "not again within the period");
        let mut t = Trimmer::new(Duration::ZERO);
        t.worked();
        assert!(t.maybe_trim());
        assert!(!t.maybe_trim(), "nothing since");
    }
}
