//! The registry: one replica of every node's record, merged through the lattice, with the
//! "who serves model M" index that routing reads ([`Replica`]).

use crate::id::{Directory, IdIndex, NodeId};
use crate::record::{Lifecycle, Record, Role, SharedRecord, Version};
use crate::time::Time;
use core::time::Duration;
use foldhash::fast::FixedState;
use hashbrown::HashMap;
use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;

/// What this replica knows about one node.
///
/// Every node holds one slot for every node of the federation, so a simulated federation of
/// 10,000 nodes holds 10^8 of them: a slot is 16 bytes, the shared record's pointer, the local
/// time of its last change in wrapping milliseconds, and the content stamp with the three flags
/// in its top bits.
#[derive(Clone, Debug)]
pub struct Slot {
    record: SharedRecord,
    /// Local time of the last change, in milliseconds modulo 2^32 ([`Slot::age`]).
    changed_ms: u32,
    /// The content stamp (low [`STAMP_BITS`] bits: a hash of the content that is neither version
    /// nor load: models, hardware, reach, role), then [`ALIVE`], [`ROUTABLE`] and [`RETIRED`].
    bits: u32,
}

// Keep it from growing unnoticed: 10^8 of them in a 10,000-node simulation.
const _: () = assert!(core::mem::size_of::<Slot>() <= 16);

/// Bits of the content stamp kept in [`Slot::bits`].
const STAMP_BITS: u32 = 29;
const STAMP: u32 = (1 << STAMP_BITS) - 1;
/// Not suspected here by the failure detector, and not LEFT.
const ALIVE: u32 = 1 << 29;
/// Alive, SERVE, serving role and at least one model.
const ROUTABLE: u32 = 1 << 30;
/// A LEFT or DOWN record past half its tombstone lifetime: no longer advertised (left out of the
/// anti-entropy hashes and entries), kept only until it is deleted.
const RETIRED: u32 = 1 << 31;

/// The longest tombstone lifetime a slot can time: ages are kept in wrapping milliseconds, and
/// a tombstone is looked at again within half its lifetime.
pub(crate) const MAX_TOMBSTONE_TTL: Duration = Duration::from_millis(1 << 31);

/// `now` in wrapping milliseconds, as slots keep it.
fn wrapping_ms(now: Time) -> u32 {
    now.as_millis() as u32
}

impl Slot {
    fn new(record: SharedRecord, now: Time, alive: bool) -> Slot {
        let stamp = content_stamp(&record);
        let mut slot = Slot { record, changed_ms: wrapping_ms(now), bits: stamp & STAMP };
        slot.set(ALIVE, alive);
        slot
    }

    fn flag(&self, flag: u32) -> bool {
        self.bits & flag != 0
    }

    fn set(&mut self, flag: u32, on: bool) {
        if on {
            self.bits |= flag;
        } else {
            self.bits &= !flag;
        }
    }

    fn stamp(&self) -> u32 {
        self.bits & STAMP
    }

    fn set_stamp(&mut self, stamp: u32) {
        self.bits = (self.bits & !STAMP) | (stamp & STAMP);
    }

    /// Time since the merged record last changed here, at `now` (exact to a millisecond while
    /// it is under [`MAX_TOMBSTONE_TTL`] twice over).
    pub(crate) fn age(&self, now: Time) -> Duration {
        Duration::from_millis(u64::from(wrapping_ms(now).wrapping_sub(self.changed_ms)))
    }

    /// The merged record.
    pub fn record(&self) -> &SharedRecord {
        &self.record
    }

    /// Alive: not suspected here by the failure detector, and not LEFT.
    pub fn is_alive(&self) -> bool {
        self.flag(ALIVE)
    }

    /// Alive, SERVE, serving role and at least one model.
    pub fn is_routable(&self) -> bool {
        self.flag(ROUTABLE)
    }

    /// The record's [`sync_of`] hash, from the kept content stamp.
    pub(crate) fn sync_hash(&self) -> u32 {
        sync_of(&self.record, self.stamp())
    }

    /// A tombstone past half its lifetime, no longer advertised ([`Replica::collect_tombstones`]).
    pub(crate) fn is_retired(&self) -> bool {
        self.flag(RETIRED)
    }
}

/// The routable hosts of one model ([`Replica::serving`]): slot numbers, read through the
/// replica's slots, so that each of the thousands of entries a large federation's host list
/// holds is 4 bytes, not a 16-byte id. Borrowed from the host index where the replica keeps one
/// (gateways), found by a scan of the slots where it does not.
#[derive(Clone)]
pub struct Serving<'a> {
    slots: &'a [Slot],
    hosts: Cow<'a, [u32]>,
}

impl<'a> Serving<'a> {
    /// How many routable hosts.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// No routable host.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// The `k`-th host; panics unless `k < len()`.
    pub fn get(&self, k: usize) -> NodeId {
        self.slots[self.hosts[k] as usize].record.id
    }

    /// The hosts, in the replica's order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = NodeId> + '_ {
        let slots = self.slots;
        self.hosts.iter().map(move |&n| slots[n as usize].record.id)
    }

    /// Whether `id` is among the hosts.
    pub fn contains(&self, id: &NodeId) -> bool {
        self.iter().any(|h| h == *id)
    }

    /// The hosts as ids.
    pub fn to_vec(&self) -> Vec<NodeId> {
        self.iter().collect()
    }
}

impl core::fmt::Debug for Serving<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The effect of one merge on the replica.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Merged {
    /// The stored record changed.
    pub changed: bool,
    /// The node was not known before.
    pub new_node: bool,
    /// `Some(r)` when the node's routability flipped to `r`.
    pub routable: Option<bool>,
}

/// A full replica of the registry: one record of every node, merged through the lattice
/// ([`Replica::merge`]), with the "who serves model M" index that routing reads.
///
/// Nothing dies of silence here: the failure detector judges liveness, marks a suspect not
/// alive ([`Slot::is_alive`]) and a confirmed failure DOWN through the lattice. No remote
/// timestamp is ever compared with the local clock, so clock skew between institutions cannot
/// make a node look dead or alive.
///
/// A node is *routable* when it is alive, in state SERVE, has the serving role and lists at least
/// one model. A gateway's replica keeps, per model name, the list of routable hosts, so a lookup
/// ([`Replica::serving`]) is one hash probe and returns a slice regardless of the registry's size.
/// Only gateways route, so a serving node's replica keeps no such index (at 10,000 nodes it is
/// ~47 KB a node) and answers the same lookup by a scan of its slots.
#[derive(Clone, Debug)]
pub struct Replica {
    local: NodeId,
    slots: Vec<Slot>,
    /// Slot numbers by the id in the slot.
    index: IdIndex,
    /// Per model name, the slot numbers of its routable hosts; kept only on a gateway
    /// ([`Replica::index_hosts`]).
    hosts: HashMap<String, Vec<u32>, FixedState>,
    view: u64,
    /// Anti-entropy hashes: per bucket of node ids, the XOR of [`Slot::sync_hash`] of its records.
    buckets: Box<[u32; BUCKETS]>,
    /// Slot numbers by anti-entropy bucket, so that an exchange touches the slots of the
    /// buckets it compares, not the whole registry.
    by_bucket: BucketLists,
    /// The GC watermark: generations of deleted tombstones, by node, and when they were deleted.
    /// A record of a deleted generation or an older one is refused, so a stale peer cannot bring
    /// it back.
    deleted: HashMap<NodeId, (u64, Time), FixedState>,
    /// The nodes whose stored record is LEFT (the local node aside): what
    /// [`Replica::collect_tombstones`] looks at, instead of every slot.
    tombstones: BTreeSet<NodeId>,
    /// The nodes whose stored record is DOWN (the local node aside): where the membership's
    /// anti-entropy looks for a member to reconnect to, instead of every slot.
    downs: BTreeSet<NodeId>,
    /// Merges refused by the watermark.
    resurrections_refused: u64,
}

impl Replica {
    /// Adds the heap bytes of the replica's tables to `heap` ([`crate::heap`]).
    pub(crate) fn heap_bytes(&self, heap: &mut crate::heap::HeapBytes) {
        use crate::heap::{array, btree, hash_table};
        heap.replica_slots += array::<Slot>(self.slots.capacity());
        heap.replica_index += self.index.heap_bytes();
        heap.replica_buckets += array::<u32>(BUCKETS) + self.by_bucket.heap_bytes();
        heap.replica_hosts += hash_table::<(String, Vec<u32>)>(self.hosts.capacity())
            + self.hosts.iter().map(|(m, h)| array::<u8>(m.capacity()) + array::<u32>(h.capacity())).sum::<u64>();
        heap.replica_other += hash_table::<(NodeId, (u64, Time))>(self.deleted.capacity())
            + btree::<NodeId>(self.tombstones.len())
            + btree::<NodeId>(self.downs.len());
    }
}

/// Buckets the registry is split into for anti-entropy, by node id; exchanges use this many or
/// fewer (a power of two), folding neighbours together.
pub(crate) const BUCKETS: usize = 1024;

/// The anti-entropy bucket of `id` when the registry is split into `count` buckets (a power of
/// two, at most [`BUCKETS`]). Buckets of a smaller count are unions of those of a larger one.
pub(crate) fn bucket_of(id: &NodeId, count: usize) -> usize {
    debug_assert!(count.is_power_of_two() && count <= BUCKETS);
    use core::hash::BuildHasher;
    FixedState::default().hash_one(id) as usize & (count - 1)
}

/// Hash of what anti-entropy must make equal about one record: the version (with the
/// heartbeat, which is the incarnation that refutes a suspicion) and the content, from its
/// content stamp, which slots keep: a merge that moves only the version does not hash the
/// content again. Load is left out: it is not spread by gossip.
fn sync_of(r: &Record, stamp: u32) -> u32 {
    use core::hash::BuildHasher;
    FixedState::default().hash_one((r.id, r.generation, r.state, r.heartbeat, stamp)) as u32
}

/// Hash of what replicas must agree on about one record: identity, generation, state, models.
/// Heartbeat and load move all the time and are left out.
fn content_stamp(r: &Record) -> u32 {
    use core::hash::BuildHasher;
    FixedState::default().hash_one((&r.models, &r.hardware, &r.reach, r.role)) as u32
}

fn view_hash(r: &Record) -> u64 {
    use core::hash::BuildHasher;
    FixedState::default().hash_one((r.id, r.generation, r.state, &r.models))
}

/// The id of the record in slot `n`, if there is one.
fn id_in(slots: &[Slot], n: u32) -> Option<NodeId> {
    slots.get(n as usize).map(|s| s.record.id)
}

mod buckets;
mod tombstones;

use buckets::BucketLists;

impl Replica {
    /// A replica that holds the local node's own record. Nodes never die of silence in it: the
    /// failure detector marks failed nodes DOWN through the lattice, and only DOWN and LEFT
    /// records (and the failure detector's suspicion) make a node unroutable.
    pub fn new(local: Record, now: Time) -> Replica {
        let mut r = Replica {
            local: local.id,
            slots: Vec::new(),
            index: IdIndex::default(),
            hosts: HashMap::with_hasher(FixedState::default()),
            view: 0,
            buckets: Box::new([0; BUCKETS]),
            by_bucket: BucketLists::default(),
            deleted: HashMap::with_hasher(FixedState::default()),
            tombstones: BTreeSet::new(),
            downs: BTreeSet::new(),
            resurrections_refused: 0,
        };
        r.merge(now, Arc::new(local));
        r
    }

    /// The local node's record.
    pub fn local(&self) -> &SharedRecord {
        // The local slot is inserted first and never removed.
        &self.slots[0].record
    }

    /// Number of known nodes, the local one included.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Never true: the local node is always known.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// What is known about `id`.
    pub fn get(&self, id: &NodeId) -> Option<&Slot> {
        self.position(id).map(|i| &self.slots[i])
    }

    /// True if a record of `id` at `version` would add to what this replica holds: it holds an
    /// older version, or none and the GC watermark would not refuse it.
    pub(crate) fn lacks(&self, id: &NodeId, version: &Version) -> bool {
        match self.get(id) {
            Some(slot) => !slot.record.version().covers(version),
            None => !self.deleted.get(id).is_some_and(|(generation, _)| version.generation <= *generation),
        }
    }

    /// The position of `id`'s slot in [`Replica::slots`].
    pub(crate) fn position(&self, id: &NodeId) -> Option<usize> {
        self.slot_number(id).map(|i| i as usize)
    }

    /// All slots in the order nodes were first learned (deterministic for a given input sequence).
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// Whether the host index is kept: the local node is a gateway, the only role that routes.
    fn index_hosts(&self) -> bool {
        self.local().role == Role::Gateway
    }

    /// Routable nodes hosting a model called `model` (any weight format).
    pub fn serving(&self, model: &str) -> Serving<'_> {
        let hosts = if self.index_hosts() {
            Cow::Borrowed(self.hosts.get(model).map_or(&[][..], Vec::as_slice))
        } else {
            let serves = |s: &Slot| s.is_routable() && s.record.models.as_slice().iter().any(|m| m.name == model);
            Cow::Owned(self.slots.iter().enumerate().filter(|(_, s)| serves(s)).map(|(n, _)| n as u32).collect())
        };
        Serving { slots: &self.slots, hosts }
    }

    /// Names of models with at least one routable host, sorted.
    pub fn routable_models(&self) -> Vec<&str> {
        let mut names: Vec<&str> = if self.index_hosts() {
            self.hosts.iter().filter(|(_, h)| !h.is_empty()).map(|(m, _)| m.as_str()).collect()
        } else {
            let routable = self.slots.iter().filter(|s| s.is_routable());
            routable.flat_map(|s| s.record.models.as_slice().iter().map(|m| m.name.as_str())).collect()
        };
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Merges a version of some node's record, received at local time `now`.
    pub fn merge(&mut self, now: Time, incoming: SharedRecord) -> Merged {
        let Some(i) = self.slot_number(&incoming.id) else {
            if self.deleted.get(&incoming.id).is_some_and(|(generation, _)| incoming.generation <= *generation) {
                self.resurrections_refused += 1;
                return Merged::default();
            }
            let (id, state) = (incoming.id, incoming.state);
            self.view ^= view_hash(&incoming);
            let slot = Slot::new(incoming, now, state < Lifecycle::Left);
            self.buckets[bucket_of(&id, BUCKETS)] ^= slot.sync_hash();
            let n = self.slots.len() as u32;
            self.by_bucket.push(bucket_of(&id, BUCKETS), n);
            crate::reserve_one(&mut self.slots);
            self.slots.push(slot);
            let slots = &self.slots;
            self.index.insert(id, n, |m| id_in(slots, m));
            self.note_state(id, None, state);
            let routable = self.refresh(self.slots.len() - 1, None);
            return Merged { changed: true, new_node: true, routable };
        };
        let i = i as usize;
        let old = &self.slots[i].record;
        let merged = if old.dominates(&incoming) {
            return Merged::default();
        } else if incoming.dominates(old) {
            incoming
        } else {
            Arc::new(old.join(&incoming))
        };
        // A higher generation or heartbeat (the incarnation) is news of life: it lifts a
        // suspicion held here.
        let advanced = merged.generation > old.generation || merged.heartbeat > old.heartbeat;
        if (merged.generation, merged.state, &merged.models) != (old.generation, old.state, &old.models) {
            self.view ^= view_hash(old) ^ view_hash(&merged);
        }
        // A retired tombstone is already out of the hashes; a newer version brings the node back.
        let out = if self.slots[i].is_retired() { 0 } else { self.slots[i].sync_hash() };
        self.slots[i].set(RETIRED, false);
        let previous = core::mem::replace(&mut self.slots[i].record, merged);
        let slot = &mut self.slots[i];
        slot.changed_ms = wrapping_ms(now);
        if (&previous.models, &previous.hardware, &previous.reach, previous.role)
            != (&slot.record.models, &slot.record.hardware, &slot.record.reach, slot.record.role)
        {
            slot.set_stamp(content_stamp(&slot.record));
        }
        let into = slot.sync_hash();
        self.buckets[bucket_of(&slot.record.id, BUCKETS)] ^= out ^ into;
        if advanced {
            slot.set(ALIVE, true);
        }
        let slot = &mut self.slots[i];
        if slot.record.state == Lifecycle::Left {
            slot.set(ALIVE, false);
        }
        let (id, state) = (slot.record.id, slot.record.state);
        self.note_state(id, Some(previous.state), state);
        let routable = self.refresh(i, Some(&previous));
        Merged { changed: true, new_node: false, routable }
    }

    /// Sets `id`'s liveness as the failure detector judges it: a suspected node is not alive, so
    /// not routable, until the
    /// suspicion is lifted here or a newer heartbeat or generation of it is merged. Returns the
    /// routability flip, if any. The local node and LEFT nodes are left alone.
    pub(crate) fn set_alive(&mut self, id: &NodeId, alive: bool) -> Option<bool> {
        let i = self.position(id)?;
        let slot = &mut self.slots[i];
        if slot.is_alive() == alive || slot.record.id == self.local || slot.record.state == Lifecycle::Left {
            return None;
        }
        slot.set(ALIVE, alive);
        self.refresh(i, None)
    }

    /// Recomputes slot `i`'s routability and keeps the host index in step. `previous` is the
    /// record before a merge (its models may differ). Returns the new routability if it flipped.
    fn refresh(&mut self, i: usize, previous: Option<&Record>) -> Option<bool> {
        let slot = &self.slots[i];
        let rec = &slot.record;
        let routable =
            slot.is_alive() && rec.state == Lifecycle::Serve && rec.role == Role::Serving && !rec.models.is_empty();
        let was = slot.is_routable();
        let models_changed = previous.is_some_and(|p| p.models != rec.models);
        if was == routable && !(routable && models_changed) {
            return None;
        }
        let n = i as u32;
        if was {
            let old_models = previous.map_or(&rec.models, |p| &p.models);
            for m in old_models.as_slice() {
                if let Some(list) = self.hosts.get_mut(m.name.as_str()) {
                    if let Some(pos) = list.iter().position(|&h| h == n) {
                        list.swap_remove(pos);
                    }
                }
            }
        }
        let index_hosts = self.index_hosts();
        let slot = &mut self.slots[i];
        slot.set(ROUTABLE, routable);
        if routable && index_hosts {
            // Not listed under any model now: it was not routable, or its old models were just
            // unlisted above. So no scan of the host lists, which hold thousands of nodes in a
            // large federation; only a model named twice in one record is skipped.
            let models = slot.record.models.as_slice();
            for (k, m) in models.iter().enumerate() {
                if models[..k].iter().any(|earlier| earlier.name == m.name) {
                    continue;
                }
                let list = self.hosts.entry_ref(m.name.as_str()).or_default();
                crate::reserve_one(list);
                list.push(n);
            }
        }
        (was != routable).then_some(routable)
    }

    /// Replaces the local node's own record with a newer version the owner made.
    pub(crate) fn set_local(&mut self, now: Time, record: Record) -> Merged {
        debug_assert_eq!(record.id, self.local);
        self.merge(now, Arc::new(record))
    }

    /// An order-independent hash of every record's id, generation, state and models: two
    /// replicas that hold the same records (heartbeats and load aside) have the same view hash.
    /// Kept up to date on every merge, so comparing replicas costs O(1).
    pub fn view_hash(&self) -> u64 {
        self.view
    }

    /// The nodes whose stored record is DOWN (in their current generation), in id order.
    pub(crate) fn down_ids(&self) -> &BTreeSet<NodeId> {
        &self.downs
    }

    /// The numbers of the slots (positions in [`Replica::slots`]) whose records fall in the given
    /// buckets of a split into `count` (a power of two, at most [`BUCKETS`]), ascending.
    pub(crate) fn slots_in_buckets(&self, count: usize, buckets: &[u16]) -> Vec<u32> {
        debug_assert!(count.is_power_of_two() && count <= BUCKETS);
        let mut out = Vec::new();
        for &b in buckets.iter().filter(|&&b| usize::from(b) < count) {
            // A bucket of a coarser split is every BUCKETS-bucket with the same low bits.
            for fine in (usize::from(b)..BUCKETS).step_by(count) {
                out.extend(self.by_bucket.iter(fine));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The slot number of `id`'s record, if held.
    pub(crate) fn slot_number(&self, id: &NodeId) -> Option<u32> {
        self.index.find(id, |m| id_in(&self.slots, m))
    }

    /// Records refused because the GC watermark holds a later deletion of their node.
    pub fn resurrections_refused(&self) -> u64 {
        self.resurrections_refused
    }

    #[cfg(test)]
    /// Deleted tombstones still remembered in the GC watermark.
    pub(crate) fn watermark_len(&self) -> usize {
        self.deleted.len()
    }

    /// The anti-entropy hashes of the registry split into `count` buckets (a power of two, at
    /// most [`BUCKETS`]): bucket `b` is the XOR of [`Slot::sync_hash`] over the records whose
    /// [`bucket_of`] is `b`. Two replicas that hold the same records have the same hashes.
    pub(crate) fn bucket_hashes(&self, count: usize) -> Vec<u32> {
        let count = count.clamp(1, BUCKETS).next_power_of_two().min(BUCKETS);
        let mut out = vec![0u32; count];
        for (i, h) in self.buckets.iter().enumerate() {
            out[i & (count - 1)] ^= h;
        }
        out
    }

    /// Every record, sorted by node id: the canonical content for comparing replicas.
    pub fn sorted_records(&self) -> Vec<SharedRecord> {
        let mut v: Vec<SharedRecord> = self.slots.iter().map(|s| s.record.clone()).collect();
        v.sort_unstable_by_key(|r| r.id);
        v
    }
}

/// The replica's slot numbers are the node's member numbers: the failure detector keeps its
/// per-member state at them ([`Directory`]). A slot keeps its number until its tombstone is
/// deleted, when the last slot moves into it ([`Replica::collect_tombstones`] says so).
impl Directory for Replica {
    fn number(&self, id: &NodeId) -> Option<u32> {
        self.slot_number(id)
    }

    fn id(&self, n: u32) -> NodeId {
        self.slots[n as usize].record.id
    }
}

#[cfg(test)]
mod tests {
    use super::tombstones::Collected;
    use super::*;
    use crate::hardware::Hardware;
    use crate::record::{Model, ModelSet, Reachability};
    use core::time::Duration;

    fn rec(n: u64, generation: u64, state: Lifecycle, hb: u64, models: &[&str]) -> SharedRecord {
        let mut r =
            Record::new(NodeId::from_u64(n), generation, Role::Serving, Hardware::CPU, Reachability::OutboundOnly);
        r.state = state;
        r.heartbeat = hb;
        r.models = ModelSet::from_models(models.iter().map(|m| Model::named(*m)).collect());
        Arc::new(r)
    }

    /// Two replicas that merged `records` in opposite orders.
    fn merged_both_ways(records: &[SharedRecord]) -> (Replica, Replica) {
        let (mut x, mut y) = (replica(), replica());
        for r in records {
            x.merge(Time::ZERO, r.clone());
        }
        for r in records.iter().rev() {
            y.merge(Time::ZERO, r.clone());
        }
        (x, y)
    }

    fn replica() -> Replica {
        Replica::new((*rec(0, 1, Lifecycle::Join, 0, &[])).clone(), Time::ZERO)
    }

    /// A gateway's replica, which keeps the host index.
    fn gateway_replica() -> Replica {
        let mut local = (*rec(0, 1, Lifecycle::Join, 0, &[])).clone();
        local.role = Role::Gateway;
        Replica::new(local, Time::ZERO)
    }

    #[test]
    fn serving_lists_only_routable_hosts_of_the_model() {
        let mut r = replica();
        assert_eq!(r.merge(Time::ZERO, rec(1, 1, Lifecycle::Serve, 1, &["llama"])).routable, Some(true));
        r.merge(Time::ZERO, rec(2, 1, Lifecycle::Join, 1, &["llama"]));
        r.merge(Time::ZERO, rec(3, 1, Lifecycle::Serve, 1, &["qwen", "llama"]));
        let mut hosts = r.serving("llama").to_vec();
        hosts.sort();
        assert_eq!(hosts, vec![NodeId::from_u64(1), NodeId::from_u64(3)]);
        assert_eq!(r.serving("qwen").to_vec(), [NodeId::from_u64(3)]);
        assert!(r.serving("mistral").is_empty());
        assert_eq!(r.routable_models(), vec!["llama", "qwen"]);
        // DOWN removes the host at once.
        assert_eq!(r.merge(Time::ZERO, rec(1, 1, Lifecycle::Down, 1, &["llama"])).routable, Some(false));
        assert_eq!(r.serving("llama").to_vec(), [NodeId::from_u64(3)]);
    }

    #[test]
    fn a_slot_stays_24_bytes() {
        // Every node of a 10,000-node federation holds 10,000 of them.
        assert!(core::mem::size_of::<Slot>() <= 24, "{} bytes", core::mem::size_of::<Slot>());
    }

    #[test]
    fn nobody_dies_of_silence_and_a_suspicion_lasts_until_news_of_life() {
        let mut r = replica();
        r.merge(Time::from_secs(1), rec(1, 1, Lifecycle::Serve, 1, &["m"]));
        assert_eq!(r.serving("m").to_vec(), [NodeId::from_u64(1)]);
        // The detector suspects it: not routable; the same version again changes nothing.
        assert_eq!(r.set_alive(&NodeId::from_u64(1), false), Some(false));
        assert!(r.serving("m").is_empty());
        assert!(!r.merge(Time::from_secs(5), rec(1, 1, Lifecycle::Serve, 1, &["m"])).changed);
        assert!(r.serving("m").is_empty());
        // A higher incarnation refutes the suspicion.
        assert_eq!(r.merge(Time::from_secs(7), rec(1, 1, Lifecycle::Serve, 2, &["m"])).routable, Some(true));
        // The local node is never suspected.
        assert_eq!(r.set_alive(&NodeId::from_u64(0), false), None);
        // DOWN through the lattice ends routing.
        assert_eq!(r.merge(Time::from_secs(8), rec(1, 1, Lifecycle::Down, 2, &["m"])).routable, Some(false));
    }

    #[test]
    fn view_hash_is_order_independent_and_ignores_heartbeats() {
        let a = [
            rec(1, 1, Lifecycle::Serve, 1, &["m"]),
            rec(2, 3, Lifecycle::Join, 0, &[]),
            rec(1, 1, Lifecycle::Down, 2, &["m"]),
        ];
        let (mut x, y) = merged_both_ways(&a);
        assert_eq!(x.view_hash(), y.view_hash());
        let before = x.view_hash();
        x.merge(Time::ZERO, rec(1, 1, Lifecycle::Down, 9, &["m"]));
        assert_eq!(x.view_hash(), before, "a heartbeat is not a view change");
        x.merge(Time::ZERO, rec(1, 1, Lifecycle::Left, 9, &["m"]));
        assert_ne!(x.view_hash(), before);
    }

    #[test]
    fn stale_versions_change_nothing() {
        let mut r = replica();
        r.merge(Time::ZERO, rec(1, 2, Lifecycle::Serve, 5, &["m"]));
        assert_eq!(r.merge(Time::ZERO, rec(1, 1, Lifecycle::Left, 99, &["x"])), Merged::default());
        assert_eq!(r.merge(Time::ZERO, rec(1, 2, Lifecycle::Serve, 4, &["m"])), Merged::default());
        assert_eq!(r.get(&NodeId::from_u64(1)).unwrap().record().heartbeat, 5);
    }

    #[test]
    fn model_changes_within_serve_move_the_host_index() {
        let mut r = replica();
        r.merge(Time::ZERO, rec(1, 1, Lifecycle::Serve, 1, &["a"]));
        r.merge(Time::ZERO, rec(1, 1, Lifecycle::Serve, 2, &["a", "b"]));
        assert_eq!(r.serving("b").to_vec(), [NodeId::from_u64(1)]);
        // A new generation may withdraw a model.
        r.merge(Time::ZERO, rec(1, 2, Lifecycle::Serve, 0, &["b"]));
        assert!(r.serving("a").is_empty());
        assert_eq!(r.serving("b").to_vec(), [NodeId::from_u64(1)]);
    }

    #[test]
    fn bucket_hashes_agree_for_the_same_records_in_any_order_and_fold_consistently() {
        let records: Vec<SharedRecord> = (1..200).map(|n| rec(n, 1, Lifecycle::Serve, n % 7, &["m"])).collect();
        let (mut x, y) = merged_both_ways(&records);
        for count in [1, 2, 64, 1024] {
            assert_eq!(x.bucket_hashes(count), y.bucket_hashes(count));
            assert_eq!(x.bucket_hashes(count).len(), count);
        }
        // A larger count's buckets fold into a smaller count's.
        let fine = x.bucket_hashes(1024);
        let coarse = x.bucket_hashes(16);
        for (b, h) in coarse.iter().enumerate() {
            assert_eq!(*h, fine.iter().skip(b).step_by(16).fold(0, |a, f| a ^ f));
        }
        // A heartbeat (a refutation's incarnation) is a difference, in exactly one bucket.
        let before = x.bucket_hashes(64);
        x.merge(Time::ZERO, rec(5, 1, Lifecycle::Serve, 99, &["m"]));
        let after = x.bucket_hashes(64);
        let differing: Vec<usize> = (0..64).filter(|&b| before[b] != after[b]).collect();
        assert_eq!(differing, vec![bucket_of(&NodeId::from_u64(5), 64)]);
    }

    #[test]
    fn tombstones_age_across_the_millisecond_wrap() {
        // Slots keep the time of their last change in wrapping milliseconds: a tombstone made
        // five seconds before 2^32 ms is timed right on the other side of it.
        let (ttl, at) = (Duration::from_secs(100), Time::from_millis(u64::from(u32::MAX) - 5_000));
        let mut r = replica();
        r.merge(at, rec(1, 1, Lifecycle::Left, 2, &["m"]));
        assert_eq!(
            r.get(&NodeId::from_u64(1)).map(|s| s.age(at + Duration::from_secs(49))),
            Some(Duration::from_secs(49))
        );
        assert_eq!(r.collect_tombstones(at + Duration::from_secs(49), ttl, |_, _| {}), Collected::default());
        assert_eq!(r.collect_tombstones(at + Duration::from_secs(50), ttl, |_, _| {}).retired, 1);
        assert_eq!(r.collect_tombstones(at + Duration::from_secs(99), ttl, |_, _| {}).deleted, 0);
        assert_eq!(r.collect_tombstones(at + Duration::from_secs(100), ttl, |_, _| {}).deleted, 1);
    }

    #[test]
    fn tombstones_retire_at_half_life_are_deleted_at_the_end_and_stay_deleted() {
        let ttl = Duration::from_secs(100);
        let mut r = replica();
        r.merge(Time::ZERO, rec(1, 1, Lifecycle::Serve, 1, &["m"]));
        r.merge(Time::ZERO, rec(2, 1, Lifecycle::Serve, 1, &["m"]));
        let with_two = r.bucket_hashes(BUCKETS);
        r.merge(Time::from_secs(10), rec(1, 1, Lifecycle::Left, 2, &["m"]));
        let with_left = r.bucket_hashes(BUCKETS);
        assert_ne!(with_left, with_two);
        assert_eq!(r.collect_tombstones(Time::from_secs(59), ttl, |_, _| {}), Collected::default());
        // Half-way: still held, no longer advertised.
        assert_eq!(
            r.collect_tombstones(Time::from_secs(60), ttl, |_, _| {}),
            Collected { retired: 1, deleted: 0, forgotten: 0 }
        );
        assert!(r.get(&NodeId::from_u64(1)).is_some_and(Slot::is_retired));
        let mut without = replica();
        without.merge(Time::ZERO, rec(2, 1, Lifecycle::Serve, 1, &["m"]));
        assert_eq!(r.bucket_hashes(BUCKETS), without.bucket_hashes(BUCKETS));
        // Re-merging the same tombstone changes nothing.
        assert!(!r.merge(Time::from_secs(70), rec(1, 1, Lifecycle::Left, 2, &["m"])).changed);
        // The end: deleted, and the watermark refuses any copy of that generation or older.
        assert_eq!(
            r.collect_tombstones(Time::from_secs(110), ttl, |_, _| {}),
            Collected { retired: 0, deleted: 1, forgotten: 0 }
        );
        assert!(r.get(&NodeId::from_u64(1)).is_none());
        assert_eq!(r.get(&NodeId::from_u64(2)).map(|s| s.record().id), Some(NodeId::from_u64(2)));
        assert_eq!(r.len(), 2);
        for stale in [rec(1, 1, Lifecycle::Left, 2, &["m"]), rec(1, 1, Lifecycle::Serve, 9, &["m"])] {
            assert_eq!(r.merge(Time::from_secs(120), stale), Merged::default());
        }
        assert_eq!(r.resurrections_refused(), 2);
        assert_eq!(r.serving("m").to_vec(), [NodeId::from_u64(2)]);
        // A new generation is a new process of that node: welcome.
        assert!(r.merge(Time::from_secs(130), rec(1, 2, Lifecycle::Serve, 0, &["m"])).new_node);
        // The watermark entry is forgotten after another lifetime.
        assert_eq!(r.collect_tombstones(Time::from_secs(210), ttl, |_, _| {}).forgotten, 1);
        assert_eq!(r.watermark_len(), 0);
        // A node held DOWN that long is reaped the same way; its next generation is welcome.
        r.merge(Time::from_secs(300), rec(2, 1, Lifecycle::Down, 1, &["m"]));
        assert_eq!(r.down_ids().len(), 1);
        assert_eq!(
            r.collect_tombstones(Time::from_secs(350), ttl, |_, _| {}),
            Collected { retired: 1, deleted: 0, forgotten: 0 }
        );
        assert_eq!(
            r.collect_tombstones(Time::from_secs(400), ttl, |_, _| {}),
            Collected { retired: 0, deleted: 1, forgotten: 0 }
        );
        assert!(r.get(&NodeId::from_u64(2)).is_none() && r.down_ids().is_empty());
        assert_eq!(r.merge(Time::from_secs(410), rec(2, 1, Lifecycle::Serve, 5, &["m"])), Merged::default());
        assert!(r.merge(Time::from_secs(420), rec(2, 2, Lifecycle::Serve, 0, &["m"])).new_node);
    }

    #[test]
    fn the_bucket_lists_follow_the_slots_through_deletions() {
        let ttl = Duration::from_secs(100);
        let mut r = replica();
        for n in 1..300 {
            r.merge(Time::ZERO, rec(n, 1, Lifecycle::Serve, 1, &["m"]));
        }
        // Every third node leaves; their tombstones are deleted (slots swapped into their place).
        for n in (3..300).step_by(3) {
            r.merge(Time::from_secs(1), rec(n, 1, Lifecycle::Left, 2, &["m"]));
        }
        assert_eq!(r.collect_tombstones(Time::from_secs(200), ttl, |_, _| {}).deleted, 99);
        for count in [1, 8, 64, BUCKETS] {
            let all: Vec<u16> = (0..count as u16).collect();
            let listed = r.slots_in_buckets(count, &all);
            assert_eq!(listed, (0..r.len() as u32).collect::<Vec<_>>(), "every slot once, at {count} buckets");
            assert!(r.slots_in_buckets(count, &[count as u16]).is_empty(), "no such bucket");
            for b in [0u16, (count / 2) as u16, (count - 1) as u16] {
                for i in r.slots_in_buckets(count, &[b]) {
                    let id = r.slots()[i as usize].record().id;
                    assert_eq!(bucket_of(&id, count), usize::from(b));
                    assert_eq!(r.slot_number(&id), Some(i));
                }
            }
        }
    }

    proptest::proptest! {
        /// Whatever merges, suspicions and tombstone collections happen, each model's host list
        /// holds exactly the routable nodes that serve it, each once (also when a record names a
        /// model twice, in two formats), whether read from a gateway's index or found by a
        /// serving node's scan; the tombstone and DOWN sets are exactly the LEFT and DOWN
        /// records; neither kind outlives its lifetime; the slot numbers by bucket and by id
        /// stay exact.
        #[test]
        fn host_lists_tombstones_down_sets_and_slot_numbers_follow_the_records(
            ops in proptest::collection::vec(
                (1u64..6, 1u64..3, 0usize..4, 0u64..4, proptest::collection::vec((0usize..3, proptest::bool::ANY), 0..3), 0u64..3),
                1..60,
            ),
        ) {
            use crate::record::Quantization;
            let mut r = replica();
            // The same merges into a gateway's replica, which collects tombstones as it goes.
            let mut w = gateway_replica();
            let ttl = Duration::from_secs(4);
            let mut now = Time::ZERO;
            let names = ["a", "b", "c"];
            for (n, generation, state, hb, models, wait) in ops {
                now = now + Duration::from_secs(wait * 2);
                // The detector suspects a node, or lifts a suspicion.
                if wait > 0 {
                    r.set_alive(&NodeId::from_u64(n), wait == 2);
                }
                let state = [Lifecycle::Join, Lifecycle::Serve, Lifecycle::Left, Lifecycle::Down][state];
                let models: Vec<Model> = models
                    .iter()
                    .map(|&(m, fp16)| Model {
                        name: names[m].into(),
                        quant: if fp16 { Quantization::Fp16 } else { Quantization::Unknown },
                    })
                    .collect();
                let mut record = (*rec(n, generation, state, hb, &[])).clone();
                record.models = ModelSet::from_models(models);
                let record = Arc::new(record);
                r.merge(now, record.clone());
                w.merge(now, record);
                w.collect_tombstones(now, ttl, |_, _| {});
                for x in [&r, &w] {
                    let in_state = |state: Lifecycle| -> BTreeSet<NodeId> {
                        x.slots()[1..].iter().filter(|s| s.record().state == state).map(|s| s.record().id).collect()
                    };
                    proptest::prop_assert_eq!(&x.tombstones, &in_state(Lifecycle::Left));
                    proptest::prop_assert_eq!(&x.downs, &in_state(Lifecycle::Down));
                }
                proptest::prop_assert!(w
                    .slots()
                    .iter()
                    .all(|s| !matches!(s.record().state, Lifecycle::Left | Lifecycle::Down) || s.age(now) < ttl));
                let all: Vec<u16> = (0..BUCKETS as u16).collect();
                let numbered: Vec<u32> = (0..w.len() as u32).collect();
                let mut listed = w.slots_in_buckets(BUCKETS, &all);
                listed.sort();
                proptest::prop_assert_eq!(listed, numbered);
                // Each slot is listed once, in its own bucket.
                let mut each = 0;
                for b in all.iter().copied() {
                    for n in w.by_bucket.iter(usize::from(b)) {
                        proptest::prop_assert_eq!(bucket_of(&w.slots()[n as usize].record().id, BUCKETS), usize::from(b));
                        each += 1;
                    }
                }
                proptest::prop_assert_eq!(each, w.len());
                for (i, s) in w.slots().iter().enumerate() {
                    proptest::prop_assert_eq!(w.slot_number(&s.record().id), Some(i as u32));
                }
                for (x, name) in [&r, &w].into_iter().flat_map(|x| names.map(|name| (x, name))) {
                    let mut listed = x.serving(name).to_vec();
                    listed.sort();
                    let mut expected: Vec<NodeId> = x
                        .slots()
                        .iter()
                        .filter(|s| s.is_routable() && s.record().models.as_slice().iter().any(|m| m.name == name))
                        .map(|s| s.record().id)
                        .collect();
                    expected.sort();
                    proptest::prop_assert_eq!(listed, expected, "hosts of {}", name);
                }
                for x in [&r, &w] {
                    let mut expected: Vec<&str> =
                        names.into_iter().filter(|name| !x.serving(name).is_empty()).collect();
                    expected.sort_unstable();
                    proptest::prop_assert_eq!(x.routable_models(), expected);
                }
            }
        }
    }
}
