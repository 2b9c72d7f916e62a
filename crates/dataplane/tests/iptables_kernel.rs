//! The iptables backend against the real kernel: three throwaway network namespaces joined by
//! veth pairs, real TCP connections over IPv4 and IPv6.
//!
//! ```text
//!   client-b (eth0 10.231.0.2, fd31::2) ──veth── (eth0 10.231.0.1, fd31::1) server
//!   client-c (eth0 10.232.0.2)          ──veth── (net1 10.232.0.1)           server
//! ```
//!
//! Rules come from the engine (pods and policies built by hand) through the iptables renderer
//! and are applied with [`IptablesDataplane`] into the server's netns only.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use netwarden_dataplane::apply::{ApplyOutcome, Dataplane};
use netwarden_dataplane::iptables_apply::{
    iptables_variant, IptablesDataplane, IptablesRulesetRef,
};
use netwarden_dataplane::netns::{self, create_named, delete_named, exec_in, run_in};
use netwarden_engine::{
    Engine, EngineOptions, LabelSelector, Mode, NetworkId, ObjectKey, Peer, Pod, PodInterface,
    PodKey, Policy, PolicyKind, PolicyPort, PolicyRule, PolicyScope, PortRef, Protocol,
};
use netwarden_render::RenderOptions;

fn root_or_skip() -> bool {
    if netns::is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "these tests need root in CI"
    );
    eprintln!("skipped: needs root");
    false
}

/// Named namespaces deleted on drop (their veth ends go with them), even when a test fails.
struct Topology {
    names: Vec<String>,
    server: PathBuf,
    client_b: PathBuf,
    client_c: PathBuf,
}

impl Drop for Topology {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = delete_named(n);
        }
    }
}

fn ip(ns: &Path, args: &[&str]) {
    exec_in(ns, "ip", args, None).unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
}

fn topology(tag: &str) -> Topology {
    let base = format!("nwipt-{tag}-{}", std::process::id());
    let names: Vec<String> = ["s", "b", "c"]
        .iter()
        .map(|s| format!("{base}-{s}"))
        .collect();
    let mut topo = Topology {
        names: Vec::new(),
        server: PathBuf::new(),
        client_b: PathBuf::new(),
        client_c: PathBuf::new(),
    };
    let mut paths = Vec::new();
    for n in &names {
        paths.push(create_named(n).unwrap());
        topo.names.push(n.clone());
    }
    topo.server = paths[0].clone();
    topo.client_b = paths[1].clone();
    topo.client_c = paths[2].clone();
    let (s, b, c) = (&topo.server, &topo.client_b, &topo.client_c);
    // Both veth pairs are created inside the server netns with the peer end placed straight
    // into the client netns: the root namespace never holds a link.
    ip(
        s,
        &[
            "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", &names[1],
        ],
    );
    ip(
        s,
        &[
            "link", "add", "net1", "type", "veth", "peer", "name", "eth0", "netns", &names[2],
        ],
    );
    let ends = [
        (s, "eth0", "10.231.0.1", Some("fd31::1")),
        (s, "net1", "10.232.0.1", None),
        (b, "eth0", "10.231.0.2", Some("fd31::2")),
        (c, "eth0", "10.232.0.2", None),
    ];
    for (ns, dev, v4, v6) in ends {
        ip(ns, &["addr", "add", &format!("{v4}/24"), "dev", dev]);
        if let Some(v6) = v6 {
            ip(
                ns,
                &["addr", "add", &format!("{v6}/64"), "dev", dev, "nodad"],
            );
        }
        ip(ns, &["link", "set", dev, "up"]);
        ip(ns, &["link", "set", "lo", "up"]);
    }
    // Static neighbours: the kernel's neighbour tables are shared by every netns of the host
    // and count entries globally (gc_thresh3), so a busy host (other labs, many namespaces) can
    // refuse new dynamic ARP/ND entries; permanent entries are exempt from that limit.
    for (a, b) in [(0, 2), (2, 0), (1, 3), (3, 1)] {
        let (ns, dev, _, _) = ends[a];
        let (peer_ns, peer_dev, peer_v4, peer_v6) = ends[b];
        let mac = mac_of(peer_ns, peer_dev);
        for addr in std::iter::once(peer_v4).chain(peer_v6) {
            ip(
                ns,
                &[
                    "neigh",
                    "replace",
                    addr,
                    "lladdr",
                    &mac,
                    "dev",
                    dev,
                    "nud",
                    "permanent",
                ],
            );
        }
    }
    topo
}

fn mac_of(ns: &Path, dev: &str) -> String {
    let out = exec_in(ns, "ip", &["-j", "link", "show", "dev", dev], None).unwrap();
    let links: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    links[0]["address"]
        .as_str()
        .expect("link address")
        .to_string()
}

fn listen(ns: &Path, addr: &str) -> TcpListener {
    let addr: SocketAddr = addr.parse().unwrap();
    run_in(ns, move || TcpListener::bind(addr))
        .unwrap()
        .unwrap()
}

/// Connects from inside `ns`; `Ok(())` when the handshake completes (the listener's backlog
/// completes it without `accept`).
fn connect(ns: &Path, addr: &str) -> Result<(), std::io::Error> {
    let addr: SocketAddr = addr.parse().unwrap();
    run_in(ns, move || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(3)).map(drop)
    })
    .unwrap()
}

fn assert_connects(ns: &Path, addr: &str) {
    if let Err(e) = connect(ns, addr) {
        panic!("connection to {addr} failed: {e}");
    }
}

/// Refused fast: a TCP reset, not a timeout.
fn assert_refused(ns: &Path, addr: &str) {
    let start = Instant::now();
    match connect(ns, addr) {
        Ok(()) => panic!("connection to {addr} succeeded"),
        Err(e) => {
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::ConnectionRefused,
                "{addr}: {e}"
            );
            assert!(
                start.elapsed() < Duration::from_secs(1),
                "{addr}: slow refusal"
            );
        }
    }
}

fn sel(app: &str) -> LabelSelector {
    LabelSelector {
        match_labels: [("app".to_string(), app.to_string())].into(),
        match_expressions: Vec::new(),
    }
}

fn iface(name: &str, network: NetworkId, ips: &[&str]) -> PodInterface {
    PodInterface {
        name: name.into(),
        network,
        ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
        prefix_lens: ips
            .iter()
            .map(|s| if s.contains(':') { 64 } else { 24 })
            .collect(),
    }
}

fn pod(name: &str, app: &str, interfaces: Vec<PodInterface>) -> Pod {
    Pod {
        key: PodKey::new("ns", name),
        labels: sel(app).match_labels,
        host_network: false,
        container_ports: Vec::new(),
        interfaces,
        netns: None,
    }
}

fn policy(kind: PolicyKind, name: &str) -> Policy {
    Policy {
        kind,
        key: ObjectKey::new("ns", name),
        pod_selector: sel("web"),
        ingress: None,
        egress: None,
        scope: match kind {
            PolicyKind::DanmNetworkPolicy => PolicyScope::AllInterfaces,
            _ => PolicyScope::Primary,
        },
        mode: Mode::Enforce,
        replaces: None,
        log_denies: false,
    }
}

fn from(apps: &[&str], port: u16) -> PolicyRule {
    PolicyRule {
        peers: apps
            .iter()
            .map(|a| Peer::Pods {
                pod_selector: Some(sel(a)),
                namespace_selector: None,
                network_selector: None,
            })
            .collect(),
        ports: vec![PolicyPort {
            protocol: Protocol::Tcp,
            port: Some(PortRef::Number(port)),
            end_port: None,
        }],
    }
}

/// The server's rules under `policies`, rendered for the iptables backend.
fn server_ruleset(policies: Vec<Policy>) -> IptablesRulesetRef {
    let mut engine = Engine::new(EngineOptions::default());
    engine.set_pod(pod(
        "server",
        "web",
        vec![
            iface("eth0", NetworkId::Primary, &["10.231.0.1", "fd31::1"]),
            iface("net1", NetworkId::nad("ns", "data"), &["10.232.0.1"]),
        ],
    ));
    engine.set_pod(pod(
        "client-b",
        "client",
        vec![iface(
            "eth0",
            NetworkId::Primary,
            &["10.231.0.2", "fd31::2"],
        )],
    ));
    engine.set_pod(pod(
        "client-c",
        "other",
        vec![iface("eth0", NetworkId::Primary, &["10.232.0.2"])],
    ));
    for p in policies {
        engine.set_policy(p);
    }
    let rules = engine.pod_rules(&PodKey::new("ns", "server")).unwrap();
    IptablesDataplane::new(RenderOptions::default())
        .render(&rules)
        .unwrap()
}

fn our_sets(ns: &Path) -> Vec<String> {
    let out = exec_in(ns, "ipset", &["list", "-n"], None).unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|n| netwarden_render::iptables::is_owned_set(n))
        .map(str::to_string)
        .collect()
}

#[test]
fn iptables_backend_enforces_updates_and_removes() {
    if !root_or_skip() {
        return;
    }
    eprintln!("iptables variant: {:?}", iptables_variant().unwrap());
    let topo = topology("e2e");
    let (s, b, c) = (
        topo.server.clone(),
        topo.client_b.clone(),
        topo.client_c.clone(),
    );
    let _l = [
        listen(&s, "10.231.0.1:8080"),
        listen(&s, "10.231.0.1:9090"),
        listen(&s, "10.232.0.1:8080"),
        listen(&s, "10.232.0.1:9090"),
        listen(&s, "[fd31::1]:8080"),
        listen(&s, "[fd31::1]:9090"),
        listen(&b, "10.231.0.2:7070"),
    ];
    let mut dp = IptablesDataplane::new(RenderOptions::default());

    // Before any rule: everything connects.
    assert_connects(&b, "10.231.0.1:9090");

    // 1. DanmNetworkPolicy isolating every interface: only app=client on 8080.
    let mut danm = policy(PolicyKind::DanmNetworkPolicy, "danm");
    danm.ingress = Some(vec![from(&["client"], 8080)]);
    let first = server_ruleset(vec![danm.clone()]);
    assert_eq!(dp.apply(&s, &first).unwrap(), ApplyOutcome::Applied);
    assert_connects(&b, "10.231.0.1:8080");
    assert_refused(&b, "10.231.0.1:9090");
    assert_connects(&b, "[fd31::1]:8080");
    assert_refused(&b, "[fd31::1]:9090");
    assert_refused(&c, "10.232.0.1:8080");
    let sets_before = our_sets(&s);
    assert_eq!(sets_before.len(), 2, "one set per family: {sets_before:?}");
    let read = dp.read_back(&s).unwrap().expect("rules present");
    assert!(
        read.contains(":DANM_INGRESS_V4") && read.contains(":DANM_INGRESS_V6"),
        "{read}"
    );
    assert!(read.contains("-A INPUT -j DANM_INGRESS_V4"), "{read}");

    // 2. Identical re-apply: nothing sent.
    assert_eq!(dp.apply(&s, &first).unwrap(), ApplyOutcome::Unchanged);

    // 3. Peers change: client-c is now allowed too. New set, old one destroyed.
    danm.ingress = Some(vec![from(&["client", "other"], 8080)]);
    assert_eq!(
        dp.apply(&s, &server_ruleset(vec![danm])).unwrap(),
        ApplyOutcome::Applied
    );
    assert_connects(&c, "10.232.0.1:8080");
    assert_refused(&c, "10.232.0.1:9090");
    assert_connects(&b, "10.231.0.1:8080");
    let sets_after = our_sets(&s);
    assert_eq!(sets_after.len(), 2, "{sets_after:?}");
    assert_ne!(sets_before, sets_after, "the v4 set was replaced");
    assert!(sets_after.contains(
        &sets_before
            .iter()
            .find(|n| n.starts_with("nw6-"))
            .unwrap()
            .clone()
    ));

    // 4. A NetworkPolicy isolates the primary interface only: net1 passes untouched; egress
    //    isolated with no rule: the server's own connections are refused fast (RST in OUTPUT).
    let mut np = policy(PolicyKind::NetworkPolicy, "np");
    np.ingress = Some(vec![from(&["client"], 8080)]);
    np.egress = Some(vec![]);
    assert_eq!(
        dp.apply(&s, &server_ruleset(vec![np])).unwrap(),
        ApplyOutcome::Applied
    );
    assert_connects(&c, "10.232.0.1:9090");
    assert_refused(&b, "10.231.0.1:9090");
    assert_connects(&b, "10.231.0.1:8080");
    assert_refused(&s, "10.231.0.2:7070");

    // 5. Monitor only: nothing is blocked, the would-deny log rule sees the new connection.
    let mut mon = policy(PolicyKind::NetworkPolicy, "preview");
    mon.mode = Mode::Monitor;
    mon.ingress = Some(vec![from(&["client"], 8080)]);
    assert_eq!(
        dp.apply(&s, &server_ruleset(vec![mon])).unwrap(),
        ApplyOutcome::Applied
    );
    assert_connects(&b, "10.231.0.1:9090");
    let counters = exec_in(&s, "iptables-save", &["-c", "-t", "filter"], None).unwrap();
    let counters = String::from_utf8_lossy(&counters.stdout);
    let nflog = counters
        .lines()
        .find(|l| l.contains("NFLOG") && l.contains("nw:wd:"))
        .expect(&counters);
    assert!(
        !nflog.starts_with("[0:"),
        "would-deny rule matched: {nflog}"
    );

    // 6. The pod is no longer selected: the empty ruleset is a removal.
    let open = server_ruleset(vec![]);
    assert!(open.is_none());
    assert_eq!(dp.apply(&s, &open).unwrap(), ApplyOutcome::Removed);
    assert_eq!(dp.read_back(&s).unwrap(), None);
    assert!(our_sets(&s).is_empty());
    assert_connects(&b, "10.231.0.1:9090");
    assert_connects(&s, "10.231.0.2:7070");

    // 7. remove() is idempotent, and succeeds for a netns that is gone.
    dp.remove(&s).unwrap();
    dp.remove(Path::new("/run/netns/nwipt-does-not-exist"))
        .unwrap();
}

#[test]
fn failed_restore_keeps_old_rules_and_forces_full_resync() {
    if !root_or_skip() {
        return;
    }
    let topo = topology("fail");
    let (s, b) = (topo.server.clone(), topo.client_b.clone());
    let _l = [listen(&s, "10.231.0.1:8080"), listen(&s, "10.231.0.1:9090")];
    let mut dp = IptablesDataplane::new(RenderOptions::default());
    let mut danm = policy(PolicyKind::DanmNetworkPolicy, "danm");
    danm.ingress = Some(vec![from(&["client"], 8080)]);
    let good = server_ruleset(vec![danm]);
    assert_eq!(dp.apply(&s, &good).unwrap(), ApplyOutcome::Applied);

    // A v4 text the kernel refuses: the restore fails as a whole, the old table stays.
    let mut bad = (*good.clone().unwrap()).clone();
    bad.v4 = format!(
        "{}-A NO_SUCH_CHAIN -j ACCEPT\nCOMMIT\n",
        bad.v4.trim_end_matches("COMMIT\n")
    );
    assert!(dp.apply(&s, &Some(std::sync::Arc::new(bad))).is_err());
    assert_connects(&b, "10.231.0.1:8080");
    assert_refused(&b, "10.231.0.1:9090");
    // The failure forgot the netns: the good ruleset is sent again in full.
    assert_eq!(dp.apply(&s, &good).unwrap(), ApplyOutcome::Applied);
    assert_eq!(dp.apply(&s, &good).unwrap(), ApplyOutcome::Unchanged);
    dp.remove(&s).unwrap();
    assert_eq!(dp.read_back(&s).unwrap(), None);
}
