//! libFuzzer target: arbitrary bytes decoded into a small cluster and a history of changes
//! (`netwarden_engine::fuzzing::Scenario`), under the invariants of `check_engine`: verdicts
//! equal a reference evaluation of the specification, incremental equals fresh, feeding the
//! same objects again changes nothing, rules are well-formed, and `AddrSet` algebra holds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    netwarden_engine::fuzzing::check_engine(data);
});
