//! The CI run of the `engine` fuzz target: [`check_engine`] (verdicts equal the reference
//! evaluation of the specification, incremental equals fresh, idempotent feeding, well-formed
//! rules, `AddrSet` algebra) over the committed seed corpus (`fuzz/seeds/engine`, reproducers of
//! past findings included) and over random inputs. `PROPTEST_CASES` raises the count for a
//! longer run.

use netwarden_engine::fuzzing::check_engine;
use netwarden_testing::{check_reporting, replay_seeds};
use proptest::prelude::*;

fn check(label: &str, data: &[u8]) {
    check_reporting(label, data, check_engine);
}

#[test]
fn seed_corpus_keeps_every_invariant() {
    replay_seeds("engine", 10, check_engine);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_clusters_keep_every_invariant(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        check("random", &data);
    }
}
