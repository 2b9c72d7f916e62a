//! The `netwarden` command line: analysis (`reach`, `explain`, `diff`, `validate`), `crd`, and the commands
//! that touch the kernel (`render`, `apply`, `run`, `lab`, `demo`), each a thin edge over the
//! library crates. Here is only the entry point: the arguments are declared in [`cli`], each
//! command's work is one function of [`commands`].

mod cli;
mod commands;

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;

use cli::{Cli, Command, LogFormat};
use commands::{agent, analysis, crd, lab, promote, report};

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Reach(args) => analysis::reach_command(args),
        Command::Explain(args) => analysis::explain_command(args),
        Command::Validate(args) => analysis::validate_command(args),
        Command::Diff(args) => analysis::diff_command(args),
        Command::Render(args) => analysis::render_command(args),
        Command::Apply(args) => agent::agent_command(args, true),
        Command::Run(args) => agent::agent_command(args, false),
        Command::Lab(command) => lab::lab_command(command),
        Command::Report(args) => report::report_command(args),
        Command::Promote(args) => promote::promote_command(args),
        Command::Suggest(args) => report::suggest_command(args),
        Command::Crd => crd::crd_command(),
        Command::Demo(args) => lab::demo_command(args),
    }
}

/// Log lines to stderr, filtered by `RUST_LOG` (default `info`), in `format`.
fn init_logging(format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        // One JSON object per line; the event's fields at the top level (`message`, ...),
        // so collectors need no nested lookups.
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// mimalloc hands freed pages back to the kernel by itself (see `Cargo.toml`); glibc's malloc,
/// still used by libnftables, is trimmed by the agent (`netwarden_agent::memory`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    // After the logger, so that a failure is reported; the setting covers memory mapped before.
    netwarden_agent::memory::no_transparent_huge_pages();
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("netwarden: {err:#}");
            ExitCode::from(2)
        }
    }
}
