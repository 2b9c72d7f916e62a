//! The nft comparison trusts the ruleset generation between listings: a netns where nothing
//! was committed since its last clean comparison compares equal without a listing (the rule
//! listing is a child `nft` process, see `nft_netlink`), at most `LIST_EVERY` (6) times in a
//! row; any commit of someone else's moves the generation and the next comparison lists. An
//! apply of ours on a netns compared clean, with nothing else committed in between, vouches
//! for the generation it leaves. Asserted on the count of listing processes (process-wide: one test in
//! this binary).

use netwarden_dataplane::netns::exec_in;
use netwarden_dataplane::nft_netlink::commands;
use netwarden_dataplane::tamper::VerifyScope;
use netwarden_dataplane::{Dataplane, NftDataplane};
use netwarden_engine::{AddrSet, PodRules, PolicyKind};
use netwarden_render::RenderOptions;
use netwarden_testing::rules::tcp_ingress_rules;
use netwarden_testing::{root_or_skip, Namespaces};

/// Ingress on `nwv0` allowing TCP `port` from one peer.
fn rules(port: u16) -> PodRules {
    let peer = AddrSet::from_addrs(["10.231.80.2".parse().unwrap()]);
    tcp_ingress_rules(
        PolicyKind::NetworkPolicy,
        &["nwv0"],
        "10.231.80.1",
        peer,
        &[port],
    )
}

#[test]
fn an_unchanged_generation_compares_equal_without_listing() {
    if !root_or_skip() {
        return;
    }
    let mut guard = Namespaces::new("nwgen");
    let ns = guard.create("p");
    let mut dp = NftDataplane::new(RenderOptions::default());
    let table = dp.render(&rules(8080)).unwrap();
    dp.apply(&ns, &table).unwrap();
    let all = VerifyScope::all();

    // The first comparison after the apply lists; the next six do not; the seventh does.
    let start = commands();
    assert_eq!(dp.verify(&ns, &all).unwrap(), vec![]);
    assert_eq!(commands() - start, 1, "the first comparison lists");
    for _ in 0..6 {
        assert_eq!(dp.verify(&ns, &all).unwrap(), vec![]);
    }
    assert_eq!(
        commands() - start,
        1,
        "an unchanged generation lists nothing"
    );
    assert_eq!(dp.verify(&ns, &all).unwrap(), vec![]);
    assert_eq!(commands() - start, 2, "listed again after six");

    // A commit of someone else's that changes nothing of ours moves the generation: listed,
    // equal. A tamper: listed, seen.
    let nft = |script: &str| {
        let out = exec_in(&ns, "sh", &["-c", script], None).unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    nft("nft add table inet pods_own");
    assert_eq!(dp.verify(&ns, &all).unwrap(), vec![]);
    assert_eq!(commands() - start, 3);
    nft("nft flush table inet netwarden");
    assert!(!dp.verify(&ns, &all).unwrap().is_empty());
    assert_eq!(commands() - start, 4);
    // Still different, listed each time until repaired.
    assert!(!dp.verify(&ns, &all).unwrap().is_empty());
    assert_eq!(commands() - start, 5);
    dp.repair(&ns).unwrap();
    assert_eq!(dp.verify(&ns, &all).unwrap(), vec![]);
    assert_eq!(dp.verify(&ns, &all).unwrap(), vec![]);
    assert_eq!(
        commands() - start,
        6,
        "listed after the repair, then trusted"
    );

    // An apply of ours on a netns compared clean, with no commit of anyone else's between:
    // the kernel holds what was compared plus the apply, so the notifications of its own
    // commits need no listing.
    let changed = dp.render(&rules(8081)).unwrap();
    dp.apply(&ns, &changed).unwrap();
    assert_eq!(dp.verify(&ns, &all).unwrap(), vec![]);
    assert_eq!(commands() - start, 6, "our own apply vouched for");
    // Someone else's commit before our apply: not vouched, listed.
    nft("nft add table inet pods_other");
    dp.apply(&ns, &table).unwrap();
    assert_eq!(dp.verify(&ns, &all).unwrap(), vec![]);
    assert_eq!(commands() - start, 7, "another commit came first: listed");
    // A tamper between a clean comparison and our apply: not vouched for either, so the
    // comparison lists, and sees what the apply left of it.
    assert_eq!(dp.verify(&ns, &all).unwrap(), vec![]);
    nft("nft add table inet pods_third");
    nft("nft add chain inet netwarden pods_chain");
    dp.apply(&ns, &changed).unwrap();
    assert!(!dp.verify(&ns, &all).unwrap().is_empty());
    assert_eq!(commands() - start, 8);
}
