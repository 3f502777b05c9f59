//! Vouching for outbound-only members: an anchor that holds a member's connection vouches for
//! it, which suppresses others' suspicions of it, and holds a lease on it, renewed by every
//! message from the member, that pings it in silence and suspects it when the lease runs out
//! ([module docs](super), after point 5).

use super::{Action, Event, Standing, Swim};
use crate::id::{Directory, NodeId};
use crate::time::Time;
use core::time::Duration;

impl Swim {
    /// Marks `id` as vouched for by `voucher` (an anchor holding a connection to it; this node
    /// itself when it is that anchor), or clears the mark with `None`. While vouched, suspicions
    /// of it from anyone but the voucher are dropped, and one already running is lifted. The mark
    /// ends when the voucher suspects it (gossip from the voucher, or [`Swim::suspect`] when the
    /// voucher is this node) or when the voucher is removed.
    ///
    /// When the voucher is this node, it also holds a lease on the member: it pings the member
    /// after a third of [`SwimConfig::vouch_lease`](super::SwimConfig::vouch_lease) in silence
    /// and suspects it after a whole lease, so a member killed without closing its connection is
    /// found within the lease.
    pub(crate) fn set_voucher(&mut self, dir: &impl Directory, id: NodeId, voucher: Option<NodeId>) {
        if !self.members.contains_key(dir, &id) {
            return;
        }
        match voucher {
            Some(v) => self.vouchers.insert(id, v),
            None => self.vouchers.remove(&id),
        };
        if voucher == Some(self.local) {
            // A lease already held runs on: being told again is no sign of life.
            self.leases.entry(id).or_insert(self.now);
            if self.next_lease_check == Time::NEVER {
                self.next_lease_check = self.now + self.lease_step();
            }
        } else {
            self.leases.remove(&id);
        }
        let Some(n) = self.members.number(dir, &id) else { return };
        let m = self.members.at_mut(n);
        if voucher.is_some() && m.standing == Standing::Suspect {
            m.standing = Standing::Alive;
            self.lift_suspicion(n);
            self.events.push_back(Event::Alive(id));
        }
    }

    /// Local evidence that `id` is unreachable (an anchor lost its connection to an outbound-only
    /// member it vouched for): suspects it as a failed probe would, unless another node vouches
    /// for it. Ends this node's lease on `id`.
    pub(crate) fn suspect(&mut self, dir: &impl Directory, now: Time, id: NodeId) {
        self.advance(now);
        self.leases.remove(&id);
        self.suspect_locally(dir, id);
    }

    /// Something arrived from `id` (any message): renews this node's lease on it, if it holds
    /// one. The probe inputs below count on their own.
    pub(crate) fn heard_from(&mut self, now: Time, id: NodeId) {
        self.advance(now);
        if let Some(heard) = self.leases.get_mut(&id) {
            *heard = (*heard).max(self.now);
        }
    }

    /// How often the leases are checked: a sixth of the lease.
    fn lease_step(&self) -> Duration {
        (self.config.vouch_lease / 6).max(Duration::from_millis(1))
    }

    /// Pings every member this node anchors that has been silent for a third of the lease, and
    /// suspects those silent for a whole lease (each once: a suspect is left to its suspicion).
    pub(super) fn check_leases(&mut self, dir: &impl Directory) {
        let now = self.now;
        if self.leases.is_empty() {
            self.next_lease_check = Time::NEVER;
            return;
        }
        self.next_lease_check = now + self.lease_step();
        let (lease, quiet) = (self.config.vouch_lease, self.config.vouch_lease / 3);
        let mut expired = Vec::new();
        let mut ping = Vec::new();
        for (&id, &heard) in &self.leases {
            if !self.members.get(dir, &id).is_some_and(|m| m.standing == Standing::Alive) {
                continue;
            }
            let silent = now.saturating_since(heard);
            if silent >= lease {
                expired.push(id);
            } else if silent >= quiet {
                ping.push(id);
            }
        }
        for to in ping {
            let seq = self.take_seq();
            self.actions.push_back(Action::SendPing { to, seq });
        }
        for id in expired {
            self.suspect_locally(dir, id);
        }
    }
}
