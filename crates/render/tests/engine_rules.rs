//! The renderer fed by the real engine: a named port resolved per pod, a monitored policy, and
//! the tracer agreeing with the engine's own views for every pair of pods.

mod common;

use std::collections::BTreeMap;

use common::{ip, ScratchNetns};
use netwarden_engine::{
    ContainerPort, Direction, Engine, EngineOptions, LabelSelector, Mode, Namespace, NetworkId,
    ObjectKey, Peer, Pod, PodInterface, Policy, PolicyKind, PolicyPort, PolicyRule, PolicyScope,
    PortRef, Protocol,
};
use netwarden_render::tracer::{trace, TracePacket};
use netwarden_render::{render_nft, LogAction, RenderOptions};

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn mk_pod(name: &str, app: &str, addr: &str, ports: Vec<ContainerPort>) -> Pod {
    Pod {
        key: ObjectKey::new("ns", name),
        labels: labels(&[("app", app)]),
        host_network: false,
        container_ports: ports,
        interfaces: vec![PodInterface {
            name: "eth0".into(),
            network: NetworkId::Primary,
            ips: vec![ip(addr)],
            prefix_lens: vec![24],
        }],
        netns: None,
    }
}

fn mk_policy(name: &str, mode: Mode, port: PortRef) -> Policy {
    Policy {
        kind: PolicyKind::NetworkPolicy,
        key: ObjectKey::new("ns", name),
        pod_selector: LabelSelector {
            match_labels: labels(&[("app", "web")]),
            ..Default::default()
        },
        ingress: Some(vec![PolicyRule {
            peers: vec![Peer::Pods {
                pod_selector: Some(LabelSelector {
                    match_labels: labels(&[("app", "client")]),
                    ..Default::default()
                }),
                namespace_selector: None,
                network_selector: None,
            }],
            ports: vec![PolicyPort {
                protocol: Protocol::Tcp,
                port: Some(port),
                end_port: None,
            }],
        }]),
        egress: None,
        scope: PolicyScope::Primary,
        mode,
        replaces: None,
        log_denies: false,
    }
}

#[test]
fn engine_rules_render_and_trace_consistently() {
    let mut engine = Engine::new(EngineOptions::default());
    engine.set_namespace(Namespace {
        name: "ns".into(),
        labels: labels(&[]),
    });
    let http = |port| ContainerPort {
        name: Some("http".into()),
        port,
        protocol: Protocol::Tcp,
    };
    engine.set_pod(mk_pod("web", "web", "10.0.0.1", vec![http(8080)]));
    engine.set_pod(mk_pod("client", "client", "10.0.0.2", vec![]));
    engine.set_pod(mk_pod("other", "other", "10.0.0.3", vec![]));
    engine.set_policy(mk_policy(
        "web-http",
        Mode::Enforce,
        PortRef::Named("http".into()),
    ));
    engine.set_policy(mk_policy("web-443", Mode::Monitor, PortRef::Number(443)));

    let opts = RenderOptions::default();
    let web = engine
        .pod_rules(&ObjectKey::new("ns", "web"))
        .expect("web has rules");
    let text = render_nft(&web, &opts).unwrap();
    assert!(
        text.contains("th dport 8080"),
        "named port resolved:\n{text}"
    );
    assert!(text.contains("nw:wd:"), "monitored policy present:\n{text}");
    if let Some(ns) = ScratchNetns::new("engine") {
        let (ok, _, stderr) = ns.nft(&["-c", "-f", "-"], &text);
        assert!(ok, "{stderr}\n{text}");
    }

    let iface = web.interface("eth0").unwrap();
    for peer in ["10.0.0.2", "10.0.0.3"] {
        for port in [80u16, 443, 8080] {
            let p = TracePacket::new(Direction::Ingress, "eth0", ip(peer), Protocol::Tcp, port);
            let r = trace(&web, &opts, &p).unwrap();
            let (enf, _) = iface
                .ingress
                .enforced
                .evaluate(ip(peer), Protocol::Tcp, port);
            let (stg, _) = iface.ingress.staged.evaluate(ip(peer), Protocol::Tcp, port);
            assert_eq!(r.accepted, enf, "{peer}:{port}");
            assert_eq!(
                r.logged == Some(LogAction::WouldDeny),
                enf && !stg,
                "{peer}:{port}"
            );
        }
    }
    // The client is only allowed on the resolved named port.
    let ok = trace(
        &web,
        &opts,
        &TracePacket::new(
            Direction::Ingress,
            "eth0",
            ip("10.0.0.2"),
            Protocol::Tcp,
            8080,
        ),
    )
    .unwrap();
    assert!(ok.accepted);
    let no = trace(
        &web,
        &opts,
        &TracePacket::new(
            Direction::Ingress,
            "eth0",
            ip("10.0.0.3"),
            Protocol::Tcp,
            8080,
        ),
    )
    .unwrap();
    assert!(!no.accepted);

    // Pods no policy selects render only the deletion.
    let other = engine.pod_rules(&ObjectKey::new("ns", "other"));
    if let Some(other) = other {
        assert_eq!(
            render_nft(&other, &opts).unwrap(),
            netwarden_render::nft::Transaction::removal().to_text()
        );
    }
}
