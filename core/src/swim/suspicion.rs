//! Suspicions: raised by a failed probe, an expired lease or gossip, confirmed by independent
//! suspecters, refuted by a higher incarnation, and confirmed as failures when their Lifeguard
//! timeout runs out ([module docs](super), points 3 and 4).

use super::{suspicion_timeout, Action, Event, Member, Rumor, Standing, Swim};
use crate::id::{Directory, NodeId};
use crate::time::Time;
use core::time::Duration;

/// A running suspicion. Its deadline is computed from the fields ([`Suspicion::deadline`]) and
/// keys [`Swim::suspicions`], so the fields change only between taking the key out and putting
/// it back.
#[derive(Clone, Debug)]
pub(super) struct Suspicion {
    started: Time,
    /// Lifeguard's bounds for the cluster size when it began, in microseconds (what
    /// [`SwimConfig::suspicion_bounds`](super::SwimConfig::suspicion_bounds) gives, exactly):
    /// half the bytes of two `Duration`s, for the millions of suspicions a cut raises.
    min_micros: u64,
    max_micros: u64,
    expected: u32,
    /// The first suspecter, then each independent confirmer (at most `expected` of them).
    pub(super) suspecters: Vec<NodeId>,
    /// This node's own probe (or lease) of the member failed too.
    witnessed: bool,
}

// A cut at 10,000 nodes holds 22 million of these: keep them from growing unnoticed.
const _: () = assert!(core::mem::size_of::<Suspicion>() <= 56);

impl Suspicion {
    /// When the suspicion runs out here. A witness waits Lifeguard's timeout, shortened by the
    /// confirmations so far; a node that only heard the rumor waits the longest timeout, by
    /// which the DOWN mark of a witness has normally reached it. Were every node to confirm at
    /// the shortest timeout, nearly all of them would, each signing its own mark: a partition
    /// of 1,250 nodes out of 10,000 made millions of marks, every one a record to spread.
    pub(super) fn deadline(&self) -> Time {
        let (min, max) = (Duration::from_micros(self.min_micros), Duration::from_micros(self.max_micros));
        if !self.witnessed {
            return self.started + max;
        }
        let confirmations = u32::try_from(self.suspecters.len() - 1).unwrap_or(u32::MAX);
        self.started + suspicion_timeout(min, max, confirmations, self.expected)
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
        let Some(m) = self.members.get_mut(dir, &id) else { return Rumor::Drop };
        if m.standing == Standing::Confirmed || incarnation <= m.incarnation() {
            return Rumor::Drop;
        }
        m.set_incarnation(incarnation);
        if m.standing == Standing::Suspect {
            m.standing = Standing::Alive;
            self.lift_suspicion(id);
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
        while let Some(&(at, id)) = self.suspicions.first() {
            if at > self.now {
                break;
            }
            self.suspicions.pop_first();
            self.confirm(dir, id);
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
        let n = self.cluster_size();
        let (min, max) = self.config.suspicion_bounds(n);
        // Lifeguard: expect K confirmations only where K other members could give them.
        let k = self.config.suspicion_confirmations;
        let expected = if n.saturating_sub(2) < k as usize { 0 } else { k };
        let witness = from == self.local;
        let Some(m) = self.members.get_mut(dir, &id) else { return Rumor::Drop };
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
                let Some(s) = self.suspected.get_mut(&id) else { return Rumor::Drop };
                let news = !s.suspecters.contains(&from) && s.suspecters.len() <= s.expected as usize;
                if !news && (!witness || s.witnessed) {
                    return Rumor::Drop;
                }
                self.suspicions.remove(&(s.deadline(), id));
                if news {
                    s.suspecters.push(from);
                }
                s.witnessed |= witness;
                self.suspicions.insert((s.deadline(), id));
                if news {
                    Rumor::Spread
                } else {
                    Rumor::Drop
                }
            }
            Standing::Alive => {
                m.standing = Standing::Suspect;
                let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
                let suspicion = Suspicion {
                    started: now,
                    min_micros: micros(min),
                    max_micros: micros(max),
                    expected,
                    suspecters: vec![from],
                    witnessed: witness,
                };
                self.suspicions.insert((suspicion.deadline(), id));
                self.suspected.insert(id, suspicion);
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
        for (_, id) in core::mem::take(&mut self.suspicions) {
            let Some(m) = self.members.get_mut(dir, &id) else { continue };
            if m.standing != Standing::Suspect {
                continue;
            }
            m.standing = Standing::Alive;
            self.events.push_back(Event::Alive(id));
            if let Some(heard) = self.leases.get_mut(&id) {
                *heard = self.now;
                self.vouchers.insert(id, self.local);
            }
        }
        self.suspected = Default::default();
    }

    /// When this node began to suspect `id`, if it does.
    pub(crate) fn suspected_since(&self, id: &NodeId) -> Option<Time> {
        self.suspected.get(id).map(|s| s.started)
    }

    /// Drops the suspicion of `id`, if any, with its deadline.
    pub(super) fn lift_suspicion(&mut self, id: NodeId) {
        if let Some(s) = self.forget_suspicion(&id) {
            self.suspicions.remove(&(s.deadline(), id));
        }
    }

    /// Takes the suspicion of `id` out of [`Swim::suspected`] (not out of the deadlines), and
    /// gives back the room a cut made ([`crate::heap::give_back_room`]): a partition makes
    /// every node suspect every member across it at once (at 10,000 nodes cut 8,750 to 1,250,
    /// 22 million suspicions). Only deadlines order suspicions, so nothing observable changes.
    fn forget_suspicion(&mut self, id: &NodeId) -> Option<Suspicion> {
        let s = self.suspected.remove(id)?;
        crate::heap::give_back_room(&mut self.suspected);
        Some(s)
    }

    fn confirm(&mut self, dir: &impl Directory, id: NodeId) {
        let Some(n) = self.members.number(dir, &id) else { return };
        let m = self.members.at_mut(n);
        if m.standing != Standing::Suspect {
            return;
        }
        let was_probed = m.probeable;
        m.standing = Standing::Confirmed;
        self.forget_suspicion(&id);
        if was_probed {
            self.leave_order(n);
        }
        if self.probe.as_ref().is_some_and(|p| p.target == id) {
            self.probe = None;
        }
        self.events.push_back(Event::Confirm(id));
    }
}
