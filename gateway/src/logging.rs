//! The `tracing` subscriber shared by every `tela` subcommand.
//!
//! Logs go to stderr so that stdout stays free for what scripts read (for example the
//! `listening on http://…` line of `tela engine-sim`). `tela demo` writes them to a file
//! instead ([`init_to_file`]), since its terminal belongs to the banner a newcomer reads.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// The level or filter given with `--log` or `RUST_LOG` does not parse.
    #[error("invalid log filter '{filter}' (try 'info', 'debug' or 'tela_gateway=debug,info'): {reason}")]
    InvalidFilter {
        /// The filter as given.
        filter: String,
        /// What the parser objected to.
        reason: String,
    },
    /// The log file cannot be created.
    #[error("cannot create the log file {}: {source}", path.display())]
    CannotCreate {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A global subscriber is already installed (logging was initialised twice).
    #[error("a tracing subscriber is already installed")]
    AlreadyInitialised,
}

/// Installs the global subscriber. `level` (from `--log`) wins over `RUST_LOG`; with neither,
/// the level is `info`. Both accept `tracing` filter directives such as `tela_gateway=debug`.
pub fn init(level: Option<&str>) -> Result<(), LoggingError> {
    tracing_subscriber::fmt()
        .with_env_filter(filter(level)?)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init()
        .map_err(|_| LoggingError::AlreadyInitialised)
}

/// Installs the global subscriber with the log written to `path` (created or truncated), at
/// the level [`init`] would use. Only what `terminal` selects (filter directives such as
/// `error,tela_gateway::demo=info`) also reaches stderr, without timestamps or targets: those
/// lines are meant for a person watching.
pub fn init_to_file(level: Option<&str>, path: &Path, terminal: &str) -> Result<(), LoggingError> {
    let file = std::fs::File::create(path)
        .map_err(|source| LoggingError::CannotCreate { path: path.to_path_buf(), source })?;
    let to_file =
        tracing_subscriber::fmt::layer().with_writer(Mutex::new(file)).with_ansi(false).with_filter(filter(level)?);
    let to_terminal = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .without_time()
        .with_target(false)
        .with_filter(parse(terminal)?);
    tracing_subscriber::registry()
        .with(to_file)
        .with(to_terminal)
        .try_init()
        .map_err(|_| LoggingError::AlreadyInitialised)
}

/// `level`, else `RUST_LOG`, else `info`.
fn filter(level: Option<&str>) -> Result<EnvFilter, LoggingError> {
    let from_env = std::env::var("RUST_LOG").ok().filter(|s| !s.trim().is_empty());
    parse(&level.map(str::to_owned).or(from_env).unwrap_or_else(|| "info".to_owned()))
}

fn parse(filter: &str) -> Result<EnvFilter, LoggingError> {
    EnvFilter::try_new(filter)
        .map_err(|e| LoggingError::InvalidFilter { filter: filter.to_owned(), reason: e.to_string() })
}
