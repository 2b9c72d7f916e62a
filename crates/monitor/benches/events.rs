//! Throughput of the collector's CPU path on one core: parse kernel-format NFLOG batches, decode
//! the packets, build the events and format them as JSON lines.
//!
//! Run: `cargo bench -p netwarden-monitor --bench events` (prints events per second; the target
//! is at least 50,000/s). A plain `harness = false` main keeps the dependency list short.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::IpAddr;
use std::time::Instant;

use netwarden_engine::{Direction, NetworkId, ObjectKey, PolicyKind, PolicyRef, StagedCause};
use netwarden_monitor::{build_event, parse_nflog_message, PodContext, Timestamp};
use netwarden_render::LogKeyInfo;

fn attr(buf: &mut Vec<u8>, ty: u16, value: &[u8]) {
    buf.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(value);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

/// One NFULNL_MSG_PACKET as the kernel builds it for an IPv4 TCP SYN, 128 bytes copied.
fn packet_message(i: u32) -> Vec<u8> {
    let mut m = vec![0u8; 16];
    m[4..6].copy_from_slice(&(4u16 << 8).to_ne_bytes());
    m.extend_from_slice(&[2, 0, 0, 100]);
    attr(&mut m, 1, &[0x08, 0x00, 1, 0]); // packet header: IPv4, hook 1
    attr(&mut m, 4, &3u32.to_be_bytes()); // indev
    let mut ts = 1_700_000_000u64.to_be_bytes().to_vec();
    ts.extend_from_slice(&u64::from(i % 1_000_000).to_be_bytes());
    attr(&mut m, 3, &ts);
    attr(&mut m, 10, b"nw:wd:0000abcd \0");
    attr(&mut m, 12, &i.to_be_bytes());
    let mut p = vec![
        0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 1, 9, 10, 0, 0, 2,
    ];
    p.extend_from_slice(&((30000 + i % 30000) as u16).to_be_bytes());
    p.extend_from_slice(&8080u16.to_be_bytes());
    p.resize(128, 0);
    attr(&mut m, 9, &p);
    let len = m.len() as u32;
    m[0..4].copy_from_slice(&len.to_ne_bytes());
    m
}

fn main() {
    let info = LogKeyInfo {
        interface: "eth0".into(),
        network: NetworkId::Primary,
        direction: Direction::Ingress,
        monitored_policies: vec![PolicyRef {
            kind: PolicyKind::NetworkPolicy,
            key: ObjectKey::new("shop", "new-web"),
        }],
        monitored_admin: Vec::new(),
        enforced_admin: Vec::new(),
        enforced_policies: vec![PolicyRef {
            kind: PolicyKind::NetworkPolicy,
            key: ObjectKey::new("shop", "old-web"),
        }],
        cause: StagedCause::ReplacedAllow,
    };
    let ctx = PodContext {
        pod: ObjectKey::new("shop", "web-7d4b9c-xk2p9"),
        node: "node-a".into(),
        log_keys: BTreeMap::from([(0x0000_abcd, info)]),
    };
    let client: IpAddr = "10.0.1.9".parse().unwrap();
    let resolve = |a: IpAddr| (a == client).then(|| ObjectKey::new("shop", "client-0"));

    // Batches of 16 messages, as the listener's default queue threshold makes the kernel send.
    let batches: Vec<Vec<u8>> = (0..64u32)
        .map(|b| (0..16).flat_map(|i| packet_message(b * 16 + i)).collect())
        .collect();

    let run = |rounds: usize| -> (usize, usize, f64) {
        let start = Instant::now();
        let (mut events, mut bytes) = (0usize, 0usize);
        for r in 0..rounds {
            let batch = &batches[r % batches.len()];
            for rec in parse_nflog_message(black_box(batch)).unwrap() {
                let ev = build_event(&rec, Timestamp(0), &ctx, &resolve).unwrap();
                bytes += black_box(ev.to_json_line()).len();
                events += 1;
            }
        }
        (events, bytes, start.elapsed().as_secs_f64())
    };
    // `cargo test --all-targets` runs this without `--bench`: a quick smoke run, no figures.
    let full = std::env::args().any(|a| a == "--bench");
    let (trials, rounds) = if full { (5, 20_000) } else { (1, 200) };
    run(2_000.min(rounds)); // warm-up
    let mut best = 0f64;
    for _ in 0..trials {
        let (events, bytes, secs) = run(rounds);
        let rate = events as f64 / secs;
        best = best.max(rate);
        println!(
            "decode+event+json: {events} events in {secs:.3}s = {rate:.0} events/s ({} bytes/event)",
            bytes / events
        );
    }
    println!("best: {best:.0} events/s on one core (target >= 50000)");
    if full && best < 50_000.0 {
        println!("BELOW TARGET: fewer than 50,000 events/s");
    }
}
