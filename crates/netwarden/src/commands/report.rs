//! The commands that read the agents' event streams: `report` (the evidence per monitored
//! policy) and `suggest` (policies from observed flows); with [`evidence_report`], the reading
//! that `promote --require-ready` shares.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use netwarden_manifest::LoadOptions;

use crate::cli::report::{ReportArgs, SuggestArgs};
use crate::cli::PageOutput;

/// Reads event streams (events and status records); bad lines are reported and skipped.
fn read_streams(paths: &[PathBuf]) -> Result<netwarden_monitor::Stream> {
    let mut all = netwarden_monitor::Stream::default();
    for path in paths {
        let stream = if path.as_os_str() == "-" {
            netwarden_monitor::read_stream(std::io::stdin().lock())?
        } else {
            netwarden_monitor::read_stream_file(path)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?
        };
        for b in &stream.bad {
            eprintln!("{}: {b}", path.display());
        }
        all.events.extend(stream.events);
        all.statuses.extend(stream.statuses);
    }
    Ok(all)
}

/// The report over `events` files as of now, with the stream it was made from.
pub fn evidence_report(
    events: &[PathBuf],
    monitored: &[String],
    clean_for: std::time::Duration,
) -> Result<(netwarden_monitor::Report, netwarden_monitor::Stream)> {
    let stream = read_streams(events)?;
    let report = netwarden_monitor::aggregate_with(
        &stream.events,
        &stream.statuses,
        monitored,
        netwarden_monitor::Timestamp::now(),
        clean_for,
    );
    Ok((report, stream))
}

/// The monitored policies of `inventory` as the events name them: `ns/name`, and `Kind/name`
/// for the admin policies (SPEC 8).
fn monitored_in(inventory: &netwarden_manifest::Inventory) -> Vec<String> {
    use netwarden_engine::{Mode, MonitoredRef};
    let namespaced = inventory
        .policies
        .iter()
        .filter(|p| p.mode == Mode::Monitor)
        .map(|p| MonitoredRef::from(p.reference()));
    let admin = inventory
        .admin_policies
        .iter()
        .filter(|p| p.mode == Mode::Monitor)
        .map(|p| MonitoredRef::from(p.reference()));
    namespaced.chain(admin).map(|r| r.to_string()).collect()
}

pub fn report_command(args: ReportArgs) -> Result<ExitCode> {
    let monitored: Vec<String> = if args.paths.is_empty() {
        Vec::new()
    } else {
        monitored_in(&netwarden_manifest::load_paths(
            &args.paths,
            &LoadOptions::default(),
        ))
    };
    let (report, stream) = evidence_report(&args.events, &monitored, args.clean_for)?;
    match args.output {
        PageOutput::Json => println!("{}", report.render_json()),
        PageOutput::Table => print!("{}", report.render_text()),
        PageOutput::Html => {
            let page =
                netwarden::html::report::report_page(&report, &stream.events, "netwarden report");
            print!("{}", netwarden::html::report::render(&page));
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn suggest_command(args: SuggestArgs) -> Result<ExitCode> {
    let inventory = args.input.inventory()?;
    args.input.options.check(&inventory)?;
    netwarden::suggest::command(
        &inventory,
        args.input.options.engine_options(false),
        &args.events,
        args.kind.kind(),
        std::io::stdout().lock(),
    )
}
