//! `gateway.toml`: the gateway's settings in a file (`tela gateway --config FILE`).
//!
//! The top-level keys are the flags of `tela gateway` with `_` for `-` (`listen`,
//! `anchor_listen`, `api_keys`, `header_timeout = "10s"`, ...); a flag or its environment
//! variable given explicitly wins over the file. The `[spin]` section ([`crate::spin::config`])
//! has no flags: it describes the batch jobs the gateway may start; nor do the `[[overflow]]`
//! sections ([`crate::overflow`]), the outside providers keys allowed to overflow may be sent
//! to (their API keys are read when the file is, from the environment or a file). Unknown keys are refused, so
//! a typo never passes silently. `gateway/examples/gateway.toml` shows every key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::spin::config::{ConfigError, Dur, SpinPlan, SpinSection};

/// `gateway.toml` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `--listen`.
    pub listen: Option<SocketAddr>,
    /// `--anchor-listen`.
    pub anchor_listen: Option<SocketAddr>,
    /// `--public-addr`.
    pub public_addr: Option<String>,
    /// `--join-secret-file` (the secret itself is never read from this file).
    pub join_secret_file: Option<PathBuf>,
    /// `--join`.
    pub join: Option<Vec<String>>,
    /// `--transport`: `auto`, `quic` or `tcp`.
    pub transport: Option<String>,
    /// `--identity`.
    pub identity: Option<PathBuf>,
    /// `--api-keys`.
    pub api_keys: Option<PathBuf>,
    /// `--no-auth`.
    pub no_auth: Option<bool>,
    /// `--tls-cert`.
    pub tls_cert: Option<PathBuf>,
    /// `--tls-key`.
    pub tls_key: Option<PathBuf>,
    /// `--open-status`.
    pub open_status: Option<bool>,
    /// `--max-body-bytes`.
    pub max_body_bytes: Option<usize>,
    /// `--header-timeout`.
    pub header_timeout: Option<Dur>,
    /// `--body-timeout`.
    pub body_timeout: Option<Dur>,
    /// `--max-concurrent`.
    pub max_concurrent: Option<usize>,
    /// `--max-attempts`.
    pub max_attempts: Option<usize>,
    /// `--node-accept-timeout`.
    pub node_accept_timeout: Option<Dur>,
    /// `--node-idle-timeout`.
    pub node_idle_timeout: Option<Dur>,
    /// `--shutdown-grace`.
    pub shutdown_grace: Option<Dur>,
    /// `--threads`.
    pub threads: Option<usize>,
    /// `--routing`: `prefix`, `least-loaded` or `p2c`.
    pub routing: Option<String>,
    /// `--ledger`: the gateway's database.
    pub ledger: Option<PathBuf>,
    /// `--no-ledger`.
    pub no_ledger: Option<bool>,
    /// `--ledger-retention-days`.
    pub ledger_retention_days: Option<u32>,
    /// `--budget-exchange`.
    pub budget_exchange: Option<Dur>,
    /// `--fair-slots-per-node`.
    pub fair_slots_per_node: Option<usize>,
    /// `--fair-queue-per-key`.
    pub fair_queue_per_key: Option<usize>,
    /// `--fair-max-wait`.
    pub fair_max_wait: Option<Dur>,
    /// `--no-batch`.
    pub no_batch: Option<bool>,
    /// `--batch-max-file-bytes`.
    pub batch_max_file_bytes: Option<usize>,
    /// `--batch-node-slots`.
    pub batch_node_slots: Option<u32>,
    /// `--batch-file-days`.
    pub batch_file_days: Option<u32>,
    /// Model spinning.
    pub spin: Option<SpinSection>,
    /// Outside providers.
    pub overflow: Option<Vec<crate::overflow::OverflowSection>>,
}

/// A configuration file, read and checked.
#[derive(Clone, Debug)]
pub struct LoadedConfig {
    /// Where it was read from.
    pub path: PathBuf,
    /// The settings as written.
    pub file: FileConfig,
    /// `[spin]`, checked, if present.
    pub spin: Option<SpinPlan>,
    /// `[[overflow]]`, checked, with the providers' keys read.
    pub overflow: Vec<crate::overflow::Provider>,
}

impl LoadedConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        let mut loaded = LoadedConfig::parse(&text, &path.display().to_string())?;
        loaded.path = path.to_path_buf();
        Ok(loaded)
    }

    /// Checks `text`, naming it `origin` in errors.
    pub fn parse(text: &str, origin: &str) -> Result<LoadedConfig, ConfigError> {
        let file: FileConfig = toml::from_str(text)
            .map_err(|e| ConfigError::Parse { path: origin.to_string(), message: e.to_string() })?;
        if let Some(t) = &file.transport {
            if !matches!(t.as_str(), "auto" | "quic" | "tcp") {
                return Err(ConfigError::Invalid {
                    key: "transport".into(),
                    reason: format!("'{t}': use auto, quic or tcp"),
                });
            }
        }
        if let Some(r) = &file.routing {
            if let Err(e) = r.parse::<tela_core::routing::RoutingPolicy>() {
                return Err(ConfigError::Invalid { key: "routing".into(), reason: e.to_string() });
            }
        }
        for (key, value) in
            [("max_concurrent", file.max_concurrent), ("max_attempts", file.max_attempts), ("threads", file.threads)]
        {
            if value == Some(0) {
                return Err(ConfigError::Invalid { key: key.into(), reason: "must be at least 1".into() });
            }
        }
        if file.tls_cert.is_some() != file.tls_key.is_some() {
            return Err(ConfigError::Invalid {
                key: if file.tls_cert.is_some() { "tls_key" } else { "tls_cert" }.into(),
                reason: "tls_cert and tls_key go together".into(),
            });
        }
        let spin = file.spin.as_ref().map(SpinPlan::resolve).transpose()?;
        let overflow = crate::overflow::Provider::resolve_all(file.overflow.as_deref().unwrap_or_default())?;
        Ok(LoadedConfig { path: PathBuf::from(origin), file, spin, overflow })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_takes_a_policy_name() {
        let loaded = LoadedConfig::parse("routing = \"least-loaded\"\n", "test.toml").expect("valid");
        assert_eq!(loaded.file.routing.as_deref(), Some("least-loaded"));
        let refused = LoadedConfig::parse("routing = \"random\"\n", "test.toml").expect_err("refused");
        assert!(refused.to_string().contains("prefix, least-loaded or p2c"), "{refused}");
    }

    #[test]
    fn overflow_sections_are_read_and_checked() {
        let text = "[[overflow]]\nname = \"other\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"m\"]\n";
        let loaded = LoadedConfig::parse(text, "test.toml").expect("valid");
        assert_eq!(loaded.overflow.len(), 1);
        assert_eq!(loaded.overflow[0].name, "other");
        let typo = LoadedConfig::parse(&format!("{text}modles = [\"m\"]\n"), "test.toml").expect_err("refused");
        assert!(typo.to_string().contains("modles"), "{typo}");
    }
}
