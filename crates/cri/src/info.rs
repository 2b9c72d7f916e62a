//! Where a sandbox's network namespace is, read from the verbose info of `PodSandboxStatus`.
//!
//! The CRI API has no field for the netns path: kubelet never needs it. Every runtime puts its
//! own debugging JSON in `PodSandboxStatusResponse.info` when `verbose = true`, under the key
//! `"info"`; the shapes handled here (the fixtures in `fixtures/` are one of each):
//!
//! - **containerd 1.6 / 1.7** (`pkg/cri/server/sandbox_status.go`, `SandboxInfo`): the OCI
//!   spec of the pause container, `runtimeSpec.linux.namespaces[type == "network"].path`.
//! - **containerd 2.x** (`internal/cri/server/podsandbox/types/sandbox_info.go`): the same
//!   `runtimeSpec` ("may not be populated if the sandbox has not been fully created"), plus the
//!   sandbox store's record `sandboxMetadata` = `{"Version": "v1", "Metadata": {..., "NetNSPath":
//!   ...}}` (`internal/cri/store/sandbox/metadata.go`), which sandboxers without a pause
//!   container still fill.
//! - **CRI-O** (`server/sandbox_status.go`, `createSandboxInfo`, checked at v1.36): `{"image",
//!   "pid", "runtimeSpec"}` of the infra container (only `runtimeSpec` when the infra container
//!   is "spoofed", i.e. dropped); the pinned netns (`/var/run/netns/<uuid>`) is in
//!   `runtimeSpec.linux.namespaces[type == "network"].path` as for containerd.
//!
//! A host-network sandbox has no `network` entry in its spec's namespaces (it shares the
//! node's) and an empty `NetNSPath`: that is `Ok(None)`. Everything else that does not name a
//! path — no `info` key, JSON that does not parse, a spec without `linux`, sources that
//! disagree — is an error naming the field: the caller must not mistake an unreadable answer
//! for a host-network pod (that pod would go unisolated).

use std::collections::HashMap;
use std::path::PathBuf;

use serde_json::Value;

/// The key of `PodSandboxStatusResponse.info` that holds the JSON, for every runtime above.
pub const INFO_KEY: &str = "info";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InfoError {
    #[error("verbose info has no {INFO_KEY:?} key (keys: {keys:?}): is verbose=true, and is this a runtime netwarden knows (containerd 1.6+, CRI-O)?")]
    MissingInfoKey { keys: Vec<String> },
    #[error("verbose info[{INFO_KEY:?}] is not JSON: {reason}")]
    Json { reason: String },
    #[error("verbose info field {field}: {reason}")]
    Field { field: String, reason: String },
    #[error("verbose info names neither runtimeSpec.linux.namespaces nor sandboxMetadata.Metadata.NetNSPath: the sandbox's network namespace cannot be told")]
    NoNamespaceSource,
    #[error("verbose info disagrees on the network namespace: runtimeSpec says {spec:?}, sandboxMetadata.Metadata.NetNSPath says {metadata:?}")]
    Disagree {
        spec: Option<PathBuf>,
        metadata: Option<PathBuf>,
    },
}

/// The netns path of a sandbox from its verbose `PodSandboxStatus` info: `Some(path)` for a
/// sandbox with its own network namespace, `None` for a host-network sandbox.
pub fn netns_from_verbose_info(
    info: &HashMap<String, String>,
) -> Result<Option<PathBuf>, InfoError> {
    let Some(text) = info.get(INFO_KEY) else {
        let mut keys: Vec<String> = info.keys().cloned().collect();
        keys.sort();
        return Err(InfoError::MissingInfoKey { keys });
    };
    let root: Value = serde_json::from_str(text).map_err(|e| InfoError::Json {
        reason: e.to_string(),
    })?;
    if !root.is_object() {
        return Err(field("", "is not a JSON object"));
    }
    let from_spec = match root.get("runtimeSpec") {
        None | Some(Value::Null) => None,
        Some(spec) => Some(netns_in_spec(spec)?),
    };
    let from_metadata = match root.get("sandboxMetadata") {
        None | Some(Value::Null) => None,
        Some(meta) => Some(netns_in_metadata(meta)?),
    };
    match (from_spec, from_metadata) {
        (None, None) => Err(InfoError::NoNamespaceSource),
        (Some(path), None) | (None, Some(path)) => Ok(path),
        (Some(spec), Some(metadata)) if spec == metadata => Ok(spec),
        (Some(spec), Some(metadata)) => Err(InfoError::Disagree { spec, metadata }),
    }
}

/// `runtimeSpec.linux.namespaces[type == "network"].path` of an OCI runtime spec. An entry
/// without a path would mean "a new namespace", which no runtime leaves in a created
/// sandbox's spec: it is an error rather than a guess.
fn netns_in_spec(spec: &Value) -> Result<Option<PathBuf>, InfoError> {
    let linux = spec
        .get("linux")
        .ok_or_else(|| field("runtimeSpec.linux", "missing"))?;
    let namespaces = match linux.get("namespaces") {
        // No namespaces at all: the sandbox shares every namespace with the node.
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(namespaces)) => namespaces,
        Some(_) => return Err(field("runtimeSpec.linux.namespaces", "is not an array")),
    };
    let mut found = None;
    for (i, ns) in namespaces.iter().enumerate() {
        let kind = ns.get("type").and_then(Value::as_str).ok_or_else(|| {
            field(
                format!("runtimeSpec.linux.namespaces[{i}].type"),
                "missing or not a string",
            )
        })?;
        if kind != "network" {
            continue;
        }
        if found.is_some() {
            return Err(field(
                format!("runtimeSpec.linux.namespaces[{i}]"),
                "a second network namespace",
            ));
        }
        let path = match ns.get("path") {
            Some(Value::String(path)) if !path.is_empty() => path,
            _ => {
                return Err(field(
                    format!("runtimeSpec.linux.namespaces[{i}].path"),
                    "missing or empty for the network namespace",
                ))
            }
        };
        found = Some(absolute(
            format!("runtimeSpec.linux.namespaces[{i}].path"),
            path,
        )?);
    }
    Ok(found)
}

/// `sandboxMetadata.Metadata.NetNSPath` (containerd 2.x): empty for a host-network sandbox.
fn netns_in_metadata(meta: &Value) -> Result<Option<PathBuf>, InfoError> {
    let path = meta
        .get("Metadata")
        .ok_or_else(|| field("sandboxMetadata.Metadata", "missing"))?
        .get("NetNSPath");
    match path {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(p)) if p.is_empty() => Ok(None),
        Some(Value::String(p)) => absolute("sandboxMetadata.Metadata.NetNSPath", p).map(Some),
        Some(_) => Err(field(
            "sandboxMetadata.Metadata.NetNSPath",
            "is not a string",
        )),
    }
}

fn absolute(name: impl Into<String>, path: &str) -> Result<PathBuf, InfoError> {
    if path.starts_with('/') {
        Ok(PathBuf::from(path))
    } else {
        Err(field(name, format!("{path:?} is not an absolute path")))
    }
}

fn field(name: impl Into<String>, reason: impl Into<String>) -> InfoError {
    InfoError::Field {
        field: name.into(),
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(json: &str) -> HashMap<String, String> {
        HashMap::from([(INFO_KEY.to_string(), json.to_string())])
    }

    fn path(p: &str) -> Option<PathBuf> {
        Some(PathBuf::from(p))
    }

    #[test]
    fn containerd_1_6_pod_network() {
        let got = netns_from_verbose_info(&info(include_str!("../fixtures/containerd-1.6.json")));
        assert_eq!(
            got,
            Ok(path("/tmp/nwcri4242x1/state/io.containerd.grpc.v1.cri/netns/cni-f194ce91-cc03-98c5-2dbc-2fc0e0087b79"))
        );
    }

    #[test]
    fn containerd_1_6_host_network() {
        let got = netns_from_verbose_info(&info(include_str!(
            "../fixtures/containerd-1.6-hostnetwork.json"
        )));
        assert_eq!(got, Ok(None));
    }

    #[test]
    fn containerd_2_pod_network_from_both_sources() {
        let got = netns_from_verbose_info(&info(include_str!("../fixtures/containerd-2.0.json")));
        assert_eq!(
            got,
            Ok(path(
                "/var/run/netns/cni-0d2c6f61-4a4e-6b3f-1c7e-93f4b0d0a2e1"
            ))
        );
    }

    #[test]
    fn containerd_2_without_runtime_spec_uses_the_metadata() {
        let mut v: Value =
            serde_json::from_str(include_str!("../fixtures/containerd-2.0.json")).unwrap();
        v.as_object_mut().unwrap().remove("runtimeSpec");
        let got = netns_from_verbose_info(&info(&v.to_string()));
        assert_eq!(
            got,
            Ok(path(
                "/var/run/netns/cni-0d2c6f61-4a4e-6b3f-1c7e-93f4b0d0a2e1"
            ))
        );
    }

    #[test]
    fn containerd_2_host_network() {
        let got = netns_from_verbose_info(&info(include_str!(
            "../fixtures/containerd-2.0-hostnetwork.json"
        )));
        assert_eq!(got, Ok(None));
    }

    #[test]
    fn crio_pod_network_and_spoofed_infra() {
        let got = netns_from_verbose_info(&info(include_str!("../fixtures/crio-1.36.json")));
        assert_eq!(
            got,
            Ok(path("/var/run/netns/7b3f8f8e-2f55-4d0a-9b3c-4c1f0e6a9d21"))
        );
        // A dropped ("spoofed") infra container: only runtimeSpec, same answer.
        let spoofed = r#"{"runtimeSpec":{"ociVersion":"1.0.2","linux":{"namespaces":[
            {"type":"ipc","path":"/var/run/ipcns/7b3f8f8e"},
            {"type":"network","path":"/var/run/netns/7b3f8f8e"}]}}}"#;
        assert_eq!(
            netns_from_verbose_info(&info(spoofed)),
            Ok(path("/var/run/netns/7b3f8f8e"))
        );
    }

    #[test]
    fn crio_host_network() {
        let got = netns_from_verbose_info(&info(include_str!(
            "../fixtures/crio-1.36-hostnetwork.json"
        )));
        assert_eq!(got, Ok(None));
    }

    #[test]
    fn malformed_answers_are_errors_naming_the_field() {
        assert!(matches!(
            netns_from_verbose_info(&HashMap::new()),
            Err(InfoError::MissingInfoKey { .. })
        ));
        assert!(matches!(
            netns_from_verbose_info(&info("{\"runtimeSpec\": {")),
            Err(InfoError::Json { .. })
        ));
        assert!(matches!(
            netns_from_verbose_info(&info("[]")),
            Err(InfoError::Field { .. })
        ));
        assert_eq!(
            netns_from_verbose_info(&info(r#"{"pid": 42}"#)),
            Err(InfoError::NoNamespaceSource)
        );
        let cases = [
            (r#"{"runtimeSpec":{}}"#, "runtimeSpec.linux"),
            (
                r#"{"runtimeSpec":{"linux":{"namespaces":{}}}}"#,
                "runtimeSpec.linux.namespaces",
            ),
            (
                r#"{"runtimeSpec":{"linux":{"namespaces":[{"path":"/x"}]}}}"#,
                "runtimeSpec.linux.namespaces[0].type",
            ),
            (
                r#"{"runtimeSpec":{"linux":{"namespaces":[{"type":"network"}]}}}"#,
                "runtimeSpec.linux.namespaces[0].path",
            ),
            (
                r#"{"runtimeSpec":{"linux":{"namespaces":[{"type":"network","path":"rel/ns"}]}}}"#,
                "runtimeSpec.linux.namespaces[0].path",
            ),
            (
                r#"{"runtimeSpec":{"linux":{"namespaces":[{"type":"network","path":"/a"},{"type":"network","path":"/a"}]}}}"#,
                "runtimeSpec.linux.namespaces[1]",
            ),
            (
                r#"{"sandboxMetadata":{"Version":"v1"}}"#,
                "sandboxMetadata.Metadata",
            ),
            (
                r#"{"sandboxMetadata":{"Metadata":{"NetNSPath":7}}}"#,
                "sandboxMetadata.Metadata.NetNSPath",
            ),
        ];
        for (json, want) in cases {
            match netns_from_verbose_info(&info(json)) {
                Err(InfoError::Field { field, .. }) => assert_eq!(field, want, "{json}"),
                other => panic!("{json}: {other:?}"),
            }
        }
    }

    #[test]
    fn sources_that_disagree_are_an_error() {
        let json = r#"{"runtimeSpec":{"linux":{"namespaces":[{"type":"network","path":"/a"}]}},
            "sandboxMetadata":{"Version":"v1","Metadata":{"NetNSPath":"/b"}}}"#;
        assert_eq!(
            netns_from_verbose_info(&info(json)),
            Err(InfoError::Disagree {
                spec: path("/a"),
                metadata: path("/b")
            })
        );
        // Host network in the spec but a path in the metadata: also a disagreement.
        let json = r#"{"runtimeSpec":{"linux":{"namespaces":[]}},
            "sandboxMetadata":{"Version":"v1","Metadata":{"NetNSPath":"/b"}}}"#;
        assert!(matches!(
            netns_from_verbose_info(&info(json)),
            Err(InfoError::Disagree { .. })
        ));
    }
}
