//! `[spin.batch]`: short, backfill-friendly jobs for the batch API's backlog, as written and checked.

use std::time::Duration;

use serde::Deserialize;

use super::error::{invalid, ConfigError};
use tela_core::spin::config::{positive, Dur};

/// `[spin.batch]`: short, backfill-friendly jobs for the batch API's backlog.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSpinSection {
    /// Pending batch requests of a model that justify one replica.
    pub backlog_per_replica: u32,
    /// Most replicas the backlog of one model may want (default 1; `max_replicas` still caps).
    pub max_replicas: Option<u32>,
    /// Time limit of a job started for the backlog only (default 1 h).
    pub job_walltime: Option<Dur>,
    /// The least time limit Slurm may shrink such a job to, to start it in a backfill window
    /// (`--time-min`; default: half the walltime).
    pub job_time_min: Option<Dur>,
}

/// `[spin.batch]`, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchSpin {
    /// Pending batch requests that justify one replica.
    pub backlog_per_replica: u32,
    /// Most replicas one model's backlog wants.
    pub max_replicas: u32,
    /// Time limit of a backlog job.
    pub job_walltime: Duration,
    /// Its least time limit (`--time-min`).
    pub job_time_min: Duration,
}

pub(super) fn resolve_batch_spin(b: &BatchSpinSection) -> Result<BatchSpin, ConfigError> {
    if b.backlog_per_replica == 0 {
        return Err(invalid("spin.batch.backlog_per_replica", "must be at least 1 (leave out [spin.batch] for none)"));
    }
    let max_replicas = b.max_replicas.unwrap_or(1);
    if max_replicas == 0 {
        return Err(invalid("spin.batch.max_replicas", "must be at least 1 (leave out [spin.batch] for none)"));
    }
    let job_walltime = positive("spin.batch.job_walltime", b.job_walltime, Duration::from_secs(3600))?;
    if job_walltime < Duration::from_secs(60) {
        return Err(invalid("spin.batch.job_walltime", "must be at least one minute, Slurm's granularity"));
    }
    let job_time_min = positive("spin.batch.job_time_min", b.job_time_min, job_walltime / 2)?;
    if job_time_min > job_walltime {
        return Err(invalid("spin.batch.job_time_min", "must not be longer than spin.batch.job_walltime"));
    }
    Ok(BatchSpin { backlog_per_replica: b.backlog_per_replica, max_replicas, job_walltime, job_time_min })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::LoadedConfig;

    use super::super::tests::{minimal, refused};

    #[test]
    fn a_batch_section_gives_short_backfill_jobs_and_refuses_times_that_cannot_serve() {
        let plain = LoadedConfig::parse(&minimal(), "t").expect("valid").spin.expect("[spin]");
        assert_eq!((plain.batch, plain.models[0].policy.batch_walltime), (None, None), "off by default");
        let on = minimal().replace("[spin.job]", "[spin.batch]\nbacklog_per_replica = 100\n[spin.job]");
        let plan = LoadedConfig::parse(&on, "t").expect("valid").spin.expect("[spin]");
        let b = plan.batch.expect("[spin.batch]");
        assert_eq!(
            (b.backlog_per_replica, b.max_replicas, b.job_walltime, b.job_time_min),
            (100, 1, Duration::from_secs(3600), Duration::from_secs(1800))
        );
        assert_eq!(plan.models[0].policy.batch_walltime, Some(Duration::from_secs(3600)));
        let set = |extra: &str| minimal().replace("[spin.job]", &format!("[spin.batch]\n{extra}\n[spin.job]"));
        let short = set("backlog_per_replica = 5\nmax_replicas = 2\njob_walltime = \"30m\"\njob_time_min = \"10m\"");
        let short = short.replace("engine = ", "drain_window = \"5m\"\nengine = ");
        let b = LoadedConfig::parse(&short, "t").expect("valid").spin.expect("[spin]").batch.expect("batch");
        assert_eq!(
            (b.max_replicas, b.job_walltime, b.job_time_min),
            (2, Duration::from_secs(1800), Duration::from_secs(600))
        );
        for (extra, key, why) in [
            ("backlog_per_replica = 0", "spin.batch.backlog_per_replica", "at least 1"),
            ("backlog_per_replica = 1\nmax_replicas = 0", "spin.batch.max_replicas", "at least 1"),
            ("backlog_per_replica = 1\njob_walltime = \"30s\"", "spin.batch.job_walltime", "at least one minute"),
            ("backlog_per_replica = 1\njob_time_min = \"2h\"", "spin.batch.job_time_min", "not be longer"),
            ("backlog_per_replica = 1\njob_time_min = \"10m\"", "spin.batch.job_time_min", "could not serve"),
            ("backlog_per_replica = 1\nqueue = 3", "queue", "unknown field"),
        ] {
            let err = refused(&set(extra));
            assert!(err.contains(key) && err.contains(why), "{extra}: {err}");
        }
    }
}
