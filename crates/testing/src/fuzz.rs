//! The CI side of the cargo-fuzz targets (`fuzz/`): each crate's `tests/fuzz_*.rs` replays its
//! target's committed seed corpus (`fuzz/seeds/<target>`, reproducers of past findings
//! included) through the same check function the target runs, and random inputs through
//! proptest. What they share is here: reading the corpus, and saying which input broke an
//! invariant before the panic goes on.

use std::path::{Path, PathBuf};

/// Runs `check(data)`; if it panics, prints `label` and the input first (a failing random
/// input is otherwise lost), then lets the panic go on.
pub fn check_reporting(label: &str, data: &[u8], check: impl Fn(&[u8])) {
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(data))) {
        eprintln!("input that broke an invariant ({label}): {data:?}");
        std::panic::resume_unwind(panic);
    }
}

/// The seed corpus of the cargo-fuzz target `target`: its files, sorted.
pub fn seed_files(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    let mut seeds: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    seeds.sort();
    seeds
}

/// Runs `check` over every seed of `target` (at least `at_least` of them, or the corpus is
/// missing), reporting the one that breaks an invariant.
pub fn replay_seeds(target: &str, at_least: usize, check: impl Fn(&[u8])) {
    let seeds = seed_files(target);
    assert!(
        seeds.len() >= at_least,
        "seed corpus of {target}: {} files, expected at least {at_least}",
        seeds.len()
    );
    for path in seeds {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        check_reporting(&path.display().to_string(), &data, &check);
    }
}
