//! When the allocation ends: `--walltime`, or the Slurm job's remaining time.
//!
//! Inside a Slurm job (`SLURM_JOB_ID` set) the node asks Slurm how long the job has left,
//! rather than parsing its end time: a duration needs no time zone and is immune to this
//! machine's clock differing from the controller's. In order:
//!
//! 1. `SLURM_JOB_END_TIME` (seconds since 1970; set by recent Slurm releases);
//! 2. `squeue -h -j $SLURM_JOB_ID -o %L` (time left, e.g. `1-02:03:04`, `45:00`);
//! 3. `scontrol show job $SLURM_JOB_ID`: `TimeLimit` minus `RunTime`.
//!
//! A job without a limit (`UNLIMITED`, `NOT_SET`) has no walltime; the node then drains
//! only on a signal or `tela drain`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tela_core::spin::parse_slurm_duration;
use tokio::process::Command;

/// Longest a Slurm command may take.
const SLURM_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the walltime came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WalltimeSource {
    /// `--walltime`.
    Flag,
    /// `SLURM_JOB_END_TIME`.
    SlurmEnv,
    /// `squeue`.
    Squeue,
    /// `scontrol show job`.
    Scontrol,
}

/// The walltime could not be read from Slurm.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    /// The command could not run or failed.
    #[error("`{command}` failed: {detail}")]
    Command {
        /// What ran.
        command: String,
        /// What went wrong.
        detail: String,
    },
    /// The output did not contain a duration.
    #[error("cannot read a duration from `{command}` output '{output}'")]
    Parse {
        /// What ran.
        command: String,
        /// What it printed.
        output: String,
    },
}

/// Time left in the job `job_id`, or `None` if it has no limit.
pub async fn slurm_time_left(job_id: &str) -> Result<(Option<Duration>, WalltimeSource), SlurmError> {
    if let Some(left) =
        std::env::var("SLURM_JOB_END_TIME").ok().and_then(|v| v.trim().parse::<u64>().ok()).filter(|&secs| secs > 0)
    {
        let end = UNIX_EPOCH + Duration::from_secs(left);
        let left = end.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO);
        return Ok((Some(left), WalltimeSource::SlurmEnv));
    }
    let squeue = run("squeue", &["-h", "-j", job_id, "-o", "%L"]).await;
    match squeue {
        Ok(out) => {
            let line = out.lines().next().unwrap_or("").trim().to_string();
            match parse_slurm_duration(&line) {
                Some(left) => return Ok((left, WalltimeSource::Squeue)),
                None => tracing::debug!("squeue printed '{line}'; trying scontrol"),
            }
        }
        Err(e) => tracing::debug!("{e}; trying scontrol"),
    }
    let command = format!("scontrol show job {job_id}");
    let out = run("scontrol", &["show", "job", job_id]).await?;
    let field = |name: &str| {
        out.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .map(str::to_string)
    };
    let parse_err = || SlurmError::Parse { command: command.clone(), output: out.chars().take(200).collect() };
    let limit = field("TimeLimit").ok_or_else(parse_err)?;
    let limit = parse_slurm_duration(&limit).ok_or_else(parse_err)?;
    let Some(limit) = limit else {
        return Ok((None, WalltimeSource::Scontrol));
    };
    let run_time = field("RunTime").and_then(|r| parse_slurm_duration(&r)).flatten().unwrap_or(Duration::ZERO);
    Ok((Some(limit.saturating_sub(run_time)), WalltimeSource::Scontrol))
}

async fn run(program: &str, args: &[&str]) -> Result<String, SlurmError> {
    let command = format!("{program} {}", args.join(" "));
    let output = tokio::time::timeout(SLURM_TIMEOUT, Command::new(program).args(args).kill_on_drop(true).output())
        .await
        .map_err(|_| SlurmError::Command {
            command: command.clone(),
            detail: format!("no answer within {SLURM_TIMEOUT:?}"),
        })?
        .map_err(|e| SlurmError::Command { command: command.clone(), detail: e.to_string() })?;
    if !output.status.success() {
        return Err(SlurmError::Command {
            command,
            detail: format!("{} — {}", output.status, String::from_utf8_lossy(&output.stderr).trim()),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
