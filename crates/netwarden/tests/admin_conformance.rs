//! The admin-policy conformance corpus (tests/admin_conformance: upstream's
//! AdminNetworkPolicy/BaselineAdminNetworkPolicy suite at v0.1.7 and ClusterNetworkPolicy suite
//! at main, every asserted connectivity state) replayed through the independent reference
//! evaluator of `netwarden_testing::admin_reference`.
//!
//! This pins the transcription and the reference against each other: a mismatch is either a
//! transcription mistake or a misreading of upstream's semantics, and both must be fixed before
//! the engine and the lab are checked against the same corpus. Every probe runs; the test fails
//! at the end listing every mismatch with its case, step and upstream line.

#[allow(dead_code)] // the helpers serve `conformance.rs` too; this file reads cases only
mod support;

use std::collections::{BTreeMap, BTreeSet};

use netwarden_testing::admin_corpus::{self, Corpus, Protocol};
use netwarden_testing::admin_reference;
use serde_json::Value;
use support::case::{conformance_dir, load_cases};
use support::matrix::Matrix;

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

/// netwarden's own admin-policy cases (`conformance/multinet/*-admin-*.yaml`, expected verdicts
/// written by hand from SPEC 8; `conformance.rs` checks them through `reach`,
/// `conformance_lab.rs` on the kernel) checked against the reference evaluator where it reads
/// them: the primary network's IPv4 cells (it dials `status.podIP`), with the policies
/// annotated `k8s.v1.cni.cncf.io/policy-for` left out (SPEC 8: they do not apply on the
/// primary network; the reference knows no networks), the expected matrix with the monitored
/// policies left out and the staged matrix with them enforced (the monitor phase; no case uses
/// `replaces`). The reference is strict: it refuses the invalid rules of the fail-closed case,
/// whose steps are counted and must be that case's only.
#[test]
fn reference_agrees_with_own_admin_cases() {
    let cases: Vec<_> = load_cases(&conformance_dir().join("multinet"))
        .expect("conformance/multinet")
        .into_iter()
        .filter(|c| c.name.starts_with("admin-"))
        .collect();
    assert!(cases.len() >= 6, "the own admin cases: {}", cases.len());
    let (mut checked, mut refused) = (0usize, BTreeSet::new());
    let mut failures = Vec::new();
    for case in &cases {
        let base = case.objects.clone().expect("own cases list their objects");
        for (i, step) in case.steps.iter().enumerate() {
            let mut objects = base.clone();
            objects.extend(step.policies.iter().cloned());
            objects.retain(|o| annotation(o, "k8s.v1.cni.cncf.io/policy-for").is_none());
            let enforced: Vec<Value> = objects
                .iter()
                .filter(|o| annotation(o, "netwarden.io/mode") != Some("monitor"))
                .cloned()
                .collect();
            let staged: Vec<Value> = objects
                .iter()
                .cloned()
                .map(|mut o| {
                    if let Some(a) = o["metadata"]["annotations"].as_object_mut() {
                        a.remove("netwarden.io/mode");
                    }
                    o
                })
                .collect();
            let what = format!("{} step {}", case.name, i + 1);
            for probe in step.probes.iter().filter(|p| {
                p.network == "default" && p.family.as_deref().is_none_or(|f| f == "ipv4")
            }) {
                let protocol = match probe.protocol.as_str() {
                    "TCP" => Protocol::Tcp,
                    "UDP" => Protocol::Udp,
                    _ => Protocol::Sctp,
                };
                let views = [
                    ("allowed", &enforced, &probe.expect),
                    (
                        "staged_allowed",
                        &staged,
                        probe.staged.as_ref().unwrap_or(&probe.expect),
                    ),
                ];
                for (view, objects, text) in views {
                    let matrix = Matrix::parse(text).expect("a well-formed matrix");
                    for ((from, to), want) in &matrix.cells {
                        match admin_reference::decide(objects, from, to, probe.port, protocol) {
                            Ok(d) => {
                                checked += 1;
                                if d.allowed() != *want {
                                    failures.push(format!(
                                        "{what} {}/{} {view} {from} -> {to}: case says {want}, \
                                         reference {} (egress: {}; ingress: {})",
                                        probe.port,
                                        probe.protocol,
                                        d.allowed(),
                                        d.egress.by,
                                        d.ingress.by
                                    ));
                                }
                            }
                            Err(_) => {
                                refused.insert(format!("{}/{}", case.name, i + 1));
                            }
                        }
                    }
                }
            }
        }
    }
    println!("own admin cases against the reference: {checked} cells checked, steps refused by the reference: {refused:?}");
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        refused.iter().all(|s| s.starts_with("admin-fail-closed/")),
        "only the fail-closed case's invalid rules may be refused: {refused:?}"
    );
    assert!(checked > 300, "most cells are checked: {checked}");
}

fn annotation<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    object["metadata"]["annotations"][key].as_str()
}
