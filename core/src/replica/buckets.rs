//! The replica's slot numbers by anti-entropy bucket, as one linked list per bucket: a head per
//! bucket and, per slot, the number of the next slot in its bucket. That is 4 bytes a slot and
//! 4 KB in all, where a vector per bucket cost 24 bytes of header for each of the 1,024 buckets
//! plus room to grow in every one (83 KB a node at 10,000 nodes, 52 KB now). Lists are walked in
//! no particular order: [`Replica::slots_in_buckets`](super::Replica::slots_in_buckets) sorts
//! what it gathers.

use super::BUCKETS;

/// The end of a list.
const END: u32 = u32::MAX;

/// Slot numbers by bucket ([`BUCKETS`] of them).
#[derive(Clone, Debug)]
pub(super) struct BucketLists {
    /// Per bucket, its first slot number, or [`END`].
    heads: Box<[u32; BUCKETS]>,
    /// Per slot number, the next slot number in the same bucket, or [`END`].
    next: Vec<u32>,
}

impl Default for BucketLists {
    fn default() -> BucketLists {
        BucketLists { heads: Box::new([END; BUCKETS]), next: Vec::new() }
    }
}

impl BucketLists {
    /// Heap bytes of the lists ([`crate::heap`]).
    pub(super) fn heap_bytes(&self) -> u64 {
        crate::heap::array::<u32>(BUCKETS) + crate::heap::array::<u32>(self.next.capacity())
    }

    /// Lists slot `n`, the next slot number of all (one more than the last listed), in `bucket`.
    pub(super) fn push(&mut self, bucket: usize, n: u32) {
        debug_assert_eq!(n as usize, self.next.len(), "slots are numbered in order");
        crate::reserve_one(&mut self.next);
        self.next.push(self.heads[bucket]);
        self.heads[bucket] = n;
    }

    /// The slot numbers listed in `bucket`.
    pub(super) fn iter(&self, bucket: usize) -> impl Iterator<Item = u32> + '_ {
        let first = Some(self.heads[bucket]).filter(|&n| n != END);
        core::iter::successors(first, |&n| Some(self.next[n as usize]).filter(|&m| m != END))
    }

    /// Follows a slot's `Vec::swap_remove`: slot `i` leaves `bucket`, and the last slot, if it
    /// was not `i`, is now numbered `i` (it is in `moved_bucket`).
    pub(super) fn swap_remove(&mut self, bucket: usize, i: u32, moved_bucket: Option<usize>) {
        let after = self.next[i as usize];
        self.redirect(bucket, i, after);
        let last = (self.next.len() - 1) as u32;
        self.next.swap_remove(i as usize);
        if let Some(moved) = moved_bucket {
            debug_assert_ne!(i, last, "a slot moved only when the removed one was not the last");
            self.redirect(moved, last, i);
        }
    }

    /// Makes whatever points at slot `from` in `bucket` (its head or a slot's next) point at `to`.
    fn redirect(&mut self, bucket: usize, from: u32, to: u32) {
        if self.heads[bucket] == from {
            self.heads[bucket] = to;
            return;
        }
        let mut k = self.heads[bucket];
        while k != END {
            let next = &mut self.next[k as usize];
            if *next == from {
                *next = to;
                return;
            }
            k = *next;
        }
        debug_assert!(false, "slot {from} is not listed in bucket {bucket}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    proptest::proptest! {
        /// Against a plain set per bucket: whatever pushes and swap-removes happen, each bucket
        /// lists exactly its slots, each once.
        #[test]
        fn lists_follow_pushes_and_swap_removes(ops in proptest::collection::vec((0usize..4, proptest::bool::ANY, 0usize..64), 1..200)) {
            let mut lists = BucketLists::default();
            // The bucket of each slot, by slot number, as a Vec with swap_remove would hold it.
            let mut model: Vec<usize> = Vec::new();
            for (bucket, remove, pick) in ops {
                if remove && !model.is_empty() {
                    let i = pick % model.len();
                    let gone = model.swap_remove(i);
                    lists.swap_remove(gone, i as u32, model.get(i).copied());
                } else {
                    lists.push(bucket, model.len() as u32);
                    model.push(bucket);
                }
                for b in 0..4 {
                    let listed: Vec<u32> = lists.iter(b).collect();
                    let set: BTreeSet<u32> = listed.iter().copied().collect();
                    proptest::prop_assert_eq!(set.len(), listed.len(), "listed twice in bucket {}", b);
                    let expected: BTreeSet<u32> = (0..model.len() as u32).filter(|&n| model[n as usize] == b).collect();
                    proptest::prop_assert_eq!(set, expected, "bucket {}", b);
                }
            }
        }
    }
}
