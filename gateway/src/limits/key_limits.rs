//! One key's limits ([`KeyLimits`]), as its line in the key file sets them.

use super::period::{Budget, GpuHours};

/// One key's limits, as its key-file line sets them; `None` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyLimits {
    /// Requests per minute (`rpm=`).
    pub requests_per_minute: Option<u64>,
    /// Tokens per minute (`tpm=`).
    pub tokens_per_minute: Option<u64>,
    /// Requests in flight at once (`concurrent=`).
    pub concurrent: Option<u32>,
    /// Tokens per calendar period (`budget_tokens=`), interactive and batch together.
    pub budget: Option<Budget>,
    /// Batch tokens per minute (`batch_tpm=`): paces the key's batches
    /// ([`KeyCounters::admit_batch`](super::KeyCounters::admit_batch)).
    pub batch_tokens_per_minute: Option<u64>,
    /// Batch tokens per calendar period (`batch_budget_tokens=`).
    pub batch_budget: Option<Budget>,
    /// GPU-hours per calendar period of the jobs the spinner starts for the key's batch backlog
    /// (`batch_gpu_hours=`; see [`crate::spin::batch_demand`]).
    pub batch_gpu_hours: Option<GpuHours>,
}

impl KeyLimits {
    /// True when no limit on interactive requests is set: they are not counted at all (batch
    /// requests are counted by the batch runner whatever this says).
    pub fn is_unlimited(&self) -> bool {
        self.requests_per_minute.is_none()
            && self.tokens_per_minute.is_none()
            && self.concurrent.is_none()
            && self.budget.is_none()
    }

    /// Whether the batch runner must ask the key's counters before sending one of its requests.
    pub fn limits_batches(&self) -> bool {
        self.batch_tokens_per_minute.is_some() || self.batch_budget.is_some() || self.budget.is_some()
    }

    /// Whether a per-minute limit is set, so responses carry `x-ratelimit-*` headers.
    pub fn has_rates(&self) -> bool {
        self.requests_per_minute.is_some() || self.tokens_per_minute.is_some()
    }

    /// Whether admitting a request needs its token estimate.
    pub fn counts_tokens(&self) -> bool {
        self.tokens_per_minute.is_some() || self.budget.is_some()
    }
}
