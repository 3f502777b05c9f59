//! `tela`: the single binary of a Tela federation. Each subcommand is a thin wrapper around a
//! module of the `tela_gateway` library; add one by adding a variant to [`Command`] and an arm
//! to the `match` in `main`.
#![forbid(unsafe_code)]

use anyhow::Context as _;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use tela_gateway::cli::{GatewayCommand, StatusCommand};
use tela_gateway::demo::DemoArgs;
use tela_gateway::engine_sim::EngineSimArgs;
use tela_gateway::usage::UsageArgs;
use tela_runtime::{anchor::AnchorArgs, control::DrainArgs, gpu::HardwareArgs, node::NodeArgs, relay::RelayArgs};

/// Tela turns GPUs behind batch schedulers, in pods and on workstations into one
/// OpenAI-compatible endpoint.
#[derive(Debug, Parser)]
#[command(name = "tela", version = env!("TELA_VERSION"), propagate_version = true)]
struct Cli {
    /// Log level or filter (e.g. `info`, `debug`, `tela_gateway=debug,info`); overrides
    /// RUST_LOG. Logs go to stderr (`tela demo`: to a file in its directory unless --verbose).
    #[arg(long, global = true, value_name = "FILTER")]
    log: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    // Help text comes from each argument struct's doc comment.
    Demo(DemoArgs),
    Gateway(Box<GatewayCommand>),
    EngineSim(EngineSimArgs),
    Node(Box<NodeArgs>),
    Anchor(AnchorArgs),
    Relay(RelayArgs),
    Drain(DrainArgs),
    Status(StatusCommand),
    Usage(UsageArgs),
    Hardware(HardwareArgs),
}

fn main() -> anyhow::Result<()> {
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let (Command::Gateway(gateway), Some(("gateway", sub))) = (&mut cli.command, matches.subcommand()) {
        gateway.note_explicit(sub);
    }
    match &cli.command {
        Command::Demo(demo) => demo.init_logging(cli.log.as_deref())?,
        _ => tela_gateway::logging::init(cli.log.as_deref())?,
    }
    // A node forwards for one engine: on one thread, a request's hops (tunnel stream, engine
    // connection, back) are plain task switches, where a multi-threaded scheduler wakes idle
    // workers on other cores for each of them and adds their wake-up latency to every request.
    // A gateway does the same on small machines; see `--threads`.
    let threads = match &cli.command {
        Command::Node(_) => Some(1),
        Command::Gateway(gateway) => Some(gateway.threads().context("tela gateway")?),
        _ => None,
    };
    let runtime = match threads {
        Some(1) => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        Some(n) => tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build(),
        // One worker per core.
        None => tokio::runtime::Builder::new_multi_thread().enable_all().build(),
    }
    .context("starting the async runtime")?;
    runtime.block_on(run(cli.command))
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Demo(args) => args.run().await.context("tela demo")?,
        Command::Gateway(args) => args.run().await.context("tela gateway")?,
        Command::EngineSim(args) => args.run().await.context("tela engine-sim")?,
        Command::Node(args) => match args.run().await.context("tela node")? {
            0 => {}
            code => std::process::exit(code),
        },
        Command::Anchor(args) => args.run().await.context("tela anchor")?,
        Command::Relay(args) => args.run().await.context("tela relay")?,
        Command::Drain(args) => args.run().await.context("tela drain")?,
        Command::Status(args) => args.run().await?,
        Command::Usage(args) => args.run().context("tela usage")?,
        Command::Hardware(args) => args.run().context("tela hardware")?,
    }
    Ok(())
}
