//! Privileged tests of netns entry and discovery in throwaway named namespaces.

use std::path::Path;

use netwarden_dataplane::netns::{self, create_named, delete_named, exec_in, list_named, run_in};
use netwarden_dataplane::{interfaces, NetnsError};

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

/// Deletes the namespace even when the test panics.
struct Guard(String);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = delete_named(&self.0);
    }
}

fn unique(tag: &str) -> String {
    format!("nwdp-{tag}-{}", std::process::id())
}

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
    let name = unique("run");
    let path = create_named(&name).unwrap();
    let _guard = Guard(name.clone());
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
