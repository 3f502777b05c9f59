//! [`InFlight`]: the count of requests a node is serving, shared by the request handlers that
//! change it and the driver that reports it to the core as [`tela_core::Load`].
//!
//! A handler calls [`InFlight::enter`] and holds the returned [`InFlightGuard`] until the
//! response is fully sent; dropping the guard (also on error or cancellation) leaves. Every
//! change wakes the driver, which reads the latest count — changes in between coalesce, but
//! the last one is never missed, which is what the core's drain needs (LEFT once it reads 0).
//! It wakes the engine's load reporter the same way ([`InFlight::changed_for_reports`]), which
//! tells the gateways at once that a tunnelled request started or ended.

use crate::sync::{Arc, AtomicU32, Ordering};

/// A shared in-flight request counter. Cheap to clone; all clones count together.
#[derive(Clone, Debug, Default)]
pub struct InFlight {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    count: AtomicU32,
    #[cfg(not(loom))]
    changed: tokio::sync::Notify,
    #[cfg(not(loom))]
    changed_for_reports: tokio::sync::Notify,
}

/// One request in flight; leaves when dropped.
#[derive(Debug)]
#[must_use = "the request counts as in flight only while the guard is held"]
pub struct InFlightGuard {
    inner: Arc<Inner>,
}

impl InFlight {
    /// A counter at zero.
    pub fn new() -> InFlight {
        InFlight::default()
    }

    /// Counts one more request until the guard is dropped.
    pub fn enter(&self) -> InFlightGuard {
        self.inner.count.fetch_add(1, Ordering::AcqRel);
        self.inner.notify();
        InFlightGuard { inner: self.inner.clone() }
    }

    /// Requests in flight now.
    pub fn get(&self) -> u32 {
        self.inner.count.load(Ordering::Acquire)
    }

    /// Resolves after the next change (or at once if one happened since the last call);
    /// then read [`InFlight::get`]. Meant for one waiter, the driver.
    #[cfg(not(loom))]
    pub async fn changed(&self) {
        self.inner.changed.notified().await;
    }

    /// As [`InFlight::changed`], for a second waiter: the engine's load reporter.
    #[cfg(not(loom))]
    pub async fn changed_for_reports(&self) {
        self.inner.changed_for_reports.notified().await;
    }
}

impl Inner {
    fn notify(&self) {
        // `notify_one` stores a permit when nobody waits, so a change made while the driver
        // is busy is seen on its next wait.
        #[cfg(not(loom))]
        {
            self.changed.notify_one();
            self.changed_for_reports.notify_one();
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        // Each guard added exactly one, so this never underflows.
        self.inner.count.fetch_sub(1, Ordering::AcqRel);
        self.inner.notify();
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::thread;

    #[test]
    fn loom_concurrent_requests_count_exactly_and_return_to_zero() {
        loom::model(|| {
            let in_flight = InFlight::new();
            let handlers: Vec<_> = (0..2)
                .map(|_| {
                    let in_flight = in_flight.clone();
                    thread::spawn(move || {
                        let guard = in_flight.enter();
                        let seen = in_flight.get();
                        assert!((1..=2).contains(&seen), "saw {seen} with a guard held");
                        drop(guard);
                    })
                })
                .collect();
            // The driver's view while handlers run: never more than the handlers, never
            // wrapped below zero.
            let seen = in_flight.get();
            assert!(seen <= 2, "saw {seen}");
            for h in handlers {
                h.join().expect("handler");
            }
            assert_eq!(in_flight.get(), 0);
        });
    }

    #[test]
    fn loom_a_guard_dropped_on_another_thread_still_leaves() {
        loom::model(|| {
            let in_flight = InFlight::new();
            let guard = in_flight.enter();
            let t = thread::spawn(move || drop(guard));
            let during = in_flight.get();
            assert!(during <= 1);
            t.join().expect("thread");
            assert_eq!(in_flight.get(), 0);
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn changes_wake_the_waiter_even_if_made_before_it_waits() {
        let in_flight = InFlight::new();
        let guard = in_flight.enter();
        tokio::time::timeout(Duration::from_secs(1), in_flight.changed())
            .await
            .expect("the enter before waiting is not lost");
        assert_eq!(in_flight.get(), 1);
        drop(guard);
        tokio::time::timeout(Duration::from_secs(1), in_flight.changed()).await.expect("the leave wakes");
        assert_eq!(in_flight.get(), 0);
        // The reporter has a wake-up of its own: the driver's did not consume it.
        tokio::time::timeout(Duration::from_secs(1), in_flight.changed_for_reports())
            .await
            .expect("the reporter is woken too");
    }
}
