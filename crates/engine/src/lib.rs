//! netwarden's policy engine: a pure function from the cluster's objects to, for every pod
//! interface and direction, whether it is isolated and which rules allow traffic — in the
//! enforced view and in the staged (monitor) view — plus verdicts for single flows.
//!
//! ```text
//!   Namespace ─┐                      ┌─> PodRules ─> render (nft / iptables)
//!   Pod ───────┤   Engine (indexes,   │     └─ InterfaceRules × {ingress, egress}
//!   Policy ────┼─> peer-set cache,    ┤          └─ DirectionRules {enforced, staged}
//!   Service ───┘   dirty tracking)    └─> verdicts / explain / reach
//! ```
//!
//! This crate does no I/O and depends on nothing that could: loading, Kubernetes, netlink and
//! processes live in the crates that depend on it.
//!
//! `fuzzing` (feature `fuzzing`) decodes a small cluster and its changes from arbitrary bytes
//! and checks the engine against a reference evaluation of the specification (the cargo-fuzz
//! target `engine` and `tests/fuzz_engine.rs`). `testing` (feature `testing`) holds the object
//! builders of every crate's tests and benchmarks. Neither is compiled into the netwarden
//! binary; test builds get both through the dev-dependency `netwarden-testing`.
#![forbid(unsafe_code)]

pub mod addrset;
pub mod admin;
pub mod hash;
pub mod labelindex;
pub mod labels;
pub mod model;
mod peersets;
pub mod selectorindex;

pub use addrset::AddrSet;
pub use admin::{
    AdminAction, AdminKind, AdminPeer, AdminPolicy, AdminPort, AdminRef, AdminRule, MonitoredRef,
    Node, PodsSelector, Tier,
};
pub use model::*;
pub mod engine;
// Fuzzing and its CI replays only (feature `fuzzing`): not compiled into the netwarden binary.
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod generate;
pub mod judge;
pub mod revocation;
pub mod rules;
pub mod sorted;

pub use engine::{selects, AddressChanges, DnsMode, Engine, EngineOptions};
pub use rules::*;
// Tests, benchmarks and examples only (feature `testing`; and this crate's unit tests).
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod verdict;
pub use judge::{judge, Judgement, TrackedFlow};
pub use verdict::{flow_verdict, side_allows, FlowEnd, FlowVerdict, SideVerdict};
