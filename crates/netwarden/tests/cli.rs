//! The command-line contracts (SPEC section 6), run through the real binary: `reach` JSON shape,
//! `explain` agreeing with `reach` on every pair, `validate` reporting every problem with its
//! exit status, `render` for both backends, and `report` over an events file.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use netwarden_testing::{netwarden_bin, output_within, TempDir};
use serde_json::Value;

/// Runs the binary under test (see `netwarden_bin!`: `NETWARDEN_BIN` runs another build, to
/// show a defect on the build before its fix).
fn netwarden(args: &[&str]) -> Output {
    Command::new(netwarden_bin!())
        .args(args)
        .output()
        .expect("run netwarden")
}

/// Like [`netwarden`], for commands that must end at once: a run longer than 20 s is killed
/// and fails the test.
fn netwarden_exits(args: &[&str]) -> Output {
    output_within(
        Command::new(netwarden_bin!()).args(args),
        Duration::from_secs(20),
        &format!("netwarden {args:?}"),
    )
}

fn example() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/multinet")
        .display()
        .to_string()
}

fn json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

#[test]
fn reach_json_contract() {
    let v = json(&netwarden(&[
        "reach",
        "-f",
        &example(),
        "--port",
        "8080/TCP",
        "-o",
        "json",
    ]));
    let probes = v["probes"].as_array().unwrap();
    // 4 pods on default (dual-stack: 2 families) + 3 on storage-net (IPv4): 16*2 + 9 probes.
    assert_eq!(probes.len(), 16 * 2 + 9);
    for p in probes {
        for field in [
            "from",
            "to",
            "network",
            "port",
            "protocol",
            "allowed",
            "staged_allowed",
            "family",
        ] {
            assert!(p.get(field).is_some(), "missing {field} in {p}");
        }
        if p["from"] == p["to"] {
            assert_eq!(p["allowed"], true, "a pod always reaches itself");
        }
    }
    let net = |n: &str| probes.iter().filter(|p| p["network"] == n).count();
    assert_eq!(net("default"), 32);
    assert_eq!(net("data/storage-net"), 9);
    // Filters.
    let v = json(&netwarden(&[
        "reach",
        "-f",
        &example(),
        "--port",
        "8080/TCP",
        "--from",
        "web/*",
        "--to",
        "data/db",
        "--network",
        "default",
    ]));
    let probes = v["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 4);
    assert!(probes
        .iter()
        .all(|p| p["to"] == "data/db" && p["from"].as_str().unwrap().starts_with("web/")));
}

#[test]
fn explain_agrees_with_reach_on_every_pair() {
    let v = json(&netwarden(&[
        "reach",
        "-f",
        &example(),
        "--port",
        "8080/TCP",
        "--port",
        "5432/TCP",
        "-o",
        "json",
    ]));
    for p in v["probes"].as_array().unwrap() {
        let port = format!("{}/{}", p["port"], p["protocol"].as_str().unwrap());
        let family = p["family"].as_str().unwrap();
        let e = json(&netwarden(&[
            "explain",
            "-f",
            &example(),
            "--from",
            p["from"].as_str().unwrap(),
            "--to",
            p["to"].as_str().unwrap(),
            "--port",
            &port,
            "--network",
            p["network"].as_str().unwrap(),
            "--family",
            family,
            "-o",
            "json",
        ]));
        let e = &e.as_array().unwrap()[0];
        assert_eq!(e["verdict"]["allowed"], p["allowed"], "{p}");
        assert_eq!(e["verdict"]["staged_allowed"], p["staged_allowed"], "{p}");
    }
}

#[test]
fn explain_names_policies_and_rules() {
    let out = netwarden(&[
        "explain",
        "-f",
        &example(),
        "--from",
        "data/db",
        "--to",
        "web/frontend",
        "--port",
        "8080/TCP",
        "--family",
        "ipv4",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains("verdict: ALLOWED (staged: DENIED, would-deny: replaced-allow)"),
        "{text}"
    );
    assert!(
        text.contains("allowed by NetworkPolicy web/frontend-http-only ingress[0]"),
        "{text}"
    );
    assert!(text.contains("web/frontend-same-namespace"), "{text}");
    let out = netwarden(&[
        "explain",
        "-f",
        &example(),
        "--from",
        "web/api",
        "--to",
        "data/backup",
        "--port",
        "5432/TCP",
        "--network",
        "data/storage-net",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("verdict: DENIED")
            && text.contains("isolated by DanmNetworkPolicy data/backup-lockdown"),
        "{text}"
    );
    assert!(text.contains("no rule allows 192.168.50.11"), "{text}");
    let out = netwarden(&[
        "explain",
        "-f",
        &example(),
        "--from",
        "web/nope",
        "--to",
        "data/db",
        "--port",
        "80",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("web/nope"));
}

const BAD: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad-cidr, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from: [{ipBlock: {cidr: 10.0.0.0/33}}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad-port, namespace: x}
spec:
  podSelector: {}
  ingress:
  - ports: [{port: 70000}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: good, namespace: x}
spec:
  podSelector: {matchLabels: {app: a}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: b}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {app: a}}
status: {podIPs: [{ip: 10.1.0.1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: x, labels: {app: b}}
status: {podIPs: [{ip: 10.1.0.2}]}
"#;

#[test]
fn validate_reports_every_problem_and_the_rest_keeps_working() {
    let dir = TempDir::new("validate");
    dir.write_in_place("bad.yaml", BAD);
    let d = dir.path.display().to_string();
    let out = netwarden(&["validate", "-f", &d, "-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "errors make validate fail");
    let problems: Value = serde_json::from_slice(&out.stdout).unwrap();
    let text = problems.to_string();
    assert!(
        text.contains("bad-cidr") && text.contains("ipBlock.cidr"),
        "{text}"
    );
    assert!(
        text.contains("bad-port") && text.contains("ports[0].port"),
        "{text}"
    );
    // The valid policy still applies: b reaches a, and x/a's other peers are denied.
    let v = json(&netwarden(&[
        "reach", "-f", &d, "--port", "80/TCP", "--to", "x/a",
    ]));
    let probes = v["probes"].as_array().unwrap();
    assert!(probes
        .iter()
        .any(|p| p["from"] == "x/b" && p["allowed"] == true));
    // --strict makes any problem fatal.
    let out = netwarden(&["reach", "-f", &d, "--port", "80/TCP", "--strict"]);
    assert!(!out.status.success());
    // A clean input validates.
    let out = netwarden(&["validate", "-f", &example()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn render_both_backends() {
    let out = netwarden(&["render", "-f", &example(), "--pod", "web/frontend"]);
    let nft = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(nft.contains("table inet netwarden"), "{nft}");
    assert!(
        nft.contains("log group 100 prefix \"nw:wd:"),
        "monitor rules present: {nft}"
    );
    let out = netwarden(&[
        "render",
        "-f",
        &example(),
        "--pod",
        "web/api",
        "--backend",
        "iptables",
    ]);
    let ipt = String::from_utf8_lossy(&out.stdout);
    assert!(
        ipt.contains("DANM_INGRESS_V4") && ipt.contains("DANM_INGRESS_V6"),
        "{ipt}"
    );
    assert!(ipt.contains("COMMIT"), "{ipt}");
}

#[test]
fn report_aggregates_events() {
    let dir = TempDir::new("report");
    let line = |t: &str, sport: u16| {
        format!(
            r#"{{"time":"{t}","node":"n1","action":"would-deny","direction":"ingress","pod":"web/frontend-6d4cf56db6-x2k9p","interface":"eth0","network":"default","peer":"data/db-0","src":"10.0.0.2","dst":"10.0.0.1","sport":{sport},"dport":8080,"protocol":"TCP","policies":["web/narrow"],"enforced_policies":["web/wide"],"cause":"replaced-allow"}}"#
        )
    };
    let events = format!(
        "{}\n{}\n",
        line("2026-01-01T00:00:00Z", 1000),
        line("2026-01-01T00:05:00Z", 1001)
    );
    dir.write_in_place("events.jsonl", &events);
    let out = netwarden(&[
        "report",
        "-e",
        &dir.path.join("events.jsonl").display().to_string(),
        "-o",
        "json",
    ]);
    let v = json(&out);
    let text = v.to_string();
    assert!(text.contains("web/narrow"), "{text}");
    assert!(
        text.contains("web/frontend") && text.contains("data/db"),
        "workloads: {text}"
    );
    assert!(
        text.contains("2026-01-01T00:00:00") && text.contains("2026-01-01T00:05:00"),
        "{text}"
    );
}

/// Misspelled kinds and apiVersions, a YAML 1.1 boolean as a namespace, and an empty directory
/// are reported (the first three as errors: `validate` exits 1), each naming its object and
/// field.
#[test]
fn validate_reports_misspellings_and_unreadable_fields() {
    let dir = TempDir::new("misspelled");
    let policy = |api: Option<&str>, kind: &str, name: &str| {
        let api = api
            .map(|a| format!("apiVersion: {a}\n"))
            .unwrap_or_default();
        format!("---\n{api}kind: {kind}\nmetadata: {{name: {name}, namespace: x}}\nspec: {{podSelector: {{}}}}\n")
    };
    let text = [
        policy(Some("networking.k8s.io/v1"), "Networkpolicy", "p1"),
        policy(Some("networking.k8s.io/v1"), "NetworkPolicies", "p2"),
        policy(Some("networking.k8s.io/v2"), "NetworkPolicy", "p3"),
        policy(None, "NetworkPolicy", "p4"),
        "---\napiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: y}\n".into(),
    ]
    .concat();
    dir.write_in_place("all.yaml", &text);
    std::fs::create_dir(dir.path.join("empty")).unwrap();
    let d = dir.path.display().to_string();
    let empty = dir.path.join("empty").display().to_string();
    let out = netwarden(&["validate", "-f", &d, &empty, "-o", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let problems: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let find = |object: &str| {
        problems
            .iter()
            .find(|p| p["object"].as_str().unwrap_or("").ends_with(object))
            .unwrap_or_else(|| panic!("no problem for {object}: {problems:?}"))
    };
    for (object, field, says) in [
        ("x/p1", "kind", "did you mean NetworkPolicy"),
        ("x/p2", "kind", "did you mean NetworkPolicy"),
        (
            "x/p3",
            "apiVersion",
            "networking.k8s.io/v1, not \"networking.k8s.io/v2\"",
        ),
        ("x/p4", "apiVersion", "missing apiVersion"),
        ("a", "metadata.namespace", "quote the value"),
    ] {
        let p = find(object);
        assert_eq!(p["field"], field, "{p}");
        assert_eq!(p["severity"], "error", "{p}");
        assert!(p["reason"].as_str().unwrap().contains(says), "{p}");
    }
    let empty_warning = problems
        .iter()
        .find(|p| p["file"] == empty.as_str())
        .expect("the empty directory is reported");
    assert_eq!(empty_warning["severity"], "warning");
    // Nothing was moved to `default` or loaded under another kind.
    let v = json(&netwarden(&[
        "reach", "-f", &d, "--port", "80/TCP", "-o", "json",
    ]));
    assert!(v["probes"].as_array().unwrap().is_empty(), "{v}");
}

/// Durations are parsed one way everywhere and bounded: no panic on a huge value, no spinning
/// loop on zero; a refused value exits 2 before anything runs.
#[test]
fn durations_out_of_range_are_refused() {
    let dir = TempDir::new("durations");
    let d = dir.path.display().to_string();
    for value in [
        "0s",
        "0",
        "5ms",
        "100000000h",
        "1000000000000000000000s",
        "-1s",
        "soon",
        "1mo",
    ] {
        let interval = format!("--interval={value}");
        let clean_for = format!("--clean-for={value}");
        for args in [
            vec!["run", "-f", &d, &interval],
            vec!["report", "-e", "-", &clean_for],
        ] {
            let out = netwarden_exits(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
            assert!(stderr.contains("duration"), "{args:?}: {stderr}");
        }
    }
    // The same spellings mean the same everywhere.
    for value in ["1h30m", "1.5h", "90m", "5400s"] {
        let out = netwarden(&["report", "-e", "/dev/null", "--clean-for", value]);
        assert!(
            out.status.success(),
            "{value}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `run --kube` refuses to start without a node name (it would program no pod, or every pod),
/// with a bad kubeconfig (naming it), or mixed with `-f`; `run` needs one source.
#[test]
fn run_kube_refuses_incomplete_configurations() {
    let dir = TempDir::new("kube-cli");
    let missing = dir.path.join("no-such-kubeconfig");
    let missing = missing.to_str().unwrap();
    let without_node = output_within(
        Command::new(netwarden_bin!())
            .args(["run", "--kube", "--kubeconfig", missing])
            .env_remove("NODE_NAME"),
        Duration::from_secs(20),
        "run --kube without a node name",
    );
    let stderr = String::from_utf8_lossy(&without_node.stderr);
    assert_eq!(without_node.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--node-name NAME or NODE_NAME"), "{stderr}");

    let bad_config = output_within(
        Command::new(netwarden_bin!())
            .args(["run", "--kube", "--kubeconfig", missing])
            .env("NODE_NAME", "n1"),
        Duration::from_secs(20),
        "run --kube with a missing kubeconfig",
    );
    let stderr = String::from_utf8_lossy(&bad_config.stderr);
    assert_eq!(bad_config.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no-such-kubeconfig"), "{stderr}");

    let d = dir.path.display().to_string();
    // Usage errors (clap), also exit status 2.
    for args in [
        vec!["run"],
        vec!["run", "--kube", "-f", &d, "--node-name", "n1"],
    ] {
        let out = netwarden_exits(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    }
    let without_kube = netwarden_exits(&["apply", "--node-name", "n1", "-f", &d]);
    let stderr = String::from_utf8_lossy(&without_kube.stderr);
    assert_eq!(without_kube.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("go with --kube"), "{stderr}");
    let apply = netwarden_exits(&["apply", "--kube", "--node-name", "n1"]);
    let stderr = String::from_utf8_lossy(&apply.stderr);
    assert_eq!(apply.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not `apply`"), "{stderr}");
}

/// Admin policies (SPEC 8) beside a NetworkPolicy, with a secondary network: see the
/// comment at the top of the example.
fn admin_example() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/admin")
        .display()
        .to_string()
}

/// The probe `from` → `to` of a `reach` JSON document on `network`.
fn probe<'a>(v: &'a Value, from: &str, to: &str, network: &str) -> &'a Value {
    v["probes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["from"] == from && p["to"] == to && p["network"] == network)
        .unwrap_or_else(|| panic!("no probe {from} -> {to} on {network}: {v}"))
}

fn explain_text(dir: &str, from: &str, to: &str, port: &str, network: &str) -> String {
    let out = netwarden(&[
        "explain",
        "-f",
        dir,
        "--from",
        from,
        "--to",
        to,
        "--port",
        port,
        "--network",
        network,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn admin_policies_decide_before_and_after_the_namespaced_tier() {
    let d = admin_example();
    let out = netwarden(&["validate", "-f", &d]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("1 policy(ies), 5 admin policy(ies), 0 node(s)"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v = json(&netwarden(&[
        "reach",
        "-f",
        &d,
        "--port",
        "8080/TCP",
        "--network",
        "all",
        "-o",
        "json",
    ]));
    // Admin Deny beats everything.
    let p = probe(&v, "lab/x", "shop/web", "default");
    assert_eq!(p["allowed"], false, "{p}");
    assert_eq!(
        p["ingress_tier"]["origin"]["policy"],
        "AdminNetworkPolicy/guard"
    );
    assert_eq!(p["ingress_tier"]["origin"]["index"], 0);
    assert_eq!(p["ingress_tier"]["origin"]["name"], "deny-lab");
    assert_eq!(p["ingress_tier"]["action"], "Deny");
    assert!(p.get("egress_tier").is_none(), "{p}");
    // An Admin Accept beats the NetworkPolicy that would deny ops.
    let p = probe(&v, "ops/mon", "shop/web", "default");
    assert_eq!(p["allowed"], true, "{p}");
    assert_eq!(
        p["ingress_tier"]["origin"]["policy"],
        "ClusterNetworkPolicy/allow-mon"
    );
    assert_eq!(p["ingress_tier"]["action"], "Allow");
    // No admin rule matches: the NetworkPolicy decides, and nothing is added to the probe.
    let p = probe(&v, "shop/db", "shop/web", "default");
    assert_eq!(p["allowed"], true, "{p}");
    assert!(p.get("ingress_tier").is_none(), "{p}");
    // Not isolated by a NetworkPolicy: the Baseline decides.
    let p = probe(&v, "shop/web", "shop/db", "default");
    assert_eq!(p["allowed"], false, "{p}");
    assert_eq!(p["ingress_tier"]["origin"]["tier"], "Baseline");
    assert_eq!(
        p["ingress_tier"]["origin"]["policy"],
        "BaselineAdminNetworkPolicy/default"
    );
    // A pod to itself is never subject to admin policies.
    assert_eq!(probe(&v, "shop/db", "shop/db", "default")["allowed"], true);
    // policy-for: on shop/storage only the storage guard applies, and it denies ops.
    let p = probe(&v, "ops/mon", "shop/web", "shop/storage");
    assert_eq!(p["allowed"], false, "{p}");
    assert_eq!(
        p["ingress_tier"]["origin"]["policy"],
        "AdminNetworkPolicy/storage-guard"
    );
    assert_eq!(
        probe(&v, "shop/web", "ops/mon", "shop/storage")["allowed"],
        true
    );

    let text = explain_text(&d, "lab/x", "shop/web", "8080/TCP", "default");
    assert!(text.contains("verdict: DENIED"), "{text}");
    assert!(
        text.contains(
            "enforced Admin tier: AdminNetworkPolicy/guard ingress[0] \"deny-lab\" Deny \
             (priority 10, enforced) -> denied"
        ),
        "{text}"
    );
    let text = explain_text(&d, "ops/mon", "shop/web", "8080/TCP", "default");
    assert!(text.contains("verdict: ALLOWED"), "{text}");
    assert!(
        text.contains(
            "Admin tier: ClusterNetworkPolicy/allow-mon ingress[0] \"mon\" Allow (priority 20, \
             enforced) -> allowed"
        ),
        "{text}"
    );
    // Pass hands over to the namespaced tier, which names its policy.
    let text = explain_text(&d, "ops/mon", "shop/web", "9090/TCP", "default");
    assert!(text.contains("verdict: DENIED"), "{text}");
    assert!(
        text.contains(
            "Admin tier: AdminNetworkPolicy/guard ingress[1] \"ops-to-policies\" Pass (priority \
             10, enforced) -> namespaced tier"
        ),
        "{text}"
    );
    assert!(
        text.contains("isolated by NetworkPolicy shop/web-policy"),
        "{text}"
    );
    let text = explain_text(&d, "shop/web", "shop/db", "8080/TCP", "default");
    assert!(
        text.contains(
            "not isolated; Baseline tier: BaselineAdminNetworkPolicy/default ingress[0] \
             \"baseline-deny\" Deny (priority 0, enforced) -> denied"
        ),
        "{text}"
    );
    let text = explain_text(&d, "ops/mon", "shop/web", "8080/TCP", "shop/storage");
    assert!(
        text.contains("Admin tier: AdminNetworkPolicy/storage-guard ingress[0] \"no-ops\" Deny"),
        "{text}"
    );
    // Without admin policies the output keeps its former shape.
    let text = explain_text(&d, "shop/db", "shop/web", "8080/TCP", "default");
    assert!(
        text.contains("    enforced not isolated -> allowed\n") && !text.contains("tier"),
        "{text}"
    );
}

/// `suggest` on the admin example: what the Admin tier decides gets no rule and is listed
/// with its rule in `explain`'s words; the Pass goes to a suggested rule; a suggestion that
/// isolates says which Baseline rules stop applying.
#[test]
fn suggest_leaves_to_the_admin_tier_what_it_decides() {
    let dir = TempDir::new("suggest-admin");
    let event = |pod: &str, src: &str, dst: &str, port: u16| {
        serde_json::json!({
            "time": "2026-01-01T00:00:00.000000Z", "node": "n", "action": "observed",
            "direction": "ingress", "pod": pod, "interface": "eth0", "network": "default",
            "peer": null, "src": src, "dst": dst, "sport": 40000, "dport": port,
            "protocol": "TCP", "policies": [], "enforced_policies": [], "cause": null
        })
        .to_string()
    };
    let lines = [
        event("shop/web", "10.0.2.1", "10.0.0.1", 8080), // lab/x: guard denies
        event("shop/web", "10.0.1.1", "10.0.0.1", 8080), // ops/mon: allow-mon accepts
        event("shop/web", "10.0.1.1", "10.0.0.1", 9090), // ops/mon: guard passes on
        event("shop/web", "10.0.0.2", "10.0.0.1", 8080), // shop/db: namespaced
        event("shop/db", "10.0.0.1", "10.0.0.2", 5432),  // shop/web: the Baseline denies now
    ];
    dir.write("events.jsonl", &(lines.join("\n") + "\n"));
    let events = dir.path.join("events.jsonl").display().to_string();
    let out = netwarden(&["suggest", "-f", &admin_example(), "--events", &events]);
    let (yaml, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("the Admin tier decides 2 observed flow(s) (1 denied)"),
        "{stderr}"
    );
    let line = |start: &str| {
        yaml.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line {start:?} in\n{yaml}"))
    };
    assert!(yaml.contains(
        "# Decided by the Admin tier, before any namespaced policy (2 flow(s); SPEC 8):\n"
    ));
    assert!(line("#   lab/x -> shop/web 8080/TCP on default: 1 seen")
        .ends_with(" - denied by the Admin tier: no rule suggested"));
    line("#     destination's ingress, both views: Admin tier: AdminNetworkPolicy/guard ingress[0] \"deny-lab\" Deny (priority 10, enforced)");
    assert!(line("#   ops/mon -> shop/web 8080/TCP on default: 1 seen")
        .ends_with(" - the Admin tier decides the destination's ingress: no rule suggested there"));
    line("#     destination's ingress, both views: Admin tier: ClusterNetworkPolicy/allow-mon ingress[0] \"mon\" Allow (priority 20, enforced)");
    // The Pass is no decision: 9090 from ops gets its rule, as does db; lab gets none.
    assert!(!yaml.contains("9090/TCP on default: 1 seen, first 2026-01-01T00:00:00.000000Z, last 2026-01-01T00:00:00.000000Z - "), "{yaml}");
    assert!(
        yaml.contains("#   ops/mon -> shop/web 9090/TCP on default: 1 seen"),
        "{yaml}"
    );
    assert!(
        yaml.contains("#   shop/db -> shop/web 8080/TCP on default: 1 seen"),
        "{yaml}"
    );
    assert!(!yaml.contains("\"lab\""), "{yaml}");
    assert_eq!(
        yaml.matches("# Isolates ingress: the Baseline tier's rules there (BaselineAdminNetworkPolicy/default) stop applying once this is enforced (SPEC 8).").count(),
        2,
        "{yaml}"
    );
    let loaded = netwarden_manifest::parse_str(
        "suggested.yaml",
        &yaml,
        &netwarden_manifest::LoadOptions::default(),
    );
    assert!(loaded.problems.is_empty(), "{:?}", loaded.problems);
    let names: Vec<String> = loaded.policies.iter().map(|p| p.key.to_string()).collect();
    assert_eq!(names, ["shop/suggested-db", "shop/suggested-web"]);
    let web = &loaded.policies[1];
    assert_eq!(web.ingress.as_ref().map(Vec::len), Some(2), "{yaml}");
}

#[test]
fn validate_reports_admin_policy_problems() {
    let dir = TempDir::new("admin-bad");
    dir.write_in_place(
        "bad.yaml",
        r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: bad}
spec:
  tier: Baseline
  priority: 2000
  subject: {namespaces: {}}
---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: partly}
spec:
  priority: 1
  subject: {namespaces: {}}
  egress:
  - {action: Deny, to: [{networks: [10.0.0.0/40]}]}
  - {action: Allow, to: [{domainNames: [example.com]}]}
---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkpolicy
metadata: {name: typo}
"#,
    );
    let d = dir.path.display().to_string();
    let out = netwarden(&["validate", "-f", &d, "-o", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let problems: Value = serde_json::from_slice(&out.stdout).unwrap();
    let has = |kind: &str, object: &str, field: &str, severity: &str| {
        problems.as_array().unwrap().iter().any(|p| {
            p["kind"] == kind
                && p["object"] == object
                && p["field"] == field
                && p["severity"] == severity
        })
    };
    assert!(
        has("ClusterNetworkPolicy", "bad", "spec.priority", "error"),
        "{problems}"
    );
    assert!(
        has(
            "AdminNetworkPolicy",
            "partly",
            "spec.egress[0].to[0].networks[0]",
            "error"
        ),
        "{problems}"
    );
    assert!(
        has("AdminNetworkPolicy", "partly", "spec.egress[0]", "error"),
        "{problems}"
    );
    assert!(
        has(
            "AdminNetworkPolicy",
            "partly",
            "spec.egress[1].to[0].domainNames",
            "warning"
        ),
        "{problems}"
    );
    assert!(
        has("AdminNetworkpolicy", "typo", "kind", "error"),
        "{problems}"
    );
}
