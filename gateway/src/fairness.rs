//! Fair sharing between API keys in front of the nodes: one key flooding the federation does
//! not starve the others.
//!
//! Each model has [`FairSettings::slots_per_node`] request slots per node that serves it and has
//! a tunnel here. While slots are free, a request takes one at once and is forwarded as before.
//! When the model is saturated — every slot holds a request that has not ended — a new request
//! waits in its key's own queue, and each slot that frees goes to the next key in deficit round
//! robin, weighted by each request's token estimate ([`crate::fair_queue`]): every key with
//! waiting requests gets an equal share of the model's tokens, so a polite key's request waits
//! for about one request of each other busy key, not for the whole flood. A key's queue holds
//! at most [`FairSettings::queue_per_key`] requests (429 above, `Retry-After: 1`), and a request
//! waits at most [`FairSettings::max_wait`] for a slot (then 429, `Retry-After: 1`). A client
//! that goes away while waiting leaves the queue; a slot granted to it is handed on.
//!
//! Keys are told apart by name (keys that share a name — one holder's old and new key — share a
//! queue); a gateway without keys has one queue. The slots count only this gateway's requests:
//! each gateway shares its own slots fairly, and the engines queue what several gateways send
//! beyond them. `slots_per_node = 0` turns fair queueing off. The held slot is released when
//! the response ends on any path (the body holds it, [`crate::body`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::api_error::ApiError;
use crate::fair_queue::{FairQueue, Ticket};

/// Tokens a key receives per turn: small, so that a polite key waits for about one request of
/// each busy key (a request of many quanta takes that many rounds, computed at once).
const QUANTUM: u64 = 32;
/// A request's cost is capped at this many tokens, so that one huge estimate is one long turn.
const MAX_COST: u64 = 1 << 15;

/// How keys share a saturated model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FairSettings {
    /// Requests in flight from this gateway per node serving the model before requests queue
    /// per key (0: no fair queueing).
    pub slots_per_node: usize,
    /// Requests one key may have waiting per model.
    pub queue_per_key: usize,
    /// The longest a request waits for a slot.
    pub max_wait: Duration,
}

impl Default for FairSettings {
    fn default() -> Self {
        FairSettings { slots_per_node: 64, queue_per_key: 256, max_wait: Duration::from_secs(60) }
    }
}

type Waiter = oneshot::Sender<()>;

/// Every model's fair queue at this gateway.
pub struct FairShare {
    settings: FairSettings,
    models: Mutex<HashMap<String, FairQueue<String, Waiter>>>,
}

/// A request's slot on its model; released (and handed on) when dropped.
pub struct Slot {
    share: Arc<FairShare>,
    model: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut models = self.share.lock();
        if let Some(queue) = models.get_mut(&self.model) {
            queue.release();
            hand_on(queue);
        }
    }
}

/// Gives free slots to waiters until none is free or none waits; a waiter that has gone hands
/// its slot back.
fn hand_on(queue: &mut FairQueue<String, Waiter>) {
    while let Some(waiter) = queue.grant() {
        if waiter.send(()).is_err() {
            queue.release();
        }
    }
}

/// A queued request's place; leaving it (the client went away, the wait timed out) takes it
/// out of the queue, or hands on a slot granted meanwhile.
struct Waiting {
    share: Arc<FairShare>,
    model: String,
    flow: String,
    ticket: Ticket,
    granted: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let Some(mut rx) = self.granted.take() else { return };
        let mut models = self.share.lock();
        let Some(queue) = models.get_mut(&self.model) else { return };
        if !queue.cancel(&self.flow, self.ticket) && rx.try_recv().is_ok() {
            // Granted just as it left: the slot is nobody's.
            queue.release();
            hand_on(queue);
        }
    }
}

impl FairShare {
    /// Fair queueing by `settings`.
    pub fn new(settings: FairSettings) -> Arc<FairShare> {
        Arc::new(FairShare { settings, models: Mutex::new(HashMap::new()) })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, FairQueue<String, Waiter>>> {
        self.models.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a slot on `model` for key `flow`, whose request costs about `cost()` tokens
    /// (asked only when it must queue); `nodes` serve the model here now. `None` when fair
    /// queueing is off or no node serves the model (routing answers that); a 429 when the key's
    /// queue is full or the wait too long.
    pub async fn enter(
        self: &Arc<Self>,
        model: &str,
        flow: &str,
        nodes: usize,
        cost: impl FnOnce() -> u64,
    ) -> Result<Option<Slot>, ApiError> {
        self.enter_within(model, flow, nodes, cost, self.settings.max_wait).await
    }

    /// [`FairShare::enter`], waiting at most `max_wait` (and never longer than the settings'
    /// `max_wait`): a request that may go elsewhere ([`crate::overflow`]) waits less.
    pub async fn enter_within(
        self: &Arc<Self>,
        model: &str,
        flow: &str,
        nodes: usize,
        cost: impl FnOnce() -> u64,
        max_wait: Duration,
    ) -> Result<Option<Slot>, ApiError> {
        let max_wait = max_wait.min(self.settings.max_wait);
        if self.settings.slots_per_node == 0 || nodes == 0 {
            return Ok(None);
        }
        let capacity = nodes.saturating_mul(self.settings.slots_per_node);
        let slot = || Slot { share: self.clone(), model: model.to_string() };
        let (tx, rx) = oneshot::channel();
        let ticket = {
            let mut models = self.lock();
            let queue = models
                .entry(model.to_string())
                .or_insert_with(|| FairQueue::new(capacity, self.settings.queue_per_key, QUANTUM));
            queue.set_capacity(capacity);
            hand_on(queue);
            if queue.try_start() {
                return Ok(Some(slot()));
            }
            match queue.enqueue(flow.to_string(), cost().clamp(1, MAX_COST), tx) {
                Ok(ticket) => ticket,
                Err(_) => {
                    return Err(ApiError::rate_limited(
                        "requests",
                        format!(
                            "Model '{model}' is saturated and key '{flow}' already has {} requests waiting for it \
                             (the most a key may queue). Please try again when some of them have finished.",
                            self.settings.queue_per_key
                        ),
                        Some(1),
                    ))
                }
            }
        };
        let mut waiting = Waiting {
            share: self.clone(),
            model: model.to_string(),
            flow: flow.to_string(),
            ticket,
            granted: Some(rx),
        };
        let rx = waiting.granted.as_mut().expect("just set");
        match tokio::time::timeout(max_wait, rx).await {
            Ok(Ok(())) => {
                waiting.granted = None;
                Ok(Some(slot()))
            }
            // The sender is only dropped with the queue's lock held after a cancel, which only
            // this request does: treat it as a timeout.
            Ok(Err(_)) | Err(_) => Err(ApiError::rate_limited(
                "requests",
                format!(
                    "Model '{model}' stayed saturated for {}; the request waited its turn (fairly shared between keys) \
                     and did not get one. Please try again.",
                    humantime::format_duration(max_wait)
                ),
                Some(1),
            )),
        }
    }

    /// Requests of every key waiting for `model`.
    pub fn waiting(&self, model: &str) -> usize {
        self.lock().get(model).map_or(0, FairQueue::waiting)
    }
}

/// Nodes that serve `model` (routable in the registry) and have a tunnel to this gateway.
pub fn nodes_serving(view: &tela_runtime::RuntimeView, model: &str) -> usize {
    let snapshot = view.snapshot();
    let count = snapshot.replica().serving(model).iter().filter(|id| view.connection(id).is_some()).count();
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(slots: usize) -> FairSettings {
        FairSettings { slots_per_node: slots, queue_per_key: 2, max_wait: Duration::from_secs(5) }
    }

    #[tokio::test]
    async fn slots_are_handed_to_the_next_key_in_turn() {
        let share = FairShare::new(settings(1));
        let enter = |flow: &'static str| {
            let share = share.clone();
            tokio::spawn(async move { share.enter("m", flow, 1, || QUANTUM).await })
        };
        let first = share.enter("m", "flood", 1, || QUANTUM).await.expect("free").expect("a slot");
        let flood = enter("flood");
        tokio::task::yield_now().await;
        let flood_again = enter("flood");
        tokio::task::yield_now().await;
        // The flood's queue (2) is full now: a third waits no more.
        let refused = share.enter("m", "flood", 1, || QUANTUM).await.err().expect("queue full");
        assert_eq!(refused.status.as_u16(), 429);
        let polite = enter("polite");
        tokio::task::yield_now().await;
        assert_eq!(share.waiting("m"), 3);
        drop(first);
        let flood_slot = flood.await.expect("task").expect("granted").expect("a slot");
        assert_eq!(share.waiting("m"), 2);
        // The freed slot goes to the polite key, not to the flood's second request.
        drop(flood_slot);
        let polite_slot = polite.await.expect("task").expect("granted").expect("a slot");
        assert!(!flood_again.is_finished(), "the flood's second request waits for the polite key");
        drop(polite_slot);
        assert!(flood_again.await.expect("task").expect("granted").is_some());
        assert_eq!(share.waiting("m"), 0);
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_frees_its_place() {
        let share = FairShare::new(settings(1));
        let held = share.enter("m", "a", 1, || 1).await.expect("free").expect("a slot");
        let s = share.clone();
        let gone = tokio::spawn(async move { s.enter("m", "b", 1, || 1).await.map(|s| s.is_some()) });
        tokio::task::yield_now().await;
        assert_eq!(share.waiting("m"), 1);
        gone.abort();
        let _ = gone.await;
        assert_eq!(share.waiting("m"), 0);
        drop(held);
        assert!(share.enter("m", "c", 1, || 1).await.expect("free").is_some(), "the slot was not lost");
        assert!(FairShare::new(settings(0)).enter("m", "a", 1, || 1).await.expect("off").is_none());
        assert!(share.enter("m", "a", 0, || 1).await.expect("no node").is_none());
    }
}
