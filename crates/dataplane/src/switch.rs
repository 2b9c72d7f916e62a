//! Moving a node from one backend to the other: each backend, when it first meets a netns,
//! removes what the other one left there, so a pod is never filtered by both.
//!
//! This is the one module that knows both backends. Each backend only runs the
//! [`SwitchCleanup`](crate::apply::SwitchCleanup) it was given; the constructors here give it
//! the other backend's removal. That keeps [`nft_apply`](crate::nft_apply) and
//! [`iptables_apply`] from importing each other.

use std::path::Path;

use netwarden_render::RenderOptions;

use crate::apply::ApplyError;
use crate::iptables_apply::{self, IptablesDataplane, IptablesError};
use crate::nft_apply::NftDataplane;

impl NftDataplane {
    /// The nft backend; where it finds the iptables backend's chains, it removes them with
    /// their sets once its own table is in place.
    pub fn new(options: RenderOptions) -> Self {
        NftDataplane::with_switch_cleanup(options, remove_iptables_leftovers)
    }
}

impl IptablesDataplane {
    /// The iptables backend; on its first contact with a netns (and on `remove`), it deletes
    /// the nft backend's table there, once its own rules are in place.
    pub fn new(options: RenderOptions) -> Self {
        IptablesDataplane::with_switch_cleanup(options, remove_nft_leftovers)
    }
}

/// The nft backend's cleanup: the iptables backend's chains and sets (moving from iptables to
/// nft).
fn remove_iptables_leftovers(netns: &Path) -> Result<(), ApplyError> {
    iptables_apply::remove_from(netns).map_err(|source| ApplyError::iptables(netns, source))
}

/// The iptables backend's cleanup: the nft backend's table (moving from nft to iptables). A
/// netns gone meanwhile has nothing left to clean.
fn remove_nft_leftovers(netns: &Path) -> Result<(), ApplyError> {
    if !crate::libnft::available() {
        // Without libnftables the nft backend never ran on this machine.
        return Ok(());
    }
    match NftDataplane::remove_table(netns) {
        Ok(_) => Ok(()),
        Err(e) if e.netns_gone() => Ok(()),
        Err(e) => Err(ApplyError::iptables(
            netns,
            IptablesError::NftLeftover(e.to_string()),
        )),
    }
}
