//! The gateway's cold-start waiting room: requests for a spinnable model that has no usable
//! replica wait here — one core [`ColdStartQueue`] per model, bounded in number and in time —
//! instead of failing with 404 or 503.
//!
//! A request [`WaitingRoom::wait`]s on a one-shot channel; nothing is locked while it waits.
//! The release task ([`WaitingRoom::release`], driven by every registry snapshot the gateway's
//! runtime publishes, and by a short poll while anything waits) lets every waiting request of a
//! model go the moment the model has a usable replica here, and answers the ones whose deadline
//! passed ([`WaitingRoom::expire`]). A request whose client goes away is dropped by the server,
//! and its place in the queue with it (see [`Leave`]).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tela_core::cold_start::{ColdStartQueue, Enqueued};
use tela_runtime::clock::Clock;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use super::SpinShared;
use crate::api_error::ApiError;
use crate::metrics::OutcomeLabel;
use crate::service::Shared;
use http::StatusCode;

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// A replica is usable: route the request now.
    Ready {
        /// How long it waited.
        waited: Duration,
    },
    /// No replica became usable within the timeout.
    TimedOut {
        /// How long it waited.
        waited: Duration,
    },
    /// The model's queue is full.
    Full {
        /// The queue's capacity.
        capacity: usize,
    },
}

#[derive(Clone, Copy, Debug)]
enum Outcome {
    Ready,
    TimedOut,
}

#[derive(Default)]
struct Rooms {
    queues: HashMap<String, ColdStartQueue<u64>>,
    waiters: HashMap<u64, oneshot::Sender<Outcome>>,
    next: u64,
}

/// Per-model cold-start queues; see the module docs.
pub struct WaitingRoom {
    clock: Clock,
    capacity: usize,
    timeout: Duration,
    rooms: Mutex<Rooms>,
    /// Wakes the release task when a request starts waiting (its deadline may be the next).
    pub(crate) arrived: Notify,
}

/// Takes a request out of its queue when dropped, whoever drops it (the client went away and
/// the server dropped the request's future, or the wait ended).
pub struct Leave<'a> {
    room: &'a WaitingRoom,
    model: &'a str,
    id: u64,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        let mut rooms = self.room.rooms.lock().unwrap_or_else(PoisonError::into_inner);
        rooms.waiters.remove(&self.id);
        if let Some(q) = rooms.queues.get_mut(self.model) {
            q.remove(&self.id);
        }
    }
}

impl WaitingRoom {
    /// Queues of `capacity` requests per model, each waiting at most `timeout`, on `clock`.
    pub fn new(clock: Clock, capacity: usize, timeout: Duration) -> WaitingRoom {
        WaitingRoom { clock, capacity, timeout, rooms: Mutex::default(), arrived: Notify::new() }
    }

    /// The longest a request waits.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Waits for a usable replica of `model`; see the module docs. `on_enqueued` runs once the
    /// request waits (to wake the spinner).
    pub async fn wait(&self, model: &str, on_enqueued: impl FnOnce()) -> Admission {
        let started = Instant::now();
        let (tx, rx) = oneshot::channel();
        let (id, deadline) = {
            let mut rooms = self.rooms.lock().unwrap_or_else(PoisonError::into_inner);
            let id = rooms.next;
            rooms.next += 1;
            let (capacity, timeout) = (self.capacity, self.timeout);
            let queue = rooms.queues.entry(model.to_string()).or_insert_with(|| ColdStartQueue::new(capacity, timeout));
            match queue.enqueue(self.clock.now(), id) {
                Enqueued::Full(_) => return Admission::Full { capacity },
                Enqueued::Accepted { deadline } => {
                    rooms.waiters.insert(id, tx);
                    (id, deadline)
                }
            }
        };
        let _leave = Leave { room: self, model, id };
        self.arrived.notify_one();
        on_enqueued();
        // The release task answers at the deadline; the timer here only guards against it
        // being gone.
        let guard = self.clock.instant_of(deadline).unwrap_or_else(|| started + self.timeout) + Duration::from_secs(1);
        let outcome = tokio::time::timeout_at(guard, rx).await;
        let waited = started.elapsed();
        match outcome {
            Ok(Ok(Outcome::Ready)) => Admission::Ready { waited },
            Ok(Ok(Outcome::TimedOut)) | Ok(Err(_)) | Err(_) => Admission::TimedOut { waited },
        }
    }

    /// Requests waiting for `model`.
    pub fn queued(&self, model: &str) -> usize {
        let rooms = self.rooms.lock().unwrap_or_else(PoisonError::into_inner);
        rooms.queues.get(model).map_or(0, ColdStartQueue::len)
    }

    /// Models with waiting requests.
    pub fn waiting_models(&self) -> Vec<String> {
        let rooms = self.rooms.lock().unwrap_or_else(PoisonError::into_inner);
        rooms.queues.iter().filter(|(_, q)| !q.is_empty()).map(|(m, _)| m.clone()).collect()
    }

    /// Lets every waiting request of `model` go (a replica is usable); how many went.
    pub fn release(&self, model: &str) -> usize {
        let mut rooms = self.rooms.lock().unwrap_or_else(PoisonError::into_inner);
        let now = self.clock.now();
        let ids = rooms.queues.get_mut(model).map(|q| q.on_replica_ready(now)).unwrap_or_default();
        let n = ids.len();
        for id in ids {
            if let Some(tx) = rooms.waiters.remove(&id) {
                let _ = tx.send(Outcome::Ready);
            }
        }
        n
    }

    /// Answers every request whose deadline passed; how many.
    pub fn expire(&self) -> usize {
        let mut rooms = self.rooms.lock().unwrap_or_else(PoisonError::into_inner);
        let now = self.clock.now();
        let Rooms { queues, waiters, .. } = &mut *rooms;
        let mut n = 0;
        for q in queues.values_mut() {
            for id in q.expire(now) {
                n += 1;
                if let Some(tx) = waiters.remove(&id) {
                    let _ = tx.send(Outcome::TimedOut);
                }
            }
        }
        n
    }

    /// The earliest deadline of a waiting request.
    pub fn next_deadline(&self) -> Option<Instant> {
        let rooms = self.rooms.lock().unwrap_or_else(PoisonError::into_inner);
        rooms.queues.values().filter_map(ColdStartQueue::next_deadline).min().and_then(|t| self.clock.instant_of(t))
    }
}

/// Lets a request for spinnable `model` proceed: at once when a replica is usable here,
/// otherwise after waiting for one. The error is the client's answer: 503 with `Retry-After`
/// when none came in time, 429 when the model's queue is full.
pub(crate) async fn admit(shared: &Shared, spin: &SpinShared, model: &str) -> Result<(), ApiError> {
    spin.demand.arrive(model);
    let view = shared.anchor_view();
    if super::usable(&view, &view.snapshot(), model) {
        return Ok(());
    }
    tracing::debug!(model, "no usable replica of '{model}': the request waits for one");
    let admission = spin.room.wait(model, || spin.wake()).await;
    let observe = |outcome: &str, waited: Duration| {
        shared
            .metrics
            .cold_start_wait
            .get_or_create(&OutcomeLabel { outcome: outcome.into() })
            .observe(waited.as_secs_f64())
    };
    match admission {
        Admission::Ready { waited } => {
            observe("ready", waited);
            Ok(())
        }
        Admission::TimedOut { waited } => {
            observe("timeout", waited);
            Err(ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                kind: "server_error",
                code: "model_starting",
                message: format!(
                    "the model '{model}' is starting: no replica was ready within {}; retry shortly",
                    humantime::format_duration(Duration::from_secs(waited.as_secs()))
                ),
                param: None,
                retry_after: Some(RETRY_AFTER_SECS),
            })
        }
        Admission::Full { capacity } => Err(ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: "rate_limit_error",
            code: "cold_start_queue_full",
            message: format!(
                "the model '{model}' is starting and {capacity} requests already wait for it, the limit; retry shortly"
            ),
            param: None,
            retry_after: Some(RETRY_AFTER_SECS),
        }),
    }
}

/// `Retry-After` on cold-start refusals: a replica takes a while to start.
const RETRY_AFTER_SECS: u32 = 10;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn requests_wait_until_released_time_out_or_leave_when_dropped() {
        let room = Arc::new(WaitingRoom::new(Clock::start(), 2, Duration::from_millis(300)));
        let waiter = {
            let room = room.clone();
            tokio::spawn(async move { room.wait("m", || {}).await })
        };
        let dropped = {
            let room = room.clone();
            tokio::spawn(async move { room.wait("m", || {}).await })
        };
        while room.queued("m") < 2 {
            tokio::task::yield_now().await;
        }
        assert_eq!(room.wait("m", || {}).await, Admission::Full { capacity: 2 });
        // A client that goes away frees its place at once.
        dropped.abort();
        let _ = dropped.await;
        assert_eq!(room.queued("m"), 1);
        assert_eq!(room.release("m"), 1);
        assert!(matches!(waiter.await.expect("joins"), Admission::Ready { .. }));
        // Nobody releases this one: the deadline answers it.
        let late = {
            let room = room.clone();
            tokio::spawn(async move { room.wait("m", || {}).await })
        };
        while room.next_deadline().is_none() {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep_until(room.next_deadline().expect("deadline")).await;
        assert_eq!(room.expire(), 1);
        assert!(matches!(late.await.expect("joins"), Admission::TimedOut { .. }));
        assert_eq!((room.queued("m"), room.waiting_models().len()), (0, 0));
    }
}
