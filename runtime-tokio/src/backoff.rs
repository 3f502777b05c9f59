//! Exponential backoff with jitter for redials: a federation's nodes that lose their
//! gateway at the same moment must not all come back at the same moment.

use rand::Rng;
use std::time::Duration;

/// Delays between attempts: `initial`, doubling up to `max`, each drawn uniformly between
/// half and all of the current step.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    /// Starts at `initial` and never waits longer than `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff { initial, max: max.max(initial), step: initial }
    }

    /// The delay before the next attempt; grows the step for the one after.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(self.max);
        let half = step / 2;
        let extra = rand::rng().random_range(0..=half.as_millis().max(1) as u64);
        half + Duration::from_millis(extra)
    }

    /// After a success: the next failure starts from `initial` again.
    pub fn reset(&mut self) {
        self.step = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_to_the_cap_with_jitter_and_reset() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let first = b.next_delay();
        assert!((50..=101).contains(&(first.as_millis() as u64)), "{first:?}");
        for _ in 0..10 {
            let d = b.next_delay();
            assert!(d <= Duration::from_millis(1001), "{d:?} exceeds the cap");
        }
        assert!(b.next_delay() >= Duration::from_millis(500), "at the cap, at least half of it");
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(101));
    }
}
