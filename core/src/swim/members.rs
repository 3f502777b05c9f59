//! The detector's member table: each member's standing, kept at the number the node's
//! [`Directory`] (the replica's slots) holds it at. Every node of a 10,000-node federation holds
//! one with 10,000 entries; keyed this way an entry is 10 bytes, with neither the 16-byte id
//! again nor an index of its own, and the probe passes walk members by the same numbers.

use super::Member;
use crate::id::{Directory, NodeId};

/// Members by directory number.
#[derive(Clone, Debug, Default)]
pub(super) struct Members {
    /// The entries by number; `None` where the directory's number is no member.
    table: Vec<Option<Member>>,
    len: usize,
}

impl Members {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// One more than the highest number the table has room for a member at (members are
    /// numbered below it).
    pub(super) fn span(&self) -> usize {
        self.table.len()
    }

    /// Adds the heap bytes of the table to `heap` ([`crate::heap`]).
    pub(super) fn heap_bytes(&self, heap: &mut crate::heap::HeapBytes) {
        heap.members += crate::heap::array::<Option<Member>>(self.table.capacity());
    }

    /// The number of member `id`.
    pub(super) fn number(&self, dir: &impl Directory, id: &NodeId) -> Option<u32> {
        dir.number(id).filter(|&n| self.has(n))
    }

    /// Whether number `n` is a member.
    pub(super) fn has(&self, n: u32) -> bool {
        self.table.get(n as usize).is_some_and(Option::is_some)
    }

    pub(super) fn contains_key(&self, dir: &impl Directory, id: &NodeId) -> bool {
        self.number(dir, id).is_some()
    }

    pub(super) fn get(&self, dir: &impl Directory, id: &NodeId) -> Option<&Member> {
        self.table.get(dir.number(id)? as usize)?.as_ref()
    }

    /// The member numbered `n`; panics unless it is one.
    pub(super) fn at(&self, n: u32) -> &Member {
        self.table[n as usize].as_ref().expect("a member number names a member")
    }

    /// The member numbered `n`, to change; panics unless it is one.
    pub(super) fn at_mut(&mut self, n: u32) -> &mut Member {
        self.table[n as usize].as_mut().expect("a member number names a member")
    }

    /// Makes number `n`, which must be no member yet, a member.
    pub(super) fn insert(&mut self, n: u32, member: Member) {
        let n = n as usize;
        if n >= self.table.len() {
            let more = n + 1 - self.table.len();
            if n >= self.table.capacity() {
                // The directory grows a slot at a time; grow as it does.
                self.table.reserve_exact(more.max(crate::growth(self.table.len())));
            }
            self.table.resize(n + 1, None);
        }
        debug_assert!(self.table[n].is_none());
        self.len += usize::from(self.table[n].is_none());
        self.table[n] = Some(member);
    }

    /// Removes the member numbered `n`; returns it.
    pub(super) fn remove(&mut self, n: u32) -> Option<Member> {
        let m = self.table.get_mut(n as usize)?.take()?;
        self.len -= 1;
        Some(m)
    }

    /// The directory moved whatever it held at `from` to `to`, where it held nothing any more:
    /// the member numbered `from`, if any, is numbered `to` now.
    pub(super) fn renumber(&mut self, from: u32, to: u32) {
        let member = self.table.get_mut(from as usize).and_then(Option::take);
        if let Some(slot) = self.table.get_mut(to as usize) {
            debug_assert!(slot.is_none(), "a number the directory gave up held a member");
            *slot = member;
        } else if let Some(member) = member {
            self.insert(to, member);
        }
        while self.table.last().is_some_and(Option::is_none) {
            self.table.pop();
        }
    }

    /// Every member with its number, in number order.
    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, &Member)> {
        self.table.iter().enumerate().filter_map(|(n, m)| Some((n as u32, m.as_ref()?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::Numbered;
    use crate::swim::Standing;

    fn member(incarnation: u64) -> Member {
        Member { incarnation: incarnation.to_le_bytes(), probeable: true, standing: Standing::Alive }
    }

    #[test]
    fn a_member_entry_is_ten_bytes() {
        // Every node of a 10,000-node federation holds 10,000 of them.
        assert_eq!(core::mem::size_of::<Option<Member>>(), 10);
    }

    #[test]
    fn members_are_found_through_the_directory_and_follow_its_moves() {
        let mut t = Members::default();
        for k in 0..100u32 {
            t.insert(k, member(u64::from(k)));
        }
        assert_eq!(t.remove(7).map(|m| m.incarnation()), Some(7));
        assert!(t.remove(7).is_none());
        let id = NodeId::from_u64;
        assert!(!t.contains_key(&Numbered, &id(7)));
        assert_eq!(t.number(&Numbered, &id(8)), Some(8));
        assert_eq!(t.get(&Numbered, &id(500)).map(Member::incarnation), None);
        // The directory deleted number 7 and moved 99 into it.
        t.renumber(99, 7);
        assert_eq!(t.get(&Numbered, &id(7)).map(Member::incarnation), Some(99));
        assert!(t.get(&Numbered, &id(99)).is_none());
        assert_eq!((t.len(), t.iter().count()), (99, 99));
        t.insert(500, member(500));
        t.at_mut(500).standing = Standing::Suspect;
        assert_eq!(t.at(500).standing, Standing::Suspect);
        assert_eq!(t.len(), 100);
    }
}
