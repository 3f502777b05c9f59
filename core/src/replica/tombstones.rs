//! Tombstones: LEFT and DOWN records are kept while they spread, stop being advertised at half
//! their lifetime and are deleted at its end, leaving a watermark that refuses their return.

use super::{bucket_of, view_hash, Replica, BUCKETS};
use crate::id::NodeId;
use crate::record::Lifecycle;
use crate::time::Time;
use core::time::Duration;

/// What [`Replica::collect_tombstones`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Collected {
    /// Tombstones that stopped being advertised.
    pub retired: usize,
    /// Tombstones deleted.
    pub deleted: usize,
    /// Watermark entries forgotten.
    pub forgotten: usize,
}

impl Replica {
    /// Ages LEFT records, which are tombstones keyed by (node, generation), and DOWN ones alike
    /// (a node held DOWN that long is gone; Serf reaps failed members the same way): one that
    /// has been LEFT or DOWN here for `ttl / 2` is retired — left out of the anti-entropy hashes
    /// and entries, so nobody advertises it any more — and one unchanged for `ttl` is deleted,
    /// its generation kept in the GC watermark for another `ttl` so that a stale peer's copy is
    /// refused rather than merged back. `ttl` must be far longer than the longest partition
    /// expected to heal: a node cut off for longer comes back only in a new generation.
    ///
    /// Looks only at the LEFT and DOWN records, not at every slot. A deletion moves the last
    /// slot into the deleted one's place; `moved(from, to)` is told of each such move, so that
    /// tables kept by slot number ([`crate::id::Directory`]) can follow.
    pub(crate) fn collect_tombstones(
        &mut self,
        now: Time,
        ttl: Duration,
        mut moved: impl FnMut(u32, u32),
    ) -> Collected {
        let mut done = Collected::default();
        let half = ttl / 2;
        let due: Vec<NodeId> = self
            .tombstones
            .iter()
            .chain(&self.downs)
            .filter(|id| self.get(id).is_some_and(|slot| slot.age(now) >= half))
            .copied()
            .collect();
        for id in due {
            // Looked up afresh: each deletion moves the last slot into the deleted one's place.
            let Some(i) = self.position(&id) else { continue };
            let slot = &self.slots[i];
            if !slot.is_retired() {
                self.buckets[bucket_of(&id, BUCKETS)] ^= slot.sync_hash();
                self.slots[i].set(super::RETIRED, true);
                done.retired += 1;
            }
            let slot = &self.slots[i];
            if slot.age(now) < ttl {
                continue;
            }
            let generation = slot.record.generation;
            self.tombstones.remove(&id);
            self.downs.remove(&id);
            self.view ^= view_hash(&slot.record);
            self.deleted.insert(id, (generation, now));
            let last = (self.slots.len() - 1) as u32;
            self.index.forget(&id, i as u32);
            // LEFT or DOWN, so listed under no model; the slot moved into its place may be.
            debug_assert!(!self.slots[i].is_routable());
            self.slots.swap_remove(i);
            let moved_slot = self.slots.get(i);
            self.by_bucket.swap_remove(
                bucket_of(&id, BUCKETS),
                i as u32,
                moved_slot.map(|m| bucket_of(&m.record.id, BUCKETS)),
            );
            if let Some(m) = moved_slot {
                moved(last, i as u32);
                self.index.renumber(&m.record.id, last, i as u32);
                let renumber = |list: &mut Vec<u32>| {
                    if let Some(s) = list.iter_mut().find(|s| **s == last) {
                        *s = i as u32;
                    }
                };
                if m.is_routable() {
                    for m in m.record.models.as_slice() {
                        if let Some(list) = self.hosts.get_mut(m.name.as_str()) {
                            renumber(list);
                        }
                    }
                }
            }
            done.deleted += 1;
        }
        let before = self.deleted.len();
        self.deleted.retain(|_, (_, at)| *at + ttl > now);
        done.forgotten = before - self.deleted.len();
        done
    }

    /// Keeps `id` in `tombstones` exactly while its stored record is LEFT and in `downs` while
    /// it is DOWN, given the stored state before and after a merge (each set is touched only
    /// when either state is its own). [`Replica::collect_tombstones`], which deletes slots,
    /// takes the deleted ids out of both.
    pub(super) fn note_state(&mut self, id: NodeId, before: Option<Lifecycle>, after: Lifecycle) {
        if id == self.local || before == Some(after) {
            return;
        }
        for (state, set) in [(Lifecycle::Left, &mut self.tombstones), (Lifecycle::Down, &mut self.downs)] {
            if after == state {
                set.insert(id);
            } else if before == Some(state) {
                set.remove(&id);
            }
        }
    }
}
