//! netwarden-render: pure functions from the engine's [`PodRules`](netwarden_engine::PodRules)
//! to the text a pod netns is programmed with.
//!
//! - [`nft`]: the table `inet netwarden` as a typed value and the transactions updating it in
//!   place (the default backend), printed as nft syntax for people and as libnftables JSON for
//!   the kernel: chains flushed and refilled, peer sets named by content, no set deleted while a
//!   rule being replaced may still look it up.
//! - [`iptables`]: `iptables-restore`/`ip6tables-restore` text and typed ipsets (seed 004's
//!   compatibility backend).
//! - [`dispatch`]: which packets each base chain sends to which interface's policy chain (by
//!   the address a packet is sent to, then by interface; unknown interfaces closed), one plan
//!   both backends print.
//! - [`options`]: marks, NFLOG group, rate limits and the forwarding switch of SPEC 3.1.
//! - `fuzzing` (feature `fuzzing`): pod rules from arbitrary bytes and the invariants every
//!   rendering keeps.
//! - [`logkey`]: the NFLOG prefix contract between the rules and the event collector.
//! - [`tracer`]: a packet tracer walking the same intermediate representation the nft text is
//!   rendered from, so verdict tests need no kernel.
//!
//! Nothing from an object's names, labels or annotations is written into the rules: chains,
//! sets and log prefixes use generated names. Interface names are the only strings from the
//! outside world; each backend matches them exactly (escaped as its syntax needs) or refuses the
//! pod ([`RenderError`]) — an interface is never silently left out.

#![forbid(unsafe_code)]

pub mod dispatch;
// Fuzzing and its CI replays only (feature `fuzzing`): not compiled into the netwarden binary.
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod iptables;
pub mod logkey;
pub mod nft;
pub mod options;
pub mod tiers;
pub mod tracer;

pub use logkey::{
    counter_name, log_key_for, log_keys, log_prefix, parse_counter_name, parse_log_prefix,
    CounterKind, LogAction, LogKey, LogKeyInfo,
};

pub use iptables::{render_iptables, IptablesRuleset};
pub use nft::{render_nft, rule_count, RenderError};
pub use options::RenderOptions;
