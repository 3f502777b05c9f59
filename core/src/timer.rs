//! The node's timers: a small closed set in a flat table, not ad-hoc deadlines.

use crate::time::Time;

/// Every timer a [`Node`](crate::Node) can arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timer {
    /// A gossip round: piggyback-only gossip while there is news, a pull on an outbound-only
    /// node, fetch retries.
    Gossip,
    /// The failure detector's next deadline.
    Probe,
    /// An anti-entropy exchange with one peer, to repair what piggybacking missed.
    AntiEntropy,
    /// Walltime minus the drain window: start draining.
    DrainStart,
    /// The drain deadline: leave even if requests are still in flight.
    DrainDeadline,
    /// After LEFT has been spread for a while: tell the runtime to exit.
    Exit,
}

impl Timer {
    /// All timers, in the order they fire when due at the same time.
    pub(crate) const ALL: [Timer; 6] =
        [Timer::DrainDeadline, Timer::DrainStart, Timer::Probe, Timer::Gossip, Timer::AntiEntropy, Timer::Exit];
    const COUNT: usize = 6;

    fn slot(self) -> usize {
        self as usize
    }
}

/// When each timer fires next, if armed.
#[derive(Clone, Debug, Default)]
pub(crate) struct TimerTable {
    due: [Option<Time>; Timer::COUNT],
}

impl TimerTable {
    /// Arms `timer` for `at`, replacing any earlier arming.
    pub(crate) fn set(&mut self, timer: Timer, at: Time) {
        self.due[timer.slot()] = Some(at);
    }

    /// Disarms `timer`.
    pub(crate) fn stop(&mut self, timer: Timer) {
        self.due[timer.slot()] = None;
    }

    /// Disarms every timer.
    pub(crate) fn stop_all(&mut self) {
        self.due = [None; Timer::COUNT];
    }

    /// When `timer` fires, if armed.
    pub(crate) fn get(&self, timer: Timer) -> Option<Time> {
        self.due[timer.slot()]
    }

    /// The earliest armed deadline, or [`Time::NEVER`].
    pub(crate) fn next_deadline(&self) -> Time {
        self.due.iter().flatten().copied().min().unwrap_or(Time::NEVER)
    }

    /// Disarms and returns the first timer (in [`Timer::ALL`] order) that is due at `now`.
    pub(crate) fn pop_expired(&mut self, now: Time) -> Option<Timer> {
        let t = Timer::ALL.into_iter().find(|t| self.due[t.slot()].is_some_and(|at| at <= now))?;
        self.stop(t);
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_timers_pop_once_in_priority_order() {
        let mut t = TimerTable::default();
        assert_eq!(t.next_deadline(), Time::NEVER);
        t.set(Timer::Gossip, Time(10));
        t.set(Timer::DrainDeadline, Time(10));
        t.set(Timer::AntiEntropy, Time(30));
        assert_eq!(t.next_deadline(), Time(10));
        assert_eq!(t.pop_expired(Time(5)), None);
        assert_eq!(t.pop_expired(Time(10)), Some(Timer::DrainDeadline));
        assert_eq!(t.pop_expired(Time(10)), Some(Timer::Gossip));
        assert_eq!(t.pop_expired(Time(10)), None);
        assert_eq!(t.next_deadline(), Time(30));
    }
}
