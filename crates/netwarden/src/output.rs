//! `netwarden reach` and `netwarden diff` as the command prints them: JSON, a table, or one
//! self-contained HTML page.
//!
//! Here, above both the analyses ([`crate::reach`], [`crate::diff`]) and the pages
//! ([`crate::html::matrix`]), because a page is built from an analysis's result: the analyses
//! know nothing of HTML, and the pages only read what the analyses computed.

use std::io::{self, Write};
use std::process::ExitCode;

use netwarden_engine::{Engine, EngineOptions};
use netwarden_manifest::Inventory;

use crate::diff::{denies_any, diff, write_json, write_table};
use crate::html::matrix::{diff_page, reach_page, render};
use crate::reach::{Reach, ReachQuery};

/// How `netwarden reach` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReachFormat {
    Json,
    Table,
    /// One self-contained page with the matrices (see [`crate::html`]).
    Html,
}

/// How `netwarden diff` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiffFormat {
    Json,
    Table,
    /// One self-contained page of the changed cells ([`crate::html::matrix::diff_page`]).
    Html,
}

/// `netwarden reach`: computes every pod's rules once, then writes the probes of `query` to
/// `out` as they are computed.
pub fn reach_command(
    mut engine: Engine,
    query: &ReachQuery,
    format: ReachFormat,
    out: impl Write,
) -> anyhow::Result<ExitCode> {
    let rules = engine.all_pod_rules();
    let reach = Reach::new(&engine, &rules, query);
    let mut out = io::BufWriter::new(out);
    match format {
        ReachFormat::Json => reach.write_json(&mut out)?,
        ReachFormat::Table => reach.write_table(&mut out)?,
        ReachFormat::Html => {
            let page = reach_page(&reach, "netwarden reach");
            out.write_all(render(&page).as_bytes())?;
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `netwarden diff`: computes the changes, prints them, and with `fail_on_deny` exits 1 when
/// a flow goes from allowed to denied.
pub fn diff_command(
    base: &Inventory,
    changed: &Inventory,
    options: &EngineOptions,
    query: &ReachQuery,
    format: DiffFormat,
    fail_on_deny: bool,
    out: impl Write,
) -> anyhow::Result<ExitCode> {
    let changes = diff(base, changed, options, query);
    let mut out = io::BufWriter::new(out);
    match format {
        DiffFormat::Json => write_json(&changes, &mut out)?,
        DiffFormat::Table => write_table(&changes, &mut out)?,
        DiffFormat::Html => {
            let page = diff_page(&changes, "netwarden diff");
            out.write_all(render(&page).as_bytes())?;
        }
    }
    out.flush()?;
    Ok(if fail_on_deny && denies_any(&changes) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
