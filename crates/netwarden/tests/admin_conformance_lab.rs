//! The admin-policy conformance corpus (tests/admin_conformance: upstream's v0.1.7 and main
//! suites, every asserted state of every test) on the kernel, both backends: each case runs as
//! one `netwarden lab check -f STATE0 --then STATE1 ... --json`, which builds the netns of the
//! case's cluster once, enforces each step's objects in turn (admin policies, NetworkPolicies,
//! relabelled namespaces, Nodes) and makes real connections between every pod pair.
//!
//! Each upstream probe must be observed as upstream asserts it: the connection made iff
//! `allowed`, and a denied one refused (netwarden REJECTs; `lab check` flags a timeout as a
//! mismatch). Any mismatch `lab check` reports between the kernel and `reach` on any probe of
//! any state (also the pairs and the IPv6 family upstream does not assert) fails too.
//!
//! The node-peer tests dial host-network pods (the centaur pods, at their Node's address): the
//! lab gives each a netns of its own standing for its node (`netwarden::lab::lab_pods`), so a
//! `nodes` peer is matched against a real connection too. SCTP probes are raw INITs where the
//! kernel has no SCTP sockets (`netwarden_lab`'s `sctp`); where it has them the lab cannot
//! probe SCTP (`observed: null`), and those probes are counted and reported. Every other probe
//! must be observed.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use netwarden_testing::admin_corpus::{self, Case, Corpus, Protocol};
use netwarden_testing::{
    assert_no_failures, docs_text, lab_check_states, lab_slot, layer, per_backend, root_or_skip,
    LabProbe, TempDir,
};
use serde_json::Value;

const BACKENDS: [&str; 2] = ["nft", "iptables"];

/// Counters of one backend's run.
#[derive(Debug, Default)]
struct Tally {
    labs: usize,
    states: usize,
    observed: usize,
    sctp: usize,
    host_network: usize,
    elapsed: Duration,
}

/// What one case's lab run returned: per state, its probes.
fn run_case_lab(
    case: &Case,
    cluster: &[Value],
    backend: &str,
) -> Result<Vec<Vec<LabProbe>>, String> {
    let states: Vec<Vec<Value>> = case
        .states(cluster)?
        .into_iter()
        .map(|(_, objects)| objects)
        .collect();
    let ports: BTreeSet<(u16, String)> = case
        .steps
        .iter()
        .flat_map(|s| &s.expect)
        .map(|p| (p.port, p.protocol.as_str().to_string()))
        .collect();
    let reports = lab_check_states(
        env!("CARGO_BIN_EXE_netwarden"),
        &states,
        backend,
        &ports,
        &[],
    )?;
    reports.iter().map(LabProbe::all_of).collect()
}

/// The host-network pods of the cluster (`ns/name`).
fn host_network_pods(cluster: &[Value]) -> BTreeSet<String> {
    cluster
        .iter()
        .filter(|o| o["kind"] == "Pod" && o["spec"]["hostNetwork"] == true)
        .map(|o| {
            format!(
                "{}/{}",
                o["metadata"]["namespace"].as_str().unwrap_or_default(),
                o["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

/// Checks one case's states against its upstream probes (and `lab check`'s own comparison).
fn check_case(
    case: &Case,
    states: &[Vec<LabProbe>],
    host_network: &BTreeSet<String>,
    backend: &str,
    tally: &mut Tally,
    failures: &mut Vec<String>,
) {
    for (k, (step, records)) in case.steps.iter().zip(states).enumerate() {
        let what = format!("{} [{backend}] step {k} {:?}", case.name(), step.name);
        tally.states += 1;
        for r in records.iter().filter(|r| r.mismatch.is_some()) {
            failures.push(format!(
                "{what}: kernel and reach disagree on {} -> {} {}/{} ({}): {}; {}",
                r.from,
                r.to,
                r.port,
                r.protocol,
                r.family,
                r.mismatch.as_deref().unwrap_or_default(),
                r.detail()
            ));
        }
        for probe in &step.expect {
            let found = records.iter().find(|r| {
                r.from == probe.from
                    && r.to == probe.to
                    && r.port == probe.port
                    && r.protocol.eq_ignore_ascii_case(probe.protocol.as_str())
                    && r.network == "default"
                    && r.family == "ipv4"
            });
            let Some(r) = found else {
                if host_network.contains(&probe.to) {
                    tally.host_network += 1;
                } else {
                    failures.push(format!("{what}: {probe}: no lab probe"));
                }
                continue;
            };
            let Some(seen) = r.observed else {
                if probe.protocol == Protocol::Sctp {
                    tally.sctp += 1;
                } else {
                    failures.push(format!("{what}: {probe}: not observed; {}", r.detail()));
                }
                continue;
            };
            tally.observed += 1;
            if seen != probe.allowed || r.allowed != probe.allowed {
                failures.push(format!(
                    "{what}: {probe}: observed {}, reach {}; {}",
                    verdict(seen),
                    verdict(r.allowed),
                    r.detail()
                ));
            }
        }
    }
}

fn verdict(v: bool) -> &'static str {
    if v {
        "allowed"
    } else {
        "denied"
    }
}

fn run_backend(corpus: &Corpus, backend: &str) -> (Tally, Vec<String>) {
    let host_network = host_network_pods(&corpus.cluster);
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    for case in &corpus.cases {
        let before = failures.len();
        let started = Instant::now();
        let result = {
            let _slot = lab_slot();
            run_case_lab(case, &corpus.cluster, backend)
        };
        tally.elapsed += started.elapsed();
        tally.labs += 1;
        match result {
            Ok(states) => check_case(
                case,
                &states,
                &host_network,
                backend,
                &mut tally,
                &mut failures,
            ),
            Err(e) => failures.push(format!("{} [{backend}]: {e}", case.name())),
        }
        for f in &failures[before..] {
            println!("FAIL {f}");
        }
    }
    println!(
        "{backend}: {} labs, {} states, {} upstream probes observed, not observable: {} to \
         host-network pods, {} SCTP; {:.1} s",
        tally.labs,
        tally.states,
        tally.observed,
        tally.host_network,
        tally.sctp,
        tally.elapsed.as_secs_f64()
    );
    (tally, failures)
}

#[test]
fn admin_conformance_on_the_kernel() {
    if !root_or_skip() {
        return;
    }
    let corpus = admin_corpus::load(&admin_corpus::default_dir()).expect("the corpus loads");
    let total: usize = corpus
        .cases
        .iter()
        .flat_map(|c| &c.steps)
        .map(|s| s.expect.len())
        .sum();
    let sctp_total = corpus
        .cases
        .iter()
        .flat_map(|c| &c.steps)
        .flat_map(|s| &s.expect)
        .filter(|p| p.protocol == Protocol::Sctp)
        .count();
    let runs = per_backend(&BACKENDS, |backend| run_backend(&corpus, backend));
    let mut failures = Vec::new();
    for (backend, (tally, backend_failures)) in BACKENDS.iter().zip(runs) {
        failures.extend(backend_failures);
        // Every probe is accounted for: observed, or one of the two known kinds.
        assert_eq!(
            tally.observed + tally.sctp + tally.host_network,
            total,
            "[{backend}] probes unaccounted for"
        );
        // The host-network pods have their netns: every probe to them is observed. SCTP is
        // observed unless the kernel has SCTP sockets (then the lab has no SCTP prober).
        assert_eq!(tally.host_network, 0, "[{backend}] {tally:?}");
        assert!(
            tally.sctp == 0 || tally.sctp == sctp_total,
            "[{backend}] SCTP is probed everywhere or nowhere: {tally:?}"
        );
        assert_eq!(
            tally.observed + tally.sctp,
            total,
            "[{backend}] every other probe is observed: {tally:?}"
        );
    }
    assert_no_failures("failing checks on the kernel", &failures);
}

/// SPEC 8's monitor phase on the kernel, both backends: the steps of netwarden's own case
/// `conformance/multinet/11-admin-monitor.yaml` (their expected matrices are
/// `conformance_lab.rs`'s) run as one `lab check --then`. Traffic follows the enforced
/// policies only (every probe observed as `allowed`, whatever `staged_allowed` says), and each
/// would-deny is logged naming the monitored admin policy as `Kind/name`, with cause
/// `admin-tier`, on the pod and direction it would deny in; nothing else is logged.
#[test]
fn monitored_admin_policies_log_would_denies_and_change_no_traffic() {
    if !root_or_skip() {
        return;
    }
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../conformance/multinet/11-admin-monitor.yaml");
    let case: Value = serde_saphyr::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let objects = case["objects"].as_array().expect("objects").clone();
    let states: Vec<Vec<Value>> = case["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            let mut all = objects.clone();
            all.extend(s["policies"].as_array().cloned().unwrap_or_default());
            all
        })
        .collect();
    let ports = BTreeSet::from([(80, "TCP".to_string()), (80, "UDP".to_string())]);
    // (state, direction, pod, monitored policy) -> the peers it would deny, per the case's
    // staged matrices: state 0 x/a's ingress from x/b and y/c, state 2 x/a's egress to them.
    let expected: BTreeSet<(usize, &str, &str, &str, &str)> = [
        (0, "ingress", "x/b", "ClusterNetworkPolicy/deny-to-a"),
        (0, "ingress", "y/c", "ClusterNetworkPolicy/deny-to-a"),
        (2, "egress", "x/b", "ClusterNetworkPolicy/deny-a-egress"),
        (2, "egress", "y/c", "ClusterNetworkPolicy/deny-a-egress"),
    ]
    .into_iter()
    .map(|(k, d, peer, policy)| (k, d, "x/a", peer, policy))
    .collect();
    for backend in BACKENDS {
        let steps = {
            let _slot = lab_slot();
            lab_check_states(
                env!("CARGO_BIN_EXE_netwarden"),
                &states,
                backend,
                &ports,
                &[],
            )
            .unwrap()
        };
        let mut seen = BTreeSet::new();
        for (k, step) in steps.iter().enumerate() {
            for p in LabProbe::all_of(step).unwrap() {
                assert_eq!(
                    p.observed,
                    Some(p.allowed),
                    "[{backend}] state {k}: {}",
                    p.detail()
                );
                assert!(
                    p.mismatch.is_none(),
                    "[{backend}] state {k}: {}",
                    p.detail()
                );
            }
            for e in step["events"].as_array().expect("events") {
                assert_eq!(e["action"], "would-deny", "[{backend}] state {k}: {e}");
                assert_eq!(e["cause"], "admin-tier", "[{backend}] state {k}: {e}");
                let policies = e["policies"].as_array().expect("policies");
                assert_eq!(policies.len(), 1, "[{backend}] state {k}: {e}");
                let key = (
                    k,
                    e["direction"].as_str().unwrap_or_default().to_string(),
                    e["pod"].as_str().unwrap_or_default().to_string(),
                    e["peer"].as_str().unwrap_or_default().to_string(),
                    policies[0].as_str().unwrap_or_default().to_string(),
                );
                seen.insert(key);
            }
        }
        let seen: BTreeSet<(usize, &str, &str, &str, &str)> = seen
            .iter()
            .map(|(k, d, pod, peer, policy)| {
                (*k, d.as_str(), pod.as_str(), peer.as_str(), policy.as_str())
            })
            .collect();
        assert_eq!(seen, expected, "[{backend}] would-deny events");
    }
}

/// `--then` keeps one topology: a state without one of the pods is refused with an error that
/// says so and names the pods, and nothing is printed as if it had been probed.
#[test]
fn a_state_that_changes_the_pods_is_refused() {
    if !root_or_skip() {
        return;
    }
    let corpus = admin_corpus::load(&admin_corpus::default_dir()).expect("the corpus loads");
    let dir = TempDir::new("admin-lab-topology");
    dir.write("s0.yaml", &docs_text(&corpus.cluster));
    let fewer: Vec<Value> = corpus
        .cluster
        .iter()
        .filter(|o| o["metadata"]["name"] != "harry-potter-1")
        .cloned()
        .collect();
    dir.write(
        "s1.yaml",
        &docs_text(&layer(&corpus.cluster, &fewer).unwrap()),
    );
    let out = {
        let _slot = lab_slot();
        std::process::Command::new(env!("CARGO_BIN_EXE_netwarden"))
            .args(["lab", "check", "--port", "80/TCP", "--json", "-f"])
            .arg(dir.path.join("s0.yaml"))
            .arg("--then")
            .arg(dir.path.join("s1.yaml"))
            .output()
            .unwrap()
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("changes the lab's topology")
            && stderr.contains("network-policy-conformance-gryffindor/harry-potter-1"),
        "{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
