//! The CRI client and the resolver against a real containerd (Debian's 1.6), started by
//! `netwarden_testing::Containerd` with real pod sandboxes on a CNI bridge. Root and the
//! packages are needed (`scripts/install-cri.sh`); with `CI=true` their absence fails.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use netwarden_cri::{CriClient, NetnsResolver, PodKey, PodNetns, SandboxState};
use netwarden_testing::{
    assert_connects, heavy_lock, listen, CniNetwork, Containerd, SandboxSpec, SharedBridge,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn netns_of(found: &HashMap<PodKey, PodNetns>, pod: &PodKey) -> (String, PathBuf) {
    match found.get(pod) {
        Some(PodNetns::Netns { sandbox, path, ips }) => {
            assert!(!ips.is_empty(), "{pod}: a READY sandbox has its addresses");
            (sandbox.clone(), path.clone())
        }
        other => panic!("{pod}: expected a netns, got {other:?}"),
    }
}

/// The files of libcni's result cache that mention `dir` (the instance's netns paths).
fn cni_results_mentioning(dir: &Path) -> Vec<String> {
    let needle = dir.display().to_string();
    std::fs::read_dir("/var/lib/cni/results")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains(&needle)))
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// (device, inode) of a file: the identity of a network namespace.
fn identity(path: &Path) -> (u64, u64) {
    let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.dev(), m.ino())
}

/// With `NETWARDEN_CRI_FIXTURES=DIR`, writes the runtime's verbose info of sandbox `id` to
/// `DIR/name`: how `fixtures/containerd-1.6*.json` were captured (then trimmed).
fn dump_verbose_info(rt: &tokio::runtime::Runtime, client: &CriClient, id: &str, name: &str) {
    let Ok(dir) = std::env::var("NETWARDEN_CRI_FIXTURES") else {
        return;
    };
    let info = rt.block_on(client.verbose_info(id)).expect("verbose info");
    let json: serde_json::Value =
        serde_json::from_str(&info[netwarden_cri::INFO_KEY]).expect("info JSON");
    let text = serde_json::to_string_pretty(&json).expect("JSON");
    std::fs::write(Path::new(&dir).join(name), text).expect("write fixture");
}

#[test]
fn resolver_finds_real_sandboxes_and_follows_a_recreated_one() {
    let _heavy = heavy_lock();
    let Some(containerd) = Containerd::start() else {
        return;
    };
    let rt = runtime();
    let (id_a, ip_a) = containerd.run_pod_sandbox("shop", "a", "uid-a", &[("app", "a")]);
    let (id_b, ip_b) = containerd.run_pod_sandbox("shop", "b", "uid-b", &[("app", "b")]);
    let client = rt
        .block_on(CriClient::connect(&containerd.endpoint()))
        .expect("connect");

    // The client's view of one sandbox.
    let a = rt
        .block_on(client.sandbox(&id_a))
        .expect("PodSandboxStatus a");
    assert_eq!(
        (
            a.namespace.as_str(),
            a.name.as_str(),
            a.uid.as_str(),
            a.state
        ),
        ("shop", "a", "uid-a", SandboxState::Ready)
    );
    assert_eq!(a.ips, vec![ip_a.clone()]);
    dump_verbose_info(&rt, &client, &id_a, "containerd-1.6.json");
    let listed = rt.block_on(client.list_sandboxes()).expect("list");
    assert_eq!(listed.len(), 2, "{listed:?}");

    let pod_a = PodKey::new("shop", "a", Some("uid-a"));
    let pod_b = PodKey::new("shop", "b", Some("uid-b"));
    let not_there = PodKey::new("shop", "c", None);
    let wrong_uid = PodKey::new("shop", "a", Some("uid-old"));
    let wanted = [
        pod_a.clone(),
        pod_b.clone(),
        not_there.clone(),
        wrong_uid.clone(),
    ];
    let mut resolver = NetnsResolver::new(client.clone());
    let found = rt.block_on(resolver.refresh(&wanted)).expect("refresh");
    let (sandbox_a, netns_a) = netns_of(&found, &pod_a);
    let (sandbox_b, netns_b) = netns_of(&found, &pod_b);
    assert_eq!(
        (sandbox_a.as_str(), sandbox_b.as_str()),
        (id_a.as_str(), id_b.as_str())
    );
    assert_eq!(found[&not_there], PodNetns::NotYetKnown);
    assert_eq!(found[&wrong_uid], PodNetns::NotYetKnown);
    assert_ne!(identity(&netns_a), identity(&netns_b));

    // The file is the sandbox's netns: the same namespace as its pause process's.
    for (id, netns, ip) in [(&id_a, &netns_a, &ip_a), (&id_b, &netns_b, &ip_b)] {
        let pid = containerd.sandbox_pid(id);
        assert_eq!(
            identity(netns),
            identity(Path::new(&format!("/proc/{pid}/ns/net"))),
            "sandbox {id}: netns file vs /proc/{pid}/ns/net"
        );
        let interfaces = netwarden_dataplane::interfaces(netns).expect("interfaces");
        let eth0 = interfaces
            .iter()
            .find(|i| i.name == "eth0")
            .unwrap_or_else(|| panic!("sandbox {id}: no eth0 in {interfaces:?}"));
        assert!(
            eth0.ips().any(|a| a.to_string() == *ip),
            "sandbox {id}: eth0 {eth0:?} lacks {ip}"
        );
    }

    // A real connection between the two sandboxes over the bridge.
    let _listener = listen(&netns_b, &format!("{ip_b}:8080"));
    assert_connects(
        &netns_a,
        &format!("{ip_b}:8080"),
        "a → b over the CNI bridge",
    );

    // Cached: a second refresh asks nothing but the list.
    assert_eq!(resolver.status_calls(), 2);
    let again = rt.block_on(resolver.refresh(&wanted)).expect("refresh");
    assert_eq!(again, found);
    assert_eq!(resolver.status_calls(), 2);

    // The sandbox of a goes away: a is not yet known, its cache entry is dropped.
    containerd.stop_and_remove(&id_a);
    let found = rt.block_on(resolver.refresh(&wanted)).expect("refresh");
    assert_eq!(found[&pod_a], PodNetns::NotYetKnown);
    assert_eq!(resolver.cached(), 1);
    // Recreated with the same metadata: the new sandbox and its new netns.
    let (id_a2, ip_a2) = containerd.run_pod_sandbox("shop", "a", "uid-a", &[("app", "a")]);
    assert_ne!(id_a2, id_a);
    let found = rt.block_on(resolver.refresh(&wanted)).expect("refresh");
    let (sandbox_a2, netns_a2) = netns_of(&found, &pod_a);
    assert_eq!(sandbox_a2, id_a2);
    // A new netns, at a new path. (Not "a new inode": the kernel reuses a freed namespace's
    // inode number, so an agent must key a pod's netns on the sandbox id, never the inode.)
    assert_ne!(
        netns_a2, netns_a,
        "a recreated sandbox has a new netns path"
    );
    let pid = containerd.sandbox_pid(&id_a2);
    assert_eq!(
        identity(&netns_a2),
        identity(Path::new(&format!("/proc/{pid}/ns/net")))
    );
    assert_eq!(resolver.status_calls(), 3);
    let _listener_a = listen(&netns_a2, &format!("{ip_a2}:8080"));
    assert_connects(&netns_b, &format!("{ip_a2}:8080"), "b → new a");

    // Cleanup leaves nothing of this instance behind.
    let socket = containerd.socket();
    let dir = socket.parent().expect("dir").to_path_buf();
    let bridge = containerd.bridge().to_string();
    drop(containerd);
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert!(
        !Path::new("/sys/class/net").join(&bridge).exists(),
        "bridge {bridge} left"
    );
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mountinfo.contains(&dir.display().to_string()),
        "mounts left under {}",
        dir.display()
    );
    assert_eq!(
        cni_results_mentioning(&dir),
        Vec::<String>::new(),
        "CNI results left"
    );
}

/// Two containerds on one bridge with disjoint address ranges: the nodes of one cluster, a
/// connection from a pod on one to a pod on the other (what multi-node agent tests build on).
#[test]
fn two_nodes_share_a_bridge() {
    let _heavy = heavy_lock();
    if !netwarden_testing::containerd_or_skip() {
        return;
    }
    let bridge = SharedBridge::new();
    let node = |first: u8| CniNetwork {
        range: Some((
            format!("198.51.100.{first}"),
            format!("198.51.100.{}", first + 49),
        )),
        bridge: Some(bridge.name().to_string()),
        ..CniNetwork::default()
    };
    let one = Containerd::start_with(&node(10)).expect("node one");
    let two = Containerd::start_with(&node(60)).expect("node two");
    let (id1, ip1) = one.run_pod_sandbox("shop", "client", "uid-c", &[]);
    let (id2, ip2) = two.run_pod_sandbox("shop", "server", "uid-s", &[]);
    assert!(ip1.starts_with("198.51.100.") && ip2.starts_with("198.51.100."));
    assert_ne!(ip1, ip2);
    let (ns1, ns2) = (one.sandbox_netns(&id1), two.sandbox_netns(&id2));
    let _listener = listen(&ns2, &format!("{ip2}:9090"));
    assert_connects(
        &ns1,
        &format!("{ip2}:9090"),
        "node one's pod → node two's pod",
    );
    drop((one, two));
    // The shared bridge outlives the instances; it goes with its guard.
    assert!(Path::new("/sys/class/net").join(bridge.name()).exists());
    let name = bridge.name().to_string();
    drop(bridge);
    assert!(!Path::new("/sys/class/net").join(name).exists());
}

#[test]
fn a_host_network_sandbox_has_no_netns() {
    let _heavy = heavy_lock();
    let Some(containerd) = Containerd::start() else {
        return;
    };
    let rt = runtime();
    let mut spec = SandboxSpec::pod("kube-system", "proxy", "uid-p");
    spec.host_network = true;
    let id = containerd.run(&spec);
    let client = rt
        .block_on(CriClient::connect(&containerd.endpoint()))
        .expect("connect");
    dump_verbose_info(&rt, &client, &id, "containerd-1.6-hostnetwork.json");
    let sandbox = rt.block_on(client.sandbox(&id)).expect("status");
    assert_eq!(sandbox.netns, None);
    let pod = PodKey::new("kube-system", "proxy", Some("uid-p"));
    let mut resolver = NetnsResolver::new(client);
    let found = rt.block_on(resolver.refresh([&pod])).expect("refresh");
    assert_eq!(found[&pod], PodNetns::HostNetwork { sandbox: id });
}

#[test]
fn wrong_endpoints_fail_with_the_endpoint_named() {
    let rt = runtime();
    let err = rt
        .block_on(CriClient::connect("unix:///nonexistent/netwarden-cri.sock"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unix:///nonexistent/netwarden-cri.sock"),
        "{err}"
    );
}

/// RunPodSandbox and Stop+Remove per sandbox, and the resolver's refresh, for 20 sandboxes.
#[test]
fn twenty_sandboxes_timed() {
    let _heavy = heavy_lock();
    let Some(containerd) = Containerd::start() else {
        return;
    };
    let rt = runtime();
    let mut runs = Vec::new();
    let mut ids = Vec::new();
    let pods: Vec<PodKey> = (0..20)
        .map(|i| PodKey::new("bench", &format!("p{i}"), Some(&format!("uid-{i}"))))
        .collect();
    for pod in &pods {
        let start = Instant::now();
        let (id, _) =
            containerd.run_pod_sandbox(&pod.namespace, &pod.name, pod.uid.as_deref().unwrap(), &[]);
        runs.push(start.elapsed());
        ids.push(id);
    }
    let client = rt
        .block_on(CriClient::connect(&containerd.endpoint()))
        .expect("connect");
    let mut resolver = NetnsResolver::new(client);
    let start = Instant::now();
    let found = rt.block_on(resolver.refresh(&pods)).expect("refresh");
    let cold = start.elapsed();
    assert!(
        found.values().all(|f| matches!(f, PodNetns::Netns { .. })),
        "{found:?}"
    );
    let start = Instant::now();
    let again = rt.block_on(resolver.refresh(&pods)).expect("refresh");
    let warm = start.elapsed();
    assert_eq!(again, found);
    assert_eq!(resolver.status_calls(), 20);
    let mut removes = Vec::new();
    for id in &ids {
        let start = Instant::now();
        containerd.stop_and_remove(id);
        removes.push(start.elapsed());
    }
    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    let summary = |v: &mut Vec<Duration>| {
        v.sort();
        format!(
            "median {:.1} ms, max {:.1} ms",
            ms(&v[v.len() / 2]),
            ms(v.last().expect("samples"))
        )
    };
    eprintln!(
        "20 sandboxes: RunPodSandbox {}; Stop+Remove {}; resolver refresh cold (1 list + 20 status) {:.1} ms, warm (1 list) {:.1} ms",
        summary(&mut runs),
        summary(&mut removes),
        ms(&cold),
        ms(&warm)
    );
}

/// Set in the child of [`a_killed_test_process_is_cleaned_up_by_the_next`].
const KILLED_CHILD: &str = "NETWARDEN_CRI_KILLED_CHILD";

/// Kills the child on drop, so a failing parent does not leave it sleeping.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A test process killed with SIGKILL leaves its containerd, shim, sandbox, netns mount and
/// bridge behind (no drop runs); the next harness start cleans them up.
#[test]
fn a_killed_test_process_is_cleaned_up_by_the_next() {
    use std::io::{BufRead, Write};
    if std::env::var(KILLED_CHILD).is_ok() {
        let containerd = Containerd::start().expect("containerd in the child");
        let (id, _) = containerd.run_pod_sandbox("shop", "victim", "uid-v", &[]);
        println!("READY {} {id}", containerd.socket().display());
        std::io::stdout().flush().expect("flush");
        std::thread::sleep(Duration::from_secs(600));
        return;
    }
    let _heavy = heavy_lock();
    if !netwarden_testing::containerd_or_skip() {
        return;
    }
    let mut child = KillOnDrop(
        netwarden_testing::this_test_in_a_child("a_killed_test_process_is_cleaned_up_by_the_next")
            .env(KILLED_CHILD, "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn the child"),
    );
    let stdout = child.0.stdout.take().expect("child stdout");
    // libtest prints "test <name> ... " before the test's own output, on the same line.
    let ready = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| Some(l.split_once("READY ")?.1.to_string()))
        .expect("the child never got a sandbox running");
    let socket = PathBuf::from(ready.split(' ').next().expect("socket"));
    let dir = socket.parent().expect("dir").to_path_buf();
    let _ = child.0.kill();
    let _ = child.0.wait();
    // What the killed process left: its directory with a netns mount in it.
    let mounts_under = |dir: &Path| {
        std::fs::read_to_string("/proc/self/mountinfo")
            .expect("mountinfo")
            .lines()
            .filter(|l| l.contains(&dir.display().to_string()))
            .count()
    };
    assert!(dir.exists());
    assert!(mounts_under(&dir) > 0, "expected the killed child's mounts");

    netwarden_testing::reap_stale_instances();
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert_eq!(
        cni_results_mentioning(&dir),
        Vec::<String>::new(),
        "CNI results left"
    );
    assert_eq!(mounts_under(&dir), 0, "mounts left under {}", dir.display());
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let bridge = name.replace("nwcri", "nwb");
    assert!(
        !Path::new("/sys/class/net").join(&bridge).exists(),
        "bridge {bridge} left"
    );
    let socket = socket.display().to_string();
    let holders: Vec<String> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&socket))
        .collect();
    assert!(
        holders.is_empty(),
        "processes of the killed instance left: {holders:?}"
    );
}
