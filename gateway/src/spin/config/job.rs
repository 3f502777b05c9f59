//! `[spin.job]`: what every job runs and how its node joins, as written and checked.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::error::{invalid, ConfigError};

/// `[spin.job]`: what every job runs and how its node joins.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSection {
    /// The `tela` binary as the compute nodes see it.
    pub tela: String,
    /// The gateways or anchors the node dials.
    pub join: Vec<String>,
    /// A file holding the join secret, readable on the compute nodes (never put into the script).
    pub join_secret_file: String,
    /// Transport for the node's dials: `auto`, `quic` or `tcp` (default `auto`).
    pub transport: Option<String>,
    /// Working directory of the job (default `/tmp`); its output file goes there.
    pub working_dir: Option<String>,
    /// Account to charge, unless the partition names its own.
    pub account: Option<String>,
    /// CPUs per task, unless the partition says (default 4).
    pub cpus_per_task: Option<u32>,
    /// Lines run before the node starts (`module load cuda`, `source venv/bin/activate`).
    pub setup: Option<Vec<String>>,
    /// Extra environment of the job's processes.
    pub env: Option<BTreeMap<String, String>>,
}

/// What every job runs, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSettings {
    /// The `tela` binary on the compute nodes.
    pub tela: String,
    /// Where nodes dial.
    pub join: Vec<String>,
    /// The join secret's file on the compute nodes.
    pub join_secret_file: String,
    /// `auto`, `quic` or `tcp`.
    pub transport: String,
    /// The job's working directory.
    pub working_dir: String,
    /// Default account.
    pub account: Option<String>,
    /// Default CPUs per task.
    pub cpus_per_task: u32,
    /// Lines run before the node starts.
    pub setup: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
}

pub(super) fn resolve_job(section: Option<&JobSection>) -> Result<JobSettings, ConfigError> {
    let Some(j) = section else {
        return Err(invalid(
            "spin.job",
            "missing: add [spin.job] with tela (the binary on compute nodes), join and join_secret_file",
        ));
    };
    if j.tela.trim().is_empty() {
        return Err(invalid("spin.job.tela", "must name the tela binary as the compute nodes see it"));
    }
    if j.join.is_empty() || j.join.iter().any(|a| a.trim().is_empty()) {
        return Err(invalid(
            "spin.job.join",
            "must list the address(es) nodes dial, e.g. [\"gateway.example.org:7000\"]",
        ));
    }
    if j.join_secret_file.trim().is_empty() {
        return Err(invalid(
            "spin.job.join_secret_file",
            "must name a file holding the join secret on the compute nodes",
        ));
    }
    let transport = j.transport.clone().unwrap_or_else(|| "auto".into());
    if !matches!(transport.as_str(), "auto" | "quic" | "tcp") {
        return Err(invalid("spin.job.transport", format!("'{transport}': use auto, quic or tcp")));
    }
    if j.cpus_per_task == Some(0) {
        return Err(invalid("spin.job.cpus_per_task", "must be at least 1"));
    }
    let mut env = Vec::new();
    for (name, value) in j.env.clone().unwrap_or_default() {
        if name.is_empty()
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            || name.starts_with(|c: char| c.is_ascii_digit())
        {
            return Err(invalid(format!("spin.job.env.{name}"), "is not a valid environment variable name"));
        }
        env.push((name, value));
    }
    Ok(JobSettings {
        tela: j.tela.clone(),
        join: j.join.clone(),
        join_secret_file: j.join_secret_file.clone(),
        transport,
        working_dir: j.working_dir.clone().unwrap_or_else(|| "/tmp".into()),
        account: j.account.clone(),
        cpus_per_task: j.cpus_per_task.unwrap_or(4),
        setup: j.setup.clone().unwrap_or_default(),
        env,
    })
}
