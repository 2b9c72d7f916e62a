//! A real containerd for the tests: started as a child process with a private root, state,
//! sockets and CNI network, creating real pod sandboxes through CRI whose netns the CNI bridge
//! plugin sets up — what a kubelet would do on a node, so the agent's tests meet real netns.
//!
//! Facts behind the configuration (which keys, why) are in the project's containerd note
//! (`restrict_oom_score_adj` without CAP_SYS_RESOURCE, netns mounts under the state dir, a
//! private runc root, the v1 linux runtime plugin left enabled). The sandbox ("pause") image
//! is built here: no registry is reachable, so a static C program waiting for SIGTERM is
//! packed as an OCI image layout and imported with `ctr`, under a `localhost/` name so that a
//! missing image fails at once instead of trying a registry.
//!
//! The CNI network is a bridge of its own (`isGateway: false`, `ipMasq: false`: nothing in the
//! root namespace's routes, forwarding or firewall changes) with host-local IPAM on a TEST-NET
//! range and its own data dir. Sandboxes on it reach each other over the bridge. Several
//! instances on one [`SharedBridge`] with disjoint address ranges are the nodes of one
//! cluster: their pods share an L2 segment.
//!
//! Cleanup on drop, also when the test panicked: every sandbox stopped and removed through CRI,
//! containerd stopped, then whatever is provably this instance's — runc containers under its
//! private runc root, shims whose `-address` is its socket, mounts under its directory, its
//! bridge, its CNI result files (libcni keeps them in the fixed /var/lib/cni/results, named
//! after the network), its cgroup parent — and its directory.
//!
//! This module talks CRI with k8s-cri's generated client directly, not through
//! `netwarden-cri`: the harness plays kubelet and must not share the code under test.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, ListPodSandboxRequest, NamespaceMode,
    NamespaceOption, PodSandboxConfig, PodSandboxMetadata, PodSandboxStatusRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StatusRequest, StopPodSandboxRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::root::is_root;

/// The pause image's name; bump the tag when [`PAUSE_C`] changes.
pub const PAUSE_IMAGE: &str = "localhost/netwarden-pause:1";

/// The default TEST-NET-2 range (RFC 5737) for sandbox addresses.
pub const DEFAULT_SUBNET: &str = "198.51.100.0/24";

/// The sandbox's only process: PID 1 of the pod, waiting until it is told to stop. PID 1
/// ignores signals it has no handler for, hence the handlers.
const PAUSE_C: &str = r#"#include <signal.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
int main(void) {
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    for (;;) pause();
}
"#;

/// The system programs and files the harness needs, with the Debian package of each
/// (`scripts/install-cri.sh` installs them).
const NEEDED: [(&str, &str); 7] = [
    ("/usr/bin/containerd", "containerd"),
    ("/usr/bin/ctr", "containerd"),
    ("/usr/sbin/runc", "runc"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("/usr/lib/cni/host-local", "containernetworking-plugins"),
    ("/usr/lib/cni/loopback", "containernetworking-plugins"),
    ("/usr/bin/gcc", "gcc"),
];

/// Where libcni caches each attachment's result (fixed in containerd 1.6).
const CNI_RESULTS: &str = "/var/lib/cni/results";

/// Whether a containerd test can run: root and the packages. Without them it skips with a line
/// on stderr, except with `CI=true`, where it fails (a CI run that skipped must not be green).
pub fn containerd_or_skip() -> bool {
    let mut missing: Vec<String> = Vec::new();
    if !is_root() {
        missing.push("root".to_string());
    }
    for (path, package) in NEEDED {
        if !Path::new(path).exists() {
            missing.push(format!(
                "{path} (Debian package {package}; scripts/install-cri.sh)"
            ));
        }
    }
    if missing.is_empty() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("this test needs a real containerd, and CI=true: refusing to skip; missing: {missing:?}");
    }
    eprintln!("skipped: needs {missing:?}");
    false
}

/// The addresses and bridge of an instance's sandboxes.
#[derive(Debug, Clone)]
pub struct CniNetwork {
    /// A TEST-NET range (RFC 5737).
    pub subnet: String,
    /// `(rangeStart, rangeEnd)` within `subnet`: disjoint ranges for instances sharing a bridge.
    pub range: Option<(String, String)>,
    /// A bridge shared with other instances (a [`SharedBridge`]'s name, which it removes);
    /// `None`: a bridge of the instance's own, removed with it.
    pub bridge: Option<String>,
}

impl Default for CniNetwork {
    fn default() -> CniNetwork {
        CniNetwork {
            subnet: DEFAULT_SUBNET.to_string(),
            range: None,
            bridge: None,
        }
    }
}

/// A bridge in the root namespace for several [`Containerd`]s (the nodes of one cluster),
/// named `nwbs<pid>x<n>`, deleted on drop (and by [`reap_stale_instances`] when its test
/// process was killed). It has no address: nothing is routed through the node.
pub struct SharedBridge {
    name: String,
}

impl SharedBridge {
    pub fn new() -> SharedBridge {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("nwbs{}x{n}", std::process::id());
        assert!(name.len() <= 15, "bridge name {name} too long");
        for args in [
            vec!["link", "add", name.as_str(), "type", "bridge"],
            vec!["link", "set", name.as_str(), "up"],
        ] {
            must(Command::new("ip").args(&args), "ip link (shared bridge)");
        }
        SharedBridge { name }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Default for SharedBridge {
    fn default() -> SharedBridge {
        SharedBridge::new()
    }
}

impl Drop for SharedBridge {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.name])
            .output();
    }
}

/// What a sandbox is made from.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: HashMap<String, String>,
    /// Share the node's network namespace (a hostNetwork pod: no CNI, no netns of its own).
    pub host_network: bool,
}

impl SandboxSpec {
    pub fn pod(namespace: &str, name: &str, uid: &str) -> SandboxSpec {
        SandboxSpec {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
            labels: HashMap::new(),
            host_network: false,
        }
    }
}

/// A running private containerd; everything it made is removed on drop.
pub struct Containerd {
    dir: PathBuf,
    child: Option<Child>,
    runtime: tokio::runtime::Runtime,
    cri: RuntimeServiceClient<Channel>,
    names: Instance,
}

fn socket_in(dir: &Path) -> PathBuf {
    dir.join("c.sock")
}

impl Containerd {
    /// Starts a containerd with sandboxes on [`DEFAULT_SUBNET`]; `None` when the test must
    /// skip (see [`containerd_or_skip`]).
    pub fn start() -> Option<Containerd> {
        Containerd::start_with(&CniNetwork::default())
    }

    /// Starts a containerd whose sandboxes take addresses from `subnet` (a TEST-NET range).
    pub fn start_on(subnet: &str) -> Option<Containerd> {
        Containerd::start_with(&CniNetwork {
            subnet: subnet.to_string(),
            ..CniNetwork::default()
        })
    }

    /// Starts a containerd whose sandboxes join `network`: several instances on one
    /// [`SharedBridge`] with disjoint ranges are the nodes of one cluster, their pods on one
    /// L2 segment.
    pub fn start_with(network: &CniNetwork) -> Option<Containerd> {
        if !containerd_or_skip() {
            return None;
        }
        reap_stale_instances();
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let mut names = Instance::of(std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        if let Some(shared) = &network.bridge {
            names.bridge = shared.clone();
            names.own_bridge = false;
        }
        let dir = &names.dir;
        let _ = std::fs::remove_dir_all(dir);
        for sub in ["root", "state", "cni", "ipam", "logs", "opt"] {
            std::fs::create_dir_all(dir.join(sub)).expect("create containerd test dirs");
        }
        std::fs::write(dir.join("config.toml"), config_toml(dir)).expect("write config.toml");
        std::fs::write(
            dir.join("cni").join("10-netwarden-test.conflist"),
            cni_conflist(&names.network, &names.bridge, network, &dir.join("ipam")),
        )
        .expect("write CNI conflist");
        // From here on, a failure (a panic) still cleans up: the value owns everything.
        let me = match Containerd::launch(names.clone()) {
            Ok(me) => me,
            Err(e) => {
                names.remove();
                panic!("{e}");
            }
        };
        me.import_pause_image();
        me.wait_cri_ready();
        Some(me)
    }

    /// Starts containerd on the configuration in `names.dir` and connects to its socket; on
    /// failure containerd is stopped again and the error carries its log.
    fn launch(names: Instance) -> Result<Containerd, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(names.dir.join("containerd.log"))
            .map_err(|e| format!("containerd log: {e}"))?;
        let mut child = Command::new("containerd")
            .arg("--config")
            .arg(names.dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("start containerd: {e}"))?;
        match runtime.block_on(connect_when_ready(&socket_in(&names.dir))) {
            Ok(cri) => Ok(Containerd {
                dir: names.dir.clone(),
                child: Some(child),
                runtime,
                cri,
                names,
            }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let log =
                    std::fs::read_to_string(names.dir.join("containerd.log")).unwrap_or_default();
                Err(format!(
                    "containerd did not start: {e}\n--- containerd.log (tail)\n{}",
                    tail(&log, 30)
                ))
            }
        }
    }

    /// `unix:///...` of this containerd's CRI socket, for the client under test.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    pub fn socket(&self) -> PathBuf {
        socket_in(&self.dir)
    }

    /// The CNI network's name (libcni names its result files after it).
    pub fn network(&self) -> &str {
        &self.names.network
    }

    /// The bridge the sandboxes' veths are attached to.
    pub fn bridge(&self) -> &str {
        &self.names.bridge
    }

    /// containerd's own log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// Runs a pod sandbox with this metadata and labels on the CNI network; returns its id and
    /// the IP the CNI plugin gave it.
    pub fn run_pod_sandbox(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        labels: &[(&str, &str)],
    ) -> (String, String) {
        let mut spec = SandboxSpec::pod(namespace, name, uid);
        spec.labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let id = self.run(&spec);
        let ip = self.status_ip(&id);
        assert!(!ip.is_empty(), "sandbox {id} of {namespace}/{name}: no IP");
        (id, ip)
    }

    /// Runs a sandbox from `spec` (also host-network ones); returns its id.
    pub fn run(&self, spec: &SandboxSpec) -> String {
        let network = if spec.host_network {
            NamespaceMode::Node
        } else {
            NamespaceMode::Pod
        };
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: spec.name.clone(),
                uid: spec.uid.clone(),
                namespace: spec.namespace.clone(),
                attempt: 0,
            }),
            // runc cannot set a hostname without a UTS namespace of its own, which a
            // host-network sandbox does not get (kubelet leaves it empty too).
            hostname: if spec.host_network {
                String::new()
            } else {
                spec.name.clone()
            },
            log_directory: self
                .dir
                .join("logs")
                .join(format!("{}_{}_{}", spec.namespace, spec.name, spec.uid))
                .display()
                .to_string(),
            labels: spec.labels.clone(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: self.names.cgroup_parent.clone(),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: network as i32,
                        pid: NamespaceMode::Pod as i32,
                        ipc: NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut cri = self.cri.clone();
        let response = self
            .runtime
            .block_on(cri.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            }))
            .unwrap_or_else(|e| {
                panic!(
                    "RunPodSandbox {}/{}: {e}\n--- containerd.log (tail)\n{}",
                    spec.namespace,
                    spec.name,
                    tail(&self.log(), 30)
                )
            });
        response.into_inner().pod_sandbox_id
    }

    /// `status.network.ip` of a sandbox (empty for host network).
    pub fn status_ip(&self, id: &str) -> String {
        let status = self.status(id);
        status["ip"].as_str().unwrap_or_default().to_string()
    }

    /// The pid of a sandbox's pause process, from its verbose info (`info.pid`).
    pub fn sandbox_pid(&self, id: &str) -> u32 {
        let status = self.status(id);
        status["pid"]
            .as_u64()
            .unwrap_or_else(|| panic!("sandbox {id}: no pid in verbose info: {status}"))
            as u32
    }

    /// The netns file of a sandbox, as the CNI result for its eth0 names it (not the field the
    /// code under test reads): for tests that enter a pod's netns to probe traffic.
    pub fn sandbox_netns(&self, id: &str) -> PathBuf {
        let status = self.status(id);
        let path = status["netns"]
            .as_str()
            .unwrap_or_else(|| panic!("sandbox {id}: no cniResult eth0 netns: {status}"));
        PathBuf::from(path)
    }

    /// `{ip, pid, netns}` of a sandbox (PodSandboxStatus, verbose).
    fn status(&self, id: &str) -> serde_json::Value {
        let mut cri = self.cri.clone();
        let response = self
            .runtime
            .block_on(cri.pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.to_string(),
                verbose: true,
            }))
            .unwrap_or_else(|e| panic!("PodSandboxStatus {id}: {e}"))
            .into_inner();
        let ip = response
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .unwrap_or_default();
        let info: serde_json::Value = response
            .info
            .get("info")
            .and_then(|i| serde_json::from_str(i).ok())
            .unwrap_or_default();
        let netns = &info["cniResult"]["Interfaces"]["eth0"]["Sandbox"];
        serde_json::json!({"ip": ip, "pid": info["pid"], "netns": netns})
    }

    /// Freezes (`true`: SIGSTOP) or thaws (`false`: SIGCONT) containerd itself: its socket
    /// accepts connections but nothing answers, the worst a runtime does to its clients. The
    /// sandboxes keep running (their shims are other processes). Thaw before the drop: the
    /// drop cleans up through CRI.
    pub fn freeze(&self, frozen: bool) {
        let Some(child) = &self.child else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let signal = if frozen {
            nix::sys::signal::Signal::SIGSTOP
        } else {
            nix::sys::signal::Signal::SIGCONT
        };
        nix::sys::signal::kill(pid, signal).expect("signal containerd");
    }

    /// Stops and removes a sandbox (its netns, veth and IP go with it).
    pub fn stop_and_remove(&self, id: &str) {
        if let Err(e) = self.try_stop_and_remove(id) {
            panic!("stop and remove sandbox {id}: {e}");
        }
    }

    fn try_stop_and_remove(&self, id: &str) -> Result<(), tonic::Status> {
        let mut cri = self.cri.clone();
        self.runtime.block_on(async {
            cri.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await?;
            cri.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await?;
            Ok(())
        })
    }

    /// The ids of every sandbox this containerd knows.
    pub fn sandbox_ids(&self) -> Vec<String> {
        let mut cri = self.cri.clone();
        self.runtime
            .block_on(cri.list_pod_sandbox(ListPodSandboxRequest { filter: None }))
            .map(|r| r.into_inner().items.into_iter().map(|s| s.id).collect())
            .unwrap_or_default()
    }

    fn import_pause_image(&self) {
        // Built per instance, in its directory: nothing outlives the instance (about 0.3 s).
        let tar = build_pause_image(&self.dir.join("pause"));
        let out = Command::new("ctr")
            .arg("--address")
            .arg(self.socket())
            .args(["-n", "k8s.io", "images", "import"])
            .arg(&tar)
            .output()
            .expect("run ctr");
        assert!(
            out.status.success(),
            "ctr images import {}: {}{}",
            tar.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Waits until CRI reports the runtime and the network ready (the CNI config is loaded).
    fn wait_cri_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = String::new();
        while Instant::now() < deadline {
            let mut cri = self.cri.clone();
            match self
                .runtime
                .block_on(cri.status(StatusRequest { verbose: false }))
            {
                Ok(r) => {
                    let conditions = r
                        .into_inner()
                        .status
                        .map(|s| s.conditions)
                        .unwrap_or_default();
                    if conditions.len() >= 2 && conditions.iter().all(|c| c.status) {
                        return;
                    }
                    last = format!("{conditions:?}");
                }
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "CRI not ready within 30 s: {last}\n--- containerd.log (tail)\n{}",
            tail(&self.log(), 30)
        );
    }
}

/// Cleans up after test processes that were killed before their [`Containerd`] was dropped
/// (a CI timeout, a SIGKILL): for each `nwcri<pid>x<n>` directory whose process is gone, the
/// way the containerd note says works — containerd started again on the same state, every
/// sandbox stopped and removed through CRI (that also ends the shims and frees the netns),
/// then the rest as on drop. A directory whose pid is alive is left alone (it is running, or
/// the pid was reused: not provably stale). A lock on the directory keeps two reapers apart.
pub fn reap_stale_instances() {
    for link in read_dir_paths(Path::new("/sys/class/net")) {
        let Some(name) = link.file_name().and_then(|f| f.to_str()) else {
            continue;
        };
        let Some((pid, _)) = name.strip_prefix("nwbs").and_then(|r| r.split_once('x')) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = Command::new("ip").args(["link", "del", name]).output();
        }
    }
    for dir in read_dir_paths(&std::env::temp_dir()) {
        let Some((pid, n)) = dir.file_name().and_then(|f| Instance::parse(f.to_str()?)) else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        let Ok(lock_file) = std::fs::File::open(&dir) else {
            continue;
        };
        let Ok(_lock) =
            nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        else {
            continue;
        };
        let names = Instance::of(pid, n);
        eprintln!(
            "containerd harness: cleaning up {} (its test process {pid} is gone)",
            dir.display()
        );
        // Its containerd may still run (it outlived the test process): stop it before a new
        // one opens the same state.
        let config = names.dir.join("config.toml").display().to_string();
        for old in processes_with_args(&["--config", &config]) {
            kill(old);
        }
        wait_gone(&config);
        match Containerd::launch(names.clone()) {
            Ok(containerd) => drop(containerd),
            Err(e) => {
                eprintln!("containerd harness: {e}");
                names.remove();
            }
        }
    }
}

/// Waits (up to 5 s) until no process runs containerd on `config`.
fn wait_gone(config: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_with_args(&["--config", config]).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Connects to the gRPC socket once containerd has created it.
async fn connect_when_ready(socket: &Path) -> Result<RuntimeServiceClient<Channel>, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if socket.exists() {
            let path = socket.to_path_buf();
            // Every call bounded: a hung containerd fails the test instead of hanging it.
            let channel = Endpoint::from_static("http://containerd.invalid")
                .timeout(Duration::from_secs(60))
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(TokioIo::new(stream))
                    }
                }))
                .await;
            match channel {
                Ok(channel) => return Ok(RuntimeServiceClient::new(channel)),
                Err(e) if Instant::now() > deadline => return Err(e.to_string()),
                Err(_) => {}
            }
        }
        if Instant::now() > deadline {
            return Err(format!("{} did not appear within 30 s", socket.display()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The CRI plugin's configuration (containerd 1.6, config version 2). Each key is explained in
/// the project's containerd note.
fn config_toml(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
# Unused snapshotters and tracing; io.containerd.runtime.v1.linux must stay (the tasks service
# of 1.6 needs it).
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{d}/c.sock"
[ttrpc]
  address = "{d}/c.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  enable_selinux = false
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{d}/state/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni"
    max_conf_num = 1
"#
    )
}

/// The CNI network: a private bridge, no gateway and no masquerade (nothing in the root
/// namespace changes but the bridge and the veths' host ends), host-local IPAM with its own
/// data dir.
fn cni_conflist(network: &str, bridge: &str, addresses: &CniNetwork, ipam_dir: &Path) -> String {
    let mut range = serde_json::json!({"subnet": addresses.subnet});
    if let Some((start, end)) = &addresses.range {
        range["rangeStart"] = start.as_str().into();
        range["rangeEnd"] = end.as_str().into();
    }
    serde_json::json!({
        "cniVersion": "0.4.0",
        "name": network,
        "plugins": [{
            "type": "bridge",
            "bridge": bridge,
            "isGateway": false,
            "ipMasq": false,
            "hairpinMode": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[range]],
                "dataDir": ipam_dir.display().to_string(),
            },
        }],
    })
    .to_string()
}

fn build_pause_image(dir: &Path) -> PathBuf {
    let _ = std::fs::remove_dir_all(dir);
    let rootfs = dir.join("rootfs");
    let layout = dir.join("layout");
    let blobs = layout.join("blobs").join("sha256");
    std::fs::create_dir_all(&rootfs).expect("pause rootfs dir");
    std::fs::create_dir_all(&blobs).expect("pause blobs dir");
    std::fs::write(dir.join("pause.c"), PAUSE_C).expect("write pause.c");
    must(
        Command::new("gcc")
            .args(["-static", "-Os", "-o"])
            .arg(rootfs.join("pause"))
            .arg(dir.join("pause.c")),
        "gcc -static pause.c (needs libc6-dev)",
    );
    // The layer: an uncompressed tar holding /pause, owned by root.
    let layer = dir.join("layer.tar");
    must(
        Command::new("tar")
            .args(["--owner=0", "--group=0", "--numeric-owner", "-C"])
            .arg(&rootfs)
            .arg("-cf")
            .arg(&layer)
            .arg("pause"),
        "tar the pause layer",
    );
    let layer_bytes = std::fs::read(&layer).expect("read layer");
    let layer_digest = store_blob(&blobs, &layer_bytes);
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config = serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "config": {"Entrypoint": ["/pause"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
    })
    .to_string();
    let config_digest = store_blob(&blobs, config.as_bytes());
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{config_digest}"),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{layer_digest}"),
            "size": layer_bytes.len(),
        }],
    })
    .to_string();
    let manifest_digest = store_blob(&blobs, manifest.as_bytes());
    let tag = PAUSE_IMAGE.rsplit_once(':').map_or("latest", |(_, t)| t);
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest.len(),
            "platform": {"architecture": arch, "os": "linux"},
            "annotations": {
                "io.containerd.image.name": PAUSE_IMAGE,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    })
    .to_string();
    std::fs::write(layout.join("index.json"), index).expect("write index.json");
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .expect("write oci-layout");
    let tar = dir.join("pause-image.tar");
    must(
        Command::new("tar")
            .arg("-C")
            .arg(&layout)
            .arg("-cf")
            .arg(&tar)
            .args(["oci-layout", "index.json", "blobs"]),
        "tar the OCI image layout",
    );
    tar
}

/// Writes `bytes` as a blob named by its sha256 (from coreutils' sha256sum); returns the hex.
fn store_blob(blobs: &Path, bytes: &[u8]) -> String {
    let tmp = blobs.join("incoming");
    std::fs::write(&tmp, bytes).expect("write blob");
    let out = must(Command::new("sha256sum").arg(&tmp), "sha256sum");
    let hex = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    assert_eq!(hex.len(), 64, "sha256sum output");
    std::fs::rename(&tmp, blobs.join(&hex)).expect("name blob");
    hex
}

fn must(cmd: &mut Command, what: &str) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // A test that failed while containerd was frozen: thaw it, or nothing below answers.
        self.freeze(false);
        // 1. Through CRI, as kubelet would: every sandbox (all of them are this instance's).
        let mut ids = self.sandbox_ids();
        ids.extend(self.names.sandbox_ids());
        for id in self.sandbox_ids() {
            if let Err(e) = self.try_stop_and_remove(&id) {
                eprintln!("containerd harness: stop/remove sandbox {id}: {e}");
            }
        }
        // 2. containerd itself: SIGTERM, then SIGKILL after 10 s.
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        self.names.remove_with(&ids);
    }
}

/// The names of everything an instance creates outside containerd's own state, all derived
/// from the pid of the test process and a counter (`nwcri<pid>x<n>`): what makes a leftover
/// provably an instance's, also after that process was killed.
#[derive(Debug, Clone)]
struct Instance {
    /// `<tmp>/nwcri<pid>x<n>`: config, root, state, sockets, CNI config and IPAM, logs.
    dir: PathBuf,
    /// The CNI network name (libcni names its result files `<network>-<sandbox>-<ifname>`).
    network: String,
    bridge: String,
    /// Whether the bridge is this instance's (else a [`SharedBridge`]'s, not removed here).
    own_bridge: bool,
    cgroup_parent: String,
}

impl Instance {
    fn of(pid: u32, n: usize) -> Instance {
        // Short: the gRPC socket path must fit in sun_path (108 bytes), a bridge name in 15.
        let tag = format!("nwcri{pid}x{n}");
        let bridge = format!("nwb{pid}x{n}");
        assert!(bridge.len() <= 15, "bridge name {bridge} too long");
        Instance {
            dir: std::env::temp_dir().join(&tag),
            network: tag.clone(),
            bridge,
            own_bridge: true,
            cgroup_parent: format!("/{tag}"),
        }
    }

    /// The ids of the sandboxes this instance's containerd ever recorded (its CRI plugin's
    /// sandbox directories and its task bundles), read from its own root and state.
    fn sandbox_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = [
            self.dir.join("root/io.containerd.grpc.v1.cri/sandboxes"),
            self.dir.join("state/io.containerd.grpc.v1.cri/sandboxes"),
            self.dir.join("state/io.containerd.runtime.v2.task/k8s.io"),
        ]
        .iter()
        .flat_map(|d| read_dir_paths(d))
        .filter_map(|p| Some(p.file_name()?.to_str()?.to_string()))
        .filter(|id| id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    /// The pid and counter of a directory name `nwcri<pid>x<n>`.
    fn parse(name: &str) -> Option<(u32, usize)> {
        let (pid, n) = name.strip_prefix("nwcri")?.split_once('x')?;
        Some((pid.parse().ok()?, n.parse().ok()?))
    }

    /// What containerd and CRI did not remove, each provably this instance's.
    fn remove(&self) {
        self.remove_with(&[]);
    }

    /// [`Instance::remove`], knowing also the sandbox ids in `known` (listed before CRI
    /// removed them, which also removed their records from the state directory).
    fn remove_with(&self, known: &[String]) {
        // A containerd still running on this configuration (its test process was killed).
        let config = self.dir.join("config.toml").display().to_string();
        for pid in processes_with_args(&["--config", &config]) {
            kill(pid);
        }
        // Containers under this instance's private runc root (their pause processes).
        let runc_root = self.dir.join("state").join("runc");
        for ns_dir in read_dir_paths(&runc_root) {
            for container in read_dir_paths(&ns_dir) {
                let id = container
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .to_string();
                let _ = Command::new("runc")
                    .arg("--root")
                    .arg(&ns_dir)
                    .args(["delete", "--force", &id])
                    .output();
            }
        }
        // Shims started for this socket: their command line says `-address <our socket>`.
        let socket = socket_in(&self.dir).display().to_string();
        for pid in processes_with_args(&["-address", &socket]) {
            kill(pid);
        }
        // Mounts under the directory (netns bind mounts, overlay rootfs, shm), deepest first.
        let mut mounts = mounts_under(&self.dir);
        mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
        for m in mounts {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
        if self.own_bridge && Path::new("/sys/class/net").join(&self.bridge).exists() {
            let _ = Command::new("ip")
                .args(["link", "del", &self.bridge])
                .output();
        }
        // libcni's cache: `<network>-<sandbox>-<ifname>` for the bridge network, and
        // `cni-loopback-<sandbox>-lo` for the loopback network containerd adds itself (a
        // sandbox removed after a restart of containerd can leave that one behind). Ours are
        // the files naming our network or one of our sandbox ids (random, 64 hex digits).
        let prefix = format!("{}-", self.network);
        let mut sandboxes = self.sandbox_ids();
        sandboxes.extend_from_slice(known);
        for f in read_dir_paths(Path::new(CNI_RESULTS)) {
            let name = f
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            if name.starts_with(&prefix)
                || sandboxes.iter().any(|id| name.contains(&format!("-{id}-")))
            {
                let _ = std::fs::remove_file(f);
            }
        }
        remove_cgroup(&self.cgroup_parent);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn read_dir_paths(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}

fn kill(pid: i32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// Pids of processes whose arguments contain `pair` (two consecutive arguments) exactly.
fn processes_with_args(pair: &[&str; 2]) -> Vec<i32> {
    let mut pids = Vec::new();
    for p in read_dir_paths(Path::new("/proc")) {
        let Some(pid) = p.file_name().and_then(|n| n.to_str()?.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(p.join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args
            .windows(2)
            .any(|w| w[0] == pair[0].as_bytes() && w[1] == pair[1].as_bytes())
        {
            pids.push(pid);
        }
    }
    pids
}

/// Mount points at or under `dir` (from /proc/self/mountinfo; octal escapes decoded).
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mountinfo(m)))
        .filter(|m| m.starts_with(dir))
        .collect()
}

fn unescape_mountinfo(s: &str) -> String {
    let mut out = String::new();
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v as char);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i] as char);
        i += 1;
    }
    out
}

/// Removes the cgroup `parent` (and whatever runc left under it) in every hierarchy.
fn remove_cgroup(parent: &str) {
    let relative = parent.trim_start_matches('/');
    let mut roots = vec![PathBuf::from("/sys/fs/cgroup")];
    roots.extend(read_dir_paths(Path::new("/sys/fs/cgroup")));
    for root in roots {
        let top = root.join(relative);
        if !top.is_dir() {
            continue;
        }
        let mut dirs = vec![top.clone()];
        let mut i = 0;
        while i < dirs.len() {
            let children: Vec<PathBuf> = read_dir_paths(&dirs[i])
                .into_iter()
                .filter(|p| p.is_dir())
                .collect();
            dirs.extend(children);
            i += 1;
        }
        for d in dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_directories_are_recognised_by_name_only() {
        assert_eq!(Instance::parse("nwcri1234x0"), Some((1234, 0)));
        assert_eq!(Instance::parse("nwcri99x12"), Some((99, 12)));
        for other in [
            "nwcri",
            "nwcri12",
            "nwcrix1",
            "nwcri12x",
            "nwcri1x2y",
            "nwpause12",
            "nwcri-1x0",
        ] {
            assert_eq!(Instance::parse(other), None, "{other}");
        }
        let i = Instance::of(4242, 3);
        assert_eq!(i.dir.file_name().unwrap(), "nwcri4242x3");
        assert_eq!(
            (
                i.network.as_str(),
                i.bridge.as_str(),
                i.cgroup_parent.as_str()
            ),
            ("nwcri4242x3", "nwb4242x3", "/nwcri4242x3")
        );
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo("/tmp/a\\040b"), "/tmp/a b");
        assert_eq!(unescape_mountinfo("/plain/path"), "/plain/path");
        assert_eq!(unescape_mountinfo("/end\\04"), "/end\\04");
    }

    #[test]
    fn the_cni_network_never_routes_through_the_node() {
        let v: serde_json::Value = serde_json::from_str(&cni_conflist(
            "n",
            "b",
            &CniNetwork::default(),
            Path::new("/d"),
        ))
        .unwrap();
        let bridge = &v["plugins"][0];
        assert_eq!(
            (bridge["isGateway"].as_bool(), bridge["ipMasq"].as_bool()),
            (Some(false), Some(false))
        );
        assert_eq!(bridge["ipam"]["dataDir"], "/d");
        assert_eq!(
            bridge["ipam"]["ranges"],
            serde_json::json!([[{"subnet": DEFAULT_SUBNET}]])
        );
        let shared = CniNetwork {
            range: Some(("198.51.100.10".into(), "198.51.100.59".into())),
            bridge: Some("nwbs1x0".into()),
            ..CniNetwork::default()
        };
        let v: serde_json::Value =
            serde_json::from_str(&cni_conflist("n", "nwbs1x0", &shared, Path::new("/d"))).unwrap();
        assert_eq!(
            v["plugins"][0]["ipam"]["ranges"][0][0],
            serde_json::json!({"subnet": DEFAULT_SUBNET, "rangeStart": "198.51.100.10", "rangeEnd": "198.51.100.59"})
        );
    }
}
