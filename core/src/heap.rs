//! Where a node's memory goes: the heap bytes of its tables, by table ([`HeapBytes`]).

use core::mem::size_of;
use core::ops::{Add, AddAssign};

/// A node's heap bytes by table.
///
/// A simulator of 10,000 nodes holds 10^8 member entries, so a byte per entry is 100 MB; this
/// is how to see which table the bytes are in before making one smaller. [`Node::heap_bytes`]
/// adds up, for each table, what its allocations hold (capacity, not length: the slack of a
/// grown `Vec` or hash table is memory too), from the sizes of the types it stores. It is an
/// estimate of the allocator's view (allocator headers and B-tree node fill are modelled, not
/// read), costs a walk over the node's small tables and none over its member entries, and
/// changes nothing. Records themselves are not counted here: a replica holds them through
/// shared handles ([`SharedRecord`](crate::SharedRecord)), and a pool shared by many nodes
/// ([`crate::Interner`]) is the owner's to count.
///
/// [`Node::heap_bytes`]: crate::Node::heap_bytes
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapBytes {
    /// The replica's slots: one per member, a handle to its record and its local state.
    pub replica_slots: u64,
    /// The replica's index from id to slot.
    pub replica_index: u64,
    /// The replica's anti-entropy buckets: hashes and slot numbers by bucket.
    pub replica_buckets: u64,
    /// The replica's routable hosts by model.
    pub replica_hosts: u64,
    /// The replica's tombstones, DOWN set and GC watermark.
    pub replica_other: u64,
    /// The failure detector's member table: incarnation and standing per member, by the
    /// replica's slot number.
    pub members: u64,
    /// Suspicions held: timers, suspecters, and the vouchers and leases of an anchor.
    pub suspicions: u64,
    /// The gossip queues of records and suspicions.
    pub queues: u64,
    /// Everything else the node holds: fetches, answers owed, outputs, connections.
    pub other: u64,
}

impl HeapBytes {
    /// All of it.
    pub fn total(&self) -> u64 {
        self.fields().iter().map(|(_, n)| n).sum()
    }

    /// Every table with its name, in the order of the fields.
    pub fn fields(&self) -> [(&'static str, u64); 9] {
        [
            ("replica_slots", self.replica_slots),
            ("replica_index", self.replica_index),
            ("replica_buckets", self.replica_buckets),
            ("replica_hosts", self.replica_hosts),
            ("replica_other", self.replica_other),
            ("members", self.members),
            ("suspicions", self.suspicions),
            ("queues", self.queues),
            ("other", self.other),
        ]
    }
}

impl AddAssign for HeapBytes {
    fn add_assign(&mut self, o: HeapBytes) {
        self.replica_slots += o.replica_slots;
        self.replica_index += o.replica_index;
        self.replica_buckets += o.replica_buckets;
        self.replica_hosts += o.replica_hosts;
        self.replica_other += o.replica_other;
        self.members += o.members;
        self.suspicions += o.suspicions;
        self.queues += o.queues;
        self.other += o.other;
    }
}

impl Add for HeapBytes {
    type Output = HeapBytes;
    fn add(mut self, o: HeapBytes) -> HeapBytes {
        self += o;
        self
    }
}

impl core::iter::Sum for HeapBytes {
    fn sum<I: Iterator<Item = HeapBytes>>(iter: I) -> HeapBytes {
        iter.fold(HeapBytes::default(), Add::add)
    }
}

/// Bytes of `capacity` elements of `T` in one allocation (a `Vec`, a `VecDeque`, a boxed
/// slice).
pub(crate) fn array<T>(capacity: usize) -> u64 {
    if capacity == 0 {
        0
    } else {
        (capacity * size_of::<T>()) as u64
    }
}

/// Bytes of a hashbrown table (or a `HashMap`, `HashSet` over one) of `T` able to hold
/// `capacity` items: a power of two of buckets, at most 7/8 full, each one `T` and one
/// control byte, plus a group of control bytes.
pub(crate) fn hash_table<T>(capacity: usize) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let buckets =
        if capacity < 8 { (capacity + 1).next_power_of_two() } else { (capacity * 8 / 7).next_power_of_two() };
    (buckets * (size_of::<T>() + 1) + 16) as u64
}

/// A hash table that has emptied to a quarter of what it can hold gives half its room back
/// (not below room for [`ROOM_KEPT`] items).
///
/// A hashbrown table keeps the room of its largest size for good. The tables a partition
/// fills at once (a node's suspicions of everyone across the cut, the records it fetches
/// after the heal) would otherwise stay that large in every node; at 10,000 nodes that is
/// gigabytes held through the heal. Halving at a quarter is amortized `O(1)` a removal. Only
/// for tables whose iteration order nothing observable depends on: shrinking rehashes.
pub(crate) fn give_back_room<K: Eq + core::hash::Hash, V, S: core::hash::BuildHasher>(
    table: &mut hashbrown::HashMap<K, V, S>,
) {
    let room = table.capacity();
    if room > ROOM_KEPT && table.len() <= room / 4 {
        table.shrink_to(table.len() * 2);
    }
}

/// Room [`give_back_room`] leaves a table however few items are left.
pub(crate) const ROOM_KEPT: usize = 64;

/// Bytes of a `BTreeMap` or `BTreeSet` of `len` entries of `T`: nodes of eleven entries, about
/// two thirds full, each with a small header (internal nodes' child pointers are a tenth more).
pub(crate) fn btree<T>(len: usize) -> u64 {
    if len == 0 {
        return 0;
    }
    let nodes = len.div_ceil(7);
    (nodes * (11 * size_of::<T>() + 16)) as u64 * 11 / 10
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_gives_back_its_room_as_it_empties_and_only_then() {
        let mut table: hashbrown::HashMap<u32, u64> = (0..10_000).map(|k| (k, 0)).collect();
        let full = table.capacity();
        for k in 0..5_000 {
            table.remove(&k);
            give_back_room(&mut table);
        }
        // (A removal may leave a tombstone, which hashbrown counts out of the room left.)
        assert!(table.capacity() > full * 3 / 4, "half full: the room stays ({} of {full})", table.capacity());
        for k in 5_000..9_990 {
            table.remove(&k);
            give_back_room(&mut table);
            assert!(table.len() >= table.capacity() / 8 || table.capacity() <= 2 * ROOM_KEPT);
        }
        assert!(table.capacity() <= 4 * ROOM_KEPT, "{} of room for 10 items", table.capacity());
        assert_eq!(table.keys().copied().collect::<std::collections::BTreeSet<_>>(), (9_990..10_000).collect());
        table.clear();
        give_back_room(&mut table);
        assert!(table.capacity() <= ROOM_KEPT);
    }

    #[test]
    fn estimates_follow_the_layouts() {
        assert_eq!(array::<u32>(0), 0);
        assert_eq!(array::<u32>(10), 40);
        // 14 items need 16 buckets at 7/8; 16 items need 32.
        assert_eq!(hash_table::<u32>(14), 16 * 5 + 16);
        assert_eq!(hash_table::<u32>(16), 32 * 5 + 16);
        assert_eq!(hash_table::<u32>(3), 4 * 5 + 16);
        assert_eq!(btree::<u64>(0), 0);
        assert!(btree::<u64>(700) > 700 * 8, "a B-tree holds more than its entries");
    }

    #[test]
    fn totals_add_every_table() {
        let mut a = HeapBytes { replica_slots: 1, members: 2, other: 3, ..HeapBytes::default() };
        assert_eq!(a.total(), 6);
        a += HeapBytes { queues: 4, ..HeapBytes::default() };
        assert_eq!(a.total(), 10);
        let sum: HeapBytes = [a, a].into_iter().sum();
        assert_eq!(sum.total(), 20);
        assert_eq!(sum.fields().len(), 9);
    }
}
