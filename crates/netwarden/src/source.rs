//! Where the agent's objects come from: manifest files (`run -f`) or a cluster's watchers
//! (`run --kube`). The agent loop ([`crate::agent`]) is the same for both; a source only says
//! when its objects changed, hands over the reduced [`Inventory`], and says whether that view
//! can be trusted yet.
//!
//! Also here: which pods this agent programs ([`Locality`]: every pod for files, the pods of
//! `--node-name` for a cluster, every pod being a peer either way), and where a local pod's
//! network namespace is ([`NetnsSource`]).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use netwarden_engine::Pod;
use netwarden_kube::{KubeOptions, KubeSource};
use netwarden_manifest::{Inventory, LoadOptions, ManifestSet};
use tracing::info;

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
        /// How often an optional kind not served yet is looked for.
        discovery_interval: Duration,
    },
}

/// What one poll of the source found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Poll {
    /// The objects changed: take the inventory again.
    pub changed: bool,
    /// When the oldest change was received (cluster only): event-to-apply latency.
    pub oldest: Option<Instant>,
}

/// A live source of objects.
pub enum ObjectSource {
    Files(ManifestSet),
    Kube(KubeSource),
}

impl ObjectSource {
    pub fn start(config: &SourceConfig, load: &LoadOptions) -> anyhow::Result<ObjectSource> {
        Ok(match config {
            SourceConfig::Files(paths) => {
                ObjectSource::Files(ManifestSet::new(paths.clone(), load.clone()))
            }
            SourceConfig::Kube {
                kubeconfig,
                node_name,
                discovery_interval,
            } => ObjectSource::Kube(KubeSource::start(KubeOptions {
                kubeconfig: kubeconfig.clone(),
                load: load.clone(),
                discovery_interval: *discovery_interval,
                events_as: Some(node_name.clone()),
            })?),
        })
    }

    /// Waits up to `wait` (files: sleeps it; a cluster: returns as soon as something changed)
    /// and says what changed.
    pub fn poll(&mut self, wait: Duration) -> Poll {
        match self {
            ObjectSource::Files(manifests) => {
                std::thread::sleep(wait);
                let changes = manifests.refresh();
                for change in &changes {
                    info!("{}: {:?}", change.path.display(), change.change);
                }
                Poll {
                    changed: !changes.is_empty(),
                    oldest: None,
                }
            }
            ObjectSource::Kube(kube) => {
                let pending = kube.wait(wait);
                Poll {
                    changed: pending.changes > 0,
                    oldest: pending.oldest,
                }
            }
        }
    }

    pub fn inventory(&self) -> Inventory {
        match self {
            ObjectSource::Files(manifests) => manifests.inventory().clone(),
            ObjectSource::Kube(kube) => kube.inventory(),
        }
    }

    /// Whether every kind was listed in full once: before that the view is partial, and
    /// applying it could remove rules a complete view keeps (a restarted agent would open a
    /// window), so nothing is applied.
    pub fn synced_once(&self) -> bool {
        match self {
            ObjectSource::Files(_) => true,
            ObjectSource::Kube(kube) => kube.status().synced_once(),
        }
    }

    /// Why the view is not current (`None`: it is).
    pub fn not_ready_reason(&self) -> Option<String> {
        match self {
            ObjectSource::Files(_) => None,
            ObjectSource::Kube(kube) => kube.status().not_ready_reason(),
        }
    }

    pub fn kube(&self) -> Option<&KubeSource> {
        match self {
            ObjectSource::Kube(kube) => Some(kube),
            ObjectSource::Files(_) => None,
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
pub trait NetnsSource {
    /// The netns path of `pod`, or `None` while it is not known (the pod is retried).
    fn netns(&self, pod: &Pod) -> Option<String>;
}

/// The netns the loader read: the `netwarden.io/netns` annotation, or the DanmEp's
/// `spec.netns`. (A CRI-backed source, asking the container runtime, plugs in here.)
#[derive(Debug, Default, Clone, Copy)]
pub struct DeclaredNetns;

impl NetnsSource for DeclaredNetns {
    fn netns(&self, pod: &Pod) -> Option<String> {
        pod.netns.clone()
    }
}

/// The pods as the engine gets them: local pods with their netns from `netns`, remote pods
/// as peers only (never a netns: they are not programmed here, whatever they are annotated
/// with).
pub fn place_pods(pods: &[Pod], locality: &Locality, netns: &dyn NetnsSource) -> Vec<Pod> {
    pods.iter()
        .map(|pod| {
            let mut pod = pod.clone();
            pod.netns = if locality.is_local(&pod) {
                netns.netns(&pod)
            } else {
                None
            };
            pod
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::testing::pod;

    fn on(node: Option<&str>, name: &str) -> Pod {
        let mut p = pod("ns", name, &[], &["10.0.0.1"]);
        p.node_name = node.map(str::to_string);
        p.netns = Some(format!("/run/netns/{name}"));
        p
    }

    #[test]
    fn only_local_pods_keep_a_netns() {
        let pods = [on(Some("n1"), "a"), on(Some("n2"), "b"), on(None, "c")];
        let placed = place_pods(&pods, &Locality::Node("n1".into()), &DeclaredNetns);
        let netns: Vec<Option<&str>> = placed.iter().map(|p| p.netns.as_deref()).collect();
        assert_eq!(netns, [Some("/run/netns/a"), None, None]);
        assert_eq!(placed.len(), 3, "every pod stays a peer");
        let all = place_pods(&pods, &Locality::All, &DeclaredNetns);
        assert!(all.iter().all(|p| p.netns.is_some()));
    }
}
