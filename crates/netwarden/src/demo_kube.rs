//! `netwarden demo --kube`: the node agent's path, shown on this machine without a cluster.
//!
//! The lab gives each pod of the manifests a network namespace (a bridge per network, veths
//! with the pods' addresses, listeners on the ports the policies name) and programs nothing.
//! The test-support API server ([`netwarden_kube_fake`]) then serves the manifests, with every
//! pod scheduled on this node and annotated with its lab netns, and `netwarden run --kube` —
//! this binary, a child process — watches it and programs the pods, as the DaemonSet would.
//! Real connections between the pods are compared with `reach`'s prediction; then a policy is
//! created through the API, and the connections are probed again until the kernel agrees with
//! the new prediction (or a deadline says it did not).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use netwarden_dataplane::Backend;
use netwarden_engine::{EngineOptions, PodKey};
use netwarden_kube_fake::{manifests, FakeApiServer, ServerOptions};
use netwarden_lab::{Lab, LabSpec};
use netwarden_manifest::{Inventory, LoadOptions, NETNS};
use serde_json::{json, Value};

use crate::lab::{default_ports, prediction, probe_against, render_text, LabReport, ObservedProbe};

/// The node the demo's pods are scheduled on, and the agent's `--node-name`.
pub const NODE: &str = "demo-node";

/// How long the agent may take to say ready, and a change to reach the kernel.
const READY_WITHIN: Duration = Duration::from_secs(30);
const CONVERGE_WITHIN: Duration = Duration::from_secs(15);

/// The policy the demo creates through the API: every pod of `namespace` isolated for
/// ingress on the cluster network, nothing allowed by it (other policies' allows still hold:
/// NetworkPolicies add up).
fn lockdown_policy(namespace: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "demo-ingress-lockdown", "namespace": namespace},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    })
}

pub fn run(paths: &[PathBuf], backend: Backend) -> Result<ExitCode> {
    let load = LoadOptions::default();
    let inventory = netwarden_manifest::load_paths(paths, &load);
    crate::inventory::report_problems(&inventory, false);
    let ports = default_ports(&inventory);
    let workdir = std::env::temp_dir().join(format!("netwarden-demo-kube-{}", std::process::id()));
    std::fs::create_dir_all(workdir.join("manifests"))?;
    netwarden_lab::install_signal_cleanup()?;

    println!(
        "== netwarden demo --kube: the node agent on a fake API server, enforcing in real netns"
    );
    println!("\n== building the lab: a netns per pod, a bridge per network; no rules yet");
    let spec = LabSpec {
        pods: inventory
            .pods
            .iter()
            .filter(|p| !p.host_network)
            .cloned()
            .collect(),
        ports: ports.iter().map(|p| (p.port, p.protocol)).collect(),
    };
    let lab = Lab::up(&spec).context("building the lab")?;
    for key in lab.pods() {
        println!(
            "   {key}: {}",
            lab.pod_netns(key)
                .map_or_else(String::new, |p| p.display().to_string())
        );
    }
    let outcome = with_lab(&lab, paths, &workdir, &inventory, &ports, backend);
    println!("\n== cleaning up");
    lab.down().context("tearing the lab down")?;
    std::fs::remove_dir_all(&workdir).ok();
    println!("   lab removed (its netns took the agent's rules with them)");
    outcome
}

/// Everything between building the lab and removing it.
fn with_lab(
    lab: &Lab,
    paths: &[PathBuf],
    workdir: &Path,
    inventory: &Inventory,
    ports: &[crate::cli_args::PortProto],
    backend: Backend,
) -> Result<ExitCode> {
    let served = workdir.join("manifests");
    let objects = scheduled_here(paths, lab)?;
    std::fs::write(
        served.join("objects.json"),
        serde_json::to_vec_pretty(&json!({"apiVersion": "v1", "kind": "List", "items": objects}))?,
    )?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let server = runtime.block_on(FakeApiServer::start(ServerOptions::default()))?;
    let loaded = manifests::load_dir(&server, &served)?;
    let kubeconfig = workdir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig)?;
    println!(
        "\n== the API server (netwarden-kube-fake) at {}: {} object(s), pods on node {NODE}",
        server.url(),
        loaded.created
    );

    let metrics = free_loopback_port()?;
    let log = workdir.join("agent.log");
    println!(
        "\n== starting the agent: netwarden run --kube --node-name {NODE} --backend {} (log: {})",
        backend.as_str(),
        log.display()
    );
    let mut agent = Agent::start(&kubeconfig, metrics, backend, &log)?;
    let started = Instant::now();
    while !ready(metrics) {
        if let Some(status) = agent.child.try_wait()? {
            bail!("the agent exited ({status}); its log: {}", tail(&log));
        }
        if started.elapsed() > READY_WITHIN {
            bail!(
                "the agent is not ready after {READY_WITHIN:?}; its log: {}",
                tail(&log)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "   ready after {:.1} s (/readyz: every kind listed, the state applied)",
        started.elapsed().as_secs_f64()
    );

    println!("\n== probing every pod pair with real connections, against `reach`'s prediction");
    let before = converge(lab, inventory, ports, backend)?;
    print!("{}", render_text(&before));
    let mut ok = before.mismatches == 0;

    let Some((namespace, changed)) = most_telling_change(inventory, &served, ports)? else {
        bail!("no namespace of the manifests has a flow a lockdown would deny");
    };
    let policy = lockdown_policy(&namespace);
    println!(
        "\n== a policy change through the API: NetworkPolicy {namespace}/demo-ingress-lockdown \
         (every pod of {namespace} isolated for ingress, nothing allowed by it)"
    );
    server
        .create(policy.clone())
        .map_err(|e| anyhow::anyhow!("creating the policy: {e}"))?;
    let changed_at = Instant::now();
    let after = converge(lab, &changed, ports, backend)?;
    println!(
        "   the kernel agrees with the new prediction after {:.2} s",
        changed_at.elapsed().as_secs_f64()
    );
    let newly_denied = newly_denied(&before.probes, &after.probes);
    println!(
        "   {} flow(s) allowed before are denied now, e.g.:",
        newly_denied.len()
    );
    for p in newly_denied.iter().take(6) {
        println!("   {p}");
    }
    print!("{}", render_text(&after));
    ok &= after.mismatches == 0;

    agent.stop()?;
    runtime.block_on(server.stop());
    println!("   agent stopped (its rules stay in place until the netns go, as on a node)");
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The namespace whose lockdown ([`lockdown_policy`]) denies the most flows `reach` allows
/// now, with the objects as they are after it (`served` plus the policy); `None` when no
/// lockdown would change anything.
fn most_telling_change(
    inventory: &Inventory,
    served: &Path,
    ports: &[crate::cli_args::PortProto],
) -> Result<Option<(String, Inventory)>> {
    let allowed_now = |inventory: &Inventory| -> std::collections::BTreeSet<String> {
        prediction(inventory, ports, EngineOptions::default())
            .into_iter()
            .filter(|p| p.allowed)
            .map(|p| {
                format!(
                    "{} {} {} {}/{}",
                    p.from, p.to, p.network, p.port, p.protocol
                )
            })
            .collect()
    };
    let before = allowed_now(inventory);
    let change = served.join("change.json");
    let mut best: Option<(usize, String, Inventory)> = None;
    let namespaces: std::collections::BTreeSet<&str> = inventory
        .pods
        .iter()
        .map(|p| p.key.namespace.as_str())
        .collect();
    for namespace in namespaces {
        std::fs::write(
            &change,
            serde_json::to_vec_pretty(&lockdown_policy(namespace))?,
        )?;
        let changed =
            netwarden_manifest::load_paths(&[served.to_path_buf()], &LoadOptions::default());
        let denied = before.difference(&allowed_now(&changed)).count();
        if denied > best.as_ref().map_or(0, |(n, _, _)| *n) {
            best = Some((denied, namespace.to_string(), changed));
        }
    }
    // Left in place: it is what the API server now serves too.
    if let Some((_, namespace, _)) = &best {
        std::fs::write(
            &change,
            serde_json::to_vec_pretty(&lockdown_policy(namespace))?,
        )?;
    }
    Ok(best.map(|(_, namespace, changed)| (namespace, changed)))
}

/// The objects of `paths` as the API server serves them here: every pod in the lab scheduled on
/// [`NODE`] and annotated with its netns (a real node's runtime would say where; the demo has
/// no runtime sandbox for them).
fn scheduled_here(paths: &[PathBuf], lab: &Lab) -> Result<Vec<Value>> {
    let mut objects = Vec::new();
    for file in manifest_files(paths)? {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        objects.extend(manifests::parse_objects(
            &file.display().to_string(),
            &text,
        )?);
    }
    for object in &mut objects {
        if object["kind"] != "Pod" {
            continue;
        }
        let key = PodKey::new(
            object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default"),
            object["metadata"]["name"].as_str().unwrap_or_default(),
        );
        let Some(netns) = lab.pod_netns(&key) else {
            continue;
        };
        object["spec"]["nodeName"] = json!(NODE);
        object["metadata"]["annotations"][NETNS] = json!(netns.display().to_string());
        object["status"]["phase"] = json!("Running");
    }
    Ok(objects)
}

/// The manifest files of `paths`: a directory's as the API server's loader reads them.
fn manifest_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            files.extend(manifests::manifest_files(path)?);
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

/// Probes until every probe agrees with the prediction of `inventory` (the agent may still
/// be applying a change), at most [`CONVERGE_WITHIN`]; the last report either way.
fn converge(
    lab: &Lab,
    inventory: &Inventory,
    ports: &[crate::cli_args::PortProto],
    backend: Backend,
) -> Result<LabReport> {
    let start = Instant::now();
    loop {
        let probes = probe_against(lab, inventory, ports, EngineOptions::default());
        let report = LabReport::new(backend, probes, Vec::new(), Default::default());
        if report.mismatches == 0 || start.elapsed() > CONVERGE_WITHIN {
            return Ok(report);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The probes that connected before and were refused after (same pair, network, port).
fn newly_denied(before: &[ObservedProbe], after: &[ObservedProbe]) -> Vec<String> {
    let key = |p: &ObservedProbe| {
        (
            p.predicted.from.clone(),
            p.predicted.to.clone(),
            p.predicted.network.clone(),
            p.predicted.port,
            p.predicted.protocol,
        )
    };
    let allowed: std::collections::BTreeSet<_> = before
        .iter()
        .filter(|p| p.predicted.allowed)
        .map(key)
        .collect();
    after
        .iter()
        .filter(|p| !p.predicted.allowed && allowed.contains(&key(p)))
        .map(|p| {
            format!(
                "{} -> {} ({}) {}/{} on {}: {}",
                p.predicted.from,
                p.predicted.to,
                p.predicted.dst,
                p.predicted.port,
                p.predicted.protocol,
                p.predicted.network,
                p.detail
                    .as_ref()
                    .map_or("not probed".to_string(), |d| d.to_string())
            )
        })
        .collect()
}

/// The agent, as a child process of this binary.
struct Agent {
    child: Child,
}

impl Agent {
    fn start(
        kubeconfig: &Path,
        metrics: SocketAddr,
        backend: Backend,
        log: &Path,
    ) -> Result<Agent> {
        let log = std::fs::File::create(log)?;
        let child = Command::new(std::env::current_exe()?)
            .args(["run", "--kube", "--node-name", NODE, "--interval", "500ms"])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--backend", backend.as_str(), "--metrics-addr"])
            .arg(metrics.to_string())
            .args(["--no-events-stdout", "--crd-grace", "5s"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting the agent")?;
        Ok(Agent { child })
    }

    /// SIGTERM, as the kubelet stops it; then waits (killing it past its shutdown timeout).
    fn stop(&mut self) -> Result<()> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).ok();
        let start = Instant::now();
        while self.child.try_wait()?.is_none() {
            if start.elapsed() > Duration::from_secs(15) {
                self.child.kill().ok();
                self.child.wait()?;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.child.kill().ok();
            self.child.wait().ok();
        }
    }
}

/// A loopback port free right now, for the agent's `/metrics` and `/readyz`.
fn free_loopback_port() -> Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// Whether the agent's `/readyz` answers 200.
fn ready(addr: SocketAddr) -> bool {
    let ask = || -> std::io::Result<String> {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(b"GET /readyz HTTP/1.1\r\nHost: demo\r\nConnection: close\r\n\r\n")?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        Ok(answer)
    };
    ask().is_ok_and(|a| a.starts_with("HTTP/1.1 200"))
}

/// The last lines of the agent's log, for an error.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
