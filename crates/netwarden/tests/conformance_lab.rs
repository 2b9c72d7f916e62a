//! The conformance suite end to end on the kernel: every step of the plain IPv4 NetworkPolicy
//! cases (conformance/netpol) and of the multi-network and monitor cases (conformance/multinet)
//! goes through `netwarden lab check`, which builds a netns per pod, enforces netwarden's rules
//! with the nft or iptables backend, and makes real connections between every pod pair.
//!
//! What a real connection did must equal the case's expected matrix (not only `reach`'s
//! prediction, which the `conformance` test checks separately), and must equal `allowed` even
//! where monitored policies make `staged_allowed` differ: monitor mode never changes traffic.
//! SCTP cannot be probed on this kernel (`observed: null`); those probes are counted, not
//! checked. Every case, step and backend runs; the test fails at the end listing every failure.

#[allow(dead_code)] // the helpers serve `conformance.rs` too; this runner uses part of them
mod support;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use support::case::{apply_labels, conformance_dir, load_cases, load_objects, Case, Probe};
use support::matrix::Matrix;
use support::reach::{write_docs, TempDir};
use support::variant::{self, Variant};

/// One lab at a time: a lab is a whole netns topology, and other lab tests may run in parallel.
static LAB_LOCK: Mutex<()> = Mutex::new(());

const BACKENDS: [&str; 2] = ["nft", "iptables"];

/// One probe record of `netwarden lab check --json`.
#[derive(Debug)]
struct LabProbe {
    from: String,
    to: String,
    network: String,
    port: u16,
    protocol: String,
    family: String,
    allowed: bool,
    staged_allowed: bool,
    /// `None`: not probed (SCTP has no sockets on this kernel).
    observed: Option<bool>,
    raw: Value,
}

/// Counters of one backend's run.
#[derive(Debug, Default)]
struct Tally {
    labs: usize,
    observed: usize,
    sctp_skipped: usize,
    elapsed: Duration,
}

/// Whether the test can run: root is needed to build network namespaces.
fn have_root() -> bool {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    if uid == "0" {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("conformance_lab needs root (uid {uid:?}) and CI=true: refusing to skip");
    }
    println!("skipped: needs root");
    false
}

/// Runs `netwarden lab check` on the objects and policies for the given ports.
fn run_lab(
    backend: &str,
    objects: &[Value],
    policies: &[Value],
    ports: &BTreeSet<(u16, String)>,
) -> Result<Vec<LabProbe>, String> {
    let dir = TempDir::new("lab");
    write_docs(&dir.path.join("objects.yaml"), objects)?;
    write_docs(&dir.path.join("policies.yaml"), policies)?;
    let bin =
        std::env::var_os("NETWARDEN_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_netwarden").into());
    let mut cmd = Command::new(bin);
    cmd.args(["lab", "check", "-f"]).arg(&dir.path);
    cmd.args(["--backend", backend]);
    for (port, proto) in ports {
        cmd.arg("--port").arg(format!("{port}/{proto}"));
    }
    cmd.arg("--json");
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run netwarden: {e}"))?;
    // 1 = some observed differs from `allowed`: still a report, checked below like any other.
    if !matches!(out.status.code(), Some(0 | 1)) {
        return Err(format!(
            "netwarden lab check exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let json: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "netwarden lab check printed no JSON ({e}), exit {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let probes = json["probes"]
        .as_array()
        .ok_or("netwarden lab check JSON has no \"probes\" array")?;
    probes.iter().map(parse_probe).collect()
}

fn parse_probe(v: &Value) -> Result<LabProbe, String> {
    let s = |k: &str| {
        v[k].as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("lab probe without string {k:?}: {v}"))
    };
    let b = |k: &str| {
        v[k].as_bool()
            .ok_or_else(|| format!("lab probe without boolean {k:?}: {v}"))
    };
    let observed = match &v["observed"] {
        Value::Null => None,
        Value::Bool(b) => Some(*b),
        other => return Err(format!("lab probe with observed {other}: {v}")),
    };
    Ok(LabProbe {
        from: s("from")?,
        to: s("to")?,
        network: s("network")?,
        port: v["port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| format!("lab probe without port: {v}"))?,
        protocol: s("protocol")?,
        family: s("family")?,
        allowed: b("allowed")?,
        staged_allowed: b("staged_allowed")?,
        observed,
        raw: v.clone(),
    })
}

/// The fields of a record that explain a failure: addresses, interfaces, what the probe saw.
fn probe_detail(r: &LabProbe) -> String {
    let f = |k: &str| match &r.raw[k] {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    format!(
        "{}%{} -> {}%{}, detail {}, {} ms",
        f("src"),
        f("from_interface"),
        f("dst"),
        f("to_interface"),
        f("detail"),
        f("elapsed_ms")
    )
}

/// Compares the observed records of one step with its expected matrices.
fn check_step(
    what: &str,
    probes: &[Probe],
    records: &[LabProbe],
    tally: &mut Tally,
    failures: &mut Vec<String>,
) {
    for probe in probes {
        let expect = match Matrix::parse(&probe.expect) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{what}: bad case data: {e}"));
                continue;
            }
        };
        let sctp = probe.protocol.eq_ignore_ascii_case("SCTP");
        let family = probe.family.as_deref().unwrap_or("any");
        let head = format!(
            "{what} {}/{} network {} family {family}",
            probe.port, probe.protocol, probe.network
        );
        let mut covered = BTreeSet::new();
        for r in records.iter().filter(|r| {
            r.network == probe.network
                && r.port == probe.port
                && r.protocol.eq_ignore_ascii_case(&probe.protocol)
                && probe.family.as_ref().is_none_or(|f| *f == r.family)
        }) {
            let pair = format!("{} -> {} ({})", r.from, r.to, r.family);
            let Some(&want) = expect.cells.get(&(r.from.clone(), r.to.clone())) else {
                failures.push(format!(
                    "{head}: {pair}: probed but not in the expected matrix"
                ));
                continue;
            };
            let Some(seen) = r.observed else {
                if sctp {
                    tally.sctp_skipped += 1;
                } else {
                    failures.push(format!(
                        "{head}: {pair}: not observed (a {} probe must be)",
                        probe.protocol
                    ));
                }
                continue;
            };
            tally.observed += 1;
            covered.insert((r.from.clone(), r.to.clone()));
            // Monitored policies never change traffic: observed must be `allowed`, whatever
            // `staged_allowed` says, and `allowed` must be the expected matrix.
            if seen != want || seen != r.allowed {
                failures.push(format!(
                    "{head}: {pair}: expected {}, observed {}, allowed {}, staged_allowed {}; {}",
                    verdict(want),
                    verdict(seen),
                    verdict(r.allowed),
                    verdict(r.staged_allowed),
                    probe_detail(r)
                ));
            }
        }
        if !sctp {
            let missing: Vec<String> = expect
                .cells
                .keys()
                .filter(|k| !covered.contains(*k))
                .map(|(f, t)| format!("{f} -> {t}"))
                .collect();
            if !missing.is_empty() {
                failures.push(format!(
                    "{head}: no observed probe for {}",
                    missing.join(", ")
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

/// Runs every step of a case through the lab on one backend.
fn run_case(
    case: &Case,
    base_objects: &[Value],
    variant: Option<Variant>,
    backend: &str,
    tally: &mut Tally,
    failures: &mut Vec<String>,
) {
    let mut objects = base_objects.to_vec();
    for (i, step) in case.steps.iter().enumerate() {
        let what = format!(
            "{} step {}{} [{backend}]",
            case.name,
            i + 1,
            step.description
                .as_ref()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default()
        );
        // Label changes persist into later steps, as in `conformance.rs`.
        if let Err(e) = apply_labels(&mut objects, &step.add_labels) {
            failures.push(format!("{what}: {e}"));
            return;
        }
        let variant::Prepared {
            objects: objs,
            policies,
            probes,
            ports,
        } = match variant::prepare(variant, &objects, step) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{what}: cannot build the variant: {e}"));
                continue;
            }
        };
        let before = failures.len();
        let started = Instant::now();
        let records = {
            let _lab = LAB_LOCK.lock().unwrap_or_else(|e| e.into_inner());
            run_lab(backend, &objs, &policies, &ports)
        };
        tally.elapsed += started.elapsed();
        tally.labs += 1;
        match records {
            Ok(records) => check_step(&what, &probes, &records, tally, failures),
            Err(e) => failures.push(format!("{what}: {e}")),
        }
        for f in &failures[before..] {
            println!("FAIL {f}");
        }
    }
}

#[test]
fn conformance_on_the_kernel() {
    if !have_root() {
        return;
    }
    let dir = conformance_dir();
    let model = load_objects(&dir.join("model.yaml")).expect("conformance/model.yaml");
    let netpol = load_cases(&dir.join("netpol")).expect("conformance/netpol");
    let multinet = load_cases(&dir.join("multinet")).expect("conformance/multinet");
    let mut failures = Vec::new();
    let mut tallies = BTreeMap::new();
    for backend in BACKENDS {
        let mut tally = Tally::default();
        for case in &netpol {
            run_case(
                case,
                &model,
                Some(Variant::Base),
                backend,
                &mut tally,
                &mut failures,
            );
        }
        for case in &multinet {
            match &case.objects {
                Some(objects) => run_case(case, objects, None, backend, &mut tally, &mut failures),
                None => failures.push(format!("{}: multinet cases list their objects", case.name)),
            }
        }
        println!(
            "{backend}: {} cases, {} labs, {} observed probes, {} SCTP probes not observable, {:.1} s",
            netpol.len() + multinet.len(),
            tally.labs,
            tally.observed,
            tally.sctp_skipped,
            tally.elapsed.as_secs_f64()
        );
        tallies.insert(backend, tally);
    }
    assert!(
        tallies.values().all(|t| t.observed > 0),
        "no probe was observed at all"
    );
    assert!(
        failures.is_empty(),
        "{} failing checks on the kernel:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

/// The comparison itself, on synthetic records (no root needed): a connection that differs
/// from the matrix, a pair without an observed probe and an unobservable SCTP probe.
#[test]
fn check_step_reports_differences() {
    let record =
        |from: &str, to: &str, protocol: &str, allowed: bool, observed: Option<bool>| LabProbe {
            from: from.to_string(),
            to: to.to_string(),
            network: "default".to_string(),
            port: 80,
            protocol: protocol.to_string(),
            family: "ipv4".to_string(),
            allowed,
            staged_allowed: allowed,
            observed,
            raw: serde_json::json!({ "src": "10.244.1.1", "detail": { "result": "refused" } }),
        };
    let probe = |protocol: &str| Probe {
        port: 80,
        protocol: protocol.to_string(),
        network: "default".to_string(),
        family: Some("ipv4".to_string()),
        expect: "- x/a x/b\nx/a . X\nx/b . .\n".to_string(),
        staged: None,
    };
    let records = [
        record("x/a", "x/a", "TCP", true, Some(true)),
        // Predicted and expected denied, but the connection went through.
        record("x/a", "x/b", "TCP", false, Some(true)),
        record("x/b", "x/a", "TCP", true, Some(true)),
        // x/b -> x/b has no record at all.
        record("x/a", "x/b", "SCTP", false, None),
    ];
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    check_step(
        "case step 1 [nft]",
        &[probe("TCP"), probe("SCTP")],
        &records,
        &mut tally,
        &mut failures,
    );
    assert_eq!(tally.observed, 3);
    assert_eq!(tally.sctp_skipped, 1);
    assert_eq!(failures.len(), 2, "{failures:#?}");
    assert!(failures[0].contains("x/a -> x/b (ipv4): expected denied, observed allowed"));
    assert!(failures[0].contains("refused"));
    assert!(failures[1].contains("no observed probe for x/b -> x/b"));
}
