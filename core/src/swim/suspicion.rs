//! Suspicions: raised by a failed probe, an expired lease or gossip, confirmed by independent
//! suspecters, refuted by a higher incarnation, and confirmed as failures when their Lifeguard
//! timeout runs out ([module docs](super), points 3 and 4).

use super::{suspicion_timeout, Action, Event, Member, Rumor, Standing, Swim, SwimConfig};
use crate::id::{Directory, NodeId};
use crate::time::Time;

/// A running suspicion. Its deadline is computed from the fields ([`Suspicion::deadline`]) and
/// keys [`Swim::suspicions`], so the fields change only between taking the key out and putting
/// it back.
///
/// A cut at 10,000 nodes holds 22 million of these at once (every node on each side suspects
/// every member of the other), so a suspicion holds what its deadline needs and no more: the
/// cluster size when it began (Lifeguard's bounds and expected confirmations follow from it and
/// the configuration) and the suspecters as fingerprints, inline.
#[derive(Clone, Debug)]
pub(super) struct Suspicion {
    /// When it began, as [`Time`]'s microseconds in bytes: no 8-byte alignment, so that a
    /// suspicion and its 4-byte key take 32 bytes in the table, not 40.
    started: [u8; 8],
    /// The cluster size when it began (low 31 bits), for
    /// [`SwimConfig::suspicion_bounds`](super::SwimConfig::suspicion_bounds), and in the top bit
    /// whether this node's own probe (or lease) of the member failed too: a witness.
    size_and_witness: u32,
    /// The first suspecter, then each independent confirmer (at most
    /// [`SwimConfig::suspicion_confirmations`](super::SwimConfig::suspicion_confirmations) of
    /// them), as [`Suspecters::print`]s.
    suspecters: Suspecters,
}

/// The witness bit of [`Suspicion::size_and_witness`].
const WITNESS: u32 = 1 << 31;

// Keep them from growing unnoticed: with its key, one table entry of tens of millions in a cut.
const _: () = assert!(core::mem::size_of::<(u32, Suspicion)>() <= 32);

/// Who raised a suspicion and who confirmed it, as fingerprints of their ids: the suspicion
/// only needs to count them and to tell whether a suspecter is new. Two suspecters whose ids
/// share a fingerprint (a chance of one in 2^32 for random ids) count as one: a confirmation
/// missed, so a timeout a little longer, never a shorter one.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Suspecters {
    /// The fingerprints in the order heard; 0 marks an empty place (no fingerprint is 0).
    prints: [u32; MOST_SUSPECTERS],
}

/// The first suspecter and up to [`MOST_CONFIRMATIONS`](super::config::MOST_CONFIRMATIONS)
/// confirmers.
const MOST_SUSPECTERS: usize = super::config::MOST_CONFIRMATIONS as usize + 1;

impl Suspecters {
    /// The low 32 bits of the id, moved up by one so that no fingerprint is 0 (ids numbered
    /// from 0 up keep distinct fingerprints below 2^32 - 1).
    fn print(id: &NodeId) -> u32 {
        (id.short() as u32).wrapping_add(1).max(1)
    }

    fn first(id: &NodeId) -> Suspecters {
        let mut s = Suspecters::default();
        s.push(id);
        s
    }

    pub(super) fn len(&self) -> usize {
        self.prints.iter().take_while(|&&p| p != 0).count()
    }

    fn contains(&self, id: &NodeId) -> bool {
        self.prints.contains(&Suspecters::print(id))
    }

    /// Adds `id`; one more than there is room for is not kept.
    fn push(&mut self, id: &NodeId) {
        if let Some(place) = self.prints.iter_mut().find(|p| **p == 0) {
            *place = Suspecters::print(id);
        }
    }
}

impl Suspicion {
    fn new(started: Time, cluster_size: u32, first: &NodeId, witnessed: bool) -> Suspicion {
        let size = cluster_size.min(WITNESS - 1);
        Suspicion {
            started: started.as_micros().to_le_bytes(),
            size_and_witness: if witnessed { size | WITNESS } else { size },
            suspecters: Suspecters::first(first),
        }
    }

    pub(super) fn started(&self) -> Time {
        Time(u64::from_le_bytes(self.started))
    }

    fn cluster_size(&self) -> u32 {
        self.size_and_witness & !WITNESS
    }

    fn witnessed(&self) -> bool {
        self.size_and_witness & WITNESS != 0
    }

    /// When the suspicion runs out here. A witness waits Lifeguard's timeout, shortened by the
    /// confirmations so far; a node that only heard the rumor waits the longest timeout, by
    /// which the DOWN mark of a witness has normally reached it. Were every node to confirm at
    /// the shortest timeout, nearly all of them would, each signing its own mark: a partition
    /// of 1,250 nodes out of 10,000 made millions of marks, every one a record to spread.
    pub(super) fn deadline(&self, config: &SwimConfig) -> Time {
        let (min, max) = config.suspicion_bounds(self.cluster_size() as usize);
        if !self.witnessed() {
            return self.started() + max;
        }
        let confirmations = u32::try_from(self.suspecters.len() - 1).unwrap_or(u32::MAX);
        self.started() + suspicion_timeout(min, max, confirmations, expected_confirmations(config, self.cluster_size()))
    }
}

/// Lifeguard: expect K confirmations only where K other members could give them.
fn expected_confirmations(config: &SwimConfig, cluster_size: u32) -> u32 {
    let k = config.suspicion_confirmations;
    if cluster_size.saturating_sub(2) < k {
        0
    } else {
        k
    }
}

impl Swim {
    /// A gossiped suspicion of `id` at `incarnation`, raised by `from`. About this node: it
    /// refutes ([`Action::GossipAlive`]). About a member: starts a suspicion or counts `from` as
    /// an independent confirmation, which shortens it.
    pub(crate) fn on_suspect_gossip(
        &mut self,
        dir: &impl Directory,
        now: Time,
        id: NodeId,
        incarnation: u64,
        from: NodeId,
    ) -> Rumor {
        self.advance(now);
        if id == self.local {
            if incarnation >= self.incarnation {
                self.incarnation = incarnation.saturating_add(1);
                self.worse_health(1);
                self.actions.push_back(Action::GossipAlive { incarnation: self.incarnation });
            }
            return Rumor::Drop;
        }
        self.raise_suspicion(dir, id, incarnation, from)
    }

    /// A gossiped announcement that `id` is alive at `incarnation`: refutes a suspicion of an
    /// older incarnation.
    pub(crate) fn on_alive_gossip(&mut self, dir: &impl Directory, now: Time, id: NodeId, incarnation: u64) -> Rumor {
        self.advance(now);
        let Some(n) = self.members.number(dir, &id) else { return Rumor::Drop };
        let m = self.members.at_mut(n);
        if m.standing == Standing::Confirmed || incarnation <= m.incarnation() {
            return Rumor::Drop;
        }
        m.set_incarnation(incarnation);
        if m.standing == Standing::Suspect {
            m.standing = Standing::Alive;
            self.lift_suspicion(n);
            self.events.push_back(Event::Alive(id));
            // Refuted: an anchor that suspected its own member vouches for it again.
            if let Some(heard) = self.leases.get_mut(&id) {
                *heard = self.now;
                self.vouchers.insert(id, self.local);
            }
        }
        Rumor::Spread
    }

    /// Confirms every suspicion whose deadline has come.
    pub(super) fn expire_suspicions(&mut self, dir: &impl Directory) {
        while let Some(&(at, n)) = self.suspicions.first() {
            if at > self.now {
                break;
            }
            self.suspicions.pop_first();
            self.confirm(dir, n);
        }
    }

    pub(super) fn suspect_locally(&mut self, dir: &impl Directory, id: NodeId) {
        let Some(incarnation) = self.members.get(dir, &id).map(Member::incarnation) else { return };
        if self.raise_suspicion(dir, id, incarnation, self.local) == Rumor::Spread {
            self.actions.push_back(Action::GossipSuspect { id, incarnation });
        }
    }

    fn raise_suspicion(&mut self, dir: &impl Directory, id: NodeId, incarnation: u64, from: NodeId) -> Rumor {
        let now = self.now;
        let cluster_size = u32::try_from(self.cluster_size()).unwrap_or(u32::MAX);
        let witness = from == self.local;
        let Some(n) = self.members.number(dir, &id) else { return Rumor::Drop };
        let m = self.members.at_mut(n);
        if incarnation < m.incarnation() {
            return Rumor::Drop;
        }
        match self.vouchers.get(&id) {
            // The voucher itself suspects it: it no longer vouches.
            Some(&v) if v == from => {
                self.vouchers.remove(&id);
            }
            Some(_) => return Rumor::Drop,
            None => {}
        }
        m.set_incarnation(incarnation);
        match m.standing {
            Standing::Confirmed => Rumor::Drop,
            Standing::Suspect => {
                let Some(s) = self.suspected.get_mut(&n) else { return Rumor::Drop };
                let expected = expected_confirmations(&self.config, s.cluster_size());
                let news = !s.suspecters.contains(&from) && s.suspecters.len() <= expected as usize;
                if !news && (!witness || s.witnessed()) {
                    return Rumor::Drop;
                }
                self.suspicions.remove(&(s.deadline(&self.config), n));
                if news {
                    s.suspecters.push(&from);
                }
                if witness {
                    s.size_and_witness |= WITNESS;
                }
                self.suspicions.insert((s.deadline(&self.config), n));
                if news {
                    Rumor::Spread
                } else {
                    Rumor::Drop
                }
            }
            Standing::Alive => {
                m.standing = Standing::Suspect;
                let suspicion = Suspicion::new(now, cluster_size, &from, witness);
                self.suspicions.insert((suspicion.deadline(&self.config), n));
                self.suspected.insert(n, suspicion);
                self.events.push_back(Event::Suspect(id));
                Rumor::Spread
            }
        }
    }

    /// Withdraws every running suspicion: each suspect is alive again ([`Event::Alive`]), its
    /// lease renewed, as if it had refuted.
    ///
    /// For a node that finds its suspicions date from a cut that has healed (see
    /// `Node::on_suspicion`). Were they kept, every member on the far side of the cut would
    /// have to refute them, a new record each spread to every node. A member that did fail
    /// meanwhile is suspected afresh by this node's probes and by the rest of the federation's,
    /// and suspicions raised after the withdrawal are taken in as ever (those raised before
    /// are not, `Node::on_suspicion`): a quiet period after a withdrawal (tried) made a gateway
    /// see a node killed during the cut 12 s late instead of 5 s in `federation-1k`.
    pub(crate) fn withdraw_suspicions(&mut self, dir: &impl Directory, now: Time) {
        self.advance(now);
        for (_, n) in core::mem::take(&mut self.suspicions) {
            if !self.members.has(n) || self.members.at(n).standing != Standing::Suspect {
                continue;
            }
            self.members.at_mut(n).standing = Standing::Alive;
            let id = dir.id(n);
            self.events.push_back(Event::Alive(id));
            if let Some(heard) = self.leases.get_mut(&id) {
                *heard = self.now;
                self.vouchers.insert(id, self.local);
            }
        }
        self.suspected = Default::default();
    }

    /// When this node began to suspect `id`, if it does.
    pub(crate) fn suspected_since(&self, dir: &impl Directory, id: &NodeId) -> Option<Time> {
        self.suspected.get(&self.members.number(dir, id)?).map(Suspicion::started)
    }

    /// Drops the suspicion of member number `n`, if any, with its deadline.
    pub(super) fn lift_suspicion(&mut self, n: u32) {
        if let Some(s) = self.forget_suspicion(n) {
            self.suspicions.remove(&(s.deadline(&self.config), n));
        }
    }

    /// Takes the suspicion of member number `n` out of [`Swim::suspected`] (not out of the deadlines), and
    /// gives back the room a cut made ([`crate::heap::give_back_room`]): a partition makes
    /// every node suspect every member across it at once (at 10,000 nodes cut 8,750 to 1,250,
    /// 22 million suspicions). Only deadlines order suspicions, so nothing observable changes.
    fn forget_suspicion(&mut self, n: u32) -> Option<Suspicion> {
        let s = self.suspected.remove(&n)?;
        crate::heap::give_back_room(&mut self.suspected);
        Some(s)
    }

    /// Confirms the failure of member number `n`.
    fn confirm(&mut self, dir: &impl Directory, n: u32) {
        if !self.members.has(n) {
            return;
        }
        let m = self.members.at_mut(n);
        if m.standing != Standing::Suspect {
            return;
        }
        let was_probed = m.probeable;
        m.standing = Standing::Confirmed;
        let id = dir.id(n);
        self.forget_suspicion(n);
        if was_probed {
            self.leave_order(n);
        }
        if self.probe.as_ref().is_some_and(|p| p.target == id) {
            self.probe = None;
        }
        self.events.push_back(Event::Confirm(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suspecters_are_counted_and_known_again_and_the_room_is_not_overrun() {
        let id = NodeId::from_u64;
        // Id 0's fingerprint is not the mark of an empty place.
        let mut s = Suspecters::first(&id(0));
        assert_eq!(s.len(), 1);
        assert!(s.contains(&id(0)) && !s.contains(&id(1)));
        for n in 1..10 {
            s.push(&id(n));
        }
        assert_eq!(s.len(), MOST_SUSPECTERS);
        assert!((0..MOST_SUSPECTERS as u64).all(|n| s.contains(&id(n))));
        assert!(!s.contains(&id(MOST_SUSPECTERS as u64)));
    }
}
