//! The per-minute token bucket behind `rpm`, `tpm` and `batch_tpm`: bursts up to the limit,
//! then a steady rate.

use std::time::{Duration, Instant};

use super::headers::RateGauge;

/// The length of a rate window: limits are per minute.
const WINDOW: Duration = Duration::from_secs(60);

/// Units used of a per-minute limit, draining at `limit` per minute.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Bucket {
    pub(super) used: f64,
    at: Option<Instant>,
}

impl Bucket {
    fn per_second(limit: u64) -> f64 {
        limit as f64 / WINDOW.as_secs_f64()
    }

    /// How long `units` take to refill under `limit` (multiplied first: `1 * 60 / 3` is exactly
    /// 20 s, where `1 / (3 / 60)` is not).
    fn refill_time(limit: u64, units: f64) -> Duration {
        Duration::from_secs_f64((units * WINDOW.as_secs_f64() / limit as f64).max(0.0))
    }

    /// Brings `used` up to `now` (time never goes backwards: an earlier `now` changes nothing).
    pub(super) fn drain(&mut self, limit: u64, now: Instant) {
        if let Some(at) = self.at {
            let elapsed = now.saturating_duration_since(at).as_secs_f64();
            self.used = (self.used - elapsed * Bucket::per_second(limit)).max(0.0);
        }
        if self.at.map_or(true, |at| now > at) {
            self.at = Some(now);
        }
    }

    /// How long until `cost` more fits under `limit` (zero if it fits now).
    pub(super) fn wait_for(&self, limit: u64, cost: u64) -> Duration {
        let excess = self.used + cost as f64 - limit as f64;
        if excess <= 0.0 {
            return Duration::ZERO;
        }
        Bucket::refill_time(limit, excess)
    }

    pub(super) fn gauge(&self, limit: u64) -> RateGauge {
        let left = (limit as f64 - self.used).max(0.0);
        // A hair of float error must not read as one unit short.
        let remaining = (left + 1e-9).floor() as u64;
        RateGauge { limit, remaining, reset: Bucket::refill_time(limit, self.used) }
    }
}
