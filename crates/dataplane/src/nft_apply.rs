//! The nftables dataplane: `nft -f -` inside the pod netns, one transaction per apply.
//!
//! The rendered text replaces table `inet netwarden` atomically (see
//! [`netwarden_render::nft`]): `nft -f` commits the whole file in one netlink batch, so a
//! failure leaves the previous table in place and packets never see a half-built table. Nothing
//! here touches another table: removal deletes `inet netwarden` only, and only when it exists.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use netwarden_render::nft::{render_removal, TABLE_FAMILY, TABLE_NAME};

use crate::apply::{netns_gone, ApplyError, ApplyOutcome, Backend, Dataplane, RenderedRuleset};
use crate::netns::{exec_in, NetnsError};

/// Applies nft rulesets, skipping those identical to the last successful apply of the netns.
#[derive(Debug)]
pub struct NftDataplane {
    /// Hash of the ruleset last applied successfully, per netns path. Dropped on any failure,
    /// so the next sync of that netns is a full one.
    last_applied: HashMap<PathBuf, u64>,
    /// The `nft` program (a path in tests or unusual installs).
    program: String,
}

impl Default for NftDataplane {
    fn default() -> Self {
        Self::new()
    }
}

impl NftDataplane {
    pub fn new() -> Self {
        NftDataplane {
            last_applied: HashMap::new(),
            program: "nft".into(),
        }
    }

    /// Uses another `nft` binary.
    pub fn with_program(program: impl Into<String>) -> Self {
        NftDataplane {
            last_applied: HashMap::new(),
            program: program.into(),
        }
    }

    /// The netns this dataplane believes are programmed (applied and not forgotten).
    pub fn known(&self) -> impl Iterator<Item = &Path> {
        self.last_applied.keys().map(PathBuf::as_path)
    }

    /// Whether table `inet netwarden` exists in `netns`.
    pub fn table_exists(&self, netns: &Path) -> Result<bool, NetnsError> {
        let out = exec_in(
            netns,
            &self.program,
            &["list", "tables", TABLE_FAMILY],
            None,
        )?;
        let wanted = format!("table {TABLE_FAMILY} {TABLE_NAME}");
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.trim() == wanted))
    }

    /// Runs `nft -c -f -` (check only, nothing changes) on `text` inside `netns`.
    pub fn check(&self, netns: &Path, text: &str) -> Result<(), NetnsError> {
        exec_in(
            netns,
            &self.program,
            &["-c", "-f", "-"],
            Some(text.as_bytes()),
        )
        .map(|_| ())
    }

    fn run_transaction(&self, netns: &Path, text: &str) -> Result<(), NetnsError> {
        exec_in(netns, &self.program, &["-f", "-"], Some(text.as_bytes())).map(|_| ())
    }

    fn remove_inner(&self, netns: &Path) -> Result<(), NetnsError> {
        match self.table_exists(netns) {
            // The removal transaction (declare + delete) also succeeds if the table vanished
            // since we looked, and never names any other table.
            Ok(true) => self.run_transaction(netns, &render_removal()),
            Ok(false) => Ok(()),
            // The pod and its netns are gone: so are its rules.
            Err(e) if netns_gone(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Dataplane for NftDataplane {
    fn apply(
        &mut self,
        netns: &Path,
        ruleset: &RenderedRuleset,
    ) -> Result<ApplyOutcome, ApplyError> {
        if ruleset.backend != Backend::Nft {
            return Err(ApplyError::WrongBackend {
                backend: "nft",
                got: ruleset.backend.as_str(),
            });
        }
        let hash = ruleset.content_hash();
        if self.last_applied.get(netns) == Some(&hash) {
            return Ok(ApplyOutcome::Unchanged);
        }
        // Forget first: whatever happens below, a failure must leave no stale hash behind.
        self.last_applied.remove(netns);
        if ruleset.is_removal() {
            self.remove_inner(netns)
                .map_err(|source| ApplyError::Remove {
                    netns: netns.to_owned(),
                    source,
                })?;
            self.last_applied.insert(netns.to_owned(), hash);
            return Ok(ApplyOutcome::Removed);
        }
        let text = ruleset.nft.as_deref().unwrap_or_default();
        self.run_transaction(netns, text)
            .map_err(|source| ApplyError::Apply {
                netns: netns.to_owned(),
                source,
            })?;
        self.last_applied.insert(netns.to_owned(), hash);
        Ok(ApplyOutcome::Applied)
    }

    fn remove(&mut self, netns: &Path) -> Result<(), ApplyError> {
        self.last_applied.remove(netns);
        self.remove_inner(netns)
            .map_err(|source| ApplyError::Remove {
                netns: netns.to_owned(),
                source,
            })
    }

    fn read_back(&self, netns: &Path) -> Result<Option<String>, ApplyError> {
        let err = |source| ApplyError::ReadBack {
            netns: netns.to_owned(),
            source,
        };
        if !self.table_exists(netns).map_err(err)? {
            return Ok(None);
        }
        let out = exec_in(
            netns,
            &self.program,
            &["list", "table", TABLE_FAMILY, TABLE_NAME],
            None,
        )
        .map_err(err)?;
        Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned()))
    }

    fn forget(&mut self, netns: &Path) {
        self.last_applied.remove(netns);
    }

    fn forget_all(&mut self) {
        self.last_applied.clear();
    }
}
