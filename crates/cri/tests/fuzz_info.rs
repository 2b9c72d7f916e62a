//! The CI run of the `cri_info` fuzz target: [`check_info`] (the verbose-info reader, raw and
//! on described infos compared with the documented answer) over the committed seed corpus
//! (`fuzz/seeds/cri_info`: the runtimes' real shapes, hostile variants, reproducers) and over
//! random inputs. `PROPTEST_CASES` raises the count for a longer run.

use std::path::Path;

use netwarden_cri::fuzzing::check_info;
use netwarden_testing::{check_reporting, replay_seeds};
use proptest::prelude::*;

fn check(label: &str, data: &[u8]) {
    check_reporting(label, data, check_info);
}

#[test]
fn seed_corpus_keeps_every_invariant() {
    replay_seeds("cri_info", 10, check_info);
}

/// The fixtures of the runtimes' answers, as they are and cut at every point (a runtime
/// killed mid-answer, a proxy truncating it).
#[test]
fn fixtures_cut_anywhere_keep_every_invariant() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let mut runs = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let data = std::fs::read(&path).unwrap();
        for cut in 0..=data.len() {
            check(&format!("{} cut at {cut}", path.display()), &data[..cut]);
            runs += 1;
        }
    }
    assert!(runs > 1000, "{runs} inputs checked");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn random_inputs_keep_every_invariant(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        check("random", &data);
    }
}
