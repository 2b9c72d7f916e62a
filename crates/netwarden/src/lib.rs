//! The `netwarden` command's library part: the analyses behind `reach`, `explain` and
//! `validate`, kept out of `main.rs` so tests and benchmarks call them directly.
#![forbid(unsafe_code)]

pub mod agent;
pub mod cli_args;
pub mod demo;
pub mod explain;
pub mod inventory;
pub mod lab;
pub mod reach;
pub mod source;
pub mod sync;
