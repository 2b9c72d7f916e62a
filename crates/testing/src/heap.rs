//! Heap bytes live, exactly: mimalloc behind a counter, for benchmarks that report what a
//! structure holds (resident size also counts what the allocator keeps after frees).
//! A benchmark installs it with `#[global_allocator] static A: CountingAllocator =
//! CountingAllocator;` and reads [`live_mib`].
//!
//! mimalloc because it is the netwarden binary's global allocator: a benchmark of the engine
//! times what the agent runs. (The engine's incremental steps are allocation-heavy: at
//! 100,000 pods one relabel spent ~38% of its recomputation in glibc's malloc.)

use std::alloc::{GlobalAlloc, Layout};

use mimalloc::MiMalloc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// mimalloc, counting the bytes it has handed out and not had back.
pub struct CountingAllocator;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `MiMalloc` unchanged; only a counter is updated beside it.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { MiMalloc.realloc(ptr, layout, new_size) }
    }
}

/// Heap bytes live now, in MiB (0 unless [`CountingAllocator`] is the global allocator).
pub fn live_mib() -> f64 {
    LIVE_BYTES.load(Ordering::Relaxed) as f64 / (1024.0 * 1024.0)
}
