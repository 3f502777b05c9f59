//! Anti-entropy by hashed buckets: what repairs whatever piggybacking missed, heals partitions
//! and brings a joining node the registry.
//!
//! The registry is split into buckets by node id ([`bucket_of`]); each replica keeps, per
//! bucket, the XOR of a hash of every record's version and content ([`Slot::sync_hash`]), updated on
//! every merge. An exchange between an initiator A and a peer B:
//!
//! 1. A sends its bucket hashes ([`Message::Buckets`]; `count` buckets, a power of two chosen
//!    from the registry's size so that a bucket holds about [`RECORDS_PER_BUCKET`] records, at
//!    most 256 hashes a datagram);
//! 2. B compares them with its own and answers the buckets that differ with the (id, hash) of
//!    each record it holds there ([`Message::BucketEntries`], at most [`MAX_EXCHANGE_DATAGRAMS`]
//!    datagrams);
//! 3. A sends B the records it holds differently or B lacks ([`Message::Records`]) and asks for
//!    the ones it lacks or holds differently ([`Message::Want`]); both merge what they get,
//!    so whichever side was behind catches up.
//!
//! Equal registries cost one datagram of hashes per 256 buckets and nothing else, at any size.
//! When an exchange found many differences (a joining node, a healed partition) the initiator
//! runs the next one with the same peer after [`FOLLOW_UP`] instead of a full interval, so a
//! registry of any size streams over in bounded datagrams until the hashes agree. A node
//! answers at most [`MAX_SERVED_PER_SECOND`] exchanges a second and ignores the rest, which
//! caps the work a crowd of joiners can put on one anchor.
//!
//! Both sides hash with the same function ([`Slot::sync_hash`]), fixed for a given wire version.
//!
//! Peers are picked among the living, so after a partition that outlasted the
//! suspicion timeout each side holds the other DOWN and neither would ever pick the other.
//! As Serf reconnects to failed members, every [`RECONNECT_INTERVAL`] a node also runs an
//! exchange with a random member held DOWN that it can reach: if that one is alive, the exchange brings it
//! its DOWN record and it refutes with a new generation, which the next exchange with it (the
//! differences make it a follow-up) brings back; it tells this node of its own DOWN record the
//! same way. From there the sides pick each other again.
//!
//! LEFT records are tombstones keyed by (node, generation), and DOWN records age the same way:
//! each anti-entropy round first ages them ([`crate::replica::Replica::collect_tombstones`]);
//! half-way through their lifetime they leave the hashes and entries (nobody advertises them, so
//! they do not come back through an exchange, and no reconnect goes to them), at the end they
//! are deleted and their generation joins a GC watermark that refuses a stale peer's copy.

use crate::id::NodeId;
use crate::node::Node;
#[cfg(doc)]
use crate::replica::Slot;
use crate::replica::{bucket_of, BUCKETS};
use crate::time::Time;
use crate::timer::Timer;
#[cfg(doc)]
use crate::wire::Message;
use crate::wire::{encode_buckets, BucketEntry, Builder, EntriesBuilder, MAX_BUCKET_HASHES};
use core::time::Duration;
use std::collections::BTreeMap;

/// Records per bucket the bucket count aims at.
pub(crate) const RECORDS_PER_BUCKET: usize = 16;
/// Most datagrams of entries, records or wants one side sends in one exchange.
pub(crate) const MAX_EXCHANGE_DATAGRAMS: usize = 8;
/// Delay before the next exchange with the same peer when the last one found differences.
pub(crate) const FOLLOW_UP: Duration = Duration::from_millis(250);
/// A [`crate::wire::Message::Records`] of more records than this is a bulk transfer, whose
/// news the membership does not piggyback on (see [`crate::membership`]).
pub(crate) const BULK_RECORDS: usize = 3;
/// Records found differing in one exchange above which the next exchange with the same peer
/// follows after [`FOLLOW_UP`].
pub(crate) const FOLLOW_UP_RECORDS: usize = 16;
/// Exchanges a node answers per second; more are ignored.
pub(crate) const MAX_SERVED_PER_SECOND: u32 = 8;
/// How often a node also runs an exchange with a random member it holds DOWN and
/// can reach, besides its usual one (see the module docs).
pub(crate) const RECONNECT_INTERVAL: Duration = Duration::from_secs(10);

/// Bucket count for a registry of `n` records exchanged in datagrams of `max_datagram` bytes: a
/// power of two, at most [`BUCKETS`], with about [`RECORDS_PER_BUCKET`] records a bucket, fewer
/// if need be so that a bucket's entries fill at most half a datagram.
pub(crate) fn bucket_count(n: usize, max_datagram: usize) -> usize {
    let per_datagram = EntriesBuilder::entries_per_datagram(max_datagram);
    let per_bucket = RECORDS_PER_BUCKET.min(per_datagram / 2).max(1);
    (n / per_bucket).clamp(1, BUCKETS).next_power_of_two().min(BUCKETS)
}

/// An exchange's state at one node.
#[derive(Clone, Debug, Default)]
pub(crate) struct AntiEntropy {
    /// The peer of the next exchange, when the last one with it found differences.
    follow_up: Option<NodeId>,
    /// Start of the current one-second window of answered exchanges, and how many.
    window: Option<Time>,
    served: u32,
    /// When the next exchange with a member held DOWN is due.
    next_reconnect: Time,
    /// When the next regular round is due (see [`Node::sync_round`]); none before the first.
    next_regular: Option<Time>,
}

impl Node {
    /// Starts an exchange with `peer`: sends it this replica's bucket hashes.
    pub(crate) fn start_sync(&mut self, peer: NodeId) {
        self.stats.syncs_started += 1;
        let count = bucket_count(self.replica.len(), self.config.max_datagram);
        let hashes = self.replica.bucket_hashes(count);
        for (i, chunk) in hashes.chunks(MAX_BUCKET_HASHES).enumerate() {
            let first = (i * MAX_BUCKET_HASHES) as u16;
            self.transmit(peer, encode_buckets(count as u16, first, chunk));
        }
    }

    /// The anti-entropy timer fired, for a regular round or for a follow-up. A regular round
    /// ages tombstones, then runs an exchange with the follow-up peer or a random live one,
    /// and every [`RECONNECT_INTERVAL`], one with a member held DOWN; a follow-up runs only
    /// the exchange with its peer.
    ///
    /// A node's first regular round comes early (within ten gossip rounds of its start, so
    /// that a joining node has the registry soon); the one after it at a random point between
    /// half and one and a half intervals later, and from there every interval on the dot,
    /// follow-ups in between moving nothing. Nodes started together (a formed federation, a
    /// job array) thus spread their exchanges over the whole interval, and the follow-ups that
    /// every node runs after a healed cut do not line their rounds up again: either made every
    /// node run its exchange, which after a heal carries differences, in the same second of
    /// every interval.
    pub(crate) fn sync_round(&mut self, interval: Duration, tombstone_ttl: Duration) {
        let regular = self.sync.next_regular.map_or(true, |at| self.now >= at);
        if regular {
            let detector = &mut self.membership.detector;
            self.replica.collect_tombstones(self.now, tombstone_ttl, |from, to| detector.renumber(from, to));
        }
        let peer = self.sync.follow_up.take().or_else(|| if regular { self.pick_peers(1).pop() } else { None });
        if let Some(peer) = peer {
            self.start_sync(peer);
        }
        if regular && self.now >= self.sync.next_reconnect {
            self.sync.next_reconnect = self.now + RECONNECT_INTERVAL;
            if let Some(down) = self.down_peer().filter(|d| Some(*d) != peer) {
                self.start_sync(down);
            }
        }
        let next = match self.sync.next_regular {
            Some(at) if !regular => at,
            Some(at) => (at + interval).max(self.now + interval / 2),
            None => self.now + interval / 2 + self.jitter(interval),
        };
        self.sync.next_regular = Some(next);
        self.timers.set(Timer::AntiEntropy, next);
    }

    /// A random member held DOWN in its current generation that this node can reach.
    fn down_peer(&mut self) -> Option<NodeId> {
        use rand::Rng;
        let down: Vec<NodeId> = self
            .replica
            .down_ids()
            .iter()
            .filter(|id| self.replica.get(id).is_some_and(|s| !s.is_retired() && self.reachable(s.record())))
            .copied()
            .collect();
        if down.is_empty() {
            return None;
        }
        Some(down[self.rng.random_range(0..down.len())])
    }

    /// Step 2: a peer's bucket hashes; answer those that differ with our entries.
    pub(crate) fn on_buckets(&mut self, from: NodeId, count: u16, first: u16, hashes: &[[u8; 4]]) {
        if !self.may_serve() {
            return;
        }
        let count_usize = usize::from(count);
        let mine = self.replica.bucket_hashes(count_usize);
        let differing: Vec<u16> = hashes
            .iter()
            .enumerate()
            .map(|(i, h)| (usize::from(first) + i, u32::from_le_bytes(*h)))
            .filter(|&(b, h)| mine.get(b).is_some_and(|m| *m != h))
            .map(|(b, _)| b as u16)
            .collect();
        if differing.is_empty() {
            return;
        }
        self.stats.syncs_answered += 1;
        let by_bucket = self.entries_of(count_usize, &differing);
        let limit = self.config.max_datagram;
        let mut sent = 0;
        let mut b = EntriesBuilder::new(limit, count);
        for bucket in differing {
            let entries = by_bucket.get(&bucket).map_or(&[][..], Vec::as_slice);
            if b.push_bucket(bucket, entries) {
                continue;
            }
            if !b.is_empty() {
                self.transmit(from, core::mem::replace(&mut b, EntriesBuilder::new(limit, count)).finish());
                sent += 1;
                if sent == MAX_EXCHANGE_DATAGRAMS {
                    return;
                }
                if b.push_bucket(bucket, entries) {
                    continue;
                }
            }
            // A bucket too big for a datagram: send what fits from a random place in it (so
            // that repeated exchanges cover all of it); the peer cannot infer absences.
            let start = {
                use rand::Rng;
                self.rng.random_range(0..entries.len().max(1))
            };
            let rotated: Vec<BucketEntry> = entries[start..].iter().chain(&entries[..start]).copied().collect();
            b.push_partial(&rotated);
            self.transmit(from, core::mem::replace(&mut b, EntriesBuilder::new(limit, count)).finish());
            sent += 1;
            if sent == MAX_EXCHANGE_DATAGRAMS {
                return;
            }
        }
        if !b.is_empty() {
            self.transmit(from, b.finish());
        }
    }

    /// Step 3: a peer's entries of differing buckets; send what it lacks, ask for what we lack.
    pub(crate) fn on_bucket_entries(&mut self, from: NodeId, count: u16, complete: &[u16], entries: &[BucketEntry]) {
        let count = usize::from(count);
        let theirs: hashbrown::HashMap<NodeId, u32> =
            entries.iter().map(|e| (e.id, u32::from_le_bytes(e.hash))).collect();
        let limit = self.config.max_datagram;
        // Ask for what we lack or hold differently.
        let mut wants = Vec::new();
        let mut want = Builder::<NodeId>::new(limit);
        let mut want_count = 0;
        for e in entries {
            let differs = self.replica.get(&e.id).map_or(true, |s| s.sync_hash() != u32::from_le_bytes(e.hash));
            if differs && e.id != self.config.id {
                want_count += 1;
                if !want.push(&e.id) {
                    wants.push(core::mem::replace(&mut want, Builder::new(limit)).finish());
                    let _ = want.push(&e.id);
                }
            }
        }
        if !want.is_empty() {
            wants.push(want.finish());
        }
        // Send what it lacks or holds differently, in the buckets it listed whole, and the
        // records it listed that we hold differently.
        // Only the slots of the complete buckets and of the listed ids can be sent; taken in
        // slot order.
        let mut candidates = self.replica.slots_in_buckets(count, complete);
        candidates.extend(entries.iter().filter_map(|e| self.replica.slot_number(&e.id)));
        candidates.sort_unstable();
        candidates.dedup();
        let slots = self.replica.slots();
        let mut records = Vec::new();
        for slot in candidates.iter().map(|&i| &slots[i as usize]).filter(|s| !s.is_retired()) {
            let r = slot.record();
            let listed = theirs.get(&r.id);
            let send = match listed {
                Some(h) => *h != slot.sync_hash(),
                // Not listed, so it came from a bucket the peer listed whole: it lacks it.
                None => true,
            };
            if send {
                records.push(r.clone());
            }
        }
        let differing = want_count + records.len();
        self.stats.syncs_records += differing as u64;
        for datagram in wants.into_iter().take(MAX_EXCHANGE_DATAGRAMS) {
            self.transmit(from, datagram);
        }
        self.send_records_up_to(from, &records, MAX_EXCHANGE_DATAGRAMS);
        if differing > FOLLOW_UP_RECORDS && self.sync.follow_up.is_none() {
            // A bulk difference (a join, a healed partition): keep going with this peer soon.
            // A few records differing is the normal state of a federation with changes in
            // flight; the next exchange at the usual interval will do.
            self.sync.follow_up = Some(from);
            let soon = self.now + FOLLOW_UP;
            if self.timers.get(Timer::AntiEntropy).map_or(true, |at| at > soon) {
                self.timers.set(Timer::AntiEntropy, soon);
            }
        }
    }

    /// Our (id, hash) entries of the given buckets, grouped by bucket, in slot order.
    fn entries_of(&self, count: usize, buckets: &[u16]) -> BTreeMap<u16, Vec<BucketEntry>> {
        let slots = self.replica.slots();
        let mut out: BTreeMap<u16, Vec<BucketEntry>> = BTreeMap::new();
        for i in self.replica.slots_in_buckets(count, buckets) {
            let slot = &slots[i as usize];
            if slot.is_retired() {
                continue;
            }
            let r = slot.record();
            let b = bucket_of(&r.id, count) as u16;
            out.entry(b).or_default().push(BucketEntry { id: r.id, hash: slot.sync_hash().to_le_bytes() });
        }
        out
    }

    /// Counts one answered exchange; false when this second's allowance is spent.
    fn may_serve(&mut self) -> bool {
        let now = self.now;
        match self.sync.window {
            Some(start) if now < start + Duration::from_secs(1) => {
                if self.sync.served >= MAX_SERVED_PER_SECOND {
                    return false;
                }
                self.sync.served += 1;
            }
            _ => {
                self.sync.window = Some(now);
                self.sync.served = 1;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_counts_are_powers_of_two_of_about_sixteen_records_or_half_a_datagram() {
        let full = crate::wire::MAX_DATAGRAM;
        assert_eq!(bucket_count(1, full), 1);
        assert_eq!(bucket_count(100, full), 8);
        assert_eq!(bucket_count(1_000, full), 64);
        assert_eq!(bucket_count(10_000, full), 1024);
        assert_eq!(bucket_count(1_000_000, full), BUCKETS);
        // A small datagram takes 13 entries: buckets of 6.
        assert_eq!(bucket_count(40, 300), 8);
        for n in 0..5_000 {
            assert!(bucket_count(n, full).is_power_of_two() && bucket_count(n, 256).is_power_of_two());
        }
    }

    #[test]
    fn nodes_started_together_spread_their_rounds_and_follow_ups_keep_them() {
        use crate::harness::Harness;
        let mut h = Harness::new(7);
        let ids = h.public_star(80, |_| {});
        // Every joiner's first exchange brings it the registry in follow-ups.
        h.run_for(Duration::from_secs(12));
        let interval = crate::membership::MembershipSettings::default().anti_entropy_interval.as_micros() as u64;
        let phase = |h: &Harness, id: NodeId| h.node(id).sync.next_regular.expect("ran a round").as_micros() % interval;
        let phases: Vec<u64> = ids.iter().map(|&id| phase(&h, id)).collect();
        let mut per_second = [0usize; 10];
        for p in &phases {
            per_second[(p * 10 / interval) as usize] += 1;
        }
        assert!(per_second.iter().all(|&n| n <= ids.len() / 4), "rounds spread over the interval: {per_second:?}");
        // A cut long enough for each side to hold the other DOWN, and its heal: the exchanges
        // across it find the other side's records and run in follow-ups.
        for &a in &ids[..40] {
            for &b in &ids[40..] {
                h.cut(a, b);
            }
        }
        h.run_for(Duration::from_secs(40));
        h.heal();
        let mut followed_up = 0;
        for _ in 0..300 {
            h.run_for(Duration::from_millis(100));
            followed_up += ids.iter().filter(|&&id| h.node(id).sync.follow_up.is_some()).count();
        }
        assert!(followed_up > 0, "the heal ran follow-ups");
        let later: Vec<u64> = ids.iter().map(|&id| phase(&h, id)).collect();
        assert_eq!(phases, later, "follow-ups moved no node's rounds");
    }
}
