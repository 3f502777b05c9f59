//! The probe schedule and the probe messages: the randomized round-robin probe order, one
//! probe per protocol period (a direct ping, then ping-reqs through helpers), the answers to
//! others' pings and ping-reqs, the relays served for other probers, and what a failed probe
//! does to local health ([module docs](super), points 1, 2 and 5).

use super::{Action, Standing, Swim};
use crate::id::{Directory, NodeId};
use crate::time::Time;
use rand::Rng;

/// Ping-reqs served for others at once; more are ignored (bounds what a flood can make us hold).
pub(super) const MAX_RELAYS: usize = 64;
/// Below this many members ping-req helpers are picked by a full scan, above by sampling.
const SCAN_BELOW: usize = 64;

/// The probe of the current period.
#[derive(Clone, Debug)]
pub(super) struct Probe {
    pub(super) target: NodeId,
    pub(super) seq: u32,
    /// While the direct ping is outstanding: when to switch to indirect probing.
    pub(super) indirect_at: Option<Time>,
    vias: Vec<NodeId>,
    nacks: Vec<NodeId>,
}

/// A ping-req we serve for another prober.
#[derive(Clone, Copy, Debug)]
pub(super) struct Relay {
    seq: u32,
    pub(super) origin: NodeId,
    pub(super) origin_seq: u32,
    target: NodeId,
    pub(super) nack_at: Time,
}

impl Swim {
    /// A ping from `from`: answer it.
    pub(crate) fn on_ping(&mut self, now: Time, from: NodeId, seq: u32) {
        self.heard_from(now, from);
        self.actions.push_back(Action::SendAck { to: from, seq });
    }

    /// A ping-req from `from`: ping `target` on its behalf and forward the ack, or nack if none
    /// comes within 80% of the probe timeout (so the nack reaches the prober within its period).
    pub(crate) fn on_ping_req(&mut self, now: Time, from: NodeId, target: NodeId, seq: u32) {
        self.heard_from(now, from);
        if target == self.local {
            self.actions.push_back(Action::SendAck { to: from, seq });
            return;
        }
        if self.relays.len() >= MAX_RELAYS {
            return;
        }
        let relay_seq = self.take_seq();
        let nack_at = now + self.config.probe_timeout.saturating_mul(4) / 5;
        self.relays.push(Relay { seq: relay_seq, origin: from, origin_seq: seq, target, nack_at });
        self.actions.push_back(Action::SendPing { to: target, seq: relay_seq });
    }

    /// An ack from `from` for `seq`: the target of our probe answered (directly or through a
    /// helper), or the target of a ping-req we serve answered and we forward it.
    pub(crate) fn on_ack(&mut self, now: Time, from: NodeId, seq: u32) {
        self.heard_from(now, from);
        if let Some(i) = self.relays.iter().position(|r| r.seq == seq && r.target == from) {
            let r = self.relays.swap_remove(i);
            self.actions.push_back(Action::SendAck { to: r.origin, seq: r.origin_seq });
            return;
        }
        let answered =
            self.probe.as_ref().is_some_and(|p| p.seq == seq && (p.target == from || p.vias.contains(&from)));
        if answered {
            self.probe = None;
            self.health = self.health.saturating_sub(1);
        }
    }

    /// A nack from helper `from` for our probe `seq`: the target did not answer it, but our
    /// link to the helper works.
    pub(crate) fn on_nack(&mut self, now: Time, from: NodeId, seq: u32) {
        self.heard_from(now, from);
        if let Some(p) = self.probe.as_mut() {
            if p.seq == seq && p.vias.contains(&from) && !p.nacks.contains(&from) {
                p.nacks.push(from);
            }
        }
    }

    /// Puts member number `n` at a random position of the probe order in `O(1)` by swaps, as
    /// memberlist does: ahead of the cursor it is probed in this pass, behind it in the next.
    /// The member it displaces stays on its side of the cursor, so nobody is probed twice in a
    /// pass. (Shifting the order instead cost `O(n)` a join, `O(n²)` for a node joining a
    /// federation of `n`.)
    pub(super) fn join_order(&mut self, n: u32) {
        let at = self.rng.random_range(0..=self.order.len());
        crate::reserve_one(&mut self.order);
        self.order.push(n);
        let last = self.order.len() - 1;
        if at < self.cursor {
            // The first unprobed member goes to the end, the displaced (probed) one takes its
            // place, and the cursor moves past it.
            self.order.swap(self.cursor, last);
            self.order.swap(at, self.cursor);
            self.cursor += 1;
        } else {
            self.order.swap(at, last);
        }
    }

    /// Takes member number `n` out of the probe order by swaps, keeping every other member on
    /// its side of the cursor. (Finding it is still a scan.)
    pub(super) fn leave_order(&mut self, n: u32) {
        let Some(at) = self.order.iter().position(|&m| m == n) else { return };
        if at < self.cursor {
            // The last probed member takes its place; the last member fills the gap.
            self.cursor -= 1;
            self.order.swap(at, self.cursor);
            self.order.swap_remove(self.cursor);
        } else {
            self.order.swap_remove(at);
        }
    }

    /// Judges the last period's probe and starts the next one.
    pub(super) fn next_period(&mut self, dir: &impl Directory) {
        if let Some(p) = self.probe.take() {
            self.probe_failed(dir, p);
        }
        let (period, timeout) = self.scaled_timing();
        self.next_probe = self.now + period;
        if self.cursor >= self.order.len() {
            // A new pass: shuffle (Fisher-Yates) so that the order is unpredictable.
            for i in (1..self.order.len()).rev() {
                let j = self.rng.random_range(0..=i);
                self.order.swap(i, j);
            }
            self.cursor = 0;
            self.passes += 1;
        }
        let Some(&n) = self.order.get(self.cursor) else { return };
        let target = dir.id(n);
        self.cursor += 1;
        let seq = self.take_seq();
        self.probe =
            Some(Probe { target, seq, indirect_at: Some(self.now + timeout), vias: Vec::new(), nacks: Vec::new() });
        self.actions.push_back(Action::SendPing { to: target, seq });
    }

    pub(super) fn probe_indirectly(&mut self, dir: &impl Directory) {
        let Some(p) = self.probe.as_ref() else { return };
        let (target, seq) = (p.target, p.seq);
        let vias = self.pick_helpers(dir, target, self.config.indirect_probes);
        for &via in &vias {
            self.actions.push_back(Action::SendPingReq { via, target, seq });
        }
        if let Some(p) = self.probe.as_mut() {
            p.indirect_at = None;
            p.vias = vias;
        }
    }

    /// Up to `k` distinct members, not `target`, probeable and not suspected.
    fn pick_helpers(&mut self, dir: &impl Directory, target: NodeId, k: usize) -> Vec<NodeId> {
        let members = &self.members;
        let healthy = |n: u32| members.at(n).standing == Standing::Alive && dir.id(n) != target;
        let mut picked = Vec::with_capacity(k);
        if self.order.len() < SCAN_BELOW {
            let mut pool: Vec<u32> = self.order.iter().copied().filter(|&n| healthy(n)).collect();
            while picked.len() < k && !pool.is_empty() {
                let i = self.rng.random_range(0..pool.len());
                picked.push(dir.id(pool.swap_remove(i)));
            }
            return picked;
        }
        for _ in 0..k * 4 {
            let n = self.order[self.rng.random_range(0..self.order.len())];
            let id = dir.id(n);
            if healthy(n) && !picked.contains(&id) {
                picked.push(id);
                if picked.len() == k {
                    break;
                }
            }
        }
        picked
    }

    fn probe_failed(&mut self, dir: &impl Directory, p: Probe) {
        if self.leases.contains_key(&p.target) {
            // Probed for the updates its pings carry, judged by the lease: one lost datagram
            // is no failure while the lease's pings (several before it runs out) go on.
            return;
        }
        // Lifeguard: with helpers, every nack we did not get is a sign that our own links or our
        // own processing are slow; without helpers, only the failed probe itself counts.
        let missed = if p.vias.is_empty() { 1 } else { p.vias.len().saturating_sub(p.nacks.len()) };
        self.worse_health(missed);
        self.suspect_locally(dir, p.target);
    }
}
