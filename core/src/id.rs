//! Node identity.

use core::fmt;
use core::hash::BuildHasher;
use foldhash::fast::FixedState;
use hashbrown::HashTable;
use serde::{Deserialize, Serialize};

/// A node's identity in the federation: 16 bytes, stable across restarts of the same node.
///
/// The runtime derives it from the node's persistent identity key; the simulator and the tests
/// derive it from a number with [`NodeId::from_u64`]. The core treats it as opaque.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct NodeId(pub [u8; 16]);

impl NodeId {
    /// A deterministic id for tests and simulations: `n` in the last eight bytes, big-endian.
    pub const fn from_u64(n: u64) -> NodeId {
        let b = n.to_be_bytes();
        NodeId([0, 0, 0, 0, 0, 0, 0, 0, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    }

    /// All sixteen bytes as 32 lowercase hex digits (the display form is shortened).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses the 32 hex digits [`NodeId::to_hex`] writes; anything else is `None`.
    pub fn from_hex(text: &str) -> Option<NodeId> {
        let text = text.as_bytes();
        if text.len() != 32 {
            return None;
        }
        let digit = |c: u8| (c as char).to_digit(16).and_then(|d| u8::try_from(d).ok());
        let mut id = [0u8; 16];
        for (byte, pair) in id.iter_mut().zip(text.chunks_exact(2)) {
            *byte = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Some(NodeId(id))
    }

    /// The first eight bytes as a number; cheap to hash and to print.
    pub fn short(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[8..]);
        u64::from_be_bytes(b)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Eight hex digits are enough to tell nodes apart in logs and tables.
        for b in &self.0[..2] {
            write!(f, "{b:02x}")?;
        }
        for b in &self.0[14..] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId(")?;
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// Where a node's tables find members by number: the replica's slots
/// ([`crate::replica::Replica`]). The failure detector keeps its per-member state at these
/// numbers and reads ids from here, so it holds neither the 16-byte id again nor an index of
/// its own: at 10,000 members on each of 10,000 nodes, that was 2.9 GB of a simulation.
pub(crate) trait Directory {
    /// The number at which `id` is held, if it is.
    fn number(&self, id: &NodeId) -> Option<u32>;
    /// The id held at `n`; panics unless something is held there.
    fn id(&self, n: u32) -> NodeId;
}

/// A directory for tests: [`NodeId::from_u64`]`(n)` is held at number `n`, for every `n` below
/// 2^20.
#[cfg(test)]
pub(crate) struct Numbered;

#[cfg(test)]
impl Directory for Numbered {
    fn number(&self, id: &NodeId) -> Option<u32> {
        let n = u32::try_from(id.short()).ok().filter(|&n| n < 1 << 20)?;
        (*id == self.id(n)).then_some(n)
    }

    fn id(&self, n: u32) -> NodeId {
        NodeId::from_u64(u64::from(n))
    }
}

/// Numbers (positions in the owner's own table) found by id, where the owner's table already
/// holds the id at each number: an entry is the 4-byte number alone, where a map from id to
/// number would take 20 bytes. Every node of a 10,000-node federation keeps such an index for
/// every node (the replica's slots).
///
/// Each call is given `id_at`, the owner's id at a number (`None` for a hole its table keeps).
#[derive(Clone, Debug, Default)]
pub(crate) struct IdIndex {
    table: HashTable<u32>,
    hasher: FixedState,
}

impl IdIndex {
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// Heap bytes of the index ([`crate::heap`]).
    pub(crate) fn heap_bytes(&self) -> u64 {
        crate::heap::hash_table::<u32>(self.table.capacity())
    }

    /// The number at which the owner holds `id`.
    pub(crate) fn find(&self, id: &NodeId, id_at: impl Fn(u32) -> Option<NodeId>) -> Option<u32> {
        self.table.find(self.hasher.hash_one(id), |&n| id_at(n) == Some(*id)).copied()
    }

    /// Indexes `id`, which the owner now holds at `n` and did not hold before.
    pub(crate) fn insert(&mut self, id: NodeId, n: u32, id_at: impl Fn(u32) -> Option<NodeId>) {
        let hasher = &self.hasher;
        self.table.insert_unique(hasher.hash_one(id), n, |&m| id_at(m).map_or(0, |id| hasher.hash_one(id)));
    }

    /// Forgets `id`, which the owner holds at `n` (no need to look at the owner's table).
    pub(crate) fn forget(&mut self, id: &NodeId, n: u32) {
        if let Ok(entry) = self.table.find_entry(self.hasher.hash_one(id), |&m| m == n) {
            entry.remove();
        }
    }

    /// The owner moved `id` from number `from` to `to`.
    pub(crate) fn renumber(&mut self, id: &NodeId, from: u32, to: u32) {
        if let Some(n) = self.table.find_mut(self.hasher.hash_one(id), |&n| n == from) {
            *n = to;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_index_follows_its_owners_table() {
        let mut ids: Vec<NodeId> = (0..50).map(NodeId::from_u64).collect();
        let mut ix = IdIndex::default();
        for (n, id) in ids.iter().enumerate() {
            ix.insert(*id, n as u32, |m| ids.get(m as usize).copied());
        }
        let at = |ids: &[NodeId], m: u32| ids.get(m as usize).copied();
        assert_eq!(ix.find(&NodeId::from_u64(7), |m| at(&ids, m)), Some(7));
        assert_eq!(ix.find(&NodeId::from_u64(99), |m| at(&ids, m)), None);
        // The owner drops 7 by moving its last entry into the hole, as a swap-remove does.
        ix.forget(&NodeId::from_u64(7), 7);
        ids.swap_remove(7);
        ix.renumber(&NodeId::from_u64(49), 49, 7);
        // Forgetting by number: the last one, whose number the owner knows.
        ix.forget(&NodeId::from_u64(48), 48);
        ids.pop();
        assert_eq!((ix.len(), ix.find(&NodeId::from_u64(7), |m| at(&ids, m))), (48, None));
        assert_eq!(ix.find(&NodeId::from_u64(48), |m| at(&ids, m)), None);
        for (n, id) in ids.iter().enumerate() {
            assert_eq!(ix.find(id, |m| at(&ids, m)), Some(n as u32), "{id:?}");
        }
    }

    #[test]
    fn ids_from_numbers_are_distinct_and_ordered() {
        assert!(NodeId::from_u64(1) < NodeId::from_u64(2));
        assert_eq!(NodeId::from_u64(7).short(), 7);
        assert_eq!(NodeId::from_u64(0x1234).to_string(), "00001234");
    }

    #[test]
    fn hex_round_trips_and_refuses_anything_else() {
        let id = NodeId(core::array::from_fn(|i| (i as u8).wrapping_mul(37)));
        assert_eq!(NodeId::from_hex(&id.to_hex()), Some(id));
        assert_eq!(NodeId::from_hex(&id.to_hex().to_uppercase()), Some(id));
        assert_eq!(NodeId::from_hex("00"), None);
        assert_eq!(NodeId::from_hex(&"g".repeat(32)), None);
        assert_eq!(NodeId::from_hex(&"é".repeat(16)), None);
    }
}
