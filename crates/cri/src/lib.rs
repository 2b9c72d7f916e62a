//! Pod network namespaces from the node's CRI runtime — SPEC 6: "netns come from the CRI
//! runtime (PodSandboxStatus)".
//!
//! Kubernetes never tells where a pod's network namespace is; the container runtime that made
//! it does, in the debugging "verbose info" of CRI's `PodSandboxStatus`. This crate asks it:
//!
//! - [`CriClient`] speaks CRI `runtime.v1` over the runtime's Unix socket
//!   (`unix:///run/containerd/containerd.sock`, `unix:///var/run/crio/crio.sock`; see
//!   [`default_endpoint`]) and only reads: ListPodSandbox, PodSandboxStatus(verbose).
//! - [`netns_from_verbose_info`] is the pure reading of the verbose info; [`info`] documents
//!   each shape and where in the runtimes' sources it comes from.
//! - `fuzzing` (hidden; feature `fuzzing`) states what the reader keeps on any answer, for the
//!   `cri_info` fuzz target and its CI replay (`tests/fuzz_info.rs`).
//! - [`NetnsResolver`] turns the pods the agent needs into netns paths, choosing the newest
//!   READY sandbox of each ([`choose_sandbox`]) and asking about each sandbox once.
//!
//! Runtimes and versions handled:
//!
//! | runtime | netns read from | checked how |
//! | --- | --- | --- |
//! | containerd 1.6, 1.7 | `info["info"].runtimeSpec.linux.namespaces[type=network].path` | real containerd 1.6.20 (Debian 12) in `tests/containerd.rs`; fixture `fixtures/containerd-1.6.json` captured from it |
//! | containerd 2.x | the same, and `info["info"].sandboxMetadata.Metadata.NetNSPath` (both must agree; either alone is enough) | fixtures written from containerd v2 sources (`internal/cri/server/podsandbox/types/sandbox_info.go`) |
//! | CRI-O | `info["info"].runtimeSpec.linux.namespaces[type=network].path` of the infra container (`server/sandbox_status.go`, `createSandboxInfo`, v1.36) | fixtures written from those sources |
//!
//! A host-network sandbox is told by the absence of a network namespace path, cross-checked
//! with `status.linux.namespaces.options.network` (NODE) when the runtime reports it; any
//! answer that cannot be read is an error, never taken for host network. The socket must be
//! the runtime's CRI socket (containerd's main socket serves CRI when its `cri` plugin is
//! enabled, which is the default in packaged containerd used by kubelet).

pub mod client;
// Fuzzing and its CI replays only (feature `fuzzing`): not compiled into the netwarden binary.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod info;
pub mod resolver;

pub use client::{
    default_endpoint, default_endpoint_among, socket_path, CriClient, CriError, Sandbox,
    SandboxState, SandboxSummary, DEFAULT_ENDPOINTS,
};
pub use info::{netns_from_verbose_info, InfoError, INFO_KEY};
pub use resolver::{choose_sandbox, NetnsResolver, PodKey, PodNetns};
