//! The probe schedule and the probe messages: the randomized round-robin probe order, one
//! probe per protocol period (a direct ping, then ping-reqs through helpers), the answers to
//! others' pings and ping-reqs, the relays served for other probers, and what a failed probe
//! does to local health ([module docs](super), points 1, 2 and 5).

use super::{Action, Standing, Swim};
use crate::id::{Directory, NodeId};
use crate::time::Time;
use rand::Rng;

/// Ping-reqs served for others at once; more are ignored (bounds what a flood can make us hold).
pub(super) const MAX_RELAYS: usize = 64;
/// Bits below a place of the pass in the places of [`Swim::joined`]: they fall between the
/// pass's own (a pass has at most 2^32 places).
const FRACTION: u32 = 24;
/// Below this many members ping-req helpers are picked by a full scan, above by sampling.
const SCAN_BELOW: usize = 64;

/// The probe of the current period.
#[derive(Clone, Debug)]
pub(super) struct Probe {
    pub(super) target: NodeId,
    pub(super) seq: u32,
    /// While the direct ping is outstanding: when to switch to indirect probing.
    pub(super) indirect_at: Option<Time>,
    vias: Vec<NodeId>,
    nacks: Vec<NodeId>,
}

/// A ping-req we serve for another prober.
#[derive(Clone, Copy, Debug)]
pub(super) struct Relay {
    seq: u32,
    pub(super) origin: NodeId,
    pub(super) origin_seq: u32,
    target: NodeId,
    pub(super) nack_at: Time,
}

impl Swim {
    /// A ping from `from`: answer it.
    pub(crate) fn on_ping(&mut self, now: Time, from: NodeId, seq: u32) {
        self.heard_from(now, from);
        self.actions.push_back(Action::SendAck { to: from, seq });
    }

    /// A ping-req from `from`: ping `target` on its behalf and forward the ack, or nack if none
    /// comes within 80% of the probe timeout (so the nack reaches the prober within its period).
    pub(crate) fn on_ping_req(&mut self, now: Time, from: NodeId, target: NodeId, seq: u32) {
        self.heard_from(now, from);
        if target == self.local {
            self.actions.push_back(Action::SendAck { to: from, seq });
            return;
        }
        if self.relays.len() >= MAX_RELAYS {
            return;
        }
        let relay_seq = self.take_seq();
        let nack_at = now + self.config.probe_timeout.saturating_mul(4) / 5;
        self.relays.push(Relay { seq: relay_seq, origin: from, origin_seq: seq, target, nack_at });
        self.actions.push_back(Action::SendPing { to: target, seq: relay_seq });
    }

    /// An ack from `from` for `seq`: the target of our probe answered (directly or through a
    /// helper), or the target of a ping-req we serve answered and we forward it.
    pub(crate) fn on_ack(&mut self, now: Time, from: NodeId, seq: u32) {
        self.heard_from(now, from);
        if let Some(i) = self.relays.iter().position(|r| r.seq == seq && r.target == from) {
            let r = self.relays.swap_remove(i);
            self.actions.push_back(Action::SendAck { to: r.origin, seq: r.origin_seq });
            return;
        }
        let answered =
            self.probe.as_ref().is_some_and(|p| p.seq == seq && (p.target == from || p.vias.contains(&from)));
        if answered {
            self.probe = None;
            self.health = self.health.saturating_sub(1);
        }
    }

    /// A nack from helper `from` for our probe `seq`: the target did not answer it, but our
    /// link to the helper works.
    pub(crate) fn on_nack(&mut self, now: Time, from: NodeId, seq: u32) {
        self.heard_from(now, from);
        if let Some(p) = self.probe.as_mut() {
            if p.seq == seq && p.vias.contains(&from) && !p.nacks.contains(&from) {
                p.nacks.push(from);
            }
        }
    }

    /// Member number `n` became probeable: it goes to a random place of the probe order, as if
    /// inserted there, like memberlist does. A place the pass has gone by means the next pass,
    /// which probes every number; a place ahead is kept in [`Swim::joined`] if the pass's own
    /// walk will not come to `n` (numbered after the pass began), so that a new member is probed
    /// in this pass as likely as any other. Without that, a member that joined mid-pass was not
    /// probed by anyone until their passes ended, and a node killed soon after it started was
    /// seen only by connection timeouts (`federation-1k`: every node's detection max 7.8 ->
    /// 13.4 s).
    pub(super) fn join_order(&mut self, n: u32) {
        self.probed += 1;
        let len = self.pass.len();
        if n < self.pass.span() || len == 0 {
            return;
        }
        // A place between the pass's own, so that members that join together (a federation
        // forming) are probed in a random order too, not in the order they joined.
        let at = self.rng.random_range(0..len << FRACTION);
        if at >= self.cursor << FRACTION {
            let i = self.joined.partition_point(|&(p, _)| p <= at);
            self.joined.insert(i, (at, n));
        }
    }

    /// Member number `n` is no longer probed: the pass skips its place.
    pub(super) fn leave_order(&mut self, n: u32) {
        self.probed -= 1;
        self.joined.retain(|&(_, m)| m != n);
    }

    /// Whether member number `n` is probed: a probeable member not confirmed dead.
    fn is_probed(&self, n: u32) -> bool {
        self.members.has(n) && self.members.at(n).is_probed()
    }

    /// The next member of the pass, starting a new pass when this one is done; `None` when no
    /// member is probed.
    fn next_in_pass(&mut self) -> Option<u32> {
        if self.probed == 0 {
            return None;
        }
        // At most the rest of this pass and one whole pass, which finds every probed member
        // (and, were the count ever wrong, gives up instead of walking passes for ever).
        let mut fresh = false;
        loop {
            if self.cursor >= self.pass.len() {
                if fresh {
                    return None;
                }
                fresh = true;
                let span = u32::try_from(self.members.span()).unwrap_or(u32::MAX);
                self.pass = Pass::new(self.rng.random(), span);
                self.cursor = 0;
                self.passes += 1;
                // The new pass walks every number, those that joined the last one too.
                self.joined = Vec::new();
            }
            let n = match self.joined.first() {
                Some(&(at, n)) if at < (self.cursor + 1) << FRACTION => {
                    self.joined.remove(0);
                    Some(n)
                }
                _ => {
                    self.cursor += 1;
                    self.pass.at(self.cursor - 1)
                }
            };
            if n.is_some_and(|n| self.is_probed(n)) {
                return n;
            }
        }
    }

    /// Judges the last period's probe and starts the next one.
    pub(super) fn next_period(&mut self, dir: &impl Directory) {
        if let Some(p) = self.probe.take() {
            self.probe_failed(dir, p);
        }
        let (period, timeout) = self.scaled_timing();
        self.next_probe = self.now + period;
        let Some(n) = self.next_in_pass() else { return };
        let target = dir.id(n);
        let seq = self.take_seq();
        self.probe =
            Some(Probe { target, seq, indirect_at: Some(self.now + timeout), vias: Vec::new(), nacks: Vec::new() });
        self.actions.push_back(Action::SendPing { to: target, seq });
    }

    pub(super) fn probe_indirectly(&mut self, dir: &impl Directory) {
        let Some(p) = self.probe.as_ref() else { return };
        let (target, seq) = (p.target, p.seq);
        let vias = self.pick_helpers(dir, target, self.config.indirect_probes);
        for &via in &vias {
            self.actions.push_back(Action::SendPingReq { via, target, seq });
        }
        if let Some(p) = self.probe.as_mut() {
            p.indirect_at = None;
            p.vias = vias;
        }
    }

    /// Up to `k` distinct members, not `target`, probeable and not suspected.
    fn pick_helpers(&mut self, dir: &impl Directory, target: NodeId, k: usize) -> Vec<NodeId> {
        let members = &self.members;
        let healthy = |n: u32| {
            members.has(n) && {
                let m = members.at(n);
                m.probeable && m.standing == Standing::Alive && dir.id(n) != target
            }
        };
        let mut picked = Vec::with_capacity(k);
        let span = members.span();
        if self.probed < SCAN_BELOW {
            let mut pool: Vec<u32> = (0..span as u32).filter(|&n| healthy(n)).collect();
            while picked.len() < k && !pool.is_empty() {
                let i = self.rng.random_range(0..pool.len());
                picked.push(dir.id(pool.swap_remove(i)));
            }
            return picked;
        }
        // Sampled from the member table, whose places also hold unprobed members and holes.
        for _ in 0..k * 8 {
            let n = self.rng.random_range(0..span) as u32;
            if healthy(n) {
                let id = dir.id(n);
                if !picked.contains(&id) {
                    picked.push(id);
                    if picked.len() == k {
                        break;
                    }
                }
            }
        }
        picked
    }

    fn probe_failed(&mut self, dir: &impl Directory, p: Probe) {
        if self.leases.contains_key(&p.target) {
            // Probed for the updates its pings carry, judged by the lease: one lost datagram
            // is no failure while the lease's pings (several before it runs out) go on.
            return;
        }
        // Lifeguard: with helpers, every nack we did not get is a sign that our own links or our
        // own processing are slow; without helpers, only the failed probe itself counts.
        let missed = if p.vias.is_empty() { 1 } else { p.vias.len().saturating_sub(p.nacks.len()) };
        self.worse_health(missed);
        self.suspect_locally(dir, p.target);
    }
}

/// One pass's probe order over the member numbers `0..span`, computed rather than stored (a
/// stored order is 4 bytes a member, 400 MB across a simulated 10,000-node federation): place
/// `i` of the pass holds `permute(i)`, a pseudo-random permutation of `0..4^half` (a four-round
/// Feistel network keyed afresh each pass), and places holding a number at or past `span` are
/// skipped, so every number below `span` comes once, in an order nobody can predict.
#[derive(Clone, Debug, Default)]
pub(super) struct Pass {
    key: u64,
    /// Half the bits of a place: `4^half` places, at most four times `span`.
    half: u32,
    span: u32,
}

impl Pass {
    pub(super) fn new(key: u64, span: u32) -> Pass {
        // The least `half` with 4^half >= span.
        let bits = u32::BITS - span.saturating_sub(1).leading_zeros();
        Pass { key, half: bits.div_ceil(2).max(1), span }
    }

    /// The numbers the pass walks are those below this.
    pub(super) fn span(&self) -> u32 {
        self.span
    }

    /// Places in the pass; 0 for an empty pass.
    pub(super) fn len(&self) -> u64 {
        if self.span == 0 {
            0
        } else {
            1 << (2 * self.half)
        }
    }

    /// The member number at place `i < len()`, if the place holds one below `span`.
    pub(super) fn at(&self, i: u64) -> Option<u32> {
        let mask = (1u64 << self.half) - 1;
        let (mut left, mut right) = (i >> self.half, i & mask);
        for round in 0..4u64 {
            let f = mix(right ^ self.key.rotate_left(16 * round as u32) ^ (round << 60)) & mask;
            (left, right) = (right, left ^ f);
        }
        let n = (left << self.half) | right;
        u32::try_from(n).ok().filter(|&n| n < self.span)
    }
}

/// A 64-bit mixer (splitmix64's finalizer): the Feistel network's round function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// A pass visits every number below its span exactly once, whatever the key.
        #[test]
        fn a_pass_is_a_permutation_of_its_span(key in proptest::prelude::any::<u64>(), span in 0u32..3000) {
            let pass = Pass::new(key, span);
            proptest::prop_assert!(pass.len() <= 4 * u64::from(span.max(1)));
            let mut seen: Vec<u32> = (0..pass.len()).filter_map(|i| pass.at(i)).collect();
            seen.sort_unstable();
            proptest::prop_assert_eq!(seen, (0..span).collect::<Vec<_>>());
        }
    }

    #[test]
    fn passes_with_different_keys_differ() {
        let order = |key| (0..Pass::new(key, 100).len()).filter_map(|i| Pass::new(key, 100).at(i)).collect::<Vec<_>>();
        assert_ne!(order(1), order(2));
        assert_ne!(order(1), (0..100).collect::<Vec<_>>(), "not the identity");
    }
}
