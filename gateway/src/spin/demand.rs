//! Demand per spinnable model, as the gateway measures it: one core [`DemandMeter`] per model of
//! the spin plan (so a client cannot grow these tables), fed by the request path and read by the
//! spin task and `/status`. The figures and their windows are the core's, the same the simulator
//! measures.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tela_core::spin::{Demand, DemandMeter};
use tela_runtime::clock::Clock;

/// Demand of the spinnable models. Cheap to share; every method holds its lock briefly.
pub struct DemandTracker {
    clock: Clock,
    models: Arc<Mutex<HashMap<String, DemandMeter>>>,
}

/// One request in flight for a model; leaves when dropped (with the response body).
pub struct InFlight {
    models: Arc<Mutex<HashMap<String, DemandMeter>>>,
    model: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = models.get_mut(&self.model) {
            m.leave();
        }
    }
}

impl DemandTracker {
    /// Tracks `models`, reading time from `clock`.
    pub fn new<'a>(clock: Clock, models: impl IntoIterator<Item = &'a str>) -> DemandTracker {
        let models = models.into_iter().map(|m| (m.to_string(), DemandMeter::default())).collect();
        DemandTracker { clock, models: Arc::new(Mutex::new(models)) }
    }

    fn with<T>(&self, model: &str, f: impl FnOnce(&mut DemandMeter) -> T) -> Option<T> {
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        models.get_mut(model).map(f)
    }

    /// Counts an arrival for `model` (when tracked).
    pub fn arrive(&self, model: &str) {
        let now = self.clock.now();
        self.with(model, |m| m.arrive(now));
    }

    /// Counts a request for `model` in flight until the guard is dropped (`None`: not tracked).
    pub fn enter(&self, model: &str) -> Option<InFlight> {
        self.with(model, DemandMeter::enter)?;
        Some(InFlight { models: self.models.clone(), model: model.to_string() })
    }

    /// Records the time to the first response byte of a request for `model`.
    pub fn first_byte(&self, model: &str, after: Duration) {
        let now = self.clock.now();
        self.with(model, |m| m.first_byte(now, after));
    }

    /// The demand of `model` now, with `queued` requests waiting for a replica.
    pub fn measure(&self, model: &str, queued: u32) -> Demand {
        let now = self.clock.now();
        self.with(model, |m| m.demand(now, queued)).unwrap_or(Demand { queued, ..Demand::default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_arrivals_and_the_p95_are_counted_for_tracked_models_only() {
        let t = DemandTracker::new(Clock::start(), ["a"]);
        assert!(t.enter("b").is_none());
        let guards: Vec<_> = (0..3).filter_map(|_| t.enter("a")).collect();
        for _ in 0..5 {
            t.arrive("a");
            t.arrive("b");
        }
        for ms in 1..=100 {
            t.first_byte("a", Duration::from_millis(ms));
        }
        let m = t.measure("a", 2);
        assert_eq!(
            (m.queued, m.in_flight, m.arrivals_per_min, m.p95_latency),
            (2, 3, 5, Some(Duration::from_millis(95)))
        );
        drop(guards);
        assert_eq!(t.measure("a", 0).in_flight, 0);
        assert_eq!(t.measure("b", 0), Demand::default());
    }
}
