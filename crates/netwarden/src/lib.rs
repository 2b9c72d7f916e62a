//! The `netwarden` command's library part: the analyses behind `reach`, `explain`, `diff`,
//! `suggest`, `promote` and `validate`, the CRDs behind `crd` and the kinds the agent watches,
//! the HTML pages and the printing of `reach` and `diff` ([`output`]), kept out of `main.rs` so
//! tests and benchmarks call them directly.
// Unsafe code: only `memory` (one call into the C allocator), with its reasons.
#![deny(unsafe_code)]

pub mod agent;
pub mod cli_args;
pub mod crd;
pub mod demo;
pub mod demo_loop;
pub mod diff;
pub mod explain;
pub mod html;
pub mod inventory;
/// The kinds the agent watches and the permissions that follows (owned by the watchers' crate).
pub use netwarden_kube::kinds;
pub mod lab;
pub mod memory;
pub mod node_paths;
pub mod output;
pub mod placement;
pub mod policy_events;
pub mod promote;
pub mod reach;
pub mod shutdown;
pub mod source;
pub mod status_tracker;
pub mod suggest;
pub mod sync;
pub mod synthetic;
