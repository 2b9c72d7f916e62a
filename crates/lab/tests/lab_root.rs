//! Privileged end-to-end tests: real namespaces, bridges, veths, listeners and probes.
//! Each test uses its own name prefix so they can run in parallel and check for leftovers.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use netwarden_dataplane::discover;
use netwarden_dataplane::netns::{exec_in, run_in};
use netwarden_engine::model::{NetworkId, Pod, PodInterface, PodKey, Protocol};
use netwarden_engine::testing::{interface, pod_with_interfaces};
use netwarden_lab::{
    cleanup_stale, teardown_from_state, Lab, LabError, LabOptions, LabSpec, ProbeConfig,
    ProbeDetail, ProbeSpec,
};
use netwarden_testing::{named_netns_with_prefix, root_or_skip};

fn options(prefix: &str) -> LabOptions {
    LabOptions {
        prefix: prefix.to_owned(),
        ..LabOptions::default()
    }
}

/// A pod of namespace `t` without labels.
fn pod(name: &str, interfaces: Vec<PodInterface>) -> Pod {
    pod_with_interfaces("t", name, &[], interfaces)
}

fn net1() -> NetworkId {
    NetworkId::nad("x", "net1")
}

/// a, b, c on the primary network (c in other subnets: on-link routes), a and b on x/net1,
/// and a pod without addresses.
fn three_pods() -> Vec<Pod> {
    vec![
        pod(
            "a",
            vec![
                interface("eth0", NetworkId::Primary, &["10.10.0.1/24", "fd10::1/64"]),
                interface("net1", net1(), &["10.20.0.1/24", "fd20::1/64"]),
            ],
        ),
        pod(
            "b",
            vec![
                interface("eth0", NetworkId::Primary, &["10.10.0.2/24", "fd10::2/64"]),
                interface("net1", net1(), &["10.20.0.2/24", "fd20::2/64"]),
            ],
        ),
        pod(
            "c",
            vec![interface(
                "eth0",
                NetworkId::Primary,
                &["10.11.0.3/24", "fd11::3/64"],
            )],
        ),
        pod("nothing", vec![]),
    ]
}

/// Every ordered pair (self included) on every network both pods share, per family and port.
fn all_probes(pods: &[Pod], ports: &[(u16, Protocol)]) -> Vec<ProbeSpec> {
    let mut out = Vec::new();
    for from in pods {
        for to in pods {
            for src_if in &from.interfaces {
                let Some(dst_if) = to.interface_on(&src_if.network) else {
                    continue;
                };
                for src in &src_if.ips {
                    for dst in dst_if.ips.iter().filter(|d| d.is_ipv4() == src.is_ipv4()) {
                        for &(port, protocol) in ports {
                            out.push(ProbeSpec {
                                from: from.key.clone(),
                                to: to.key.clone(),
                                src_ip: Some(*src),
                                dst_ip: *dst,
                                port,
                                protocol,
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

const REJECT_80: &str = "table inet nwlabtest {
  chain input {
    type filter hook input priority 0; policy accept;
    tcp dport 80 reject with tcp reset
    udp dport 80 reject with icmpx type port-unreachable
  }
}
";

#[test]
fn dual_stack_two_networks_probes_and_rejects() {
    if !root_or_skip() {
        return;
    }
    let prefix = "nwlabt1";
    let pods = three_pods();
    let ports = vec![
        (80, Protocol::Tcp),
        (80, Protocol::Udp),
        (81, Protocol::Tcp),
        (81, Protocol::Udp),
    ];
    let mut spec_ports = ports.clone();
    spec_ports.push((9, Protocol::Sctp));
    let spec = LabSpec {
        pods: pods.clone(),
        ports: spec_ports,
    };
    let lab = Lab::up_with(&spec, &options(prefix)).unwrap();
    assert_eq!(lab.skipped(), [PodKey::new("t", "nothing")]);
    // SCTP has no listener; it is probed with raw INITs where the kernel has no SCTP sockets,
    // and is unsupported where it has them.
    let raw_sctp = lab.unsupported_ports().is_empty();
    if !raw_sctp {
        assert_eq!(lab.unsupported_ports(), [(9, Protocol::Sctp)]);
    }
    assert_eq!(lab.ports(), &ports[..]);
    assert_eq!(lab.state().pods.len(), 3);
    assert_eq!(named_netns_with_prefix(prefix).len(), 4, "fabric + 3 pods");

    // The sysctls written from a setns'd thread landed in the pod netns.
    let a = PodKey::new("t", "a");
    let b = PodKey::new("t", "b");
    let a_path = lab.pod_netns(&a).unwrap().to_owned();
    let out = exec_in(&a_path, "cat", &["/proc/sys/net/ipv4/icmp_ratelimit"], None).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");

    let probes = all_probes(&pods, &ports);
    // a,b: 2 nets x 2 families; pairs a-a,a-b,b-a,b-b: 4*4 + c pairs on primary: 5 * 2 families.
    assert_eq!(probes.len(), (4 * 4 + 5 * 2) * ports.len());
    let outcomes = lab.probe(&probes);
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.connected)
        .map(|o| format!("{:?} -> {}", o.spec, o.detail))
        .collect();
    assert!(
        failed.is_empty(),
        "{} probes failed: {failed:#?}",
        failed.len()
    );

    // Reject port 80 in b: TCP with a reset, UDP with port unreachable.
    let b_path = lab.pod_netns(&b).unwrap().to_owned();
    exec_in(&b_path, "nft", &["-f", "-"], Some(REJECT_80.as_bytes())).unwrap();
    let outcomes = lab.probe(&probes);
    for o in &outcomes {
        let to_b_80 = o.spec.to == b && o.spec.port == 80;
        if to_b_80 {
            assert_eq!(o.detail, ProbeDetail::Refused, "{o:?}");
            assert!(!o.connected);
            if o.spec.protocol == Protocol::Tcp {
                assert!(o.elapsed < Duration::from_millis(500), "slow refusal {o:?}");
            }
        } else {
            assert_eq!(o.detail, ProbeDetail::Connected, "{o:?}");
        }
    }
    assert!(outcomes.iter().any(|o| o.spec.to == b && o.spec.port == 80));

    // An unknown source pod and an address nobody has are reported, not panics.
    let odd = lab.probe(&[
        ProbeSpec {
            from: PodKey::new("t", "nothing"),
            to: a.clone(),
            src_ip: None,
            dst_ip: "10.10.0.1".parse().unwrap(),
            port: 81,
            protocol: Protocol::Tcp,
        },
        ProbeSpec {
            from: a.clone(),
            to: b.clone(),
            src_ip: Some("10.99.0.1".parse().unwrap()),
            dst_ip: "10.10.0.2".parse().unwrap(),
            port: 81,
            protocol: Protocol::Tcp,
        },
    ]);
    assert!(
        odd.iter()
            .all(|o| matches!(o.detail, ProbeDetail::Error(_))),
        "{odd:?}"
    );
    // SCTP between two pods without rules: the INIT reaches b (whose kernel, without SCTP,
    // answers protocol unreachable), both families.
    let sctp: Vec<ProbeSpec> = [("10.10.0.1", "10.10.0.2"), ("fd10::1", "fd10::2")]
        .into_iter()
        .map(|(src, dst)| ProbeSpec {
            from: a.clone(),
            to: b.clone(),
            src_ip: Some(src.parse().unwrap()),
            dst_ip: dst.parse().unwrap(),
            port: 9,
            protocol: Protocol::Sctp,
        })
        .collect();
    for o in lab.probe(&sctp) {
        if raw_sctp {
            assert_eq!(o.detail, ProbeDetail::Connected, "{o:?}");
        } else {
            assert!(matches!(o.detail, ProbeDetail::Error(_)), "{o:?}");
        }
    }
    let json = serde_json::to_value(&odd[0]).unwrap();
    assert_eq!(json["detail"]["result"], "error");
    assert_eq!(json["spec"]["protocol"], "TCP");

    lab.down().unwrap();
    assert_eq!(named_netns_with_prefix(prefix), Vec::<String>::new());
}

#[test]
fn failed_up_leaves_nothing() {
    if !root_or_skip() {
        return;
    }
    // Refused before anything is created.
    let prefix = "nwlabt2";
    let bad_name = pod(
        "a",
        vec![interface("bad name", NetworkId::Primary, &["10.30.0.1/24"])],
    );
    let err = Lab::up_with(
        &LabSpec {
            pods: vec![bad_name],
            ports: vec![],
        },
        &options(prefix),
    );
    assert!(matches!(err, Err(LabError::Invalid(_))), "{:?}", err.err());
    assert_eq!(named_netns_with_prefix(prefix), Vec::<String>::new());

    // Fails in the kernel after namespaces, bridges and veths exist: the second pod adds the
    // same address twice to one interface.
    let mut pods = vec![
        pod(
            "a",
            vec![interface("eth0", NetworkId::Primary, &["10.30.0.1/24"])],
        ),
        pod(
            "b",
            vec![interface(
                "eth0",
                NetworkId::Primary,
                &["10.30.0.2/24", "10.30.0.2/24"],
            )],
        ),
    ];
    pods.push(pod(
        "c",
        vec![interface("eth0", NetworkId::Primary, &["10.30.0.3/24"])],
    ));
    let spec = LabSpec {
        pods,
        ports: vec![(80, Protocol::Tcp)],
    };
    let err = Lab::up_with(&spec, &options(prefix))
        .err()
        .expect("duplicate address must fail");
    assert!(matches!(err, LabError::Setup { .. }), "{err}");
    assert!(err.to_string().contains("t/b"), "{err}");
    assert_eq!(named_netns_with_prefix(prefix), Vec::<String>::new());

    // A port already taken cannot be, but a port the lab cannot bind in the pod fails late too:
    // two listeners on one port/protocol are deduplicated, so this one succeeds and is removed.
    let spec = LabSpec {
        pods: vec![pod(
            "a",
            vec![interface("eth0", NetworkId::Primary, &["10.30.0.1/24"])],
        )],
        ports: vec![(80, Protocol::Tcp), (80, Protocol::Tcp)],
    };
    Lab::up_with(&spec, &options(prefix))
        .unwrap()
        .down()
        .unwrap();
    assert_eq!(named_netns_with_prefix(prefix), Vec::<String>::new());
}

#[test]
fn drop_and_state_and_stale_cleanup() {
    if !root_or_skip() {
        return;
    }
    let prefix = "nwlabt3";
    let spec = LabSpec {
        pods: vec![
            pod(
                "a",
                vec![interface("eth0", NetworkId::Primary, &["10.40.0.1/24"])],
            ),
            pod(
                "b",
                vec![interface("eth0", NetworkId::Primary, &["10.40.0.2/24"])],
            ),
        ],
        ports: vec![(80, Protocol::Tcp), (80, Protocol::Udp)],
    };

    // Drop without down.
    {
        let lab = Lab::up_with(&spec, &options(prefix)).unwrap();
        assert_eq!(named_netns_with_prefix(prefix).len(), 3);
        assert!(lab
            .pod_netns_name(&PodKey::new("t", "a"))
            .unwrap()
            .starts_with("nwlabt3-"));
    }
    assert_eq!(named_netns_with_prefix(prefix), Vec::<String>::new());

    // From a saved state (another process would read it from a file).
    let lab = Lab::up_with(&spec, &options(prefix)).unwrap();
    let state = lab.state().clone();
    let text = serde_json::to_string(&state).unwrap();
    let state: netwarden_lab::LabState = serde_json::from_str(&text).unwrap();
    teardown_from_state(&state).unwrap();
    assert_eq!(named_netns_with_prefix(prefix), Vec::<String>::new());
    lab.down().unwrap();

    // By prefix.
    let lab = Lab::up_with(&spec, &options(prefix)).unwrap();
    let mut removed = cleanup_stale(prefix).unwrap();
    removed.sort();
    let mut expected = lab.state().netns_names();
    expected.sort();
    assert_eq!(removed, expected);
    assert_eq!(named_netns_with_prefix(prefix), Vec::<String>::new());
    drop(lab);
}

#[test]
fn discover_sees_lab_interfaces() {
    if !root_or_skip() {
        return;
    }
    let prefix = "nwlabt4";
    let lab = Lab::up_with(
        &LabSpec {
            pods: three_pods(),
            ports: vec![],
        },
        &options(prefix),
    )
    .unwrap();
    let a = lab.pod_netns(&PodKey::new("t", "a")).unwrap();
    let found = discover::interfaces(a).unwrap();
    let summary: Vec<(String, Vec<String>, bool)> = found
        .iter()
        .map(|i| {
            (
                i.name.clone(),
                i.addrs.iter().map(|a| a.to_string()).collect(),
                i.up,
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                "eth0".to_owned(),
                vec!["10.10.0.1/24".to_owned(), "fd10::1/64".to_owned()],
                true
            ),
            (
                "net1".to_owned(),
                vec!["10.20.0.1/24".to_owned(), "fd20::1/64".to_owned()],
                true
            ),
        ]
    );
    // The kernel's link-local addresses are kept apart, never in `addrs`.
    assert!(found.iter().all(|i| i
        .addrs
        .iter()
        .all(|n| !matches!(n.addr(), IpAddr::V6(v) if v.segments()[0] == 0xfe80))));
    // The route to c's other subnet is on-link via eth0.
    let routes = run_in(a, || {
        std::fs::read_to_string("/proc/thread-self/net/route").unwrap()
    })
    .unwrap();
    assert!(routes.contains("eth0\t00000B0A"), "{routes}");
    assert!(
        !Path::new("/sys/class/net/v0x0").exists(),
        "no lab link in the root netns"
    );
    lab.down().unwrap();
    assert_eq!(named_netns_with_prefix(prefix), Vec::<String>::new());
}

/// What netwarden's egress rules do, in the source pod: REJECT port 80 (TCP with a reset, UDP
/// with port unreachable) in the OUTPUT hook; and a silent DROP of port 81 for contrast.
const EGRESS_REJECT_80_DROP_81: &str = "table inet nwlabtest {
  chain output {
    type filter hook output priority 0; policy accept;
    oif \"lo\" accept
    tcp dport 80 reject with tcp reset
    udp dport 80 reject with icmpx type port-unreachable
    th dport 81 drop
  }
}
";

/// Regression: a datagram discarded in the source's OUTPUT hook fails `send` with EPERM,
/// whether it was rejected or dropped. The probe used to report that as an error; an egress
/// REJECT is a refusal (its port unreachable reaches the socket) and an egress DROP a timeout.
#[test]
fn egress_reject_is_refused_and_egress_drop_times_out() {
    if !root_or_skip() {
        return;
    }
    let prefix = "nwlabt6";
    let spec = LabSpec {
        pods: vec![
            pod(
                "a",
                vec![interface(
                    "eth0",
                    NetworkId::Primary,
                    &["10.60.0.1/24", "fd60::1/64"],
                )],
            ),
            pod(
                "b",
                vec![interface(
                    "eth0",
                    NetworkId::Primary,
                    &["10.60.0.2/24", "fd60::2/64"],
                )],
            ),
        ],
        ports: vec![
            (80, Protocol::Tcp),
            (80, Protocol::Udp),
            (81, Protocol::Tcp),
            (81, Protocol::Udp),
        ],
    };
    let mut lab = Lab::up_with(&spec, &options(prefix)).unwrap();
    // Timeouts are what this test waits for: keep them short.
    lab.set_probe_config(ProbeConfig {
        tcp_timeout: Duration::from_millis(500),
        udp_timeout: Duration::from_millis(300),
        ..ProbeConfig::default()
    });
    let a = PodKey::new("t", "a");
    let a_path = lab.pod_netns(&a).unwrap().to_owned();
    exec_in(
        &a_path,
        "nft",
        &["-f", "-"],
        Some(EGRESS_REJECT_80_DROP_81.as_bytes()),
    )
    .unwrap();
    let probes: Vec<ProbeSpec> = all_probes(&spec.pods, &spec.ports)
        .into_iter()
        .filter(|p| p.from == a && p.to != a)
        .collect();
    assert_eq!(probes.len(), 2 * 4, "a -> b, 2 families, 4 ports");
    let outcomes = lab.probe(&probes);
    let wrong: Vec<String> = outcomes
        .iter()
        .filter(|o| {
            let want = if o.spec.port == 80 {
                ProbeDetail::Refused
            } else {
                ProbeDetail::Timeout
            };
            o.detail != want
        })
        .map(|o| format!("{:?} -> {}", o.spec, o.detail))
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
    lab.down().unwrap();
    assert_eq!(named_netns_with_prefix(prefix), Vec::<String>::new());
}
