//! Property tests of the engine (issue: foundation): adding an allow rule never turns an allow
//! into a deny; a policy that selects no pod changes no verdict; verdicts do not depend on
//! object order; incremental recomputation equals a fresh computation.

use std::collections::BTreeMap;

use netwarden_engine::testing::*;
use netwarden_engine::*;
use proptest::prelude::*;

const NAMESPACES: [&str; 2] = ["x", "y"];
const VALUES: [&str; 3] = ["a", "b", "c"];

fn arb_selector() -> impl Strategy<Value = LabelSelector> {
    prop_oneof![
        Just(selector(&[])),
        (0..3usize).prop_map(|v| selector(&[("app", VALUES[v])])),
        (0..3usize, any::<bool>()).prop_map(|(v, not)| LabelSelector {
            match_labels: Default::default(),
            match_expressions: vec![Requirement {
                key: "app".into(),
                operator: if not { Operator::NotIn } else { Operator::In },
                values: vec![VALUES[v].into()],
            }],
        }),
        any::<bool>().prop_map(|exists| LabelSelector {
            match_labels: Default::default(),
            match_expressions: vec![Requirement {
                key: "tier".into(),
                operator: if exists {
                    Operator::Exists
                } else {
                    Operator::DoesNotExist
                },
                values: vec![]
            }],
        }),
    ]
}

fn arb_peer() -> impl Strategy<Value = Peer> {
    prop_oneof![
        (
            proptest::option::of(arb_selector()),
            proptest::option::of(arb_selector())
        )
            .prop_filter("a pod peer has a selector", |(p, n)| p.is_some()
                || n.is_some())
            .prop_map(|(p, n)| pods_peer(p, n)),
        (0..4u8).prop_map(|i| ip_block(&format!("10.0.{i}.0/24"), &[])),
        Just(ip_block("10.0.0.0/16", &["10.0.1.0/24"])),
    ]
}

fn arb_port() -> impl Strategy<Value = PolicyPort> {
    prop_oneof![
        (80u16..83).prop_map(tcp),
        Just(named(Protocol::Tcp, "http")),
        Just(PolicyPort {
            protocol: Protocol::Udp,
            port: None,
            end_port: None
        }),
        Just(PolicyPort {
            protocol: Protocol::Tcp,
            port: Some(PortRef::Number(80)),
            end_port: Some(81)
        }),
    ]
}

fn arb_rule() -> impl Strategy<Value = PolicyRule> {
    (
        proptest::collection::vec(arb_peer(), 0..3),
        proptest::collection::vec(arb_port(), 0..2),
    )
        .prop_map(|(peers, ports)| rule(peers, ports))
}

fn arb_rules() -> impl Strategy<Value = Option<Vec<PolicyRule>>> {
    proptest::option::of(proptest::collection::vec(arb_rule(), 0..3))
}

fn arb_policy(index: usize) -> impl Strategy<Value = Policy> {
    (
        0..2usize,
        arb_selector(),
        arb_rules(),
        arb_rules(),
        0..3usize,
        any::<bool>(),
    )
        .prop_map(move |(ns, sel, ingress, egress, kind, monitor)| {
            let kind = [
                PolicyKind::NetworkPolicy,
                PolicyKind::DanmNetworkPolicy,
                PolicyKind::MultiNetworkPolicy,
            ][kind];
            let mut p = policy(
                kind,
                NAMESPACES[ns],
                &format!("p{index}"),
                sel,
                ingress,
                egress,
            );
            if kind == PolicyKind::MultiNetworkPolicy {
                p.scope = PolicyScope::Networks(vec![NetworkId::nad("x", "net1")]);
            }
            if monitor {
                p.mode = Mode::Monitor;
            }
            p
        })
}

fn arb_pods() -> impl Strategy<Value = Vec<Pod>> {
    proptest::collection::vec(
        (
            0..2usize,
            0..3usize,
            any::<bool>(),
            any::<bool>(),
            80u16..83,
        ),
        2..6,
    )
    .prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (ns, app, tier, net1, http))| {
                let mut l = vec![("app", VALUES[app])];
                if tier {
                    l.push(("tier", "front"));
                }
                let ip = format!("10.0.{}.{}", i % 3, i + 1);
                let mut p = pod(NAMESPACES[ns], &format!("pod{i}"), &l, &[&ip]);
                if net1 {
                    p = with_interface(
                        p,
                        "net1",
                        NetworkId::nad("x", "net1"),
                        &[&format!("192.168.0.{}", i + 1)],
                    );
                }
                with_port(p, "http", http, Protocol::Tcp)
            })
            .collect()
    })
}

fn arb_policies() -> impl Strategy<Value = Vec<Policy>> {
    (0..4usize).prop_flat_map(|n| (0..n).map(arb_policy).collect::<Vec<_>>())
}

type Matrix = BTreeMap<(String, String, String, u16, bool), (bool, bool)>;

/// Every verdict of the cluster: (from, to, network, port, udp) → (enforced, staged).
fn matrix(engine: &mut Engine) -> Matrix {
    let all = engine.all_pod_rules();
    let mut out = Matrix::new();
    for (fk, fr) in &all {
        for (tk, tr) in &all {
            for fi in &fr.interfaces {
                let Some(ti) = tr.interfaces.iter().find(|t| t.network == fi.network) else {
                    continue;
                };
                for port in [80u16, 81, 82] {
                    for udp in [false, true] {
                        let proto = if udp { Protocol::Udp } else { Protocol::Tcp };
                        let v = flow_verdict(
                            FlowEnd {
                                pod: fk,
                                interface: fi,
                                ip: fi.ips[0],
                            },
                            FlowEnd {
                                pod: tk,
                                interface: ti,
                                ip: ti.ips[0],
                            },
                            proto,
                            port,
                        );
                        out.insert(
                            (
                                fk.to_string(),
                                tk.to_string(),
                                fi.network.to_string(),
                                port,
                                udp,
                            ),
                            (v.allowed, v.staged_allowed),
                        );
                    }
                }
            }
        }
    }
    out
}

fn build(pods: &[Pod], policies: &[Policy]) -> Engine {
    let mut e = Engine::new(EngineOptions::default());
    e.set_namespace(namespace("x", &[("team", "a")]));
    e.set_namespace(namespace("y", &[("team", "b")]));
    for p in pods {
        e.set_pod(p.clone());
    }
    for p in policies {
        e.set_policy(p.clone());
    }
    e
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn adding_an_allow_rule_never_denies_more(pods in arb_pods(), policies in arb_policies(), extra in arb_rule(), which in 0..4usize, egress in any::<bool>()) {
        prop_assume!(!policies.is_empty());
        let before = matrix(&mut build(&pods, &policies));
        let mut widened = policies.clone();
        let target = &mut widened[which % policies.len()];
        let rules = if egress { &mut target.egress } else { &mut target.ingress };
        if let Some(rules) = rules {
            rules.push(extra);
        }
        let after = matrix(&mut build(&pods, &widened));
        for (k, (a, s)) in &before {
            let (a2, s2) = after[k];
            prop_assert!(!*a || a2, "enforced allow became deny at {:?}", k);
            prop_assert!(!*s || s2, "staged allow became deny at {:?}", k);
        }
    }

    #[test]
    fn selects_any_pod_agrees_with_targets(pods in arb_pods(), policies in arb_policies()) {
        let engine = build(&pods, &policies);
        for policy in &policies {
            prop_assert_eq!(engine.selects_any_pod(policy), !engine.targets(policy).is_empty(), "{}", policy.key);
        }
    }

    #[test]
    fn a_policy_selecting_no_pod_changes_nothing(pods in arb_pods(), policies in arb_policies(), extra in arb_policy(9)) {
        let before = matrix(&mut build(&pods, &policies));
        let mut none = extra;
        none.pod_selector = selector(&[("app", "nobody")]);
        let mut more = policies.clone();
        more.push(none);
        prop_assert_eq!(before, matrix(&mut build(&pods, &more)));
    }

    #[test]
    fn verdicts_do_not_depend_on_object_order(pods in arb_pods(), policies in arb_policies()) {
        let forward = matrix(&mut build(&pods, &policies));
        let mut rp = pods.clone();
        rp.reverse();
        let mut rpol = policies.clone();
        rpol.reverse();
        prop_assert_eq!(forward, matrix(&mut build(&rp, &rpol)));
    }

    #[test]
    fn monitored_policies_never_change_enforcement(pods in arb_pods(), policies in arb_policies()) {
        let enforced_only: Vec<Policy> = policies.iter().filter(|p| p.mode == Mode::Enforce).cloned().collect();
        let with = matrix(&mut build(&pods, &policies));
        let without = matrix(&mut build(&pods, &enforced_only));
        for (k, (a, _)) in &with {
            prop_assert_eq!(*a, without[k].0, "at {:?}", k);
        }
    }

    #[test]
    fn incremental_equals_fresh(pods in arb_pods(), policies in arb_policies(), relabel in 0..6usize, app in 0..3usize, change in 0..4usize, drop_policy in any::<bool>()) {
        let mut e = build(&pods, &policies);
        let mut cached: BTreeMap<PodKey, PodRules> = e.all_pod_rules();
        // Change one pod's labels (a value set or a label gone, on a key the selectors read
        // through every operator), maybe remove a policy, then recompute only the dirty pods.
        let mut pods2 = pods.clone();
        let i = relabel % pods2.len();
        let labels = &mut pods2[i].labels;
        match change {
            0 => drop(labels.insert("app".into(), VALUES[app].into())),
            1 => drop(labels.remove("app")),
            2 => drop(labels.insert("tier".into(), VALUES[app].into())),
            _ => drop(labels.remove("tier")),
        }
        e.set_pod(pods2[i].clone());
        let mut policies2 = policies.clone();
        if drop_policy && !policies2.is_empty() {
            let gone = policies2.remove(0);
            e.remove_policy(&gone.reference());
        }
        for key in e.take_dirty() {
            match e.pod_rules(&key) {
                Some(r) => { cached.insert(key, r); }
                None => { cached.remove(&key); }
            }
        }
        let fresh = build(&pods2, &policies2).all_pod_rules();
        prop_assert_eq!(cached, fresh);
    }
}

/// Labels from a small universe, so that selectors and pods collide often.
fn arb_labels() -> impl Strategy<Value = Labels> {
    proptest::collection::btree_map(
        prop_oneof![Just("app"), Just("tier"), Just("zone")].prop_map(str::to_string),
        (0..3usize).prop_map(|v| VALUES[v].to_string()),
        0..3,
    )
    .prop_map(|map| map.into_iter().collect())
}

/// A selector mixing every operator, on the keys of [`arb_labels`].
fn arb_index_selector() -> impl Strategy<Value = LabelSelector> {
    let key = prop_oneof![Just("app"), Just("tier"), Just("zone")].prop_map(str::to_string);
    let values = proptest::collection::vec((0..3usize).prop_map(|v| VALUES[v].to_string()), 0..3);
    let operator = prop_oneof![
        Just(Operator::In),
        Just(Operator::NotIn),
        Just(Operator::Exists),
        Just(Operator::DoesNotExist)
    ];
    (
        arb_labels(),
        proptest::collection::vec((key, operator, values), 0..3),
    )
        .prop_map(|(match_labels, exprs)| LabelSelector {
            match_labels,
            match_expressions: exprs
                .into_iter()
                .map(|(key, operator, values)| Requirement {
                    key,
                    operator,
                    values,
                })
                .collect(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Issue 10: the label index finds exactly the pods brute-force selection finds, after
    /// pods were added, relabelled and removed in any order.
    #[test]
    fn indexed_selection_equals_brute_force(
        pods in proptest::collection::vec((0..2usize, arb_labels()), 0..24),
        relabels in proptest::collection::vec((0..24usize, arb_labels()), 0..8),
        removals in proptest::collection::vec(0..24usize, 0..6),
        selectors in proptest::collection::vec(arb_index_selector(), 1..8),
    ) {
        use netwarden_engine::labelindex::{Candidates, LabelIndex};
        let mut index = LabelIndex::default();
        let mut live: BTreeMap<PodKey, Labels> = BTreeMap::new();
        for (i, (ns, labels)) in pods.iter().enumerate() {
            let key = PodKey::new(NAMESPACES[*ns], format!("p{i}"));
            index.insert(&key.namespace, &key, labels);
            live.insert(key, labels.clone());
        }
        let keys: Vec<PodKey> = live.keys().cloned().collect();
        for (i, labels) in &relabels {
            if let Some(key) = keys.get(*i) {
                if let Some(old) = live.get(key).cloned() {
                    index.remove(&key.namespace, key, &old);
                    index.insert(&key.namespace, key, labels);
                    live.insert(key.clone(), labels.clone());
                }
            }
        }
        for i in &removals {
            if let Some(key) = keys.get(*i) {
                if let Some(old) = live.remove(key) {
                    index.remove(&key.namespace, key, &old);
                }
            }
        }
        for selector in &selectors {
            for ns in NAMESPACES {
                let brute: Vec<&PodKey> = live
                    .iter()
                    .filter(|(k, labels)| k.namespace == ns && selector.matches(labels))
                    .map(|(k, _)| k)
                    .collect();
                let indexed: Vec<&PodKey> = match index.candidates(ns, selector) {
                    Candidates::Among(list) => list
                        .into_iter()
                        .filter(|k| selector.matches(&live[*k]))
                        .collect(),
                    Candidates::Everyone => live
                        .iter()
                        .filter(|(k, labels)| k.namespace == ns && selector.matches(labels))
                        .map(|(k, _)| k)
                        .collect(),
                };
                prop_assert_eq!(&indexed, &brute, "{:?} in {}", selector, ns);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Issue 10: the selector index (selectors by the pods they can select) names every
    /// selector that selects a pod, whatever its namespace part and pod part, after selectors
    /// were filed and some unfiled again.
    #[test]
    fn selector_index_names_every_selector_that_selects(
        filed in proptest::collection::vec(
            (0..2usize, proptest::option::of(arb_index_selector()), proptest::option::of(arb_index_selector())),
            1..10,
        ),
        unfiled in proptest::collection::vec(0..10usize, 0..4),
        pods in proptest::collection::vec((0..2usize, arb_labels(), arb_labels()), 1..12),
    ) {
        use netwarden_engine::selectorindex::{Reach, SelectorIndex};
        type Filed = (usize, Option<LabelSelector>, Option<LabelSelector>);
        fn reach(filed: &Filed) -> Reach<'_> {
            Reach {
                namespace: NAMESPACES[filed.0],
                namespace_selector: filed.1.as_ref(),
                pod_selector: filed.2.as_ref(),
            }
        }
        let mut index: SelectorIndex<usize> = SelectorIndex::default();
        for (item, selector) in filed.iter().enumerate() {
            index.insert(&item, reach(selector));
        }
        let mut live: Vec<usize> = (0..filed.len()).collect();
        for item in &unfiled {
            if let Some(at) = live.iter().position(|x| x == item) {
                index.remove(item, reach(&filed[*item]));
                live.remove(at);
            }
        }
        // Each pod: its namespace, that namespace's labels (any: the index must not care
        // which namespaces exist), and its own labels.
        for (ns, namespace_labels, pod_labels) in &pods {
            let namespace = NAMESPACES[*ns];
            let candidates = index.candidates(namespace, namespace_labels, pod_labels);
            for item in &live {
                let (own, namespace_selector, pod_selector) = &filed[*item];
                let namespace_ok = match namespace_selector {
                    Some(sel) => sel.matches(namespace_labels),
                    None => NAMESPACES[*own] == namespace,
                };
                let selects = namespace_ok
                    && pod_selector.as_ref().is_none_or(|sel| sel.matches(pod_labels));
                if selects {
                    prop_assert!(candidates.contains(&item), "{:?} selects {:?} in {}", filed[*item], pod_labels, namespace);
                }
            }
            for item in &candidates {
                prop_assert!(live.contains(item), "unfiled {} still named", item);
            }
        }
    }
}
