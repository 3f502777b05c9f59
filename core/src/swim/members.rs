//! The detector's member table: every member's entry once, in a slab, found through an index of
//! 4-byte slab numbers. Every node of a 10,000-node federation holds one with 10,000 entries,
//! and the probe order refers to members by slab number, so neither repeats the 16-byte id.

use super::Member;
use crate::id::{IdIndex, NodeId};

#[derive(Clone, Debug)]
struct Entry {
    id: NodeId,
    member: Member,
}

/// Members by id, each with a slab number that stays its own until it is removed.
#[derive(Clone, Debug, Default)]
pub(super) struct Members {
    /// The entries; `None` where `free` lists a hole.
    slab: Vec<Option<Entry>>,
    free: Vec<u32>,
    /// Slab numbers by the id in the entry.
    index: IdIndex,
}

/// The id in slab entry `n`, if it holds one.
fn id_in(slab: &[Option<Entry>], n: u32) -> Option<NodeId> {
    slab.get(n as usize)?.as_ref().map(|e| e.id)
}

impl Members {
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    /// Adds the heap bytes of the table and its index to `heap` ([`crate::heap`]).
    pub(super) fn heap_bytes(&self, heap: &mut crate::heap::HeapBytes) {
        heap.members +=
            crate::heap::array::<Option<Entry>>(self.slab.capacity()) + crate::heap::array::<u32>(self.free.capacity());
        heap.members_index += self.index.heap_bytes();
    }

    /// The slab number of `id`.
    pub(super) fn number(&self, id: &NodeId) -> Option<u32> {
        self.index.find(id, |n| id_in(&self.slab, n))
    }

    pub(super) fn contains_key(&self, id: &NodeId) -> bool {
        self.number(id).is_some()
    }

    pub(super) fn get(&self, id: &NodeId) -> Option<&Member> {
        self.number(id).map(|n| self.at(n))
    }

    pub(super) fn get_mut(&mut self, id: &NodeId) -> Option<&mut Member> {
        let n = self.number(id)?;
        Some(self.at_mut(n))
    }

    /// The id of the member numbered `n`; panics on a hole.
    pub(super) fn id(&self, n: u32) -> NodeId {
        self.entry(n).id
    }

    /// The member numbered `n`; panics on a hole.
    pub(super) fn at(&self, n: u32) -> &Member {
        &self.entry(n).member
    }

    /// The member numbered `n`, to change; panics on a hole.
    pub(super) fn at_mut(&mut self, n: u32) -> &mut Member {
        &mut self.slab[n as usize].as_mut().expect("a member number names a member").member
    }

    fn entry(&self, n: u32) -> &Entry {
        self.slab[n as usize].as_ref().expect("a member number names a member")
    }

    /// Adds `id`, which must not be a member yet; returns its number.
    pub(super) fn insert(&mut self, id: NodeId, member: Member) -> u32 {
        debug_assert!(!self.contains_key(&id));
        let n = crate::slab_insert(&mut self.slab, &mut self.free, Entry { id, member });
        let slab = &self.slab;
        self.index.insert(id, n, |m| id_in(slab, m));
        n
    }

    /// Removes `id`; returns the number it had.
    pub(super) fn remove(&mut self, id: &NodeId) -> Option<u32> {
        let slab = &self.slab;
        let n = self.index.remove(id, |m| id_in(slab, m))?;
        self.slab[n as usize] = None;
        self.free.push(n);
        Some(n)
    }

    /// Every member with its id, in slab order.
    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = (NodeId, &Member)> {
        self.slab.iter().flatten().map(|e| (e.id, &e.member))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swim::Standing;

    fn member(incarnation: u64) -> Member {
        Member { incarnation: incarnation.to_le_bytes(), probeable: true, standing: Standing::Alive }
    }

    #[test]
    fn a_member_entry_has_no_padding() {
        // Every node of a 10,000-node federation holds 10,000 of them.
        assert_eq!(core::mem::size_of::<Option<Entry>>(), 26);
    }

    #[test]
    fn numbers_stay_put_and_holes_are_reused() {
        let mut t = Members::default();
        let ids: Vec<NodeId> = (0..100).map(NodeId::from_u64).collect();
        for (k, id) in ids.iter().enumerate() {
            assert_eq!(t.insert(*id, member(k as u64)), k as u32);
        }
        assert_eq!(t.remove(&ids[7]), Some(7));
        assert_eq!(t.remove(&ids[7]), None);
        assert!(!t.contains_key(&ids[7]));
        for (k, id) in ids.iter().enumerate().filter(|(k, _)| *k != 7) {
            let n = t.number(id).expect("still a member");
            assert_eq!((n, t.id(n), t.at(n).incarnation()), (k as u32, *id, k as u64));
        }
        assert_eq!(t.insert(NodeId::from_u64(500), member(500)), 7, "the hole is filled first");
        assert_eq!(t.insert(NodeId::from_u64(501), member(501)), 100);
        assert_eq!((t.len(), t.iter().count()), (101, 101));
        t.get_mut(&NodeId::from_u64(500)).expect("a member").standing = Standing::Suspect;
        assert_eq!(t.get(&NodeId::from_u64(500)).map(|m| m.standing), Some(Standing::Suspect));
    }
}
