//! netwarden-lab: a real network-namespace topology built from the engine's pods, with
//! listeners in every pod and real TCP/UDP probes between them (SCTP too, as raw INITs, on a
//! kernel without SCTP sockets).
//!
//! ```text
//!   fabric netns <prefix>-<hex>-f            pod netns <prefix>-<hex>-<n>
//!   ┌───────────────────────────────┐        ┌──────────────────────┐
//!   │ nwbr0 (primary) ── v0x0 ══════╪════════╪══ eth0 10.1.0.1/24   │  listeners on [::]:port
//!   │ nwbr1 (x/net1)  ── v0x1 ══════╪════════╪══ net1 10.2.0.1/24   │  (TCP accept, UDP echo)
//!   └───────────────────────────────┘        └──────────────────────┘
//! ```
//!
//! One bridge per network lives in a lab-owned "fabric" netns; each pod interface is a veth
//! pair created from inside the fabric, its pod end born in the pod netns under the interface's
//! name. Nothing is created in the root netns. Netns names are generated (`<prefix>-<6 random
//! hex>-<n>`), never derived from pod names, which are untrusted.
//!
//! Teardown deletes the namespaces (links die with them): [`Lab::down`], or `Drop`, or a failed
//! [`Lab::up`], or from another process with [`LabState`] / [`cleanup_stale`], or on a signal
//! after [`install_signal_cleanup`].
//!
//! Every operation needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN).

#![forbid(unsafe_code)]

mod cleanup;
mod plan;
mod probe;
mod sctp;
mod serve;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use netwarden_dataplane::netns::{exec, list_named, named_path, Netns, NetnsError};
use netwarden_engine::model::{Pod, PodKey, Protocol};

pub use cleanup::{
    cleanup_stale, install_signal_cleanup, teardown_from_state, LabState, LabStatePod,
};
pub use probe::{ProbeConfig, ProbeDetail, ProbeOutcome, ProbeSpec};

/// The default first word of every lab netns name.
pub const DEFAULT_PREFIX: &str = "nwlab";

/// What to build: the pods (their interfaces, networks and addresses) and the ports every pod
/// listens on.
#[derive(Debug, Clone, Default)]
pub struct LabSpec {
    pub pods: Vec<Pod>,
    pub ports: Vec<(u16, Protocol)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabOptions {
    /// First word of the netns names (`[a-z0-9-]`, 1-32); an instance adds `-<6 hex>`.
    pub prefix: String,
    pub probe: ProbeConfig,
}

impl Default for LabOptions {
    fn default() -> Self {
        LabOptions {
            prefix: DEFAULT_PREFIX.to_owned(),
            probe: ProbeConfig::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("invalid lab input: {0}")]
    Invalid(String),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("{step}: {source}")]
    Setup { step: String, source: NetnsError },
    #[error("cannot listen on {port}/{protocol} in {netns}: {source}")]
    Listen {
        netns: String,
        port: u16,
        protocol: Protocol,
        source: nix::errno::Errno,
    },
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
    #[error("cannot read /dev/urandom: {0}")]
    Random(std::io::Error),
    #[error("cannot set {key} in {netns}: {source}")]
    Sysctl {
        netns: String,
        key: String,
        source: std::io::Error,
    },
    #[error("netns left behind after teardown: {names:?}{}", cause.as_ref().map(|c| format!(" ({c})")).unwrap_or_default())]
    Leftover {
        names: Vec<String>,
        cause: Option<String>,
    },
}

struct LabPod {
    netns: String,
    path: PathBuf,
    handle: Arc<Netns>,
}

/// A running lab. Dropping it tears it down; [`Lab::down`] does the same and reports errors.
pub struct Lab {
    state: LabState,
    pods: BTreeMap<PodKey, LabPod>,
    skipped: Vec<PodKey>,
    ports: Vec<(u16, Protocol)>,
    unsupported: Vec<(u16, Protocol)>,
    probe_config: ProbeConfig,
    server: Option<serve::Server>,
    torn_down: bool,
}

/// Removes what a failing `up` created, whatever step failed.
struct UpGuard {
    instance: String,
    names: Vec<String>,
    armed: bool,
}

impl Drop for UpGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = cleanup::delete_netns(&self.names);
            cleanup::unregister(&self.instance);
        }
    }
}

/// Set in the fabric: no IPv6 on bridges and fabric veth ends (they only switch frames), so
/// they send no DAD, router solicitations or MLD reports.
const FABRIC_SYSCTLS: &[(&str, &str)] = &[
    ("net/ipv6/conf/all/disable_ipv6", "1"),
    ("net/ipv6/conf/default/disable_ipv6", "1"),
];

/// Set in every pod netns before its interfaces exist (new interfaces copy `default`).
const POD_SYSCTLS: &[(&str, &str)] = &[
    ("net/ipv6/conf/all/disable_ipv6", "0"),
    ("net/ipv6/conf/default/disable_ipv6", "0"),
    // Addresses usable at once (on top of `nodad`), and no waiting for routers that don't exist.
    ("net/ipv6/conf/all/accept_dad", "0"),
    ("net/ipv6/conf/default/accept_dad", "0"),
    ("net/ipv6/conf/default/accept_ra", "0"),
    ("net/ipv6/conf/default/router_solicitations", "0"),
    // Every rejected UDP probe must get its port unreachable: the kernel's per-peer ICMP rate
    // limit would turn refusals into timeouts after a few probes.
    ("net/ipv4/icmp_ratelimit", "0"),
    ("net/ipv6/icmp/ratelimit", "0"),
];

impl Lab {
    /// Builds the lab with default options.
    pub fn up(spec: &LabSpec) -> Result<Lab, LabError> {
        Lab::up_with(spec, &LabOptions::default())
    }

    /// Builds the lab. On error everything created so far is removed.
    pub fn up_with(spec: &LabSpec, options: &LabOptions) -> Result<Lab, LabError> {
        if !plan::valid_prefix(&options.prefix) {
            return Err(LabError::Invalid(format!(
                "bad lab prefix {:?}",
                options.prefix
            )));
        }
        let instance = fresh_instance(&options.prefix)?;
        // Validation happens here, before anything exists.
        let plan = plan::plan(spec, &instance)?;
        let names = plan.netns_names();
        let state = LabState {
            instance: instance.clone(),
            fabric: plan.fabric.clone(),
            pods: plan
                .pods
                .iter()
                .map(|p| LabStatePod {
                    namespace: p.key.namespace.clone(),
                    name: p.key.name.clone(),
                    netns: p.netns.clone(),
                })
                .collect(),
        };
        // Registered first so that a signal during `up` removes the partial lab too.
        cleanup::register(state.clone());
        let mut guard = UpGuard {
            instance: instance.clone(),
            names: names.clone(),
            armed: true,
        };

        let setup = |step: &str| {
            let step = step.to_owned();
            move |source| LabError::Setup { step, source }
        };
        exec(
            "ip",
            &["-batch", "-"],
            Some(plan.netns_add_script().as_bytes()),
        )
        .map_err(setup("creating the lab namespaces"))?;

        let fabric = Netns::open(&named_path(&plan.fabric)?)?;
        let mut pods = BTreeMap::new();
        let mut handles = Vec::new();
        for p in &plan.pods {
            let path = named_path(&p.netns)?;
            let handle = Arc::new(Netns::open(&path)?);
            handles.push((p.netns.clone(), handle.clone()));
            pods.insert(
                p.key.clone(),
                LabPod {
                    netns: p.netns.clone(),
                    path,
                    handle,
                },
            );
        }

        set_sysctls(
            vec![(plan.fabric.clone(), Arc::new(fabric))],
            FABRIC_SYSCTLS,
        )?;
        set_sysctls(handles.clone(), POD_SYSCTLS)?;

        exec(
            "ip",
            &["-n", &plan.fabric, "-batch", "-"],
            Some(plan.fabric_script().as_bytes()),
        )
        .map_err(setup("creating bridges and veth pairs in the fabric netns"))?;
        configure_pods(&plan)?;

        let listeners = serve::listen_in_pods(handles.clone(), plan.ports.clone())?;
        let server = serve::Server::start(listeners)?;

        // No SCTP sockets to listen with; where the kernel has no SCTP at all, raw INITs
        // still probe the rules (see `sctp`): the ports are only unsupported otherwise.
        let mut unsupported = plan.unsupported;
        if sctp::raw_probing_available() {
            unsupported.retain(|&(_, protocol)| protocol != Protocol::Sctp);
        }
        guard.armed = false;
        Ok(Lab {
            state,
            pods,
            skipped: plan.skipped,
            ports: plan.ports,
            unsupported,
            probe_config: options.probe.clone(),
            server: Some(server),
            torn_down: false,
        })
    }

    /// `/run/netns/NAME` of a pod's netns, for `exec_in`/`run_in` (e.g. to apply rules).
    pub fn pod_netns(&self, key: &PodKey) -> Option<&Path> {
        self.pods.get(key).map(|p| p.path.as_path())
    }

    /// The netns name of a pod (what `ip -n NAME` takes).
    pub fn pod_netns_name(&self, key: &PodKey) -> Option<&str> {
        self.pods.get(key).map(|p| p.netns.as_str())
    }

    /// The pods that got a netns, in key order.
    pub fn pods(&self) -> impl Iterator<Item = &PodKey> {
        self.pods.keys()
    }

    /// Pods left out because they have no interface with an address.
    pub fn skipped(&self) -> &[PodKey] {
        &self.skipped
    }

    /// The ports every pod listens on.
    pub fn ports(&self) -> &[(u16, Protocol)] {
        &self.ports
    }

    /// Requested ports the lab cannot probe: SCTP, where the kernel has SCTP sockets (the lab
    /// has no SCTP listener); on a kernel without SCTP, raw INITs probe them (see `sctp`).
    pub fn unsupported_ports(&self) -> &[(u16, Protocol)] {
        &self.unsupported
    }

    /// What another process needs to tear this lab down ([`teardown_from_state`]).
    pub fn state(&self) -> &LabState {
        &self.state
    }

    pub fn probe_config(&self) -> &ProbeConfig {
        &self.probe_config
    }

    pub fn set_probe_config(&mut self, config: ProbeConfig) {
        self.probe_config = config;
    }

    /// Runs the probes in parallel; outcomes are in the order of `probes`.
    pub fn probe(&self, probes: &[ProbeSpec]) -> Vec<ProbeOutcome> {
        let sources: BTreeMap<PodKey, &Netns> = self
            .pods
            .iter()
            .map(|(k, p)| (k.clone(), &*p.handle))
            .collect();
        probe::run(&sources, probes, &self.probe_config)
    }

    /// Tears the lab down, reporting any namespace that could not be removed.
    pub fn down(mut self) -> Result<(), LabError> {
        self.teardown()
    }

    /// Rebuilds the namespace names of `state` and removes them; see [`teardown_from_state`].
    pub fn teardown_from_state(state: &LabState) -> Result<(), LabError> {
        teardown_from_state(state)
    }

    fn teardown(&mut self) -> Result<(), LabError> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        // Sockets and open netns files keep a namespace (and its veths) alive after
        // `ip netns del`: close them first.
        if let Some(mut server) = self.server.take() {
            server.stop();
        }
        self.pods.clear();
        let result = cleanup::delete_netns(&self.state.netns_names());
        cleanup::unregister(&self.state.instance);
        result
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// `<prefix>-<6 random hex>`, not used by any existing netns.
fn fresh_instance(prefix: &str) -> Result<String, LabError> {
    let existing = list_named()?;
    let mut urandom = std::fs::File::open("/dev/urandom").map_err(LabError::Random)?;
    for _ in 0..16 {
        let mut bytes = [0u8; 3];
        urandom.read_exact(&mut bytes).map_err(LabError::Random)?;
        let instance = format!("{prefix}-{:02x}{:02x}{:02x}", bytes[0], bytes[1], bytes[2]);
        let taken = existing
            .iter()
            .any(|n| n.starts_with(&format!("{instance}-")));
        if !taken {
            return Ok(instance);
        }
    }
    Err(LabError::Invalid(format!(
        "no free lab name with prefix {prefix:?}"
    )))
}

/// Writes `/proc/sys/<key>` inside each netns, from one thread that visits them in turn
/// (`/proc/sys/net` shows the netns of the thread that opens it).
fn set_sysctls(
    targets: Vec<(String, Arc<Netns>)>,
    entries: &'static [(&'static str, &'static str)],
) -> Result<(), LabError> {
    let handle = std::thread::Builder::new()
        .name("lab-sysctl".into())
        .spawn(move || {
            for (name, netns) in &targets {
                netns.enter_current_thread()?;
                for (key, value) in entries {
                    match std::fs::write(Path::new("/proc/sys").join(key), value) {
                        Ok(()) => {}
                        // A kernel without IPv6 has no net/ipv6: nothing to tune there.
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(source) => {
                            return Err(LabError::Sysctl {
                                netns: name.clone(),
                                key: (*key).to_owned(),
                                source,
                            })
                        }
                    }
                }
            }
            Ok(())
        })
        .map_err(LabError::Thread)?;
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Runs each pod's `ip -batch` script; a few at a time, since each is a short process.
fn configure_pods(plan: &plan::Plan) -> Result<(), LabError> {
    const PARALLEL: usize = 4;
    let next = AtomicUsize::new(0);
    let first_error: Mutex<Option<LabError>> = Mutex::new(None);
    std::thread::scope(|scope| -> Result<(), LabError> {
        for _ in 0..PARALLEL.min(plan.pods.len()) {
            std::thread::Builder::new()
                .name("lab-setup".into())
                .spawn_scoped(scope, || loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(pod) = plan.pods.get(i) else { break };
                    let script = plan.pod_script(i);
                    let result = exec(
                        "ip",
                        &["-n", &pod.netns, "-batch", "-"],
                        Some(script.as_bytes()),
                    );
                    if let Err(source) = result {
                        let step = format!("configuring pod {} in {}", pod.key, pod.netns);
                        first_error
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert(LabError::Setup { step, source });
                        // Stop handing out work: the lab is going to be removed.
                        next.store(plan.pods.len(), Ordering::SeqCst);
                    }
                })
                .map_err(LabError::Thread)?;
        }
        Ok(())
    })?;
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Probes from pods whose netns are given by path: how `lab probe` reaches a lab that another
/// process (`lab up`) built and keeps serving. Outcomes come back in the order of `probes`;
/// a probe whose source netns cannot be opened is an `Error` outcome.
pub fn probe_paths(
    sources: &BTreeMap<PodKey, std::path::PathBuf>,
    probes: &[ProbeSpec],
    config: &ProbeConfig,
) -> Vec<ProbeOutcome> {
    let mut opened: BTreeMap<PodKey, Netns> = BTreeMap::new();
    for (key, path) in sources {
        if let Ok(ns) = Netns::open(path) {
            opened.insert(key.clone(), ns);
        }
    }
    let refs: BTreeMap<PodKey, &Netns> = opened.iter().map(|(k, n)| (k.clone(), n)).collect();
    probe::run(&refs, probes, config)
}
