//! `tela-sim`: run simulated Tela federations from scenario files.

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use tela_sim::{replay_command, Limits, Scenario, Sim};

/// Prints a line to stdout, or nothing once stdout is gone: `tela-sim run … | head -1` must
/// still write its report and exit with the run's status (`println!` panics on a closed pipe).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

#[derive(Parser)]
#[command(name = "tela-sim", about = "Deterministic simulator of Tela federations (the protocol core at scale)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one scenario with one seed.
    Run {
        /// Scenario name (from runtime-sim/scenarios/) or path to a TOML file.
        scenario: String,
        /// Root seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Draw this seed's own fault mix from the scenario's swarm ranges.
        #[arg(long)]
        swarm: bool,
        /// Write the JSON report here.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Write SVG plots into this directory.
        #[arg(long)]
        plot: Option<PathBuf>,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Run a scenario over many seeds, each with its own fault mix; stop at the first failure.
    Swarm {
        /// Scenario name or path.
        scenario: String,
        /// Number of seeds.
        #[arg(long, default_value_t = 20)]
        seeds: u64,
        /// First seed.
        #[arg(long, default_value_t = 1)]
        from: u64,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// List the named scenarios.
    List,
}

#[derive(clap::Args)]
struct LimitArgs {
    /// Abort (and report what was measured) above this resident memory.
    #[arg(long, default_value_t = 12_000)]
    max_rss_mb: u64,
    /// Abort (and report) after this much wall time.
    #[arg(long, default_value_t = 3_600.0)]
    max_wall_s: f64,
}

impl LimitArgs {
    fn limits(&self) -> Limits {
        Limits { max_rss_mb: self.max_rss_mb, max_wall_s: self.max_wall_s }
    }
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::List => {
            for n in tela_sim::scenario::known_scenarios() {
                let sc = Scenario::load(&n)?;
                say!("{n:<20} {}", sc.description);
            }
            Ok(())
        }
        Cmd::Run { scenario, seed, swarm, report, plot, limits } => {
            let sc = Scenario::load(&scenario)?;
            let name = sc.name.clone();
            let r = Sim::new(sc, seed, swarm, limits.limits()).run();
            say!("{}", r.summary());
            if let Some(path) = report {
                let json = serde_json::to_string_pretty(&r)?;
                std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
                say!("report: {}", path.display());
            }
            if let Some(dir) = plot {
                for p in tela_sim::plot::write(&r, &dir).map_err(anyhow::Error::msg)? {
                    say!("plot: {}", p.display());
                }
            }
            if !r.passed() {
                say!("replay: {}", replay_command(&scenario, seed, swarm));
                bail!("{name} seed {seed} failed");
            }
            Ok(())
        }
        Cmd::Swarm { scenario, seeds, from, limits } => {
            let base = Scenario::load(&scenario)?;
            for seed in from..from + seeds {
                let r = Sim::new(base.clone(), seed, true, limits.limits()).run();
                let first = r.summary().lines().next().unwrap_or_default().to_string();
                if !r.passed() {
                    say!("{}", r.summary());
                    say!("replay: {}", replay_command(&scenario, seed, true));
                    bail!("{} seed {seed} failed", base.name);
                }
                say!("ok   {first}");
            }
            say!("{seeds} seeds of {} passed", base.name);
            Ok(())
        }
    }
}
