//! Builders for hand-made `PodRules` shared by the golden and tracer tests, and the golden
//! scenarios. (The throwaway netns for `nft -c` is `netwarden_testing::ScratchNetns`.)
#![allow(dead_code)] // each test binary uses a subset

use std::net::IpAddr;
use std::sync::Arc;

use netwarden_engine::{
    AddrSet, AdminAction, AdminKind, AdminRef, AllowRule, Clause, Direction, DirectionRules,
    ImplicitDns, InterfaceRules, IpBlock, Isolation, Mode, NetworkId, ObjectKey, PeerMatch,
    PodRules, PolicyKind, PolicyRef, PortMatch, PortRange, Protocol, RuleOrigin, Tier, TierOrigin,
    TierRule, TierRules,
};

pub fn pref(name: &str) -> PolicyRef {
    PolicyRef {
        kind: PolicyKind::NetworkPolicy,
        key: ObjectKey::new("ns", name),
    }
}

pub fn origin(policy: &str, direction: Direction, index: usize, mode: Mode) -> RuleOrigin {
    RuleOrigin {
        policy: pref(policy),
        direction,
        index,
        mode,
    }
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn addrs(list: &[&str]) -> PeerMatch {
    PeerMatch::Addrs(Arc::new(AddrSet::from_addrs(list.iter().map(|a| ip(a)))))
}

pub fn block(cidr: &str, except: &[&str]) -> PeerMatch {
    PeerMatch::Addrs(Arc::new(AddrSet::from_ip_block(&IpBlock {
        cidr: cidr.parse().unwrap(),
        except: except.iter().map(|e| e.parse().unwrap()).collect(),
    })))
}

pub fn ports(list: &[(Protocol, Option<(u16, u16)>)]) -> PortMatch {
    PortMatch::Only(
        list.iter()
            .map(|&(protocol, ports)| PortRange { protocol, ports })
            .collect(),
    )
}

pub fn tcp(p: u16) -> (Protocol, Option<(u16, u16)>) {
    (Protocol::Tcp, Some((p, p)))
}

pub fn clause(peers: PeerMatch, ports: PortMatch) -> Clause {
    Clause { peers, ports }
}

pub fn rule(origin: RuleOrigin, clauses: Vec<Clause>) -> AllowRule {
    AllowRule { origin, clauses }
}

/// Rule `index` of admin policy `policy` (a ClusterNetworkPolicy of `tier`, priority 10).
pub fn tier_rule(
    policy: &str,
    tier: Tier,
    direction: Direction,
    index: usize,
    action: AdminAction,
    clauses: Vec<Clause>,
) -> TierRule {
    TierRule {
        origin: TierOrigin {
            policy: AdminRef {
                kind: AdminKind::ClusterNetworkPolicy,
                name: policy.into(),
            },
            tier,
            priority: 10,
            direction,
            index,
            name: None,
            mode: Mode::Enforce,
        },
        action,
        clauses,
    }
}

/// A tier whose views are `enforced` and `staged`.
pub fn tiers(enforced: Vec<TierRule>, staged: Vec<TierRule>) -> TierRules {
    TierRules {
        enforced: enforced.into(),
        staged: staged.into(),
    }
}

/// A direction isolated by enforced policies only.
pub fn enforced(policies: &[&str], rules: Vec<AllowRule>) -> DirectionRules {
    let iso = Isolation::Isolated(rules.into());
    DirectionRules {
        enforced: iso.clone(),
        staged: iso,
        enforced_policies: policies.iter().map(|p| pref(p)).collect(),
        monitored_policies: vec![],
        replaced_policies: vec![],
        log_denies: false,
        implicit_dns: ImplicitDns::default(),
        ..DirectionRules::open()
    }
}

/// `dr` with outgoing DNS implied in both views (a DanmNetworkPolicy isolates it, SPEC 3.1).
pub fn with_dns(mut dr: DirectionRules) -> DirectionRules {
    dr.implicit_dns = ImplicitDns {
        enforced: dr.enforced.is_isolated(),
        staged: dr.staged.is_isolated(),
    };
    dr
}

pub fn iface(
    name: &str,
    ips: &[&str],
    ingress: DirectionRules,
    egress: DirectionRules,
) -> InterfaceRules {
    InterfaceRules {
        name: name.into(),
        network: if name == "eth0" {
            NetworkId::Primary
        } else {
            NetworkId::nad("ns", name)
        },
        ips: ips.iter().map(|a| ip(a)).collect(),
        ingress,
        egress,
    }
}

pub fn pod(interfaces: Vec<InterfaceRules>) -> PodRules {
    PodRules {
        pod: ObjectKey::new("ns", "pod"),
        netns: None,
        interfaces,
        learn: false,
    }
}

/// Monitor bookkeeping for a direction: `enforced_rules` decide, `staged_rules` preview.
pub fn monitored(
    enforced_policies: &[&str],
    enforced_rules: Option<Vec<AllowRule>>,
    monitored_policies: &[&str],
    replaced: &[&str],
    staged_rules: Vec<AllowRule>,
) -> DirectionRules {
    DirectionRules {
        enforced: match enforced_rules {
            Some(r) => Isolation::Isolated(r.into()),
            None => Isolation::Open,
        },
        staged: Isolation::Isolated(staged_rules.into()),
        enforced_policies: enforced_policies.iter().map(|p| pref(p)).collect(),
        monitored_policies: monitored_policies.iter().map(|p| pref(p)).collect(),
        replaced_policies: replaced.iter().map(|p| pref(p)).collect(),
        log_denies: false,
        implicit_dns: ImplicitDns::default(),
        ..DirectionRules::open()
    }
}

use netwarden_render::RenderOptions;

use Direction::{Egress, Ingress};
use Mode::{Enforce, Monitor};

/// Every golden scenario: name, pod rules, options.
#[allow(clippy::vec_init_then_push)] // one push per scenario reads better than one huge vec![]
pub fn scenarios() -> Vec<(&'static str, PodRules, RenderOptions)> {
    let o = RenderOptions::default;
    let open = DirectionRules::open;
    let mut v = Vec::new();

    v.push((
        "open",
        pod(vec![iface("eth0", &["10.0.0.1"], open(), open())]),
        o(),
    ));

    v.push((
        "ingress_pods_ports",
        pod(vec![iface(
            "eth0",
            &["10.0.0.1"],
            enforced(
                &["allow-web"],
                vec![
                    rule(
                        origin("allow-web", Ingress, 0, Enforce),
                        vec![clause(
                            addrs(&["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.9"]),
                            ports(&[tcp(80), tcp(443)]),
                        )],
                    ),
                    // Same peers, other rule: the set is shared.
                    rule(
                        origin("allow-web", Ingress, 1, Enforce),
                        vec![clause(
                            addrs(&["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.9"]),
                            ports(&[(Protocol::Udp, Some((5353, 5353)))]),
                        )],
                    ),
                ],
            ),
            open(),
        )]),
        o(),
    ));

    v.push((
        "egress_ipblock_except",
        pod(vec![iface(
            "eth0",
            &["10.0.0.1"],
            open(),
            enforced(
                &["egress"],
                vec![
                    rule(
                        origin("egress", Egress, 0, Enforce),
                        vec![clause(
                            block("10.0.0.0/8", &["10.1.0.0/16", "10.0.0.5/32"]),
                            ports(&[tcp(443)]),
                        )],
                    ),
                    rule(
                        origin("egress", Egress, 1, Enforce),
                        vec![clause(block("192.168.1.0/24", &[]), PortMatch::Any)],
                    ),
                ],
            ),
        )]),
        o(),
    ));

    // `port: http` resolved per destination pod: 8080 on one, 9090 on the other (as the engine
    // emits it: one clause per resolution).
    v.push((
        "named_port",
        pod(vec![iface(
            "eth0",
            &["10.0.0.1"],
            open(),
            enforced(
                &["to-http"],
                vec![rule(
                    origin("to-http", Egress, 0, Enforce),
                    vec![
                        clause(addrs(&["10.0.0.5"]), ports(&[tcp(8080)])),
                        clause(addrs(&["10.0.0.6"]), ports(&[tcp(9090)])),
                    ],
                )],
            ),
        )]),
        o(),
    ));

    v.push((
        "dual_stack",
        pod(vec![iface(
            "eth0",
            &["10.0.0.1", "fd00::1"],
            enforced(
                &["ds"],
                vec![
                    rule(
                        origin("ds", Ingress, 0, Enforce),
                        vec![clause(
                            addrs(&["10.0.0.2", "fd00::2", "fd00::3"]),
                            ports(&[tcp(80)]),
                        )],
                    ),
                    rule(
                        origin("ds", Ingress, 1, Enforce),
                        vec![clause(
                            block("fd00:1::/64", &["fd00:1::/120"]),
                            PortMatch::Any,
                        )],
                    ),
                ],
            ),
            open(),
        )]),
        o(),
    ));

    v.push((
        "port_ranges",
        pod(vec![iface(
            "eth0",
            &["10.0.0.1"],
            enforced(
                &["ranges"],
                vec![rule(
                    origin("ranges", Ingress, 0, Enforce),
                    vec![clause(
                        PeerMatch::Any,
                        ports(&[
                            (Protocol::Tcp, Some((1000, 2000))),
                            (Protocol::Tcp, Some((1500, 2500))),
                            tcp(22),
                            (Protocol::Udp, Some((53, 53))),
                            (Protocol::Udp, Some((54, 54))),
                        ]),
                    )],
                )],
            ),
            open(),
        )]),
        o(),
    ));

    v.push((
        "sctp",
        pod(vec![iface(
            "eth0",
            &["10.0.0.1"],
            enforced(
                &["diameter"],
                vec![
                    rule(
                        origin("diameter", Ingress, 0, Enforce),
                        vec![clause(
                            addrs(&["10.0.0.7"]),
                            ports(&[(Protocol::Sctp, Some((3868, 3868)))]),
                        )],
                    ),
                    rule(
                        origin("diameter", Ingress, 1, Enforce),
                        vec![clause(
                            addrs(&["10.0.0.9"]),
                            ports(&[(Protocol::Sctp, None)]),
                        )],
                    ),
                ],
            ),
            open(),
        )]),
        o(),
    ));

    // DanmNetworkPolicy: every interface, both directions: quality-of-life rules, DNS implied
    // in egress (SPEC 3.1), forward.
    let both = |n: usize| {
        enforced(
            &["danm"],
            vec![rule(
                origin("danm", if n == 0 { Ingress } else { Egress }, 0, Enforce),
                vec![clause(addrs(&["10.0.0.2", "10.10.0.2"]), ports(&[tcp(80)]))],
            )],
        )
    };
    let multi = pod(vec![
        iface("net1", &["10.10.0.1"], both(0), with_dns(both(1))),
        iface("eth0", &["10.0.0.1"], both(0), with_dns(both(1))),
    ]);
    v.push(("multi_interface", multi, o()));
    // A NetworkPolicy isolates the primary interface only; net1 stays open. Its packets are
    // dispatched by destination address first: eth0's addresses are judged by eth0's chain
    // wherever they arrive (issue 20, defect 3a).
    v.push((
        "primary_only",
        pod(vec![
            iface(
                "eth0",
                &["10.0.0.1", "fd00::1"],
                enforced(
                    &["np"],
                    vec![rule(
                        origin("np", Ingress, 0, Enforce),
                        vec![clause(addrs(&["10.10.0.2", "fd00::2"]), ports(&[tcp(80)]))],
                    )],
                ),
                open(),
            ),
            iface("net1", &["10.10.0.1"], open(), open()),
        ]),
        o(),
    ));
    // The same rules without the DNS allowance (`--dns=none`, or a NetworkPolicy), and with
    // forwarding allowed.
    let no_dns = pod(vec![
        iface("net1", &["10.10.0.1"], both(0), both(1)),
        iface("eth0", &["10.0.0.1"], both(0), both(1)),
    ]);
    v.push((
        "no_dns_no_forward",
        no_dns,
        RenderOptions {
            reject_forward: false,
            ..o()
        },
    ));

    v.push((
        "monitor_only",
        pod(vec![iface(
            "eth0",
            &["10.0.0.1"],
            monitored(
                &[],
                None,
                &["mon"],
                &[],
                vec![rule(
                    origin("mon", Ingress, 0, Monitor),
                    vec![clause(addrs(&["10.0.0.2"]), ports(&[tcp(80)]))],
                )],
            ),
            open(),
        )]),
        o(),
    ));

    let enf_rule = || {
        rule(
            origin("enf", Ingress, 0, Enforce),
            vec![clause(addrs(&["10.0.0.2"]), ports(&[tcp(80)]))],
        )
    };
    let mon_rule = || {
        rule(
            origin("mon", Ingress, 0, Monitor),
            vec![clause(addrs(&["10.0.0.3"]), ports(&[tcp(80)]))],
        )
    };
    v.push((
        "enforced_and_monitored",
        pod(vec![iface(
            "eth0",
            &["10.0.0.1"],
            monitored(
                &["enf"],
                Some(vec![enf_rule()]),
                &["mon"],
                &[],
                vec![enf_rule(), mon_rule()],
            ),
            open(),
        )]),
        o(),
    ));

    // `new` (monitored) replaces `old` (enforced): old allows the whole /24 on any port, new only
    // 10.0.0.2 on TCP 80. Deny logging on as well.
    let old_rule = || {
        rule(
            origin("old", Ingress, 0, Enforce),
            vec![clause(block("10.0.0.0/24", &[]), PortMatch::Any)],
        )
    };
    let new_rule = || {
        rule(
            origin("new", Ingress, 0, Monitor),
            vec![clause(addrs(&["10.0.0.2"]), ports(&[tcp(80)]))],
        )
    };
    let mut replaced = monitored(
        &["old"],
        Some(vec![old_rule()]),
        &["new"],
        &["old"],
        vec![new_rule()],
    );
    replaced.log_denies = true;
    v.push((
        "replaced",
        pod(vec![iface("eth0", &["10.0.0.1"], replaced, open())]),
        o(),
    ));

    let mut log_in = enforced(
        &["logged"],
        vec![rule(
            origin("logged", Ingress, 0, Enforce),
            vec![clause(addrs(&["10.0.0.2"]), ports(&[tcp(80)]))],
        )],
    );
    log_in.log_denies = true;
    let mut log_out = enforced(
        &["logged"],
        vec![rule(
            origin("logged", Egress, 0, Enforce),
            vec![clause(addrs(&["10.0.0.2"]), PortMatch::Any)],
        )],
    );
    log_out.log_denies = true;
    v.push((
        "log_denies",
        pod(vec![iface("eth0", &["10.0.0.1"], log_in, log_out)]),
        RenderOptions {
            nflog_group: 7,
            log_rate_per_minute: 30,
            log_burst: 5,
            ..o()
        },
    ));

    // Isolated with a rule that can match nothing (only unresolvable named ports): deny all.
    v.push((
        "deny_all",
        pod(vec![iface(
            "eth0",
            &["10.0.0.1"],
            enforced(
                &["deny"],
                vec![rule(origin("deny", Ingress, 0, Enforce), vec![])],
            ),
            enforced(&["deny"], vec![]),
        )]),
        o(),
    ));

    // Learn mode on a pod no policy isolates: a dual-stack primary interface and an IPv4-only
    // secondary one; only base chains with learn rules, no policy chain, no forward chain.
    v.push((
        "learn_open",
        PodRules {
            learn: true,
            ..pod(vec![
                iface("eth0", &["10.0.0.1", "fd00::1"], open(), open()),
                iface("net1", &["192.168.1.1"], open(), open()),
            ])
        },
        o(),
    ));

    // Admin policies (SPEC 8), enforced: ingress Allow web from .2, Pass .3 (on to the
    // NetworkPolicy, which allows .3 on 443), Deny the rest of 10.0.0.0/24; egress: a Baseline
    // Deny to 10.1.0.0/16, no NetworkPolicy (so Baseline decides).
    {
        let admin = vec![
            tier_rule(
                "admins",
                Tier::Admin,
                Ingress,
                0,
                AdminAction::Allow,
                vec![clause(addrs(&["10.0.0.2"]), ports(&[tcp(80)]))],
            ),
            tier_rule(
                "admins",
                Tier::Admin,
                Ingress,
                1,
                AdminAction::Pass,
                vec![clause(addrs(&["10.0.0.3"]), PortMatch::Any)],
            ),
            tier_rule(
                "admins",
                Tier::Admin,
                Ingress,
                2,
                AdminAction::Deny,
                vec![clause(block("10.0.0.0/24", &[]), PortMatch::Any)],
            ),
        ];
        let mut ingress = enforced(
            &["allow-web"],
            vec![rule(
                origin("allow-web", Ingress, 0, Enforce),
                vec![clause(addrs(&["10.0.0.3"]), ports(&[tcp(443)]))],
            )],
        );
        ingress.admin = tiers(admin.clone(), admin);
        let baseline = vec![tier_rule(
            "default",
            Tier::Baseline,
            Egress,
            0,
            AdminAction::Deny,
            vec![clause(block("10.1.0.0/16", &[]), PortMatch::Any)],
        )];
        let mut egress = open();
        egress.baseline = tiers(baseline.clone(), baseline);
        v.push((
            "admin_tiers",
            pod(vec![iface("eth0", &["10.0.0.1"], ingress, egress)]),
            o(),
        ));
    }

    // Admin rules in runs (SPEC 8, `render::tiers`): three Deny rules in a row (two for any
    // port, from .4 and .5, merged into one set; one for TCP 22 from .6, apart), then an Allow
    // of .7 and a Deny of .8 (not merged across the Allow, which decides first for .7).
    {
        let deny = |index, peers: &[&str], port: PortMatch| {
            tier_rule(
                "admins",
                Tier::Admin,
                Ingress,
                index,
                AdminAction::Deny,
                vec![clause(addrs(peers), port)],
            )
        };
        let admin = vec![
            deny(0, &["10.0.0.4"], PortMatch::Any),
            deny(1, &["10.0.0.5"], PortMatch::Any),
            deny(2, &["10.0.0.6"], ports(&[tcp(22)])),
            tier_rule(
                "admins",
                Tier::Admin,
                Ingress,
                3,
                AdminAction::Allow,
                vec![clause(addrs(&["10.0.0.7"]), PortMatch::Any)],
            ),
            deny(4, &["10.0.0.7", "10.0.0.8"], PortMatch::Any),
        ];
        let mut ingress = open();
        ingress.admin = tiers(admin.clone(), admin);
        v.push((
            "admin_tier_runs",
            pod(vec![iface("eth0", &["10.0.0.1"], ingress, open())]),
            o(),
        ));
    }

    // A monitored Baseline policy (SPEC 8 and 4): enforced, an Admin Deny of .9 only; staged,
    // also a Baseline Deny of 10.0.0.0/24 (would-denies counted and logged, nothing refused).
    {
        let admin = vec![tier_rule(
            "admins",
            Tier::Admin,
            Ingress,
            0,
            AdminAction::Deny,
            vec![clause(addrs(&["10.0.0.9"]), PortMatch::Any)],
        )];
        let mut monitored = tier_rule(
            "default",
            Tier::Baseline,
            Ingress,
            0,
            AdminAction::Deny,
            vec![clause(block("10.0.0.0/24", &[]), PortMatch::Any)],
        );
        monitored.origin.mode = Mode::Monitor;
        let mut ingress = open();
        ingress.admin = tiers(admin.clone(), admin);
        ingress.baseline = tiers(vec![], vec![monitored]);
        v.push((
            "admin_tiers_monitor",
            pod(vec![iface("eth0", &["10.0.0.1"], ingress, open())]),
            o(),
        ));
    }

    // Learn mode beside an enforced ingress policy, with a short window and a small set.
    v.push((
        "learn_isolated",
        PodRules {
            learn: true,
            ..pod(vec![iface(
                "eth0",
                &["10.0.0.1"],
                enforced(
                    &["allow-web"],
                    vec![rule(
                        origin("allow-web", Ingress, 0, Enforce),
                        vec![clause(addrs(&["10.0.0.2"]), ports(&[tcp(80)]))],
                    )],
                ),
                open(),
            )])
        },
        RenderOptions {
            learn_window_secs: 30,
            learn_set_size: 1024,
            ..o()
        },
    ));
    v
}
