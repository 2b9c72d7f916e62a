//! The CI run of the `nflog` fuzz target: [`check_nflog`] (the netlink parser, the packet
//! decoder and the event builder on raw and on described buffers) over the committed seed
//! corpus (`fuzz/seeds/nflog`, reproducers of past findings included) and over random inputs.
//! `PROPTEST_CASES` raises the count for a longer run.

use netwarden_monitor::fuzzing::check_nflog;
use netwarden_testing::{check_reporting, replay_seeds};
use proptest::prelude::*;

fn check(label: &str, data: &[u8]) {
    check_reporting(label, data, check_nflog);
}

#[test]
fn seed_corpus_keeps_every_invariant() {
    replay_seeds("nflog", 10, check_nflog);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn random_buffers_keep_every_invariant(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        check("random", &data);
    }
}
