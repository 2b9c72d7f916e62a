//! netwarden-render: pure functions from the engine's [`PodRules`](netwarden_engine::PodRules)
//! to the text a pod netns is programmed with.
//!
//! - [`nft`]: one `nft -f` transaction updating table `inet netwarden` in place (the default
//!   backend): chains flushed and refilled, peer sets named by content, no set deleted while a
//!   rule being replaced may still look it up.
//! - [`iptables`]: `iptables-restore`/`ip6tables-restore` text (seed 004's compatibility backend).
//! - [`options`]: marks, NFLOG group, rate limits and the switches of SPEC 3.1.
//! - [`logkey`]: the NFLOG prefix contract between the rules and the event collector.
//! - [`tracer`]: a packet tracer walking the same intermediate representation the nft text is
//!   rendered from, so verdict tests need no kernel.
//!
//! Nothing from an object's names, labels or annotations is written into the rule text: chains,
//! sets and log prefixes use generated names, and interface names (validated at the edge) are
//! the only strings from the outside world, always quoted.

#![forbid(unsafe_code)]

pub mod iptables;
pub mod logkey;
pub mod nft;
pub mod options;
pub mod tracer;

pub use logkey::{
    log_key_for, log_keys, log_prefix, parse_log_prefix, LogAction, LogKey, LogKeyInfo,
};

pub use iptables::{render_iptables, IptablesRuleset};
pub use nft::{render_nft, rule_count};
pub use options::RenderOptions;
