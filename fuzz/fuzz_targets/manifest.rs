//! libFuzzer target: arbitrary bytes through the manifest loader, as YAML and as JSON, with
//! the invariants of `netwarden_manifest::fuzzing::check_load` (no panic, valid names, no
//! policy wider than written, bounded one-line problems).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    netwarden_manifest::fuzzing::check_load(data);
});
