//! Pod rules built by hand for the dataplane's kernel tests: the engine's output type, without
//! an engine (the tests are about what the kernel does with a given ruleset).

use std::sync::Arc;

use netwarden_engine::{
    AddrSet, AllowRule, Clause, Direction, DirectionRules, InterfaceRules, Isolation, Mode,
    NetworkId, ObjectKey, PeerMatch, PodRules, PolicyKind, PolicyRef, PortMatch, PortRange,
    Protocol, RuleOrigin,
};

/// Pod `t/pod` whose ingress on each of `interfaces` (each holding `pod_ip`) allows TCP
/// `ports` from `peers`, by one enforced policy `t/allow` of `kind`; egress open.
pub fn tcp_ingress_rules(
    kind: PolicyKind,
    interfaces: &[&str],
    pod_ip: &str,
    peers: AddrSet,
    ports: &[u16],
) -> PodRules {
    let policy = PolicyRef {
        kind,
        key: ObjectKey::new("t", "allow"),
    };
    let rule = AllowRule {
        origin: RuleOrigin {
            policy: policy.clone(),
            direction: Direction::Ingress,
            index: 0,
            mode: Mode::Enforce,
        },
        clauses: vec![Clause {
            peers: PeerMatch::Addrs(Arc::new(peers)),
            ports: PortMatch::Only(
                ports
                    .iter()
                    .map(|&p| PortRange {
                        protocol: Protocol::Tcp,
                        ports: Some((p, p)),
                    })
                    .collect(),
            ),
        }],
    };
    let iso = Isolation::Isolated(vec![rule].into());
    let mut ingress = DirectionRules::open();
    ingress.enforced = iso.clone();
    ingress.staged = iso;
    ingress.enforced_policies = vec![policy];
    PodRules {
        pod: ObjectKey::new("t", "pod"),
        netns: None,
        learn: false,
        interfaces: interfaces
            .iter()
            .map(|name| InterfaceRules {
                name: name.to_string(),
                network: NetworkId::Primary,
                ips: vec![pod_ip.parse().expect("a pod address")],
                ingress: ingress.clone(),
                egress: DirectionRules::open(),
            })
            .collect(),
    }
}
