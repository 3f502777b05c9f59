//! Why a configuration file was refused, and the helper every section refuses a key with.

use std::path::PathBuf;

/// Why a configuration file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the configuration file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not have the expected shape (an unknown key, a wrong
    /// type); the message quotes the line.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message, with the line and key.
        message: String,
    },
    /// A value is out of range or inconsistent with another one.
    #[error("{key}: {reason}")]
    Invalid {
        /// The key at fault, as a TOML path (`spin.model[llama].min_replicas`).
        key: String,
        /// Why, and what to write instead.
        reason: String,
    },
}

/// A refusal of `key`, saying why.
pub(super) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key: key.into(), reason: reason.into() }
}

impl From<tela_core::spin::config::InvalidKey> for ConfigError {
    fn from(e: tela_core::spin::config::InvalidKey) -> ConfigError {
        ConfigError::Invalid { key: e.key, reason: e.reason }
    }
}
