//! The process-wide opt-in (`--allow-host-netns`): once set, every way into a netns accepts the
//! agent's own; it cannot be changed afterwards. A test binary of its own, because the setting
//! is fixed for the whole process (the other test binaries run with the strict default).
//!
//! Nothing is changed in the namespace: the commands only read.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use netwarden_dataplane::netns::{
    exec_in, netns_id, own_netns_id, process_access, run_in, set_process_access, Netns,
    NetnsAccess, NetnsError, NotNetns,
};
use netwarden_testing::this_test_in_a_child;

#[test]
fn a_late_opt_in_is_refused_not_silently_applied() {
    let own_path = Path::new("/proc/self/ns/net");
    assert_eq!(process_access(), NetnsAccess::STRICT, "strict by default");
    // Reading (or using) the access fixes the default: an opt-in after that is an error.
    let err = set_process_access(NetnsAccess::ALLOW_OWN).unwrap_err();
    assert!(
        matches!(err, NetnsError::AccessAlreadyFixed { fixed } if fixed == NetnsAccess::STRICT),
        "{err:?}"
    );
    assert!(matches!(
        Netns::open(own_path),
        Err(NetnsError::OwnNetns { .. })
    ));
}

/// Runs in a child process of this test binary, where nothing has fixed the access yet.
#[test]
fn an_opt_in_at_startup_applies_to_every_way_in() {
    if std::env::var_os("NWDP_ALLOW_OWN_CHILD").is_none() {
        let out = this_test_in_a_child("an_opt_in_at_startup_applies_to_every_way_in")
            .env("NWDP_ALLOW_OWN_CHILD", "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    // The child: first thing, as the CLI does with --allow-host-netns.
    set_process_access(NetnsAccess::ALLOW_OWN).unwrap();
    set_process_access(NetnsAccess::ALLOW_OWN).expect("the same value again is fine");
    assert!(matches!(
        set_process_access(NetnsAccess::STRICT),
        Err(NetnsError::AccessAlreadyFixed { .. })
    ));

    let own_path = Path::new("/proc/self/ns/net");
    let own = own_netns_id().unwrap();
    assert_eq!(Netns::open(own_path).unwrap().id(), own);
    assert_eq!(netns_id(own_path).unwrap(), own);
    let inside = run_in(own_path, || {
        std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino()
    })
    .unwrap();
    assert_eq!(inside, own.ino);
    let out = exec_in(own_path, "readlink", &["/proc/self/ns/net"], None).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("net:[{}]", own.ino)
    );
    // The opt-in is about the own netns only: what is not a netns stays refused.
    assert!(matches!(
        Netns::open(Path::new("/proc/self/ns/uts")),
        Err(NetnsError::NotANetns {
            what: NotNetns::Namespace(libc::CLONE_NEWUTS),
            ..
        })
    ));
    // An explicit strict open still refuses it.
    assert!(matches!(
        Netns::open_with(own_path, NetnsAccess::STRICT),
        Err(NetnsError::OwnNetns { .. })
    ));
}
