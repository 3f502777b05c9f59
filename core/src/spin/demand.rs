//! Demand of one spinnable model as a gateway measures it: requests in flight, arrivals over the
//! last minute and the p95 time to the first response byte over the last minute.
//!
//! The gateway keeps one [`DemandMeter`] per model of its spin plan (so a client cannot grow the
//! tables) and the simulator one per simulated model; both turn it into the spinner's
//! [`Demand`] with [`DemandMeter::demand`]. Time is an input, so the same arrivals give the same
//! figures in both.
//!
//! Memory is bounded whatever the load: arrivals are counted per second (at most one window of
//! counters) and at most [`TTFB_SAMPLES`] latencies are kept.
//!
//! ```
//! use std::time::Duration;
//! use tela_core::spin::DemandMeter;
//! use tela_core::Time;
//!
//! let mut m = DemandMeter::default();
//! m.arrive(Time::from_secs(1));
//! m.enter();
//! m.first_byte(Time::from_secs(1), Duration::from_millis(40));
//! let d = m.demand(Time::from_secs(2), 3);
//! assert_eq!((d.queued, d.in_flight, d.arrivals_per_min), (3, 1, 1));
//! assert_eq!(d.p95_latency, Some(Duration::from_millis(40)));
//! // A minute later the arrival and the sample are out of the window.
//! m.leave();
//! assert!(m.demand(Time::from_secs(62), 0).is_idle());
//! ```

use super::Demand;
use crate::time::Time;
use core::time::Duration;
use std::collections::VecDeque;

/// The window of the arrival rate and of the latency percentile.
pub(crate) const DEMAND_WINDOW: Duration = Duration::from_secs(60);

/// Times to first byte kept per model at most (the newest).
pub(crate) const TTFB_SAMPLES: usize = 256;

/// Demand of one model over a sliding minute: in flight, arrivals, p95 time to first byte.
///
/// Arrivals are counted per second and at most 256 latencies are kept, so memory is bounded
/// whatever the load.
#[derive(Clone, Debug, Default)]
pub struct DemandMeter {
    in_flight: u32,
    /// Arrivals per second of the window: `(second, count)`, oldest first.
    arrivals: VecDeque<(u64, u32)>,
    /// `(when, time to first byte)`, oldest first.
    ttfb: VecDeque<(Time, Duration)>,
}

fn second_of(t: Time) -> u64 {
    t.as_micros() / 1_000_000
}

impl DemandMeter {
    /// A request for the model arrived at `now` (whether or not a replica can take it).
    pub fn arrive(&mut self, now: Time) {
        let second = second_of(now);
        match self.arrivals.back_mut() {
            Some((s, n)) if *s >= second => *n = n.saturating_add(1),
            _ => self.arrivals.push_back((second, 1)),
        }
        self.prune(now);
    }

    /// A request started being served.
    pub fn enter(&mut self) {
        self.in_flight = self.in_flight.saturating_add(1);
    }

    /// A request being served finished, failed or was dropped.
    pub fn leave(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Requests being served now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// A request's first response byte came `after` its routing, at `now`.
    pub fn first_byte(&mut self, now: Time, after: Duration) {
        if self.ttfb.len() == TTFB_SAMPLES {
            self.ttfb.pop_front();
        }
        self.ttfb.push_back((now, after));
    }

    /// Arrivals within the window ending at `now`.
    pub fn arrivals_per_min(&mut self, now: Time) -> u32 {
        self.prune(now);
        self.arrivals.iter().map(|(_, n)| *n).fold(0, u32::saturating_add)
    }

    /// The p95 (nearest rank) of the times to first byte within the window ending at `now`.
    pub fn p95_ttfb(&mut self, now: Time) -> Option<Duration> {
        self.prune(now);
        let mut recent: Vec<Duration> = self.ttfb.iter().map(|(_, d)| *d).collect();
        recent.sort_unstable();
        let rank = (recent.len() * 95).div_ceil(100);
        recent.get(rank.checked_sub(1)?).copied()
    }

    /// The spinner's view of this model at `now`, with `queued` requests waiting for a replica
    /// (the cold-start queue's length) and no batch backlog.
    pub fn demand(&mut self, now: Time, queued: u32) -> Demand {
        Demand {
            queued,
            in_flight: self.in_flight,
            arrivals_per_min: self.arrivals_per_min(now),
            p95_latency: self.p95_ttfb(now),
            batch_replicas: 0,
        }
    }

    /// Drops what left the window ending at `now`.
    fn prune(&mut self, now: Time) {
        let window = DEMAND_WINDOW.as_secs();
        let second = second_of(now);
        while self.arrivals.front().is_some_and(|(s, _)| s + window <= second) {
            self.arrivals.pop_front();
        }
        let window = DEMAND_WINDOW.as_micros() as u64;
        while self.ttfb.front().is_some_and(|(t, _)| t.as_micros() + window <= now.as_micros()) {
            self.ttfb.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn arrivals_count_over_the_last_minute_by_the_second() {
        let mut m = DemandMeter::default();
        for s in 0..90 {
            m.arrive(Time::from_secs(s));
            m.arrive(Time::from_secs(s));
        }
        // Seconds 30..=89 are within the minute ending in second 89.
        assert_eq!(m.arrivals_per_min(Time::from_secs(89)), 120);
        assert_eq!(m.arrivals_per_min(Time::from_secs(148)), 2);
        assert_eq!(m.arrivals_per_min(Time::from_secs(149)), 0);
        assert!(m.arrivals.is_empty(), "the counters left with the window");
    }

    #[test]
    fn the_p95_is_the_nearest_rank_of_the_recent_samples_only() {
        let mut m = DemandMeter::default();
        assert_eq!(m.p95_ttfb(Time::ZERO), None);
        for ms in 1..=100 {
            m.first_byte(Time::from_secs(10), Duration::from_millis(ms));
        }
        assert_eq!(m.p95_ttfb(Time::from_secs(10)), Some(Duration::from_millis(95)));
        m.first_byte(Time::from_secs(40), Duration::from_millis(7));
        assert_eq!(m.p95_ttfb(Time::from_secs(70)), Some(Duration::from_millis(7)));
        assert_eq!(m.p95_ttfb(Time::from_secs(100)), None);
    }

    #[test]
    fn in_flight_never_goes_below_zero() {
        let mut m = DemandMeter::default();
        m.enter();
        m.leave();
        m.leave();
        assert_eq!(m.in_flight(), 0);
    }

    proptest! {
        /// Whatever the arrivals and samples, the meter holds at most a window of counters and
        /// `TTFB_SAMPLES` samples, and counts exactly the arrivals of the window's seconds.
        #[test]
        fn memory_is_bounded_and_counts_are_exact(
            steps in proptest::collection::vec((0u64..3_000_000, any::<bool>()), 1..2_000),
        ) {
            let mut m = DemandMeter::default();
            let mut now = 0u64;
            let mut seconds: Vec<u64> = Vec::new();
            for (dt, sample) in steps {
                now += dt;
                let t = Time(now);
                m.arrive(t);
                seconds.push(now / 1_000_000);
                if sample {
                    m.first_byte(t, Duration::from_micros(dt));
                }
                prop_assert!(m.arrivals.len() <= DEMAND_WINDOW.as_secs() as usize);
                prop_assert!(m.ttfb.len() <= TTFB_SAMPLES);
            }
            let second = now / 1_000_000;
            let expected = seconds.iter().filter(|s| *s + 60 > second).count() as u32;
            prop_assert_eq!(m.arrivals_per_min(Time(now)), expected);
        }
    }
}
