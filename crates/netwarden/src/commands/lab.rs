//! `lab` (`check`, `up`, `probe`, `down`) and `demo`: real network namespaces built from
//! manifests, enforced and probed with real traffic (the library's [`netwarden::lab`]), and how
//! their results are printed and turned into an exit status.

use std::process::ExitCode;

use anyhow::{bail, Result};
use netwarden::cli_args::PortProto;
use netwarden::inventory::report_problems;

use crate::cli::agent::DataplaneArgs;
use crate::cli::lab::{DemoArgs, LabCheckArgs, LabCommand, LabDownArgs, LabProbeArgs, LabUpArgs};
use crate::cli::Input;

pub fn lab_command(command: LabCommand) -> Result<ExitCode> {
    match command {
        LabCommand::Check(args) => lab_check(args),
        LabCommand::Up(args) => lab_up(args),
        LabCommand::Probe(args) => lab_probe(args),
        LabCommand::Down(args) => lab_down(args),
    }
}

fn lab_check(args: LabCheckArgs) -> Result<ExitCode> {
    netwarden_lab::install_signal_cleanup()?;
    let options = lab_options(&args.input, &args.dataplane, args.ports)?;
    if !args.then.is_empty() {
        let reports = netwarden::lab::check_states(
            &args.input.paths,
            &args.then,
            &args.input.load_options(),
            &options,
        )?;
        return print_lab_states(&args.then, &reports, args.json);
    }
    let report = netwarden::lab::check(&args.input.paths, &args.input.load_options(), &options)?;
    print_lab_report(&report, args.json)
}

/// Prints the reports of `lab check --then`: state 0 is `-f`'s, state k the k-th `--then`.
fn print_lab_states(
    then: &[std::path::PathBuf],
    reports: &[netwarden::lab::LabReport],
    json: bool,
) -> Result<ExitCode> {
    let names =
        std::iter::once("-f".to_string()).chain(then.iter().map(|p| p.display().to_string()));
    if json {
        #[derive(serde::Serialize)]
        struct State<'a> {
            state: usize,
            path: String,
            #[serde(flatten)]
            report: &'a netwarden::lab::LabReport,
        }
        let steps: Vec<State<'_>> = names
            .zip(reports)
            .enumerate()
            .map(|(state, (path, report))| State {
                state,
                path,
                report,
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "steps": steps }))?
        );
    } else {
        for (i, (name, report)) in names.zip(reports).enumerate() {
            println!("== state {i}: {name}");
            print!("{}", netwarden::lab::render_text(report));
        }
    }
    Ok(if reports.iter().all(|r| r.mismatches == 0) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn lab_up(args: LabUpArgs) -> Result<ExitCode> {
    netwarden_lab::install_signal_cleanup()?;
    let inventory = netwarden_manifest::load_paths(&args.input.paths, &args.input.load_options());
    report_problems(&inventory, false);
    let mut ports = args.ports.clone();
    if ports.is_empty() {
        ports = netwarden::lab::default_ports(&inventory);
    }
    let options = lab_options(&args.input, &args.dataplane, ports)?;
    let mut lab = netwarden::lab::EnforcedLab::up(&inventory, &options)?;
    // `lab up` prints no events: leave the pods' NFLOG group free for an agent under test.
    lab.collector.close_all();
    if let Some(dir) = args.state.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.state, serde_json::to_vec_pretty(&lab.session())?)?;
    eprintln!("{}", lab.sync);
    for (key, path) in &lab.netns {
        println!("{key}\t{}", path.display());
    }
    eprintln!(
        "lab up: serving; `netwarden lab probe -f ...` to probe, `netwarden lab down` (or Ctrl-C) to remove it"
    );
    // Serve until `lab down` removes the state file (or a signal ends the process, whose
    // handler removes the lab).
    while args.state.exists() {
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    lab.down()?;
    Ok(ExitCode::SUCCESS)
}

fn lab_probe(args: LabProbeArgs) -> Result<ExitCode> {
    let session: netwarden::lab::LabSession =
        serde_json::from_slice(&std::fs::read(&args.state).map_err(|e| {
            anyhow::anyhow!("reading {}: {e} (is a lab up?)", args.state.display())
        })?)?;
    let load = args.input.load_options();
    let mut ports = args.ports.clone();
    if ports.is_empty() {
        ports = netwarden::lab::default_ports(&netwarden_manifest::load_paths(
            &args.input.paths,
            &load,
        ));
    }
    let engine = args.input.engine_options(false);
    let report = netwarden::lab::probe_session(&session, &args.input.paths, &load, &ports, engine)?;
    print_lab_report(&report, args.json)
}

fn lab_down(args: LabDownArgs) -> Result<ExitCode> {
    let bytes = match std::fs::read(&args.state) {
        Ok(b) => b,
        Err(e) => bail!("reading {}: {e} (no lab up?)", args.state.display()),
    };
    let session: netwarden::lab::LabSession = serde_json::from_slice(&bytes)?;
    // The `lab up` process notices its state file is gone and removes the lab itself.
    std::fs::remove_file(&args.state)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{}", session.pid)).exists()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Whatever is left (the up process died without cleaning): remove it from the state.
    netwarden_lab::teardown_from_state(&session.state)?;
    println!("lab {} removed", session.state.instance);
    Ok(ExitCode::SUCCESS)
}

/// Prints a lab run (JSON or the matrices); fails when a real connection disagreed with the
/// prediction.
fn print_lab_report(report: &netwarden::lab::LabReport, json: bool) -> Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{}", netwarden::lab::render_text(report));
    }
    Ok(if report.mismatches == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn lab_options(
    input: &Input,
    dataplane: &DataplaneArgs,
    ports: Vec<PortProto>,
) -> Result<netwarden::lab::LabCheckOptions> {
    Ok(netwarden::lab::LabCheckOptions {
        backend: dataplane.backend.backend(),
        ports,
        engine: dataplane.engine_options(input),
        render: dataplane.render_options()?,
    })
}

/// `demo`: the lab from examples/ and the loop observe → suggest → monitor → report → promote,
/// or with --kube the node agent's cluster path.
pub fn demo_command(args: DemoArgs) -> Result<ExitCode> {
    if args.kube {
        return netwarden::demo_kube::run(&args.paths, args.backend.backend());
    }
    netwarden_lab::install_signal_cleanup()?;
    netwarden::demo::run(&args.paths, args.traffic, args.backend.backend())
}
