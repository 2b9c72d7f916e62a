//! SIGINT during a lab removes it: the test re-runs its own binary as a child that builds a lab
//! after `install_signal_cleanup`, interrupts it, and checks that nothing is left.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use netwarden_dataplane::netns::{is_root, list_named};
use netwarden_engine::model::{NetworkId, Pod, PodInterface, PodKey, Protocol};
use netwarden_lab::{install_signal_cleanup, Lab, LabOptions, LabSpec};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const CHILD_ENV: &str = "NWLAB_SIGNAL_CHILD";
const PREFIX: &str = "nwlabt5";

fn leftovers() -> Vec<String> {
    let dash = format!("{PREFIX}-");
    list_named()
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(&dash))
        .collect()
}

/// The child's body: only does something when run by `sigint_removes_the_lab`.
#[test]
fn signal_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    install_signal_cleanup().unwrap();
    let pod = Pod {
        key: PodKey::new("t", "a"),
        labels: Default::default(),
        host_network: false,
        container_ports: vec![],
        interfaces: vec![PodInterface {
            name: "eth0".into(),
            network: NetworkId::Primary,
            ips: vec!["10.50.0.1".parse().unwrap()],
            prefix_lens: vec![24],
        }],
        netns: None,
    };
    let spec = LabSpec {
        pods: vec![pod],
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
    if !is_root() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "lab tests need root in CI"
        );
        eprintln!("skipped: needs root");
        return;
    }
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "signal_child", "--nocapture", "--test-threads=1"])
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
    assert!(list_named()
        .unwrap()
        .iter()
        .any(|n| n.starts_with(&format!("{instance}-"))));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 2), "exit status after SIGINT");
    assert_eq!(leftovers(), Vec::<String>::new());
}
