//! From the pods the agent enforces for to their network namespaces, through the CRI runtime.
//!
//! A pod is matched to its sandbox by the sandbox's metadata (namespace, name, and uid when
//! the caller knows it): kubelet writes the pod's own values there. A pod may have several
//! sandboxes (kubelet recreates one whose netns or pause process died, and the old one stays
//! NOTREADY until it is removed); the newest READY one is the pod's. A pod without one is not
//! yet known — it is starting, or between two sandboxes — and the caller asks again at its
//! next refresh, with no error.
//!
//! Cost per refresh: one ListPodSandbox, plus one PodSandboxStatus (verbose) for each chosen
//! sandbox not seen before. A sandbox's netns never changes during its life, so the answer is
//! cached by sandbox id; entries of sandboxes the runtime no longer lists are dropped.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;

use crate::client::{CriClient, CriError, SandboxState, SandboxSummary};

/// A pod as the agent knows it. `uid: None` matches any uid (standalone manifests may have
/// none); with a uid, a sandbox of an older pod of the same name never matches.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
}

impl PodKey {
    pub fn new(namespace: &str, name: &str, uid: Option<&str>) -> PodKey {
        PodKey {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: uid.map(str::to_string),
        }
    }

    fn matches(&self, s: &SandboxSummary) -> bool {
        s.namespace == self.namespace
            && s.name == self.name
            && self.uid.as_ref().is_none_or(|uid| *uid == s.uid)
    }
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        if let Some(uid) = &self.uid {
            write!(f, " (uid {uid})")?;
        }
        Ok(())
    }
}

/// What the runtime says about one pod's network namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodNetns {
    /// The pod's netns file, in the sandbox `sandbox`. A new sandbox id for the same pod means
    /// a new netns: the caller re-applies the pod's rules.
    Netns {
        sandbox: String,
        path: PathBuf,
        /// The sandbox's addresses as the runtime reports them (`status.network`): the pod's
        /// primary addresses before the API's `status.podIPs` has them (issue 20, defect 7).
        ips: Vec<IpAddr>,
    },
    /// The sandbox shares the node's network namespace (hostNetwork): never isolated.
    HostNetwork { sandbox: String },
    /// No READY sandbox matches the pod (yet): ask again at the next refresh.
    NotYetKnown,
    /// The runtime's answer about the chosen sandbox could not be read (the message names the
    /// sandbox and the field). Not host network: the caller must fail closed. Asked again at
    /// the next refresh.
    Unreadable { sandbox: String, error: String },
}

/// The READY sandbox of `pod` among `sandboxes`: the newest by creation time, then by attempt,
/// then by id (so that the choice never depends on the runtime's list order).
pub fn choose_sandbox<'a>(
    pod: &PodKey,
    sandboxes: &'a [SandboxSummary],
) -> Option<&'a SandboxSummary> {
    sandboxes
        .iter()
        .filter(|s| s.state == SandboxState::Ready && pod.matches(s))
        .max_by(|a, b| (a.created_at, a.attempt, &a.id).cmp(&(b.created_at, b.attempt, &b.id)))
}

/// What is cached about a sandbox: its netns (`None` for host network).
/// What PodSandboxStatus said of a sandbox: its netns (`None`: host network) and addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Known {
    netns: Option<PathBuf>,
    ips: Vec<IpAddr>,
}

type Cache = HashMap<String, Known>;

/// Keeps the cache entries of the sandboxes still listed.
fn prune(cache: &mut Cache, listed: &[SandboxSummary]) {
    let alive: HashSet<&str> = listed.iter().map(|s| s.id.as_str()).collect();
    cache.retain(|id, _| alive.contains(id.as_str()));
}

/// Resolves pods to network namespaces with a cache of the sandboxes already asked about.
pub struct NetnsResolver {
    client: CriClient,
    cache: Cache,
    /// PodSandboxStatus calls made so far (for tests and metrics: the cache must keep this
    /// at one per new sandbox).
    status_calls: u64,
    /// Sandboxes whose status could not be read at the last ask (each reported once).
    failing: HashSet<String>,
}

impl NetnsResolver {
    pub fn new(client: CriClient) -> NetnsResolver {
        NetnsResolver {
            client,
            cache: Cache::new(),
            status_calls: 0,
            failing: HashSet::new(),
        }
    }

    pub fn client(&self) -> &CriClient {
        &self.client
    }

    /// PodSandboxStatus calls made since this resolver was created.
    pub fn status_calls(&self) -> u64 {
        self.status_calls
    }

    /// Sandboxes whose netns is cached.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// The netns of every pod in `pods`, from one ListPodSandbox and PodSandboxStatus for new
    /// sandboxes only. An error only when the runtime cannot list its sandboxes (it is down):
    /// the caller keeps what it knew and tries again.
    pub async fn refresh<'p>(
        &mut self,
        pods: impl IntoIterator<Item = &'p PodKey>,
    ) -> Result<HashMap<PodKey, PodNetns>, CriError> {
        let listed = self.client.list_sandboxes().await?;
        prune(&mut self.cache, &listed);
        let mut out = HashMap::new();
        for pod in pods {
            let answer = match choose_sandbox(pod, &listed) {
                None => PodNetns::NotYetKnown,
                Some(chosen) => self.netns_of(&chosen.id).await,
            };
            out.insert(pod.clone(), answer);
        }
        Ok(out)
    }

    async fn netns_of(&mut self, id: &str) -> PodNetns {
        let known = match self.cache.get(id) {
            Some(known) => known.clone(),
            None => {
                self.status_calls += 1;
                match self.client.sandbox(id).await {
                    Ok(sandbox) => {
                        self.failing.remove(id);
                        let known = Known {
                            ips: sandbox
                                .ips
                                .iter()
                                .filter_map(|ip| ip.parse().ok())
                                .collect(),
                            netns: sandbox.netns,
                        };
                        // A sandbox's netns never changes; its addresses come with CNI, which
                        // a READY sandbox has run: a sandbox without any is asked again.
                        if known.netns.is_none() || !known.ips.is_empty() {
                            self.cache.insert(id.to_string(), known.clone());
                        }
                        known
                    }
                    Err(e) if e.is_not_found() => return PodNetns::NotYetKnown,
                    Err(e) => {
                        // Said once per sandbox until it answers (the agent asks every tick).
                        if self.failing.insert(id.to_string()) {
                            tracing::warn!(sandbox = id, error = %e, "cannot read a sandbox's network namespace");
                        }
                        return PodNetns::Unreadable {
                            sandbox: id.to_string(),
                            error: e.to_string(),
                        };
                    }
                }
            }
        };
        let sandbox = id.to_string();
        match known.netns {
            Some(path) => PodNetns::Netns {
                sandbox,
                path,
                ips: known.ips,
            },
            None => PodNetns::HostNetwork { sandbox },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(
        id: &str,
        name: &str,
        uid: &str,
        attempt: u32,
        ready: bool,
        at: i64,
    ) -> SandboxSummary {
        SandboxSummary {
            id: id.to_string(),
            namespace: "shop".to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
            attempt,
            state: if ready {
                SandboxState::Ready
            } else {
                SandboxState::NotReady
            },
            created_at: at,
        }
    }

    fn chosen(pod: &PodKey, listed: &[SandboxSummary]) -> Option<String> {
        choose_sandbox(pod, listed).map(|s| s.id.clone())
    }

    #[test]
    fn a_recreated_sandbox_wins() {
        let pod = PodKey::new("shop", "web", Some("u1"));
        // The old sandbox died (NOTREADY) and kubelet made attempt 1.
        let listed = [
            sandbox("old", "web", "u1", 0, false, 100),
            sandbox("new", "web", "u1", 1, true, 200),
        ];
        assert_eq!(chosen(&pod, &listed), Some("new".into()));
        // Both ready for a moment (the old one not yet stopped): still the newer one, in
        // either list order.
        let mut listed = [
            sandbox("old", "web", "u1", 0, true, 100),
            sandbox("new", "web", "u1", 1, true, 200),
        ];
        assert_eq!(chosen(&pod, &listed), Some("new".into()));
        listed.reverse();
        assert_eq!(chosen(&pod, &listed), Some("new".into()));
        // Same creation time: the higher attempt, then the id, decide.
        let listed = [
            sandbox("b", "web", "u1", 1, true, 5),
            sandbox("a", "web", "u1", 2, true, 5),
        ];
        assert_eq!(chosen(&pod, &listed), Some("a".into()));
    }

    #[test]
    fn only_ready_sandboxes_of_the_same_pod_count() {
        let pod = PodKey::new("shop", "web", Some("u1"));
        assert_eq!(chosen(&pod, &[]), None);
        assert_eq!(
            chosen(&pod, &[sandbox("s", "web", "u1", 0, false, 1)]),
            None
        );
        // Same name, other uid: an older pod of that name (a StatefulSet's previous pod).
        assert_eq!(chosen(&pod, &[sandbox("s", "web", "u0", 3, true, 9)]), None);
        assert_eq!(chosen(&pod, &[sandbox("s", "api", "u1", 0, true, 1)]), None);
        let mut other_ns = sandbox("s", "web", "u1", 0, true, 1);
        other_ns.namespace = "dev".into();
        assert_eq!(chosen(&pod, &[other_ns]), None);
        // Without a uid, any uid matches: the newest ready one.
        let any = PodKey::new("shop", "web", None);
        let listed = [
            sandbox("s0", "web", "u0", 0, true, 1),
            sandbox("s1", "web", "u1", 0, true, 2),
        ];
        assert_eq!(chosen(&any, &listed), Some("s1".into()));
    }

    #[test]
    fn the_cache_keeps_only_listed_sandboxes() {
        let known = |netns: Option<&str>| Known {
            netns: netns.map(PathBuf::from),
            ips: Vec::new(),
        };
        let mut cache = Cache::from([
            ("gone".to_string(), known(Some("/a"))),
            ("here".to_string(), known(None)),
        ]);
        prune(&mut cache, &[sandbox("here", "web", "u", 0, false, 1)]);
        assert_eq!(cache.keys().collect::<Vec<_>>(), ["here"]);
    }
}
