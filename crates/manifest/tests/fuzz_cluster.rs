//! The CI run of the `cluster` fuzz target: [`check_cluster`] (ClusterSet under histories of
//! watch events: upsert/remove/relist answers, counts, problems, incremental = fresh) over the
//! committed seed corpus (`fuzz/seeds/cluster`, reproducers of past findings included) and
//! over random inputs. `PROPTEST_CASES` raises the count for a longer run.

use netwarden_manifest::fuzzing::check_cluster;
use netwarden_testing::{check_reporting, replay_seeds};
use proptest::prelude::*;

fn check(label: &str, data: &[u8]) {
    check_reporting(label, data, check_cluster);
}

#[test]
fn seed_corpus_keeps_every_invariant() {
    replay_seeds("cluster", 10, check_cluster);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn random_histories_keep_every_invariant(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        check("random", &data);
    }
}
