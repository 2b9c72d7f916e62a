//! Only real network namespaces are opened, without hanging, and never the agent's own unless
//! allowed (root: named namespaces are created; the rest is unprivileged but runs here too).
//!
//! Each refusal is checked through every way in: `Netns::open`, `netns_id`, `run_in`,
//! `exec_in`, `exec_in_unchecked` and `interfaces`. Opens run on a helper thread with a deadline,
//! so a regression that blocks (a FIFO opened for reading waits for a writer) fails the test
//! instead of hanging the suite.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use netwarden_dataplane::netns::{
    exec_in, exec_in_unchecked, netns_id, own_netns_id, run_in, Netns, NetnsAccess, NetnsError,
    NetnsId, NotNetns,
};
use netwarden_dataplane::{interfaces, DiscoverError};
use netwarden_testing::{root_or_skip, Namespaces, TempDir};

/// Generous on purpose: it only tells "returned" from "blocked forever" on a loaded machine;
/// it measures nothing.
const DEADLINE: Duration = Duration::from_secs(5);

/// Runs `f` on a helper thread; panics when it has not returned within [`DEADLINE`].
fn within_deadline<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(DEADLINE)
        .unwrap_or_else(|_| panic!("{what} did not return within {DEADLINE:?}: it blocks"))
}

/// Every entry point refuses `path`; `check` judges each `NetnsError` (the discovery one is
/// unwrapped from `DiscoverError::Netns`). Returns `Netns::open`'s error message.
fn refused_everywhere(path: &Path, check: impl Fn(&NetnsError) -> bool) -> String {
    let p = path.to_owned();
    let errors: Vec<(&str, NetnsError)> = within_deadline(&format!("opening {p:?}"), move || {
        let discover = match interfaces(&p) {
            Err(DiscoverError::Netns(e)) => e,
            other => panic!("interfaces({p:?}) = {other:?}"),
        };
        vec![
            ("Netns::open", Netns::open(&p).unwrap_err()),
            ("netns_id", netns_id(&p).unwrap_err()),
            ("run_in", run_in(&p, || ()).unwrap_err()),
            ("exec_in", exec_in(&p, "true", &[], None).unwrap_err()),
            (
                "exec_in_unchecked",
                exec_in_unchecked(&p, "true", &[], None).unwrap_err(),
            ),
            ("interfaces", discover),
        ]
    });
    for (via, err) in &errors {
        assert!(check(err), "{via}({path:?}): unexpected {err:?}");
    }
    errors[0].1.to_string()
}

fn not_a_netns(path: &Path, expected: NotNetns, message: &str) {
    let shown = refused_everywhere(
        path,
        |e| matches!(e, NetnsError::NotANetns { what, .. } if *what == expected),
    );
    assert!(shown.contains(message), "{path:?}: {shown}");
    assert!(shown.contains(&path.display().to_string()), "{shown}");
}

fn own_netns_refused(path: &Path) {
    let shown = refused_everywhere(path, |e| matches!(e, NetnsError::OwnNetns { .. }));
    assert!(
        shown.contains("is the agent's own network namespace; pass --allow-host-netns to allow it"),
        "{shown}"
    );
    // The explicit opt-in opens it, and it is what the process runs in.
    let netns = Netns::open_with(path, NetnsAccess::ALLOW_OWN).unwrap();
    assert_eq!(netns.id(), own_netns_id().unwrap());
}

fn stat_id(path: &Path) -> NetnsId {
    let meta = std::fs::metadata(path).unwrap();
    NetnsId {
        dev: meta.dev(),
        ino: meta.ino(),
    }
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let dir = TempDir::new("fifo");
    let fifo = dir.path.join("netns");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let result = std::panic::catch_unwind(|| not_a_netns(&fifo, NotNetns::Fifo, "is a FIFO"));
    if result.is_err() {
        // A blocked reader waits for a writer: give it one so the stuck thread ends.
        let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
    }
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn files_that_are_not_namespaces_are_refused() {
    let dir = TempDir::new("files");
    let regular = dir.path.join("regular");
    std::fs::write(&regular, b"not a namespace").unwrap();
    not_a_netns(&regular, NotNetns::RegularFile, "is a regular file");
    not_a_netns(&dir.path, NotNetns::Directory, "is a directory");
    not_a_netns(
        Path::new("/dev/null"),
        NotNetns::CharDevice,
        "is a character device",
    );
    let socket = dir.path.join("socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    not_a_netns(&socket, NotNetns::Socket, "is a socket");
    // A missing path stays an `Open` error with `NotFound` (the backends treat it as "gone").
    let err = Netns::open(&dir.path.join("missing")).unwrap_err();
    assert!(
        matches!(&err, NetnsError::Open { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
        "{err:?}"
    );
}

#[test]
fn namespaces_of_other_types_are_refused() {
    not_a_netns(
        Path::new("/proc/self/ns/uts"),
        NotNetns::Namespace(libc::CLONE_NEWUTS),
        "is a uts namespace",
    );
    not_a_netns(
        Path::new("/proc/self/ns/mnt"),
        NotNetns::Namespace(libc::CLONE_NEWNS),
        "is a mnt namespace",
    );
}

#[test]
fn the_agents_own_netns_is_refused_unless_allowed() {
    let own = own_netns_id().unwrap();
    assert_eq!(own, stat_id(Path::new("/proc/self/ns/net")));
    own_netns_refused(Path::new("/proc/self/ns/net"));
    own_netns_refused(Path::new("/proc/thread-self/ns/net"));
    own_netns_refused(&PathBuf::from(format!(
        "/proc/{}/ns/net",
        std::process::id()
    )));
    // `..` is resolved by the kernel; the identity check sees where it led.
    own_netns_refused(Path::new("/run/../proc/./self/ns/../ns/net"));
    let dir = TempDir::new("own");
    let link = dir.path.join("looks-like-a-pod");
    std::os::unix::fs::symlink("/proc/self/ns/net", &link).unwrap();
    own_netns_refused(&link);
    std::os::unix::fs::symlink("../../proc/self/ns/net", dir.path.join("dotdot")).unwrap();
    if dir.path.parent() == Some(Path::new("/tmp")) {
        own_netns_refused(&dir.path.join("dotdot"));
    }
    // PID 1 is usually in the node's netns: refused when it is ours; when we may not even look
    // (another user namespace, ptrace rules), opening it fails all the same.
    let init = Path::new("/proc/1/ns/net");
    match std::fs::metadata(init) {
        Ok(meta) if (meta.dev(), meta.ino()) == (own.dev, own.ino) => own_netns_refused(init),
        Ok(_) => eprintln!("/proc/1/ns/net is another netns here: not ours to refuse"),
        Err(e) => {
            eprintln!("/proc/1/ns/net cannot be inspected here ({e}): checking it is refused");
            assert!(matches!(Netns::open(init), Err(NetnsError::Open { .. })));
        }
    }
}

#[test]
fn a_named_netns_is_accepted_directly_and_through_a_symlink() {
    if !root_or_skip() {
        return;
    }
    let mut namespaces = Namespaces::new("nwdp-chk");
    let path = namespaces.create("ns");
    let id = netns_id(&path).unwrap();
    assert_eq!(id, stat_id(&path));
    assert_ne!(id, own_netns_id().unwrap());
    let netns = Netns::open(&path).unwrap();
    assert_eq!(netns.id(), id);
    assert_eq!(
        netns
            .run(|| stat_id(Path::new("/proc/thread-self/ns/net")))
            .unwrap(),
        id,
        "the thread entered the namespace that was checked"
    );

    let dir = TempDir::new("link");
    let link = dir.path.join("pod");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    assert_eq!(netns_id(&link).unwrap(), id);
    let inside = run_in(&link, || stat_id(Path::new("/proc/thread-self/ns/net"))).unwrap();
    assert_eq!(inside, id);
    let out = exec_in(&link, "readlink", &["/proc/self/ns/net"], None).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("net:[{}]", id.ino)
    );
    // Discovery goes through the same open: an empty netns has no pod interface.
    assert_eq!(interfaces(&link).unwrap(), vec![]);
}
