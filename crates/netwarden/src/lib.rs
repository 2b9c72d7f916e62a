//! The `netwarden` command's library part: the analyses behind `reach`, `explain` and
//! `validate`, kept out of `main.rs` so tests and benchmarks call them directly.
#![forbid(unsafe_code)]

pub mod cli_args;
pub mod explain;
pub mod inventory;
pub mod reach;
