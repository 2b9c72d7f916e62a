//! A deterministic synthetic cluster for benchmarks: pods with realistic label cardinality
//! (apps of ~20 replicas, tiers, zones), a third of them on a secondary network, policies of
//! the three kinds, and one Service in front of every app (most with a selector, some fed by
//! EndpointSlice addresses, as in a real cluster). No randomness crate: a small LCG keeps it
//! reproducible.

use std::net::{IpAddr, Ipv4Addr};

use crate::model::*;

/// Labels from pairs. Also `testing`'s builder (which is compiled for tests only): this
/// module is compiled into the libraries (`netwarden::synthetic` writes its cluster).
pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A namespace with `extra` labels and the `kubernetes.io/metadata.name` label the API server
/// sets. Also `testing`'s builder.
pub fn namespace(name: &str, extra: &[(&str, &str)]) -> Namespace {
    let mut l = labels(extra);
    l.insert("kubernetes.io/metadata.name".into(), name.into());
    Namespace {
        name: name.into(),
        labels: l,
        learn: false,
    }
}

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The generated objects.
pub struct Cluster {
    pub namespaces: Vec<Namespace>,
    pub pods: Vec<Pod>,
    pub policies: Vec<Policy>,
    /// One per app, `svc<N>` in front of `app<N>`: see [`service_for_app`].
    pub services: Vec<Service>,
}

const PODS_PER_NAMESPACE: usize = 200;
const PODS_PER_APP: usize = 20;

/// One Service in ten has no selector: its endpoints come from EndpointSlice addresses.
const SLICE_SERVICE_EVERY: usize = 10;

fn app_of(i: usize) -> String {
    format!("app{}", i / PODS_PER_APP)
}

fn ns_name(i: usize) -> String {
    format!("ns{i}")
}

/// The primary address of pod number `i`.
pub fn pod_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000u32 + i as u32 + 1))
}

/// The Service in front of app number `app` (whose pods are numbers `20·app .. 20·app + 20`,
/// capped at `pods`): ClusterIP `10.96.x.y`, port 80 to the pods' named port `http`, and for
/// one app in three also 5432 to 5432 (what the generated egress rules allow). One in
/// [`SLICE_SERVICE_EVERY`] is selector-less, with its pods' addresses as EndpointSlice
/// endpoints.
pub fn service_for_app(app: usize, pods: usize) -> Service {
    let first = app * PODS_PER_APP;
    let members = first..(first + PODS_PER_APP).min(pods);
    let mut ports = vec![ServicePort {
        protocol: Protocol::Tcp,
        port: 80,
        target: PortRef::Named("http".into()),
    }];
    if app.is_multiple_of(3) {
        ports.push(ServicePort {
            protocol: Protocol::Tcp,
            port: 5432,
            target: PortRef::Number(5432),
        });
    }
    let sliced = app % SLICE_SERVICE_EVERY == SLICE_SERVICE_EVERY - 1;
    Service {
        key: ObjectKey::new(ns_name(first / PODS_PER_NAMESPACE), format!("svc{app}")),
        cluster_ips: vec![IpAddr::V4(Ipv4Addr::from(0x0a60_0000u32 + app as u32 + 1))],
        selector: (!sliced).then(|| labels(&[("app", &app_of(first))])),
        endpoint_addrs: if sliced {
            members.map(pod_ip).collect()
        } else {
            Vec::new()
        },
        ports,
    }
}

/// `pods` pods and `policies` policies (60% NetworkPolicy, 20% DanmNetworkPolicy, 20%
/// MultiNetworkPolicy).
pub fn cluster(pods: usize, policies: usize, seed: u64) -> Cluster {
    let mut rng = Lcg(seed);
    let ns_count = pods.div_ceil(PODS_PER_NAMESPACE).max(1);
    let namespaces = (0..ns_count)
        .map(|i| {
            namespace(
                &ns_name(i),
                &[
                    ("team", &format!("team{}", i % 10)),
                    ("env", if i % 3 == 0 { "prod" } else { "dev" }),
                ],
            )
        })
        .collect();
    let nets: Vec<NetworkId> = (0..5)
        .map(|i| NetworkId::nad("infra", format!("net{i}")))
        .collect();
    let mut out_pods = Vec::with_capacity(pods);
    for i in 0..pods {
        let ns = ns_name(i / PODS_PER_NAMESPACE);
        let mut interfaces = vec![PodInterface {
            name: "eth0".into(),
            network: NetworkId::Primary,
            ips: vec![pod_ip(i)],
            prefix_lens: vec![8],
        }];
        if i % 3 == 0 {
            let ip2 = IpAddr::V4(Ipv4Addr::from(0xc0a8_0000u32 + i as u32 + 1));
            interfaces.push(PodInterface {
                name: "net1".into(),
                network: nets[i % nets.len()].clone(),
                ips: vec![ip2],
                prefix_lens: vec![16],
            });
        }
        out_pods.push(Pod {
            key: PodKey::new(ns, format!("pod{i}")),
            labels: labels(&[
                ("app", &app_of(i)),
                ("tier", ["web", "api", "db"][i % 3]),
                ("zone", ["a", "b", "c", "d"][i % 4]),
                (
                    "pod-template-hash",
                    &format!("{:x}", i / PODS_PER_APP * 7919),
                ),
            ]),
            host_network: false,
            container_ports: vec![
                ContainerPort {
                    name: Some("http".into()),
                    port: 8080,
                    protocol: Protocol::Tcp,
                },
                ContainerPort {
                    name: Some("metrics".into()),
                    port: 9090,
                    protocol: Protocol::Tcp,
                },
            ],
            interfaces,
            netns: None,
            node_name: None,
            uid: None,
            learn: false,
        });
    }
    let apps_per_ns = PODS_PER_NAMESPACE / PODS_PER_APP;
    let mut out_policies = Vec::with_capacity(policies);
    for i in 0..policies {
        let ns_index = rng.below(ns_count);
        let ns = ns_name(ns_index);
        let app = |rng: &mut Lcg| format!("app{}", ns_index * apps_per_ns + rng.below(apps_per_ns));
        let kind = match i % 5 {
            0 => PolicyKind::DanmNetworkPolicy,
            1 => PolicyKind::MultiNetworkPolicy,
            _ => PolicyKind::NetworkPolicy,
        };
        let sel = |pairs: &[(&str, String)]| LabelSelector {
            match_labels: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            match_expressions: Vec::new(),
        };
        let mut peers = vec![Peer::Pods {
            pod_selector: Some(sel(&[("app", app(&mut rng))])),
            namespace_selector: None,
            network_selector: None,
        }];
        match rng.below(4) {
            0 => peers.push(Peer::Pods {
                pod_selector: Some(sel(&[("tier", "web".into())])),
                namespace_selector: Some(sel(&[("team", format!("team{}", rng.below(10)))])),
                network_selector: None,
            }),
            1 => peers.push(Peer::IpBlock(IpBlock {
                cidr: "172.16.0.0/12".parse().expect("cidr"),
                except: vec!["172.16.5.0/24".parse().expect("cidr")],
            })),
            2 => peers.push(Peer::Pods {
                pod_selector: Some(LabelSelector {
                    match_labels: Default::default(),
                    match_expressions: vec![Requirement {
                        key: "tier".into(),
                        operator: Operator::In,
                        values: vec!["api".into(), "db".into()],
                    }],
                }),
                namespace_selector: None,
                network_selector: None,
            }),
            _ => {}
        }
        let ports = vec![
            PolicyPort {
                protocol: Protocol::Tcp,
                port: Some(PortRef::Named("http".into())),
                end_port: None,
            },
            PolicyPort {
                protocol: Protocol::Tcp,
                port: Some(PortRef::Number(9000)),
                end_port: Some(9100),
            },
        ];
        let ingress = Some(vec![PolicyRule { peers, ports }]);
        let egress = (rng.below(10) < 3).then(|| {
            vec![PolicyRule {
                peers: vec![Peer::Pods {
                    pod_selector: Some(sel(&[("app", app(&mut rng))])),
                    namespace_selector: None,
                    network_selector: None,
                }],
                ports: [PolicyPort {
                    protocol: Protocol::Tcp,
                    port: Some(PortRef::Number(5432)),
                    end_port: None,
                }]
                .into_iter()
                // Half the egress rules also allow the destination's named port, which the
                // Services' port 80 targets.
                .chain((i.is_multiple_of(2)).then(|| PolicyPort {
                    protocol: Protocol::Tcp,
                    port: Some(PortRef::Named("http".into())),
                    end_port: None,
                }))
                .collect(),
            }]
        });
        let scope = match kind {
            PolicyKind::NetworkPolicy => PolicyScope::Primary,
            PolicyKind::DanmNetworkPolicy => PolicyScope::AllInterfaces,
            PolicyKind::MultiNetworkPolicy => {
                PolicyScope::Networks(vec![nets[rng.below(nets.len())].clone()])
            }
        };
        out_policies.push(Policy {
            kind,
            key: ObjectKey::new(ns, format!("policy{i}")),
            pod_selector: sel(&[("app", app(&mut rng))]),
            ingress,
            egress,
            scope,
            mode: if i % 7 == 0 {
                Mode::Monitor
            } else {
                Mode::Enforce
            },
            replaces: None,
            log_denies: false,
        });
    }
    Cluster {
        namespaces,
        pods: out_pods,
        policies: out_policies,
        services: (0..pods.div_ceil(PODS_PER_APP))
            .map(|app| service_for_app(app, pods))
            .collect(),
    }
}

/// `count` admin policies of the kinds an administrator writes (SPEC 8), over the namespaces
/// [`cluster`] labels (`team0`…`team9`, `env` prod/dev): whole-namespace subjects (`team`),
/// whole-namespace and pod-label peers, a few CIDRs; actions Allow/Deny/Pass in the Admin tier
/// (priorities spread over 0–999, ClusterNetworkPolicy and AdminNetworkPolicy alike), and one
/// BaselineAdminNetworkPolicy `default` denying cross-team ingress. Each has 5 rules per
/// direction, so 200 policies carry 2,000 rules.
pub fn admin_policies(count: usize, seed: u64) -> Vec<crate::admin::AdminPolicy> {
    use crate::admin::{
        AdminAction, AdminKind, AdminPeer, AdminPolicy, AdminPort, AdminRule, PodsSelector, Tier,
    };
    let mut rng = Lcg(seed ^ 0xad31);
    let team = |i: usize| LabelSelector {
        match_labels: labels(&[("team", &format!("team{}", i % 10))]),
        match_expressions: Vec::new(),
    };
    let mut out = Vec::with_capacity(count);
    for n in 0..count.saturating_sub(1) {
        let action = |rng: &mut Lcg| match rng.below(3) {
            0 => AdminAction::Allow,
            1 => AdminAction::Deny,
            _ => AdminAction::Pass,
        };
        let peer = |rng: &mut Lcg| match rng.below(4) {
            0 | 1 => AdminPeer::Pods(PodsSelector::namespaces(team(rng.below(10)))),
            2 => AdminPeer::Pods(PodsSelector {
                namespaces: LabelSelector::default(),
                pods: LabelSelector {
                    match_labels: labels(&[("app", &format!("app{}", rng.below(500)))]),
                    match_expressions: Vec::new(),
                },
            }),
            _ => AdminPeer::Networks(vec![format!("10.{}.0.0/16", rng.below(200))
                .parse()
                .expect("a CIDR")]),
        };
        let rules = |rng: &mut Lcg, egress: bool| -> Vec<AdminRule> {
            (0..5)
                .map(|i| {
                    let mut peers = vec![peer(rng)];
                    if !egress {
                        peers.retain(|p| !matches!(p, AdminPeer::Networks(_)));
                        if peers.is_empty() {
                            peers.push(AdminPeer::Pods(PodsSelector::namespaces(team(i))));
                        }
                    }
                    AdminRule {
                        name: Some(format!("r{i}")),
                        action: action(rng),
                        peers,
                        ports: rng.below(2).eq(&0).then(|| {
                            vec![AdminPort::Numbers(crate::rules::PortRange {
                                protocol: Protocol::Tcp,
                                ports: Some((80, 80 + rng.below(1000) as u16)),
                            })]
                        }),
                    }
                })
                .collect()
        };
        out.push(AdminPolicy {
            kind: if n % 2 == 0 {
                AdminKind::ClusterNetworkPolicy
            } else {
                AdminKind::AdminNetworkPolicy
            },
            name: format!("admin{n}"),
            tier: Tier::Admin,
            priority: rng.below(1000) as u32,
            subject: PodsSelector::namespaces(team(n)),
            ingress: rules(&mut rng, false),
            egress: rules(&mut rng, true),
            scope: PolicyScope::Primary,
            mode: Mode::Enforce,
            replaces: None,
            log_denies: false,
        });
    }
    if count > 0 {
        out.push(AdminPolicy {
            kind: AdminKind::BaselineAdminNetworkPolicy,
            name: "default".into(),
            tier: Tier::Baseline,
            priority: 0,
            subject: PodsSelector::namespaces(LabelSelector::default()),
            ingress: (0..10)
                .map(|i| AdminRule {
                    name: None,
                    action: AdminAction::Deny,
                    peers: vec![AdminPeer::Pods(PodsSelector::namespaces(team(i)))],
                    ports: None,
                })
                .collect(),
            egress: Vec::new(),
            scope: PolicyScope::Primary,
            mode: Mode::Enforce,
            replaces: None,
            log_denies: false,
        });
    }
    out
}
