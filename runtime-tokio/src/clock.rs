//! Maps tokio's monotonic clock onto the core's [`Time`] and picks generations.

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tela_core::Time;
use tokio::time::Instant;

/// The runtime's timeline: [`Time`] counts microseconds since the clock was made.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A timeline starting now.
    pub fn start() -> Clock {
        Clock { origin: Instant::now() }
    }

    /// The current time on the timeline.
    pub fn now(&self) -> Time {
        self.time_of(Instant::now())
    }

    /// `instant` on the timeline (instants before the origin map to zero).
    pub fn time_of(&self, instant: Instant) -> Time {
        let micros = instant.saturating_duration_since(self.origin).as_micros();
        Time(u64::try_from(micros).unwrap_or(u64::MAX))
    }

    /// The instant of `time`, or `None` for [`Time::NEVER`].
    pub fn instant_of(&self, time: Time) -> Option<Instant> {
        if time == Time::NEVER {
            return None;
        }
        self.origin.checked_add(Duration::from_micros(time.as_micros()))
    }
}

/// A generation for a process starting now: the wall-clock milliseconds since 1970, so that
/// every restart of a node starts above the last one (the core moves above any higher
/// generation it hears of, should the clock have gone backwards).
pub fn generation_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_and_times_round_trip() {
        let clock = Clock::start();
        let later = clock.origin + Duration::from_millis(1500);
        assert_eq!(clock.time_of(later), Time::from_millis(1500));
        assert_eq!(clock.instant_of(Time::from_millis(1500)), Some(later));
        assert_eq!(clock.time_of(clock.origin - Duration::from_secs(1)), Time::ZERO);
        assert_eq!(clock.instant_of(Time::NEVER), None);
        assert!(clock.now() < Time::from_secs(60));
    }

    #[test]
    fn generations_grow() {
        let a = generation_now();
        std::thread::sleep(Duration::from_millis(2));
        assert!(generation_now() > a);
    }
}
