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
//! path — no `info` key, JSON that does not parse, a spec whose `linux` is missing or not an
//! object, a `Metadata` without its `NetNSPath` string, sources that disagree — is an error
//! naming the field: the caller must not mistake an unreadable answer for a host-network pod
//! (that pod would go unisolated).
//!
//! The answer comes from another process (the runtime, or whatever listens on its socket), so
//! a path is only returned when it is a plain absolute path ([`MAX_NETNS_PATH`] bytes at most,
//! no control character — NUL included — and no `..` component): the agent opens it as root
//! (the dataplane then refuses anything but a network namespace other than its own). An
//! error's message is one line of at most [`MAX_ERROR_LEN`] bytes however long or odd the
//! runtime's text: it is logged, and shown in the pod's status.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

/// The key of `PodSandboxStatusResponse.info` that holds the JSON, for every runtime above.
pub const INFO_KEY: &str = "info";

/// The longest netns path accepted, in bytes: `PATH_MAX` less its terminating NUL (the kernel
/// refuses longer ones anyway, with a less telling error).
pub const MAX_NETNS_PATH: usize = 4095;

/// The longest an [`InfoError`]'s message can be, in bytes.
pub const MAX_ERROR_LEN: usize = 1024;

/// How much of a runtime's string (a path, a key) an error quotes, in bytes of escaped text
/// (one escaped character more at most): with [`MAX_KEYS_LISTED`], what keeps a message
/// under [`MAX_ERROR_LEN`].
const MAX_QUOTED: usize = 96;

/// How many of the info's keys [`InfoError::MissingInfoKey`] lists.
const MAX_KEYS_LISTED: usize = 6;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InfoError {
    #[error("verbose info has no {INFO_KEY:?} key (keys: {}): is verbose=true, and is this a runtime netwarden knows (containerd 1.6+, CRI-O)?", quoted_keys(.keys))]
    MissingInfoKey { keys: Vec<String> },
    #[error("verbose info[{INFO_KEY:?}] is not JSON: {reason}")]
    Json { reason: String },
    #[error("verbose info field {field}: {reason}")]
    Field { field: String, reason: String },
    #[error("verbose info names neither runtimeSpec.linux.namespaces nor sandboxMetadata.Metadata.NetNSPath: the sandbox's network namespace cannot be told")]
    NoNamespaceSource,
    #[error("verbose info disagrees on the network namespace: runtimeSpec says {}, sandboxMetadata.Metadata.NetNSPath says {}", quoted_path(.spec), quoted_path(.metadata))]
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
    // `linux` of the wrong type would otherwise read as "no namespaces": host network.
    let linux = match spec.get("linux") {
        Some(linux @ Value::Object(_)) => linux,
        None | Some(Value::Null) => return Err(field("runtimeSpec.linux", "missing")),
        Some(_) => return Err(field("runtimeSpec.linux", "is not an object")),
    };
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
        found = Some(netns_path(
            format!("runtimeSpec.linux.namespaces[{i}].path"),
            path,
        )?);
    }
    Ok(found)
}

/// `sandboxMetadata.Metadata.NetNSPath` (containerd 2.x): empty for a host-network sandbox.
/// containerd writes the field always (a Go string without `omitempty`), so a record without
/// it is not one this reader knows, not a host-network sandbox.
fn netns_in_metadata(meta: &Value) -> Result<Option<PathBuf>, InfoError> {
    let metadata = match meta.get("Metadata") {
        Some(metadata @ Value::Object(_)) => metadata,
        None | Some(Value::Null) => return Err(field("sandboxMetadata.Metadata", "missing")),
        Some(_) => return Err(field("sandboxMetadata.Metadata", "is not an object")),
    };
    const NAME: &str = "sandboxMetadata.Metadata.NetNSPath";
    match metadata.get("NetNSPath") {
        None | Some(Value::Null) => Err(field(NAME, "missing")),
        Some(Value::String(p)) if p.is_empty() => Ok(None),
        Some(Value::String(p)) => netns_path(NAME, p).map(Some),
        Some(_) => Err(field(NAME, "is not a string")),
    }
}

/// `path` as a netns path the agent may open, or an error naming the field (see the module
/// documentation for what is accepted).
fn netns_path(name: impl Into<String>, path: &str) -> Result<PathBuf, InfoError> {
    let problem = if !path.starts_with('/') {
        "is not an absolute path"
    } else if path.len() > MAX_NETNS_PATH {
        "is longer than PATH_MAX"
    } else if path.chars().any(char::is_control) {
        "has a control character"
    } else if Path::new(path)
        .components()
        .any(|c| c == Component::ParentDir)
    {
        "has a \"..\" component"
    } else {
        return Ok(PathBuf::from(path));
    };
    Err(field(name, format!("{} {problem}", quoted(path))))
}

/// A runtime's string as an error shows it: quoted with Rust's escapes (so one line, whatever
/// it holds), cut once the escaped text reaches [`MAX_QUOTED`] bytes.
fn quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        if out.len() >= MAX_QUOTED {
            return format!("{out}\"... ({} bytes)", s.len());
        }
        out.extend(c.escape_debug());
    }
    out.push('"');
    out
}

fn quoted_path(path: &Option<PathBuf>) -> String {
    match path {
        Some(p) => quoted(&p.to_string_lossy()),
        None => "none (host network)".to_string(),
    }
}

fn quoted_keys(keys: &[String]) -> String {
    let mut shown: Vec<String> = keys
        .iter()
        .take(MAX_KEYS_LISTED)
        .map(|k| quoted(k))
        .collect();
    if keys.len() > MAX_KEYS_LISTED {
        shown.push(format!("and {} more", keys.len() - MAX_KEYS_LISTED));
    }
    format!("[{}]", shown.join(", "))
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
        assert_field_errors(&cases);
    }

    /// Each info is refused with an error naming the field given beside it.
    fn assert_field_errors(cases: &[(&str, &str)]) {
        for (json, want) in cases {
            match netns_from_verbose_info(&info(json)) {
                Err(InfoError::Field { field, .. }) => assert_eq!(field, *want, "{json}"),
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

    /// Found while writing the fuzz target's reference: a `linux` or `Metadata` of the wrong
    /// type (or a record without `NetNSPath`) read as "no network namespace", i.e. host
    /// network, and the pod would have gone unisolated.
    #[test]
    fn a_section_of_the_wrong_type_is_not_host_network() {
        let cases = [
            (r#"{"runtimeSpec":{"linux":7}}"#, "runtimeSpec.linux"),
            (r#"{"runtimeSpec":{"linux":[]}}"#, "runtimeSpec.linux"),
            (r#"{"runtimeSpec":{"linux":null}}"#, "runtimeSpec.linux"),
            (r#"{"runtimeSpec":{"linux":"x"}}"#, "runtimeSpec.linux"),
            (
                r#"{"sandboxMetadata":{"Metadata":7}}"#,
                "sandboxMetadata.Metadata",
            ),
            (
                r#"{"sandboxMetadata":{"Metadata":null}}"#,
                "sandboxMetadata.Metadata",
            ),
            (
                r#"{"sandboxMetadata":{"Metadata":{}}}"#,
                "sandboxMetadata.Metadata.NetNSPath",
            ),
            (
                r#"{"sandboxMetadata":{"Metadata":{"NetNSPath":null}}}"#,
                "sandboxMetadata.Metadata.NetNSPath",
            ),
        ];
        assert_field_errors(&cases);
    }

    /// A hostile or broken runtime cannot make the agent open a path with `..`, a NUL or a
    /// newline in it, or one the kernel would refuse as too long.
    #[test]
    fn only_plain_absolute_paths_are_returned() {
        let long = format!("/{}", "a".repeat(MAX_NETNS_PATH));
        let bad = [
            "/var/run/netns/../../etc/shadow",
            "/..",
            "/a/..",
            "/var/run/netns/x\\u0000y",
            "/var/run/netns/x\\ny",
            "/var/run/netns/x\\u001b[2J",
            &long,
        ];
        for path in bad {
            for json in [
                format!(
                    r#"{{"runtimeSpec":{{"linux":{{"namespaces":[{{"type":"network","path":"{path}"}}]}}}}}}"#
                ),
                format!(r#"{{"sandboxMetadata":{{"Metadata":{{"NetNSPath":"{path}"}}}}}}"#),
            ] {
                let got = netns_from_verbose_info(&info(&json));
                let Err(e @ InfoError::Field { .. }) = &got else {
                    panic!("{path:?}: {got:?}");
                };
                let message = e.to_string();
                assert!(message.len() <= MAX_ERROR_LEN, "{message}");
                assert!(!message.chars().any(char::is_control), "{message:?}");
            }
        }
        // Odd but plain: accepted as written (the dataplane checks what the file is).
        let at_limit = format!("/{}", "a".repeat(MAX_NETNS_PATH - 1));
        for path in [
            "/var/run/netns/a..b",
            "/var/run/netns/./x",
            "//x",
            "/",
            &at_limit,
        ] {
            let json = format!(r#"{{"sandboxMetadata":{{"Metadata":{{"NetNSPath":"{path}"}}}}}}"#);
            assert_eq!(
                netns_from_verbose_info(&info(&json)),
                Ok(path_of(path)),
                "{path}"
            );
        }
    }

    fn path_of(p: &str) -> Option<PathBuf> {
        Some(PathBuf::from(p))
    }

    #[test]
    fn errors_quote_at_most_a_bounded_part_of_the_runtime_text() {
        let many: HashMap<String, String> = (0..1000)
            .map(|i| (format!("key-{i}-{}", "\n".repeat(300)), String::new()))
            .collect();
        let message = netns_from_verbose_info(&many).unwrap_err().to_string();
        assert!(message.len() <= MAX_ERROR_LEN, "{} bytes", message.len());
        assert!(message.contains("and 994 more"), "{message}");
        assert!(!message.contains('\n'));
        let a = format!("/{}", "\u{10ffff}".repeat(1000));
        let b = format!("/{}", "\u{7}".repeat(MAX_NETNS_PATH - 1));
        let json = serde_json::json!({
            "runtimeSpec": {"linux": {"namespaces": [{"type": "network", "path": a}]}},
            "sandboxMetadata": {"Metadata": {"NetNSPath": "/other"}},
        });
        let message = netns_from_verbose_info(&info(&json.to_string()))
            .unwrap_err()
            .to_string();
        assert!(message.contains("... (4001 bytes)"), "{message}");
        assert!(message.len() <= MAX_ERROR_LEN, "{} bytes", message.len());
        let message = quoted_keys(&[b]);
        assert!(
            message.len() < 200 && !message.chars().any(char::is_control),
            "{message}"
        );
    }
}
