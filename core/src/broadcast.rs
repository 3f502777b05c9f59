//! A bounded queue of updates waiting to be piggybacked on datagrams, least-sent or newest first.
//!
//! At 10,000 nodes a change cannot be pushed to everyone; it rides on traffic the node sends
//! anyway (probes, acks, gossip) and every node that learns it passes it on a few times. This
//! queue decides what goes into the bytes left over in each datagram:
//!
//! - one item per subject [`NodeId`] ([`Update::key`]): a newer update for the same node replaces
//!   the queued one and starts its count afresh; one the queued item already covers
//!   ([`Update::covers`]) is dropped, so nothing superseded is ever sent;
//! - [`BroadcastQueue::fill`] hands out items in the queue's [`Order`], taking each item that
//!   still fits the remaining bytes: fewest transmissions first, newest first among equals
//!   (suspicions), or newest first (records). Least-sent first gives every item its first send
//!   before any its second, but when a backlog builds up (a healed cut queues a thousand records
//!   at every node) a new change then goes out once at once and waits for the rest of its sends
//!   behind the backlog; its epidemic misses a few nodes, which hear of it only through
//!   anti-entropy, 10 to 20 s later. Newest first sends a new change to its limit as fast as in
//!   a quiet federation and leaves the backlog to drain behind it;
//! - each item is sent at most `ceil(lambda · log2(n + 1))` times ([`BroadcastQueue::transmit_limit`];
//!   `lambda · ceil(log10(n + 1))`, memberlist's limit, with [`BroadcastQueue::per_decade`])
//!   for a cluster of `n` nodes, the bound under which epidemic dissemination reaches every node
//!   with high probability, and is then forgotten;
//! - at most `capacity` items are held; when full, the last in the send order makes room (the
//!   most-sent, or the oldest: it has had the most chances to spread already).
//! - an item may take fewer bytes after its first sends ([`Update::encoded_len`] is given its
//!   send count): a [`RecordUpdate`] is announced by version once pushed whole a few times.
//!
//! Every operation is `O(log m)` for `m` queued items: each item is stored once in a slab, the
//! send order is a B-tree map from `(sends, newest first)`, packed into one `u64`, to slab
//! numbers, and a hash index of slab numbers finds an item by key (reading the key from the
//! slab). A queue that empties gives its room back. After a heal at 10,000 nodes every node's
//! queue holds thousands of items, so an item's bytes are the simulator's memory: a record
//! item is two shared handles and a few counters (40 bytes in the slab). The logarithm is
//! computed in fixed point, so the limit is the same on every platform and replays bit for bit.
//!
//! # How the node drives it
//!
//! When the node learns something others should hear (a record changed through a merge, a node
//! it confirmed dead, a suspicion), it pushes the update with [`BroadcastQueue::push`]. Whenever
//! it builds a datagram (a probe, an ack, a gossip message) it encodes the message itself first,
//! then calls [`BroadcastQueue::fill`] with the bytes still free below `max_datagram` (less the
//! few bytes of the piggyback section's item count) and the current cluster size, and appends the
//! encoded items it is handed. [`RecordUpdate`] carries a record together with its encoding for
//! exactly this.

use crate::id::{IdIndex, NodeId};
use crate::intern::Encoding;
use crate::record::SharedRecord;
use std::collections::BTreeMap;

/// Something the [`BroadcastQueue`] can carry.
pub(crate) trait Update {
    /// The node the update is about; the queue holds at most one update per key.
    fn key(&self) -> NodeId;
    /// True if `self` already carries everything `other` (same key) does, so `other` is
    /// redundant. Must be reflexive: an update covers an equal one.
    fn covers(&self, other: &Self) -> bool;
    /// Bytes the update takes in a datagram when it has been handed out `sends` times before
    /// (an update may travel in a shorter form once it has spread a little).
    fn encoded_len(&self, sends: u32) -> usize;
}

/// A record with its postcard encoding, ready to be appended to a datagram.
///
/// Pushed whole for its first `eager` sends, then announced by version only
/// ([`crate::wire::Piggyback::Have`]): by then most receivers hold it, and the few that do
/// not fetch it from whoever announced it (Plumtree's eager and lazy push).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RecordUpdate {
    record: SharedRecord,
    encoded: Encoding,
    eager: u32,
    announce_len: u8,
}

impl RecordUpdate {
    #[cfg(test)]
    /// Encodes `record` once for all the datagrams it will ride on, always sent whole.
    pub(crate) fn new(record: SharedRecord) -> Result<RecordUpdate, postcard::Error> {
        let encoded = Encoding::from(postcard::to_allocvec(&*record)?);
        Ok(RecordUpdate::with_encoding(record, encoded, u32::MAX))
    }

    /// `record` with the bytes it takes in a datagram already made, when the datagram frames
    /// it differently from a bare record (the membership's piggyback items carry a variant index),
    /// sent whole `eager` times and announced after that.
    pub(crate) fn with_encoding(record: SharedRecord, encoded: Encoding, eager: u32) -> RecordUpdate {
        let len = postcard::experimental::serialized_size(&crate::wire::Piggyback::Have {
            id: record.id,
            version: record.version(),
        });
        // At most 38 bytes: a tag, an id, two varints and a state.
        let announce_len = u8::try_from(len.unwrap_or(usize::MAX)).unwrap_or(u8::MAX);
        RecordUpdate { record, encoded, eager, announce_len }
    }

    /// True if the update goes whole after `sends` sends, false if it is only announced.
    pub(crate) fn is_eager(&self, sends: u32) -> bool {
        sends < self.eager
    }

    /// The announcement of the record: its id and version.
    pub(crate) fn announcement(&self) -> crate::wire::Piggyback {
        crate::wire::Piggyback::Have { id: self.record.id, version: self.record.version() }
    }

    #[cfg(test)]
    /// The record.
    pub(crate) fn record(&self) -> &SharedRecord {
        &self.record
    }

    /// The bytes the record takes on the wire.
    pub(crate) fn encoded(&self) -> &[u8] {
        &self.encoded
    }
}

impl Update for RecordUpdate {
    fn key(&self) -> NodeId {
        self.record.id
    }

    fn covers(&self, other: &Self) -> bool {
        self.record.dominates(&other.record)
    }

    fn encoded_len(&self, sends: u32) -> usize {
        if self.is_eager(sends) {
            self.encoded.len()
        } else {
            usize::from(self.announce_len)
        }
    }
}

/// What [`BroadcastQueue::push`] did with an update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Queued {
    /// Nothing was queued for its key; it is now.
    Added,
    /// It replaced an older update for the same key, which will not be sent again.
    Replaced,
    /// The queued update for its key already covers it; the queue is unchanged.
    Stale,
}

#[derive(Clone, Debug)]
struct Entry<T> {
    item: T,
    sends: u32,
    /// Order of arrival among the queued items (numbered afresh whenever the queue empties).
    seq: u32,
}

impl<T> Entry<T> {
    fn rank(&self, order: Order) -> Rank {
        rank(order, self.sends, self.seq)
    }
}

/// The order in which a queue hands out its items.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// Fewest sends first, newest first among equals: every item gets its first send before
    /// any gets its second.
    LeastSent,
    /// Newest first: an item goes out in every datagram until its limit, whatever the backlog.
    Newest,
}

/// Most sends counted per item; transmit limits are capped to it.
const MAX_SENDS: u32 = 255;

/// Position in the send order. Sequence numbers are unique among queued items, so a rank
/// names one item. From the high bits: the send count again for [`Order::LeastSent`] (zero for
/// [`Order::Newest`]), the sequence number inverted (newest first), then the send count,
/// so that ranks sort in send order and the low byte gives the count back.
type Rank = u64;

fn rank(order: Order, sends: u32, seq: u32) -> Rank {
    let sends = sends.min(MAX_SENDS);
    let first = if order == Order::LeastSent { sends } else { 0 };
    (u64::from(first) << 40) | (u64::from(u32::MAX - seq) << 8) | u64::from(sends)
}

/// The send count of an item at `rank`.
fn sends_at(rank: Rank) -> u32 {
    (rank & 0xFF) as u32
}

/// Items [`BroadcastQueue::fill`] makes room for at once: an announcement takes at least 20
/// bytes, so a 1,100-byte datagram holds at most about fifty.
const PICKS_AT_ONCE: usize = 64;

/// After this many queued items in a row did not fit, [`BroadcastQueue::fill`] stops looking:
/// the datagram is as good as full and scanning the whole queue would cost `O(m)`.
const MAX_SKIPS: usize = 16;

/// Bounded queue of updates to piggyback, least-sent or newest first; see the [module docs](self).
///
/// Every node of a large federation holds one, full during a join storm, so the items are kept
/// once, in a slab, and both the key index and the send order point into it with slab numbers.
#[derive(Clone, Debug)]
pub(crate) struct BroadcastQueue<T> {
    lambda: f64,
    /// Count sends per decade of cluster size (`lambda · ceil(log10(n + 1))`, memberlist's
    /// limit) instead of per doubling.
    decades: bool,
    capacity: usize,
    order_by: Order,
    next_seq: u32,
    /// The queued items; `None` where `free` lists a hole.
    slab: Vec<Option<Entry<T>>>,
    free: Vec<u32>,
    /// Slab numbers by the key of their item (4 bytes an item: the key is read from the slab).
    index: IdIndex,
    order: BTreeMap<Rank, u32>,
    evicted: u64,
}

impl<T: Update> BroadcastQueue<T> {
    /// Heap bytes of the queue's tables ([`crate::heap`]); what the items point to (records,
    /// encodings) is not counted.
    pub(crate) fn heap_bytes(&self) -> u64 {
        use crate::heap::{array, btree};
        array::<Option<Entry<T>>>(self.slab.capacity())
            + array::<u32>(self.free.capacity())
            + self.index.heap_bytes()
            + btree::<(Rank, u32)>(self.order.len())
    }

    /// An empty queue: each item sent at most `ceil(lambda · log2(n + 1))` times (at least once;
    /// a negative or non-finite `lambda` counts as zero), at most `capacity` items (at least one).
    pub(crate) fn new(lambda: f64, capacity: usize) -> BroadcastQueue<T> {
        BroadcastQueue {
            lambda: if lambda.is_finite() { lambda.max(0.0) } else { 0.0 },
            decades: false,
            capacity: capacity.max(1),
            order_by: Order::LeastSent,
            next_seq: 0,
            slab: Vec::new(),
            free: Vec::new(),
            index: IdIndex::default(),
            order: BTreeMap::new(),
            evicted: 0,
        }
    }

    /// An empty queue whose items are each sent at most `lambda · ceil(log10(n + 1))` times
    /// (memberlist's retransmit limit): fewer sends than [`BroadcastQueue::new`]'s, for large
    /// items whose spreading is backed by anti-entropy.
    pub(crate) fn per_decade(lambda: f64, capacity: usize) -> BroadcastQueue<T> {
        BroadcastQueue { decades: true, ..BroadcastQueue::new(lambda, capacity) }
    }

    /// The same queue, handing out its items in `order` ([`Order::LeastSent`] unless set).
    pub(crate) fn in_order(self, order: Order) -> BroadcastQueue<T> {
        debug_assert!(self.index.len() == 0, "set before anything is queued");
        BroadcastQueue { order_by: order, ..self }
    }

    /// Drops every queued item and gives back the room they took.
    pub(crate) fn clear(&mut self) {
        let (evicted, decades, order_by) = (self.evicted, self.decades, self.order_by);
        *self = BroadcastQueue { decades, order_by, evicted, ..BroadcastQueue::new(self.lambda, self.capacity) };
    }

    /// How many times one item is sent in a cluster of `cluster_size` nodes (at least 1).
    pub(crate) fn transmit_limit(&self, cluster_size: usize) -> u32 {
        let n = u64::try_from(cluster_size).unwrap_or(u64::MAX).saturating_add(1);
        let log = if self.decades {
            // ceil(log10 n) is the number of decimal digits of n - 1, exact for every n.
            f64::from((n - 1).checked_ilog10().map_or(0, |d| d + 1))
        } else {
            log2_fixed(n) as f64 / LOG2_ONE as f64
        };
        let limit = (self.lambda * log).ceil();
        // `as` saturates floats into the integer's range.
        (limit as u32).clamp(1, MAX_SENDS)
    }

    /// Queues `item`, replacing an older update for the same key or dropping `item` if the queued
    /// one covers it. When the queue is full the last item in the send order (the most-sent, or
    /// the oldest) is evicted to make room.
    pub(crate) fn push(&mut self, item: T) -> Queued {
        let key = item.key();
        if self.index.len() == 0 {
            self.next_seq = 0;
        } else if self.next_seq == u32::MAX {
            self.renumber();
        }
        let seq = self.next_seq;
        if let Some(at) = self.position(&key) {
            let Some(e) = self.slab[at as usize].as_mut() else { return Queued::Stale };
            if e.item.covers(&item) {
                return Queued::Stale;
            }
            self.order.remove(&e.rank(self.order_by));
            *e = Entry { item, sends: 0, seq };
            self.order.insert(rank(self.order_by, 0, seq), at);
            self.next_seq += 1;
            return Queued::Replaced;
        }
        if self.index.len() >= self.capacity {
            if let Some((_, victim)) = self.order.pop_last() {
                self.vacate(victim);
                self.evicted += 1;
            }
        }
        let at = crate::slab_insert(&mut self.slab, &mut self.free, Entry { item, sends: 0, seq });
        let slab = &self.slab;
        self.index.insert(key, at, |n| key_in(slab, n));
        self.order.insert(rank(self.order_by, 0, seq), at);
        self.next_seq += 1;
        Queued::Added
    }

    /// Numbers the queued items `0..m` in their order of arrival, once `u32::MAX` pushes came
    /// without the queue ever emptying: the send order stays exactly as it was.
    fn renumber(&mut self) {
        let mut queued: Vec<(u32, u32)> =
            self.order.values().filter_map(|&at| Some((self.slab[at as usize].as_ref()?.seq, at))).collect();
        queued.sort_unstable();
        self.order.clear();
        self.next_seq = 0;
        for (_, at) in queued {
            if let Some(e) = self.slab[at as usize].as_mut() {
                e.seq = self.next_seq;
                self.order.insert(e.rank(self.order_by), at);
                self.next_seq += 1;
            }
        }
    }

    /// Picks updates to piggyback into `budget` free bytes of a datagram in the queue's
    /// [`Order`], skipping any that no longer fit; calls `take` with each in that
    /// order, with the times it was handed out before, and returns the bytes they use (never
    /// more than `budget`).
    ///
    /// Each picked item counts one transmission; an item that reaches the limit for
    /// `cluster_size` nodes leaves the queue. Items already over the limit (the cluster shrank)
    /// are dropped without being sent.
    pub(crate) fn fill(&mut self, budget: usize, cluster_size: usize, mut take: impl FnMut(&T, u32)) -> usize {
        let limit = self.transmit_limit(cluster_size);
        while let Some((&last, &at)) = self.order.last_key_value() {
            if sends_at(last) < limit {
                break;
            }
            self.order.pop_last();
            self.vacate(at);
        }
        let mut used = 0;
        let mut skips = 0;
        // A datagram takes a few dozen items at most: room for them up front, not by doublings.
        let mut picked: Vec<(Rank, u32)> = Vec::with_capacity(PICKS_AT_ONCE);
        let mut spent: Vec<(Rank, u32)> = Vec::new();
        for (rank, &at) in &self.order {
            if budget - used == 0 || skips == MAX_SKIPS {
                break;
            }
            let Some(e) = self.slab[at as usize].as_ref() else { continue };
            if e.sends >= limit {
                // Newest first keeps an item over a shrunken cluster's limit anywhere in the order.
                spent.push((*rank, at));
                continue;
            }
            let len = e.item.encoded_len(e.sends);
            if len > budget - used {
                skips += 1;
                continue;
            }
            skips = 0;
            used += len;
            take(&e.item, e.sends);
            picked.push((*rank, at));
        }
        for (was, at) in spent {
            self.order.remove(&was);
            self.vacate(at);
        }
        for (was, at) in picked {
            self.order.remove(&was);
            let sends = sends_at(was).saturating_add(1);
            if sends >= limit {
                self.vacate(at);
            } else if let Some(e) = self.slab[at as usize].as_mut() {
                e.sends = sends;
                self.order.insert(e.rank(self.order_by), at);
            }
        }
        self.release_if_empty();
        used
    }

    /// Removes the update queued for `key` (the node left and was forgotten, say).
    pub(crate) fn remove(&mut self, key: &NodeId) -> Option<T> {
        let at = self.position(key)?;
        let e = self.vacate(at)?;
        self.order.remove(&e.rank(self.order_by));
        self.release_if_empty();
        Some(e.item)
    }

    #[cfg(test)]
    /// The update queued for `key`.
    pub(crate) fn get(&self, key: &NodeId) -> Option<&T> {
        self.entry(key).map(|e| &e.item)
    }

    #[cfg(test)]
    /// How many times the update queued for `key` has been handed out.
    pub(crate) fn sends(&self, key: &NodeId) -> Option<u32> {
        self.entry(key).map(|e| e.sends)
    }

    /// Updates queued.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    #[cfg(test)]
    /// True when nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.index.len() == 0
    }

    #[cfg(test)]
    /// Updates evicted unsent-enough because the queue was full, since creation.
    pub(crate) fn evicted(&self) -> u64 {
        self.evicted
    }

    /// The slab number of the item queued for `key`.
    fn position(&self, key: &NodeId) -> Option<u32> {
        self.index.find(key, |n| key_in(&self.slab, n))
    }

    #[cfg(test)]
    fn entry(&self, key: &NodeId) -> Option<&Entry<T>> {
        self.slab[self.position(key)? as usize].as_ref()
    }

    /// Takes the item at slab number `at` out of the slab and the key index (not out of the
    /// send order: callers hold or remove its rank themselves).
    fn vacate(&mut self, at: u32) -> Option<Entry<T>> {
        let key = key_in(&self.slab, at)?;
        self.index.forget(&key, at);
        let e = self.slab[at as usize].take()?;
        self.free.push(at);
        Some(e)
    }

    /// Gives an emptied queue's tables back to the allocator once they have grown past a few
    /// items: a heal fills every node's queues to thousands of items, and the room would
    /// otherwise stay with each node for good. Slab numbers are internal, so nothing else moves.
    fn release_if_empty(&mut self) {
        if self.index.len() == 0 && self.slab.capacity() > RELEASE_ABOVE {
            debug_assert!(self.order.is_empty());
            self.slab = Vec::new();
            self.free = Vec::new();
            self.index = IdIndex::default();
        }
    }
}

/// An emptied queue whose slab had room for more items than this gives its tables back.
const RELEASE_ABOVE: usize = 64;

/// The key of the item at slab number `at`, if it holds one.
fn key_in<T: Update>(slab: &[Option<Entry<T>>], at: u32) -> Option<NodeId> {
    slab.get(at as usize)?.as_ref().map(|e| e.item.key())
}

/// `1.0` in the fixed-point format of [`log2_fixed`].
pub(crate) const LOG2_ONE: u64 = 1 << 16;

/// `log2(x)` in fixed point with 16 fractional bits (rounded down; `0` for `x ≤ 1`).
///
/// Integer-only, so every platform computes the same transmit limits and timeouts.
pub(crate) fn log2_fixed(x: u64) -> u64 {
    if x <= 1 {
        return 0;
    }
    let int = u64::from(63 - x.leading_zeros());
    // x / 2^int in [1, 2), as a fixed-point number with 32 fractional bits.
    let mut y: u128 = (u128::from(x) << 32) >> int;
    let mut frac = 0u64;
    for bit in (0..16).rev() {
        y = (y * y) >> 32;
        if y >= 2u128 << 32 {
            y >>= 1;
            frac |= 1 << bit;
        }
    }
    (int << 16) | frac
}

#[cfg(test)]
mod tests {
    use super::*;

    impl<T: Update> BroadcastQueue<T> {
        /// The send order as `(sends, key)`.
        fn ranks(&self) -> Vec<(u32, NodeId)> {
            self.order
                .iter()
                .map(|(&rank, &at)| (sends_at(rank), key_in(&self.slab, at).expect("a ranked item is queued")))
                .collect()
        }
    }
    use proptest::prelude::*;

    /// An update about node `key` at `version`, `len` bytes long.
    #[derive(Clone, Debug, PartialEq, Eq)]
    struct Up {
        key: u64,
        version: u32,
        len: usize,
    }

    impl Update for Up {
        fn key(&self) -> NodeId {
            NodeId::from_u64(self.key)
        }
        fn covers(&self, other: &Self) -> bool {
            self.version >= other.version
        }
        fn encoded_len(&self, _sends: u32) -> usize {
            self.len
        }
    }

    fn up(key: u64, version: u32, len: usize) -> Up {
        Up { key, version, len }
    }

    fn fill_all(q: &mut BroadcastQueue<Up>, budget: usize, n: usize) -> Vec<Up> {
        let mut out = Vec::new();
        q.fill(budget, n, |u, _| out.push(u.clone()));
        out
    }

    #[test]
    fn an_emptied_queue_gives_its_room_back_and_keeps_working() {
        let mut q = BroadcastQueue::new(1.0, 10_000);
        for k in 0..1_000 {
            q.push(up(k, 1, 10));
        }
        let full = q.heap_bytes();
        assert!(full > 1_000 * 20, "{full} bytes for 1,000 items");
        // One node: every item is sent once and leaves.
        let mut sent = 0;
        while !q.is_empty() {
            sent += fill_all(&mut q, 1_000, 1).len();
        }
        assert_eq!(sent, 1_000);
        assert_eq!(q.heap_bytes(), 0, "an empty queue holds no tables");
        q.push(up(7, 2, 10));
        assert_eq!(q.get(&NodeId::from_u64(7)), Some(&up(7, 2, 10)));
        assert_eq!(fill_all(&mut q, 100, 1), vec![up(7, 2, 10)]);
        // A queue that never grew past a few items keeps them.
        for k in 0..3 {
            q.push(up(k, 1, 10));
        }
        assert!(q.remove(&NodeId::from_u64(0)).is_some());
        let small = q.heap_bytes();
        q.remove(&NodeId::from_u64(1));
        q.remove(&NodeId::from_u64(2));
        assert!(q.is_empty() && q.heap_bytes() > 0 && q.heap_bytes() <= small);
    }

    #[test]
    fn fixed_point_log2_is_exact_on_powers_of_two_and_close_elsewhere() {
        assert_eq!(log2_fixed(0), 0);
        assert_eq!(log2_fixed(1), 0);
        for k in 0..63 {
            assert_eq!(log2_fixed(1 << k), k << 16);
        }
        for x in [3u64, 10, 1000, 10_001, 123_456_789, u64::MAX] {
            let exact = (x as f64).log2();
            let got = log2_fixed(x) as f64 / LOG2_ONE as f64;
            assert!((exact - got).abs() < 1e-4, "log2({x}) = {got}, want {exact}");
        }
    }

    #[test]
    fn transmit_limit_grows_with_the_log_of_the_cluster() {
        let q = BroadcastQueue::<Up>::new(1.0, 10);
        assert_eq!(q.transmit_limit(0), 1);
        assert_eq!(q.transmit_limit(1), 1);
        assert_eq!(q.transmit_limit(3), 2);
        assert_eq!(q.transmit_limit(10_000), 14); // log2(10_001) = 13.29
        let q = BroadcastQueue::<Up>::new(3.0, 10);
        assert_eq!(q.transmit_limit(7), 9);
        let q = BroadcastQueue::<Up>::per_decade(4.0, 10);
        assert_eq!(q.transmit_limit(0), 1);
        assert_eq!(q.transmit_limit(9), 4); // log10(10) = 1
        assert_eq!(q.transmit_limit(10), 8); // log10(11) = 1.04
        assert_eq!(q.transmit_limit(100), 12);
        assert_eq!(q.transmit_limit(10_000), 20);
        assert_eq!(BroadcastQueue::<Up>::new(f64::NAN, 1).transmit_limit(1000), 1);
        assert_eq!(BroadcastQueue::<Up>::new(f64::INFINITY, 1).transmit_limit(1000), 1);
        assert_eq!(BroadcastQueue::<Up>::new(1e300, 1).transmit_limit(1000), MAX_SENDS, "capped");
    }

    #[test]
    fn newer_update_replaces_older_and_older_is_dropped() {
        let mut q = BroadcastQueue::new(4.0, 10);
        assert_eq!(q.push(up(1, 2, 10)), Queued::Added);
        assert_eq!(fill_all(&mut q, 100, 10).len(), 1);
        assert_eq!(q.sends(&NodeId::from_u64(1)), Some(1));
        assert_eq!(q.push(up(1, 1, 10)), Queued::Stale);
        assert_eq!(q.push(up(1, 2, 10)), Queued::Stale, "an equal update does not restart the count");
        assert_eq!(q.sends(&NodeId::from_u64(1)), Some(1));
        assert_eq!(q.push(up(1, 3, 10)), Queued::Replaced);
        assert_eq!(q.sends(&NodeId::from_u64(1)), Some(0));
        assert_eq!(fill_all(&mut q, 100, 10), vec![up(1, 3, 10)]);
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn least_sent_first_then_newest_first() {
        let mut q = BroadcastQueue::new(4.0, 10);
        q.push(up(1, 0, 10));
        q.push(up(2, 0, 10));
        assert_eq!(fill_all(&mut q, 10, 10), vec![up(2, 0, 10)], "newest first");
        assert_eq!(fill_all(&mut q, 10, 10), vec![up(1, 0, 10)], "then the one sent less");
        q.push(up(3, 0, 10));
        assert_eq!(fill_all(&mut q, 25, 10), vec![up(3, 0, 10), up(2, 0, 10)]);
    }

    #[test]
    fn newest_first_sends_a_new_item_to_its_limit_before_the_backlog_and_evicts_the_oldest() {
        let mut q = BroadcastQueue::new(1.0, 3).in_order(Order::Newest);
        q.push(up(1, 0, 10));
        q.push(up(2, 0, 10));
        // Three nodes: ceil(log2 4) = 2 sends each.
        assert_eq!(fill_all(&mut q, 10, 3), vec![up(2, 0, 10)]);
        q.push(up(3, 0, 10));
        assert_eq!(fill_all(&mut q, 10, 3), vec![up(3, 0, 10)], "the newest, unsent items behind it");
        assert_eq!(fill_all(&mut q, 10, 3), vec![up(3, 0, 10)], "again, to its limit");
        assert_eq!(q.get(&NodeId::from_u64(3)), None, "then it leaves");
        q.push(up(4, 0, 10));
        q.push(up(5, 0, 10));
        assert_eq!(q.get(&NodeId::from_u64(1)), None, "full: the oldest made room, though sent least");
        assert_eq!(q.evicted(), 1);
        assert_eq!(fill_all(&mut q, 30, 3), vec![up(5, 0, 10), up(4, 0, 10), up(2, 0, 10)]);
        // Items over a shrunken cluster's limit leave unsent, wherever they stand.
        q.push(up(6, 0, 10));
        assert_eq!(fill_all(&mut q, 30, 1), vec![up(6, 0, 10)]);
        assert!(q.is_empty());
    }

    #[test]
    fn sequence_numbers_start_afresh_or_are_renumbered_without_moving_the_order() {
        let mut q = BroadcastQueue::new(4.0, 100);
        q.push(up(1, 0, 10));
        fill_all(&mut q, 100, 10_000);
        q.next_seq = u32::MAX - 2;
        for k in 2..=6 {
            q.push(up(k, 0, 10));
            if k == 4 {
                fill_all(&mut q, 10, 10_000); // 4, sent once
            }
        }
        assert!(q.next_seq < 10, "renumbered: {}", q.next_seq);
        // Unsent newest first (6, 5, 3, 2), then those sent once, newest first (4, 1).
        let keys = |q: &BroadcastQueue<Up>| q.ranks().iter().map(|r| r.1).collect::<Vec<_>>();
        assert_eq!(keys(&q), [6, 5, 3, 2, 4, 1].map(NodeId::from_u64));
        assert_eq!(q.push(up(2, 1, 10)), Queued::Replaced);
        assert_eq!(keys(&q), [2, 6, 5, 3, 4, 1].map(NodeId::from_u64));
        while !q.is_empty() {
            fill_all(&mut q, 1_000, 1);
        }
        q.push(up(9, 0, 10));
        assert_eq!(q.next_seq, 1, "an emptied queue numbers from 0 again");
    }

    #[test]
    fn items_that_do_not_fit_are_skipped_for_smaller_ones() {
        let mut q = BroadcastQueue::new(4.0, 10);
        q.push(up(1, 0, 5));
        q.push(up(2, 0, 50));
        q.push(up(3, 0, 30));
        assert_eq!(fill_all(&mut q, 40, 10), vec![up(3, 0, 30), up(1, 0, 5)]);
        assert_eq!(fill_all(&mut q, 0, 10), vec![]);
        assert_eq!(q.sends(&NodeId::from_u64(2)), Some(0));
    }

    #[test]
    fn items_leave_after_their_transmit_limit() {
        let mut q = BroadcastQueue::new(1.0, 10);
        q.push(up(1, 0, 1));
        // Three nodes: ceil(log2 4) = 2 sends.
        assert_eq!(fill_all(&mut q, 10, 3).len(), 1);
        assert_eq!(fill_all(&mut q, 10, 3).len(), 1);
        assert!(q.is_empty());
        assert_eq!(fill_all(&mut q, 10, 3).len(), 0);
        // The cluster shrinking below what an item has had already retires it unsent.
        q.push(up(2, 0, 1));
        assert_eq!(fill_all(&mut q, 10, 1000).len(), 1);
        assert_eq!(fill_all(&mut q, 10, 0).len(), 0);
        assert!(q.is_empty());
    }

    #[test]
    fn full_queue_evicts_the_most_sent() {
        let mut q = BroadcastQueue::new(8.0, 2);
        q.push(up(1, 0, 10));
        q.push(up(2, 0, 10));
        fill_all(&mut q, 10, 100); // sends 2
        fill_all(&mut q, 10, 100); // sends 1
        fill_all(&mut q, 10, 100); // sends 2 again
        assert_eq!((q.sends(&NodeId::from_u64(1)), q.sends(&NodeId::from_u64(2))), (Some(1), Some(2)));
        assert_eq!(q.push(up(3, 0, 10)), Queued::Added);
        assert_eq!(q.len(), 2);
        assert!(q.get(&NodeId::from_u64(2)).is_none());
        assert_eq!(q.evicted(), 1);
        assert_eq!(q.remove(&NodeId::from_u64(1)), Some(up(1, 0, 10)));
        assert_eq!(fill_all(&mut q, 100, 100), vec![up(3, 0, 10)]);
    }

    #[test]
    fn record_updates_carry_their_encoding_and_are_superseded_by_the_lattice() {
        use crate::hardware::Hardware;
        use crate::record::{Lifecycle, Reachability, Record, Role};
        use std::sync::Arc;
        let r = Record::new(NodeId::from_u64(5), 1, Role::Serving, Hardware::CPU, Reachability::OutboundOnly);
        let mut down = r.clone();
        down.state = Lifecycle::Down;
        let a = RecordUpdate::new(Arc::new(r.clone())).unwrap();
        let b = RecordUpdate::new(Arc::new(down)).unwrap();
        assert_eq!(postcard::from_bytes::<Record>(a.encoded()).unwrap(), r);
        assert_eq!(a.encoded_len(0), a.encoded().len());
        assert!(a.is_eager(1_000_000), "RecordUpdate::new always sends the whole record");
        let lazy = RecordUpdate::with_encoding(a.record().clone(), Encoding::from(a.encoded()), 2);
        assert!(lazy.is_eager(1) && !lazy.is_eager(2));
        assert_eq!(lazy.encoded_len(1), a.encoded().len());
        let announced = crate::wire::encode_piggyback(&lazy.announcement());
        assert_eq!(lazy.encoded_len(2), announced.len(), "the budget counts the announcement's bytes");
        assert!(announced.len() * 4 < a.encoded().len(), "{} vs {} bytes", announced.len(), a.encoded().len());
        let mut q = BroadcastQueue::new(2.0, 4);
        assert_eq!(q.push(b.clone()), Queued::Added);
        assert_eq!(q.push(a.clone()), Queued::Stale);
        assert_eq!(q.get(&NodeId::from_u64(5)).map(|u| u.record().state), Some(Lifecycle::Down));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Push(u64, u32, usize),
        Fill(usize, usize),
        Remove(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u64..12, 0u32..6, 1usize..120).prop_map(|(k, v, l)| Op::Push(k, v, l)),
            3 => (0usize..300, 0usize..40).prop_map(|(b, n)| Op::Fill(b, n)),
            1 => (0u64..12).prop_map(Op::Remove),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// Runs random operations against a model of what is queued and checks every `fill`.
        #[test]
        fn fill_respects_budget_supersession_limits_order_and_capacity(
            lambda in 0.5f64..3.0,
            capacity in 1usize..8,
            newest in any::<bool>(),
            ops in prop::collection::vec(op(), 1..80),
        ) {
            let order = if newest { Order::Newest } else { Order::LeastSent };
            let mut q = BroadcastQueue::new(lambda, capacity).in_order(order);
            // The newest update pushed per key that was not stale, and how often each was sent.
            let mut latest: std::collections::HashMap<u64, u32> = Default::default();
            let mut sent: std::collections::HashMap<(u64, u32), u32> = Default::default();
            for op in ops {
                match op {
                    Op::Push(k, v, l) => {
                        let before = q.get(&NodeId::from_u64(k)).cloned();
                        let r = q.push(up(k, v, l));
                        match before {
                            Some(b) if b.version >= v => prop_assert_eq!(r, Queued::Stale),
                            Some(_) => prop_assert_eq!(r, Queued::Replaced),
                            None => prop_assert_eq!(r, Queued::Added),
                        }
                        if r != Queued::Stale {
                            latest.insert(k, v);
                            sent.insert((k, v), 0);
                        }
                    }
                    Op::Fill(budget, n) => {
                        let limit = q.transmit_limit(n);
                        // The send order before the call, minus what is over the limit.
                        let ranked: Vec<(u32, NodeId)> = q.ranks().into_iter()
                            .filter(|r| r.0 < limit).collect();
                        let out = fill_all(&mut q, budget, n);
                        let total: usize = out.iter().map(|u| u.len).sum();
                        prop_assert!(total <= budget);
                        for u in &out {
                            prop_assert_eq!(latest.get(&u.key), Some(&u.version), "superseded item sent");
                            let c = sent.entry((u.key, u.version)).or_default();
                            *c += 1;
                            prop_assert!(*c <= limit, "sent {} times, limit {}", c, limit);
                        }
                        // Greedy in the send order: any skipped item ranked before the last picked
                        // one did not fit what was left when its turn came.
                        let picked: Vec<NodeId> = out.iter().map(|u| u.key()).collect();
                        let order_of_picks: Vec<NodeId> =
                            ranked.iter().map(|r| r.1).filter(|k| picked.contains(k)).collect();
                        prop_assert_eq!(&order_of_picks, &picked, "picked out of order");
                        if let Some(last) = picked.last() {
                            let mut left = budget;
                            for r in &ranked {
                                if r.1 == *last { break; }
                                let len = out.iter().find(|u| u.key() == r.1).map(|u| u.len);
                                match len {
                                    Some(l) => left -= l,
                                    None => {
                                        let skipped = q.get(&r.1).map_or(0, |u| u.len);
                                        prop_assert!(skipped > left, "a fitting item was passed over");
                                    }
                                }
                            }
                        }
                    }
                    Op::Remove(k) => {
                        q.remove(&NodeId::from_u64(k));
                        latest.remove(&k);
                    }
                }
                prop_assert!(q.len() <= capacity);
                prop_assert_eq!(q.len(), q.order.len());
                prop_assert_eq!(q.len() + q.free.len(), q.slab.len());
                for (_, key) in q.ranks() {
                    prop_assert!(q.get(&key).is_some(), "ranked item not found by its key");
                }
            }
        }
    }
}
