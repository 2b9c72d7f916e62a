//! The CI run of the `cluster` fuzz target: [`check_cluster`] (ClusterSet under histories of
//! watch events: upsert/remove/relist answers, counts, problems, incremental = fresh) over the
//! committed seed corpus (`fuzz/seeds/cluster`, reproducers of past findings included) and
//! over random inputs. `PROPTEST_CASES` raises the count for a longer run.

use std::path::Path;

use netwarden_manifest::fuzzing::check_cluster;
use proptest::prelude::*;

fn check(label: &str, data: &[u8]) {
    if let Err(panic) = std::panic::catch_unwind(|| check_cluster(data)) {
        eprintln!("input that broke an invariant ({label}): {data:?}");
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn seed_corpus_keeps_every_invariant() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/cluster");
    let mut seeds: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    seeds.sort();
    assert!(
        seeds.len() >= 10,
        "seed corpus missing under {}",
        dir.display()
    );
    for path in seeds {
        check(&path.display().to_string(), &std::fs::read(&path).unwrap());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn random_histories_keep_every_invariant(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        check("random", &data);
    }
}
