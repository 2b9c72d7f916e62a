//! The renderers on rules decoded from arbitrary bytes (the CI run of the `render` fuzz
//! target): no panic, refusals only where a backend cannot match a name, no object text in any
//! rule. Over the committed seed corpus (`fuzz/seeds/render`) and random inputs;
//! `PROPTEST_CASES` raises the count for a long run.

use std::path::Path;

use netwarden_render::fuzzing::{check_render, pod_rules_from_bytes};
use netwarden_render::RenderOptions;
use proptest::prelude::*;

fn check(label: &str, data: &[u8]) {
    let rules = pod_rules_from_bytes(data);
    if let Err(panic) = std::panic::catch_unwind(|| check_render(&rules, &RenderOptions::default()))
    {
        eprintln!("input that broke an invariant ({label}): {data:?}");
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn seed_corpus_renders_safely() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/render");
    let mut seeds: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    seeds.sort();
    assert!(
        seeds.len() >= 8,
        "seed corpus missing under {}",
        dir.display()
    );
    for path in seeds {
        check(&path.display().to_string(), &std::fs::read(&path).unwrap());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_rules_render_safely(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        check("random", &data);
    }
}
