//! libnftables 1.0.6 (Debian 12) prints listings through process-wide state: its JSON printer
//! splits set type names with `strtok`. Two listings printed at once in two threads aborted
//! the whole process (`json.c:71: set_dtype_json: Assertion '__out' failed`), seen once in CI
//! while the dataplane adopted six netns in parallel. This drives many threads listing tables
//! with concatenated set types (the names `strtok` splits) at the same time, each in its own
//! netns: the process must survive and every listing must be whole. The race is narrow (two
//! `strtok` calls a few instructions apart): this did not abort here without the lock either
//! (6 threads × 1,000 listings of 100 sets, three runs), so it guards the path rather than
//! reproducing the abort; the cause was confirmed under gdb (`strtok` called from
//! `nft_run_cmd_from_buffer` for a JSON `list ruleset`).

use netwarden_dataplane::libnft::{NftContext, Output};
use netwarden_dataplane::netns::run_in;
use netwarden_testing::{root_or_skip, Namespaces};

const THREADS: usize = 6;
const ROUNDS: usize = 200;

/// Sets per table, each of a type whose name has several parts.
const SETS: usize = 100;

/// Each thread's set type: different parts, so a name split across threads shows.
const TYPES: [&[&str]; THREADS] = [
    &["ipv4_addr", "inet_proto", "inet_service"],
    &["ipv6_addr", "ifname"],
    &["ether_addr", "mark", "ipv4_addr", "inet_service"],
    &["ifname", "ipv6_addr", "inet_proto"],
    &["inet_service", "ipv4_addr"],
    &["mark", "ifname", "ether_addr"],
];

/// A table of `SETS` sets of type `parts` (the names `strtok` splits).
fn table(parts: &[&str]) -> String {
    let sets: String = (0..SETS)
        .map(|i| format!("  set s{i} {{ type {}; }}\n", parts.join(" . ")))
        .collect();
    format!("table inet nwthr {{\n{sets}}}\n")
}

/// How a listing names a set of type `parts`.
fn listed_type(parts: &[&str]) -> String {
    let quoted: Vec<String> = parts.iter().map(|p| format!("\"{p}\"")).collect();
    format!("\"type\": [{}]", quoted.join(", "))
}

#[test]
fn listings_in_parallel_threads_never_abort_the_process() {
    if !root_or_skip() {
        return;
    }
    let mut guard = Namespaces::new("nwthr");
    let netns: Vec<_> = (0..THREADS)
        .map(|i| guard.create(&format!("p{i}")))
        .collect();
    let workers: Vec<_> = netns
        .iter()
        .zip(TYPES)
        .map(|(path, parts)| {
            let path = path.clone();
            std::thread::spawn(move || {
                run_in(&path, || {
                    let mut ctx = NftContext::new().unwrap();
                    ctx.run(&table(parts), Output::Text).unwrap();
                    let expected = listed_type(parts);
                    for round in 0..ROUNDS {
                        let output = if round % 2 == 0 {
                            Output::JsonTerse
                        } else {
                            Output::Json
                        };
                        let listing = ctx.run("list ruleset", output).unwrap();
                        let parsed: serde_json::Value = serde_json::from_str(&listing).unwrap();
                        let sets = parsed["nftables"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .filter(|item| item.get("set").is_some())
                            .count();
                        assert_eq!(sets, SETS, "round {round}");
                        assert_eq!(
                            listing.matches(&expected).count(),
                            SETS,
                            "round {round}: every type whole: {listing:.2000}"
                        );
                    }
                })
                .unwrap()
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
}
