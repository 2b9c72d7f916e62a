//! The `netwarden` command line: analysis (`reach`, `explain`, `validate`), and the commands
//! that touch the kernel (`render`, `apply`, `run`, `lab`, `demo`), each a thin edge over the
//! library crates.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use netwarden::cli_args::{PodSelectorArg, PortProto};
use netwarden::inventory::{load_engine, report_problems};
use netwarden::reach::{Family, ReachQuery};
use netwarden::{explain, reach};
use netwarden_engine::{EngineOptions, PodKey};
use netwarden_manifest::LoadOptions;

#[derive(Parser)]
#[command(name = "netwarden", version, about = "Kubernetes network policy on every pod interface, with a monitor phase")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Every ordered pod pair on every network: allowed now, and allowed once monitored
    /// policies are enforced.
    Reach(ReachArgs),
    /// Why one flow is allowed or denied: the policies isolating each side and the rules
    /// that match.
    Explain(ExplainArgs),
    /// Report every problem in the manifests (file, kind, object, field, reason).
    Validate(ValidateArgs),
}

#[derive(Args, Clone)]
struct Input {
    /// Manifest files or directories (YAML, multi-document, `kind: List`, or JSON).
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    paths: Vec<PathBuf>,
    /// Make any problem in the input fatal.
    #[arg(long)]
    strict: bool,
    /// Ignore `networking.k8s.io/v1` NetworkPolicy objects.
    #[arg(long)]
    no_network_policy: bool,
    /// Do not always allow outgoing DNS (TCP/UDP 53) from isolated pods.
    #[arg(long)]
    no_dns: bool,
}

impl Input {
    fn load(&self) -> Result<(netwarden_engine::Engine, netwarden_manifest::Inventory)> {
        let load = LoadOptions { network_policy_enabled: !self.no_network_policy };
        let options = EngineOptions { allow_dns: !self.no_dns, ..EngineOptions::default() };
        let (engine, inventory) = load_engine(&self.paths, &load, options);
        report_problems(&inventory, self.strict);
        if self.strict && !inventory.problems.is_empty() {
            bail!("{} problem(s) in the input (--strict)", inventory.problems.len());
        }
        Ok((engine, inventory))
    }
}

#[derive(Clone, Copy, ValueEnum, Default)]
enum Output {
    #[default]
    Table,
    Json,
}

#[derive(Args)]
struct ReachArgs {
    #[command(flatten)]
    input: Input,
    /// Ports to probe, as PORT/PROTO (TCP, UDP, SCTP); repeatable.
    #[arg(long = "port", required = true, num_args = 1..)]
    ports: Vec<PortProto>,
    /// Only this network (`default` or `ns/name`), or `all`.
    #[arg(long, default_value = "all")]
    network: String,
    /// Sources: `ns/pod`, `ns/*` or `*`.
    #[arg(long, default_value = "*")]
    from: PodSelectorArg,
    /// Destinations: `ns/pod`, `ns/*` or `*`.
    #[arg(long, default_value = "*")]
    to: PodSelectorArg,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Json)]
    output: Output,
}

#[derive(Args)]
struct ExplainArgs {
    #[command(flatten)]
    input: Input,
    /// Source pod, `ns/name`.
    #[arg(long)]
    from: String,
    /// Destination pod, `ns/name`.
    #[arg(long)]
    to: String,
    /// PORT/PROTO.
    #[arg(long)]
    port: PortProto,
    /// Only this network (`default` or `ns/name`).
    #[arg(long)]
    network: Option<String>,
    /// Only this family.
    #[arg(long, value_enum)]
    family: Option<FamilyArg>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(Clone, Copy, ValueEnum)]
enum FamilyArg {
    Ipv4,
    Ipv6,
}

#[derive(Args)]
struct ValidateArgs {
    #[command(flatten)]
    input: Input,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

fn pod_key(s: &str) -> Result<PodKey> {
    match s.parse::<PodSelectorArg>() {
        Ok(PodSelectorArg::Pod(key)) => Ok(key),
        _ => bail!("expected a pod as ns/name, got {s:?}"),
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Reach(args) => {
            let (mut engine, _) = args.input.load()?;
            let rules = engine.all_pod_rules();
            let query = ReachQuery {
                ports: args.ports,
                network: Some(args.network),
                from: args.from,
                to: args.to,
            };
            let report = reach::reach(&engine, &rules, &query);
            match args.output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
                Output::Table => print!("{}", reach::render_table(&report)),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Explain(args) => {
            let (mut engine, _) = args.input.load()?;
            let rules = engine.all_pod_rules();
            let family = args.family.map(|f| match f {
                FamilyArg::Ipv4 => Family::Ipv4,
                FamilyArg::Ipv6 => Family::Ipv6,
            });
            let explanations = explain::explain(
                &engine,
                &rules,
                &pod_key(&args.from)?,
                &pod_key(&args.to)?,
                args.port,
                args.network.as_deref(),
                family,
            )
            .map_err(anyhow::Error::msg)?;
            match args.output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&explanations)?),
                Output::Table => print!("{}", explain::render_text(&explanations)),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Validate(args) => {
            let load = LoadOptions { network_policy_enabled: !args.input.no_network_policy };
            let inventory = netwarden_manifest::load_paths(&args.input.paths, &load);
            let fatal = inventory.problems.iter().any(|p| {
                args.input.strict || p.severity == netwarden_manifest::Severity::Error
            });
            match args.output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&inventory.problems)?),
                Output::Table => {
                    for p in &inventory.problems {
                        println!("{p}");
                    }
                    println!(
                        "{} namespace(s), {} pod(s), {} policy(ies), {} service(s); {} problem(s)",
                        inventory.namespaces.len(),
                        inventory.pods.len(),
                        inventory.policies.len(),
                        inventory.services.len(),
                        inventory.problems.len()
                    );
                }
            }
            Ok(if fatal { ExitCode::FAILURE } else { ExitCode::SUCCESS })
        }
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("netwarden: {err:#}");
            ExitCode::from(2)
        }
    }
}
