//! Learn mode in the engine model: which pods learn (their own annotation, their namespace's, a
//! `--learn` selector), that a change of any of these names exactly the pods concerned, and
//! that learning changes nothing else in a pod's rules.

use netwarden_engine::testing::{namespace, pod};
use netwarden_engine::{Engine, EngineOptions, LearnSelector, PodKey};

fn key(ns: &str, name: &str) -> PodKey {
    PodKey::new(ns, name)
}

fn engine(options: EngineOptions) -> Engine {
    let mut e = Engine::new(options);
    e.set_namespace(namespace("a", &[]));
    e.set_namespace(namespace("b", &[]));
    e.set_pod(pod("a", "p1", &[], &["10.0.0.1"]));
    e.set_pod(pod("a", "p2", &[], &["10.0.0.2"]));
    e.set_pod(pod("b", "q1", &[], &["10.0.1.1"]));
    e
}

fn learns(e: &mut Engine, ns: &str, name: &str) -> bool {
    e.pod_rules(&key(ns, name)).expect("pod").learn
}

#[test]
fn selectors_parse_and_match() {
    let one: LearnSelector = "a/p1".parse().unwrap();
    let all: LearnSelector = "a/*".parse().unwrap();
    assert!(one.matches(&key("a", "p1")) && !one.matches(&key("a", "p2")));
    assert!(all.matches(&key("a", "p2")) && !all.matches(&key("b", "p2")));
    assert_eq!(all.to_string(), "a/*");
    for bad in ["a", "/p", "a/", "*/p", "a/p*", "a/p/q", "*"] {
        let err = bad.parse::<LearnSelector>().unwrap_err();
        assert!(
            err.contains("--learn") && err.contains("NS/POD"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn pod_namespace_and_selector_each_turn_learning_on() {
    let mut e = engine(EngineOptions::default());
    assert!(!learns(&mut e, "a", "p1"));
    let before = e.pod_rules(&key("a", "p1")).unwrap();

    // The pod's own annotation.
    let mut p1 = pod("a", "p1", &[], &["10.0.0.1"]);
    p1.learn = true;
    e.take_dirty();
    e.set_pod(p1);
    assert!(e.take_dirty().contains(&key("a", "p1")));
    let after = e.pod_rules(&key("a", "p1")).unwrap();
    assert!(after.learn);
    // Nothing but the switch changed.
    assert_eq!(
        netwarden_engine::PodRules {
            learn: false,
            ..after
        },
        before
    );
    assert!(!learns(&mut e, "a", "p2"));

    // The namespace's: every pod of it is named dirty, and no other.
    e.take_dirty();
    let mut ns_b = namespace("b", &[]);
    ns_b.learn = true;
    e.set_namespace(ns_b);
    let dirty = e.take_dirty();
    assert_eq!(dirty.into_iter().collect::<Vec<_>>(), [key("b", "q1")]);
    assert!(learns(&mut e, "b", "q1"));
    e.set_namespace(namespace("b", &[]));
    assert!(e.take_dirty().contains(&key("b", "q1")));
    assert!(!learns(&mut e, "b", "q1"));

    // A selector.
    let mut e = engine(EngineOptions {
        learn: vec!["a/*".parse().unwrap()],
        ..EngineOptions::default()
    });
    assert!(learns(&mut e, "a", "p1") && learns(&mut e, "a", "p2"));
    assert!(!learns(&mut e, "b", "q1"));
}
