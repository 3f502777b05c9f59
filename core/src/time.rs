//! Time as an input: the core never reads a clock.
//!
//! [`Time`] is a point on the caller's monotonic timeline in microseconds. The tokio runtime maps
//! `std::time::Instant` onto it; the simulator uses virtual time. Only differences between two
//! `Time`s taken from the same node's timeline are meaningful — times are never sent to peers.

use core::fmt;
use core::ops::{Add, Sub};
use core::time::Duration;

/// A point in time on the local node's monotonic timeline, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(pub u64);

impl Time {
    /// The start of the timeline.
    pub const ZERO: Time = Time(0);
    /// A time that never comes; the deadline of a node with no timer armed.
    pub const NEVER: Time = Time(u64::MAX);

    /// Builds a time from whole milliseconds.
    pub const fn from_millis(ms: u64) -> Time {
        Time(ms.saturating_mul(1_000))
    }

    /// Builds a time from whole seconds.
    pub const fn from_secs(s: u64) -> Time {
        Time(s.saturating_mul(1_000_000))
    }

    /// Microseconds since the start of the timeline.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// Whole milliseconds since the start of the timeline.
    pub const fn as_millis(self) -> u64 {
        self.0 / 1_000
    }

    /// The time elapsed since `earlier`, or zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Time) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }

    /// `self - d`, stopping at zero.
    pub fn saturating_sub(self, d: Duration) -> Time {
        Time(self.0.saturating_sub(micros(d)))
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(micros(d)))
    }
}

impl Sub<Time> for Time {
    type Output = Duration;
    fn sub(self, earlier: Time) -> Duration {
        self.saturating_since(earlier)
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Time::NEVER {
            return f.write_str("never");
        }
        write!(f, "{}.{:06}s", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_wrapping() {
        assert_eq!(Time::NEVER + Duration::from_secs(1), Time::NEVER);
        assert_eq!(Time::ZERO.saturating_sub(Duration::from_secs(1)), Time::ZERO);
        assert_eq!(Time::from_secs(1) - Time::from_secs(2), Duration::ZERO);
        assert_eq!(Time::from_millis(1500) - Time::from_secs(1), Duration::from_millis(500));
        assert_eq!(Time::from_millis(1500).to_string(), "1.500000s");
    }
}
