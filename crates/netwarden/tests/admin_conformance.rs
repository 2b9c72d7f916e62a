//! The admin-policy conformance corpus (tests/admin_conformance: upstream's
//! AdminNetworkPolicy/BaselineAdminNetworkPolicy suite at v0.1.7 and ClusterNetworkPolicy suite
//! at main, every asserted connectivity state) replayed through the independent reference
//! evaluator of `netwarden_testing::admin_reference`.
//!
//! This pins the transcription and the reference against each other: a mismatch is either a
//! transcription mistake or a misreading of upstream's semantics, and both must be fixed before
//! the engine and the lab are checked against the same corpus. Every probe runs; the test fails
//! at the end listing every mismatch with its case, step and upstream line.

use std::collections::BTreeMap;

use netwarden_testing::admin_corpus::{self, Corpus};
use netwarden_testing::admin_reference;

fn corpus() -> Corpus {
    admin_corpus::load(&admin_corpus::default_dir()).expect("the corpus loads")
}

#[test]
fn reference_reproduces_every_upstream_probe() {
    let corpus = corpus();
    let mut failures = Vec::new();
    // tag -> (cases, steps, probes)
    let mut counts: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    for case in &corpus.cases {
        let count = counts.entry(case.source.tag.clone()).or_default();
        count.0 += 1;
        let states = match case.states(&corpus.cluster) {
            Ok(s) => s,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        for (i, (step, objects)) in states.iter().enumerate() {
            count.1 += 1;
            for probe in &step.expect {
                count.2 += 1;
                let what = format!("{} step {i} {:?}: {probe}", case.name(), step.name);
                match admin_reference::decide(
                    objects,
                    &probe.from,
                    &probe.to,
                    probe.port,
                    probe.protocol,
                ) {
                    Ok(d) if d.allowed() == probe.allowed => {}
                    Ok(d) => failures.push(format!(
                        "{what}: reference says {} (egress: {}; ingress: {})",
                        if d.allowed() { "allowed" } else { "denied" },
                        d.egress.by,
                        d.ingress.by
                    )),
                    Err(e) => failures.push(format!("{what}: {e}")),
                }
            }
        }
    }
    for (tag, (cases, steps, probes)) in &counts {
        println!("{tag}: {cases} cases, {steps} steps, {probes} probes");
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn corpus_covers_both_tags_and_is_well_formed() {
    let corpus = corpus();
    for tag in ["v0.1.7", "main"] {
        let cases: Vec<_> = corpus.of_tag(tag).collect();
        assert!(!cases.is_empty(), "no case of {tag}");
        for case in cases {
            assert!(!case.steps.is_empty(), "{}: no step", case.name());
            // Every case starts from a cluster without policies: its first step applies them.
            assert!(
                !case.steps[0].apply.is_empty(),
                "{}: the first step applies nothing",
                case.name()
            );
            let file = case.source.file.rsplit('/').next().unwrap_or_default();
            for step in &case.steps {
                assert!(
                    !step.expect.is_empty(),
                    "{} {:?}: no probe",
                    case.name(),
                    step.name
                );
                for probe in &step.expect {
                    assert!(
                        probe.upstream.starts_with(&format!("{file}:")),
                        "{}: {probe} does not point into {file}",
                        case.name()
                    );
                }
            }
        }
    }
    // Names are unique: a later loader keyed by name must not silently merge cases.
    let mut names: Vec<_> = corpus.cases.iter().map(|c| c.name()).collect();
    let total = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), total, "duplicate case names");
    // Policy kinds per tag: v1alpha1 objects at v0.1.7, v1alpha2 at main.
    for case in &corpus.cases {
        for step in &case.steps {
            for obj in &step.apply {
                let kind = obj["kind"].as_str().unwrap_or_default();
                let ok = match (case.source.tag.as_str(), kind) {
                    (_, "NetworkPolicy" | "Namespace") => true,
                    ("v0.1.7", k) => k == "AdminNetworkPolicy" || k == "BaselineAdminNetworkPolicy",
                    ("main", k) => k == "ClusterNetworkPolicy",
                    _ => false,
                };
                assert!(ok, "{}: unexpected {kind}", case.name());
            }
        }
    }
}

/// The same corpus through netwarden itself: every step's objects written to a directory and
/// `netwarden reach -f` asked for the step's ports; each upstream probe must get the verdict
/// upstream asserts (the IPv4 probe: the corpus's addresses are `status.podIP`). Probes `reach`
/// does not list (a host-network pod, which has no policy side of its own) are counted, not
/// checked, and must stay few.
#[test]
fn netwarden_reproduces_every_upstream_probe() {
    let corpus = corpus();
    let bin = env!("CARGO_BIN_EXE_netwarden");
    let mut failures = Vec::new();
    let (mut checked, mut unlisted) = (0usize, 0usize);
    for case in &corpus.cases {
        let states = case.states(&corpus.cluster).expect("the corpus replays");
        for (i, (step, objects)) in states.iter().enumerate() {
            if step.expect.is_empty() {
                continue;
            }
            let dir = netwarden_testing::TempDir::new("admin-conformance");
            let docs: Vec<serde_json::Value> = objects.to_vec();
            dir.write("objects.yaml", &netwarden_testing::docs_text(&docs));
            let mut ports: Vec<String> = step
                .expect
                .iter()
                .map(|p| format!("{}/{}", p.port, p.protocol.as_str()))
                .collect();
            ports.sort();
            ports.dedup();
            let mut args = vec![
                "reach".to_string(),
                "-f".into(),
                dir.path.display().to_string(),
                "-o".into(),
                "json".into(),
            ];
            for p in &ports {
                args.push("--port".into());
                args.push(p.clone());
            }
            let out = std::process::Command::new(bin)
                .args(&args)
                .output()
                .unwrap();
            let what = format!("{} step {i} {:?}", case.name(), step.name);
            let Ok(report) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
                failures.push(format!(
                    "{what}: reach failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
                continue;
            };
            let probes = report["probes"].as_array().cloned().unwrap_or_default();
            for probe in &step.expect {
                let found = probes.iter().find(|p| {
                    p["from"] == probe.from.as_str()
                        && p["to"] == probe.to.as_str()
                        && p["port"] == probe.port
                        && p["protocol"]
                            .as_str()
                            .is_some_and(|s| s.eq_ignore_ascii_case(probe.protocol.as_str()))
                        && p["network"] == "default"
                        && (p.get("family").is_none() || p["family"] == "ipv4")
                });
                let Some(found) = found else {
                    unlisted += 1;
                    continue;
                };
                checked += 1;
                if found["allowed"] != probe.allowed {
                    failures.push(format!(
                        "{what}: {probe}: netwarden says allowed={}",
                        found["allowed"]
                    ));
                }
            }
        }
    }
    println!(
        "netwarden against the corpus: {checked} probes checked, {unlisted} not listed by reach"
    );
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked > 500, "most probes are checked: {checked}");
}
