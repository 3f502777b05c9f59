//! The cold-start queue: requests for a spinnable model with no replica wait here, bounded in
//! number and in time, instead of failing at once.
//!
//! One queue per model, kept by the gateway. A request is either accepted with a deadline or
//! refused because the queue is full (the gateway answers 503 at once). When a replica of the
//! model becomes routable the gateway releases every waiting request, oldest first; at each
//! [`ColdStartQueue::next_deadline`] it expires the requests that waited too long and answers
//! them with an error that says the model is still starting; a request whose client went away
//! is [removed](ColdStartQueue::remove). The queue's length is the `queued` demand the spinner
//! sees.
//!
//! ```
//! use std::time::Duration;
//! use tela_core::cold_start::{ColdStartQueue, Enqueued};
//! use tela_core::Time;
//!
//! let mut q = ColdStartQueue::new(2, Duration::from_secs(60));
//! assert!(matches!(q.enqueue(Time::ZERO, 1), Enqueued::Accepted { .. }));
//! assert!(matches!(q.enqueue(Time::from_secs(1), 2), Enqueued::Accepted { .. }));
//! assert!(matches!(q.enqueue(Time::from_secs(2), 3), Enqueued::Full(3)));
//! assert_eq!(q.expire(Time::from_secs(60)), vec![1]);
//! assert_eq!(q.on_replica_ready(Time::from_secs(60)), vec![2]);
//! ```

use crate::time::Time;
use core::time::Duration;
use std::collections::VecDeque;

/// What became of a request offered to the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Enqueued<T> {
    /// It waits until a replica is ready or `deadline` passes.
    Accepted {
        /// When it times out.
        deadline: Time,
    },
    /// The queue is full; the request is handed back and the queue is unchanged.
    Full(T),
}

/// A bounded FIFO of requests waiting for a model's first replica; `T` identifies a request.
#[derive(Debug, Clone)]
pub struct ColdStartQueue<T> {
    capacity: usize,
    timeout: Duration,
    /// Oldest first; deadlines never decrease because time never goes backwards.
    waiting: VecDeque<(Time, T)>,
    now: Time,
}

impl<T> ColdStartQueue<T> {
    /// A queue holding at most `capacity` requests for at most `timeout` each.
    pub fn new(capacity: usize, timeout: Duration) -> ColdStartQueue<T> {
        ColdStartQueue { capacity, timeout, waiting: VecDeque::new(), now: Time::ZERO }
    }

    /// Offers a request that arrived at `now`.
    pub fn enqueue(&mut self, now: Time, request: T) -> Enqueued<T> {
        self.now = self.now.max(now);
        if self.waiting.len() >= self.capacity {
            return Enqueued::Full(request);
        }
        let deadline = self.now + self.timeout;
        self.waiting.push_back((deadline, request));
        Enqueued::Accepted { deadline }
    }

    /// A replica is ready: every request still within its deadline, oldest first.
    ///
    /// Requests past their deadline stay for [`ColdStartQueue::expire`], so the caller answers
    /// each request exactly once and in the way its wait deserves.
    pub fn on_replica_ready(&mut self, now: Time) -> Vec<T> {
        self.now = self.now.max(now);
        let expired = self.waiting.iter().take_while(|(deadline, _)| *deadline <= self.now).count();
        self.waiting.drain(expired..).map(|(_, r)| r).collect()
    }

    /// The requests whose deadline is at or before `now`, oldest first.
    pub fn expire(&mut self, now: Time) -> Vec<T> {
        self.now = self.now.max(now);
        let expired = self.waiting.iter().take_while(|(deadline, _)| *deadline <= self.now).count();
        self.waiting.drain(..expired).map(|(_, r)| r).collect()
    }

    /// Takes `request` out of the queue (its client went away); whether it was waiting.
    pub fn remove(&mut self, request: &T) -> bool
    where
        T: PartialEq,
    {
        match self.waiting.iter().position(|(_, r)| r == request) {
            Some(i) => {
                self.waiting.remove(i);
                true
            }
            None => false,
        }
    }

    /// When the oldest waiting request times out, if any waits.
    pub fn next_deadline(&self) -> Option<Time> {
        self.waiting.front().map(|(deadline, _)| *deadline)
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// The most requests it holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn a_full_queue_refuses_and_hands_the_request_back() {
        let mut q = ColdStartQueue::new(3, MIN);
        for id in 0..3 {
            assert_eq!(q.enqueue(Time::from_secs(id), id), Enqueued::Accepted { deadline: Time::from_secs(id + 60) });
        }
        assert_eq!(q.enqueue(Time::from_secs(4), 99), Enqueued::Full(99));
        assert_eq!(q.len(), 3);
        // Releasing makes room again.
        assert_eq!(q.on_replica_ready(Time::from_secs(5)), vec![0, 1, 2]);
        assert!(q.is_empty());
        assert!(matches!(q.enqueue(Time::from_secs(6), 7), Enqueued::Accepted { .. }));
    }

    #[test]
    fn a_request_whose_client_left_is_removed_and_frees_its_place() {
        let mut q = ColdStartQueue::new(2, MIN);
        let _ = q.enqueue(Time::ZERO, 1);
        let _ = q.enqueue(Time::from_secs(1), 2);
        assert!(q.remove(&1) && !q.remove(&1));
        assert_eq!(q.next_deadline(), Some(Time::from_secs(61)));
        assert!(matches!(q.enqueue(Time::from_secs(2), 3), Enqueued::Accepted { .. }));
        assert_eq!(q.on_replica_ready(Time::from_secs(3)), vec![2, 3]);
    }

    #[test]
    fn zero_capacity_fails_at_once() {
        let mut q = ColdStartQueue::new(0, MIN);
        assert_eq!(q.enqueue(Time::ZERO, 1), Enqueued::Full(1));
    }

    #[test]
    fn requests_time_out_in_arrival_order_and_not_before_their_deadline() {
        let mut q = ColdStartQueue::new(10, MIN);
        let _ = q.enqueue(Time::from_secs(0), "a");
        let _ = q.enqueue(Time::from_secs(10), "b");
        let _ = q.enqueue(Time::from_secs(20), "c");
        assert_eq!(q.next_deadline(), Some(Time::from_secs(60)));
        assert!(q.expire(Time::from_secs(59)).is_empty());
        assert_eq!(q.expire(Time::from_secs(70)), vec!["a", "b"]);
        assert_eq!(q.next_deadline(), Some(Time::from_secs(80)));
        // A replica comes up after c's deadline: c is expired, not released.
        assert!(q.on_replica_ready(Time::from_secs(81)).is_empty());
        assert_eq!(q.expire(Time::from_secs(81)), vec!["c"]);
        assert_eq!(q.next_deadline(), None);
    }

    #[test]
    fn time_going_backwards_does_not_shorten_a_wait() {
        let mut q = ColdStartQueue::new(10, MIN);
        let _ = q.enqueue(Time::from_secs(100), 1);
        assert_eq!(q.enqueue(Time::from_secs(50), 2), Enqueued::Accepted { deadline: Time::from_secs(160) });
        assert!(q.expire(Time::from_secs(10)).is_empty());
    }

    proptest! {
        /// Every accepted request is answered exactly once, never beyond capacity, never late
        /// when it is released and never early when it expires.
        #[test]
        fn every_request_is_answered_once(ops in proptest::collection::vec((0u8..3, 0u64..40), 0..200)) {
            let mut q = ColdStartQueue::new(5, MIN);
            let mut now = Time::ZERO;
            let mut deadlines = std::collections::BTreeMap::new();
            let mut answered = std::collections::BTreeSet::new();
            for (i, (op, dt)) in ops.into_iter().enumerate() {
                now = now + Duration::from_secs(dt);
                match op {
                    0 => match q.enqueue(now, i) {
                        Enqueued::Accepted { deadline } => { deadlines.insert(i, deadline); }
                        Enqueued::Full(r) => prop_assert!(r == i && q.len() == 5),
                    },
                    1 => for r in q.on_replica_ready(now) {
                        prop_assert!(deadlines[&r] > now && answered.insert(r));
                    },
                    _ => for r in q.expire(now) {
                        prop_assert!(deadlines[&r] <= now && answered.insert(r));
                    },
                }
                prop_assert!(q.len() <= 5);
                prop_assert_eq!(q.len() + answered.len(), deadlines.len());
            }
        }
    }
}
