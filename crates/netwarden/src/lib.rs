//! The `netwarden` command's library part: the analyses behind `reach`, `explain`, `diff`,
//! `suggest`, `promote` and `validate`, the CRDs behind `crd` and the kinds the agent watches,
//! the HTML pages and the printing of `reach` and `diff` ([`output`]), the lab and the demo,
//! kept out of `main.rs` so tests and benchmarks call them directly. The node agent (`run`,
//! `apply`) is the `netwarden-agent` crate.
#![forbid(unsafe_code)]

pub mod cli_args;
pub mod crd;
pub mod demo;
pub mod demo_kube;
pub mod demo_loop;
pub mod diff;
pub mod explain;
pub mod html;
pub mod inventory;
/// The kinds the agent watches and the permissions that follows (owned by the watchers' crate).
pub use netwarden_kube::kinds;
pub mod lab;
pub mod output;
pub mod promote;
pub mod reach;
pub mod suggest;
pub mod synthetic;
