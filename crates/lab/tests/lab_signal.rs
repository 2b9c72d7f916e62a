//! SIGINT during a lab removes it: the test re-runs its own binary as a child that builds a lab
//! after `install_signal_cleanup`, interrupts it, and checks that nothing is left.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use netwarden_engine::model::Protocol;
use netwarden_engine::testing::pod;
use netwarden_lab::{install_signal_cleanup, Lab, LabOptions, LabSpec};
use netwarden_testing::{named_netns_with_prefix, root_or_skip, this_test_in_a_child};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const CHILD_ENV: &str = "NWLAB_SIGNAL_CHILD";
const PREFIX: &str = "nwlabt5";

/// The child's body: only does something when run by `sigint_removes_the_lab`.
#[test]
fn signal_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    install_signal_cleanup().unwrap();
    let spec = LabSpec {
        pods: vec![pod("t", "a", &[], &["10.50.0.1/24"])],
        ports: vec![(80, Protocol::Tcp)],
    };
    let options = LabOptions {
        prefix: PREFIX.into(),
        ..LabOptions::default()
    };
    let lab = Lab::up_with(&spec, &options).unwrap();
    println!("READY {}", lab.state().instance);
    std::thread::sleep(Duration::from_secs(30));
    panic!("the signal should have ended this process");
}

#[test]
fn sigint_removes_the_lab() {
    if std::env::var_os(CHILD_ENV).is_some() || !root_or_skip() {
        return;
    }
    let mut child = this_test_in_a_child("signal_child")
        .env(CHILD_ENV, "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    // libtest prints "test signal_child ... " before the child's own output, on the same line.
    let ready = stdout.lines().map_while(Result::ok).find_map(|l| {
        l.split_once("READY ")
            .map(|(_, instance)| instance.trim().to_owned())
    });
    let Some(instance) = ready else {
        let _ = child.kill();
        panic!("child did not build its lab");
    };
    assert!(!named_netns_with_prefix(&instance).is_empty());
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 2), "exit status after SIGINT");
    assert_eq!(named_netns_with_prefix(PREFIX), Vec::<String>::new());
}
