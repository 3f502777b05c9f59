//! [`EngineTraffic`]: what is flowing between the node and its engine right now — requests
//! sent and not finished, when the engine last sent a byte, how many requests it completed.
//!
//! The tunnel handler ([`crate::forward`]) writes it as responses arrive; the engine
//! supervisor ([`super::supervise`]) reads it to tell an engine that is too busy to answer a
//! probe in time from one that is stuck (see [`super::health`]). Writing costs one atomic
//! store per body frame; nothing locks.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::time::Instant;

/// The progress of the requests the node forwards to its engine. Cheap to clone; clones
/// share the counts.
#[derive(Clone, Debug)]
pub struct EngineTraffic {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// What the timestamps count from.
    epoch: Instant,
    in_flight: AtomicU32,
    /// Milliseconds since `epoch` of the last byte from the engine, plus one; 0: never.
    last_byte: AtomicU64,
    completed: AtomicU64,
}

/// One request sent to the engine; counts as in flight until dropped.
#[derive(Debug)]
#[must_use = "the request counts as in flight only while this is held"]
pub struct EngineRequest {
    inner: Arc<Inner>,
}

/// A point to measure progress from ([`EngineTraffic::mark`]).
#[derive(Clone, Copy, Debug)]
pub struct TrafficMark {
    at: u64,
    completed: u64,
}

/// What flowed between a [`TrafficMark`] and now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flow {
    /// Requests at the engine now.
    pub in_flight: u32,
    /// Whether the engine sent any byte (a response head, a body frame) since the mark.
    pub bytes: bool,
    /// Requests the engine finished answering since the mark.
    pub completed: u64,
}

impl Default for EngineTraffic {
    fn default() -> Self {
        EngineTraffic::new()
    }
}

impl EngineTraffic {
    /// Nothing in flight, nothing received yet.
    pub fn new() -> EngineTraffic {
        EngineTraffic {
            inner: Arc::new(Inner {
                epoch: Instant::now(),
                in_flight: AtomicU32::new(0),
                last_byte: AtomicU64::new(0),
                completed: AtomicU64::new(0),
            }),
        }
    }

    /// Counts a request sent to the engine until the returned guard is dropped.
    pub fn start(&self) -> EngineRequest {
        self.inner.in_flight.fetch_add(1, Ordering::AcqRel);
        EngineRequest { inner: self.inner.clone() }
    }

    /// Now, to measure [`EngineTraffic::since`] from.
    pub fn mark(&self) -> TrafficMark {
        TrafficMark { at: self.inner.now(), completed: self.inner.completed.load(Ordering::Acquire) }
    }

    /// What flowed since `mark`.
    pub fn since(&self, mark: TrafficMark) -> Flow {
        let last = self.inner.last_byte.load(Ordering::Acquire);
        Flow {
            in_flight: self.inner.in_flight.load(Ordering::Acquire),
            bytes: last != 0 && last >= mark.at,
            completed: self.inner.completed.load(Ordering::Acquire).saturating_sub(mark.completed),
        }
    }
}

impl Inner {
    /// Milliseconds since the epoch, plus one (so that 0 can mean "never").
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }
}

impl EngineRequest {
    /// The engine sent something for this request (its response head, a body frame).
    pub fn received(&self) {
        self.inner.last_byte.fetch_max(self.inner.now(), Ordering::AcqRel);
    }

    /// The engine finished this response (its last byte arrived).
    pub fn completed(self) {
        self.received();
        self.inner.completed.fetch_add(1, Ordering::AcqRel);
    }
}

impl Drop for EngineRequest {
    fn drop(&mut self) {
        // Each guard added exactly one, so this never underflows.
        self.inner.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn flow_counts_what_happened_after_the_mark() {
        let traffic = EngineTraffic::new();
        let first = traffic.start();
        first.received();
        std::thread::sleep(Duration::from_millis(3));
        let mark = traffic.mark();
        assert_eq!(traffic.since(mark), Flow { in_flight: 1, bytes: false, completed: 0 }, "bytes before the mark");

        std::thread::sleep(Duration::from_millis(3));
        first.received();
        assert_eq!(traffic.since(mark), Flow { in_flight: 1, bytes: true, completed: 0 });
        let second = traffic.start();
        first.completed();
        assert_eq!(traffic.since(mark), Flow { in_flight: 1, bytes: true, completed: 1 });
        drop(second); // ended without an answer: not a completion
        assert_eq!(traffic.since(mark), Flow { in_flight: 0, bytes: true, completed: 1 });
        std::thread::sleep(Duration::from_millis(3));
        assert_eq!(traffic.since(traffic.mark()), Flow::default());
    }
}
