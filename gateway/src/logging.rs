//! The `tracing` subscriber shared by every `tela` subcommand.
//!
//! Logs go to stderr so that stdout stays free for what scripts read (for example the
//! `listening on http://…` line of `tela engine-sim`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

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
    /// A global subscriber is already installed (logging was initialised twice).
    #[error("a tracing subscriber is already installed")]
    AlreadyInitialised,
}

/// Installs the global subscriber. `level` (from `--log`) wins over `RUST_LOG`; with neither,
/// the level is `info`. Both accept `tracing` filter directives such as `tela_gateway=debug`.
pub fn init(level: Option<&str>) -> Result<(), LoggingError> {
    let from_env = std::env::var("RUST_LOG").ok().filter(|s| !s.trim().is_empty());
    let filter = level.map(str::to_owned).or(from_env).unwrap_or_else(|| "info".to_owned());
    let env_filter = EnvFilter::try_new(&filter)
        .map_err(|e| LoggingError::InvalidFilter { filter: filter.clone(), reason: e.to_string() })?;
    tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init()
        .map_err(|_| LoggingError::AlreadyInitialised)
}
