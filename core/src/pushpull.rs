//! First dissemination: periodic push-pull of records with a few random peers.
//!
//! Every gossip round a node sends each of `fanout` random peers a *digest* — the versions it
//! holds for its own record and a rotating window of its registry, as many as fit one datagram.
//! The receiver answers with the records it holds newer ([`Message::Records`]), asks for the
//! ones it lacks ([`Message::Want`]), which the first node then sends, and sends back a digest
//! of its own window ([`Message::DigestReply`]) so that the initiator — often an outbound-only
//! node that nobody else can reach — learns of nodes it did not know. Heartbeats travel inside
//! digests as liveness evidence; only changes of generation, state or content move whole
//! records. Changes to the local lifecycle are also pushed at once to `fanout` peers.
//!
//! This is simple and converges, but every node's heartbeat travels to every node, and a full
//! pass over the registry takes `n / window` rounds: it is meant for federations of tens to a few
//! hundred nodes. For larger ones [`Dissemination::Swim`](crate::swim_mode::Dissemination::Swim)
//! ([`crate::swim_mode`]) probes instead and spreads only changes; it keeps these exchanges as
//! its low-rate anti-entropy.

use crate::id::NodeId;
use crate::node::Node;
use crate::record::{Lifecycle, Reachability, Record, SharedRecord, Version};
use crate::wire::{Builder, DigestEntry, Message};

/// Records sent in answer to one digest or want, in datagrams; bounds reply amplification.
const MAX_REPLY_DATAGRAMS: usize = 2;

/// Dissemination state.
#[derive(Clone, Debug, Default)]
pub(crate) struct PushPull {
    /// Where the next digest window starts in the replica's slot order.
    cursor: usize,
}

impl Node {
    pub(crate) fn gossip_round(&mut self) {
        let peers = self.pick_peers(self.config.fanout);
        for peer in peers {
            self.send_digest(peer, false);
        }
        if self.replica.local().state == Lifecycle::Left {
            self.announce();
        }
    }

    /// Pushes the local record to `fanout` random peers.
    pub(crate) fn announce(&mut self) {
        let own = self.replica.local().clone();
        for peer in self.pick_peers(self.config.fanout) {
            self.send_records(peer, core::slice::from_ref(&own));
        }
    }

    pub(crate) fn handle_message(&mut self, from: NodeId, msg: Message) {
        match msg {
            Message::Digest(entries) => {
                self.on_digest(from, &entries);
                self.send_digest(from, true);
            }
            Message::DigestReply(entries) => self.on_digest(from, &entries),
            Message::Records(records) => {
                // Many records at once are a bulk transfer (a join, a long separation): news to
                // this replica, old news to the federation, so they are not gossiped on.
                let spread = records.len() <= crate::anti_entropy::BULK_RECORDS;
                for r in records {
                    self.absorb_news(r, spread);
                }
            }
            Message::Want(ids) => {
                // In Swim mode a want comes from an anti-entropy exchange, which asks for whole
                // buckets; a push-pull want asks for one digest window.
                let records: Vec<SharedRecord> =
                    ids.iter().filter_map(|id| self.replica.get(id).map(|s| s.record().clone())).collect();
                let cap =
                    if self.swim.is_some() { crate::anti_entropy::MAX_EXCHANGE_DATAGRAMS } else { MAX_REPLY_DATAGRAMS };
                self.send_records_up_to(from, &records, cap);
            }
            Message::Buckets { count, first, hashes } => self.on_buckets(from, count, first, &hashes),
            Message::BucketEntries { count, complete, entries } => {
                self.on_bucket_entries(from, count, &complete, &entries)
            }
            Message::Fetch(ids) => self.on_fetch(from, &ids),
            swim @ (Message::Ping { .. }
            | Message::PingReq { .. }
            | Message::Ack { .. }
            | Message::Nack { .. }
            | Message::Gossip(_)) => self.swim_message(from, swim),
        }
    }

    fn on_digest(&mut self, from: NodeId, entries: &[DigestEntry]) {
        // Heartbeat news is taken straight from the digest (liveness evidence, no record needed);
        // only changes of generation, state or content are exchanged as whole records.
        let mut newer: Vec<SharedRecord> = Vec::new();
        let mut want = Builder::<NodeId>::new(self.config.max_datagram);
        let mut flips = Vec::new();
        for e in entries {
            let Some(i) = self.replica.position(&e.id) else {
                want.push(&e.id);
                continue;
            };
            let slot = &self.replica.slots()[i];
            let r = slot.record();
            let v = &e.version;
            if (r.generation, r.state, slot.stamp()) == (v.generation, v.state, e.stamp) {
                if v.heartbeat > self.replica.heartbeat_at(i) && e.id != self.config.id {
                    let id = e.id;
                    if let Some(f) = self.replica.note_heartbeat(self.now, &id, v.generation, v.heartbeat) {
                        flips.push((id, f));
                    }
                    self.swim_heartbeat_heard(id, v.heartbeat);
                }
                continue;
            }
            let mine = r.version();
            let content_differs = (r.generation, r.state) == (v.generation, v.state);
            if content_differs || !v.covers(&mine) {
                newer.push(r.clone());
            }
            if content_differs || !mine.covers(v) {
                want.push(&e.id);
            }
        }
        for (id, routable) in flips {
            self.emit_routable(id, routable);
        }
        self.send_records(from, &newer);
        if !want.is_empty() {
            self.transmit(from, want.finish());
        }
    }

    pub(crate) fn send_digest(&mut self, to: NodeId, reply: bool) {
        let limit = self.config.max_datagram;
        let mut b = if reply { Builder::digest_reply(limit) } else { Builder::<DigestEntry>::new(limit) };
        let replica = &self.replica;
        let entry = |i: usize| {
            let slot = &replica.slots()[i];
            let r = slot.record();
            let version = Version { generation: r.generation, state: r.state, heartbeat: replica.heartbeat_at(i) };
            DigestEntry { id: r.id, version, stamp: slot.stamp() }
        };
        b.push(&entry(0));
        let n = replica.len();
        let mut taken = 0;
        // Slot 0 is the local record, already in.
        while taken + 1 < n {
            let i = 1 + (self.gossip.cursor + taken) % (n - 1);
            if !b.push(&entry(i)) {
                break;
            }
            taken += 1;
        }
        if n > 1 {
            self.gossip.cursor = (self.gossip.cursor + taken) % (n - 1);
        }
        self.transmit(to, b.finish());
    }

    fn send_records(&mut self, to: NodeId, records: &[SharedRecord]) {
        self.send_records_up_to(to, records, MAX_REPLY_DATAGRAMS);
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

    /// Alive by heartbeat (push-pull), or not DOWN (Swim mode, where nothing expires).
    fn looks_alive(&self, slot: &crate::replica::Slot) -> bool {
        slot.is_alive() && (self.swim.is_none() || slot.record().state < Lifecycle::Down)
    }

    /// Public nodes, and any node with a live connection to us.
    pub(crate) fn reachable(&self, r: &Record) -> bool {
        matches!(r.reach, Reachability::Public(_)) || self.connected.binary_search(&r.id).is_ok()
    }
}
