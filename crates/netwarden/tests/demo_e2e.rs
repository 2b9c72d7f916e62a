//! The README's first command runs `netwarden demo`; this runs it as a user would (the
//! examples, each backend) and checks what it shows: the first act's probes agree with the
//! prediction, and the loop observe → suggest → monitor → report → promote goes through —
//! the observed flows logged by learn mode, suggested policies that load back, no would-deny
//! with them in monitor mode, every policy ready to promote from the kernel's counters, and
//! after promotion the workloads' traffic still connecting and every other probe as `reach`
//! predicts. `demo --kube` is run the same way: the agent's cluster path, before and after a
//! policy change through the API.
//!
//! Needs root (network namespaces); without it the test skips, or fails when `CI=true`.

use std::process::Command;

use netwarden_testing::{heavy_lock, root_or_skip};

const BIN: &str = env!("CARGO_BIN_EXE_netwarden");

/// Runs `netwarden demo -f examples/multinet ARGS`, which must succeed; its stdout and
/// stderr.
fn run_demo(args: &[&str]) -> (String, String) {
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/multinet");
    let out = Command::new(BIN)
        .args(["demo", "-f", examples])
        .args(args)
        .output()
        .expect("run netwarden demo");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "demo {args:?} failed\n{stdout}\n{stderr}"
    );
    (stdout, stderr)
}

fn demo(backend: &str) {
    if !root_or_skip() {
        return;
    }
    let _lock = heavy_lock();
    let (stdout, stderr) = run_demo(&["--backend", backend]);
    for expected in [
        "0 mismatch(es) with the prediction",
        "== the loop, 1/5 observe",
        "\"action\":\"observed\"",
        "== the loop, 2/5 suggest",
        "4 polic(ies) written to",
        "would-deny events: 0",
        "== the loop, 4/5 report",
        "\"record\":\"status\"",
        "data/suggested-db            ready to promote",
        "web/suggested-api            ready to promote",
        "== the loop, 5/5 promote",
        "+     netwarden.io/mode: \"enforce\"",
        "refused as predicted (flows nobody observed), 0 mismatch(es)",
        "labs removed",
    ] {
        assert!(
            stdout.contains(expected),
            "{backend}: the demo does not show {expected:?}:\n{stdout}\n{stderr}"
        );
    }
    assert!(
        !stdout.contains("not ready"),
        "{backend}: a policy was not ready:\n{stdout}"
    );
}

#[test]
fn demo_nft() {
    demo("nft");
}

#[test]
fn demo_iptables() {
    demo("iptables");
}

/// `demo --kube` (issue 21): the agent's cluster path on this machine — the fake API server,
/// `run --kube` programming the lab's netns, probes agreeing with the prediction before and
/// after a policy created through the API, and nothing left behind.
fn demo_kube(backend: &str) {
    if !root_or_skip() {
        return;
    }
    let _lock = heavy_lock();
    let (stdout, stderr) = run_demo(&["--kube", "--backend", backend]);
    assert_eq!(
        stdout.matches("0 mismatch(es) with the prediction").count(),
        2,
        "{backend}: before and after the change\n{stdout}"
    );
    let denied: usize = stdout
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_suffix(" flow(s) allowed before are denied now, e.g.:")
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{backend}: no change shown\n{stdout}"));
    assert!(denied > 0, "{backend}: the change denied nothing\n{stdout}");
    for expected in [
        "ready after",
        "demo-ingress-lockdown",
        "the kernel agrees with the new prediction after",
        "lab removed",
    ] {
        assert!(
            stdout.contains(expected),
            "{backend}: the demo does not show {expected:?}:\n{stdout}\n{stderr}"
        );
    }
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left: Vec<String> = String::from_utf8_lossy(&netns.stdout)
        .lines()
        .filter(|l| {
            stdout.contains(&format!(
                "/run/netns/{}",
                l.split_whitespace().next().unwrap_or("")
            ))
        })
        .map(str::to_string)
        .collect();
    assert!(left.is_empty(), "{backend}: netns left behind: {left:?}");
}

#[test]
fn demo_kube_nft() {
    demo_kube("nft");
}

#[test]
fn demo_kube_iptables() {
    demo_kube("iptables");
}
