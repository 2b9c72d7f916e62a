//! The monitor phase end to end on the kernel (SPEC section 4, event contract of section 6):
//! real netns labs built by `netwarden lab check --json` (or `EnforcedLab` for the flood), real
//! TCP/UDP connections over IPv4 and IPv6, on the nft and the iptables backend, and the
//! `would-deny`/`deny` events netwarden's own NFLOG listeners collected meanwhile.
//!
//! 1. a monitored deny-all-ingress: everything flows, one `would-deny` per connection into the
//!    pod and every event field right;
//! 2. enforced only: traffic follows the policy, no event; with `--log-denies`, one `deny` per
//!    denied connection;
//! 3. enforced and monitored policies on the same pods, both directions: enforcement unchanged,
//!    events exactly where reach's staged view denies what the enforced view allows, `egress`
//!    ones from the client's netns;
//! 4. `netwarden.io/replaces`: `replaced-allow` events for what only the replaced policy allowed;
//! 5. a monitored policy isolating egress: `egress`/`new-isolation` events;
//! 6. the default log rate (10/minute, burst 10) caps a flood of 200 new connections;
//! 7. the conformance suite (plain IPv4 NetworkPolicy cases) with every policy monitored:
//!    everything flows and the pairs with a `would-deny` are exactly the expected denied ones.
//!
//! They need root (network namespaces); without it they skip, or fail when `CI=true`. Labs run
//! one at a time (a static lock). Each test runs every backend and family even after a failure
//! and fails at the end listing every failing check.

#[allow(dead_code)] // the helpers serve the conformance runners too; this file uses part of them
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use netwarden::cli_args::PortProto;
use netwarden::lab::{EnforcedLab, LabCheckOptions};
use netwarden_dataplane::Backend;
use netwarden_engine::{EngineOptions, PodKey, Protocol};
use netwarden_lab::ProbeSpec;
use netwarden_manifest::LoadOptions;
use netwarden_monitor::Timestamp;
use netwarden_render::RenderOptions;
use netwarden_testing::{heavy_lock, lab_check_states, lab_slot, root_or_skip, Fields, LabProbe};
use serde_json::{json, Value};
use support::case::{conformance_dir, load_cases, load_objects, Case};
use support::matrix::Matrix;
use support::variant;

const BACKENDS: [&str; 2] = ["nft", "iptables"];
/// The namespace of the scenario objects.
const NS: &str = "mon";
/// The port every scenario pod listens on (TCP and UDP).
const PORT: u16 = 8080;
/// A log rate no scenario comes near, so that every event is there to count (the rate limit
/// has a scenario of its own). The iptables backend clamps it to what `-m limit` can hold.
const HIGH_RATE: &str = "1000000";

// ---------------------------------------------------------------------------------------------
// Scenario objects

struct PodDef {
    name: &'static str,
    labels: &'static [(&'static str, &'static str)],
    v4: &'static str,
    v6: &'static str,
}

/// `server`, two clients told apart by `role`, and `other`; all dual-stack on the primary
/// network (on-link /24 and /64 in the lab).
const PODS: [PodDef; 4] = [
    PodDef {
        name: "server",
        labels: &[("app", "server")],
        v4: "10.78.0.10",
        v6: "fd78::10",
    },
    PodDef {
        name: "client-ok",
        labels: &[("role", "ok")],
        v4: "10.78.0.11",
        v6: "fd78::11",
    },
    PodDef {
        name: "client-no",
        labels: &[("role", "no")],
        v4: "10.78.0.12",
        v6: "fd78::12",
    },
    PodDef {
        name: "other",
        labels: &[("app", "other")],
        v4: "10.78.0.13",
        v6: "fd78::13",
    },
];

fn pod_name(short: &str) -> String {
    format!("{NS}/{short}")
}

fn pod_def(short: &str) -> &'static PodDef {
    PODS.iter()
        .find(|p| p.name == short)
        .unwrap_or_else(|| panic!("no scenario pod {short}"))
}

/// The namespace and the four pods.
fn objects() -> Vec<Value> {
    let mut docs = vec![json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": NS, "labels": {"team": NS}},
    })];
    for def in &PODS {
        let labels: serde_json::Map<String, Value> = def
            .labels
            .iter()
            .map(|(k, v)| ((*k).to_string(), Value::from(*v)))
            .collect();
        docs.push(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": def.name, "namespace": NS, "labels": labels},
            "spec": {"containers": [{"name": "c", "ports": [
                {"name": "http", "containerPort": PORT, "protocol": "TCP"},
                {"name": "dns-ish", "containerPort": PORT, "protocol": "UDP"},
            ]}]},
            "status": {"podIPs": [{"ip": def.v4}, {"ip": def.v6}]},
        }));
    }
    docs
}

/// A `podSelector` peer: `key` in `values`.
fn pods_where(key: &str, values: &[&str]) -> Value {
    json!({"podSelector": {"matchExpressions": [
        {"key": key, "operator": "In", "values": values}
    ]}})
}

/// TCP and UDP `PORT`.
fn both_ports() -> Value {
    json!([{"protocol": "TCP", "port": PORT}, {"protocol": "UDP", "port": PORT}])
}

/// A NetworkPolicy of `NS` selecting `key=value` pods. `ingress`/`egress`: `None` = that
/// direction is not in `policyTypes`; `Some(peers)` = isolated, allowing TCP/UDP `PORT` from/to
/// those peers (no peer: nothing allowed).
fn policy(
    name: &str,
    select: (&str, &str),
    annotations: &[(&str, &str)],
    ingress: Option<Vec<Value>>,
    egress: Option<Vec<Value>>,
) -> Value {
    let mut types = Vec::new();
    let mut spec = json!({"podSelector": {"matchLabels": {select.0: select.1}}});
    let rules = |peers: Vec<Value>, key: &str| -> Value {
        if peers.is_empty() {
            json!([])
        } else {
            json!([{key: peers, "ports": both_ports()}])
        }
    };
    if let Some(peers) = ingress {
        types.push("Ingress");
        spec["ingress"] = rules(peers, "from");
    }
    if let Some(peers) = egress {
        types.push("Egress");
        spec["egress"] = rules(peers, "to");
    }
    spec["policyTypes"] = json!(types);
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_string(), Value::from(*v)))
        .collect();
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": spec,
    })
}

const MONITOR: (&str, &str) = ("netwarden.io/mode", "monitor");

// ---------------------------------------------------------------------------------------------
// Running `netwarden lab check`

/// One event of `lab check --json`, the fields of the SPEC 6 contract.
#[derive(Debug, Clone)]
struct LabEvent {
    action: String,
    direction: String,
    pod: String,
    peer: Option<String>,
    src: IpAddr,
    dst: IpAddr,
    dport: Option<u16>,
    protocol: String,
    raw: Value,
}

/// What identifies the connection an event is about, from the logging pod's point of view.
type EventKey = (String, String, String, IpAddr, IpAddr, u16, String);

impl LabEvent {
    fn key(&self) -> EventKey {
        (
            self.action.clone(),
            self.direction.clone(),
            self.pod.clone(),
            self.src,
            self.dst,
            self.dport.unwrap_or(0),
            self.protocol.clone(),
        )
    }

    /// (from, to) of the connection: an ingress event is logged by the server, an egress one
    /// by the client.
    fn pair(&self) -> (String, String) {
        let peer = self.peer.clone().unwrap_or_else(|| "?".to_string());
        if self.direction == "ingress" {
            (peer, self.pod.clone())
        } else {
            (self.pod.clone(), peer)
        }
    }
}

struct LabOutput {
    probes: Vec<LabProbe>,
    events: Vec<LabEvent>,
    /// When the run started and ended (events must be stamped in between).
    window: (Timestamp, Timestamp),
}

/// Runs `netwarden lab check -f <docs> --backend B --port ... --json <extra>`, one lab at a
/// time (its NFLOG listeners must see only its own traffic).
fn lab_check_docs(
    backend: &str,
    docs: &[Value],
    ports: &BTreeSet<(u16, String)>,
    extra: &[&str],
) -> Result<LabOutput, String> {
    let mut outs = lab_check_docs_states(backend, &[docs.to_vec()], ports, extra)?;
    outs.pop()
        .ok_or_else(|| "lab check reported no state".to_string())
}

/// As [`lab_check_docs`] for several states of one cluster on one topology (`lab check
/// --then`): each state's probes and the events logged while it was enforced.
fn lab_check_docs_states(
    backend: &str,
    states: &[Vec<Value>],
    ports: &BTreeSet<(u16, String)>,
    extra: &[&str],
) -> Result<Vec<LabOutput>, String> {
    let start = Timestamp::now();
    let reports = {
        let _lab = lab_slot();
        lab_check_states(
            env!("CARGO_BIN_EXE_netwarden"),
            states,
            backend,
            ports,
            extra,
        )?
    };
    let end = Timestamp::now();
    reports
        .iter()
        .map(|report| {
            let probes = LabProbe::all_of(report)?;
            let events = report["events"]
                .as_array()
                .ok_or("lab check JSON has no \"events\" array")?
                .iter()
                .map(parse_event)
                .collect::<Result<Vec<_>, _>>()?;
            Ok(LabOutput {
                probes,
                events,
                window: (start, end),
            })
        })
        .collect()
}

fn parse_event(v: &Value) -> Result<LabEvent, String> {
    let f = Fields::of("event", v);
    // Every field of the contract is there, and the line reads back as the monitor's own type
    // (what `netwarden report` consumes).
    for k in [
        "time",
        "node",
        "action",
        "direction",
        "pod",
        "interface",
        "network",
        "peer",
        "src",
        "dst",
        "sport",
        "dport",
        "protocol",
        "policies",
        "enforced_policies",
        "cause",
    ] {
        if v.get(k).is_none() {
            return Err(format!("event without field {k:?}: {v}"));
        }
    }
    serde_json::from_value::<netwarden_monitor::Event>(v.clone())
        .map_err(|e| format!("event does not read back ({e}): {v}"))?;
    f.optional_port("sport")?;
    Ok(LabEvent {
        action: f.str("action")?,
        direction: f.str("direction")?,
        pod: f.str("pod")?,
        peer: f.optional_str("peer")?,
        src: f.ip("src")?,
        dst: f.ip("dst")?,
        dport: f.optional_port("dport")?,
        protocol: f.str("protocol")?,
        raw: v.clone(),
    })
}

fn strings(v: &Value) -> Option<Vec<String>> {
    v.as_array()?
        .iter()
        .map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// Strict RFC 3339 (`YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`), read by the monitor's parser.
fn rfc3339(s: &str) -> Option<Timestamp> {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|p| p.iter().all(u8::is_ascii_digit));
    let shape = b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    if !shape {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        rest = &frac[n..];
    }
    let zone_ok = rest == "Z"
        || (rest.len() == 6
            && matches!(rest.as_bytes()[0], b'+' | b'-')
            && rest.as_bytes()[3] == b':'
            && rest[1..3]
                .bytes()
                .chain(rest[4..6].bytes())
                .all(|c| c.is_ascii_digit()));
    if !zone_ok {
        return None;
    }
    Timestamp::parse_rfc3339(s)
}

// ---------------------------------------------------------------------------------------------
// Expectations

/// An event a connection must produce.
#[derive(Debug, Clone)]
struct Expected {
    action: &'static str,
    direction: &'static str,
    /// The pod logging it (`ns/name`) and the one on the other end.
    pod: String,
    peer: String,
    policies: Vec<String>,
    enforced_policies: Vec<String>,
    cause: &'static str,
}

impl Expected {
    fn would_deny(direction: &'static str, pod: &str, peer: &str, cause: &'static str) -> Expected {
        Expected {
            action: "would-deny",
            direction,
            pod: pod_name(pod),
            peer: pod_name(peer),
            policies: Vec::new(),
            enforced_policies: Vec::new(),
            cause,
        }
    }

    fn monitored(mut self, names: &[&str]) -> Expected {
        self.policies = names.iter().map(|n| pod_name(n)).collect();
        self
    }

    fn enforced(mut self, names: &[&str]) -> Expected {
        self.enforced_policies = names.iter().map(|n| pod_name(n)).collect();
        self
    }
}

/// The key the event for `probe` must have.
fn expected_key(probe: &LabProbe, e: &Expected) -> EventKey {
    (
        e.action.to_string(),
        e.direction.to_string(),
        e.pod.clone(),
        probe.src,
        probe.dst,
        probe.port,
        probe.protocol.clone(),
    )
}

/// The fields every lab event has whatever the scenario: the node, a time inside the run, the
/// primary interface and network, a source port.
fn check_common_fields(what: &str, ev: &LabEvent, window: (Timestamp, Timestamp)) -> Vec<String> {
    let mut bad = Vec::new();
    let r = &ev.raw;
    if r["node"].as_str().is_none_or(str::is_empty) {
        bad.push(format!("{what}: event with an empty node: {r}"));
    }
    match r["time"].as_str().and_then(rfc3339) {
        None => bad.push(format!("{what}: event time is not RFC 3339: {r}")),
        Some(t) => {
            // Kernel stamps and the wall clock may differ by a little; not by minutes.
            let slack = Duration::from_secs(60);
            if t < window.0.minus(slack) || t.micros() > window.1.micros() + 60_000_000 {
                bad.push(format!("{what}: event time outside the run: {r}"));
            }
        }
    }
    if r["interface"] != "eth0" {
        bad.push(format!("{what}: event interface is not eth0: {r}"));
    }
    if r["network"] != "default" {
        bad.push(format!("{what}: event network is not \"default\": {r}"));
    }
    if r["sport"].as_u64().is_none_or(|p| p == 0) {
        bad.push(format!("{what}: event without a source port: {r}"));
    }
    bad
}

/// Checks that the events are exactly one per expected (probe, event), with the right fields,
/// and nothing else.
fn check_events(
    what: &str,
    out: &LabOutput,
    expect: &dyn Fn(&LabProbe) -> Vec<Expected>,
    failures: &mut Vec<String>,
) {
    let mut wanted: BTreeMap<EventKey, (&LabProbe, Expected)> = BTreeMap::new();
    for p in out.probes.iter().filter(|p| p.observed.is_some()) {
        for e in expect(p) {
            let key = expected_key(p, &e);
            if wanted.insert(key.clone(), (p, e)).is_some() {
                failures.push(format!("{what}: test bug: two expectations for {key:?}"));
            }
        }
    }
    let mut seen: BTreeMap<EventKey, Vec<&LabEvent>> = BTreeMap::new();
    for ev in &out.events {
        failures.extend(check_common_fields(what, ev, out.window));
        seen.entry(ev.key()).or_default().push(ev);
    }
    for (key, (probe, e)) in &wanted {
        let Some(events) = seen.get(key) else {
            failures.push(format!(
                "{what}: missing {} {} event at {} for {}",
                e.action,
                e.direction,
                e.pod,
                probe.describe()
            ));
            continue;
        };
        if events.len() != 1 {
            failures.push(format!(
                "{what}: {} events instead of one for {}: {:#?}",
                events.len(),
                probe.describe(),
                events.iter().map(|e| &e.raw).collect::<Vec<_>>()
            ));
        }
        let ev = events[0];
        let r = &ev.raw;
        let field = |name: &str, ok: bool, want: String| {
            (!ok).then(|| {
                format!(
                    "{what}: event {name} should be {want} for {}: {r}",
                    probe.describe()
                )
            })
        };
        failures.extend(
            [
                field(
                    "peer",
                    ev.peer.as_deref() == Some(e.peer.as_str()),
                    e.peer.clone(),
                ),
                field(
                    "policies",
                    strings(&r["policies"]).as_ref() == Some(&e.policies),
                    format!("{:?}", e.policies),
                ),
                field(
                    "enforced_policies",
                    strings(&r["enforced_policies"]).as_ref() == Some(&e.enforced_policies),
                    format!("{:?}", e.enforced_policies),
                ),
                field("cause", r["cause"] == e.cause, e.cause.to_string()),
            ]
            .into_iter()
            .flatten(),
        );
    }
    for (key, events) in &seen {
        if !wanted.contains_key(key) {
            for ev in events {
                failures.push(format!("{what}: unexpected event {}", ev.raw));
            }
        }
    }
}

/// Every pair of the four pods has a TCP and a UDP probe per family, every probe connected
/// exactly when `allowed(from, to)` says, and `allowed` (reach's prediction) says the same.
fn check_traffic(
    what: &str,
    out: &LabOutput,
    allowed: &dyn Fn(&str, &str) -> bool,
    failures: &mut Vec<String>,
) {
    let mut covered = BTreeSet::new();
    for p in &out.probes {
        let (Some(from), Some(to)) = (
            p.from.strip_prefix(&format!("{NS}/")),
            p.to.strip_prefix(&format!("{NS}/")),
        ) else {
            failures.push(format!("{what}: probe of an unknown pod: {}", p.describe()));
            continue;
        };
        // A pod always reaches itself (loopback).
        let want = from == to || allowed(from, to);
        if p.observed != Some(want) || p.allowed != want {
            failures.push(format!(
                "{what}: expected {}: {}",
                if want { "connected" } else { "refused" },
                p.describe()
            ));
        }
        let family_ok = match p.family.as_str() {
            "ipv4" => p.src.is_ipv4() && p.dst.is_ipv4(),
            "ipv6" => p.src.is_ipv6() && p.dst.is_ipv6(),
            _ => false,
        };
        if !family_ok || p.network != "default" || p.port != PORT {
            failures.push(format!("{what}: odd probe record: {}", p.raw));
        }
        covered.insert((
            p.from.clone(),
            p.to.clone(),
            p.protocol.clone(),
            p.family.clone(),
        ));
    }
    for f in &PODS {
        for t in &PODS {
            for protocol in ["TCP", "UDP"] {
                for family in ["ipv4", "ipv6"] {
                    let k = (
                        pod_name(f.name),
                        pod_name(t.name),
                        protocol.to_string(),
                        family.to_string(),
                    );
                    if !covered.contains(&k) {
                        failures.push(format!("{what}: no probe {k:?}"));
                    }
                }
            }
        }
    }
}

/// The probes where reach says the staged view denies what enforcement allows, against the
/// probes that got a `would-deny` event (ingress or egress).
fn check_events_follow_reach(what: &str, out: &LabOutput, failures: &mut Vec<String>) {
    let with_event: BTreeSet<(IpAddr, IpAddr, u16, String)> = out
        .events
        .iter()
        .filter(|e| e.action == "would-deny")
        .map(|e| (e.src, e.dst, e.dport.unwrap_or(0), e.protocol.clone()))
        .collect();
    for p in out.probes.iter().filter(|p| p.observed.is_some()) {
        let predicted = p.allowed && !p.staged_allowed;
        let got = with_event.contains(&(p.src, p.dst, p.port, p.protocol.clone()));
        if predicted != got {
            failures.push(format!(
                "{what}: reach predicts {} would-deny event, the lab logged {}: {}",
                if predicted { "a" } else { "no" },
                if got { "one" } else { "none" },
                p.describe()
            ));
        }
    }
}

fn tcp_udp_ports() -> BTreeSet<(u16, String)> {
    [(PORT, "TCP".to_string()), (PORT, "UDP".to_string())]
        .into_iter()
        .collect()
}

/// Runs one scenario on both backends and checks traffic and events.
fn scenario(
    name: &str,
    policies: &[Value],
    extra: &[&str],
    allowed: &dyn Fn(&str, &str) -> bool,
    expect: &dyn Fn(&LabProbe) -> Vec<Expected>,
    follow_reach: bool,
) -> Vec<String> {
    let mut docs = objects();
    docs.extend(policies.iter().cloned());
    let mut failures = Vec::new();
    for backend in BACKENDS {
        let what = format!("{name} [{backend}]");
        let started = Instant::now();
        let out = match lab_check_docs(backend, &docs, &tcp_udp_ports(), extra) {
            Ok(out) => out,
            Err(e) => {
                failures.push(format!("{what}: {e}"));
                continue;
            }
        };
        let before = failures.len();
        check_traffic(&what, &out, allowed, &mut failures);
        check_events(&what, &out, expect, &mut failures);
        if follow_reach {
            check_events_follow_reach(&what, &out, &mut failures);
        }
        println!(
            "{what}: {} probes, {} events, {} failing checks, {:.1} s",
            out.probes.len(),
            out.events.len(),
            failures.len() - before,
            started.elapsed().as_secs_f64()
        );
        for f in &failures[before..] {
            println!("FAIL {f}");
        }
    }
    failures
}

fn assert_no_failures(failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} failing checks:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

fn short(name: &str) -> &str {
    name.strip_prefix(&format!("{NS}/")).unwrap_or(name)
}

// ---------------------------------------------------------------------------------------------
// Scenarios 1-5

/// 1. A monitored deny-all-ingress on the server: nothing is blocked; every connection into the
///    server (TCP: each connect; UDP: each probe flow) gives one would-deny, and no other pod
///    logs anything.
#[test]
fn monitored_only() {
    if !root_or_skip() {
        return;
    }
    let policies = [policy(
        "deny-in",
        ("app", "server"),
        &[MONITOR],
        Some(vec![]),
        None,
    )];
    let failures = scenario(
        "monitored only",
        &policies,
        &["--log-rate", HIGH_RATE],
        &|_, _| true,
        &|p| {
            if p.to == pod_name("server") && p.from != p.to {
                vec![
                    Expected::would_deny("ingress", "server", short(&p.from), "new-isolation")
                        .monitored(&["deny-in"]),
                ]
            } else {
                vec![]
            }
        },
        true,
    );
    assert_no_failures(&failures);
}

/// 2. Enforced only: traffic follows the policy and nothing is logged; with `--log-denies` (or
///    the policy annotated `netwarden.io/log: "true"`), one `deny` per denied connection, at
///    the server, naming the enforced policy.
#[test]
fn enforced_only() {
    if !root_or_skip() {
        return;
    }
    let policies = [policy(
        "allow-ok",
        ("app", "server"),
        &[],
        Some(vec![pods_where("role", &["ok"])]),
        None,
    )];
    let allowed = |from: &str, to: &str| to != "server" || from == "client-ok";
    let mut failures = scenario(
        "enforced only",
        &policies,
        &["--log-rate", HIGH_RATE],
        &allowed,
        &|_| vec![],
        true,
    );
    let denies = |p: &LabProbe| {
        let (from, to) = (short(&p.from), short(&p.to));
        if from != to && !allowed(from, to) {
            vec![Expected {
                action: "deny",
                ..Expected::would_deny("ingress", to, from, "denied").enforced(&["allow-ok"])
            }]
        } else {
            vec![]
        }
    };
    failures.extend(scenario(
        "enforced only, --log-denies",
        &policies,
        &["--log-rate", HIGH_RATE, "--log-denies"],
        &allowed,
        &denies,
        false,
    ));
    // The same asked per policy (`netwarden.io/log: "true"`) instead of globally.
    let logged = [policy(
        "allow-ok",
        ("app", "server"),
        &[("netwarden.io/log", "true")],
        Some(vec![pods_where("role", &["ok"])]),
        None,
    )];
    failures.extend(scenario(
        "enforced only, netwarden.io/log",
        &logged,
        &["--log-rate", HIGH_RATE],
        &allowed,
        &denies,
        false,
    ));
    assert_no_failures(&failures);
}

/// 3. Enforced and monitored policies on the same pods, in both directions:
///    - server: enforced ingress from `role in (ok, no)`, a monitored ingress adding `other`
///      (staged allows more: no event, still refused), a monitored egress to `role=ok` only;
///    - client-ok: enforced egress to `app in (server, other)`, monitored deny-all ingress;
///    - other: monitored deny-all ingress (so server -> other gives an egress event at the
///      server and an ingress event at other).
///
/// Enforcement is unchanged; events exactly where reach's staged view denies.
#[test]
fn enforced_and_monitored_both_directions() {
    if !root_or_skip() {
        return;
    }
    let policies = [
        policy(
            "srv-in",
            ("app", "server"),
            &[],
            Some(vec![pods_where("role", &["ok", "no"])]),
            None,
        ),
        policy(
            "srv-in-extra",
            ("app", "server"),
            &[MONITOR],
            Some(vec![pods_where("app", &["other"])]),
            None,
        ),
        policy(
            "srv-out",
            ("app", "server"),
            &[MONITOR],
            None,
            Some(vec![pods_where("role", &["ok"])]),
        ),
        policy(
            "ok-out",
            ("role", "ok"),
            &[],
            None,
            Some(vec![pods_where("app", &["server", "other"])]),
        ),
        policy("ok-in", ("role", "ok"), &[MONITOR], Some(vec![]), None),
        policy("other-in", ("app", "other"), &[MONITOR], Some(vec![]), None),
    ];
    // Enforced: server ingress from the two clients; client-ok egress to server and other.
    let allowed = |from: &str, to: &str| {
        let server_in = to != "server" || from == "client-ok" || from == "client-no";
        let ok_out = from != "client-ok" || to == "server" || to == "other";
        server_in && ok_out
    };
    let failures = scenario(
        "enforced and monitored, both directions",
        &policies,
        &["--log-rate", HIGH_RATE],
        &allowed,
        &|p| {
            let (from, to) = (short(&p.from), short(&p.to));
            let mut out = Vec::new();
            if from == to || !allowed(from, to) {
                return out;
            }
            // server's egress: enforced open, staged only to client-ok.
            if from == "server" && to != "client-ok" {
                out.push(
                    Expected::would_deny("egress", "server", to, "new-isolation")
                        .monitored(&["srv-out"]),
                );
            }
            // client-ok's and other's ingress: enforced open, staged closed (server -> other
            // is logged twice: leaving the server and entering other).
            if to == "client-ok" {
                out.push(
                    Expected::would_deny("ingress", "client-ok", from, "new-isolation")
                        .monitored(&["ok-in"]),
                );
            }
            if to == "other" {
                out.push(
                    Expected::would_deny("ingress", "other", from, "new-isolation")
                        .monitored(&["other-in"]),
                );
            }
            out
        },
        true,
    );
    assert_no_failures(&failures);
}

/// 4. `netwarden.io/replaces`: a monitored policy previews replacing a broader enforced one;
///    traffic is unchanged and the flows only the replaced policy allowed give `replaced-allow`.
#[test]
fn replaces_previews_narrower_policy() {
    if !root_or_skip() {
        return;
    }
    let policies = [
        policy(
            "srv-broad",
            ("app", "server"),
            &[],
            Some(vec![pods_where("role", &["ok", "no"])]),
            None,
        ),
        policy(
            "srv-narrow",
            ("app", "server"),
            &[MONITOR, ("netwarden.io/replaces", "srv-broad")],
            Some(vec![pods_where("role", &["ok"])]),
            None,
        ),
    ];
    let allowed =
        |from: &str, to: &str| to != "server" || from == "client-ok" || from == "client-no";
    let failures = scenario(
        "replaces",
        &policies,
        &["--log-rate", HIGH_RATE],
        &allowed,
        &|p| {
            if p.to == pod_name("server") && p.from == pod_name("client-no") {
                vec![
                    Expected::would_deny("ingress", "server", "client-no", "replaced-allow")
                        .monitored(&["srv-narrow"])
                        .enforced(&["srv-broad"]),
                ]
            } else {
                vec![]
            }
        },
        true,
    );
    assert_no_failures(&failures);
}

/// 5. A monitored policy isolating client-no's (open) egress to the server only: its
///    connections elsewhere give `egress`/`new-isolation` events from client-no's netns.
#[test]
fn monitored_egress_isolation() {
    if !root_or_skip() {
        return;
    }
    let policies = [policy(
        "no-out",
        ("role", "no"),
        &[MONITOR],
        None,
        Some(vec![pods_where("app", &["server"])]),
    )];
    let failures = scenario(
        "monitored egress isolation",
        &policies,
        &["--log-rate", HIGH_RATE],
        &|_, _| true,
        &|p| {
            let (from, to) = (short(&p.from), short(&p.to));
            if from == "client-no" && to != "server" && to != from {
                vec![
                    Expected::would_deny("egress", "client-no", to, "new-isolation")
                        .monitored(&["no-out"]),
                ]
            } else {
                vec![]
            }
        },
        true,
    );
    assert_no_failures(&failures);
}

// ---------------------------------------------------------------------------------------------
// Scenario 6: the rate limit

/// Connections of the flood per family.
const FLOOD: usize = 100;
/// The default log limit (SPEC 4 via `RenderOptions::default`): 10/minute, burst 10.
const DEFAULT_BURST: usize = 10;

/// 6. With the default log rate, 200 new TCP connections from one client into a monitored pod
///    (100 per family, as fast as the probes go) all succeed and log at most the burst (plus
///    what the rate refills meanwhile). nft has one limit per pod and direction; iptables one
///    per pod, direction and family (`-m limit` is per rule, and IPv4 and IPv6 are separate
///    rulesets), so there the cap holds per family.
#[test]
fn default_rate_limit_caps_a_flood() {
    if !root_or_skip() {
        return;
    }
    let policies = [policy(
        "deny-in",
        ("app", "server"),
        &[MONITOR],
        Some(vec![]),
        None,
    )];
    let mut docs = objects();
    docs.extend(policies);
    let text = docs
        .iter()
        .map(|d| serde_json::to_string(d).expect("JSON"))
        .collect::<Vec<_>>()
        .join("\n---\n");
    let inventory = netwarden_manifest::parse_str("monitor.yaml", &text, &LoadOptions::default());
    assert!(
        inventory.problems.is_empty(),
        "scenario manifests have problems: {:?}",
        inventory.problems
    );
    let mut failures = Vec::new();
    for backend in [Backend::Nft, Backend::Iptables] {
        let what = format!("rate limit [{}]", backend.as_str());
        let options = LabCheckOptions {
            backend,
            ports: vec![PortProto {
                port: PORT,
                protocol: Protocol::Tcp,
            }],
            engine: EngineOptions::default(),
            render: RenderOptions::default(),
        };
        assert_eq!(
            (options.render.log_rate_per_minute, options.render.log_burst),
            (10, DEFAULT_BURST as u32),
            "the default log rate changed; this test assumes 10/minute, burst 10"
        );
        let _lab = heavy_lock();
        let started = Instant::now();
        let lab = match EnforcedLab::up(&inventory, &options) {
            Ok(lab) => lab,
            Err(e) => {
                failures.push(format!("{what}: lab up: {e:#}"));
                continue;
            }
        };
        let client = PodKey::new(NS, "client-ok");
        let server = PodKey::new(NS, "server");
        let (c, s) = (pod_def("client-ok"), pod_def("server"));
        let specs: Vec<ProbeSpec> = [(c.v4, s.v4), (c.v6, s.v6)]
            .iter()
            .flat_map(|(src, dst)| {
                let spec = ProbeSpec {
                    from: client.clone(),
                    to: server.clone(),
                    src_ip: Some(src.parse().expect("address")),
                    dst_ip: dst.parse().expect("address"),
                    port: PORT,
                    protocol: Protocol::Tcp,
                };
                std::iter::repeat_n(spec, FLOOD)
            })
            .collect();
        let flood_start = Instant::now();
        let outcomes = lab.lab.probe(&specs);
        let flood_time = flood_start.elapsed();
        let events = lab.events();
        if let Err(e) = lab.down() {
            failures.push(format!("{what}: lab down: {e:#}"));
        }
        let failed: Vec<String> = outcomes
            .iter()
            .filter(|o| !o.connected)
            .map(|o| {
                format!(
                    "{} -> {}: {}",
                    o.spec.src_ip.unwrap_or(o.spec.dst_ip),
                    o.spec.dst_ip,
                    o.detail
                )
            })
            .collect();
        if !failed.is_empty() {
            failures.push(format!(
                "{what}: {} of {} flood connections failed: {failed:?}",
                failed.len(),
                outcomes.len()
            ));
        }
        // What 10/minute refills while the flood runs (plus one token for rounding).
        let refill = (flood_time.as_secs_f64() / 6.0).ceil() as usize + 1;
        let per_family = |v6: bool| {
            events
                .iter()
                .filter(|e| e.pod == server.to_string() && e.src.is_ipv6() == v6)
                .count()
        };
        let (v4, v6) = (per_family(false), per_family(true));
        for e in &events {
            let ok = e.pod == server.to_string()
                && e.direction == netwarden_engine::Direction::Ingress
                && e.action == netwarden_monitor::EventAction::WouldDeny
                && e.peer.as_deref() == Some("mon/client-ok")
                && e.dport == Some(PORT);
            if !ok {
                failures.push(format!("{what}: unexpected event {}", e.to_json_line()));
            }
        }
        let caps: Vec<(&str, usize)> = match backend {
            Backend::Nft => vec![("IPv4 and IPv6 together", v4 + v6)],
            Backend::Iptables => vec![("IPv4", v4), ("IPv6", v6)],
        };
        for (label, n) in caps {
            if n > DEFAULT_BURST + refill {
                failures.push(format!(
                    "{what}: {n} events ({label}) for {} connections in {:.1} s: more than the burst {DEFAULT_BURST} + {refill} refilled",
                    specs.len(),
                    flood_time.as_secs_f64()
                ));
            }
            // The bucket starts full: the first connections are logged.
            if n < DEFAULT_BURST.min(FLOOD) {
                failures.push(format!(
                    "{what}: only {n} events ({label}) for {} connections: the burst should be logged",
                    specs.len()
                ));
            }
        }
        println!(
            "{what}: {} connections in {:.1} s, events IPv4 {v4}, IPv6 {v6} ({:.1} s in all)",
            specs.len(),
            flood_time.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
    }
    assert_no_failures(&failures);
}

// ---------------------------------------------------------------------------------------------
// Scenario 7: the conformance suite, every policy monitored

/// Every policy of a step annotated `netwarden.io/mode: monitor`.
fn monitored(policies: &[Value]) -> Result<Vec<Value>, String> {
    policies
        .iter()
        .map(|p| {
            let mut p = p.clone();
            let annotations = p["metadata"]
                .as_object_mut()
                .ok_or("policy without metadata")?
                .entry("annotations")
                .or_insert_with(|| json!({}));
            annotations
                .as_object_mut()
                .ok_or("policy annotations are not a map")?
                .insert("netwarden.io/mode".into(), json!("monitor"));
            Ok(p)
        })
        .collect()
}

#[derive(Default)]
struct Tally {
    labs: usize,
    steps: usize,
    observed: usize,
    sctp: usize,
    events: usize,
    denied_pairs: usize,
    elapsed: Duration,
}

/// One step with every policy monitored: all traffic flows, and the (from, to, port, protocol)
/// with a would-deny event are exactly the expected denied ones (self-pairs excluded: always
/// allowed).
fn check_monitored_step(
    what: &str,
    step: &support::case::Step,
    out: &LabOutput,
    tally: &mut Tally,
    failures: &mut Vec<String>,
) {
    type Flow = (String, String, u16, String);
    let mut expected: BTreeSet<Flow> = BTreeSet::new();
    let mut probed: BTreeSet<(u16, String)> = BTreeSet::new();
    // SCTP is probed (raw INITs) where the kernel has no SCTP sockets, not where it has them.
    let sctp_probed = out
        .probes
        .iter()
        .any(|p| p.protocol == "SCTP" && p.observed.is_some());
    for probe in &step.probes {
        let matrix = match Matrix::parse(&probe.expect) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{what}: bad case data: {e}"));
                continue;
            }
        };
        let protocol = probe.protocol.to_ascii_uppercase();
        if protocol == "SCTP" && !sctp_probed {
            continue;
        }
        probed.insert((probe.port, protocol.clone()));
        for ((from, to), allowed) in &matrix.cells {
            if !allowed && from != to {
                expected.insert((from.clone(), to.clone(), probe.port, protocol.clone()));
            }
        }
    }
    for p in &out.probes {
        match p.observed {
            None if p.protocol == "SCTP" => tally.sctp += 1,
            None => failures.push(format!("{what}: not observed: {}", p.describe())),
            Some(seen) => {
                tally.observed += 1;
                if !seen || !p.allowed {
                    failures.push(format!(
                        "{what}: everything is monitored, yet blocked or predicted blocked: {}",
                        p.describe()
                    ));
                }
            }
        }
    }
    let mut keys: BTreeMap<EventKey, usize> = BTreeMap::new();
    for ev in &out.events {
        *keys.entry(ev.key()).or_default() += 1;
    }
    for (key, n) in keys.iter().filter(|(_, n)| **n > 1) {
        failures.push(format!("{what}: {n} events for one connection: {key:?}"));
    }
    check_events_follow_reach(what, out, failures);
    let mut got: BTreeSet<Flow> = BTreeSet::new();
    for ev in &out.events {
        failures.extend(check_common_fields(what, ev, out.window));
        let r = &ev.raw;
        let ok = ev.action == "would-deny"
            && ev.peer.is_some()
            && strings(&r["policies"]).is_some_and(|p| !p.is_empty())
            && strings(&r["enforced_policies"]).is_some_and(|p| p.is_empty())
            && r["cause"] == "new-isolation";
        if !ok {
            failures.push(format!("{what}: odd event {r}"));
        }
        let (from, to) = ev.pair();
        got.insert((from, to, ev.dport.unwrap_or(0), ev.protocol.clone()));
    }
    tally.events += out.events.len();
    tally.denied_pairs += expected.len();
    for flow in expected.difference(&got) {
        failures.push(format!(
            "{what}: expected denied, but no would-deny event for {} -> {} {}/{}",
            flow.0, flow.1, flow.2, flow.3
        ));
    }
    for flow in got.difference(&expected) {
        failures.push(format!(
            "{what}: would-deny event for {} -> {} {}/{}, which the case expects allowed{}",
            flow.0,
            flow.1,
            flow.2,
            flow.3,
            if probed.contains(&(flow.2, flow.3.clone())) {
                ""
            } else {
                " (a port the step does not probe)"
            }
        ));
    }
}

/// Every step of the cases with every policy monitored; steps with the same pods and ports
/// share one lab (`lab check --then`, see `support::lab`).
fn conformance_monitored(
    backend: &str,
    cases: &[Case],
    model: &[Value],
    failures: &mut Vec<String>,
) {
    struct Planned<'a> {
        what: String,
        step: &'a support::case::Step,
        state: Vec<Value>,
        ports: BTreeSet<(u16, String)>,
    }
    let mut tally = Tally::default();
    let mut planned = Vec::new();
    for case in cases {
        // As written (no variant): labels carried into later steps, ports from the probes.
        for (i, step, prepared) in variant::prepared_steps(case, model, None) {
            let what = format!("{} step {} [{backend}, all monitored]", case.name, i + 1);
            // Every policy monitored.
            let ready = prepared.and_then(|ready| Ok((monitored(&ready.policies)?, ready)));
            match ready {
                Ok((policies, ready)) => {
                    let mut state = ready.objects;
                    state.extend(policies);
                    planned.push(Planned {
                        what,
                        step,
                        state,
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
    for group in support::lab::grouped(planned, |s| support::lab::lab_key(&s.state, &s.ports)) {
        let states: Vec<Vec<Value>> = group.iter().map(|s| s.state.clone()).collect();
        let started = Instant::now();
        let outs = lab_check_docs_states(
            backend,
            &states,
            &group[0].ports,
            &["--log-rate", HIGH_RATE],
        );
        tally.elapsed += started.elapsed();
        tally.labs += 1;
        let before = failures.len();
        match outs {
            Ok(outs) => {
                for (s, out) in group.iter().zip(&outs) {
                    tally.steps += 1;
                    check_monitored_step(&s.what, s.step, out, &mut tally, failures);
                }
            }
            // The lab ran its states together: each of them failed.
            Err(e) => failures.extend(group.iter().map(|s| format!("{}: {e}", s.what))),
        }
        for f in &failures[before..] {
            println!("FAIL {f}");
        }
    }
    println!(
        "conformance, all monitored [{backend}]: {} cases, {} steps in {} labs, {} observed probes ({} SCTP not observable), {} events, {} expected-denied flows, {:.1} s",
        cases.len(),
        tally.steps,
        tally.labs,
        tally.observed,
        tally.sctp,
        tally.events,
        tally.denied_pairs,
        tally.elapsed.as_secs_f64()
    );
    if tally.observed == 0 {
        failures.push(format!("conformance [{backend}]: no probe observed at all"));
    }
}

/// 7. Every `conformance/netpol` case (plain IPv4, every step) with every policy monitored.
#[test]
fn conformance_all_monitored_nft() {
    conformance_all_monitored("nft");
}

#[test]
fn conformance_all_monitored_iptables() {
    conformance_all_monitored("iptables");
}

fn conformance_all_monitored(backend: &str) {
    if !root_or_skip() {
        return;
    }
    let dir = conformance_dir();
    let model = load_objects(&dir.join("model.yaml")).expect("conformance/model.yaml");
    let cases = load_cases(&dir.join("netpol")).expect("conformance/netpol");
    assert!(!cases.is_empty(), "no conformance case found");
    let mut failures = Vec::new();
    conformance_monitored(backend, &cases, &model, &mut failures);
    assert_no_failures(&failures);
}

// ---------------------------------------------------------------------------------------------
// The checks themselves, without a kernel

#[test]
fn rfc3339_is_strict() {
    assert!(rfc3339("2024-05-01T12:34:56.123456Z").is_some());
    assert!(rfc3339("2024-05-01T12:34:56+02:00").is_some());
    assert!(rfc3339("2024-05-01 12:34:56Z").is_none());
    assert!(rfc3339("2024-05-01T12:34:56").is_none());
    assert!(rfc3339("2024-05-01T12:34:56.Z").is_none());
    assert!(rfc3339("2024-13-01T12:34:56Z").is_none());
}

/// `check_events` reports a missing event, a duplicate, a wrong field and an extra event.
#[test]
fn check_events_reports_differences() {
    let probe = |from: &str, to: &str, src: &str, dst: &str| {
        LabProbe::parse(&json!({
            "from": pod_name(from), "to": pod_name(to), "network": "default", "port": PORT,
            "protocol": "TCP", "family": "ipv4", "allowed": true, "staged_allowed": false,
            "observed": true, "src": src, "dst": dst,
        }))
        .expect("probe")
    };
    let now = Timestamp::now();
    let event = |from: &str, src: &str, cause: &str| {
        parse_event(&json!({
            "time": now.to_string(), "node": "lab", "action": "would-deny",
            "direction": "ingress", "pod": "mon/server", "interface": "eth0",
            "network": "default", "peer": pod_name(from), "src": src, "dst": "10.78.0.10",
            "sport": 40000, "dport": PORT, "protocol": "TCP", "policies": ["mon/deny-in"],
            "enforced_policies": [], "cause": cause,
        }))
        .expect("event")
    };
    let out = LabOutput {
        probes: vec![
            probe("client-ok", "server", "10.78.0.11", "10.78.0.10"),
            probe("client-no", "server", "10.78.0.12", "10.78.0.10"),
            probe("other", "server", "10.78.0.13", "10.78.0.10"),
        ],
        events: vec![
            // client-ok: twice; client-no: wrong cause; other: missing; and one extra.
            event("client-ok", "10.78.0.11", "new-isolation"),
            event("client-ok", "10.78.0.11", "new-isolation"),
            event("client-no", "10.78.0.12", "replaced-allow"),
            event("server", "10.78.0.10", "new-isolation"),
        ],
        window: (now, now),
    };
    let mut failures = Vec::new();
    check_events(
        "unit",
        &out,
        &|p| {
            vec![
                Expected::would_deny("ingress", "server", short(&p.from), "new-isolation")
                    .monitored(&["deny-in"]),
            ]
        },
        &mut failures,
    );
    assert_eq!(failures.len(), 4, "{failures:#?}");
    assert!(
        failures[0].contains("2 events instead of one"),
        "{failures:#?}"
    );
    assert!(
        failures[1].contains("event cause should be new-isolation"),
        "{failures:#?}"
    );
    assert!(
        failures[2].contains("missing would-deny ingress event"),
        "{failures:#?}"
    );
    assert!(failures[3].contains("unexpected event"), "{failures:#?}");
}
