//! `crd`: the CustomResourceDefinitions netwarden serves, printed as YAML.

use std::process::ExitCode;

use anyhow::Result;

/// `crd`: the CRDs, generated from netwarden's types.
pub fn crd_command() -> Result<ExitCode> {
    print!("{}", netwarden::crd::render_yaml()?);
    Ok(ExitCode::SUCCESS)
}
