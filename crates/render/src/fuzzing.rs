//! Fuzzing support: pod rules decoded from arbitrary bytes, and the invariants every rendering
//! must keep. The same two functions serve the libFuzzer target (`fuzz/fuzz_targets/render.rs`)
//! and the property tests that run in CI (`tests/fuzz_render.rs`, `tests/fuzz_render_kernel.rs`).
//!
//! Every object name the decoder invents (policy names and namespaces, which reach the renderers
//! only through rule origins) carries the marker [`MARK`], which no interface name, keyword or
//! generated name contains: finding it in a rendered rule means object text leaked into a rule.
//! Interface names are drawn from kernel-legal names, hostile ones included (quotes, `;`, `{`,
//! `$`, a trailing `*` or `+`, non-ASCII).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::IpNet;
use netwarden_engine::{
    AddrSet, AdminAction, AdminKind, AdminRef, AllowRule, Clause, Direction, DirectionRules,
    ImplicitDns, InterfaceRules, IpBlock, Isolation, Mode, NetworkId, ObjectKey, PeerMatch,
    PodRules, PolicyKind, PolicyRef, PortMatch, PortRange, Protocol, RuleOrigin, Tier, TierOrigin,
    TierRule, TierRules,
};
// Reading past the end gives zeros: every input decodes to pod rules.
use netwarden_fuzzbytes::Bytes;

use crate::iptables::{iptables_ifname, needs_chain, render_iptables};
use crate::nft::{build_table, ifname_match_error, RenderError, Transaction};
use crate::options::RenderOptions;

/// Marks every object name the decoder invents (see the module doc).
pub const MARK: &str = "§";

/// Interface names worth trying: ordinary, and every kind of character nft or iptables syntax
/// could trip over. All are legal kernel names.
pub const IFNAMES: &[&str] = &[
    "eth0",
    "net1",
    "ens5",
    "a\"b;+",
    "x\\y",
    "p*",
    "q\\*",
    "e\"",
    "{x}",
    "$(id)",
    "#c",
    "-j",
    "!x",
    "é1",
    "lo0",
    "a'b",
    "a,b",
    "x@y",
    "vlan.10",
    "abcdefghijklmno",
    "a\u{1}b",
];

// The parts of pod rules, each decoded from the choices `b` reads.

fn name(b: &mut Bytes) -> String {
    // Object text with every character rule syntax cares about, and the marker.
    const PARTS: &[&str] = &[
        "a", "\"", ";", "{", "}", "\n", " ", "$", "'", "/", "*", "#", "\\",
    ];
    let n = 1 + b.below(6);
    let mut s = String::from(MARK);
    for _ in 0..n {
        s.push_str(PARTS[b.below(PARTS.len())]);
    }
    s
}

fn net(b: &mut Bytes) -> IpNet {
    if b.bool() {
        let addr = Ipv4Addr::from(b.u32());
        let len = match b.below(4) {
            0 => 0,
            1 => 32,
            _ => b.below(33) as u8,
        };
        IpNet::new(IpAddr::V4(addr), len)
            .expect("prefix ≤ 32")
            .trunc()
    } else {
        let hi = u128::from(b.u32()) << 96;
        let addr = Ipv6Addr::from(hi | u128::from(b.u16()));
        let len = match b.below(4) {
            0 => 0,
            1 => 128,
            _ => b.below(129) as u8,
        };
        IpNet::new(IpAddr::V6(addr), len)
            .expect("prefix ≤ 128")
            .trunc()
    }
}

fn peers(b: &mut Bytes) -> PeerMatch {
    if b.below(4) == 0 {
        return PeerMatch::Any;
    }
    let mut set = AddrSet::new();
    for _ in 0..1 + b.below(4) {
        let cidr = net(b);
        let except = (0..b.below(3))
            .map(|_| net(b))
            .filter(|e| e.addr().is_ipv4() == cidr.addr().is_ipv4())
            .collect();
        set.union_with(&AddrSet::from_ip_block(&IpBlock { cidr, except }));
    }
    PeerMatch::Addrs(Arc::new(set))
}

fn ports(b: &mut Bytes) -> PortMatch {
    if b.below(3) == 0 {
        return PortMatch::Any;
    }
    let ranges = (0..1 + b.below(4))
        .map(|_| {
            let protocol = Protocol::ALL[b.below(3)];
            let ports = if b.below(4) == 0 {
                None
            } else {
                let lo = b.u16().max(1);
                let hi = lo.saturating_add(u16::from(b.u8()) * u16::from(b.bool()));
                Some((lo, hi))
            };
            PortRange { protocol, ports }
        })
        .collect();
    PortMatch::Only(ranges)
}

fn rules(b: &mut Bytes, direction: Direction, mode: Mode) -> Vec<AllowRule> {
    (0..b.below(4))
        .map(|index| AllowRule {
            origin: RuleOrigin {
                policy: PolicyRef {
                    kind: PolicyKind::NetworkPolicy,
                    key: ObjectKey::new(name(b), name(b)),
                },
                direction,
                index,
                mode,
            },
            clauses: (0..b.below(3))
                .map(|_| Clause {
                    peers: peers(b),
                    ports: ports(b),
                })
                .collect(),
        })
        .collect()
}

fn isolation(b: &mut Bytes, direction: Direction, mode: Mode) -> Isolation {
    if b.below(3) == 0 {
        Isolation::Open
    } else {
        Isolation::Isolated(rules(b, direction, mode).into())
    }
}

fn policy(b: &mut Bytes) -> PolicyRef {
    PolicyRef {
        kind: PolicyKind::DanmNetworkPolicy,
        key: ObjectKey::new(name(b), name(b)),
    }
}

fn direction(b: &mut Bytes, direction: Direction) -> DirectionRules {
    let enforced = isolation(b, direction, Mode::Enforce);
    let monitored = b.below(3) == 0;
    // As the engine builds it: a monitored policy isolates the staged view.
    let staged = if monitored {
        Isolation::Isolated(rules(b, direction, Mode::Monitor).into())
    } else {
        enforced.clone()
    };
    let mut dr = DirectionRules::open();
    if enforced.is_isolated() {
        dr.enforced_policies.push(policy(b));
    }
    if monitored {
        dr.monitored_policies.push(policy(b));
        if enforced.is_isolated() && b.bool() {
            dr.replaced_policies = dr.enforced_policies.clone();
        }
    }
    dr.log_denies = b.bool();
    if direction == Direction::Egress {
        dr.implicit_dns = ImplicitDns {
            enforced: enforced.is_isolated() && b.bool(),
            staged: staged.is_isolated() && b.bool(),
        };
    }
    dr.enforced = enforced;
    dr.staged = staged;
    dr
}

/// Admin policy rules of one tier (SPEC 8): up to four, each with an action and up to two
/// clauses; with `monitored`, the staged view differs (a rule of a
/// monitored policy added, or the last enforced one left out as replaced).
fn tier(b: &mut Bytes, direction: Direction, tier: Tier) -> TierRules {
    // Pass in the Baseline tier is refused at the edge; were one to get through, every
    // consumer must agree that it decides nothing.
    let actions: &[AdminAction] = match tier {
        Tier::Admin => &[AdminAction::Allow, AdminAction::Deny, AdminAction::Pass],
        Tier::Baseline => &[
            AdminAction::Allow,
            AdminAction::Deny,
            AdminAction::Deny,
            AdminAction::Pass,
        ],
    };
    let rule = |b: &mut Bytes, index: usize, mode: Mode| TierRule {
        origin: TierOrigin {
            policy: AdminRef {
                kind: AdminKind::ClusterNetworkPolicy,
                name: name(b),
            },
            tier,
            priority: b.below(1001) as u32,
            direction,
            index,
            name: b.bool().then(|| name(b)),
            mode,
        },
        action: *b.pick(actions),
        clauses: (0..b.below(3))
            .map(|_| Clause {
                peers: peers(b),
                ports: ports(b),
            })
            .collect(),
    };
    let enforced: Vec<TierRule> = (0..b.below(5)).map(|i| rule(b, i, Mode::Enforce)).collect();
    let staged = match b.below(4) {
        0 => {
            let mut staged = enforced.clone();
            let at = b.below(staged.len() + 1);
            staged.insert(at, rule(b, at, Mode::Monitor));
            staged
        }
        1 if !enforced.is_empty() => enforced[..enforced.len() - 1].to_vec(),
        _ => enforced.clone(),
    };
    TierRules {
        enforced: enforced.into(),
        staged: staged.into(),
    }
}

/// Pod rules decoded from arbitrary bytes: one to three interfaces with names from
/// [`IFNAMES`], each direction open, enforced, monitored or both.
pub fn pod_rules_from_bytes(data: &[u8]) -> PodRules {
    let mut b = Bytes::new(data);
    let count = 1 + b.below(3);
    let mut names: Vec<&str> = Vec::new();
    while names.len() < count {
        let name = IFNAMES[b.below(IFNAMES.len())];
        if names.contains(&name) {
            // Distinct names (a netns has one interface per name); stop when the bytes repeat.
            if b.overran() {
                break;
            }
            continue;
        }
        names.push(name);
    }
    let interfaces = names
        .iter()
        .enumerate()
        .map(|(i, name)| InterfaceRules {
            name: name.to_string(),
            network: if i == 0 {
                NetworkId::Primary
            } else {
                NetworkId::nad(MARK, *name)
            },
            ips: vec![IpAddr::V4(Ipv4Addr::new(10, 0, i as u8, 1))],
            ingress: direction(&mut b, Direction::Ingress),
            egress: direction(&mut b, Direction::Egress),
        })
        .collect();
    let mut rules = PodRules {
        pod: ObjectKey::new(MARK, MARK),
        netns: None,
        interfaces,
        // Decoded last, so the earlier fields read the bytes they always did.
        learn: b.bool(),
    };
    // Admin policy tiers, decoded after everything older (same reason).
    if b.bool() {
        for iface in &mut rules.interfaces {
            for direction in [Direction::Ingress, Direction::Egress] {
                let dr = match direction {
                    Direction::Ingress => &mut iface.ingress,
                    Direction::Egress => &mut iface.egress,
                };
                dr.admin = tier(&mut b, direction, Tier::Admin);
                dr.baseline = tier(&mut b, direction, Tier::Baseline);
            }
        }
    }
    rules
}

/// What rendering `rules` gave, for the kernel checks.
#[derive(Debug)]
pub struct Rendered {
    /// The nft creation transaction: JSON and text (`None`: nothing isolated, or refused).
    pub nft: Option<(String, String)>,
    /// The iptables ruleset (`None`: refused).
    pub iptables: Option<crate::iptables::IptablesRuleset>,
}

/// Renders `rules` with both backends and checks every invariant that needs no kernel:
/// nothing panics; a pod is refused only for an interface name the backend cannot match
/// exactly, and never otherwise; the JSON is a well-formed document of commands; interface
/// names appear only as exact-match operands; no object text (see [`MARK`]) reaches a rule.
pub fn check_render(rules: &PodRules, opts: &RenderOptions) -> Rendered {
    // Learn mode matches every interface by name, and so does the dispatch of a pod with an
    // isolated interface (open interfaces get an accept by name).
    let isolated: Vec<&InterfaceRules> = rules
        .interfaces
        .iter()
        .filter(|_| rules.learn || rules.is_isolated())
        .collect();
    let nft = match build_table(rules, opts) {
        Ok(table) => {
            for i in &isolated {
                assert!(
                    ifname_match_error(&i.name).is_none(),
                    "{:?} rendered though nft cannot match it exactly",
                    i.name
                );
            }
            table.map(|t| {
                let tx = Transaction::create(&t);
                (tx.to_json(), tx.to_text())
            })
        }
        Err(RenderError::UnmatchableInterface { name, .. }) => {
            assert!(
                ifname_match_error(&name).is_some(),
                "{name:?} refused though nft can match it"
            );
            None
        }
        Err(e @ (RenderError::LearnNeedsNft { .. } | RenderError::AdminNeedsNft { .. })) => {
            panic!("the nft backend refused: {e}")
        }
    };
    if let Some((json, text)) = &nft {
        assert!(!json.contains(MARK), "object text in the nft JSON: {json}");
        assert!(!text.contains(MARK), "object text in the nft text: {text}");
        let doc: serde_json::Value = serde_json::from_str(json).expect("well-formed JSON");
        let commands = doc["nftables"].as_array().expect("a command list");
        for c in commands {
            let rule = &c["add"]["rule"];
            let Some(expr) = rule["expr"].as_array() else {
                continue;
            };
            for e in expr {
                let key = e["match"]["left"]["meta"]["key"].as_str();
                if matches!(key, Some("iifname" | "oifname")) {
                    let name = e["match"]["right"].as_str().expect("a name");
                    let exact = name.strip_suffix("\\*").map(|s| format!("{s}*"));
                    let known = name == "lo"
                        || rules
                            .interfaces
                            .iter()
                            .any(|i| i.name == name || exact.as_deref() == Some(i.name.as_str()));
                    assert!(known, "unknown interface operand {name:?}");
                    assert!(
                        !name.ends_with('*') || name.ends_with("\\*"),
                        "a wildcard operand: {name:?}"
                    );
                }
            }
        }
    }
    // Every interface of a pod with a chain is dispatched by name (crate::dispatch).
    let any_chain = rules
        .interfaces
        .iter()
        .any(|i| needs_chain(&i.ingress) || needs_chain(&i.egress));
    let chained: Vec<&InterfaceRules> = rules.interfaces.iter().filter(|_| any_chain).collect();
    let iptables = match render_iptables(rules, opts) {
        Ok(r) => {
            assert!(!rules.learn, "iptables rendered a learning pod");
            for i in &chained {
                assert!(
                    iptables_ifname(&i.name).is_ok(),
                    "{:?} rendered though iptables cannot match it",
                    i.name
                );
            }
            for text in [&r.v4, &r.v6, &r.ipset_script()] {
                assert!(!text.contains(MARK), "object text in iptables: {text}");
            }
            assert!(
                r.sets
                    .iter()
                    .all(|s| s.cidrs.iter().all(|c| c.prefix_len() > 0)),
                "a /0 in an ipset"
            );
            Some(r)
        }
        Err(RenderError::UnmatchableInterface { name, .. }) => {
            assert!(
                iptables_ifname(&name).is_err() && chained.iter().any(|i| i.name == name),
                "{name:?} refused though iptables can match it or it needs no rule"
            );
            None
        }
        Err(RenderError::LearnNeedsNft { pod }) => {
            assert!(
                rules.learn,
                "{pod}: refused for learn mode though it does not learn"
            );
            None
        }
        Err(RenderError::AdminNeedsNft { pod }) => {
            assert!(
                rules
                    .interfaces
                    .iter()
                    .any(|i| i.ingress.has_tiers() || i.egress.has_tiers()),
                "{pod}: refused for admin policies though none applies"
            );
            None
        }
    };
    Rendered { nft, iptables }
}
