//! Where the agent's objects come from: manifest files (`run -f`) or a cluster's watchers
//! (`run --kube`). The agent loop ([`crate::agent`]) is the same for both; a source only says
//! when its objects changed, hands over the reduced [`Inventory`], and says whether that view
//! can be trusted yet.
//!
//! Also here: which pods this agent programs ([`Locality`]: every pod for files, the pods of
//! `--node-name` for a cluster, every pod being a peer either way), and where a local pod's
//! network namespace is ([`NetnsSource`]): declared in the objects ([`DeclaredNetns`]), or
//! asked of the node's CRI runtime first ([`CriNetns`], `run --kube`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use netwarden_cri::{CriClient, NetnsResolver, PodNetns};
use netwarden_engine::Pod;
use netwarden_kube::{KubeOptions, KubeSource};
use netwarden_manifest::{Inventory, InventoryDelta, LoadOptions, ManifestSet, Problem};

use crate::placement::{NetnsAnswer, NetnsOrigin};
use tracing::{info, warn};

/// How the agent reads its objects.
#[derive(Debug, Clone)]
pub enum SourceConfig {
    /// Manifest files and directories, re-read as they change.
    Files(Vec<PathBuf>),
    /// A cluster, watched.
    Kube {
        /// `None`: `KUBECONFIG`, `~/.kube/config`, then in-cluster.
        kubeconfig: Option<PathBuf>,
        /// Only pods with this `spec.nodeName` are programmed.
        node_name: String,
        /// The CRI runtime asked for local pods' netns (`None`: declared netns only).
        cri_endpoint: Option<String>,
        /// How often an optional kind not served yet is looked for.
        discovery_interval: Duration,
        /// How long a watched CRD must stay unserved before its objects are dropped (its
        /// last state enforced meanwhile).
        crd_grace: Duration,
    },
}

/// What one poll of the source found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Poll {
    /// The objects changed: take the inventory again.
    pub changed: bool,
    /// When the oldest change was received (cluster only): event-to-apply latency.
    pub oldest: Option<Instant>,
    /// Ended early by [`ObjectSource::waker`] (news from elsewhere: the kernel).
    pub woken: bool,
}

/// What changed in a source's objects, as the engine takes it, and every current problem.
#[derive(Debug, Default)]
pub struct Update {
    pub delta: InventoryDelta,
    pub problems: Vec<Problem>,
}

/// A live source of objects.
pub enum ObjectSource {
    /// Manifest files, with the inventory last handed over (files are re-read whole; the
    /// delta is their difference), and what ends a poll's wait early.
    Files(Box<ManifestSet>, Option<Inventory>, Arc<Wakeup>),
    Kube(KubeSource),
}

/// A wait that another thread can end early ([`ObjectSource::waker`] for files).
#[derive(Debug, Default)]
pub struct Wakeup {
    woken: Mutex<bool>,
    ring: Condvar,
}

impl Wakeup {
    /// Waits up to `timeout` or until woken; whether it was woken (since the last wait).
    fn wait(&self, timeout: Duration) -> bool {
        let woken = self.woken.lock().unwrap_or_else(|p| p.into_inner());
        let (mut woken, _) = self
            .ring
            .wait_timeout_while(woken, timeout, |w| !*w)
            .unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *woken)
    }

    fn wake(&self) {
        *self.woken.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.ring.notify_all();
    }
}

impl ObjectSource {
    /// Starts reading: the files at once, or the cluster's watchers as tasks of `runtime`.
    pub fn start(
        config: &SourceConfig,
        load: &LoadOptions,
        runtime: &tokio::runtime::Handle,
    ) -> anyhow::Result<ObjectSource> {
        Ok(match config {
            SourceConfig::Files(paths) => ObjectSource::Files(
                Box::new(ManifestSet::new(paths.clone(), load.clone())),
                None,
                Arc::default(),
            ),
            SourceConfig::Kube {
                kubeconfig,
                node_name,
                discovery_interval,
                crd_grace,
                // Used by the agent for its netns source, not by the watchers.
                cri_endpoint: _,
            } => ObjectSource::Kube(KubeSource::start_on(
                KubeOptions {
                    kubeconfig: kubeconfig.clone(),
                    load: load.clone(),
                    discovery_interval: *discovery_interval,
                    crd_grace: *crd_grace,
                    events_as: Some(node_name.clone()),
                },
                runtime,
            )?),
        })
    }

    /// Waits up to `wait` (files: sleeps it; a cluster: returns as soon as something changed)
    /// and says what changed.
    pub fn poll(&mut self, wait: Duration) -> Poll {
        match self {
            ObjectSource::Files(manifests, _, wakeup) => {
                let woken = wakeup.wait(wait);
                let changes = manifests.refresh();
                for change in &changes {
                    info!("{}: {:?}", change.path.display(), change.change);
                }
                Poll {
                    changed: !changes.is_empty(),
                    oldest: None,
                    woken,
                }
            }
            ObjectSource::Kube(kube) => {
                let pending = kube.wait(wait);
                Poll {
                    changed: pending.changes > 0,
                    oldest: pending.oldest,
                    woken: pending.woken,
                }
            }
        }
    }

    /// Something that ends the current (or next) [`ObjectSource::poll`] at once, from any
    /// thread.
    pub fn waker(&self) -> Box<dyn Fn() + Send + Sync> {
        match self {
            ObjectSource::Files(_, _, wakeup) => {
                let wakeup = wakeup.clone();
                Box::new(move || wakeup.wake())
            }
            ObjectSource::Kube(kube) => Box::new(kube.waker()),
        }
    }

    /// What changed since the last call (the first call: everything).
    pub fn take_update(&mut self) -> Update {
        match self {
            ObjectSource::Files(manifests, last, _) => {
                let next = manifests.inventory().clone();
                let delta = InventoryDelta::between(last.as_ref(), &next);
                let problems = next.problems.clone();
                *last = Some(next);
                Update { delta, problems }
            }
            ObjectSource::Kube(kube) => {
                let (delta, problems) = kube.take_delta();
                Update { delta, problems }
            }
        }
    }

    /// Whether every kind was listed in full once: before that the view is partial, and
    /// applying it could remove rules a complete view keeps (a restarted agent would open a
    /// window), so nothing is applied.
    pub fn synced_once(&self) -> bool {
        match self {
            ObjectSource::Files(..) => true,
            ObjectSource::Kube(kube) => kube.status().synced_once(),
        }
    }

    /// Why the view is not current (`None`: it is).
    pub fn not_ready_reason(&self) -> Option<String> {
        match self {
            ObjectSource::Files(..) => None,
            ObjectSource::Kube(kube) => kube.status().not_ready_reason(),
        }
    }

    pub fn kube(&self) -> Option<&KubeSource> {
        match self {
            ObjectSource::Kube(kube) => Some(kube),
            ObjectSource::Files(..) => None,
        }
    }
}

/// Which pods this agent programs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Locality {
    /// Every pod (manifests describe one node's pods).
    All,
    /// The pods scheduled on this node.
    Node(String),
}

impl Locality {
    pub fn of(config: &SourceConfig) -> Locality {
        match config {
            SourceConfig::Files(_) => Locality::All,
            SourceConfig::Kube { node_name, .. } => Locality::Node(node_name.clone()),
        }
    }

    pub fn is_local(&self, pod: &Pod) -> bool {
        match self {
            Locality::All => true,
            Locality::Node(node) => pod.node_name.as_deref() == Some(node.as_str()),
        }
    }
}

/// Where a local pod's network namespace is.
pub trait NetnsSource: Send {
    /// Learns again where the `local` pods' namespaces are (at most once per agent tick).
    fn refresh(&mut self, _local: &[Pod]) {}

    /// Where `pod`'s netns is, and who says so (see [`crate::placement`]).
    fn netns(&self, pod: &Pod) -> NetnsAnswer;
}

/// The netns the loader read: the `netwarden.io/netns` annotation, or the DanmEp's
/// `spec.netns` (files, or a cluster without a runtime socket).
#[derive(Debug, Default, Clone, Copy)]
pub struct DeclaredNetns;

impl NetnsSource for DeclaredNetns {
    fn netns(&self, pod: &Pod) -> NetnsAnswer {
        declared(pod)
    }
}

/// What a pod's objects declare of its netns.
fn declared(pod: &Pod) -> NetnsAnswer {
    match &pod.netns {
        Some(path) => NetnsAnswer::Netns {
            path: path.clone(),
            origin: NetnsOrigin::Declared,
            ips: Vec::new(),
        },
        None => NetnsAnswer::Unknown(
            "no network namespace known: no sandbox in the runtime, none declared \
             (netwarden.io/netns, a DanmEp's spec.netns)"
                .into(),
        ),
    }
}

/// The longest one CRI refresh may hold the agent loop (connect, list, and the status of new
/// sandboxes); past it the last answers stay.
const CRI_WAIT: Duration = Duration::from_secs(3);

/// The netns of local pods from the node's CRI runtime (`PodSandboxStatus`), matched by the
/// sandbox's namespace, name and uid; the declared netns only when the runtime has no sandbox
/// for a pod.
///
/// The runtime is asked from the synchronous agent loop, on the agent's async runtime (the
/// loop blocks on the answer), with a bounded wait: a hung CRI socket delays a tick by
/// [`CRI_WAIT`] at most. A failed refresh changes nothing (fail closed: the runtime hiccuping
/// never removes a pod's rules) and is reported once until it passes.
pub struct CriNetns {
    endpoint: String,
    runtime: tokio::runtime::Handle,
    /// Connected at the first refresh, and again after a failure.
    resolver: Option<NetnsResolver>,
    /// The last answer per local pod.
    known: HashMap<netwarden_cri::PodKey, PodNetns>,
    /// Whether the last refresh failed (its error was reported).
    failing: bool,
}

impl CriNetns {
    /// Asks the runtime at `endpoint`, connecting on `runtime` (the agent's).
    pub fn new(endpoint: &str, runtime: tokio::runtime::Handle) -> CriNetns {
        CriNetns {
            endpoint: endpoint.to_string(),
            runtime,
            resolver: None,
            known: HashMap::new(),
            failing: false,
        }
    }

    /// One ListPodSandbox (plus PodSandboxStatus for new sandboxes), bounded by [`CRI_WAIT`].
    fn ask(
        &mut self,
        keys: &[netwarden_cri::PodKey],
    ) -> Result<HashMap<netwarden_cri::PodKey, PodNetns>, String> {
        let endpoint = &self.endpoint;
        let resolver = &mut self.resolver;
        let ask = async {
            if resolver.is_none() {
                *resolver = Some(NetnsResolver::new(CriClient::connect(endpoint).await?));
            }
            match resolver.as_mut() {
                Some(r) => r.refresh(keys).await,
                None => unreachable!("connected above"),
            }
        };
        // The timer is created inside the runtime: a `timeout` built outside it has no clock.
        let answer = self
            .runtime
            .block_on(async { tokio::time::timeout(CRI_WAIT, ask).await });
        match answer {
            Ok(Ok(answers)) => Ok(answers),
            Ok(Err(e)) => {
                // A new connection next time: the runtime may have restarted.
                self.resolver = None;
                Err(e.to_string())
            }
            Err(_) => {
                self.resolver = None;
                Err(format!("{endpoint}: no answer within {CRI_WAIT:?}"))
            }
        }
    }
}

/// The pod's key as the CRI matches sandboxes.
fn cri_key(pod: &Pod) -> netwarden_cri::PodKey {
    netwarden_cri::PodKey::new(&pod.key.namespace, &pod.key.name, pod.uid.as_deref())
}

/// The answers to keep after a refresh: the new ones, except that a sandbox whose status
/// could not be read keeps the pod's last good answer (fail closed). Pods not asked about
/// (no longer local) are forgotten.
pub fn merge_answers(
    previous: &HashMap<netwarden_cri::PodKey, PodNetns>,
    fresh: HashMap<netwarden_cri::PodKey, PodNetns>,
) -> HashMap<netwarden_cri::PodKey, PodNetns> {
    fresh
        .into_iter()
        .map(|(key, answer)| {
            let answer = match (answer, previous.get(&key)) {
                (PodNetns::Unreadable { .. }, Some(good @ PodNetns::Netns { .. })) => good.clone(),
                (answer, _) => answer,
            };
            (key, answer)
        })
        .collect()
}

/// Where a local pod's netns is, from the runtime's answer and what the objects declare.
///
/// The runtime made the namespace, so it wins: the `netwarden.io/netns` annotation and the
/// DanmEp's netns are written by others and go stale when the sandbox is recreated (a new
/// netns the annotation does not name). They are used only when the runtime has no sandbox
/// for the pod (pods it does not run, or no runtime at all); a declared path naming a netns
/// the runtime made for another pod is refused later ([`crate::placement::place`]). Host
/// network: said as such (the placement compares it with the pod's spec). An unreadable
/// answer gives nothing (the pod's rules stay as they are, it is retried).
pub fn decide_netns(cri: Option<&PodNetns>, pod: &Pod) -> NetnsAnswer {
    match cri {
        Some(PodNetns::Netns { path, sandbox, ips }) => match path.to_str() {
            Some(path) => NetnsAnswer::Netns {
                path: path.to_string(),
                origin: NetnsOrigin::Runtime {
                    sandbox: sandbox.clone(),
                },
                ips: ips.clone(),
            },
            None => NetnsAnswer::Unknown(format!(
                "the runtime's netns path of sandbox {sandbox} is not UTF-8"
            )),
        },
        Some(PodNetns::HostNetwork { sandbox }) => NetnsAnswer::HostNetwork {
            sandbox: sandbox.clone(),
        },
        Some(PodNetns::Unreadable { sandbox, error }) => NetnsAnswer::Unknown(format!(
            "the runtime cannot say where sandbox {sandbox}'s netns is: {error}"
        )),
        Some(PodNetns::NotYetKnown) | None => declared(pod),
    }
}

impl NetnsSource for CriNetns {
    fn refresh(&mut self, local: &[Pod]) {
        let keys: Vec<netwarden_cri::PodKey> = local
            .iter()
            .filter(|p| !p.host_network)
            .map(cri_key)
            .collect();
        match self.ask(&keys) {
            Ok(fresh) => {
                if std::mem::take(&mut self.failing) {
                    info!("the CRI runtime at {} answers again", self.endpoint);
                }
                let merged = merge_answers(&self.known, fresh);
                for (key, answer) in &merged {
                    if self.known.get(key) != Some(answer) {
                        match answer {
                            PodNetns::Netns { sandbox, path, .. } => info!(
                                "{key}: network namespace {} (sandbox {sandbox})",
                                path.display()
                            ),
                            PodNetns::HostNetwork { sandbox } => {
                                info!("{key}: the runtime runs sandbox {sandbox} in the node's network namespace")
                            }
                            PodNetns::Unreadable { sandbox, error } => {
                                warn!("{key}: sandbox {sandbox}: {error}")
                            }
                            PodNetns::NotYetKnown => {}
                        }
                    }
                }
                self.known = merged;
            }
            Err(e) => {
                if !std::mem::replace(&mut self.failing, true) {
                    warn!("CRI runtime: {e}; the network namespaces known stay as they are");
                }
            }
        }
    }

    fn netns(&self, pod: &Pod) -> NetnsAnswer {
        decide_netns(self.known.get(&cri_key(pod)), pod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::testing::pod;

    fn sandbox(id: &str, path: &str) -> PodNetns {
        PodNetns::Netns {
            sandbox: id.into(),
            path: path.into(),
            ips: Vec::new(),
        }
    }

    #[test]
    fn the_runtime_wins_over_the_declared_netns() {
        let mut p = pod("ns", "a", &[], &["10.0.0.1"]);
        p.netns = Some("/run/netns/annotated".into());
        let path = |answer: NetnsAnswer| match answer {
            NetnsAnswer::Netns { path, origin, .. } => Some((path, origin)),
            _ => None,
        };
        let cri = sandbox("s1", "/run/netns/cni-1");
        assert_eq!(
            path(decide_netns(Some(&cri), &p)),
            Some((
                "/run/netns/cni-1".into(),
                NetnsOrigin::Runtime {
                    sandbox: "s1".into()
                }
            ))
        );
        let declared = Some(("/run/netns/annotated".to_string(), NetnsOrigin::Declared));
        assert_eq!(
            path(decide_netns(Some(&PodNetns::NotYetKnown), &p)),
            declared,
            "no sandbox: the declared netns"
        );
        assert_eq!(path(decide_netns(None, &p)), declared);
        let host = PodNetns::HostNetwork {
            sandbox: "s1".into(),
        };
        assert_eq!(
            decide_netns(Some(&host), &p),
            NetnsAnswer::HostNetwork {
                sandbox: "s1".into()
            },
            "said as such: the placement compares it with the pod's spec"
        );
        let bad = PodNetns::Unreadable {
            sandbox: "s1".into(),
            error: "x".into(),
        };
        assert!(matches!(
            decide_netns(Some(&bad), &p),
            NetnsAnswer::Unknown(_)
        ));
    }

    #[test]
    fn an_unreadable_sandbox_keeps_the_last_good_netns() {
        let a = netwarden_cri::PodKey::new("ns", "a", Some("u1"));
        let b = netwarden_cri::PodKey::new("ns", "b", None);
        let gone = netwarden_cri::PodKey::new("ns", "gone", None);
        let previous = HashMap::from([
            (a.clone(), sandbox("s1", "/run/netns/cni-1")),
            (b.clone(), sandbox("s2", "/run/netns/cni-2")),
            (gone.clone(), sandbox("s3", "/run/netns/cni-3")),
        ]);
        let bad = PodNetns::Unreadable {
            sandbox: "s9".into(),
            error: "x".into(),
        };
        let fresh = HashMap::from([
            (a.clone(), bad.clone()),
            (b.clone(), sandbox("s4", "/run/netns/cni-4")),
        ]);
        let merged = merge_answers(&previous, fresh);
        assert_eq!(merged[&a], previous[&a], "fail closed");
        assert_eq!(merged[&b], sandbox("s4", "/run/netns/cni-4"), "recreated");
        assert!(!merged.contains_key(&gone), "no longer local: forgotten");
        let merged = merge_answers(&HashMap::new(), HashMap::from([(a.clone(), bad.clone())]));
        assert_eq!(merged[&a], bad);
    }
}
