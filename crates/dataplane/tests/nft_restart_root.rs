//! A restarted agent meets big tables (issue 20, defect 6): netns already hold netwarden's
//! table, with peer sets of 20,000 elements, from a previous process. A fresh dataplane must
//! converge on them with one cheap reading (netlink dumps, names only) and one transaction per netns, apply a change, and
//! never make libnftables fetch the sets' elements: before the fix each netns cost two listings
//! that did (`list tables`, `list table`, about half a second of CPU each at this size, eight
//! at once), and a restart at 20,000 pods never finished its first sync.
//!
//! Asserted on counts of libnftables calls (process-wide, hence one test in this binary), not
//! on time: the agent benchmark measures time (`crates/netwarden/benches/agent.rs`, restart).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use netwarden_dataplane::libnft::call_counts;
use netwarden_dataplane::netns::exec_in;
use netwarden_dataplane::nft_netlink::readings;
use netwarden_dataplane::{ApplyOutcome, Dataplane, NftDataplane};
use netwarden_engine::{AddrSet, PodRules, PolicyKind};
use netwarden_render::RenderOptions;
use netwarden_testing::rules::tcp_ingress_rules;
use netwarden_testing::{root_or_skip, Namespaces};

/// Pod netns of the test; peers per set.
const NETNS: usize = 6;
const PEERS: u32 = 20_000;

/// `PEERS` addresses two apart (no two merge into a range), shifted by `shift`.
fn peers(shift: u32) -> AddrSet {
    let base = u32::from(Ipv4Addr::new(10, 200, 0, 0)) + shift;
    AddrSet::from_addrs((0..PEERS).map(|i| IpAddr::V4(Ipv4Addr::from(base + 2 * i))))
}

/// Ingress on `nwv0` allowing TCP `port` from `peers`.
fn rules(port: u16, peers: &AddrSet) -> PodRules {
    tcp_ingress_rules(
        PolicyKind::NetworkPolicy,
        &["nwv0"],
        "10.231.79.1",
        peers.clone(),
        &[port],
    )
}

fn listed(netns: &Path) -> String {
    let out = exec_in(netns, "nft", &["list", "table", "inet", "netwarden"], None).unwrap();
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_fresh_dataplane_adopts_big_tables_cheaply_and_applies_a_change() {
    if !root_or_skip() {
        return;
    }
    let mut guard = Namespaces::new("nwrst");
    let netns: Vec<PathBuf> = (0..NETNS).map(|i| guard.create(&format!("p{i}"))).collect();
    let big = peers(0);

    // The previous process: every netns programmed, then the process is gone (its contexts and
    // bookkeeping with it; the kernel keeps the tables).
    {
        let mut before = NftDataplane::new(RenderOptions::default());
        let table = before.render(&rules(8080, &big)).unwrap();
        let batch: Vec<_> = netns.iter().map(|n| (n.clone(), table.clone())).collect();
        for r in before.apply_many(&batch) {
            assert_eq!(r.unwrap(), ApplyOutcome::Applied);
        }
    }
    for n in &netns {
        assert!(listed(n).contains("dport 8080"));
    }

    // The restarted one, with a change made meanwhile (the allowed port), same peers.
    let mut after = NftDataplane::new(RenderOptions::default());
    let table = after.render(&rules(8081, &big)).unwrap();
    let batch: Vec<_> = netns.iter().map(|n| (n.clone(), table.clone())).collect();
    let start = call_counts();
    let read_before = readings();
    for r in after.apply_many(&batch) {
        assert_eq!(r.unwrap(), ApplyOutcome::Applied);
    }
    let spent = call_counts();
    let n = NETNS as u64;
    assert_eq!(
        readings() - read_before,
        n,
        "one reading (netlink dumps: names only) per netns"
    );
    assert_eq!(
        spent.element_listings - start.element_listings,
        0,
        "no listing may fetch the big sets' elements: {start:?} -> {spent:?}"
    );
    assert_eq!(
        spent.listings - start.listings,
        0,
        "no libnftables listing: {start:?} -> {spent:?}"
    );
    assert_eq!(
        spent.transactions - start.transactions,
        n,
        "the peer set is adopted, not sent again: one transaction per netns: {start:?} -> \
         {spent:?}"
    );
    for n in &netns {
        let text = listed(n);
        assert!(
            text.contains("dport 8081") && !text.contains("dport 8080"),
            "{text:.2000}"
        );
        // The set adopted is the one in force, whole.
        assert!(
            text.contains("10.200.156.62"),
            "an element of the set is kept"
        );
    }

    // Next change, peers too: the state is known now, no listing at all; new sets first, then
    // the rules (two transactions per netns).
    let moved = peers(1);
    let table = after.render(&rules(8081, &moved)).unwrap();
    let batch: Vec<_> = netns.iter().map(|n| (n.clone(), table.clone())).collect();
    let start = call_counts();
    for r in after.apply_many(&batch) {
        assert_eq!(r.unwrap(), ApplyOutcome::Applied);
    }
    let spent = call_counts();
    assert_eq!(spent.listings - start.listings, 0, "{start:?} -> {spent:?}");
    assert_eq!(
        spent.transactions - start.transactions,
        2 * n,
        "{start:?} -> {spent:?}"
    );
    for n in &netns {
        assert!(
            listed(n).contains("10.200.156.63"),
            "the new peers are in force"
        );
    }
    // The evidence counters are read without fetching set elements either.
    let start = call_counts();
    after.read_counters(&netns[0]).unwrap();
    assert_eq!(call_counts().listings, start.listings);
}
