//! Admin policies (SPEC 8) with `netwarden run --kube`, end to end: the fake API server (real
//! list/watch over HTTP), one real `netwarden` agent for the whole scenario (node n1), three
//! pods in real network namespaces (a lab: one bridge, IPv4 and IPv6, every pod listening on
//! TCP 8080 and 8081), real TCP probes (root; fails when `CI=true` without it).
//!
//! Namespaces `adm-a`, `adm-b`, `adm-c` (label `team` a, b, c) hold one pod each (`a1`, `b1`,
//! `c1`), all on n1, so this agent programs both ends of every connection. At every step the
//! whole matrix (every ordered pair of pods, both ports, both families) is probed until it is
//! what the admin tiers say — the denied connections refused, every other one connecting —
//! within a bounded deadline:
//! 1. no admin CRD served: everything connects;
//! 2. the v1alpha2 ClusterNetworkPolicy CRD installed while the agent runs; an Admin-tier Deny
//!    a→b on 8080 (and an invalid admin policy beside it, which gets an Event and disturbs
//!    nothing);
//! 3. its action Deny→Accept over a NetworkPolicy of b that isolates it; two policies' priorities
//!    swapped (the verdict flips); its subject moved from b to c;
//! 4. Pass (the rest of the Admin tier skipped, the NetworkPolicy decides) and a Baseline-tier
//!    Deny that only applies where no NetworkPolicy isolates;
//! 5. the policies deleted: everything connects again;
//! 6. the v1alpha1 AdminNetworkPolicy / BaselineAdminNetworkPolicy CRDs installed, their policies
//!    enforced; the API failing for those kinds (503, watches cut) keeps them enforced; the CRDs
//!    gone without a word (their paths 404, no DELETED event): enforced until the deletion is
//!    confirmed (`--crd-grace`), then dropped;
//! 7. the v1alpha2 CRD deleted as kube-apiserver deletes one (its objects first, a DELETED event
//!    each): its policy dropped at once.
//!
//! Netns are `nwak<pid>-…` (the lab's), removed even when the test fails; traffic only flows
//! between them.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use common::{lab_up_with_ports, namespace_doc_with, pod_doc_in, PodDef};
use netwarden_engine::{PodKey, Protocol};
use netwarden_kube_fake::{FakeApiServer, ServerOptions};
use netwarden_lab::{Lab, ProbeDetail, ProbeSpec};
use netwarden_testing::{
    free_port, http_get, kube_agent_args, metric, netwarden_bin, ready, root_or_skip,
    rules_snapshot, unique_prefix, wait_until, AgentProcess, TempDir,
};
use serde_json::{json, Value};

const GROUP: &str = "policy.networking.k8s.io";
const V1ALPHA2: &str = "policy.networking.k8s.io/v1alpha2";
const V1ALPHA1: &str = "policy.networking.k8s.io/v1alpha1";
const NETWORK_POLICY: &str = "networking.k8s.io/v1";
/// Every pod listens on both; policies name 8080 or 8081 to show what they leave alone.
const PORTS: [u16; 2] = [8080, 8081];
/// `--crd-grace`: how long a deleted CRD's policies stay enforced.
const GRACE: Duration = Duration::from_secs(3);
/// The longest a step may take to be enforced (the agent polls every 200 ms).
const CONVERGE: Duration = Duration::from_secs(20);

/// One pod per namespace: (namespace, its `team` label, the pod).
const PODS: [(&str, &str, PodDef); 3] = [
    (
        "adm-a",
        "a",
        PodDef {
            name: "a1",
            labels: &[("app", "a1")],
            v4: "10.78.0.1",
            v6: "fd78::1",
        },
    ),
    (
        "adm-b",
        "b",
        PodDef {
            name: "b1",
            labels: &[("app", "b1")],
            v4: "10.78.0.2",
            v6: "fd78::2",
        },
    ),
    (
        "adm-c",
        "c",
        PodDef {
            name: "c1",
            labels: &[("app", "c1")],
            v4: "10.78.0.3",
            v6: "fd78::3",
        },
    ),
];

/// A connection refused at a step: (from pod, to pod, port), for both families.
type Denied = (&'static str, &'static str, u16);

/// `{}` (every namespace) or `team=<team>`.
fn namespaces(team: Option<&str>) -> Value {
    match team {
        Some(team) => json!({"matchLabels": {"team": team}}),
        None => json!({}),
    }
}

/// A v1alpha2 ClusterNetworkPolicy with one ingress rule: `action` on the pods of the
/// namespaces `subject` from those of `from`, on TCP `port` (a team `None`: every namespace;
/// a port `None`: every port and protocol). Changed with struct update syntax.
#[derive(Clone, Copy)]
struct Cnp {
    name: &'static str,
    tier: &'static str,
    priority: u32,
    subject: Option<&'static str>,
    action: &'static str,
    from: Option<&'static str>,
    port: Option<u16>,
}

impl Cnp {
    /// Admin tier, priority 10: `action` on b's pods from a's on TCP 8080.
    fn a_to_b(name: &'static str, action: &'static str) -> Cnp {
        Cnp {
            name,
            tier: "Admin",
            priority: 10,
            subject: Some("b"),
            action,
            from: Some("a"),
            port: Some(8080),
        }
    }

    fn doc(&self) -> Value {
        let mut rule = json!({"name": format!("{}-rule", self.action.to_lowercase()),
                              "action": self.action,
                              "from": [{"namespaces": namespaces(self.from)}]});
        if let Some(port) = self.port {
            rule["protocols"] = json!([{"tcp": {"destinationPort": {"number": port}}}]);
        }
        json!({"apiVersion": V1ALPHA2, "kind": "ClusterNetworkPolicy",
               "metadata": {"name": self.name},
               "spec": {"tier": self.tier, "priority": self.priority,
                        "subject": {"namespaces": namespaces(self.subject)}, "ingress": [rule]}})
    }
}

/// A v1alpha1 admin policy (`AdminNetworkPolicy`, or the `BaselineAdminNetworkPolicy`
/// `default` when `priority` is `None`): Deny from the pods of namespace `from` to those of
/// `subject` on TCP `port`.
fn v1alpha1_deny(name: &str, priority: Option<u32>, subject: &str, from: &str, port: u16) -> Value {
    let mut spec = json!({"subject": {"namespaces": namespaces(Some(subject))},
        "ingress": [{"name": "deny", "action": "Deny", "from": [{"namespaces": namespaces(Some(from))}],
                     "ports": [{"portNumber": {"protocol": "TCP", "port": port}}]}]});
    let kind = match priority {
        Some(priority) => {
            spec["priority"] = json!(priority);
            "AdminNetworkPolicy"
        }
        None => "BaselineAdminNetworkPolicy",
    };
    json!({"apiVersion": V1ALPHA1, "kind": kind, "metadata": {"name": name}, "spec": spec})
}

/// A NetworkPolicy isolating every pod of `ns` for ingress, allowing TCP 8080 from the pods
/// of the namespaces of `teams` (none: nothing allowed).
fn network_policy(ns: &str, name: &str, teams: &[&str]) -> Value {
    let mut spec = json!({"podSelector": {}, "policyTypes": ["Ingress"]});
    if !teams.is_empty() {
        let from: Vec<Value> = teams
            .iter()
            .map(|t| json!({"namespaceSelector": namespaces(Some(t))}))
            .collect();
        spec["ingress"] = json!([{"from": from, "ports": [{"protocol": "TCP", "port": 8080}]}]);
    }
    json!({"apiVersion": NETWORK_POLICY, "kind": "NetworkPolicy",
           "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

fn pod_key(name: &str) -> PodKey {
    let (ns, _, _) = PODS
        .iter()
        .find(|(_, _, p)| p.name == name)
        .unwrap_or_else(|| panic!("no pod {name}"));
    PodKey::new(*ns, name)
}

/// The probes whose outcome is not the one wanted (a denial must be a refusal, never a
/// timeout), described.
fn disagreements(lab: &Lab, want: &[(ProbeSpec, bool)]) -> Vec<String> {
    let specs: Vec<ProbeSpec> = want.iter().map(|(s, _)| s.clone()).collect();
    lab.probe(&specs)
        .into_iter()
        .zip(want)
        .filter(|(o, (_, allowed))| match o.detail {
            ProbeDetail::Connected => !allowed,
            ProbeDetail::Refused => *allowed,
            _ => true,
        })
        .map(|(o, (_, allowed))| {
            format!(
                "{} -> {} [{}]:{}: {} (want {})",
                o.spec.from,
                o.spec.to,
                o.spec.dst_ip,
                o.spec.port,
                o.detail,
                if *allowed { "connected" } else { "refused" }
            )
        })
        .collect()
}

/// The value of `name{kind="<kind>"}` in a `/metrics` text.
fn labelled(text: &str, name: &str, kind: &str) -> Option<f64> {
    let prefix = format!("{name}{{kind=\"{kind}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
}

/// The lab, the API server and the agent. Fields drop in order: the agent first, the lab (its
/// netns) last.
struct World {
    agent: AgentProcess,
    metrics: SocketAddr,
    api: FakeApiServer,
    _runtime: tokio::runtime::Runtime,
    _dir: TempDir,
    lab: Lab,
    started: Instant,
}

impl World {
    fn new() -> World {
        let mut docs = Vec::new();
        for (ns, team, pod) in &PODS {
            docs.push(namespace_doc_with(ns, "team", team));
            docs.push(pod_doc_in(ns, pod, None));
        }
        let ports: Vec<(u16, Protocol)> = PORTS.iter().map(|&p| (p, Protocol::Tcp)).collect();
        let (lab, _) = lab_up_with_ports(&unique_prefix("nwak"), &docs, &ports);

        let runtime = tokio::runtime::Runtime::new().unwrap();
        let api = runtime
            .block_on(FakeApiServer::start(ServerOptions::default()))
            .expect("start the fake API server");
        // Every cluster has it: Events about cluster-scoped objects are written there.
        api.create(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}),
        )
        .unwrap();
        for (ns, team, pod) in &PODS {
            api.create(namespace_doc_with(ns, "team", team)).unwrap();
            let netns = lab.pod_netns(&pod_key(pod.name)).expect("a lab netns");
            let mut doc = pod_doc_in(ns, pod, Some(netns));
            doc["spec"]["nodeName"] = json!("n1");
            doc["status"]["phase"] = json!("Running");
            api.create(doc).unwrap();
        }
        let dir = TempDir::new("nwak");
        let kubeconfig = dir.path.join("kubeconfig");
        api.write_kubeconfig(&kubeconfig).unwrap();
        let metrics = free_port();
        let mut args = kube_agent_args(&kubeconfig, "n1", metrics);
        args.extend(
            [
                "--crd-grace",
                &format!("{}s", GRACE.as_secs()),
                // CRDs installed while the agent runs are found within this.
                "--discovery-interval",
                "250ms",
            ]
            .map(String::from),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut agent = AgentProcess::start(&netwarden_bin!(), &args, &dir.path.join("agent.log"));
        agent.wait_for("ready", Duration::from_secs(30), || ready(metrics));
        World {
            agent,
            metrics,
            api,
            _runtime: runtime,
            _dir: dir,
            lab,
            started: Instant::now(),
        }
    }

    /// Every probe of the matrix with whether it must connect: every ordered pair of pods,
    /// both ports, both families; refused exactly when listed in `denied`.
    fn matrix(&self, denied: &[Denied]) -> Vec<(ProbeSpec, bool)> {
        let mut out = Vec::new();
        for (_, _, from) in &PODS {
            for (_, _, to) in &PODS {
                if from.name == to.name {
                    continue;
                }
                for port in PORTS {
                    for addr in [to.v4, to.v6] {
                        let spec = ProbeSpec {
                            from: pod_key(from.name),
                            to: pod_key(to.name),
                            src_ip: None,
                            dst_ip: addr.parse::<IpAddr>().unwrap(),
                            port,
                            protocol: Protocol::Tcp,
                        };
                        let allowed = !denied.contains(&(from.name, to.name, port));
                        out.push((spec, allowed));
                    }
                }
            }
        }
        out
    }

    /// Fails with the disagreements, the pods' rules and the agent's log.
    fn fail(&self, step: &str, wrong: &[String]) -> ! {
        let rules: Vec<String> = PODS
            .iter()
            .map(|(_, _, p)| {
                let netns = self.lab.pod_netns(&pod_key(p.name)).unwrap();
                format!("--- rules of {}:\n{}", p.name, rules_snapshot("nft", netns))
            })
            .collect();
        panic!(
            "{step}: {wrong:#?}\n{}\n--- agent log:\n{}",
            rules.join("\n"),
            self.agent.log()
        );
    }

    /// Waits (at most [`CONVERGE`]) until exactly the `denied` connections are refused.
    fn expect(&mut self, step: &str, denied: &[Denied]) {
        let want = self.matrix(denied);
        let start = Instant::now();
        let mut wrong = Vec::new();
        let done = wait_until(CONVERGE, || {
            self.agent.assert_running();
            wrong = disagreements(&self.lab, &want);
            wrong.is_empty()
        });
        if !done {
            self.fail(step, &wrong);
        }
        eprintln!(
            "[{:5.1}s] {step}: enforced after {} ms ({} probes, {} refused)",
            self.started.elapsed().as_secs_f64(),
            start.elapsed().as_millis(),
            want.len(),
            want.iter().filter(|(_, a)| !a).count()
        );
    }

    /// The `denied` connections stay refused, and every other one connects, at every round
    /// until `until`.
    fn hold(&mut self, step: &str, denied: &[Denied], until: Instant) {
        let want = self.matrix(denied);
        let mut rounds = 0;
        while Instant::now() < until {
            self.agent.assert_running();
            let wrong = disagreements(&self.lab, &want);
            if !wrong.is_empty() {
                self.fail(step, &wrong);
            }
            rounds += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "[{:5.1}s] {step}: held over {rounds} rounds",
            self.started.elapsed().as_secs_f64()
        );
    }

    fn readyz(&self) -> String {
        http_get(self.metrics, "/readyz").unwrap_or_default()
    }

    fn create(&self, doc: Value) {
        self.api.create(doc).unwrap();
    }

    fn update(&self, doc: Value) {
        self.api.update(doc).unwrap();
    }

    fn delete(&self, api_version: &str, kind: &str, namespace: &str, name: &str) {
        self.api.delete(api_version, kind, namespace, name).unwrap();
    }
}

#[test]
fn admin_policies_follow_the_cluster() {
    if !root_or_skip() {
        return;
    }
    let mut w = World::new();
    const CNP: &str = "ClusterNetworkPolicy";

    // 1. No admin CRD served: the agent says so once, and nothing is refused.
    w.expect("1 baseline, no admin CRD", &[]);
    assert!(
        w.agent
            .log()
            .contains("ClusterNetworkPolicy (policy.networking.k8s.io/v1alpha2) is not served"),
        "{}",
        w.agent.log()
    );

    // 2. The v1alpha2 CRD installed while the agent runs; an Admin-tier Deny a -> b on 8080,
    // and an invalid policy (priority out of range) whose subject has no pod.
    w.api.install_crd(GROUP, "v1alpha2", CNP);
    let guard = Cnp::a_to_b("guard", "Deny");
    w.create(guard.doc());
    let broken = Cnp {
        name: "broken",
        priority: 5000,
        subject: Some("z"),
        ..guard
    };
    w.create(broken.doc());
    w.expect(
        "2 CRD installed, Admin Deny a->b:8080",
        &[("a1", "b1", 8080)],
    );
    assert!(
        w.agent
            .log()
            .contains("ClusterNetworkPolicy is now served (v1alpha2)"),
        "{}",
        w.agent.log()
    );
    let api = &w.api;
    let invalid_event = wait_until(Duration::from_secs(10), || {
        api.objects("Event").iter().any(|e| {
            e["reason"] == "InvalidPolicy"
                && e["regarding"]["kind"] == CNP
                && e["regarding"]["name"] == "broken"
        })
    });
    assert!(
        invalid_event,
        "an InvalidPolicy Event on broken: {:#?}\n{}",
        w.api.objects("Event"),
        w.agent.log()
    );

    // 3a. Action: b isolated by a NetworkPolicy (nothing allowed), then the Admin Deny turned
    // into an Accept, which the namespaced tier cannot override.
    w.create(network_policy("adm-b", "b-isolate", &[]));
    let b_isolated = [
        ("a1", "b1", 8080),
        ("a1", "b1", 8081),
        ("c1", "b1", 8080),
        ("c1", "b1", 8081),
    ];
    w.expect("3a NetworkPolicy isolates b", &b_isolated);
    let guard = Cnp {
        action: "Accept",
        ..guard
    };
    w.update(guard.doc());
    let b_accepts_a = &b_isolated[1..];
    w.expect(
        "3a action Deny -> Accept over the NetworkPolicy",
        b_accepts_a,
    );

    // 3b. Priority: the Accept at 20, a Deny (`blocker`) at 10 first; swapped, the Accept
    // decides. The swap's intermediate state (both at 20) is decided by name, `blocker` first:
    // still refused, so only the swap as a whole opens a1 -> b1:8080.
    let guard = Cnp {
        priority: 20,
        ..guard
    };
    w.update(guard.doc());
    let blocker = Cnp::a_to_b("blocker", "Deny");
    w.create(blocker.doc());
    w.expect("3b Deny at 10 before Accept at 20", &b_isolated);
    w.update(
        Cnp {
            priority: 20,
            ..blocker
        }
        .doc(),
    );
    let guard = Cnp {
        priority: 10,
        ..guard
    };
    w.update(guard.doc());
    w.expect("3b priorities swapped: Accept at 10 first", b_accepts_a);
    w.delete(V1ALPHA2, CNP, "", "blocker");

    // 3c. Subject: the Deny back, b no longer isolated; then the subject moved to c: b is open
    // again, c refuses a on 8080.
    let guard = Cnp {
        action: "Deny",
        ..guard
    };
    w.update(guard.doc());
    w.delete(NETWORK_POLICY, "NetworkPolicy", "adm-b", "b-isolate");
    w.expect("3c Deny again, b not isolated", &[("a1", "b1", 8080)]);
    let guard = Cnp {
        subject: Some("c"),
        ..guard
    };
    w.update(guard.doc());
    w.expect("3c subject b -> c", &[("a1", "c1", 8080)]);

    // 4. Pass: c isolated by a NetworkPolicy allowing 8080 from b only; `guard` passes a -> c
    // on 8080 to it, skipping `catch` (Admin, priority 50, accepting everything from a), which
    // still accepts a -> c on 8081 over the NetworkPolicy.
    w.create(network_policy("adm-c", "c-policy", &["b"]));
    w.update(
        Cnp {
            action: "Pass",
            ..guard
        }
        .doc(),
    );
    let catch = Cnp {
        name: "catch",
        priority: 50,
        action: "Accept",
        port: None,
        ..guard
    };
    w.create(catch.doc());
    w.expect(
        "4 Pass: the NetworkPolicy refuses a -> c:8080, catch accepts 8081",
        &[("a1", "c1", 8080), ("b1", "c1", 8081)],
    );
    // The NetworkPolicy now allows a too: what was passed to it connects.
    w.update(network_policy("adm-c", "c-policy", &["a", "b"]));
    w.expect(
        "4 Pass: the NetworkPolicy decides a -> c:8080",
        &[("b1", "c1", 8081)],
    );
    // A Baseline-tier Deny of 8080 from everyone to everyone: it applies to a and b, which no
    // NetworkPolicy isolates, never to c, which c-policy isolates.
    let floor = Cnp {
        name: "floor",
        tier: "Baseline",
        subject: None,
        from: None,
        ..Cnp::a_to_b("floor", "Deny")
    };
    w.create(floor.doc());
    w.expect(
        "4 Baseline Deny only where no NetworkPolicy isolates",
        &[
            ("a1", "b1", 8080),
            ("b1", "a1", 8080),
            ("c1", "a1", 8080),
            ("c1", "b1", 8080),
            ("b1", "c1", 8081),
        ],
    );

    // 5. Deleted: everything connects again.
    for name in ["guard", "catch", "floor", "broken"] {
        w.delete(V1ALPHA2, CNP, "", name);
    }
    w.expect(
        "5 admin policies deleted",
        &[("a1", "c1", 8081), ("b1", "c1", 8081)],
    );
    w.delete(NETWORK_POLICY, "NetworkPolicy", "adm-c", "c-policy");
    w.expect("5 NetworkPolicy deleted", &[]);

    // 6. v1alpha1: both CRDs installed while the agent runs, an AdminNetworkPolicy Deny a -> b
    // on 8080 and the BaselineAdminNetworkPolicy denying a -> c on 8081 (ingress of c).
    for kind in ["AdminNetworkPolicy", "BaselineAdminNetworkPolicy"] {
        w.api.install_crd(GROUP, "v1alpha1", kind);
    }
    w.create(v1alpha1_deny("anp-guard", Some(10), "b", "a", 8080));
    // The Baseline also denies c's egress to b on 8081: refused at the source.
    let mut baseline = v1alpha1_deny("default", None, "c", "a", 8081);
    baseline["spec"]["egress"] = json!([{"name": "no-b", "action": "Deny",
        "to": [{"namespaces": namespaces(Some("b"))}],
        "ports": [{"portNumber": {"protocol": "TCP", "port": 8081}}]}]);
    w.create(baseline);
    let v1alpha1_denied = [("a1", "b1", 8080), ("a1", "c1", 8081), ("c1", "b1", 8081)];
    w.expect(
        "6 v1alpha1 CRDs installed, policies enforced",
        &v1alpha1_denied,
    );

    // Until now no watch met an error, and nothing was logged as one.
    let log_before_faults = w.agent.log().len();
    let text = http_get(w.metrics, "/metrics").unwrap_or_default();
    for kind in netwarden_kube::WATCHED_KINDS {
        assert_eq!(
            labelled(&text, "netwarden_watch_errors_total", kind.kind),
            Some(0.0),
            "{}: {text}",
            kind.kind
        );
    }

    // Transient errors: every request about those kinds answered 503, their watches cut (the
    // relists fail): the last state stays enforced, the agent not ready meanwhile.
    w.api.clear_requests();
    for kind in ["AdminNetworkPolicy", "BaselineAdminNetworkPolicy"] {
        w.api.set_kind_unavailable(kind, true);
    }
    w.api.fail_watches();
    let api = &w.api;
    w.agent.wait_for(
        "the v1alpha1 kinds refused and the agent not ready",
        Duration::from_secs(10),
        || {
            let refused = |kind: &str| {
                api.requests()
                    .0
                    .iter()
                    .any(|r| r.kind.as_deref() == Some(kind) && r.code == 503)
            };
            refused("AdminNetworkPolicy")
                && refused("BaselineAdminNetworkPolicy")
                && !ready(w.metrics)
        },
    );
    w.hold(
        "6 API failing for the v1alpha1 kinds: last state kept",
        &v1alpha1_denied,
        Instant::now() + Duration::from_millis(1500),
    );
    for kind in ["AdminNetworkPolicy", "BaselineAdminNetworkPolicy"] {
        w.api.set_kind_unavailable(kind, false);
    }
    let metrics = w.metrics;
    w.agent
        .wait_for("ready again", Duration::from_secs(20), || ready(metrics));
    w.expect("6 API back", &v1alpha1_denied);

    // The CRDs gone without a word (their paths 404, their watches ended, no DELETED event: a
    // restarting API server looks the same for a while): enforced while the deletion is not
    // confirmed (`/readyz` says why), dropped once discovery has kept saying so for
    // `--crd-grace`.
    let deleted = Instant::now();
    for kind in ["AdminNetworkPolicy", "BaselineAdminNetworkPolicy"] {
        w.api.uninstall_crd(GROUP, "v1alpha1", kind);
    }
    let noticed = wait_until(Duration::from_secs(10), || {
        w.readyz()
            .contains(&format!("AdminNetworkPolicy: {V1ALPHA1} not served since"))
    });
    assert!(
        noticed,
        "/readyz names the kind not served: {}\n{}",
        w.readyz(),
        w.agent.log()
    );
    // The agent drops nothing before GRACE after it noticed, which is after `deleted`.
    w.hold(
        "6 CRDs deleted, not confirmed yet: last state kept",
        &v1alpha1_denied,
        deleted + GRACE - Duration::from_millis(700),
    );
    w.expect("6 CRD deletion confirmed: policies dropped", &[]);
    assert!(
        deleted.elapsed() >= GRACE,
        "dropped {:?} after the deletion, before --crd-grace",
        deleted.elapsed()
    );
    w.agent.wait_for(
        "ready: an absent kind is no outage",
        Duration::from_secs(20),
        || ready(metrics),
    );

    // 7. The v1alpha2 CRD deleted as kube-apiserver deletes one, with a policy in it: the
    // objects are deleted first (a DELETED event each), which the agent applies at once, then
    // the kind goes.
    w.create(
        Cnp {
            port: Some(8081),
            ..Cnp::a_to_b("last", "Deny")
        }
        .doc(),
    );
    w.expect("7 a ClusterNetworkPolicy again", &[("a1", "b1", 8081)]);
    assert_eq!(w.api.delete_crd(GROUP, CNP), 1);
    w.expect("7 CRD deleted, its policy with it", &[]);
    w.agent.wait_for(
        "ready: the deleted kind absent",
        Duration::from_secs(20),
        || ready(metrics),
    );

    // No reconcile failed, no error logged; what the agent holds is what the cluster has.
    assert_eq!(
        metric(metrics, "netwarden_sync_errors_total"),
        Some(0.0),
        "{}",
        w.agent.log()
    );
    // The kinds' objects are gone (a kind holding none has no line).
    let text = http_get(metrics, "/metrics").unwrap_or_default();
    for kind in [
        CNP,
        "AdminNetworkPolicy",
        "BaselineAdminNetworkPolicy",
        "NetworkPolicy",
    ] {
        assert_eq!(
            labelled(&text, "netwarden_objects", kind).unwrap_or(0.0),
            0.0,
            "{kind}: {text}"
        );
    }
    // Errors logged: none before the faults; after them, only kube's client reporting the
    // answers the test made the API server give (503 while failing, 404 once deleted).
    let log = w.agent.log();
    let (before, after) = log.split_at(log_before_faults);
    let errors = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains(" ERROR "))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        errors(before),
        Vec::<String>::new(),
        "errors before the faults"
    );
    let unexpected: Vec<String> = errors(after)
        .into_iter()
        .filter(|l| {
            !(l.contains("kube_client::client::builder: failed with status")
                && (l.contains(" 503 ") || l.contains(" 404 ")))
        })
        .collect();
    assert!(unexpected.is_empty(), "errors logged: {unexpected:#?}");
    w.agent.assert_running();
    eprintln!(
        "admin_policies_follow_the_cluster: {:.1}s from the agent ready",
        w.started.elapsed().as_secs_f64()
    );
}
