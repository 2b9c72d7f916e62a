//! netwarden-dataplane: everything that touches a pod's network namespace.
//!
//! - [`netns`]: opening a network namespace (only a real one, and never the agent's own unless
//!   allowed), entering it on a dedicated thread, and running commands in it.
//! - [`discover`]: listing the interfaces and L3 addresses found inside a netns (rtnetlink).
//! - [`apply`]: the [`Dataplane`] trait (apply / remove / read back one pod netns's rules).
//! - [`nft_apply`]: the nftables implementation (`nft -f -` in the pod netns, one transaction).
//! - [`nft_session`]: a long-lived `nft -i` per netns, which [`nft_apply`] sends transactions to.
//! - [`fake`]: an in-memory implementation for tests of the reconcile loop.

// Denied, not forbidden: `netns::check` needs one `ioctl` (NS_GET_NSTYPE), allowed there alone.
#![deny(unsafe_code)]

pub mod apply;
pub mod discover;
pub mod fake;
pub mod iptables_apply;
pub mod netns;
pub mod nft_apply;
pub mod nft_session;

pub use apply::{ApplyError, ApplyOutcome, Backend, Dataplane, RenderedRuleset};
pub use discover::{interfaces, DiscoverError, DiscoveredInterface};
pub use fake::FakeDataplane;
pub use iptables_apply::IptablesDataplane;
pub use netns::{exec_in, netns_id, run_in, Netns, NetnsAccess, NetnsError, NetnsId};
pub use nft_apply::NftDataplane;
