//! Privileged tests of netns entry and discovery in throwaway named namespaces.
//!
//! Discovery is compared with `ip -j addr show` in the same netns (an oracle used by the tests
//! only).

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use ipnet::IpNet;
use netwarden_dataplane::netns::{create_named, delete_named, exec_in, list_named, run_in};
use netwarden_dataplane::{interfaces, DiscoverError, DiscoveredInterface, NetnsError};
use netwarden_testing::{ip, root_or_skip, Namespaces};

fn netns_inode(path: &str) -> String {
    std::fs::read_link(path)
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

#[test]
fn run_and_exec_inside_a_named_netns() {
    if !root_or_skip() {
        return;
    }
    let mut namespaces = Namespaces::new("nwdp-run");
    let name = namespaces.adopt("ns");
    let path = create_named(&name).unwrap();
    assert!(list_named().unwrap().contains(&name));

    let before = netns_inode("/proc/thread-self/ns/net");
    let inside = run_in(&path, || netns_inode("/proc/thread-self/ns/net")).unwrap();
    assert_ne!(before, inside, "the closure ran in the target netns");
    assert_eq!(
        before,
        netns_inode("/proc/thread-self/ns/net"),
        "caller thread untouched"
    );

    // A child spawned from the switched thread is in the netns: only `lo` exists there.
    exec_in(
        &path,
        "ip",
        &[
            "link", "add", "name", "dummy7", "type", "veth", "peer", "name", "dummy8",
        ],
        None,
    )
    .unwrap();
    exec_in(
        &path,
        "ip",
        &["addr", "add", "10.77.0.1/24", "dev", "dummy7"],
        None,
    )
    .unwrap();
    exec_in(
        &path,
        "ip",
        &["addr", "add", "fd77::1/64", "dev", "dummy7", "nodad"],
        None,
    )
    .unwrap();
    exec_in(&path, "ip", &["link", "set", "dummy7", "up"], None).unwrap();
    exec_in(&path, "ip", &["link", "set", "dummy8", "up"], None).unwrap();
    exec_in(&path, "ip", &["link", "set", "lo", "up"], None).unwrap();
    let found = interfaces(&path).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].name, "dummy7");
    assert!(found[0].up);
    let addrs: Vec<String> = found[0].addrs.iter().map(|a| a.to_string()).collect();
    assert_eq!(addrs, ["10.77.0.1/24", "fd77::1/64"]);
    // The root netns has no such link.
    assert!(!Path::new("/sys/class/net/dummy7").exists());

    // stdin reaches the program and failures carry stderr.
    let out = exec_in(
        &path,
        "ip",
        &["-batch", "-"],
        Some(b"link set dummy7 down\n"),
    )
    .unwrap();
    assert!(out.status.success());
    let err = exec_in(&path, "ip", &["link", "set", "nosuchlink", "up"], None).unwrap_err();
    assert!(
        matches!(err, NetnsError::Command { ref stderr, .. } if !stderr.is_empty()),
        "{err}"
    );

    delete_named(&name).unwrap();
    assert!(!list_named().unwrap().contains(&name));
}

#[test]
fn invalid_names_never_reach_ip() {
    for bad in ["", "../etc", "a b", "-n"] {
        assert!(
            matches!(create_named(bad), Err(NetnsError::InvalidName(_))),
            "{bad:?}"
        );
        assert!(
            matches!(delete_named(bad), Err(NetnsError::InvalidName(_))),
            "{bad:?}"
        );
    }
}

/// What `ip -j addr show` reports, reduced the way discovery reduces it (the oracle: iproute2
/// reads the same kernel tables through its own netlink code).
fn ip_addr_show_oracle(path: &Path) -> Vec<DiscoveredInterface> {
    let out = exec_in(path, "ip", &["-j", "addr", "show"], None).unwrap();
    let links: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let mut found = Vec::new();
    for link in links {
        let name = link["ifname"].as_str().unwrap().to_owned();
        if name == "lo" {
            continue;
        }
        let (mut addrs, mut link_local) = (Vec::new(), Vec::new());
        for info in link["addr_info"].as_array().unwrap() {
            let Some(local) = info["local"].as_str() else {
                continue;
            };
            let net: IpNet = format!("{local}/{}", info["prefixlen"]).parse().unwrap();
            if info["scope"] == "link" && net.addr().is_ipv6() {
                link_local.push(net);
            } else {
                addrs.push(net);
            }
        }
        if addrs.is_empty() {
            continue;
        }
        let flags = link["flags"].as_array().unwrap();
        found.push(DiscoveredInterface {
            name,
            index: link["ifindex"].as_u64().unwrap() as u32,
            addrs,
            link_local,
            up: flags.iter().any(|f| f == "UP"),
        });
    }
    found
}

/// A veth pair inside the netns; `dev` gets no automatic link-local address (so what the
/// test adds is all there is, whenever it looks).
fn veth(path: &Path, dev: &str, peer: &str) {
    ip(
        path,
        &["link", "add", dev, "type", "veth", "peer", "name", peer],
    );
    ip(path, &["link", "set", "dev", dev, "addrgenmode", "none"]);
    ip(path, &["link", "set", "dev", peer, "addrgenmode", "none"]);
}

#[test]
fn discovery_reads_the_kernel_as_ip_addr_show_does() {
    if !root_or_skip() {
        return;
    }
    let mut namespaces = Namespaces::new("nwdp-disc");
    let path = namespaces.create("ns");
    veth(&path, "eth0", "peer0");
    veth(&path, "net1", "peer1");
    veth(&path, "a\"b;+", "peer2");
    veth(&path, "ll-only", "peer3");
    for (dev, v4, v6, ll) in [
        ("eth0", "10.61.0.2/24", "fd61::2/64", "fe80::61:2/64"),
        ("net1", "10.62.0.2/28", "fd62::2/120", "fe80::62:2/64"),
        ("a\"b;+", "192.168.63.2/32", "fd63::2/128", "fe80::63:2/64"),
    ] {
        ip(&path, &["addr", "add", v4, "dev", dev]);
        ip(&path, &["addr", "add", v6, "dev", dev, "nodad"]);
        ip(&path, &["addr", "add", ll, "dev", dev, "nodad"]);
    }
    // A secondary address, and a point-to-point one (IFA_LOCAL differs from IFA_ADDRESS).
    ip(&path, &["addr", "add", "10.61.0.3/24", "dev", "eth0"]);
    ip(
        &path,
        &[
            "addr",
            "add",
            "10.64.0.1",
            "peer",
            "10.64.0.2/32",
            "dev",
            "net1",
        ],
    );
    ip(
        &path,
        &["addr", "add", "fe80::64:2/64", "dev", "ll-only", "nodad"],
    );
    for dev in ["eth0", "a\"b;+", "ll-only", "peer0", "peer2"] {
        ip(&path, &["link", "set", dev, "up"]);
    }

    let found = interfaces(&path).unwrap();
    assert_eq!(found, ip_addr_show_oracle(&path));
    let summary: Vec<(&str, Vec<String>, Vec<String>, bool)> = found
        .iter()
        .map(|i| {
            (
                i.name.as_str(),
                i.addrs.iter().map(ToString::to_string).collect(),
                i.link_local.iter().map(ToString::to_string).collect(),
                i.up,
            )
        })
        .collect();
    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    assert_eq!(
        summary,
        vec![
            (
                "eth0",
                s(&["10.61.0.2/24", "10.61.0.3/24", "fd61::2/64"]),
                s(&["fe80::61:2/64"]),
                true
            ),
            (
                "net1",
                s(&["10.62.0.2/28", "10.64.0.1/32", "fd62::2/120"]),
                s(&["fe80::62:2/64"]),
                false
            ),
            (
                "a\"b;+",
                s(&["192.168.63.2/32", "fd63::2/128"]),
                s(&["fe80::63:2/64"]),
                true
            ),
        ]
    );
}

#[test]
fn a_pod_interface_named_in_bytes_that_are_not_utf8_is_refused() {
    if !root_or_skip() {
        return;
    }
    let mut namespaces = Namespaces::new("nwdp-utf8");
    let path = namespaces.create("ns");
    // `ip` takes the name as bytes: give it the raw 0xff through an OsStr.
    let raw = std::ffi::OsStr::from_bytes(b"x\xffy");
    let status = std::process::Command::new("ip")
        .args(["-n", path.file_name().unwrap().to_str().unwrap()])
        .args(["link", "add"])
        .arg(raw)
        .args(["type", "veth", "peer", "name", "peer0"])
        .status()
        .unwrap();
    assert!(status.success());
    veth(&path, "eth0", "peer1");
    ip(&path, &["addr", "add", "10.65.0.2/24", "dev", "eth0"]);
    // No address yet: not a pod interface, so its name does not matter.
    let found = interfaces(&path).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].name, "eth0");

    // `ip -o link`: one `INDEX: NAME@PEER: ...` line per link, the name as raw bytes.
    let out = exec_in(&path, "ip", &["-o", "link", "show"], None).unwrap();
    let index: u32 = out
        .stdout
        .split(|b| *b == b'\n')
        .find_map(|line| {
            let line = std::str::from_utf8(line).err().map(|_| line)?;
            let colon = line.iter().position(|b| *b == b':')?;
            let rest = line[colon + 1..].trim_ascii_start();
            rest.starts_with(b"x\xffy@").then(|| {
                std::str::from_utf8(&line[..colon])
                    .unwrap()
                    .parse()
                    .unwrap()
            })
        })
        .expect("ip -o link shows the interface");
    let status = std::process::Command::new("ip")
        .args(["-n", path.file_name().unwrap().to_str().unwrap()])
        .args(["addr", "add", "10.66.0.2/24", "dev"])
        .arg(raw)
        .status()
        .unwrap();
    assert!(status.success());
    let err = interfaces(&path).unwrap_err();
    assert!(
        matches!(&err, DiscoverError::UnsupportedName { index: i, bytes } if *i == index && bytes == b"x\xffy"),
        "{err:?}"
    );
}

/// Interface changes are followed as the kernel reports them (issue 20, defect 3b): a link
/// added, an address added, a link deleted each mark the netns changed and wake the owner,
/// without any read of the netns in between; a netns no longer watched is not reported.
#[test]
fn interface_changes_are_notified_per_netns() {
    use netwarden_dataplane::{InterfaceWatch, Netns};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    if !root_or_skip() {
        return;
    }
    let mut namespaces = Namespaces::new("nwdp-watch");
    let a = namespaces.create("a");
    let b = namespaces.create("b");
    let woken = Arc::new(AtomicUsize::new(0));
    let counter = woken.clone();
    let watch = InterfaceWatch::start(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    watch.watch(&Netns::open(&a).unwrap()).unwrap();
    watch.watch(&Netns::open(&b).unwrap()).unwrap();
    // Watching again changes nothing.
    watch.watch(&Netns::open(&a).unwrap()).unwrap();
    assert_eq!(watch.paths().len(), 2);
    let changed_within = |what: &str| {
        let start = Instant::now();
        loop {
            let changed = watch.take_changed();
            if !changed.is_empty() {
                return (changed, start.elapsed());
            }
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "{what}: not notified"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    ip(
        &a,
        &[
            "link", "add", "nwd0", "type", "veth", "peer", "name", "nwd0p",
        ],
    );
    let (changed, took) = changed_within("link added");
    assert_eq!(
        changed.into_iter().collect::<Vec<_>>(),
        std::slice::from_ref(&a)
    );
    assert!(took < Duration::from_millis(500), "{took:?}");
    std::thread::sleep(Duration::from_millis(100));
    watch.take_changed();
    ip(
        &b,
        &[
            "link", "add", "nwd1", "type", "veth", "peer", "name", "nwd1p",
        ],
    );
    ip(&b, &["addr", "add", "10.78.0.1/24", "dev", "nwd1"]);
    let (changed, _) = changed_within("address added");
    assert_eq!(
        changed.into_iter().collect::<Vec<_>>(),
        std::slice::from_ref(&b)
    );
    assert!(woken.load(Ordering::SeqCst) >= 2);
    watch.unwatch(&b);
    std::thread::sleep(Duration::from_millis(100));
    watch.take_changed();
    ip(&b, &["link", "del", "nwd1"]);
    ip(&a, &["link", "del", "nwd0"]);
    let (changed, _) = changed_within("link deleted");
    assert!(!changed.contains(&b), "b is no longer watched: {changed:?}");
    // A burst of changes wakes the owner a bounded number of times.
    std::thread::sleep(Duration::from_millis(200));
    let before = woken.load(Ordering::SeqCst);
    let start = Instant::now();
    for i in 0..100 {
        let (name, peer) = (format!("nwf{i}"), format!("nwg{i}"));
        ip(
            &a,
            &["link", "add", &name, "type", "veth", "peer", "name", &peer],
        );
    }
    let elapsed = start.elapsed();
    std::thread::sleep(Duration::from_millis(200));
    let wakes = woken.load(Ordering::SeqCst) - before;
    let bound = (elapsed.as_millis() / 50 + 3) as usize;
    assert!(
        wakes <= bound,
        "{wakes} wake-ups for 100 changes in {elapsed:?}"
    );
    let (messages, _) = watch.counts();
    assert!(messages >= 100, "{messages}");
}
