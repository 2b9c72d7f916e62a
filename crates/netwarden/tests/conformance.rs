//! Conformance suite: the Kubernetes NetworkPolicy e2e truth tables (conformance/netpol), their
//! dual-stack, MultiNetworkPolicy and DanmNetworkPolicy variants, and the multi-network and
//! monitor-mode cases of conformance/multinet, all checked through `netwarden reach`.
//!
//! Every case runs to the end; a mismatch prints the case, variant, step, port/protocol,
//! network and family with the expected, observed and difference matrices, and the test fails
//! at the end listing every failing case.

mod support;

use std::collections::BTreeSet;
use support::case::{conformance_dir, load_cases, load_objects, Case};
use support::reach::{check_probe, run_reach};
use support::variant::{self, Variant};

/// Runs every step of a case with the given objects and rewriters; returns the failures.
fn run_case(
    case: &Case,
    label: &str,
    base_objects: &[serde_json::Value],
    variant: Option<Variant>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for (i, step, prepared) in variant::prepared_steps(case, base_objects, variant) {
        let step_name = variant::step_name(label, i, step);
        let ready = match prepared {
            Ok(ready) => ready,
            Err(e) => {
                failures.push(format!("{step_name}: {e}"));
                continue;
            }
        };
        let probes = ready.probes;
        let records = match run_reach(&ready.objects, &ready.policies, &ready.ports) {
            Ok(r) => r,
            Err(e) => {
                println!("FAIL {step_name}: {e}");
                failures.push(format!("{step_name}: {e}"));
                continue;
            }
        };
        if failures.is_empty() && !records_conform(&probes, &records) {
            println!(
                "==== {label}: upstream {:?} ({}){}",
                case.upstream.as_deref().unwrap_or("none"),
                case.upstream_context.as_deref().unwrap_or("-"),
                case.notes
                    .as_ref()
                    .map(|n| format!("\nnotes: {n}"))
                    .unwrap_or_default()
            );
        }
        for probe in &probes {
            let what = format!(
                "{step_name} {}/{} network {} family {}",
                probe.port,
                probe.protocol,
                probe.network,
                probe.family.as_deref().unwrap_or("any")
            );
            match check_probe(probe, &records) {
                Ok(None) => {}
                Ok(Some(report)) => {
                    println!("FAIL {what}\n{report}");
                    failures.push(what);
                }
                Err(e) => {
                    println!("FAIL {what}: bad case data: {e}");
                    failures.push(format!("{what}: bad case data: {e}"));
                }
            }
        }
    }
    failures
}

/// Whether every probe of a step conforms (used to print a case header before its first failure).
fn records_conform(probes: &[support::case::Probe], records: &[support::reach::Record]) -> bool {
    probes
        .iter()
        .all(|p| matches!(check_probe(p, records), Ok(None)))
}

fn finish(suite: &str, total: usize, failures: Vec<String>) {
    if failures.is_empty() {
        println!("{suite}: {total} case runs conform");
        return;
    }
    panic!(
        "{suite}: {} failing checks over {total} case runs:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

fn run_upstream(v: Variant) {
    let dir = conformance_dir();
    let model = load_objects(&dir.join("model.yaml")).expect("conformance/model.yaml");
    let cases = load_cases(&dir.join("netpol")).expect("conformance/netpol");
    let mut failures = Vec::new();
    for case in &cases {
        let label = format!("{} [{}]", case.name, v.name());
        failures.extend(run_case(case, &label, &model, Some(v)));
    }
    finish(v.name(), cases.len(), failures);
}

#[test]
fn upstream_networkpolicy() {
    run_upstream(Variant::Base);
}

#[test]
fn upstream_networkpolicy_dualstack() {
    run_upstream(Variant::DualStack);
}

#[test]
fn upstream_as_multinetworkpolicy() {
    run_upstream(Variant::MultiNetworkPolicy);
}

#[test]
fn upstream_as_danmnetworkpolicy() {
    run_upstream(Variant::Danm);
}

#[test]
fn multinet_cases() {
    let dir = conformance_dir();
    let cases = load_cases(&dir.join("multinet")).expect("conformance/multinet");
    let mut failures = Vec::new();
    for case in &cases {
        match &case.objects {
            Some(objects) => failures.extend(run_case(case, &case.name, objects, None)),
            None => failures.push(format!("{}: multinet cases list their objects", case.name)),
        }
    }
    finish("multinet", cases.len(), failures);
}

/// The data alone (no binary needed): every file parses, every matrix is well formed and
/// names exactly the pods of its case, every variant can be derived.
#[test]
fn data_is_well_formed() {
    let dir = conformance_dir();
    let model = load_objects(&dir.join("model.yaml")).expect("conformance/model.yaml");
    let model_pods = pod_names(&model);
    assert_eq!(model_pods.len(), 9, "the model has 9 pods");
    let mut problems = Vec::new();
    let upstream = load_cases(&dir.join("netpol")).expect("conformance/netpol");
    let multinet = load_cases(&dir.join("multinet")).expect("conformance/multinet");
    assert!(upstream.len() >= 48, "every upstream It() is transcribed");
    let mut names = BTreeSet::new();
    for case in upstream.iter().chain(&multinet) {
        if !names.insert(case.name.clone()) {
            problems.push(format!("{}: duplicate case name", case.name));
        }
        let pods = match &case.objects {
            Some(objects) => pod_names(objects),
            None => model_pods.clone(),
        };
        for (i, step) in case.steps.iter().enumerate() {
            for probe in &step.probes {
                for text in std::iter::once(&probe.expect).chain(probe.staged.as_ref()) {
                    match support::matrix::Matrix::parse(text) {
                        Ok(m) if case.objects.is_none() && m.pods != pods => {
                            problems.push(format!(
                                "{} step {}: matrix pods differ from the model",
                                case.name,
                                i + 1
                            ))
                        }
                        Ok(m) if m.pods.iter().any(|p| !pods.contains(p)) => problems.push(
                            format!("{} step {}: matrix names an unknown pod", case.name, i + 1),
                        ),
                        Ok(_) => {}
                        Err(e) => problems.push(format!("{} step {}: {e}", case.name, i + 1)),
                    }
                }
            }
            if case.objects.is_none() {
                for v in Variant::ALL {
                    let built = variant::objects(v, &model)
                        .and(variant::policies(v, &step.policies))
                        .and(variant::probes(v, &step.probes));
                    if let Err(e) = built {
                        problems.push(format!("{} [{}] step {}: {e}", case.name, v.name(), i + 1));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn pod_names(objects: &[serde_json::Value]) -> Vec<String> {
    objects
        .iter()
        .filter(|o| o["kind"] == "Pod")
        .map(|o| {
            format!(
                "{}/{}",
                o["metadata"]["namespace"].as_str().unwrap_or("default"),
                o["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect()
}
