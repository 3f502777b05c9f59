//! How one model spins ([`ModelPolicy`]) and the limits shared by all models ([`SpinConfig`]).

use super::Demand;
use crate::placement::ModelSpec;
use core::time::Duration;
use serde::{Deserialize, Serialize};

/// How one model spins.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ModelPolicy {
    /// The model and its variants, for placement.
    pub spec: ModelSpec,
    /// Time limit of each job.
    pub walltime: Duration,
    /// Time limit of a job submitted for low-priority backlog only (`None`: [`Self::walltime`]);
    /// short, so that it fits a backfill window.
    pub batch_walltime: Option<Duration>,
    /// Replicas kept even without demand.
    pub min_replicas: u32,
    /// Most replicas at once, whoever started them.
    pub max_replicas: u32,
    /// Requests (queued + in flight) one replica should carry; more wants another replica.
    pub concurrency_per_replica: u32,
    /// Arrivals per minute one replica absorbs, if arrival rate should drive scaling.
    pub arrivals_per_replica: Option<u32>,
    /// p95 latency above which one more replica is wanted.
    pub latency_target: Option<Duration>,
    /// After any scaling action, no scale-up for this long (unless the model has no replica).
    pub cooldown: Duration,
    /// How long demand must stay low before replicas are released.
    pub scale_down_after: Duration,
    /// Load, in percent of the scale-up thresholds, below which a replica counts as not needed.
    pub scale_down_percent: u32,
    /// Names of the shapes (partitions) this model may run on, most preferred first; empty: any.
    ///
    /// Placement's rules still choose among them (least capable tier that fits, then fewest
    /// GPUs); the order breaks the remaining ties.
    pub shapes: Vec<String>,
}

impl ModelPolicy {
    /// A policy with defaults: 4 h walltime, 0–4 replicas, 16 requests per replica, 2 min
    /// cooldown, release after 15 min of low demand at 50% of the thresholds, any shape.
    pub fn new(spec: ModelSpec) -> ModelPolicy {
        ModelPolicy {
            spec,
            walltime: Duration::from_secs(4 * 3600),
            batch_walltime: None,
            min_replicas: 0,
            max_replicas: 4,
            concurrency_per_replica: 16,
            arrivals_per_replica: None,
            latency_target: None,
            cooldown: Duration::from_secs(120),
            scale_down_after: Duration::from_secs(15 * 60),
            scale_down_percent: 50,
            shapes: Vec::new(),
        }
    }

    pub(super) fn validate(&self) -> Result<(), SpinConfigError> {
        let model = || self.spec.name.clone();
        if self.min_replicas > self.max_replicas {
            return Err(SpinConfigError::MinAboveMax {
                model: model(),
                min: self.min_replicas,
                max: self.max_replicas,
            });
        }
        if self.concurrency_per_replica == 0 || self.arrivals_per_replica == Some(0) {
            return Err(SpinConfigError::ZeroThreshold { model: model() });
        }
        if !(1..=100).contains(&self.scale_down_percent) {
            return Err(SpinConfigError::BadScaleDownPercent { model: model(), percent: self.scale_down_percent });
        }
        if self.walltime.is_zero() || self.batch_walltime.is_some_and(|w| w.is_zero()) {
            return Err(SpinConfigError::ZeroWalltime { model: model() });
        }
        Ok(())
    }

    /// Replicas the load wants at `percent` of the thresholds.
    pub(super) fn replicas_for(&self, demand: &Demand, percent: u32) -> u32 {
        let at = |per_replica: u32, load: u32| {
            let capacity = u64::from(per_replica) * u64::from(percent);
            u32::try_from((u64::from(load) * 100).div_ceil(capacity)).unwrap_or(u32::MAX)
        };
        let load = demand.queued.saturating_add(demand.in_flight);
        let by_load = at(self.concurrency_per_replica, load);
        let by_rate = self.arrivals_per_replica.map_or(0, |r| at(r, demand.arrivals_per_min));
        by_load.max(by_rate).max(u32::from(demand.queued > 0))
    }
}

/// A GPU-hour budget over a sliding window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuHourBudget {
    /// GPU-hours the jobs submitted within one window may use.
    pub gpu_hours: u64,
    /// The window's length.
    pub window: Duration,
}

/// Limits shared by all models.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SpinConfig {
    /// Most live jobs at once (queued, running or draining).
    pub max_concurrent_jobs: u32,
    /// GPU-hour budget, if any.
    pub budget: Option<GpuHourBudget>,
    /// The first [`JobId`](super::JobId); a restarted spinner should continue past the ids the runtime knows.
    pub first_job_id: u64,
}

impl Default for SpinConfig {
    fn default() -> SpinConfig {
        SpinConfig { max_concurrent_jobs: 8, budget: None, first_job_id: 1 }
    }
}

/// Why a spinner's configuration was refused; nothing was built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpinConfigError {
    /// `min_replicas` above `max_replicas`.
    #[error("model '{model}': min_replicas {min} is above max_replicas {max}")]
    MinAboveMax {
        /// The model.
        model: String,
        /// Its minimum.
        min: u32,
        /// Its maximum.
        max: u32,
    },
    /// A per-replica threshold of zero.
    #[error("model '{model}': concurrency_per_replica and arrivals_per_replica must be at least 1")]
    ZeroThreshold {
        /// The model.
        model: String,
    },
    /// `scale_down_percent` outside 1..=100.
    #[error("model '{model}': scale_down_percent is {percent}, expected 1..=100 (50 is a good band)")]
    BadScaleDownPercent {
        /// The model.
        model: String,
        /// The value given.
        percent: u32,
    },
    /// A walltime of zero.
    #[error("model '{model}': walltime must be longer than zero")]
    ZeroWalltime {
        /// The model.
        model: String,
    },
    /// Two policies for one model.
    #[error("model '{0}' has two spin policies; keep one")]
    DuplicateModel(String),
    /// A budget window of zero.
    #[error("the GPU-hour budget's window must be longer than zero")]
    ZeroBudgetWindow,
}
