//! Measures how long `Lab::up`, probing and `down` take (needs root):
//! `cargo run -p netwarden-lab --example lab_timing [PODS...]` (default: 9 110).
//!
//! Pods are dual stack on the primary network (10.66.x.y/16, fd66::/64), each listening on
//! TCP and UDP 80 and 81. For 9 pods it also probes every ordered pair x 2 ports x 2 protocols
//! (IPv4), and prints the timings; it asserts nothing about them. `NWLAB_PROBE_PODS=N` probes
//! the first N pods instead of 9.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use netwarden_engine::model::{Pod, Protocol};
use netwarden_engine::testing::pod;
use netwarden_lab::{install_signal_cleanup, Lab, LabSpec, ProbeSpec};

fn pods(n: usize) -> Vec<Pod> {
    (0..n)
        .map(|i| {
            let (hi, lo) = ((i / 250) as u8, (i % 250 + 1) as u8);
            let v4 = Ipv4Addr::new(10, 66, hi, lo);
            let v6 = Ipv6Addr::new(0xfd66, 0, 0, 0, 0, 0, hi.into(), lo.into());
            pod(
                "bench",
                &format!("p{i}"),
                &[],
                &[&format!("{v4}/16"), &format!("{v6}/64")],
            )
        })
        .collect()
}

fn main() {
    if !netwarden_testing::root_or_skip() {
        return;
    }
    // Interrupted (Ctrl-C, timeout): the lab is removed all the same.
    install_signal_cleanup().expect("signal handler");
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![9, 110]
    } else {
        sizes
    };
    let ports = vec![
        (80, Protocol::Tcp),
        (80, Protocol::Udp),
        (81, Protocol::Tcp),
        (81, Protocol::Udp),
    ];
    for n in sizes {
        let spec = LabSpec {
            pods: pods(n),
            ports: ports.clone(),
        };
        let start = Instant::now();
        let lab = Lab::up(&spec).expect("lab up");
        println!(
            "up: {n} pods, {} listeners: {:?}",
            n * ports.len(),
            start.elapsed()
        );

        // NWLAB_PROBE_PODS=110 probes all pairs of a 110-pod lab (48400 probes).
        let probe_n = std::env::var("NWLAB_PROBE_PODS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(9);
        let probe_pods = &spec.pods[..n.min(probe_n)];
        let mut probes = Vec::new();
        for from in probe_pods {
            for to in probe_pods {
                for &(port, protocol) in &ports {
                    probes.push(ProbeSpec {
                        from: from.key.clone(),
                        to: to.key.clone(),
                        src_ip: None,
                        dst_ip: to.interfaces[0].ips[0],
                        port,
                        protocol,
                    });
                }
            }
        }
        let start = Instant::now();
        let outcomes = lab.probe(&probes);
        let connected = outcomes.iter().filter(|o| o.connected).count();
        println!(
            "probe: {} probes ({}x{} pairs x 2 ports x 2 protocols): {:?}, {connected} connected",
            probes.len(),
            probe_pods.len(),
            probe_pods.len(),
            start.elapsed()
        );
        // Once more: neighbour caches are warm now.
        let start = Instant::now();
        let again = lab.probe(&probes).iter().filter(|o| o.connected).count();
        println!("probe again: {:?}, {again} connected", start.elapsed());

        let start = Instant::now();
        lab.down().expect("lab down");
        println!("down: {n} pods: {:?}", start.elapsed());
    }
}
