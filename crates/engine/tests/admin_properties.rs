//! Properties of the admin policy tiers (SPEC 8) over the fuzzer's random clusters
//! (`netwarden_engine::fuzzing::Scenario`: namespaces, pods on several networks, every kind of
//! policy, Services, admin policies of the three kinds, Nodes, and a history of changes; the
//! objects at the end of the history are used), each comparing one cluster under two sets of
//! admin policies, verdict by verdict (every pod-to-pod flow and every flow between a pod and
//! an outside address, for every probed port, in both views):
//! - an Admin tier whose rules all Pass decides nothing: with every Admin tier rule turned
//!   into a Pass (and no `replaces` on its policies, which acts on another policy rather than
//!   through rules), verdicts equal those without the Admin tier (the Baseline tier kept);
//! - monitoring an admin policy never changes enforcement: with one admin policy monitored,
//!   the enforced verdicts equal those without it (SPEC 4, "whatever the mix");
//! - the staged view previews enforcement: with every policy enforced but one admin policy
//!   monitored (replacing nothing), the staged verdicts equal the enforced verdicts with that
//!   policy enforced.
//!
//! Incremental equals fresh with admin policies and Nodes is `tests/fuzz_engine.rs`.

use std::collections::BTreeMap;

use netwarden_engine::admin::{AdminAction, Tier};
use netwarden_engine::fuzzing::{Scenario, State};
use netwarden_engine::Mode;
use proptest::prelude::*;

/// Random inputs long enough to reach the admin policies (decoded after the rest).
fn inputs() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 300..1000)
}

type Verdicts = BTreeMap<String, (bool, bool)>;

/// The verdicts of `state`, both views.
fn verdicts(scenario: &Scenario, state: &State) -> Verdicts {
    state.verdicts(&state.rules(&scenario.options))
}

/// The flows whose verdicts differ between `a` in view `a_staged` and `b` in view
/// `b_staged`.
fn differing(a: &Verdicts, a_staged: bool, b: &Verdicts, b_staged: bool) -> Vec<String> {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "the same flows"
    );
    let view = |(enforced, staged): (bool, bool), in_staged| {
        if in_staged {
            staged
        } else {
            enforced
        }
    };
    a.iter()
        .filter(|(flow, v)| view(**v, a_staged) != view(b[*flow], b_staged))
        .map(|(flow, v)| {
            format!(
                "{flow}: {} vs {}",
                view(*v, a_staged),
                view(b[flow], b_staged)
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn an_admin_tier_that_only_passes_changes_no_verdict(data in inputs()) {
        let scenario = Scenario::from_bytes(&data);
        let state = scenario.final_state();
        let mut passing = state.clone();
        for policy in passing.admin_policies.values_mut() {
            if policy.tier == Tier::Admin {
                for rule in policy.ingress.iter_mut().chain(policy.egress.iter_mut()) {
                    rule.action = AdminAction::Pass;
                }
                // Not a rule: a monitored policy replacing another (a Baseline one of its
                // kind, say) takes that one out of the staged view whatever its rules say.
                policy.replaces = None;
            }
        }
        let mut without = state;
        without.admin_policies.retain(|_, p| p.tier != Tier::Admin);
        let (with_pass, without) = (verdicts(&scenario, &passing), verdicts(&scenario, &without));
        for staged in [false, true] {
            let diff = differing(&with_pass, staged, &without, staged);
            prop_assert!(diff.is_empty(), "staged: {staged}: {diff:#?}\nobjects: {passing:#?}");
        }
    }

    #[test]
    fn monitoring_an_admin_policy_never_changes_enforcement(data in inputs()) {
        let scenario = Scenario::from_bytes(&data);
        let state = scenario.final_state();
        for reference in state.admin_policies.keys() {
            let mut monitored = state.clone();
            monitored
                .admin_policies
                .get_mut(reference)
                .expect("a key of the map")
                .mode = Mode::Monitor;
            let mut absent = state.clone();
            absent.admin_policies.remove(reference);
            let diff = differing(
                &verdicts(&scenario, &monitored),
                false,
                &verdicts(&scenario, &absent),
                false,
            );
            prop_assert!(diff.is_empty(), "{reference} monitored: {diff:#?}\nobjects: {monitored:#?}");
        }
    }

    #[test]
    fn the_staged_view_of_a_monitored_admin_policy_is_its_enforcement(data in inputs()) {
        let scenario = Scenario::from_bytes(&data);
        let mut enforced = scenario.final_state();
        for policy in enforced.policies.values_mut() {
            policy.mode = Mode::Enforce;
            policy.replaces = None;
        }
        for policy in enforced.admin_policies.values_mut() {
            policy.mode = Mode::Enforce;
            policy.replaces = None;
        }
        let all_enforced = verdicts(&scenario, &enforced);
        for reference in enforced.admin_policies.keys() {
            let mut monitored = enforced.clone();
            monitored
                .admin_policies
                .get_mut(reference)
                .expect("a key of the map")
                .mode = Mode::Monitor;
            let diff = differing(&verdicts(&scenario, &monitored), true, &all_enforced, false);
            prop_assert!(diff.is_empty(), "{reference}: {diff:#?}\nobjects: {monitored:#?}");
        }
    }
}
