//! The renderer fed by the real engine: a named port resolved per pod, a monitored policy, and
//! the tracer agreeing with the engine's own views for every pair of pods.

mod common;

use common::ip;
use netwarden_engine::testing::{
    labels, named, netpol, pod, pods_with, rule, selector, tcp, with_port,
};
use netwarden_engine::{
    Direction, Engine, EngineOptions, Mode, Namespace, ObjectKey, Pod, Policy, PolicyPort, Protocol,
};
use netwarden_render::tracer::{trace, TracePacket};
use netwarden_render::{render_nft, LogAction, RenderOptions};
use netwarden_testing::ScratchNetns;

fn mk_pod(name: &str, app: &str, addr: &str) -> Pod {
    pod("ns", name, &[("app", app)], &[addr])
}

/// `ns/<name>` on `app=web`, in `mode`, allowing `port` from `app=client`.
fn mk_policy(name: &str, mode: Mode, port: PolicyPort) -> Policy {
    let mut p = netpol(
        "ns",
        name,
        selector(&[("app", "web")]),
        Some(vec![rule(
            vec![pods_with(&[("app", "client")])],
            vec![port],
        )]),
        None,
    );
    p.mode = mode;
    p
}

#[test]
fn engine_rules_render_and_trace_consistently() {
    let mut engine = Engine::new(EngineOptions::default());
    engine.set_namespace(Namespace {
        name: "ns".into(),
        labels: labels(&[]),
        learn: false,
    });
    let web = with_port(
        mk_pod("web", "web", "10.0.0.1"),
        "http",
        8080,
        Protocol::Tcp,
    );
    engine.set_pod(web);
    engine.set_pod(mk_pod("client", "client", "10.0.0.2"));
    engine.set_pod(mk_pod("other", "other", "10.0.0.3"));
    engine.set_policy(mk_policy(
        "web-http",
        Mode::Enforce,
        named(Protocol::Tcp, "http"),
    ));
    engine.set_policy(mk_policy("web-443", Mode::Monitor, tcp(443)));

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
    if let Some(ns) = ScratchNetns::new("nwrt-engine") {
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
