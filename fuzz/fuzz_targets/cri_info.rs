//! libFuzzer target: arbitrary bytes through the CRI verbose-info reader under the invariants
//! of `netwarden_cri::fuzzing::check_info`: as the info JSON and as a map key (no panic, only
//! plain absolute netns paths the info names, host network only when no source names one,
//! bounded one-line errors), and as a description of a runtime's answer whose reading must be
//! the documented one.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    netwarden_cri::fuzzing::check_info(data);
});
