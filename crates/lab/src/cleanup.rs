//! Tearing labs down: from a live [`crate::Lab`], from a saved [`LabState`] (`lab down` run as a
//! separate command), by prefix ([`cleanup_stale`]), and on SIGINT/SIGTERM/SIGHUP
//! ([`install_signal_cleanup`]).
//!
//! Deleting a lab is deleting its namespaces: the veths and bridges live only inside them and go
//! away with them. Names come from our own state, but a state file can be edited, so every name
//! is checked to belong to the lab's instance prefix before it is handed to `ip netns del`.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use netwarden_dataplane::netns::{exec, list_named, valid_name};
use serde::{Deserialize, Serialize};

use crate::plan::valid_prefix;
use crate::LabError;

/// What `lab down` needs to remove a lab built by another process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabState {
    /// `<prefix>-<6 hex>`; every netns below starts with it followed by `-`.
    pub instance: String,
    pub fabric: String,
    pub pods: Vec<LabStatePod>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabStatePod {
    pub namespace: String,
    pub name: String,
    pub netns: String,
}

impl LabState {
    pub fn netns_names(&self) -> Vec<String> {
        std::iter::once(self.fabric.clone())
            .chain(self.pods.iter().map(|p| p.netns.clone()))
            .collect()
    }
}

fn owned_by(instance: &str, name: &str) -> bool {
    valid_name(name)
        && name
            .strip_prefix(instance)
            .is_some_and(|rest| rest.starts_with('-'))
}

/// Deletes whichever of `names` exist; returns the names that could not be deleted.
pub(crate) fn delete_netns(names: &[String]) -> Result<(), LabError> {
    let existing = list_named()?;
    let targets: Vec<&String> = names.iter().filter(|n| existing.contains(n)).collect();
    if targets.is_empty() {
        return Ok(());
    }
    let script: String = targets.iter().map(|n| format!("netns del {n}\n")).collect();
    // -force: go on after a failed line, so one stuck netns does not keep the others alive.
    let result = exec("ip", &["-force", "-batch", "-"], Some(script.as_bytes()));
    let existing = list_named()?;
    let left: Vec<String> = names
        .iter()
        .filter(|n| existing.contains(n))
        .cloned()
        .collect();
    if !left.is_empty() {
        return Err(LabError::Leftover {
            names: left,
            cause: result.err().map(|e| e.to_string()),
        });
    }
    Ok(())
}

/// Removes the lab described by `state` (validated against its instance prefix).
pub fn teardown_from_state(state: &LabState) -> Result<(), LabError> {
    let names = state.netns_names();
    if let Some(bad) = names.iter().find(|n| !owned_by(&state.instance, n)) {
        return Err(LabError::Invalid(format!(
            "state names netns {bad:?}, which is not part of lab {:?}",
            state.instance
        )));
    }
    unregister(&state.instance);
    delete_netns(&names)
}

/// Deletes every named netns whose name starts with `prefix` followed by `-` (e.g. `nwlab`
/// removes all labs; `nwlab-1a2b3c` one lab). Returns the names deleted.
pub fn cleanup_stale(prefix: &str) -> Result<Vec<String>, LabError> {
    if !valid_prefix(prefix) {
        return Err(LabError::Invalid(format!("bad lab prefix {prefix:?}")));
    }
    let names: Vec<String> = list_named()?
        .into_iter()
        .filter(|n| owned_by(prefix, n))
        .collect();
    delete_netns(&names)?;
    Ok(names)
}

/// Labs alive in this process, for the signal handler.
fn registry() -> &'static Mutex<BTreeMap<String, LabState>> {
    static LABS: OnceLock<Mutex<BTreeMap<String, LabState>>> = OnceLock::new();
    LABS.get_or_init(Default::default)
}

pub(crate) fn register(state: LabState) {
    registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(state.instance.clone(), state);
}

pub(crate) fn unregister(instance: &str) {
    registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(instance);
}

/// Makes SIGINT, SIGTERM and SIGHUP delete every lab still alive in this process, then exit
/// with status 128 + signal. Call once, early in a CLI that builds labs; later calls are no-ops.
///
/// A dedicated thread receives the signals (signal-hook's self-pipe), so the cleanup runs
/// outside signal context and may spawn `ip`. Labs register themselves in `Lab::up` and
/// unregister on `down`/drop.
pub fn install_signal_cleanup() -> Result<(), LabError> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    static INSTALLED: OnceLock<()> = OnceLock::new();
    if INSTALLED.get().is_some() {
        return Ok(());
    }
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]).map_err(LabError::Thread)?;
    std::thread::Builder::new()
        .name("lab-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                // Hold the lock to the end so no lab is registered meanwhile.
                let labs = registry().lock().unwrap_or_else(|p| p.into_inner());
                for state in labs.values() {
                    let _ = delete_netns(&state.netns_names());
                }
                std::process::exit(128 + signal);
            }
        })
        .map_err(LabError::Thread)?;
    let _ = INSTALLED.set(());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_needs_instance_and_dash() {
        assert!(owned_by("nwlab-abc123", "nwlab-abc123-f"));
        assert!(owned_by("nwlab", "nwlab-abc123-3"));
        assert!(!owned_by("nwlab-abc123", "nwlab-abc1234-1"));
        assert!(!owned_by("nwlab-abc123", "nwlab-abc123"));
        assert!(!owned_by("nwlab", "other"));
        assert!(!owned_by("nwlab", "nwlab-../x"));
    }

    #[test]
    fn tampered_state_is_refused() {
        let state = LabState {
            instance: "nwlab-abc123".into(),
            fabric: "nwlab-abc123-f".into(),
            pods: vec![LabStatePod {
                namespace: "n".into(),
                name: "p".into(),
                netns: "default".into(),
            }],
        };
        assert!(matches!(
            teardown_from_state(&state),
            Err(LabError::Invalid(_))
        ));
        assert!(matches!(cleanup_stale(""), Err(LabError::Invalid(_))));
        assert!(matches!(cleanup_stale("x y"), Err(LabError::Invalid(_))));
    }
}
