//! libFuzzer target: arbitrary bytes decoded into pod rules
//! (`netwarden_render::fuzzing::pod_rules_from_bytes`) and rendered by both backends under the
//! invariants of `check_render` (no panic, refusals only for names a backend cannot match, no
//! object text in any rule, interface names only as exact-match operands).
#![no_main]

use libfuzzer_sys::fuzz_target;
use netwarden_render::fuzzing::{check_render, pod_rules_from_bytes};
use netwarden_render::RenderOptions;

fuzz_target!(|data: &[u8]| {
    let rules = pod_rules_from_bytes(data);
    check_render(&rules, &RenderOptions::default());
});
