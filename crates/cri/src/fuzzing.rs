//! Invariants of the verbose-info reader ([`netns_from_verbose_info`]) on arbitrary input, for
//! the cargo-fuzz target `fuzz/fuzz_targets/cri_info.rs` and the CI test `tests/fuzz_info.rs`.
//!
//! The info map is the one input of the agent a runtime controls completely (whatever listens
//! on the CRI socket writes it), and its answer decides which file the agent opens as root and
//! whether a pod is isolated at all. [`check_info`] looks at each input in two ways:
//!
//! - **Raw**: the bytes (lossily UTF-8, as protobuf strings are) as the JSON text under
//!   `info["info"]`, and as the map's only key.
//! - **Described**: the bytes *describe* a verbose info ([`Described`]): the runtimes' shapes
//!   (containerd 1.6 / 2.x, CRI-O, host network) with each section present, null, of the wrong
//!   type or missing, namespace entries of every type, netns paths plausible and hostile
//!   (relative, `..`, NUL, newline, over `PATH_MAX`), unrelated keys, the text cut short. The
//!   reader's answer must equal the one [`Described::expected`] derives from the module
//!   documentation of [`crate::info`], independently of the reader's code.
//!
//! On every answer, raw or described:
//! - nothing panics;
//! - a path returned is non-empty, absolute, at most `MAX_NETNS_PATH` bytes, without control
//!   characters (NUL included) or `..` components, and is the text of a `network` entry's
//!   `path` or of `NetNSPath`, which all agree (the reader invents nothing);
//! - host network (`Ok(None)`) only when a source is there and none of them names a network
//!   namespace; and the cross-check with the sandbox's declared mode (`check_mode`) refuses
//!   NODE with a path and POD without one;
//! - the same info re-serialized (pretty, keys reordered by `serde_json`) or with other keys
//!   added to the map gives the same answer;
//! - an error's message is one line (no control character) of at most `MAX_ERROR_LEN` bytes.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use k8s_cri::v1::NamespaceMode;
// Reads bytes as choices; zeros past the end, so every input describes something and short
// inputs describe small infos.
use netwarden_fuzzbytes::Bytes;
use serde_json::{json, Map, Value};

use crate::client::check_mode;
use crate::info::{netns_from_verbose_info, InfoError, INFO_KEY, MAX_ERROR_LEN, MAX_NETNS_PATH};

/// Checks every invariant of the module documentation on `data`; panics on a violation.
pub fn check_info(data: &[u8]) {
    let text = String::from_utf8_lossy(data).into_owned();
    let _ = check_answer(&HashMap::from([(INFO_KEY.to_string(), text.clone())]));
    let got = check_answer(&HashMap::from([(text, String::new())]));
    assert!(
        matches!(got, Err(InfoError::MissingInfoKey { .. })) || data == INFO_KEY.as_bytes(),
        "a map without the info key: {got:?}"
    );

    let described = Described::from_bytes(data);
    let map = described.map();
    let got = check_answer(&map);
    let expected = described.expected();
    assert_eq!(
        Expected::of(&got),
        expected,
        "the reader's answer {got:?} is not the documented one for {described:#?}\ninfo: {map:?}"
    );
}

/// Runs the reader on `info` and checks the invariants every answer keeps; returns the answer.
fn check_answer(info: &HashMap<String, String>) -> Result<Option<PathBuf>, InfoError> {
    let got = netns_from_verbose_info(info);
    let root = info
        .get(INFO_KEY)
        .and_then(|t| serde_json::from_str::<Value>(t).ok());
    match &got {
        Ok(Some(path)) => {
            let text = path.to_str().expect("a path read from JSON is UTF-8");
            assert!(plain_absolute(text), "path {text:?} returned");
            let named = root.as_ref().map(network_paths).unwrap_or_default();
            assert!(
                !named.is_empty() && named.iter().all(|n| n == text),
                "path {text:?} returned, the info names {named:?}"
            );
        }
        Ok(None) => {
            let root = root
                .as_ref()
                .expect("host network from an info that does not parse");
            let sources = ["runtimeSpec", "sandboxMetadata"]
                .iter()
                .filter(|k| root.get(**k).is_some_and(|v| !v.is_null()))
                .count();
            assert!(sources > 0, "host network without a source: {root}");
            let named = network_paths(root);
            assert!(
                named.is_empty(),
                "host network, but the info names {named:?}"
            );
            let entries = root
                .pointer("/runtimeSpec/linux/namespaces")
                .and_then(Value::as_array)
                .into_iter()
                .flatten();
            for entry in entries {
                assert_ne!(
                    entry.get("type"),
                    Some(&json!("network")),
                    "host network with a network entry: {root}"
                );
            }
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.len() <= MAX_ERROR_LEN,
                "an error of {} bytes: {message}",
                message.len()
            );
            assert!(
                !message.chars().any(char::is_control),
                "a control character in an error: {message:?}"
            );
        }
    }
    // The declared mode cross-check: a path and NODE, or no path and POD, never pass.
    if let Ok(netns) = &got {
        let node = check_mode(Some(NamespaceMode::Node as i32), netns.clone());
        let pod = check_mode(Some(NamespaceMode::Pod as i32), netns.clone());
        assert_eq!(node.is_ok(), netns.is_none(), "NODE and {netns:?}");
        assert_eq!(pod.is_ok(), netns.is_some(), "POD and {netns:?}");
        assert_eq!(check_mode(None, netns.clone()), Ok(netns.clone()));
    }
    // Neither the layout of the JSON nor other keys of the map change the answer.
    if let Some(root) = &root {
        let mut again = info.clone();
        again.insert(INFO_KEY.into(), serde_json::to_string_pretty(root).unwrap());
        again.insert("config".into(), "{\"runtimeSpec\": 7}".into());
        again.insert(String::new(), String::from_utf8_lossy(&[0xff, 0]).into());
        let other = netns_from_verbose_info(&again);
        assert_eq!(
            Expected::of(&other),
            Expected::of(&got),
            "the same info read differently"
        );
    }
    got
}

/// Whether `path` is what the reader may return: a plain absolute path (written here from the
/// module documentation, not taken from the reader).
fn plain_absolute(path: &str) -> bool {
    path.starts_with('/')
        && path.len() <= MAX_NETNS_PATH
        && !path.contains('\0')
        && !path.chars().any(char::is_control)
        && !Path::new(path)
            .components()
            .any(|c| matches!(c, Component::ParentDir))
}

/// Every string the info gives as a network namespace's path (a `network` entry's `path`, a
/// non-empty `NetNSPath`).
fn network_paths(root: &Value) -> Vec<String> {
    let mut out: Vec<String> = root
        .pointer("/runtimeSpec/linux/namespaces")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|e| e.get("type") == Some(&json!("network")))
        .filter_map(|e| e.get("path").and_then(Value::as_str).map(str::to_string))
        .collect();
    if let Some(p) = root
        .pointer("/sandboxMetadata/Metadata/NetNSPath")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
    {
        out.push(p.to_string());
    }
    out
}

// ----- the described info -----------------------------------------------------------------

/// Paths a runtime writes, and ones a hostile or broken one could.
const PATHS: &[&str] = &[
    "/var/run/netns/cni-0d2c6f61-4a4e-6b3f-1c7e-93f4b0d0a2e1",
    "/run/netns/7b3f8f8e-2f55-4d0a-9b3c-4c1f0e6a9d21",
    "/tmp/nwcri4242x1/state/io.containerd.grpc.v1.cri/netns/cni-f194ce91",
    "/proc/4711/ns/net",
    "/",
    "//var//run/./netns/",
    "/var/run/netns/a..b",
    "/var/run/netns/é ü",
    "",
    "var/run/netns/x",
    "./x",
    "..",
    "/..",
    "/var/run/netns/../../etc/shadow",
    "/a/..",
    "/a\0b",
    "/a\nb",
    "/a\u{1b}[2Jb",
    "/a\u{202e}b",
    "\\var\\run",
];

/// Namespace types: the OCI ones, and near misses of `network`.
const TYPES: &[&str] = &[
    "network", "pid", "ipc", "uts", "mount", "user", "cgroup", "time", "Network", "network ",
    "net", "",
];

/// A value of the wrong type for any field.
const ODD: &[&str] = &["7", "true", "[]", "\"x\"", "{}", "[{}]", "-1e400"];

#[derive(Debug, Clone)]
enum Text {
    Absent,
    Null,
    Odd(Value),
    Str(String),
}

impl Text {
    fn from(c: &mut Bytes, list: &[&str]) -> Text {
        match c.below(16) {
            0 => Text::Absent,
            1 => Text::Null,
            2 => match odd(c) {
                Value::String(s) => Text::Str(s),
                v => Text::Odd(v),
            },
            3 => Text::Str(generated_path(c)),
            _ => Text::Str(c.pick(list).to_string()),
        }
    }

    fn put(&self, map: &mut Map<String, Value>, key: &str) {
        match self {
            Text::Absent => {}
            Text::Null => {
                map.insert(key.into(), Value::Null);
            }
            Text::Odd(v) => {
                map.insert(key.into(), v.clone());
            }
            Text::Str(s) => {
                map.insert(key.into(), Value::String(s.clone()));
            }
        }
    }
}

fn odd(c: &mut Bytes) -> Value {
    let text = *c.pick(ODD);
    // "-1e400" is out of f64's range: serde_json refuses it, so it stands for a string.
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.into()))
}

/// A path made of pieces, long ones included (over `PATH_MAX`).
fn generated_path(c: &mut Bytes) -> String {
    const PIECES: &[&str] = &[
        "/",
        "a",
        "..",
        ".",
        "netns",
        "\0",
        "\n",
        "é",
        "/var/run/netns",
    ];
    let mut s = String::new();
    for _ in 0..c.below(12) {
        s.push_str(c.pick::<&str>(PIECES));
    }
    if c.below(8) == 0 {
        let n = usize::from(c.u8()) * 24;
        s = format!("/{}{s}", "x".repeat(n));
    }
    s
}

#[derive(Debug, Clone)]
struct Entry {
    kind: Text,
    path: Text,
}

#[derive(Debug, Clone)]
enum Section {
    Absent,
    Null,
    Odd(Value),
    /// For `runtimeSpec`: its `linux`; for `sandboxMetadata`: its `Metadata`.
    Inner(Inner),
}

#[derive(Debug, Clone)]
enum Inner {
    Absent,
    Null,
    Odd(Value),
    /// `linux.namespaces`, or the record's `NetNSPath`.
    Object(Field),
}

#[derive(Debug, Clone)]
enum Field {
    /// `namespaces`: absent (`Absent`), null, odd, or a list; `NetNSPath`: a [`Text`].
    Namespaces(Option<Result<Vec<Entry>, Value>>, bool),
    NetNsPath(Text),
}

/// A verbose info, described: which keys the map has and what its JSON holds.
#[derive(Debug, Clone)]
pub struct Described {
    info_key: bool,
    other_keys: Vec<String>,
    /// `None`: the root is this value instead of an object.
    root_odd: Option<Value>,
    spec: Section,
    metadata: Section,
    /// Keys of the info the reader does not look at (`pid`, `cniResult`, ...).
    extras: Vec<(String, Value)>,
    /// Cut the JSON text to this many bytes (fewer than it has).
    cut: Option<usize>,
}

impl Described {
    pub fn from_bytes(data: &[u8]) -> Described {
        let c = &mut Bytes::new(data);
        let flags = c.u8();
        let info_key = flags % 32 != 1;
        let other_keys = (0..flags % 3)
            .map(|_| c.pick(&["config", "", "Info", "info "]).to_string())
            .collect();
        let root_odd = (c.below(24) == 0).then(|| odd(c));
        let spec = Described::section(c, true);
        let metadata = Described::section(c, false);
        let extras = (0..c.below(4))
            .map(|_| {
                let key = c.pick(&["pid", "image", "cniResult", "config", "runtimeType"]);
                let value = match c.below(3) {
                    0 => json!(4711),
                    1 => json!({"Interfaces": {"eth0": {"Sandbox": c.pick(PATHS)}}}),
                    _ => odd(c),
                };
                (key.to_string(), value)
            })
            .collect();
        let cut = (c.below(16) == 0).then(|| usize::from(c.u8()) * 8 + usize::from(c.u8()));
        Described {
            info_key,
            other_keys,
            root_odd,
            spec,
            metadata,
            extras,
            cut,
        }
    }

    fn section(c: &mut Bytes, spec: bool) -> Section {
        match c.below(12) {
            0 | 1 => Section::Absent,
            2 => Section::Null,
            3 => Section::Odd(odd(c)),
            _ => Section::Inner(match c.below(12) {
                0 => Inner::Absent,
                1 => Inner::Null,
                2 => Inner::Odd(odd(c)),
                _ if spec => {
                    let extra = c.below(2) == 0;
                    Inner::Object(Field::Namespaces(
                        match c.below(10) {
                            0 => None,
                            1 => Some(Err(Value::Null)),
                            2 => Some(Err(odd(c))),
                            _ => Some(Ok((0..c.below(7))
                                .map(|_| Entry {
                                    kind: Text::from(c, TYPES),
                                    path: Text::from(c, PATHS),
                                })
                                .collect())),
                        },
                        extra,
                    ))
                }
                _ => Inner::Object(Field::NetNsPath(Text::from(c, PATHS))),
            }),
        }
    }

    /// The info's JSON value.
    fn json(&self) -> Value {
        if let Some(odd) = &self.root_odd {
            return odd.clone();
        }
        let mut root = Map::new();
        for (k, v) in &self.extras {
            root.insert(k.clone(), v.clone());
        }
        for (key, section, inner_key) in [
            ("runtimeSpec", &self.spec, "linux"),
            ("sandboxMetadata", &self.metadata, "Metadata"),
        ] {
            let value = match section {
                Section::Absent => continue,
                Section::Null => Value::Null,
                Section::Odd(v) => v.clone(),
                Section::Inner(inner) => {
                    let mut outer = Map::new();
                    outer.insert("ociVersion".into(), json!("1.1.0"));
                    match inner {
                        Inner::Absent => {}
                        Inner::Null => {
                            outer.insert(inner_key.into(), Value::Null);
                        }
                        Inner::Odd(v) => {
                            outer.insert(inner_key.into(), v.clone());
                        }
                        Inner::Object(field) => {
                            outer.insert(inner_key.into(), Value::Object(field.json()));
                        }
                    }
                    Value::Object(outer)
                }
            };
            root.insert(key.into(), value);
        }
        Value::Object(root)
    }

    /// The info map, as the runtime would send it.
    pub fn map(&self) -> HashMap<String, String> {
        let mut map: HashMap<String, String> = self
            .other_keys
            .iter()
            .map(|k| (k.clone(), "{}".to_string()))
            .collect();
        if self.info_key {
            let mut text = self.json().to_string();
            if let Some(cut) = self.cut.filter(|&cut| cut < text.len()) {
                let mut cut = cut;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                text.truncate(cut);
            }
            map.insert(INFO_KEY.into(), text);
        }
        map
    }

    /// What the reader must answer, from the module documentation of [`crate::info`].
    pub fn expected(&self) -> Expected {
        let map = self.map();
        let Some(text) = map.get(INFO_KEY) else {
            return Expected::MissingInfoKey;
        };
        let whole = self.json().to_string();
        if *text != whole {
            // Cut short: JSON text cut inside its outermost value never parses, but a
            // cut scalar (`-1` of `-1e400`, say) might.
            if serde_json::from_str::<Value>(text).is_err() {
                return Expected::Json;
            }
        }
        if self.root_odd.as_ref().is_some_and(|v| !v.is_object()) {
            return Expected::Field(String::new());
        }
        let root = serde_json::from_str::<Value>(text).expect("a whole described info parses");
        if self.root_odd.is_some() {
            // An odd `{}` root: no source at all.
            return if root.as_object().is_some_and(|m| m.is_empty()) {
                Expected::NoSource
            } else {
                Expected::Field(String::new())
            };
        }
        let spec = match &self.spec {
            Section::Absent | Section::Null => None,
            // `{}`, `[]`, a number...: no `linux` in any of them.
            Section::Odd(_) => return Expected::Field("runtimeSpec.linux".into()),
            Section::Inner(inner) => Some(match inner {
                Inner::Absent | Inner::Null => return Expected::Field("runtimeSpec.linux".into()),
                Inner::Odd(v) if !v.is_object() => {
                    return Expected::Field("runtimeSpec.linux".into())
                }
                // `linux: {}`: no namespaces, the node's.
                Inner::Odd(_) => None,
                Inner::Object(Field::Namespaces(namespaces, _)) => {
                    match spec_netns(namespaces.as_ref()) {
                        Ok(path) => path,
                        Err(e) => return e,
                    }
                }
                Inner::Object(Field::NetNsPath(_)) => unreachable!("a spec has namespaces"),
            }),
        };
        const NETNS_PATH: &str = "sandboxMetadata.Metadata.NetNSPath";
        let metadata = match &self.metadata {
            Section::Absent | Section::Null => None,
            Section::Odd(_) => return Expected::Field("sandboxMetadata.Metadata".into()),
            Section::Inner(inner) => Some(match inner {
                Inner::Absent | Inner::Null => {
                    return Expected::Field("sandboxMetadata.Metadata".into())
                }
                Inner::Odd(v) if !v.is_object() => {
                    return Expected::Field("sandboxMetadata.Metadata".into())
                }
                // `Metadata: {}`: containerd always writes `NetNSPath`.
                Inner::Odd(_) => return Expected::Field(NETNS_PATH.into()),
                Inner::Object(Field::NetNsPath(text)) => match text {
                    Text::Absent | Text::Null | Text::Odd(_) => {
                        return Expected::Field(NETNS_PATH.into())
                    }
                    Text::Str(s) if s.is_empty() => None,
                    Text::Str(s) if plain_absolute(s) => Some(s.clone()),
                    Text::Str(_) => return Expected::Field(NETNS_PATH.into()),
                },
                Inner::Object(Field::Namespaces(..)) => unreachable!("a record has NetNSPath"),
            }),
        };
        match (spec, metadata) {
            (None, None) => Expected::NoSource,
            (Some(p), None) | (None, Some(p)) => p.map_or(Expected::Host, Expected::Netns),
            (Some(a), Some(b)) if a == b => a.map_or(Expected::Host, Expected::Netns),
            (Some(_), Some(_)) => Expected::Disagree,
        }
    }
}

/// The spec's answer from its `namespaces`: `Ok(None)` for none, `Ok(Some(path))`, or the
/// error.
fn spec_netns(namespaces: Option<&Result<Vec<Entry>, Value>>) -> Result<Option<String>, Expected> {
    let entries = match namespaces {
        None | Some(Err(Value::Null)) => return Ok(None),
        // The odd arrays are `[]` (no namespaces) and `[{}]` (an entry without a type).
        Some(Err(Value::Array(odd))) if odd.is_empty() => return Ok(None),
        Some(Err(Value::Array(_))) => {
            return Err(Expected::Field(
                "runtimeSpec.linux.namespaces[0].type".into(),
            ))
        }
        Some(Err(_)) => return Err(Expected::Field("runtimeSpec.linux.namespaces".into())),
        Some(Ok(entries)) => entries,
    };
    let mut found = None;
    for (i, entry) in entries.iter().enumerate() {
        let Text::Str(kind) = &entry.kind else {
            return Err(Expected::Field(format!(
                "runtimeSpec.linux.namespaces[{i}].type"
            )));
        };
        if kind != "network" {
            continue;
        }
        if found.is_some() {
            return Err(Expected::Field(format!(
                "runtimeSpec.linux.namespaces[{i}]"
            )));
        }
        match &entry.path {
            Text::Str(p) if plain_absolute(p) => found = Some(p.clone()),
            _ => {
                return Err(Expected::Field(format!(
                    "runtimeSpec.linux.namespaces[{i}].path"
                )))
            }
        }
    }
    Ok(found)
}

impl Field {
    fn json(&self) -> Map<String, Value> {
        let mut map = Map::new();
        match self {
            Field::Namespaces(namespaces, extra) => {
                if *extra {
                    map.insert("cgroupsPath".into(), json!("kubepods:cri-containerd:0f6a"));
                }
                match namespaces {
                    None => {}
                    Some(Err(v)) => {
                        map.insert("namespaces".into(), v.clone());
                    }
                    Some(Ok(entries)) => {
                        let list = entries
                            .iter()
                            .map(|e| {
                                let mut m = Map::new();
                                e.kind.put(&mut m, "type");
                                e.path.put(&mut m, "path");
                                Value::Object(m)
                            })
                            .collect();
                        map.insert("namespaces".into(), Value::Array(list));
                    }
                }
            }
            Field::NetNsPath(text) => {
                map.insert("ID".into(), json!("0f6a2d1c9b7e"));
                text.put(&mut map, "NetNSPath");
            }
        }
        map
    }
}

/// An answer of the reader, as the documentation tells it: errors by kind and field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    Host,
    Netns(String),
    MissingInfoKey,
    Json,
    Field(String),
    NoSource,
    Disagree,
}

impl Expected {
    fn of(answer: &Result<Option<PathBuf>, InfoError>) -> Expected {
        match answer {
            Ok(None) => Expected::Host,
            Ok(Some(p)) => Expected::Netns(p.to_string_lossy().into_owned()),
            Err(InfoError::MissingInfoKey { .. }) => Expected::MissingInfoKey,
            Err(InfoError::Json { .. }) => Expected::Json,
            Err(InfoError::Field { field, .. }) => Expected::Field(field.clone()),
            Err(InfoError::NoNamespaceSource) => Expected::NoSource,
            Err(InfoError::Disagree { .. }) => Expected::Disagree,
        }
    }
}
