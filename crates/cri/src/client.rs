//! The CRI client: the runtime service of CRI v1 (k8s-cri's generated client on tonic) over
//! the runtime's Unix socket, reduced to what netwarden reads — the pod sandboxes and where
//! their network namespaces are. It never changes anything in the runtime.
//!
//! Only CRI `runtime.v1` is spoken: containerd 1.6+ and CRI-O 1.20+ serve it (v1alpha2 was
//! removed from kubelet in 1.26 and from containerd in 2.0).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ListPodSandboxRequest, NamespaceMode, PodSandboxMetadata, PodSandboxState,
    PodSandboxStatusRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::info::{netns_from_verbose_info, InfoError};

/// containerd's CRI socket, then CRI-O's: what kubelet's documentation names as the defaults.
pub const DEFAULT_ENDPOINTS: [&str; 2] = [
    "unix:///run/containerd/containerd.sock",
    "unix:///var/run/crio/crio.sock",
];

/// How long one CRI call may take: the runtime answers these from memory in about a
/// millisecond; a runtime that hangs must not hang the agent.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("CRI endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("CRI endpoint {endpoint:?}: cannot connect: {source}")]
    Connect {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("CRI {call}{}: {} ({})", sandbox_suffix(.sandbox), .status.message(), .status.code())]
    Call {
        call: &'static str,
        sandbox: Option<String>,
        status: Box<tonic::Status>,
    },
    #[error("CRI {call}: sandbox {sandbox:?}: the answer has no {field}")]
    Missing {
        call: &'static str,
        sandbox: String,
        field: &'static str,
    },
    #[error("CRI PodSandboxStatus: sandbox {sandbox:?} ({pod}): {source}")]
    Info {
        sandbox: String,
        pod: String,
        #[source]
        source: InfoError,
    },
    #[error("CRI PodSandboxStatus: sandbox {sandbox:?} ({pod}): status.linux.namespaces.options.network is {mode}, but the verbose info says {netns}")]
    ModeMismatch {
        sandbox: String,
        pod: String,
        mode: &'static str,
        netns: String,
    },
}

fn sandbox_suffix(sandbox: &Option<String>) -> String {
    sandbox
        .as_deref()
        .map(|s| format!(" of sandbox {s:?}"))
        .unwrap_or_default()
}

impl CriError {
    /// Whether the runtime said the sandbox does not exist (it was removed between a list and
    /// a status call): the caller treats the pod as not yet known.
    pub fn is_not_found(&self) -> bool {
        matches!(self, CriError::Call { status, .. } if status.code() == tonic::Code::NotFound)
    }
}

/// A sandbox's state as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SandboxState {
    Ready,
    NotReady,
}

/// A pod sandbox as ListPodSandbox shows it: who it belongs to, not where its netns is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSummary {
    pub id: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Kubelet's counter of sandboxes it created for this pod (a recreated sandbox has a
    /// higher one).
    pub attempt: u32,
    pub state: SandboxState,
    /// Nanoseconds since the Unix epoch.
    pub created_at: i64,
}

/// A pod sandbox with its network namespace, from PodSandboxStatus (verbose).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    pub id: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub attempt: u32,
    pub state: SandboxState,
    pub created_at: i64,
    /// The netns file; `None` for a host-network sandbox.
    pub netns: Option<PathBuf>,
    /// `status.network.ip` and `additional_ips` as the runtime reports them (empty for host
    /// network or before CNI ran); for information: netwarden reads addresses in the netns.
    pub ips: Vec<String>,
}

/// A connection to the node's CRI runtime. Cheap to clone (one HTTP/2 connection shared).
#[derive(Clone, Debug)]
pub struct CriClient {
    endpoint: String,
    runtime: RuntimeServiceClient<Channel>,
}

/// The socket path of a `unix:///path` endpoint.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, CriError> {
    let bad = |reason: &str| CriError::Endpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let path = endpoint
        .strip_prefix("unix://")
        .ok_or_else(|| bad("only unix:///absolute/path endpoints are supported"))?;
    if !path.starts_with('/') {
        return Err(bad("the socket path must be absolute (unix:///...)"));
    }
    Ok(PathBuf::from(path))
}

/// The first of [`DEFAULT_ENDPOINTS`] whose socket exists, as `exists` tells.
pub fn default_endpoint_among(exists: impl Fn(&Path) -> bool) -> Option<String> {
    DEFAULT_ENDPOINTS
        .iter()
        .find(|e| socket_path(e).is_ok_and(|p| exists(&p)))
        .map(|e| e.to_string())
}

/// containerd's socket, then CRI-O's, whichever exists on this node.
pub fn default_endpoint() -> Option<String> {
    default_endpoint_among(|p| p.exists())
}

impl CriClient {
    /// Connects to `endpoint` (`unix:///path`). The connection is made now, so a wrong path
    /// fails here rather than on the first call.
    pub async fn connect(endpoint: &str) -> Result<CriClient, CriError> {
        let path = socket_path(endpoint)?;
        // The URI is required by tonic but unused: the connector below dials the socket.
        let channel = Endpoint::from_static("http://cri.invalid")
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|source| CriError::Connect {
                endpoint: endpoint.to_string(),
                source,
            })?;
        Ok(CriClient {
            endpoint: endpoint.to_string(),
            runtime: RuntimeServiceClient::new(channel),
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Every sandbox the runtime knows, ready or not (one ListPodSandbox call).
    pub async fn list_sandboxes(&self) -> Result<Vec<SandboxSummary>, CriError> {
        let response = self
            .runtime
            .clone()
            .list_pod_sandbox(ListPodSandboxRequest { filter: None })
            .await
            .map_err(|status| call_error("ListPodSandbox", None, status))?
            .into_inner();
        response
            .items
            .into_iter()
            .map(|s| {
                let (namespace, name, uid, attempt) =
                    metadata("ListPodSandbox", &s.id, s.metadata)?;
                Ok(SandboxSummary {
                    state: state_of(s.state),
                    created_at: s.created_at,
                    id: s.id,
                    namespace,
                    name,
                    uid,
                    attempt,
                })
            })
            .collect()
    }

    /// The verbose info of a sandbox as the runtime sent it (for diagnostics and fixtures).
    pub async fn verbose_info(&self, id: &str) -> Result<HashMap<String, String>, CriError> {
        Ok(self
            .runtime
            .clone()
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.to_string(),
                verbose: true,
            })
            .await
            .map_err(|status| call_error("PodSandboxStatus", Some(id), status))?
            .into_inner()
            .info)
    }

    /// One sandbox with its network namespace (PodSandboxStatus, verbose).
    pub async fn sandbox(&self, id: &str) -> Result<Sandbox, CriError> {
        let response = self
            .runtime
            .clone()
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.to_string(),
                verbose: true,
            })
            .await
            .map_err(|status| call_error("PodSandboxStatus", Some(id), status))?
            .into_inner();
        let status = response.status.ok_or_else(|| CriError::Missing {
            call: "PodSandboxStatus",
            sandbox: id.to_string(),
            field: "status",
        })?;
        let (namespace, name, uid, attempt) = metadata("PodSandboxStatus", id, status.metadata)?;
        let pod = format!("{namespace}/{name} uid {uid}");
        let from_info =
            netns_from_verbose_info(&response.info).map_err(|source| CriError::Info {
                sandbox: id.to_string(),
                pod: pod.clone(),
                source,
            })?;
        let mode = status
            .linux
            .and_then(|l| l.namespaces)
            .and_then(|n| n.options)
            .map(|o| o.network);
        let netns =
            check_mode(mode, from_info).map_err(|(mode, netns)| CriError::ModeMismatch {
                sandbox: id.to_string(),
                pod,
                mode,
                netns,
            })?;
        let ips = status
            .network
            .map(|n| {
                std::iter::once(n.ip)
                    .chain(n.additional_ips.into_iter().map(|ip| ip.ip))
                    .filter(|ip| !ip.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        Ok(Sandbox {
            id: status.id,
            namespace,
            name,
            uid,
            attempt,
            state: state_of(status.state),
            created_at: status.created_at,
            netns,
            ips,
        })
    }
}

/// Cross-checks the verbose info with the sandbox's declared network namespace mode, when the
/// runtime reports one: NODE must come with no path (host network), POD with a path. A
/// disagreement is an error (`(mode, what the info said)`): fail closed rather than guess.
pub(crate) fn check_mode(
    mode: Option<i32>,
    from_info: Option<PathBuf>,
) -> Result<Option<PathBuf>, (&'static str, String)> {
    let said = |n: &Option<PathBuf>| match n {
        Some(p) => format!("netns {}", p.display()),
        None => "host network (no netns path)".to_string(),
    };
    match (
        mode.and_then(|m| NamespaceMode::try_from(m).ok()),
        &from_info,
    ) {
        (Some(NamespaceMode::Node), Some(_)) => Err(("NODE", said(&from_info))),
        (Some(NamespaceMode::Pod), None) => Err(("POD", said(&from_info))),
        _ => Ok(from_info),
    }
}

fn call_error(call: &'static str, sandbox: Option<&str>, status: tonic::Status) -> CriError {
    CriError::Call {
        call,
        sandbox: sandbox.map(str::to_string),
        status: Box::new(status),
    }
}

fn state_of(state: i32) -> SandboxState {
    // Anything but READY (including values this client does not know) is not ready.
    if state == PodSandboxState::SandboxReady as i32 {
        SandboxState::Ready
    } else {
        SandboxState::NotReady
    }
}

fn metadata(
    call: &'static str,
    id: &str,
    metadata: Option<PodSandboxMetadata>,
) -> Result<(String, String, String, u32), CriError> {
    let m = metadata.ok_or_else(|| CriError::Missing {
        call,
        sandbox: id.to_string(),
        field: "metadata",
    })?;
    Ok((m.namespace, m.name, m.uid, m.attempt))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_unix_sockets_with_absolute_paths() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").unwrap(),
            PathBuf::from("/run/containerd/containerd.sock")
        );
        for bad in ["/run/x.sock", "tcp://127.0.0.1:1", "unix://run/x.sock", ""] {
            let err = socket_path(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn default_endpoint_prefers_containerd_then_crio() {
        assert_eq!(
            default_endpoint_among(|_| true).as_deref(),
            Some("unix:///run/containerd/containerd.sock")
        );
        assert_eq!(
            default_endpoint_among(|p| p.starts_with("/var/run/crio")).as_deref(),
            Some("unix:///var/run/crio/crio.sock")
        );
        assert_eq!(default_endpoint_among(|_| false), None);
    }

    #[test]
    fn namespace_mode_and_info_must_agree() {
        let p = Some(PathBuf::from("/var/run/netns/x"));
        let pod = Some(NamespaceMode::Pod as i32);
        let node = Some(NamespaceMode::Node as i32);
        assert_eq!(check_mode(pod, p.clone()), Ok(p.clone()));
        assert_eq!(check_mode(node, None), Ok(None));
        assert_eq!(check_mode(None, p.clone()), Ok(p.clone()));
        assert_eq!(check_mode(None, None), Ok(None));
        assert!(check_mode(node, p).is_err());
        assert!(check_mode(pod, None).is_err());
    }

    #[test]
    fn unknown_states_are_not_ready() {
        assert_eq!(
            state_of(PodSandboxState::SandboxReady as i32),
            SandboxState::Ready
        );
        assert_eq!(
            state_of(PodSandboxState::SandboxNotready as i32),
            SandboxState::NotReady
        );
        assert_eq!(state_of(17), SandboxState::NotReady);
    }
}
