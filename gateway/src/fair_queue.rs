//! [`FairQueue`]: deficit round robin over flows (API keys) in front of a fixed number of slots
//! — a pure structure, no clock, no I/O; [`crate::fairness`] runs one per model.
//!
//! While a slot is free and nobody waits, a request takes one at once ([`FairQueue::try_start`]).
//! Otherwise it waits in its flow's own queue, bounded at `max_queued` (a full queue refuses it:
//! [`FairQueue::enqueue`] gives the waiter back). When a slot frees ([`FairQueue::release`]),
//! [`FairQueue::grant`] picks the next waiter by deficit round robin (Shreedhar and Varghese):
//! the flows with waiters take turns; each turn begins by adding `quantum` to the flow's
//! deficit, and the flow is served while its deficit covers its next request's cost. A flow
//! that starts waiting joins the end of the rotation, so it waits at most for the rest of the
//! current turn and one turn of each other busy flow. With costs in tokens, each
//! busy key gets an equal share of the tokens admitted, whatever its request sizes; one key
//! sending a thousand requests waits behind itself, not in front of everyone else. A flow whose
//! queue empties leaves the rotation and forgets its deficit, so idle keys bank nothing.
//!
//! The caller drives it: `grant` until it returns `None` after every `release` or capacity
//! change, and `release` a slot it granted to a waiter that has gone away.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// A request's ticket in its flow's queue, to take it out if it gives up.
pub type Ticket = u64;

/// One flow's waiters and deficit.
struct Flow<W> {
    queue: VecDeque<(Ticket, u64, W)>,
    deficit: u64,
}

/// Deficit round robin over flows `F` of waiters `W`; see the module docs.
pub struct FairQueue<F, W> {
    capacity: usize,
    in_use: usize,
    max_queued: usize,
    quantum: u64,
    flows: HashMap<F, Flow<W>>,
    /// Flows with waiters, in turn order; the front's turn is under way.
    rotation: VecDeque<F>,
    /// Whether the front flow has had its quantum for the turn under way.
    turn_begun: bool,
    next_ticket: Ticket,
}

impl<F: Clone + Eq + Hash, W> FairQueue<F, W> {
    /// `capacity` slots, at most `max_queued` waiters per flow, `quantum` cost units per turn.
    pub fn new(capacity: usize, max_queued: usize, quantum: u64) -> FairQueue<F, W> {
        FairQueue {
            capacity,
            in_use: 0,
            max_queued,
            quantum: quantum.max(1),
            flows: HashMap::new(),
            rotation: VecDeque::new(),
            turn_begun: false,
            next_ticket: 0,
        }
    }

    /// Changes the number of slots (nodes came or went); slots in use stay in use. Call
    /// [`FairQueue::grant`] after it.
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity;
    }

    /// Takes a slot if one is free and nobody waits for one.
    pub fn try_start(&mut self) -> bool {
        if self.in_use < self.capacity && self.rotation.is_empty() {
            self.in_use += 1;
            true
        } else {
            false
        }
    }

    /// Queues `waiter` of `flow`, costing `cost` (at least 1); gives it back if the flow's
    /// queue is full.
    pub fn enqueue(&mut self, flow: F, cost: u64, waiter: W) -> Result<Ticket, W> {
        let entry = self.flows.entry(flow.clone()).or_insert_with(|| Flow { queue: VecDeque::new(), deficit: 0 });
        if entry.queue.len() >= self.max_queued {
            return Err(waiter);
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        if entry.queue.is_empty() {
            self.rotation.push_back(flow);
        }
        entry.queue.push_back((ticket, cost.max(1), waiter));
        Ok(ticket)
    }

    /// Takes a waiter out of its queue (it gave up); false if it is not there (granted already).
    pub fn cancel(&mut self, flow: &F, ticket: Ticket) -> bool {
        let Some(entry) = self.flows.get_mut(flow) else { return false };
        let Some(at) = entry.queue.iter().position(|(t, _, _)| *t == ticket) else { return false };
        entry.queue.remove(at);
        if entry.queue.is_empty() {
            self.flows.remove(flow);
            if self.rotation.front() == Some(flow) {
                self.turn_begun = false;
            }
            self.rotation.retain(|f| f != flow);
        }
        true
    }

    /// A slot is free again: a request ended, or a waiter it was granted to had gone.
    pub fn release(&mut self) {
        self.in_use = self.in_use.saturating_sub(1);
    }

    /// If a slot is free and someone waits, gives the slot to the next waiter by deficit round
    /// robin and returns it.
    pub fn grant(&mut self) -> Option<W> {
        if self.in_use >= self.capacity || self.rotation.is_empty() {
            return None;
        }
        for _ in 0..2 {
            // One round: each flow's turn begins with a quantum more, and it is served while its
            // deficit covers its next request; then the next flow's turn begins.
            // (The front's turn may be under way: finishing it is one step more.)
            for _ in 0..self.rotation.len() + usize::from(self.turn_begun) {
                let flow = self.rotation.front()?.clone();
                let entry = self.flows.get_mut(&flow)?;
                if !self.turn_begun {
                    entry.deficit = entry.deficit.saturating_add(self.quantum);
                    self.turn_begun = true;
                }
                let cost = entry.queue.front().map_or(0, |w| w.1);
                if entry.deficit >= cost {
                    entry.deficit -= cost;
                    let (_, _, waiter) = entry.queue.pop_front()?;
                    if entry.queue.is_empty() {
                        self.flows.remove(&flow);
                        self.rotation.pop_front();
                        self.turn_begun = false;
                    }
                    self.in_use += 1;
                    return Some(waiter);
                }
                self.rotation.rotate_left(1);
                self.turn_begun = false;
            }
            // Nobody could be served in a whole round: run at once the rounds it takes until
            // someone can (less the one the next pass gives), so that a cost of many quanta is
            // not a loop per quantum.
            let quantum = self.quantum;
            let rounds = self
                .rotation
                .iter()
                .filter_map(|f| self.flows.get(f))
                .filter_map(|e| e.queue.front().map(|w| w.1.saturating_sub(e.deficit).div_ceil(quantum)))
                .min()?;
            let extra = rounds.saturating_sub(1).saturating_mul(quantum);
            for f in &self.rotation {
                if let Some(e) = self.flows.get_mut(f) {
                    e.deficit = e.deficit.saturating_add(extra);
                }
            }
        }
        None
    }

    /// Slots in use.
    pub fn in_use(&self) -> usize {
        self.in_use
    }

    /// Waiters of `flow`.
    pub fn queued(&self, flow: &F) -> usize {
        self.flows.get(flow).map_or(0, |f| f.queue.len())
    }

    /// Waiters of every flow.
    pub fn waiting(&self) -> usize {
        self.flows.values().map(|f| f.queue.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drains every grant of `q` (each taking a slot) into the flows they belonged to.
    fn grants(q: &mut FairQueue<&'static str, (&'static str, u32)>, n: usize) -> Vec<(&'static str, u32)> {
        let mut out = Vec::new();
        for _ in 0..n {
            q.release();
            match q.grant() {
                Some(w) => out.push(w),
                None => break,
            }
        }
        out
    }

    #[test]
    fn requests_run_at_once_while_slots_are_free() {
        let mut q: FairQueue<&str, ()> = FairQueue::new(2, 4, 10);
        assert!(q.try_start() && q.try_start());
        assert!(!q.try_start(), "both slots taken");
        assert_eq!(q.in_use(), 2);
        q.release();
        assert!(q.try_start());
        q.release();
        q.enqueue("a", 1, ()).expect("room");
        assert!(!q.try_start(), "a free slot goes to the waiter first");
        assert_eq!(q.grant(), Some(()));
        assert_eq!(q.in_use(), 2);
    }

    #[test]
    fn a_flooding_flow_does_not_starve_a_polite_one() {
        let mut q = FairQueue::new(1, 1000, 100);
        assert!(q.try_start());
        for i in 0..500 {
            q.enqueue("flood", 100, ("flood", i)).expect("room");
        }
        // The polite key arrives behind 500 of the flood's requests...
        q.enqueue("polite", 100, ("polite", 0)).expect("room");
        q.enqueue("polite", 100, ("polite", 1)).expect("room");
        let served = grants(&mut q, 6);
        // ...and is served in turn, not after them.
        let polite: Vec<usize> = served.iter().enumerate().filter(|(_, w)| w.0 == "polite").map(|(i, _)| i).collect();
        assert_eq!(polite.len(), 2, "{served:?}");
        assert!(polite[1] <= 4, "alternating with the flood: {served:?}");
        // FIFO order within a flow.
        let flood: Vec<u32> = served.iter().filter(|w| w.0 == "flood").map(|w| w.1).collect();
        assert!(flood.windows(2).all(|w| w[0] < w[1]), "{flood:?}");
    }

    #[test]
    fn a_newcomer_waits_for_the_rest_of_the_turn_under_way_only() {
        let mut q = FairQueue::new(1, 1000, 32);
        assert!(q.try_start());
        for i in 0..100 {
            q.enqueue("flood", 23, ("flood", i)).expect("room");
        }
        assert_eq!(grants(&mut q, 5).len(), 5, "the flood alone takes every slot");
        q.enqueue("polite", 23, ("polite", 0)).expect("room");
        let next: Vec<&str> = grants(&mut q, 2).iter().map(|w| w.0).collect();
        assert!(next.contains(&"polite"), "served within two grants: {next:?}");
    }

    #[test]
    fn shares_are_equal_in_cost_not_in_requests() {
        let mut q = FairQueue::new(1, 1000, 50);
        assert!(q.try_start());
        for i in 0..100 {
            q.enqueue("big", 400, ("big", i)).expect("room");
            q.enqueue("small", 100, ("small", i)).expect("room");
        }
        let served = grants(&mut q, 50);
        let cost =
            |flow: &str| served.iter().filter(|w| w.0 == flow).count() as u64 * if flow == "big" { 400 } else { 100 };
        let (big, small) = (cost("big"), cost("small"));
        assert!(big.abs_diff(small) <= 400, "tokens served: big {big}, small {small}");
    }

    #[test]
    fn full_queues_refuse_and_cancelled_waiters_leave() {
        let mut q = FairQueue::new(0, 2, 10);
        let t0 = q.enqueue("a", 5, 0).expect("room");
        q.enqueue("a", 5, 1).expect("room");
        assert_eq!(q.enqueue("a", 5, 2), Err(2), "a's queue is full");
        q.enqueue("b", 5, 3).expect("b has its own queue");
        assert!(q.cancel(&"a", t0));
        assert!(!q.cancel(&"a", t0), "already gone");
        assert_eq!((q.queued(&"a"), q.waiting()), (1, 2));
        assert_eq!(q.grant(), None, "no capacity");
        q.set_capacity(5);
        let mut got = vec![q.grant(), q.grant(), q.grant()];
        got.sort();
        assert_eq!(got, vec![None, Some(1), Some(3)]);
        assert_eq!((q.in_use(), q.waiting()), (2, 0));
        // Cancelling the last waiter of a flow leaves no turn behind.
        let t = q.enqueue("c", 1, 9).expect("room");
        assert!(q.cancel(&"c", t));
        assert!(q.try_start(), "nobody waits");
    }

    #[test]
    fn a_lone_flow_with_large_costs_is_served_without_spinning() {
        let mut q = FairQueue::new(1, 10, 1);
        q.enqueue("a", u64::MAX / 4, 7).expect("room");
        assert_eq!(q.grant(), Some(7));
    }
}
