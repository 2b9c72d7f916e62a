//! The renderers on rules decoded from arbitrary bytes (the CI run of the `render` fuzz
//! target): no panic, refusals only where a backend cannot match a name, no object text in any
//! rule. Over the committed seed corpus (`fuzz/seeds/render`) and random inputs;
//! `PROPTEST_CASES` raises the count for a long run.

use netwarden_render::fuzzing::{check_render, pod_rules_from_bytes};
use netwarden_render::RenderOptions;
use netwarden_testing::{check_reporting, replay_seeds};
use proptest::prelude::*;

/// The render invariants on the rules `data` decodes to.
fn render_safely(data: &[u8]) {
    check_render(&pod_rules_from_bytes(data), &RenderOptions::default());
}

fn check(label: &str, data: &[u8]) {
    check_reporting(label, data, render_safely);
}

#[test]
fn seed_corpus_renders_safely() {
    replay_seeds("render", 8, render_safely);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_rules_render_safely(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        check("random", &data);
    }
}
