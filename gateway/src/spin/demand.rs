//! Demand per spinnable model, as the gateway measures it: requests in flight, arrivals over the
//! last minute and the p95 time to the first response byte. Only models of the spin plan are
//! tracked, so a client cannot grow these tables.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Samples of time to first byte kept per model.
const TTFB_SAMPLES: usize = 256;
/// The window of the arrival rate and the latency percentile.
const WINDOW: Duration = Duration::from_secs(60);

#[derive(Default)]
struct ModelDemand {
    in_flight: Arc<AtomicU32>,
    /// Arrivals per second of the last minute: `(second, count)`, oldest first.
    arrivals: VecDeque<(u64, u32)>,
    ttfb: VecDeque<(Instant, Duration)>,
}

/// What [`DemandTracker::measure`] reports for one model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measured {
    /// Requests being served now.
    pub in_flight: u32,
    /// Requests that arrived over the last minute.
    pub arrivals_per_min: u32,
    /// p95 time to first byte over the last minute, once there are samples.
    pub p95_ttfb: Option<Duration>,
}

/// Demand of the spinnable models. Cheap to share; every method holds its lock briefly.
pub struct DemandTracker {
    started: Instant,
    models: Mutex<HashMap<String, ModelDemand>>,
}

/// One request in flight for a model; leaves when dropped (with the response body).
pub struct InFlight(Arc<AtomicU32>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl DemandTracker {
    /// Tracks `models`.
    pub fn new<'a>(models: impl IntoIterator<Item = &'a str>) -> DemandTracker {
        let models = models.into_iter().map(|m| (m.to_string(), ModelDemand::default())).collect();
        DemandTracker { started: Instant::now(), models: Mutex::new(models) }
    }

    /// Counts an arrival for `model` (when tracked).
    pub fn arrive(&self, model: &str) {
        let second = self.started.elapsed().as_secs();
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(m) = models.get_mut(model) else { return };
        match m.arrivals.back_mut() {
            Some((s, n)) if *s == second => *n = n.saturating_add(1),
            _ => m.arrivals.push_back((second, 1)),
        }
        while m.arrivals.front().is_some_and(|(s, _)| *s + WINDOW.as_secs() <= second) {
            m.arrivals.pop_front();
        }
    }

    /// Counts a request for `model` in flight until the guard is dropped (`None`: not tracked).
    pub fn enter(&self, model: &str) -> Option<InFlight> {
        let models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        let count = models.get(model)?.in_flight.clone();
        count.fetch_add(1, Ordering::AcqRel);
        Some(InFlight(count))
    }

    /// Records the time to the first response byte of a request for `model`.
    pub fn first_byte(&self, model: &str, after: Duration) {
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(m) = models.get_mut(model) else { return };
        if m.ttfb.len() == TTFB_SAMPLES {
            m.ttfb.pop_front();
        }
        m.ttfb.push_back((Instant::now(), after));
    }

    /// The demand of `model` now.
    pub fn measure(&self, model: &str) -> Measured {
        let second = self.started.elapsed().as_secs();
        let models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(m) = models.get(model) else { return Measured::default() };
        let arrivals = m.arrivals.iter().filter(|(s, _)| *s + WINDOW.as_secs() > second).map(|(_, n)| *n).sum();
        let mut recent: Vec<Duration> =
            m.ttfb.iter().filter(|(at, _)| at.elapsed() < WINDOW).map(|(_, d)| *d).collect();
        recent.sort();
        let p95 = (!recent.is_empty()).then(|| recent[(recent.len() * 95).div_ceil(100).saturating_sub(1)]);
        Measured { in_flight: m.in_flight.load(Ordering::Acquire), arrivals_per_min: arrivals, p95_ttfb: p95 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_arrivals_and_the_p95_are_counted_for_tracked_models_only() {
        let t = DemandTracker::new(["a"]);
        assert!(t.enter("b").is_none());
        let guards: Vec<_> = (0..3).filter_map(|_| t.enter("a")).collect();
        for _ in 0..5 {
            t.arrive("a");
            t.arrive("b");
        }
        for ms in 1..=100 {
            t.first_byte("a", Duration::from_millis(ms));
        }
        let m = t.measure("a");
        assert_eq!((m.in_flight, m.arrivals_per_min, m.p95_ttfb), (3, 5, Some(Duration::from_millis(95))));
        drop(guards);
        assert_eq!(t.measure("a").in_flight, 0);
        assert_eq!(t.measure("b"), Measured::default());
    }
}
