//! Knobs of the rendered rules that are not policy: marks, NFLOG group, log rate limits, the
//! learn-mode window and set size, and the forwarding switch of SPEC 3.1 (which DNS the rules imply is the engine's decision). Shared by the nft and iptables renderers and by the monitor (which
//! needs the NFLOG group to listen on).

/// Options common to every backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RenderOptions {
    /// NFLOG group of would-deny and deny messages. NFLOG is per network namespace, so one
    /// group serves every pod: the collector listens once per pod netns.
    pub nflog_group: u16,
    /// Packet mark bit set when the STAGED view allows (seed 000 proposes 0x40000).
    pub staged_mark: u32,
    /// Packet mark bit set when the ENFORCED view allows (monitor bookkeeping only).
    pub allow_mark: u32,
    /// Log messages per minute, per pod and direction (a named limit per direction).
    pub log_rate_per_minute: u32,
    /// Burst of the log rate limit, in packets.
    pub log_burst: u32,
    /// Packets forwarded through an isolated pod's netns are rejected (SPEC 3.1; off for pods
    /// that route).
    pub reject_forward: bool,
    /// Learn mode: how long a flow stays in the kernel's set of seen flows, i.e. each distinct
    /// flow is logged once per this many seconds (`--learn-window`).
    pub learn_window_secs: u64,
    /// Learn mode: elements of each seen-flow set (per family and direction). A flow that finds
    /// its set full is not logged; it is counted in the table's counter `lrn_full`.
    pub learn_set_size: u32,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            nflog_group: 100,
            staged_mark: 0x40000,
            allow_mark: 0x20000,
            log_rate_per_minute: 10,
            log_burst: 10,
            reject_forward: true,
            learn_window_secs: 3600,
            learn_set_size: 65_536,
        }
    }
}

impl RenderOptions {
    /// Both bookkeeping bits, the ones the monitor evaluation owns in the packet mark.
    pub fn monitor_bits(&self) -> u32 {
        self.staged_mark | self.allow_mark
    }

    /// Checks the marks are usable: non-zero and disjoint (they share one mark word), and the
    /// rate limit non-zero (nft rejects `rate 0/minute`).
    pub fn validate(&self) -> Result<(), String> {
        if self.staged_mark == 0 || self.allow_mark == 0 {
            return Err("staged_mark and allow_mark must be non-zero".into());
        }
        if self.staged_mark & self.allow_mark != 0 {
            return Err(format!(
                "staged_mark {:#x} and allow_mark {:#x} overlap",
                self.staged_mark, self.allow_mark
            ));
        }
        if self.learn_window_secs == 0 || self.learn_set_size == 0 {
            return Err("learn window and learn set size must be non-zero".into());
        }
        if self.log_rate_per_minute == 0 || self.log_burst == 0 {
            return Err("log rate and burst must be non-zero".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_seeds() {
        let o = RenderOptions::default();
        assert_eq!(o.staged_mark, 0x40000);
        assert_eq!(o.monitor_bits(), 0x60000);
        assert!(o.validate().is_ok());
        let bad = RenderOptions {
            allow_mark: 0x40000,
            ..o
        };
        assert!(bad.validate().is_err());
    }
}
