//! The renderers on rules decoded from arbitrary bytes (the CI run of the `render` fuzz
//! target): no panic, refusals only where a backend cannot match a name, no object text in any
//! rule. `PROPTEST_CASES` raises the count for a long run.

use netwarden_render::fuzzing::{check_render, pod_rules_from_bytes};
use netwarden_render::RenderOptions;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_rules_render_safely(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        let rules = pod_rules_from_bytes(&data);
        check_render(&rules, &RenderOptions::default());
    }
}
