//! libFuzzer target: arbitrary bytes decoded into a history of watch events applied to a
//! `ClusterSet`, under the invariants of `netwarden_manifest::fuzzing::check_cluster`: no
//! panic, `upsert`/`remove`/`retain_kind` answers that match what changed, counts that match
//! the objects held, bounded problems naming their object, and incremental = fresh.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    netwarden_manifest::fuzzing::check_cluster(data);
});
