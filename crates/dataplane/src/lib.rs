//! netwarden-dataplane: everything that touches a pod's network namespace.
//!
//! - [`netns`]: opening a network namespace (only a real one, and never the agent's own unless
//!   allowed), entering it on a dedicated thread, and running commands in it.
//! - [`conntrack`]: the tracked connections of a netns (ctnetlink), and ending those a new
//!   ruleset refuses (revocation).
//! - [`discover`]: listing the interfaces and L3 addresses found inside a netns (rtnetlink).
//! - [`apply`]: the [`Dataplane`] trait (render, apply, remove, read back one pod netns's
//!   rules), one implementation per backend, each with its own ruleset type.
//! - [`nft_apply`]: the nftables implementation; [`nft_plan`] plans its transactions (pure),
//!   [`libnft`] commits them in process, [`nft_contexts`] keeps a context per netns.
//! - [`iptables_apply`]: the iptables compatibility implementation (seed 004), failing with an
//!   [`iptables_error::IptablesError`].
//! - [`switch`]: moving between backends; the one module that knows both, it gives each the
//!   removal of the other's rules (and holds their `new`).
//! - [`fake`]: an in-memory nft implementation for tests of the reconcile loop.
//! - [`watch`]: the kernel's notifications of interface and address changes, per netns.
//! - [`tamper`]: what tamper repair finds (differences between what was applied and the
//!   kernel), shared by the backends; [`nft_verify`] compares the nft table.

// Unsafe code is confined to the modules that talk to C (libnftables) or the kernel directly,
// each with its reasons; everything else is safe Rust.
#![deny(unsafe_code)]

pub mod apply;
pub mod conntrack;
pub mod discover;
pub mod fake;
pub mod iptables_apply;
pub mod iptables_error;
pub mod libnft;
pub mod netns;
pub mod nfnetlink;
pub mod nft_apply;
pub mod nft_contexts;
pub mod nft_netlink;
pub mod nft_plan;
pub mod nft_verify;
pub mod switch;
pub mod tamper;
pub mod watch;

pub use apply::{ApplyError, ApplyOutcome, Backend, Dataplane, EvidenceCounters};
pub use discover::{interfaces, interfaces_of, DiscoverError, DiscoveredInterface};
pub use fake::FakeDataplane;
pub use iptables_apply::IptablesDataplane;
pub use netns::{exec_in, netns_id, run_in, Netns, NetnsAccess, NetnsError, NetnsId};
pub use nft_apply::NftDataplane;
pub use watch::{InterfaceWatch, Rules, RulesNews, RulesWatch, WatchError};
