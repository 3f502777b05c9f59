//! Suspicions beyond the detector: a suspicion queued for piggybacking ([`QueuedSuspicion`]),
//! a piggybacked one taken in (refuted when it is about this node, answered with the newer
//! record when it is stale here; ignored when a member held in doubt raised or passed it on,
//! taken as a sign of a healed cut when the doubt is mutual, and ignored when it was raised
//! before this node withdrew its suspicions), and a node held DOWN told so when it talks to us,
//! so that it refutes.

use crate::answers::Answer;
use crate::broadcast::Update;
use crate::id::NodeId;
use crate::node::Node;
use crate::record::{Lifecycle, SharedRecord};
use crate::swim::Rumor;
use crate::time::Time;
use crate::wire::{suspicion_age, suspicion_age_duration, Piggyback};
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
    /// When it was raised, on this node's timeline (now less the age it arrived with).
    raised: Time,
    /// The encoded length at the longest age: the age is a varint that grows as it is sent.
    encoded_len: u8,
}

// Millions are queued in a cut at 10,000 nodes.
const _: () = assert!(core::mem::size_of::<QueuedSuspicion>() <= 64);

impl QueuedSuspicion {
    pub(super) fn new(id: NodeId, generation: u64, heartbeat: u64, from: NodeId, raised: Time) -> QueuedSuspicion {
        let mut q = QueuedSuspicion { id, generation, heartbeat, from, raised, encoded_len: 0 };
        // At most 56 bytes: a tag, two ids and three varints.
        let oldest = q.piggyback(raised + suspicion_age_duration(u16::MAX));
        let len = postcard::experimental::serialized_size(&oldest).unwrap_or(usize::MAX);
        q.encoded_len = u8::try_from(len).unwrap_or(u8::MAX);
        q
    }

    /// The suspicion as sent at `now`.
    pub(super) fn piggyback(&self, now: Time) -> Piggyback {
        let (id, generation, heartbeat, from) = (self.id, self.generation, self.heartbeat, self.from);
        Piggyback::Suspect { id, generation, heartbeat, from, age: suspicion_age(now.saturating_since(self.raised)) }
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
    /// Whether this node holds `id` in doubt: suspected here, or DOWN in its current generation.
    pub(super) fn doubts(&self, id: &NodeId) -> bool {
        self.membership.suspects.contains(id) || self.replica.down_ids().contains(id)
    }

    /// Whether this node holds most of the federation in doubt (suspected, or DOWN in their
    /// current generation): it is cut off from the rest (or the rest failed), and what it
    /// suspects says more about where it stands than about them.
    pub(super) fn cut_off(&self) -> bool {
        let down = self.replica.down_ids().len();
        // Members DOWN here are no longer the detector's.
        let members = self.membership.detector.cluster_size() - 1 + down;
        members > 0 && 2 * (self.membership.suspects.len() + down) >= members
    }

    /// This node refuted a suspicion or a DOWN mark of itself. If it holds most members in doubt,
    /// the federation suspected it because it was cut off, and its own suspicions date from the
    /// cut: it withdraws them instead of making every member across the cut refute them.
    pub(crate) fn refuted(&mut self) {
        if self.cut_off() {
            self.withdraw_suspicions();
        }
    }

    /// Withdraws every suspicion this node holds, queued ones included
    /// ([`Swim::withdraw_suspicions`](crate::swim::Swim::withdraw_suspicions)). For a node that
    /// found its suspicions date from a cut that has healed.
    fn withdraw_suspicions(&mut self) {
        let now = self.now;
        self.membership.withdrawn = Some(now);
        if self.membership.suspects.is_empty() {
            return;
        }
        self.stats.suspicions_withdrawn += self.membership.suspects.len() as u64;
        let st = &mut self.membership;
        st.detector.withdraw_suspicions(&self.replica, now);
        st.suspicions.clear();
    }

    /// A suspicion of `id` at `(generation, heartbeat)` raised by `from`, piggybacked by
    /// `sender`. Returns the record that answers it when the suspicion is stale here (we hold, or
    /// are, a later version): the sender has missed a refutation, and telling it directly is
    /// cheaper than letting its suspicion run out.
    ///
    /// A suspicion that a node held in doubt here raised or passed on is not taken in: that node
    /// is likely cut off from us, and so from whomever it suspects (after a partition heals, each
    /// side holds the other in doubt and gossips suspicions of all of it).
    ///
    /// When such a suspicion names this node, the doubt is mutual, which a failure never makes
    /// (a failed node suspects no one): the two were cut off from each other, and the cut has
    /// healed, since the suspicion got through. This node withdraws its own suspicions, which
    /// date from the cut, and does not refute (the suspecter does the same when it hears of a
    /// suspicion of itself from this side) — unless this node holds most members in doubt: then
    /// it is the one that was cut off, the rest of the federation may well suspect it, and it
    /// refutes, then withdraws ([`Node::refuted`]).
    ///
    /// A suspicion raised (`age` ago) before this node last withdrew its suspicions dates from
    /// the cut too, and is not taken in: members cut off together would otherwise hand each
    /// other back the suspicions each had withdrawn, and withdraw again on the next mutual
    /// doubt, for minutes at 10,000 nodes. A suspicion raised after the withdrawal is taken in as
    /// ever, so a member that really failed during the cut is suspected again at once by whoever
    /// probes it next.
    pub(super) fn on_suspicion(
        &mut self,
        sender: NodeId,
        id: NodeId,
        generation: u64,
        heartbeat: u64,
        from: NodeId,
        age: u16,
    ) -> Option<SharedRecord> {
        let raised = self.now.saturating_sub(suspicion_age_duration(age));
        let before_withdrawal = self.membership.withdrawn.is_some_and(|at| raised < at);
        let in_doubt = self.doubts(&sender) || self.doubts(&from);
        if id == self.config.id {
            let own = self.replica.local().clone();
            if own.state == Lifecycle::Left {
                return None;
            }
            if in_doubt && !self.cut_off() {
                self.withdraw_suspicions();
                return None;
            }
            // A suspicion of a generation above ours names a record nobody can hold unless
            // we signed it (an earlier process of ours): that record, if it exists, makes us
            // refute when it arrives. Suspicions are not signed, so this one is only answered.
            if generation == own.generation && heartbeat >= own.heartbeat {
                if before_withdrawal {
                    return None;
                }
                // Alive at a higher incarnation: the record at the new heartbeat refutes it.
                self.stats.suspicions_refuted += 1;
                self.update_local(|r| r.heartbeat = r.heartbeat.max(heartbeat));
                self.membership.detector.note_refuted();
                self.refuted();
            }
            return Some(self.replica.local().clone());
        }
        if in_doubt {
            return None;
        }
        let held = self.replica.get(&id).map(|s| s.record().clone())?;
        if (held.generation, held.heartbeat) > (generation, heartbeat) {
            return Some(held);
        }
        let now = self.now;
        let st = &mut self.membership;
        if held.generation != generation || before_withdrawal {
            return None; // a generation we do not hold yet (its record will tell more), or the cut's
        }
        if st.detector.on_suspect_gossip(&self.replica, now, id, heartbeat, from) == Rumor::Spread {
            st.suspicions.push(QueuedSuspicion::new(id, generation, heartbeat, from, raised));
        }
        None
    }

    /// This node's own suspicion of `id` as sent now (its age counted from when this node began
    /// to suspect it), if it suspects `id`.
    pub(crate) fn own_suspicion(&self, id: NodeId) -> Option<Piggyback> {
        let generation = self.replica.get(&id)?.record().generation;
        let detector = &self.membership.detector;
        let heartbeat = detector.member_incarnation(&self.replica, &id)?;
        let age = suspicion_age(self.now.saturating_since(detector.suspected_since(&self.replica, &id)?));
        Some(Piggyback::Suspect { id, generation, heartbeat, from: self.config.id, age })
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
        QueuedSuspicion::new(NodeId::from_u64(7), 3, heartbeat, NodeId::from_u64(from), Time::from_secs(2))
    }

    #[test]
    fn suspicions_are_superseded_by_later_versions_and_replaced_by_other_suspecters() {
        assert!(suspicion(5, 1).covers(&suspicion(4, 2)));
        assert!(suspicion(5, 1).covers(&suspicion(5, 1)));
        assert!(!suspicion(5, 1).covers(&suspicion(5, 2)), "another suspecter is a confirmation");
        assert!(!suspicion(4, 1).covers(&suspicion(5, 1)));
    }

    #[test]
    fn a_queued_suspicion_ages_as_it_waits_and_its_budget_covers_the_oldest() {
        let s = suspicion(5, 1);
        let (id, from) = (NodeId::from_u64(7), NodeId::from_u64(1));
        let at = |age| Piggyback::Suspect { id, generation: 3, heartbeat: 5, from, age };
        assert_eq!(s.piggyback(Time::from_secs(2)), at(0));
        assert_eq!(s.piggyback(Time::from_millis(3_257)), at(125), "hundredths of a second, rounded down");
        assert_eq!(s.piggyback(Time::from_secs(10_000)), at(u16::MAX), "saturates");
        for now in [Time::from_secs(2), Time::from_secs(3), Time::from_secs(10_000)] {
            let sent = crate::wire::encode_piggyback(&s.piggyback(now)).len();
            assert!(s.encoded_len(0) >= sent, "the budget never counts fewer bytes than are sent");
        }
        assert_eq!(s.encoded_len(0), crate::wire::encode_piggyback(&at(u16::MAX)).len());
        let big = QueuedSuspicion::new(NodeId([0xff; 16]), u64::MAX, u64::MAX, NodeId([0xff; 16]), Time::ZERO);
        assert_eq!(big.encoded_len(0), 56, "the longest suspicion fits its length byte");
    }
}
