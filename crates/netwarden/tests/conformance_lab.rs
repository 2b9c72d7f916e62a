//! The conformance suite end to end on the kernel: every step of the plain IPv4 NetworkPolicy
//! cases (conformance/netpol) and of the multi-network and monitor cases (conformance/multinet)
//! goes through `netwarden lab check`, which builds a netns per pod, enforces netwarden's rules
//! with the nft or iptables backend, and makes real connections between every pod pair. Steps
//! with the same pods and ports, of any case, share one lab (`lab check -f S0 --then S1 ...`,
//! each state the whole cluster at that step, enforced in turn): building and removing the
//! netns is most of a lab's cost.
//!
//! What a real connection did must equal the case's expected matrix (not only `reach`'s
//! prediction, which the `conformance` test checks separately), and must equal `allowed` even
//! where monitored policies make `staged_allowed` differ: monitor mode never changes traffic.
//! A denied connection must be refused (reset or port unreachable: netwarden REJECTs), so any
//! probe `lab check` flags with a `mismatch` (e.g. a deny that timed out) fails the case too.
//! SCTP is probed with raw INITs where the kernel has no SCTP sockets; where it has them the
//! lab cannot probe SCTP (`observed: null`), and those probes are counted, not checked. A probe
//! no expected matrix covers (another network or family of the step) must still agree with
//! `reach`. Every case, step and backend runs; the test fails at the end listing every failure.
//!
//! `a_silent_drop_is_a_mismatch` pins that rule on a lab where a foreign table drops what
//! netwarden would refuse.

mod common;
#[allow(dead_code)] // the helpers serve `conformance.rs` too; this runner uses part of them
mod support;

use netwarden_testing::{
    assert_no_failures, heavy_lock, lab_check_states, lab_slot, netwarden_bin, per_backend,
    root_or_skip, LabProbe,
};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use support::case::{conformance_dir, load_cases, load_objects, Case, Probe};
use support::matrix::Matrix;
use support::variant::{self, Variant};

const BACKENDS: [&str; 2] = ["nft", "iptables"];

/// Counters of one backend's run.
#[derive(Debug, Default)]
struct Tally {
    /// Topologies built (`lab check` runs).
    labs: usize,
    /// Steps checked (states enforced in those labs).
    steps: usize,
    observed: usize,
    sctp_skipped: usize,
    /// Probes no expected matrix covers (another network or family, or a port another step of
    /// the same lab needed): checked against `reach` only.
    extra: usize,
    elapsed: Duration,
}

/// One step of a case made ready to run: how failures name it, the whole cluster at that
/// point (objects and policies) and what must be observed.
struct Planned {
    what: String,
    state: Vec<Value>,
    probes: Vec<Probe>,
    ports: BTreeSet<(u16, String)>,
}

/// Runs one lab for `steps` (one topology, each step's state enforced in turn, probed on the
/// union of their ports: [`support::lab::lab_key`] groups steps of the same ports) and checks
/// every step's records.
fn run_group(backend: &str, steps: &[Planned], tally: &mut Tally, failures: &mut Vec<String>) {
    let states: Vec<Vec<Value>> = steps.iter().map(|s| s.state.clone()).collect();
    let ports: BTreeSet<(u16, String)> = steps.iter().flat_map(|s| s.ports.clone()).collect();
    let before = failures.len();
    let started = Instant::now();
    let reports = {
        let _lab = lab_slot();
        lab_check_states(&netwarden_bin!(), &states, backend, &ports, &[])
    };
    tally.elapsed += started.elapsed();
    tally.labs += 1;
    let records: Result<Vec<Vec<LabProbe>>, String> =
        reports.and_then(|r| r.iter().map(LabProbe::all_of).collect());
    match records {
        Ok(records) => {
            for (step, records) in steps.iter().zip(&records) {
                tally.steps += 1;
                check_step(&step.what, &step.probes, records, tally, failures);
            }
        }
        // The lab ran its states together: each of them failed.
        Err(e) => failures.extend(steps.iter().map(|s| format!("{}: {e}", s.what))),
    }
    for f in &failures[before..] {
        println!("FAIL {f}");
    }
}

/// Compares the observed records of one step with its expected matrices.
fn check_step(
    what: &str,
    probes: &[Probe],
    records: &[LabProbe],
    tally: &mut Tally,
    failures: &mut Vec<String>,
) {
    let covers = |probe: &Probe, r: &LabProbe| {
        r.network == probe.network
            && r.port == probe.port
            && r.protocol.eq_ignore_ascii_case(&probe.protocol)
            && probe.family.as_ref().is_none_or(|f| *f == r.family)
    };
    // A port (or network, family) only another step of the lab needed: no expected matrix,
    // but the kernel must still do what `reach` predicts (connect or refuse).
    for r in records
        .iter()
        .filter(|r| !probes.iter().any(|p| covers(p, r)))
    {
        tally.extra += 1;
        if let Some(mismatch) = &r.mismatch {
            failures.push(format!(
                "{what} {}/{} network {} (no expected matrix): {} -> {} ({}): kernel and reach disagree: {mismatch}; {}",
                r.port, r.protocol, r.network, r.from, r.to, r.family, r.detail()
            ));
        }
    }
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
        // Set when this kernel cannot probe SCTP: then the SCTP cells go unobserved.
        let mut sctp_unobservable = false;
        for r in records.iter().filter(|r| covers(probe, r)) {
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
                    sctp_unobservable = true;
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
            // `staged_allowed` says, and `allowed` must be the expected matrix. A deny must
            // be a refusal: `lab check` flags anything else (a timeout...) as a mismatch.
            if seen != want || seen != r.allowed || r.mismatch.is_some() {
                failures.push(format!(
                    "{head}: {pair}: expected {}, observed {}, allowed {}, staged_allowed {}, mismatch {}; {}",
                    verdict(want),
                    verdict(seen),
                    verdict(r.allowed),
                    verdict(r.staged_allowed),
                    r.mismatch.as_deref().unwrap_or("none"),
                    r.detail()
                ));
            }
        }
        if !sctp_unobservable {
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

/// Every step of a case made ready to run on one backend; a step that cannot be built fails
/// alone.
fn plan_case(
    case: &Case,
    base_objects: &[Value],
    variant: Option<Variant>,
    backend: &str,
    planned: &mut Vec<Planned>,
    failures: &mut Vec<String>,
) {
    for (i, step, prepared) in variant::prepared_steps(case, base_objects, variant) {
        let what = format!("{} [{backend}]", variant::step_name(&case.name, i, step));
        match prepared {
            Ok(ready) => {
                let mut state = ready.objects;
                state.extend(ready.policies);
                planned.push(Planned {
                    what,
                    state,
                    probes: ready.probes,
                    ports: ready.ports,
                });
            }
            Err(e) => {
                println!("FAIL {what}: {e}");
                failures.push(format!("{what}: {e}"));
            }
        }
    }
}

/// Every case on one backend: its counters and failures. Steps that share their pods run in
/// one lab (`lab check --then`): building and removing the netns is most of a lab's cost.
fn run_backend<'a>(
    backend: &'a str,
    model: &[Value],
    netpol: &[Case],
    multinet: &[Case],
) -> (&'a str, Tally, Vec<String>) {
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    let mut planned = Vec::new();
    for case in netpol {
        plan_case(
            case,
            model,
            Some(Variant::Base),
            backend,
            &mut planned,
            &mut failures,
        );
    }
    for case in multinet {
        match &case.objects {
            Some(objects) => plan_case(case, objects, None, backend, &mut planned, &mut failures),
            None => failures.push(format!("{}: multinet cases list their objects", case.name)),
        }
    }
    for group in support::lab::grouped(planned, |s| support::lab::lab_key(&s.state, &s.ports)) {
        run_group(backend, &group, &mut tally, &mut failures);
    }
    println!(
        "{backend}: {} cases, {} steps in {} labs, {} observed probes, {} SCTP probes not \
         observable, {} probes without an expected matrix; {:.1} s",
        netpol.len() + multinet.len(),
        tally.steps,
        tally.labs,
        tally.observed,
        tally.sctp_skipped,
        tally.extra,
        tally.elapsed.as_secs_f64()
    );
    (backend, tally, failures)
}

#[test]
fn conformance_on_the_kernel() {
    if !root_or_skip() {
        return;
    }
    let dir = conformance_dir();
    let model = load_objects(&dir.join("model.yaml")).expect("conformance/model.yaml");
    let netpol = load_cases(&dir.join("netpol")).expect("conformance/netpol");
    let multinet = load_cases(&dir.join("multinet")).expect("conformance/multinet");
    let runs = per_backend(&BACKENDS, |backend| {
        run_backend(backend, &model, &netpol, &multinet)
    });
    let mut failures = Vec::new();
    let mut tallies = BTreeMap::new();
    for (backend, tally, backend_failures) in runs {
        failures.extend(backend_failures);
        tallies.insert(backend, tally);
    }
    assert!(
        tallies.values().all(|t| t.observed > 0),
        "no probe was observed at all"
    );
    assert_no_failures("failing checks on the kernel", &failures);
}

/// The comparison itself, on synthetic records (no root needed): a connection that differs
/// from the matrix, a deny that timed out instead of being refused, a pair without an observed
/// probe, an unobservable SCTP probe, and the probes of a port only another step of the lab
/// needed (checked against `reach` alone).
#[test]
fn check_step_reports_differences() {
    let record = |from: &str,
                  to: &str,
                  protocol: &str,
                  allowed: bool,
                  observed: Option<bool>,
                  mismatch: Option<&str>| LabProbe {
        from: from.to_string(),
        to: to.to_string(),
        network: "default".to_string(),
        port: 80,
        protocol: protocol.to_string(),
        family: "ipv4".to_string(),
        allowed,
        staged_allowed: allowed,
        observed,
        mismatch: mismatch.map(str::to_string),
        src: "10.244.1.1".parse().unwrap(),
        dst: "10.244.1.2".parse().unwrap(),
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
    let connected_deny = Some("denied-but-connected");
    let timed_out_deny = Some("denied-but-timed-out");
    let records = [
        record("x/a", "x/a", "TCP", true, Some(true), None),
        // Predicted and expected denied, but the connection went through.
        record("x/a", "x/b", "TCP", false, Some(true), connected_deny),
        record("x/b", "x/a", "TCP", true, Some(true), None),
        // x/b -> x/b has no record at all.
        record("x/a", "x/b", "SCTP", false, None, None),
        record("x/a", "x/a", "UDP", true, Some(true), None),
        // Not connected, as expected, but dropped instead of refused.
        record("x/a", "x/b", "UDP", false, Some(false), timed_out_deny),
        record("x/b", "x/a", "UDP", true, Some(true), None),
        record("x/b", "x/b", "UDP", true, Some(true), None),
    ];
    // Port 81 only another step of the lab probes: checked against reach alone.
    let other_port = |mismatch: Option<&str>| LabProbe {
        port: 81,
        ..record(
            "x/a",
            "x/b",
            "TCP",
            false,
            Some(mismatch.is_some()),
            mismatch,
        )
    };
    let records = [
        &records[..],
        &[other_port(None), other_port(connected_deny)],
    ]
    .concat();
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    check_step(
        "case step 1 [nft]",
        &[probe("TCP"), probe("SCTP"), probe("UDP")],
        &records,
        &mut tally,
        &mut failures,
    );
    assert_eq!(tally.observed, 7);
    assert_eq!(tally.sctp_skipped, 1);
    assert_eq!(tally.extra, 2);
    assert_eq!(failures.len(), 4, "{failures:#?}");
    assert!(
        failures[0].contains("81/TCP network default (no expected matrix): x/a -> x/b")
            && failures[0].contains("denied-but-connected"),
        "{}",
        failures[0]
    );
    failures.remove(0);
    assert!(failures[0].contains("x/a -> x/b (ipv4): expected denied, observed allowed"));
    assert!(failures[0].contains("refused"));
    assert!(failures[1].contains("no observed probe for x/b -> x/b"));
    assert!(
        failures[2].contains("80/UDP")
            && failures[2].contains("x/a -> x/b (ipv4): expected denied, observed denied")
            && failures[2].contains("mismatch denied-but-timed-out"),
        "{}",
        failures[2]
    );
}

/// Regression: a deny that times out is not netwarden's deny. In a real lab (both backends),
/// client-no -> server is denied and refused; then a table of the test's own in the server's
/// netns silently drops that one flow (IPv4, TCP) before netwarden's chains see it. `lab
/// check`'s report must call exactly that probe a mismatch, of the timed-out kind, where it
/// found none before the drop.
#[test]
fn a_silent_drop_is_a_mismatch() {
    use netwarden::cli_args::PortProto;
    use netwarden::lab::{EnforcedLab, LabCheckOptions, Mismatch};
    use netwarden::reach::Family;
    use netwarden_dataplane::netns::exec_in;
    use netwarden_dataplane::Backend;
    use netwarden_engine::Protocol;
    use netwarden_lab::ProbeDetail;

    if !root_or_skip() {
        return;
    }
    let (server, client_no) = (common::pod_def("server"), common::pod_def("client-no"));
    let docs = [
        common::namespace_doc(),
        common::pod_doc(server, None),
        common::pod_doc(common::pod_def("client-ok"), None),
        common::pod_doc(client_no, None),
        common::ingress_policy("server-from-ok", "server", &["ok"], false),
    ];
    let inventory = common::inventory(&docs);
    // Priority -10 runs before netwarden's chains (priority filter, 0) and iptables' INPUT.
    let drop_table = format!(
        "table inet nwtest_drop {{\n  chain input {{\n    type filter hook input priority -10;\n    ip saddr {} tcp dport {} drop\n  }}\n}}\n",
        client_no.v4,
        common::PORT
    );
    for backend in [Backend::Nft, Backend::Iptables] {
        let options = LabCheckOptions {
            backend,
            ports: vec![PortProto {
                port: common::PORT,
                protocol: Protocol::Tcp,
            }],
            engine: Default::default(),
            render: Default::default(),
        };
        let _lock = heavy_lock();
        // Dropped (also on a panic), the lab removes its namespaces and what is in them.
        let mut lab = EnforcedLab::up(&inventory, &options).expect("lab up");
        let before = lab.report(&options.ports);
        let server_netns = lab.netns[&common::key("server")].clone();
        exec_in(
            &server_netns,
            "nft",
            &["-f", "-"],
            Some(drop_table.as_bytes()),
        )
        .expect("adding the drop table in the server's netns");
        let after = lab.report(&options.ports);
        lab.down().expect("lab down");

        let show = |r: &netwarden::lab::LabReport| {
            r.probes
                .iter()
                .map(|p| {
                    format!(
                        "{} -> {} {:?} allowed {} detail {:?} mismatch {:?}",
                        p.predicted.from,
                        p.predicted.to,
                        p.predicted.family,
                        p.predicted.allowed,
                        p.detail,
                        p.mismatch
                    )
                })
                .collect::<Vec<_>>()
        };
        assert!(
            before.probes.iter().all(|p| p.observed.is_some()),
            "[{backend:?}] {:#?}",
            show(&before)
        );
        assert_eq!(
            before.mismatches,
            0,
            "[{backend:?}] without the drop: {:#?}",
            show(&before)
        );
        let denied = |r: &netwarden::lab::LabReport, family: Family| {
            r.probes
                .iter()
                .find(|p| {
                    p.predicted.from == common::key("client-no")
                        && p.predicted.to == common::key("server")
                        && p.predicted.family == family
                })
                .cloned()
                .expect("a client-no -> server probe")
        };
        let v4 = denied(&before, Family::Ipv4);
        assert!(!v4.predicted.allowed);
        assert_eq!(v4.detail, Some(ProbeDetail::Refused), "[{backend:?}]");

        assert_eq!(
            after.mismatches,
            1,
            "[{backend:?}] with the drop: {:#?}",
            show(&after)
        );
        let dropped = denied(&after, Family::Ipv4);
        assert_eq!(dropped.detail, Some(ProbeDetail::Timeout), "[{backend:?}]");
        assert_eq!(dropped.observed, Some(false));
        assert_eq!(dropped.mismatch, Some(Mismatch::DeniedButTimedOut));
        let text = netwarden::lab::render_text(&after);
        assert!(
            text.contains("denied but timed out (expected a refusal)"),
            "[{backend:?}] {text}"
        );
        let json = serde_json::to_value(&after).expect("JSON");
        let flagged: Vec<&Value> = json["probes"]
            .as_array()
            .expect("probes")
            .iter()
            .filter(|p| !p["mismatch"].is_null())
            .collect();
        assert_eq!(flagged.len(), 1, "[{backend:?}] {flagged:#?}");
        assert_eq!(flagged[0]["mismatch"], "denied-but-timed-out");
        assert_eq!(flagged[0]["observed"], false);
        assert_eq!(flagged[0]["detail"]["result"], "timeout");
    }
}
