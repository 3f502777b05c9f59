//! Choosing whom to send to, and sending whole records: what the membership's gossip rounds,
//! its lifecycle news and its anti-entropy exchanges share.
//!
//! Only public nodes and peers holding a connection to this node can be sent to; peers are
//! picked among the living (not DOWN, not suspected here), and among the rest only when too
//! few are alive, so that a node cut off by a partition keeps knocking.

use crate::id::NodeId;
use crate::node::Node;
use crate::record::{Lifecycle, Reachability, Record, SharedRecord};
use crate::wire::Builder;

/// Datagrams that carry a lifecycle announcement to one peer.
const ANNOUNCE_DATAGRAMS: usize = 2;

impl Node {
    /// Pushes the local record to `gossip_fanout` random peers at once: lifecycle news is urgent
    /// (gateways must stop routing to a draining node now, not when the gossip reaches them).
    pub(crate) fn announce(&mut self) {
        let own = self.replica.local().clone();
        for peer in self.pick_peers(self.config.membership.gossip_fanout) {
            self.send_records_up_to(peer, core::slice::from_ref(&own), ANNOUNCE_DATAGRAMS);
        }
    }

    /// Sends `records` in at most `datagrams` datagrams; the rest are dropped.
    pub(crate) fn send_records_up_to(&mut self, to: NodeId, records: &[SharedRecord], datagrams: usize) {
        let mut rest = records;
        for _ in 0..datagrams {
            if rest.is_empty() {
                return;
            }
            let mut b = Builder::<Record>::new(self.config.max_datagram);
            let mut used = 0;
            for r in rest {
                if !b.push(r) {
                    break;
                }
                used += 1;
            }
            if used == 0 {
                return; // cannot happen for valid records: any one fits a datagram
            }
            rest = &rest[used..];
            self.transmit(to, b.finish());
        }
    }

    /// Up to `k` distinct peers we can send to: public nodes and peers with a live connection,
    /// alive ones first. Dead ones are tried only when too few are alive, so a node cut off by a
    /// partition keeps knocking.
    pub(crate) fn pick_peers(&mut self, k: usize) -> Vec<NodeId> {
        use rand::Rng;
        let me = self.config.id;
        let mut picked: Vec<NodeId> = Vec::with_capacity(k);
        // Fast path for large registries: sample slots at random and keep alive, reachable ones.
        let n = self.replica.len();
        if n > 4 * k + 1 {
            for _ in 0..k * 4 {
                let slot = &self.replica.slots()[self.rng.random_range(1..n)];
                let r = slot.record();
                if self.looks_alive(slot) && r.state != Lifecycle::Left && self.reachable(r) && !picked.contains(&r.id)
                {
                    picked.push(r.id);
                    if picked.len() == k {
                        return picked;
                    }
                }
            }
        }
        // Small or mostly dead registry: scan.
        let mut alive: Vec<NodeId> = Vec::new();
        let mut other: Vec<NodeId> = Vec::new();
        for slot in self.replica.slots() {
            let r = slot.record();
            if r.id == me || r.state == Lifecycle::Left || picked.contains(&r.id) || !self.reachable(r) {
                continue;
            }
            if self.looks_alive(slot) {
                alive.push(r.id);
            } else {
                other.push(r.id);
            }
        }
        // Connected peers whose record we do not know yet (a freshly dialled anchor).
        for &p in &self.connected {
            if self.replica.get(&p).is_none() && !picked.contains(&p) {
                alive.push(p);
            }
        }
        for pool in [&mut alive, &mut other] {
            while picked.len() < k && !pool.is_empty() {
                let i = self.rng.random_range(0..pool.len());
                picked.push(pool.swap_remove(i));
            }
        }
        picked
    }

    /// Not DOWN, and not suspected here.
    fn looks_alive(&self, slot: &crate::replica::Slot) -> bool {
        slot.is_alive() && slot.record().state < Lifecycle::Down
    }

    /// Public nodes, and any node with a live connection to us.
    pub(crate) fn reachable(&self, r: &Record) -> bool {
        matches!(r.reach, Reachability::Public(_)) || self.connected.binary_search(&r.id).is_ok()
    }
}
