//! What can fail in the iptables backend ([`IptablesError`]), one variant per stage.
//!
//! A module of its own, below both [`apply`](crate::apply) (whose
//! [`ApplyError`](crate::apply::ApplyError) carries it) and the backend in
//! [`iptables_apply`](crate::iptables_apply) (which raises it), so that neither of those two
//! has to import the other for it.

use crate::netns::{netns_gone, NetnsError};

#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    #[error("ipset restore failed: {0}")]
    Ipset(#[source] NetnsError),
    #[error("iptables-restore (IPv4) failed: {0}")]
    RestoreV4(#[source] NetnsError),
    #[error("ip6tables-restore (IPv6) failed: {0}")]
    RestoreV6(#[source] NetnsError),
    #[error("reading back the rules failed: {0}")]
    ReadBack(#[source] NetnsError),
    #[error("cannot destroy stale ipset {name}: {source}")]
    Destroy { name: String, source: NetnsError },
    #[error("cannot determine the iptables variant: {0}")]
    Version(String),
    #[error("removing the nft backend's table: {0}")]
    NftLeftover(String),
    #[error("the evidence counters were lost when the rules were replaced: {0}")]
    CountersLost(String),
}

impl IptablesError {
    /// Whether the failure is the netns being gone (the pod is gone, and its rules with it).
    pub fn netns_gone(&self) -> bool {
        match self {
            IptablesError::Ipset(e)
            | IptablesError::RestoreV4(e)
            | IptablesError::RestoreV6(e)
            | IptablesError::ReadBack(e)
            | IptablesError::Destroy { source: e, .. } => netns_gone(e),
            IptablesError::Version(_)
            | IptablesError::NftLeftover(_)
            | IptablesError::CountersLost(_) => false,
        }
    }
}
