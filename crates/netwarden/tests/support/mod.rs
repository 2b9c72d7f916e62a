//! Shared pieces of the conformance runner: the case file format, the expected-matrix text,
//! the derivation of variants (dual-stack, MultiNetworkPolicy, DanmNetworkPolicy) and the
//! invocation of `netwarden reach`.

pub mod case;
pub mod matrix;
pub mod reach;
pub mod variant;
