//! What the command-line tests (`diff_cli`, `kube_analysis`, `promote`) share: running this
//! build's `netwarden`, the examples, and its JSON output.

#![allow(dead_code)] // each test binary uses a part of these helpers

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use netwarden_testing::{netwarden_bin, output_within};
use serde_json::Value;

/// `netwarden ARGS` (this build), failing the test if it runs longer than 30 s.
pub fn netwarden(args: &[&str]) -> Output {
    output_within(
        Command::new(netwarden_bin!()).args(args),
        Duration::from_secs(30),
        &format!("netwarden {args:?}"),
    )
}

/// The examples' manifests directory.
pub fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/multinet")
}

/// A successful command's stdout as JSON.
pub fn stdout_json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "status {:?}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}
