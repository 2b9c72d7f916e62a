//! `netwarden suggest` round trip in the lab (issue 9, item 2): on the examples' topology
//! (examples/multinet: four pods, two namespaces, the secondary network data/storage-net),
//! flows are observed as learn mode logs them; the suggested policies of each kind (monitor
//! mode) are enforced in real network namespaces, and the same flows, sent again as real
//! connections, all connect and produce **zero** would-deny events. Then one flow that was never
//! observed, towards a direction the suggestion isolates, produces a would-deny: the kernel
//! rules are as narrow as the suggestion says.
//!
//! With admin policies (SPEC 8) in the cluster, a flow the Admin tier denies gets no rule and
//! stays refused by the kernel (its would-deny at the source's egress, which the suggestion
//! isolates, is the only one, and the YAML says to expect it), a side the Admin tier accepts
//! gets no rule and still connects with no would-deny, and the rest is as above.
//!
//! Needs root (network namespaces); without it the test skips, or fails when `CI=true`. Both
//! backends (nft, iptables). The lab names and removes its own namespaces (also on failure).

use std::net::IpAddr;
use std::path::PathBuf;

use netwarden::cli_args::PortProto;
use netwarden::lab::{EnforcedLab, LabCheckOptions};
use netwarden::suggest::{self, Observations, Workloads};
use netwarden_dataplane::Backend;
use netwarden_engine::{Direction, EngineOptions, NetworkId, Pod, PodKey, PolicyKind, Protocol};
use netwarden_lab::{ProbeOutcome, ProbeSpec};
use netwarden_manifest::LoadOptions;
use netwarden_monitor::{Event, EventAction, Timestamp};
use netwarden_render::RenderOptions;
use netwarden_testing::{heavy_lock, root_or_skip};

fn examples() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/multinet");
    vec![dir.join("namespaces.yaml"), dir.join("pods.yaml")]
}

/// One flow between two pods of the examples.
#[derive(Debug, Clone)]
struct Flow {
    from: &'static str,
    to: &'static str,
    network: NetworkId,
    v6: bool,
    port: u16,
    /// Which ends logged it in learn mode.
    logged: &'static [Direction],
}

fn storage() -> NetworkId {
    NetworkId::nad("data", "storage-net")
}

fn observed_flows() -> Vec<Flow> {
    let both: &'static [Direction] = &[Direction::Egress, Direction::Ingress];
    vec![
        Flow {
            from: "web/frontend",
            to: "web/api",
            network: NetworkId::Primary,
            v6: false,
            port: 8080,
            logged: both,
        },
        Flow {
            from: "web/frontend",
            to: "web/api",
            network: NetworkId::Primary,
            v6: true,
            port: 8080,
            logged: both,
        },
        Flow {
            from: "web/api",
            to: "data/db",
            network: storage(),
            v6: false,
            port: 5432,
            logged: both,
        },
        Flow {
            from: "web/api",
            to: "data/db",
            network: NetworkId::Primary,
            v6: false,
            port: 5432,
            logged: &[Direction::Ingress],
        },
        Flow {
            from: "data/backup",
            to: "data/db",
            network: storage(),
            v6: false,
            port: 5432,
            logged: &[Direction::Egress],
        },
    ]
}

/// A flow never observed, in a direction the suggestion of `kind` isolates.
fn unobserved(kind: PolicyKind) -> Flow {
    match kind {
        // db's ingress on the primary network logged (from api): frontend was never seen.
        PolicyKind::NetworkPolicy | PolicyKind::DanmNetworkPolicy => Flow {
            from: "web/frontend",
            to: "data/db",
            network: NetworkId::Primary,
            v6: false,
            port: 5432,
            logged: &[],
        },
        // api's egress on storage-net logged (to db): backup was never seen.
        PolicyKind::MultiNetworkPolicy => Flow {
            from: "web/api",
            to: "data/backup",
            network: storage(),
            v6: false,
            port: 5432,
            logged: &[],
        },
    }
}

fn pod<'p>(pods: &'p [Pod], key: &str) -> &'p Pod {
    pods.iter()
        .find(|p| p.key.to_string() == key)
        .expect("example pod")
}

fn addresses(pods: &[Pod], f: &Flow) -> (IpAddr, IpAddr) {
    let ip = |key: &str| {
        pod(pods, key)
            .interface_on(&f.network)
            .expect("interface on the flow's network")
            .ips
            .iter()
            .copied()
            .find(|ip| ip.is_ipv6() == f.v6)
            .expect("address of the family")
    };
    (ip(f.from), ip(f.to))
}

/// The events learn mode logs for `flows`.
fn learn_events(pods: &[Pod], flows: &[Flow]) -> Vec<Event> {
    let mut out = Vec::new();
    for (i, f) in flows.iter().enumerate() {
        let (src, dst) = addresses(pods, f);
        for &direction in f.logged {
            let at = match direction {
                Direction::Egress => f.from,
                Direction::Ingress => f.to,
            };
            out.push(Event {
                time: Timestamp::from_secs(1_780_000_000 + i as i64),
                node: "lab".into(),
                action: EventAction::Observed,
                direction,
                pod: at.into(),
                interface: pod(pods, at).interface_on(&f.network).unwrap().name.clone(),
                network: f.network.to_string(),
                peer: None,
                src,
                dst,
                sport: Some(40_000),
                dport: Some(f.port),
                protocol: "TCP".into(),
                policies: Vec::new(),
                enforced_policies: Vec::new(),
                cause: None,
            });
        }
    }
    out
}

fn spec(pods: &[Pod], f: &Flow) -> ProbeSpec {
    let (src, dst) = addresses(pods, f);
    let key = |s: &str| {
        let (ns, name) = s.split_once('/').unwrap();
        PodKey::new(ns, name)
    };
    ProbeSpec {
        from: key(f.from),
        to: key(f.to),
        src_ip: Some(src),
        dst_ip: dst,
        port: f.port,
        protocol: Protocol::Tcp,
    }
}

fn would_denies(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.action == EventAction::WouldDeny)
        .map(Event::to_json_line)
        .collect()
}

/// What one lab run saw: the observed flows' outcomes and the events after them, then the
/// extra flow's outcome and the events after it.
struct LabRun {
    outcomes: Vec<ProbeOutcome>,
    after_observed: Vec<Event>,
    extra_outcome: Vec<ProbeOutcome>,
    after_extra: Vec<Event>,
}

impl LabRun {
    /// Whether the extra flow `extra` logged a would-deny.
    fn extra_would_denied(&self, pods: &[Pod], extra: &Flow) -> bool {
        let (src, dst) = addresses(pods, extra);
        self.after_extra
            .iter()
            .any(|e| e.action == EventAction::WouldDeny && e.src == src && e.dst == dst)
    }
}

/// Enforces `inventory` on `backend` in a lab, probes `flows` then `extra`, tears down.
/// Failures to set up or tear down go to `failures` (`what` names the run).
fn lab_run(
    inventory: &netwarden_manifest::Inventory,
    backend: Backend,
    pods: &[Pod],
    flows: &[Flow],
    extra: &Flow,
    what: &str,
    failures: &mut Vec<String>,
) -> Option<LabRun> {
    let options = LabCheckOptions {
        backend,
        ports: vec![
            PortProto {
                port: 8080,
                protocol: Protocol::Tcp,
            },
            PortProto {
                port: 5432,
                protocol: Protocol::Tcp,
            },
        ],
        engine: EngineOptions::default(),
        render: RenderOptions {
            log_rate_per_minute: 1_000_000,
            ..RenderOptions::default()
        },
    };
    let _lab = heavy_lock();
    let lab = match EnforcedLab::up(inventory, &options) {
        Ok(lab) => lab,
        Err(e) => {
            failures.push(format!("{what}: lab up: {e:#}"));
            return None;
        }
    };
    let specs: Vec<ProbeSpec> = flows.iter().map(|f| spec(pods, f)).collect();
    let outcomes = lab.lab.probe(&specs);
    let after_observed = lab.events();
    let extra_outcome = lab.lab.probe(&[spec(pods, extra)]);
    let after_extra = lab.events();
    if let Err(e) = lab.down() {
        failures.push(format!("{what}: lab down: {e:#}"));
    }
    Some(LabRun {
        outcomes,
        after_observed,
        extra_outcome,
        after_extra,
    })
}

#[test]
fn suggested_policies_pass_the_observed_flows_in_the_lab() {
    if !root_or_skip() {
        return;
    }
    let base = netwarden_manifest::load_paths(&examples(), &LoadOptions::default());
    assert!(base.problems.is_empty(), "{:?}", base.problems);
    let flows = observed_flows();
    let events = learn_events(&base.pods, &flows);
    let workloads = Workloads::new(&base.pods);
    let mut observations = Observations::default();
    for e in &events {
        observations.add(&workloads, e);
    }
    let tiers = suggest::admin_tiers(&base, EngineOptions::default(), &workloads, &observations);
    let mut failures = Vec::new();
    for kind in [
        PolicyKind::NetworkPolicy,
        PolicyKind::MultiNetworkPolicy,
        PolicyKind::DanmNetworkPolicy,
    ] {
        let suggestion = suggest::suggest(&workloads, &observations, &tiers, kind);
        let yaml = suggest::yaml::render(&suggestion, &workloads, &observations);
        let mut loader = netwarden_manifest::Loader::new(LoadOptions::default());
        for path in examples() {
            loader.add_path(&path);
        }
        loader.add_str("suggested.yaml", &yaml);
        let inventory = loader.finish();
        assert!(
            inventory.problems.is_empty(),
            "{kind}: {:?}\n{yaml}",
            inventory.problems
        );
        assert!(
            !inventory.policies.is_empty(),
            "{kind}: nothing suggested\n{yaml}"
        );
        for backend in [Backend::Nft, Backend::Iptables] {
            let what = format!("{kind} [{}]", backend.as_str());
            let extra = unobserved(kind);
            let Some(run) = lab_run(
                &inventory,
                backend,
                &base.pods,
                &flows,
                &extra,
                &what,
                &mut failures,
            ) else {
                continue;
            };
            for o in run
                .outcomes
                .iter()
                .chain(&run.extra_outcome)
                .filter(|o| !o.connected)
            {
                failures.push(format!(
                    "{what}: {} -> {} {}: {} (monitor mode must not block)",
                    o.spec.from, o.spec.to, o.spec.port, o.detail
                ));
            }
            let wd = would_denies(&run.after_observed);
            if !wd.is_empty() {
                failures.push(format!(
                    "{what}: observed flows logged would-deny: {wd:?}\n{yaml}"
                ));
            }
            let wd = would_denies(&run.after_extra);
            if !run.extra_would_denied(&base.pods, &extra) {
                failures.push(format!(
                    "{what}: the unobserved flow {extra:?} logged no would-deny (events: {wd:?})\n{yaml}"
                ));
            }
            println!(
                "{what}: {} observed flows connected, 0 would-deny; unobserved flow: {} would-deny",
                run.outcomes.len(),
                wd.len()
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// db's ingress: the Admin tier denies frontend (`guard`) and accepts api (`allow-api`), on the
/// primary network.
const ADMIN: &str = "apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: guard}
spec:
  priority: 10
  subject: {pods: {namespaceSelector: {matchLabels: {team: data}}, podSelector: {matchLabels: {app: db}}}}
  ingress:
  - name: no-frontend
    action: Deny
    from: [{pods: {namespaceSelector: {matchLabels: {team: web}}, podSelector: {matchLabels: {app: frontend}}}}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: allow-api}
spec:
  tier: Admin
  priority: 20
  subject: {pods: {namespaceSelector: {matchLabels: {team: data}}, podSelector: {matchLabels: {app: db}}}}
  ingress:
  - name: api
    action: Accept
    from: [{pods: {namespaceSelector: {matchLabels: {team: web}}, podSelector: {matchLabels: {app: api}}}}]
";

#[test]
fn suggested_policies_leave_the_admin_tier_its_flows_in_the_lab() {
    if !root_or_skip() {
        return;
    }
    let load = |suggested: Option<&str>| {
        let mut loader = netwarden_manifest::Loader::new(LoadOptions::default());
        for path in examples() {
            loader.add_path(&path);
        }
        loader.add_str("admin.yaml", ADMIN);
        if let Some(yaml) = suggested {
            loader.add_str("suggested.yaml", yaml);
        }
        let inventory = loader.finish();
        assert!(inventory.problems.is_empty(), "{:?}", inventory.problems);
        inventory
    };
    let base = load(None);
    assert_eq!(base.admin_policies.len(), 2);
    let both: &'static [Direction] = &[Direction::Egress, Direction::Ingress];
    let primary = |from, to, port, logged| Flow {
        from,
        to,
        network: NetworkId::Primary,
        v6: false,
        port,
        logged,
    };
    let denied = primary("web/frontend", "data/db", 5432, both);
    let accepted = primary("web/api", "data/db", 5432, &[Direction::Ingress]);
    let plain = primary("web/frontend", "web/api", 8080, both);
    let flows = [denied.clone(), accepted.clone(), plain.clone()];
    let events = learn_events(&base.pods, &flows);
    let workloads = Workloads::new(&base.pods);
    let mut observations = Observations::default();
    for e in &events {
        observations.add(&workloads, e);
    }
    let tiers = suggest::admin_tiers(&base, EngineOptions::default(), &workloads, &observations);
    let suggestion = suggest::suggest(&workloads, &observations, &tiers, PolicyKind::NetworkPolicy);
    let yaml = suggest::yaml::render(&suggestion, &workloads, &observations);
    // Listed, and no rule for either: one is denied, the other's ingress is the Admin tier's.
    let db = workloads.of_pod(&PodKey::new("data", "db")).unwrap();
    let verdicts: Vec<(bool, Vec<Direction>)> = suggestion
        .admin
        .iter()
        .map(|a| (a.tiers.denied, a.tiers.settled.iter().copied().collect()))
        .collect();
    assert_eq!(
        verdicts,
        [
            (false, vec![Direction::Ingress]),
            (true, vec![Direction::Ingress])
        ],
        "{yaml}"
    );
    for p in &suggestion.policies {
        for (flow, _) in p
            .ingress_evidence
            .iter()
            .chain(&p.egress_evidence)
            .flatten()
        {
            assert!(
                flow.dst != suggest::End::Workload(db),
                "a rule for a flow the Admin tier decides\n{yaml}"
            );
        }
    }
    assert!(
        yaml.contains("Admin tier: AdminNetworkPolicy/guard ingress[0] \"no-frontend\" Deny"),
        "{yaml}"
    );
    assert_eq!(suggestion.admin[1].refused_too, [Direction::Egress]);
    assert!(
        yaml.contains("denied by the Admin tier: no rule suggested; the suggestion refuses it at the source's egress too (would-deny events there while monitored)"),
        "{yaml}"
    );
    let inventory = load(Some(&yaml));
    // db logged its ingress: it is isolated, with no rule at all.
    assert!(inventory
        .policies
        .iter()
        .any(|p| p.key.name == "suggested-db"));

    let mut failures = Vec::new();
    for backend in [Backend::Nft, Backend::Iptables] {
        let what = format!("admin [{}]", backend.as_str());
        // Never observed, into db's isolated ingress, not the Admin tier's: a would-deny.
        let extra = primary("data/backup", "data/db", 5432, &[]);
        let Some(run) = lab_run(
            &inventory,
            backend,
            &base.pods,
            &flows,
            &extra,
            &what,
            &mut failures,
        ) else {
            continue;
        };
        for (o, f) in run.outcomes.iter().zip(&flows) {
            // The Admin tier's Deny is enforced; everything else connects (monitor mode).
            let expected = f.from != denied.from || f.to != denied.to;
            if o.connected != expected {
                failures.push(format!(
                    "{what}: {} -> {} {}: connected {} ({})",
                    o.spec.from, o.spec.to, o.spec.port, o.connected, o.detail
                ));
            }
        }
        if !run.extra_outcome.iter().all(|o| o.connected) {
            failures.push(format!(
                "{what}: the unobserved flow was blocked in monitor mode"
            ));
        }
        // The only would-deny: the denied flow at frontend's egress, which the suggestion
        // isolates with no rule for it (the YAML says so); db's ingress is the Admin tier's.
        let (denied_src, denied_dst) = addresses(&base.pods, &denied);
        let wd: Vec<&Event> = run
            .after_observed
            .iter()
            .filter(|e| e.action == EventAction::WouldDeny)
            .collect();
        if wd.is_empty()
            || !wd.iter().all(|e| {
                (e.src, e.dst, e.direction, e.pod.as_str())
                    == (denied_src, denied_dst, Direction::Egress, denied.from)
            })
        {
            failures.push(format!(
                "{what}: observed flows logged would-deny: {wd:?}\n{yaml}"
            ));
        }
        if !run.extra_would_denied(&base.pods, &extra) {
            failures.push(format!(
                "{what}: the unobserved flow logged no would-deny (events: {:?})\n{yaml}",
                would_denies(&run.after_extra)
            ));
        }
        println!(
            "{what}: Admin Deny refused (would-deny at the source's egress only), Admin Accept and the rest connected; unobserved flow: would-deny"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
