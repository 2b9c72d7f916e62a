//! Precision of dirty tracking at cluster scale (issue 8, "incremental at cluster scale"): on
//! the generated cluster of 1,000 pods behind 50 Services with 200 policies, a change must
//! name dirty exactly the pods whose rules change — not every pod, as a Service change once
//! did. "The pods whose rules change" is found by brute force: every pod's rules before the
//! change, against every pod's rules from a fresh engine fed the objects after it.
//! (Incremental equals fresh on random histories is `tests/fuzz_engine.rs`.)

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use netwarden_engine::generate::{cluster, pod_ip, Cluster};
use netwarden_engine::testing::pod;
use netwarden_engine::*;

const PODS: usize = 1_000;
const POLICIES: usize = 200;

/// The generated cluster, with an extra pod `extra` in `ns0` when given.
fn objects(extra: Option<&Pod>) -> Cluster {
    let mut c = cluster(PODS, POLICIES, 42);
    c.pods.extend(extra.cloned());
    c
}

fn feed(c: &Cluster) -> Engine {
    let mut e = Engine::new(EngineOptions::default());
    for ns in &c.namespaces {
        e.set_namespace(ns.clone());
    }
    for p in &c.pods {
        e.set_pod(p.clone());
    }
    for p in &c.policies {
        e.set_policy(p.clone());
    }
    for s in &c.services {
        e.set_service(s.clone());
    }
    e
}

/// Pods whose rules differ between `before` and a fresh engine's rules over `after`.
fn differing(before: &BTreeMap<PodKey, PodRules>, after: &Cluster) -> BTreeSet<PodKey> {
    let after = feed(after).all_pod_rules();
    before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .cloned()
        .collect()
}

/// An engine over `c` with every pod's rules computed (as an agent holds them), and those
/// rules.
fn computed(c: &Cluster) -> (Engine, BTreeMap<PodKey, PodRules>) {
    let mut e = feed(c);
    let rules = e.all_pod_rules();
    assert!(e.take_dirty().is_empty());
    (e, rules)
}

/// Endpoint edits of a selector-less Service `svc<N>` (whose endpoints are the pods of app
/// N): one address goes; every address moves to the pods of app N + 1; every address goes.
fn endpoint_edits(service: &Service) -> Vec<Vec<IpAddr>> {
    let app: usize = service.key.name["svc".len()..].parse().expect("svc<N>");
    let next = (app + 1) % (PODS / 20);
    vec![
        service.endpoint_addrs[1..].to_vec(),
        (0..20).map(|i| pod_ip(next * 20 + i)).collect(),
        Vec::new(),
    ]
}

#[test]
fn a_service_endpoint_change_dirties_exactly_the_pods_whose_rules_change() {
    let c = objects(None);
    assert_eq!(c.services.len(), 50);
    let sliced: Vec<&Service> = c.services.iter().filter(|s| s.selector.is_none()).collect();
    assert!(
        !sliced.is_empty(),
        "the generator makes selector-less Services"
    );
    let (mut engine, before) = computed(&c);
    let mut changes_with_effect = 0;
    let mut largest = 0;
    for service in sliced {
        for addrs in endpoint_edits(service) {
            let mut changed = service.clone();
            changed.endpoint_addrs = addrs;
            engine.set_service(changed.clone());
            let dirty = engine.take_dirty();

            let mut after = objects(None);
            let at = after
                .services
                .iter()
                .position(|s| s.key == changed.key)
                .expect("same Services");
            after.services[at] = changed.clone();
            let expected = differing(&before, &after);
            assert_eq!(
                dirty, expected,
                "{}: endpoints {:?}",
                changed.key, changed.endpoint_addrs
            );
            changes_with_effect += usize::from(!expected.is_empty());
            largest = largest.max(expected.len());
            // The agent recomputes every pod named dirty that it holds rules for.
            for key in dirty {
                engine.pod_rules(&key);
            }

            // Back to the cluster as it was, every pod's rules recomputed as an agent would.
            engine.set_service(service.clone());
            for key in engine.take_dirty() {
                assert_eq!(engine.pod_rules(&key).as_ref(), before.get(&key), "{key}");
            }
        }
    }
    // The property above must not hold vacuously: some changes reach rules, and none reaches
    // every pod.
    assert!(changes_with_effect > 0, "no endpoint change reached a rule");
    assert!(largest < PODS / 10, "{largest} pods changed");
}

#[test]
fn a_change_to_a_selector_services_endpoints_through_a_pod_is_precise() {
    // Selector Services follow their pods: a pod leaving an app leaves its Service. Its
    // address also leaves policy peers, where dirty tracking compares per peer, not per rule:
    // the dirty pods cover the pods whose rules change, and stay near them.
    let c = objects(None);
    for i in [0usize, 45, 333, 999] {
        let (mut engine, before) = computed(&c);
        let mut pod = c.pods[i].clone();
        pod.labels.insert("app".into(), "elsewhere".into());
        engine.set_pod(pod.clone());
        let dirty = engine.take_dirty();
        let mut after = objects(None);
        after.pods[i] = pod;
        let expected = differing(&before, &after);
        assert!(
            dirty.is_superset(&expected),
            "pod{i}: missed {:?}",
            expected.difference(&dirty)
        );
        // The slack: the pod itself, and rules where another peer already allowed its address.
        assert!(
            dirty.len() <= expected.len() + 5,
            "pod{i}: {} pods dirty, {} changed",
            dirty.len(),
            expected.len()
        );
    }
}

#[test]
fn a_pod_nothing_selects_dirties_only_itself() {
    // No Service selects `app: lonely`, no policy targets it, and no peer picks it: peers
    // select by app, by `tier: web` across namespaces, or by `tier in (api, db)`.
    let mut lonely = pod("ns0", "lonely", &[("app", "lonely")], &["10.200.0.1/8"]);
    let c = objects(Some(&lonely));
    let (mut engine, before) = computed(&c);
    lonely.labels.insert("app".into(), "lonelier".into());
    lonely.container_ports.push(ContainerPort {
        name: Some("http".into()),
        port: 8080,
        protocol: Protocol::Tcp,
    });
    lonely.interfaces[0].ips = vec!["10.200.0.2".parse().unwrap()];
    engine.set_pod(lonely.clone());
    let dirty = engine.take_dirty();
    assert_eq!(dirty, BTreeSet::from([lonely.key.clone()]));
    let expected = differing(&before, &objects(Some(&lonely)));
    assert_eq!(expected, BTreeSet::from([lonely.key.clone()]));
}

#[test]
fn a_change_only_the_pod_sees_dirties_only_itself() {
    // pod0 is behind a Service, in policy peers and targeted: its netns and interface names
    // still concern no other pod.
    let c = objects(None);
    let (mut engine, _) = computed(&c);
    let mut pod = c.pods[0].clone();
    pod.netns = Some("/run/netns/recreated".into());
    pod.interfaces[0].name = "eth9".into();
    engine.set_pod(pod.clone());
    assert_eq!(engine.take_dirty(), BTreeSet::from([pod.key.clone()]));
    let rules = engine.pod_rules(&pod.key).expect("known pod");
    assert_eq!(rules.netns.as_deref(), Some("/run/netns/recreated"));
    assert_eq!(rules.interfaces[0].name, "eth9");
}
