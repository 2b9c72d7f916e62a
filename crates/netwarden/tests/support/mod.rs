//! Shared pieces of the conformance runner: the case file format, the expected-matrix text,
//! the derivation of variants (dual-stack, MultiNetworkPolicy, DanmNetworkPolicy), the
//! invocation of `netwarden reach` and which steps share a lab.

pub mod case;
pub mod lab;
pub mod matrix;
pub mod reach;
pub mod variant;
