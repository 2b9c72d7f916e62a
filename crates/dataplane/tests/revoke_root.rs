//! Revocation against the real kernel (SPEC 5, "Revocation"), both backends, IPv4 and IPv6,
//! ingress and egress: live connections that a new ruleset denies stop passing packets within
//! 1 s of the apply once their conntrack entries are deleted ([`conntrack::revoke`], judged by
//! [`netwarden_engine::judge`]); the ones still allowed keep passing; with `keep` (no
//! revocation) the denied ones pass on.
//!
//! ```text
//!   peer (eth0 10.241.0.2, fd41::2) ──veth── (eth0 10.241.0.1, fd41::1) pod
//! ```
//!
//! The pod is isolated in both directions. Before: ingress TCP 8080, 9090 and UDP 7000 from
//! the peer, egress TCP 6060, 5050 to it. After: ingress TCP 8080, egress TCP 6060 only.
//! The revoked TCP connections leave tombstones that a second revocation leaves alone.
//!
//! A second case isolates the pod in ingress only and lets the **pod** speak first after the
//! revocation: deleting the entry alone let that connection live on (the kernel picked it up
//! again with the pod as originator, through the open egress); the tombstone ends it, and a new
//! connection from the same ports is judged, and refused, by the rules.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use netwarden_dataplane::conntrack::{self, DumpFilter};
use netwarden_dataplane::iptables_apply::IptablesDataplane;
use netwarden_dataplane::{ApplyOutcome, Dataplane, Netns, NftDataplane};
use netwarden_engine::testing::{
    interface, pod_with_interfaces, pods_with, port, rule, selector, tcp,
};
use netwarden_engine::{
    judge, Engine, EngineOptions, NetworkId, PodKey, PodRules, Policy, PolicyKind, PolicyRule,
    Protocol, TrackedFlow,
};
use netwarden_render::RenderOptions;
use netwarden_testing::{
    in_netns, listen, pin_neighbours, root_or_skip, udp_flow, veth, Namespaces,
};

const POD_V4: &str = "10.241.0.1";
const PEER_V4: &str = "10.241.0.2";
const POD_V6: &str = "fd41::1";
const PEER_V6: &str = "fd41::2";

/// How long a revoked connection may still pass packets (SPEC 5).
const WITHIN: Duration = Duration::from_secs(1);

struct Topology {
    _namespaces: Namespaces,
    pod: PathBuf,
    peer: PathBuf,
}

fn topology(tag: &str) -> Topology {
    let mut namespaces = Namespaces::new(&format!("nwrvk{tag}"));
    let (pod, peer) = (namespaces.create("p"), namespaces.create("q"));
    veth(
        &pod,
        "eth0",
        &[&format!("{POD_V4}/24"), &format!("{POD_V6}/64")],
        &peer,
        "eth0",
        &[&format!("{PEER_V4}/24"), &format!("{PEER_V6}/64")],
    );
    pin_neighbours(&pod, "eth0", &peer, "eth0");
    Topology {
        _namespaces: namespaces,
        pod,
        peer,
    }
}

fn udp(protocol_port: u16) -> netwarden_engine::PolicyPort {
    port(Protocol::Udp, Some(protocol_port), None)
}

/// The pod's rules: ingress and egress allowing `ingress`/`egress` with the peer.
fn pod_rules(
    ingress: Vec<netwarden_engine::PolicyPort>,
    egress: Vec<netwarden_engine::PolicyPort>,
) -> PodRules {
    let mut engine = Engine::new(EngineOptions::default());
    engine.set_pod(pod_with_interfaces(
        "ns",
        "pod",
        &[("app", "web")],
        vec![interface("eth0", NetworkId::Primary, &[POD_V4, POD_V6])],
    ));
    engine.set_pod(pod_with_interfaces(
        "ns",
        "peer",
        &[("app", "peer")],
        vec![interface("eth0", NetworkId::Primary, &[PEER_V4, PEER_V6])],
    ));
    let with_peer =
        |ports| -> Vec<PolicyRule> { vec![rule(vec![pods_with(&[("app", "peer")])], ports)] };
    engine.set_policy(Policy {
        ingress: Some(with_peer(ingress)),
        egress: Some(with_peer(egress)),
        ..netwarden_engine::testing::policy(
            PolicyKind::NetworkPolicy,
            "ns",
            "web",
            selector(&[("app", "web")]),
            None,
            None,
        )
    });
    engine.pod_rules(&PodKey::new("ns", "pod")).unwrap()
}

fn before() -> PodRules {
    pod_rules(
        vec![tcp(8080), tcp(9090), udp(7000)],
        vec![tcp(6060), tcp(5050)],
    )
}

fn after() -> PodRules {
    pod_rules(vec![tcp(8080)], vec![tcp(6060)])
}

fn addr(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// A live TCP connection: `initiator` connected from its netns to `responder`'s listener.
struct Live {
    what: String,
    initiator: TcpStream,
    responder: TcpStream,
}

fn live(what: &str, from: &Path, to: &Path, to_ip: &str, port: u16) -> Live {
    let target = addr(to_ip, port);
    let listener = listen(to, &target);
    let t = target.clone();
    let initiator = in_netns(from, move || TcpStream::connect(t.as_str()))
        .unwrap_or_else(|e| panic!("{what}: connect {target}: {e}"));
    let (responder, _) = listener.accept().unwrap();
    for s in [&initiator, &responder] {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        s.set_nodelay(true).unwrap();
    }
    Live {
        what: what.into(),
        initiator,
        responder,
    }
}

impl Live {
    /// One round trip, each side writing first in turn.
    fn round_trip(&mut self) -> std::io::Result<()> {
        let mut buf = [0u8; 4];
        self.initiator.write_all(b"ping")?;
        self.responder.read_exact(&mut buf)?;
        self.responder.write_all(b"pong")?;
        self.initiator.read_exact(&mut buf)?;
        Ok(())
    }

    fn assert_passes(&mut self, when: &str) {
        self.round_trip()
            .unwrap_or_else(|e| panic!("{} {when}: should pass: {e}", self.what));
    }

    /// The initiator writes; the connection must be reset within [`WITHIN`], the responder
    /// never sees the bytes. Returns how long the reset took.
    fn assert_revoked(&mut self) -> Duration {
        let start = Instant::now();
        let mut reset = None;
        while start.elapsed() < WITHIN {
            let mut buf = [0u8; 4];
            let r = self
                .initiator
                .write_all(b"ping")
                .and_then(|()| self.initiator.read(&mut buf));
            match r {
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => {
                    reset = Some((e, start.elapsed()));
                    break;
                }
                Ok(n) => panic!("{}: {n} bytes came back after the revocation", self.what),
            }
        }
        let (e, took) = reset
            .unwrap_or_else(|| panic!("{}: still open {WITHIN:?} after the revocation", self.what));
        assert!(
            matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe),
            "{}: {e}",
            self.what
        );
        let mut buf = [0u8; 64];
        match self.responder.read(&mut buf) {
            Ok(n) if n > 0 => panic!(
                "{}: the responder got {n} bytes after the revocation",
                self.what
            ),
            _ => {}
        }
        took
    }
}

fn revoke(ns: &Path, rules: &PodRules) -> conntrack::Revoked {
    let rules = rules.clone();
    conntrack::revoke(
        &Netns::open(ns).unwrap(),
        vec![DumpFilter::All],
        move |f: &TrackedFlow| judge(&rules, f).is_denied(),
    )
    .unwrap()
}

/// Every case for one backend and family; `revoke_on`: `--established=revoke` (else `keep`).
fn scenario<D: Dataplane>(dp: D, tag: &str, v6: bool, revoke_on: bool) {
    scenario_with(dp, tag, v6, revoke_on, true);
}

/// [`scenario`], with the kernel's TCP mid-stream pickup (`nf_conntrack_tcp_loose`, per netns)
/// on or off in the pod netns. Off, a revoked connection's next packet is `invalid` instead of
/// `new`: the rules must still see it and reject it with a reset, not drop it silently.
fn scenario_with<D: Dataplane>(mut dp: D, tag: &str, v6: bool, revoke_on: bool, loose: bool) {
    let topo = topology(tag);
    let (p, q) = (topo.pod.clone(), topo.peer.clone());
    let (pod_ip, peer_ip) = if v6 {
        (POD_V6, PEER_V6)
    } else {
        (POD_V4, PEER_V4)
    };
    let before_rules = dp.render(&before()).unwrap();
    assert_eq!(dp.apply(&p, &before_rules).unwrap(), ApplyOutcome::Applied);
    if !loose {
        // The sysctl exists in the netns once a rule there uses conntrack (the apply above).
        let out = netwarden_testing::run_in(
            &p,
            "sysctl",
            &["-w", "net.netfilter.nf_conntrack_tcp_loose=0"],
        );
        assert!(out.status.success(), "{out:?}");
    }

    let mut in_kept = live("ingress 8080 (kept)", &q, &p, pod_ip, 8080);
    let mut in_denied = live("ingress 9090 (denied)", &q, &p, pod_ip, 9090);
    let mut out_kept = live("egress 6060 (kept)", &p, &q, peer_ip, 6060);
    let mut out_denied = live("egress 5050 (denied)", &p, &q, peer_ip, 5050);
    let udp_in = udp_flow(&q, peer_ip, &p, pod_ip, 7000);
    for l in [&mut in_kept, &mut in_denied, &mut out_kept, &mut out_denied] {
        l.assert_passes("before");
    }
    assert!(udp_in.passes(), "UDP 7000 before");

    let after_rules = dp.render(&after()).unwrap();
    let start = Instant::now();
    assert_eq!(dp.apply(&p, &after_rules).unwrap(), ApplyOutcome::Applied);
    if !revoke_on {
        // `keep`: established traffic is accepted before any rule, the denied ones pass on.
        in_denied.assert_passes("after, kept");
        out_denied.assert_passes("after, kept");
        assert!(udp_in.passes(), "UDP 7000 after, kept");
        return;
    }
    let revoked = revoke(&p, &after());
    let applied_and_revoked = start.elapsed();
    let mut flows: Vec<(u8, u16)> = revoked
        .flows
        .iter()
        .map(|f| (f.protocol, f.dport))
        .collect();
    flows.sort();
    assert_eq!(flows, [(6, 5050), (6, 9090), (17, 7000)], "{revoked:?}");
    assert_eq!(revoked.deleted, 3, "{revoked:?}");
    // The revoked TCP connections left tombstones, which a later revocation leaves alone.
    let listed = Netns::open(&p)
        .unwrap()
        .run(|| conntrack::list_here(DumpFilter::All))
        .unwrap()
        .unwrap();
    let mut tombstones: Vec<u16> = listed
        .iter()
        .filter(|c| c.is_tombstone())
        .map(|c| c.flow.dport)
        .collect();
    tombstones.sort();
    assert_eq!(tombstones, [5050, 9090], "{listed:#?}");
    let again = revoke(&p, &after());
    assert!(again.flows.is_empty(), "{again:?}");
    in_kept.assert_passes("after");
    out_kept.assert_passes("after");
    let t_in = in_denied.assert_revoked();
    let t_out = out_denied.assert_revoked();
    assert!(!udp_in.passes(), "UDP 7000 passes after the revocation");
    in_kept.assert_passes("at the end");
    out_kept.assert_passes("at the end");
    eprintln!(
        "{tag}: apply+revoke {:.1} ms ({} listed); reset after the next write: ingress {:.1} ms, egress {:.1} ms",
        applied_and_revoked.as_secs_f64() * 1e3,
        revoked.listed,
        t_in.as_secs_f64() * 1e3,
        t_out.as_secs_f64() * 1e3
    );
}

#[test]
fn nft_revokes_denied_connections_v4() {
    if root_or_skip() {
        scenario(
            NftDataplane::new(RenderOptions::default()),
            "n4",
            false,
            true,
        );
    }
}

#[test]
fn nft_revokes_denied_connections_v6() {
    if root_or_skip() {
        scenario(
            NftDataplane::new(RenderOptions::default()),
            "n6",
            true,
            true,
        );
    }
}

#[test]
fn iptables_revokes_denied_connections_v4() {
    if root_or_skip() {
        scenario(
            IptablesDataplane::new(RenderOptions::default()),
            "i4",
            false,
            true,
        );
    }
}

#[test]
fn iptables_revokes_denied_connections_v6() {
    if root_or_skip() {
        scenario(
            IptablesDataplane::new(RenderOptions::default()),
            "i6",
            true,
            true,
        );
    }
}

#[test]
fn revoked_packets_are_rejected_with_tcp_pickup_off() {
    if root_or_skip() {
        scenario_with(
            NftDataplane::new(RenderOptions::default()),
            "l4",
            false,
            true,
            false,
        );
        scenario_with(
            IptablesDataplane::new(RenderOptions::default()),
            "l6",
            true,
            true,
            false,
        );
    }
}

/// A revocation scoped to the peers a change lost asks the kernel for their connections only
/// (a filtered dump, `CTA_FILTER`; IPv6 by family): listing by original source or destination
/// returns exactly those, and a pass scoped to the IPv6 peer ends its denied connection while
/// the IPv4 one, denied by the same rules but outside the scope, is not even listed. (What makes the scope
/// sound is proven in `engine/tests/revocation_scope.rs`; here, that the kernel filters.)
#[test]
fn a_scoped_revocation_lists_only_the_lost_peers_connections() {
    if !root_or_skip() {
        return;
    }
    use netwarden_engine::revocation::RevocationScope;
    use netwarden_engine::AddrSet;
    let topo = topology("s");
    let (p, q) = (topo.pod.clone(), topo.peer.clone());
    let mut dp = NftDataplane::new(RenderOptions::default());
    let before_rules = dp.render(&before()).unwrap();
    dp.apply(&p, &before_rules).unwrap();
    let mut v4 = live("ingress 9090 v4", &q, &p, POD_V4, 9090);
    let mut v6 = live("ingress 9090 v6", &q, &p, POD_V6, 9090);
    let mut out_v4 = live("egress 5050 v4", &p, &q, PEER_V4, 5050);
    for l in [&mut v4, &mut v6, &mut out_v4] {
        l.assert_passes("before");
    }
    let list = |filter: DumpFilter| {
        let mut flows: Vec<(String, String, u16)> = Netns::open(&p)
            .unwrap()
            .run(move || conntrack::list_here(filter))
            .unwrap()
            .unwrap()
            .into_iter()
            .map(|c| (c.flow.src.to_string(), c.flow.dst.to_string(), c.flow.dport))
            .collect();
        flows.sort();
        flows
    };
    let peer_v6: std::net::IpAddr = PEER_V6.parse().unwrap();
    let peer_v4: std::net::IpAddr = PEER_V4.parse().unwrap();
    assert_eq!(
        list(DumpFilter::OrigSource(peer_v4)),
        vec![(PEER_V4.to_string(), POD_V4.to_string(), 9090)]
    );
    assert_eq!(
        list(DumpFilter::OrigDestination(peer_v4)),
        vec![(POD_V4.to_string(), PEER_V4.to_string(), 5050)]
    );
    // IPv6: the family's entries (the kernel's IPv6 filter is inverted, see `dump_request`).
    assert_eq!(
        list(DumpFilter::OrigSource(peer_v6)),
        vec![(PEER_V6.to_string(), POD_V6.to_string(), 9090)]
    );
    assert!(list(DumpFilter::All).len() >= 3);

    let after_rules = dp.render(&after()).unwrap();
    dp.apply(&p, &after_rules).unwrap();
    let scope = RevocationScope::Peers {
        ingress: AddrSet::from_addrs([peer_v6]),
        egress: AddrSet::new(),
    };
    let revoked = NftDataplane::revoke_connections(&p, &after(), &scope).unwrap();
    assert_eq!(revoked.listed, 1, "{revoked:?}");
    assert_eq!(revoked.flows.len(), 1, "{revoked:?}");
    v6.assert_revoked();
    v4.assert_passes("outside the scope");
    out_v4.assert_passes("outside the scope");
    // Nothing in scope: no dump at all.
    let none = NftDataplane::revoke_connections(&p, &after(), &RevocationScope::Nothing).unwrap();
    assert_eq!(none, conntrack::Revoked::default());
    // The whole table: the IPv4 connections the rules deny go too.
    let all = NftDataplane::revoke_connections(&p, &after(), &RevocationScope::Everything).unwrap();
    assert_eq!(all.flows.len(), 2, "{all:?}");
    v4.assert_revoked();
    out_v4.assert_revoked();
}

#[test]
fn keep_leaves_established_connections_alone() {
    if root_or_skip() {
        scenario(
            NftDataplane::new(RenderOptions::default()),
            "k4",
            false,
            false,
        );
        scenario(
            IptablesDataplane::new(RenderOptions::default()),
            "k6",
            true,
            false,
        );
    }
}

/// The pod is isolated in ingress only (its egress is open), and after the revocation the
/// **pod** speaks first on the revoked connection. Its packet finds no conntrack entry and
/// leaves through the open egress: the kernel's mid-stream pickup would track the connection
/// anew with the pod as its originator, and the peer's packets, now replies, would be accepted
/// as established — the connection would survive. The revocation leaves a tombstone in the
/// entry's place so that it cannot (see `conntrack`'s module doc).
fn pod_speaks_first<D: Dataplane>(mut dp: D, tag: &str, v6: bool) {
    let topo = topology(tag);
    let (p, q) = (topo.pod.clone(), topo.peer.clone());
    let pod_ip = if v6 { POD_V6 } else { POD_V4 };
    let ingress_only = |ports| {
        let mut r = pod_rules(ports, vec![]);
        r.interfaces[0].egress = netwarden_engine::DirectionRules::open();
        r
    };
    let before = ingress_only(vec![tcp(8080), tcp(9090)]);
    let after = ingress_only(vec![tcp(8080)]);
    assert_eq!(
        dp.apply(&p, &dp.render(&before).unwrap()).unwrap(),
        ApplyOutcome::Applied
    );
    let mut kept = live("ingress 8080 (kept)", &q, &p, pod_ip, 8080);
    let mut denied = live("ingress 9090 (denied)", &q, &p, pod_ip, 9090);
    kept.assert_passes("before");
    denied.assert_passes("before");
    assert_eq!(
        dp.apply(&p, &dp.render(&after).unwrap()).unwrap(),
        ApplyOutcome::Applied
    );
    let revoked = revoke(&p, &after);
    assert_eq!(revoked.flows.len(), 1, "{revoked:?}");
    // The pod (the responder) writes first, then the peer answers.
    let start = Instant::now();
    let mut dead = None;
    while start.elapsed() < WITHIN {
        let mut buf = [0u8; 4];
        let r = denied
            .responder
            .write_all(b"push")
            .and_then(|()| denied.initiator.read_exact(&mut buf))
            .and_then(|()| denied.initiator.write_all(b"back"))
            .and_then(|()| denied.responder.read_exact(&mut buf));
        match r {
            Ok(()) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => {
                dead = Some((e, start.elapsed()));
                break;
            }
        }
    }
    let (e, took) = dead.unwrap_or_else(|| {
        panic!(
            "{tag}: the revoked connection still passes {WITHIN:?} after, the pod speaking first"
        )
    });
    kept.assert_passes("after");
    // The refused peer opens a new connection on the very same ports: the rules judge it.
    let local = denied.initiator.local_addr().unwrap();
    drop(denied);
    let target = addr(pod_ip, 9090);
    let again = in_netns(&q, move || reuse_connect(local, target.parse().unwrap()));
    assert!(
        again.is_err(),
        "{tag}: a new connection on the revoked ports got through"
    );
    eprintln!(
        "{tag}: pod spoke first; the revoked connection failed after {:.1} ms ({e})",
        took.as_secs_f64() * 1e3
    );
}

#[test]
fn nft_pod_speaking_first_does_not_revive_a_revoked_connection() {
    if root_or_skip() {
        pod_speaks_first(NftDataplane::new(RenderOptions::default()), "f4", false);
        pod_speaks_first(NftDataplane::new(RenderOptions::default()), "f6", true);
    }
}

#[test]
fn iptables_pod_speaking_first_does_not_revive_a_revoked_connection() {
    if root_or_skip() {
        pod_speaks_first(
            IptablesDataplane::new(RenderOptions::default()),
            "g4",
            false,
        );
        pod_speaks_first(IptablesDataplane::new(RenderOptions::default()), "g6", true);
    }
}

/// A TCP connection from `local` (bound with `SO_REUSEADDR`) to `to`, within 1 s.
fn reuse_connect(
    local: std::net::SocketAddr,
    to: std::net::SocketAddr,
) -> std::io::Result<TcpStream> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrStorage};
    use std::os::fd::AsRawFd;
    let family = if local.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = nix::sys::socket::socket(family, SockType::Stream, SockFlag::empty(), None)?;
    nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReuseAddr, &true)?;
    // A refusal is a reset; a drop would hang: give up after 1 s.
    let second = nix::sys::time::TimeVal::new(1, 0);
    nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::SendTimeout, &second)?;
    nix::sys::socket::bind(fd.as_raw_fd(), &SockaddrStorage::from(local))?;
    nix::sys::socket::connect(fd.as_raw_fd(), &SockaddrStorage::from(to))?;
    Ok(TcpStream::from(fd))
}

/// What a revocation costs with a large table: 5,000 tracked UDP flows in the pod netns, one
/// dump judging them all while none is denied (the cost every changed netns pays), then one
/// that denies and deletes them all. Prints the figures; bounds them loosely.
#[test]
fn revocation_cost_with_a_large_table() {
    if !root_or_skip() {
        return;
    }
    const FLOWS: u16 = 5_000;
    let topo = topology("c4");
    let (p, q) = (topo.pod.clone(), topo.peer.clone());
    let mut dp = NftDataplane::new(RenderOptions::default());
    let open = pod_rules(vec![udp(7000)], vec![tcp(6060)]);
    assert_eq!(
        dp.apply(&p, &dp.render(&open).unwrap()).unwrap(),
        ApplyOutcome::Applied
    );
    let _server = in_netns(&p, || UdpSocket::bind(format!("{POD_V4}:7000")).unwrap());
    let target = format!("{POD_V4}:7000");
    in_netns(&q, move || {
        for i in 0..FLOWS {
            let s = UdpSocket::bind(format!("{PEER_V4}:{}", 20_000 + i)).unwrap();
            s.send_to(b"x", target.as_str()).unwrap();
        }
    });
    let count = || {
        Netns::open(&p)
            .unwrap()
            .run(|| conntrack::list_here(DumpFilter::All))
            .unwrap()
            .unwrap()
            .len()
    };
    assert!(count() >= usize::from(FLOWS), "{} tracked", count());
    let start = Instant::now();
    let none = revoke(&p, &open);
    let judged = start.elapsed();
    assert!(
        none.flows.is_empty() && none.listed >= usize::from(FLOWS),
        "{none:?}"
    );
    let closed = pod_rules(vec![tcp(8080)], vec![tcp(6060)]);
    let start = Instant::now();
    let all = revoke(&p, &closed);
    let deleted = start.elapsed();
    assert_eq!(all.deleted, usize::from(FLOWS));
    assert!(count() < 10, "{} left", count());
    eprintln!(
        "{FLOWS} tracked flows: dump + judge, none denied {:.1} ms; dump + judge + delete all {:.1} ms",
        judged.as_secs_f64() * 1e3,
        deleted.as_secs_f64() * 1e3
    );
    assert!(judged < Duration::from_secs(2) && deleted < Duration::from_secs(10));
}
