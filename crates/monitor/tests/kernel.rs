//! Real-kernel tests of the NFLOG listeners, in network namespaces these tests create.
//!
//! Topology: a "pod" netns logging with nft rules like netwarden's (`log group 100 prefix
//! "nw:..."`, no rejection) and a "client" netns joined to it by a veth pair. Traffic only goes
//! to addresses inside these namespaces. Namespaces are deleted by a Drop guard, also on failure.
//!
//! Needs root and `nft`/`ip`: without root the tests fail when CI=true and skip otherwise.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use netwarden_engine::{Direction, NetworkId, ObjectKey, StagedCause};
use netwarden_monitor::{
    Collector, EventProcessor, L4Protocol, ListenerConfig, ListenerExit, MemorySink, Metrics,
    NflogError, NflogSocket, PodContext, RawRecord,
};
use netwarden_render::LogKeyInfo;
use netwarden_testing::{
    in_netns, pin_neighbours, root_or_skip, run_in_with_input, veth, Namespaces, ProcessStats,
};

/// A pod netns and a client netns joined by a veth pair on 198.18.<n>.0/24 and
/// fd00:6e77:<n>::/64 (pod .1/::1, client .2/::2), with the logging rules in the pod netns.
struct Pair {
    pod: PathBuf,
    client: PathBuf,
    pod_v4: IpAddr,
    pod_v6: IpAddr,
    client_v4: IpAddr,
    client_v6: IpAddr,
}

const RULES: &str = r#"
table inet nwmontest {
    chain input {
        type filter hook input priority 0; policy accept;
        tcp dport 9 ct state new log group 100 prefix "nw:wd:0000abcd "
        udp dport 9 log group 100 prefix "nw:dn:0000abcd "
    }
}
"#;

/// The pod netns `pod` and the client netns `client` (created by the first pair that names
/// it) of `namespaces`, joined as [`Pair`] says on subnet `subnet`.
fn pair(namespaces: &mut Namespaces, pod: &str, client: &str, subnet: u8) -> Pair {
    let pod = namespaces.create(pod);
    let client = match namespaces.path(client) {
        path if path.exists() => path,
        _ => namespaces.create(client),
    };
    let (pod_if, client_if) = (format!("vp{subnet}"), format!("vc{subnet}"));
    let v4 = |h: u8| format!("198.18.{subnet}.{h}");
    let v6 = |h: u8| format!("fd00:6e77:{subnet}::{h}");
    veth(
        &pod,
        &pod_if,
        &[&format!("{}/24", v4(1)), &format!("{}/64", v6(1))],
        &client,
        &client_if,
        &[&format!("{}/24", v4(2)), &format!("{}/64", v6(2))],
    );
    // The test is about logging, not address resolution.
    pin_neighbours(&pod, &pod_if, &client, &client_if);
    let out = run_in_with_input(&pod, "nft", &["-f", "-"], RULES.as_bytes());
    assert!(out.status.success(), "{out:?}");
    Pair {
        pod,
        client,
        pod_v4: v4(1).parse().unwrap(),
        pod_v6: v6(1).parse().unwrap(),
        client_v4: v4(2).parse().unwrap(),
        client_v6: v6(2).parse().unwrap(),
    }
}

fn context(pod: &str) -> PodContext {
    let info = LogKeyInfo {
        interface: "vp".into(),
        network: NetworkId::Primary,
        direction: Direction::Ingress,
        monitored_policies: vec![],
        monitored_admin: Vec::new(),
        enforced_admin: Vec::new(),
        enforced_policies: vec![],
        cause: StagedCause::NewIsolation,
    };
    PodContext {
        pod: ObjectKey::new("test", pod),
        node: "node-test".into(),
        log_keys: BTreeMap::from([(0x0000_abcd, info)]),
    }
}

/// From the client netns: one TCP connection attempt (a SYN, refused: nothing listens) and one
/// UDP datagram to port 9 of each pod address.
fn send_probes(client: &Path, targets: Vec<IpAddr>, sport: u16) {
    in_netns(client, move || {
        for addr in targets {
            let _ = TcpStream::connect_timeout(&SocketAddr::new(addr, 9), Duration::from_secs(2));
            let bind: SocketAddr = if addr.is_ipv4() {
                ([0, 0, 0, 0], sport).into()
            } else {
                ("::".parse::<IpAddr>().unwrap(), sport).into()
            };
            let udp = UdpSocket::bind(bind).unwrap();
            udp.send_to(b"hello", SocketAddr::new(addr, 9)).unwrap();
        }
    });
}

/// Receives until `done` holds for what was received, or `max` has passed.
fn collect_until(
    rx: &Receiver<RawRecord>,
    done: impl Fn(&[RawRecord]) -> bool,
    max: Duration,
) -> Vec<RawRecord> {
    let deadline = Instant::now() + max;
    let mut out = Vec::new();
    while !done(&out) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        if let Ok(r) = rx.recv_timeout(left) {
            out.push(r);
        }
    }
    out
}

/// One TCP and one UDP record towards each of `dsts` (a SYN may be retransmitted and logged
/// twice, so this is not a count).
fn probes_seen(records: &[RawRecord], dsts: &[IpAddr]) -> bool {
    dsts.iter().all(|dst| {
        [L4Protocol::Tcp, L4Protocol::Udp].iter().all(|proto| {
            records.iter().any(|r| {
                r.record
                    .packet
                    .is_some_and(|p| p.protocol == *proto && p.dst == *dst)
            })
        })
    })
}

#[test]
fn records_from_a_pod_netns_are_decoded() {
    if !root_or_skip() {
        return;
    }
    let mut namespaces = Namespaces::new("nwmonr");
    let p = pair(&mut namespaces, "p", "c", 1);

    let metrics = Arc::new(Metrics::new());
    let (mut collector, rx) = Collector::new(ListenerConfig::default(), 1024, metrics.clone());
    collector.open(&p.pod, context("web-0")).unwrap();
    assert!(collector.is_listening(&p.pod));

    // A second socket cannot take the same group in the same netns.
    let busy = NflogSocket::open(Some(&p.pod), &ListenerConfig::default()).unwrap_err();
    assert!(
        matches!(busy, NflogError::GroupBusy { group: 100 }),
        "{busy}"
    );

    send_probes(&p.client, vec![p.pod_v4, p.pod_v6], 33333);
    let dsts = [p.pod_v4, p.pod_v6];
    let records = collect_until(&rx, |r| probes_seen(r, &dsts), Duration::from_secs(5));
    assert!(probes_seen(&records, &dsts), "{records:#?}");

    let find = |proto: L4Protocol, dst: IpAddr| {
        records
            .iter()
            .find(|r| {
                r.record
                    .packet
                    .is_some_and(|p| p.protocol == proto && p.dst == dst)
            })
            .unwrap_or_else(|| panic!("no {proto} record to {dst}: {records:#?}"))
    };
    for (dst, src, family) in [(p.pod_v4, p.client_v4, 2), (p.pod_v6, p.client_v6, 10)] {
        let tcp = find(L4Protocol::Tcp, dst);
        assert_eq!(tcp.record.prefix.as_deref(), Some("nw:wd:0000abcd "));
        assert_eq!(tcp.record.family, family);
        assert_eq!(tcp.record.group, 100);
        let pk = tcp.record.packet.unwrap();
        assert_eq!((pk.src, pk.dport), (src, Some(9)));
        assert!(pk.sport.is_some_and(|s| s != 0));
        assert!(tcp.record.indev.is_some());
        assert!(tcp.record.seq.is_some());

        let udp = find(L4Protocol::Udp, dst);
        assert_eq!(udp.record.prefix.as_deref(), Some("nw:dn:0000abcd "));
        let pk = udp.record.packet.unwrap();
        assert_eq!((pk.src, pk.sport, pk.dport), (src, Some(33333), Some(9)));
        assert_eq!(&*udp.netns, p.pod.as_path());
        assert_eq!(udp.context.pod, ObjectKey::new("test", "web-0"));
    }

    // The same records as events, through the processor.
    let sink = MemorySink::new();
    let processor = EventProcessor::new(metrics.clone(), Arc::new(sink.clone()));
    let client_v4 = p.client_v4;
    let resolve = move |a: IpAddr| (a == client_v4).then(|| ObjectKey::new("test", "client-0"));
    for r in &records {
        processor.handle(r, &resolve);
    }
    let events = sink.events();
    assert_eq!(events.len(), records.len());
    let e = events
        .iter()
        .find(|e| e.protocol == "UDP" && e.src == p.client_v4)
        .unwrap();
    assert_eq!(e.peer.as_deref(), Some("test/client-0"));
    assert_eq!(
        (e.pod.as_str(), e.dport, e.action.as_str()),
        ("test/web-0", Some(9), "deny")
    );
    assert_eq!(metrics.unknown(), 0);
    assert_eq!(metrics.nflog_dropped(), 0);

    assert_eq!(collector.close(&p.pod), Some(ListenerExit::Stopped));
    assert!(!collector.is_listening(&p.pod));
}

#[test]
fn a_deleted_netns_ends_its_listener_only() {
    if !root_or_skip() {
        return;
    }
    let mut namespaces = Namespaces::new("nwmond");
    let a = pair(&mut namespaces, "a", "c", 2);
    let b = pair(&mut namespaces, "b", "c", 3);
    let cfg = ListenerConfig {
        poll_interval: Duration::from_millis(50),
        ..Default::default()
    };
    let (mut collector, rx) = Collector::new(cfg, 1024, Arc::new(Metrics::new()));
    collector.open(&a.pod, context("a")).unwrap();
    collector.open(&b.pod, context("b")).unwrap();

    send_probes(&a.client, vec![a.pod_v4], 40001);
    let seen = collect_until(&rx, |r| probes_seen(r, &[a.pod_v4]), Duration::from_secs(5));
    assert!(probes_seen(&seen, &[a.pod_v4]), "{seen:#?}");

    // Delete a's netns under the listener.
    namespaces.delete("a");
    let deadline = Instant::now() + Duration::from_secs(5);
    while collector.is_listening(&a.pod) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !collector.is_listening(&a.pod),
        "listener of a deleted netns must end"
    );
    assert_eq!(
        collector.reap(),
        vec![(a.pod.clone(), ListenerExit::NetnsGone)]
    );
    assert_eq!(collector.netns_paths(), vec![b.pod.clone()]);

    // b still works.
    send_probes(&b.client, vec![b.pod_v4, b.pod_v6], 40002);
    let dsts = [b.pod_v4, b.pod_v6];
    let records = collect_until(&rx, |r| probes_seen(r, &dsts), Duration::from_secs(5));
    assert!(probes_seen(&records, &dsts), "{records:#?}");
    assert!(records.iter().all(|r| r.context.pod.name == "b"));
    // Re-opening a path that no longer exists is an error, not a crash.
    assert!(collector.open(&a.pod, context("a")).is_err());
    assert_eq!(collector.close(&b.pod), Some(ListenerExit::Stopped));
}

fn rss_kib() -> u64 {
    ProcessStats::of(std::process::id()).rss_kib
}

#[test]
fn a_flood_is_bounded_and_counted() {
    if !root_or_skip() {
        return;
    }
    let mut namespaces = Namespaces::new("nwmonf");
    let p = pair(&mut namespaces, "p", "c", 4);
    const QUEUE: usize = 2048;
    const PACKETS: usize = 100_000;
    let metrics = Arc::new(Metrics::new());
    // A small socket buffer so the kernel side overflows too, not only our queue.
    let cfg = ListenerConfig {
        rcvbuf: 64 * 1024,
        ..Default::default()
    };
    let (mut collector, rx) = Collector::new(cfg, QUEUE, metrics.clone());
    collector.open(&p.pod, context("flood")).unwrap();
    let rss_before = rss_kib();

    // Nobody drains the queue while the flood runs.
    let target = SocketAddr::new(p.pod_v4, 9);
    let sent = in_netns(&p.client, move || {
        let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
        let mut sent = 0usize;
        let started = Instant::now();
        for _ in 0..PACKETS {
            // ICMP port unreachable coming back may fail a send with ECONNREFUSED: not counted.
            if udp.send_to(b"x", target).is_ok() {
                sent += 1;
            }
            if started.elapsed() > Duration::from_secs(60) {
                break;
            }
        }
        sent
    });
    std::thread::sleep(Duration::from_millis(500));

    let queued: Vec<RawRecord> = rx.try_iter().collect();
    let rss_after = rss_kib();
    let dropped = metrics.nflog_dropped();
    eprintln!(
        "flood: sent {sent}, queued {}, dropped {dropped} (queue+kernel), overruns {}, rss {} -> {} KiB",
        queued.len(),
        metrics.nflog_overruns(),
        rss_before,
        rss_after
    );
    assert!(sent > PACKETS / 2, "sent only {sent}");
    assert!(queued.len() <= QUEUE, "the queue is bounded");
    assert!(dropped > 0, "drops must be counted");
    assert!(
        queued.len() as u64 + dropped <= sent as u64 + 16,
        "no record counted twice"
    );
    assert!(
        rss_after.saturating_sub(rss_before) < 64 * 1024,
        "memory must stay bounded"
    );
    // The listener survived and still delivers.
    assert!(collector.is_listening(&p.pod));
    let p_v6 = p.pod_v6;
    send_probes(&p.client, vec![p_v6], 40003);
    let seen = |r: &[RawRecord]| probes_seen(r, &[p_v6]);
    let after = collect_until(&rx, seen, Duration::from_secs(5));
    assert!(
        seen(&after),
        "listener still works after the flood: {after:#?}"
    );
    assert_eq!(collector.close(&p.pod), Some(ListenerExit::Stopped));
}
