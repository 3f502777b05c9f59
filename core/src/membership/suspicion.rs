//! Suspicions beyond the detector: a suspicion queued for piggybacking ([`QueuedSuspicion`]),
//! a piggybacked one taken in (refuted when it is about this node, answered with the newer
//! record when it is stale here), and a node held DOWN told so when it talks to us, so that it
//! refutes.

use crate::answers::Answer;
use crate::broadcast::Update;
use crate::id::NodeId;
use crate::node::Node;
use crate::record::{Lifecycle, SharedRecord};
use crate::swim::Rumor;
use crate::wire::Piggyback;
use core::time::Duration;

/// How often a node tells the members it suspects, directly, that it does; most suspects told at
/// once. The epidemic may miss a suspect (outbound-only members hear only from their anchors), and
/// a suspect that does not hear of its suspicion cannot refute it.
pub(super) const NOTICE_INTERVAL: Duration = Duration::from_secs(1);
pub(super) const MAX_NOTICES: usize = 4;

/// A suspicion queued for piggybacking. Encoded when sent, not kept encoded: while a partition
/// runs every node queues one for each member cut off, and the encoding would double the item.
#[derive(Clone, Debug)]
pub(super) struct QueuedSuspicion {
    id: NodeId,
    generation: u64,
    heartbeat: u64,
    from: NodeId,
    encoded_len: u8,
}

impl QueuedSuspicion {
    pub(super) fn new(id: NodeId, generation: u64, heartbeat: u64, from: NodeId) -> QueuedSuspicion {
        let mut q = QueuedSuspicion { id, generation, heartbeat, from, encoded_len: 0 };
        // At most 53 bytes: a tag, two ids and two varints.
        let len = postcard::experimental::serialized_size(&q.piggyback()).unwrap_or(usize::MAX);
        q.encoded_len = u8::try_from(len).unwrap_or(u8::MAX);
        q
    }

    pub(super) fn piggyback(&self) -> Piggyback {
        Piggyback::Suspect { id: self.id, generation: self.generation, heartbeat: self.heartbeat, from: self.from }
    }
}

impl Update for QueuedSuspicion {
    fn key(&self) -> NodeId {
        self.id
    }

    /// A later generation or heartbeat covers an earlier one; at the same version only the same
    /// suspecter does: suspicions from different suspecters replace each other, which is what
    /// carries Lifeguard's independent confirmations.
    fn covers(&self, other: &Self) -> bool {
        (self.generation, self.heartbeat) > (other.generation, other.heartbeat)
            || ((self.generation, self.heartbeat) == (other.generation, other.heartbeat) && self.from == other.from)
    }

    fn encoded_len(&self, _sends: u32) -> usize {
        usize::from(self.encoded_len)
    }
}

impl Node {
    /// A piggybacked suspicion of `id` at `(generation, heartbeat)` raised by `from`. Returns the
    /// record that answers it when the suspicion is stale here (we hold, or are, a later version):
    /// the sender has missed a refutation, and telling it directly is cheaper than letting its
    /// suspicion run out.
    pub(super) fn on_suspicion(
        &mut self,
        id: NodeId,
        generation: u64,
        heartbeat: u64,
        from: NodeId,
    ) -> Option<SharedRecord> {
        if id == self.config.id {
            let own = self.replica.local().clone();
            if own.state == Lifecycle::Left {
                return None;
            }
            // A suspicion of a generation above ours names a record nobody can hold unless
            // we signed it (an earlier process of ours): that record, if it exists, makes us
            // refute when it arrives. Suspicions are not signed, so this one is only answered.
            if generation == own.generation && heartbeat >= own.heartbeat {
                // Alive at a higher incarnation: the record at the new heartbeat refutes it.
                self.stats.suspicions_refuted += 1;
                self.update_local(|r| r.heartbeat = r.heartbeat.max(heartbeat));
                self.membership.detector.note_refuted();
            }
            return Some(self.replica.local().clone());
        }
        let held = self.replica.get(&id).map(|s| s.record().clone())?;
        if (held.generation, held.heartbeat) > (generation, heartbeat) {
            return Some(held);
        }
        let now = self.now;
        let st = &mut self.membership;
        if held.generation != generation {
            return None; // a generation we do not hold yet: its record will tell more
        }
        if st.detector.on_suspect_gossip(&self.replica, now, id, heartbeat, from) == Rumor::Spread {
            st.suspicions.push(QueuedSuspicion::new(id, generation, heartbeat, from));
        }
        None
    }

    /// `from` sent us something while we hold it DOWN in its current generation: if it does not
    /// know (it was confirmed failed while cut off), its DOWN record makes it refute at once.
    /// Draining nodes know, so each node is told at most once per [`NOTICE_INTERVAL`].
    pub(super) fn tell_if_down(&mut self, from: NodeId) {
        // The set of DOWN ids is small (usually empty): no registry lookup per message.
        if !self.replica.down_ids().contains(&from) {
            return;
        }
        let Some(record) = self.replica.get(&from).map(|s| s.record().clone()) else { return };
        let now = self.now;
        let st = &mut self.membership;
        if st.told_down.iter().any(|(id, at)| *id == from && now < *at + NOTICE_INTERVAL) {
            return;
        }
        st.told_down.retain(|(id, at)| *id != from && now < *at + NOTICE_INTERVAL);
        st.told_down.push((from, now));
        if self.answer(from, Answer::Records(&[record])) {
            self.stats.down_notices += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suspicion(heartbeat: u64, from: u64) -> QueuedSuspicion {
        QueuedSuspicion::new(NodeId::from_u64(7), 3, heartbeat, NodeId::from_u64(from))
    }

    #[test]
    fn suspicions_are_superseded_by_later_versions_and_replaced_by_other_suspecters() {
        assert!(suspicion(5, 1).covers(&suspicion(4, 2)));
        assert!(suspicion(5, 1).covers(&suspicion(5, 1)));
        assert!(!suspicion(5, 1).covers(&suspicion(5, 2)), "another suspecter is a confirmation");
        assert!(!suspicion(4, 1).covers(&suspicion(5, 1)));
        let s = suspicion(5, 1);
        let expected =
            Piggyback::Suspect { id: NodeId::from_u64(7), generation: 3, heartbeat: 5, from: NodeId::from_u64(1) };
        assert_eq!(s.piggyback(), expected);
        assert_eq!(
            s.encoded_len(0),
            crate::wire::encode_piggyback(&expected).len(),
            "the budget counts the sent bytes"
        );
        let big = QueuedSuspicion::new(NodeId([0xff; 16]), u64::MAX, u64::MAX, NodeId([0xff; 16]));
        assert_eq!(big.encoded_len(0), 53, "the longest suspicion fits its length byte");
    }
}
