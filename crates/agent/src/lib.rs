//! netwarden's node agent: `netwarden run -f DIR` (standalone, on a directory of manifests),
//! `netwarden run --kube` (the DaemonSet, on a cluster's watchers) and `netwarden apply` (one
//! pass). The analysis commands live in the `netwarden` crate; this crate is what runs on a
//! node and touches its kernel.
//!
//! The parts, from the outside in:
//! - [`agent`]: the [`Agent`] value, its named state and one method per step of a pass
//!   (feed, place, sync, observe, report events), and its one async runtime.
//! - [`source`]: where objects come from (files or the cluster) and where a local pod's netns
//!   is (the CRI runtime or what the objects declare).
//! - [`placement`]: which netns and interfaces each local pod gets, and which pods are refused
//!   or locked down (what the runtime and the kernel say wins over annotations).
//! - [`sync`]: the pods' rules to the kernel, through a backend (nftables or iptables).
//! - [`status_tracker`], [`policy_events`]: monitored policies' status records, and the
//!   Kubernetes Events on bad policies.
//! - [`shutdown`], [`memory`], [`node_paths`]: the process around it.
// Unsafe code: only `memory` (one call into the C allocator), with its reasons.
#![deny(unsafe_code)]

pub mod agent;
pub mod memory;
pub mod node_paths;
pub mod placement;
pub mod policy_events;
pub mod revocations;
pub mod shutdown;
pub mod source;
pub mod status_tracker;
pub mod sync;
pub mod tamper_guard;

pub use agent::{run, AgentConfig};
