//! Failure detection by probing: SWIM with the Lifeguard refinements, as a sans-IO state machine.
//!
//! At 10,000 nodes, flooding heartbeats costs every node 10,000 updates a second. Instead each
//! node checks one member per *protocol period* and only news of a failure spreads:
//!
//! 1. **Probe schedule.** Members are probed in a randomized round-robin: each pass walks the
//!    member numbers in a fresh pseudo-random order (computed, not stored: a keyed permutation),
//!    so every member is probed exactly once per pass and one that joins during a pass is
//!    probed in it or in the next; a failed member is found within two passes by every prober
//!    (the SWIM paper's bound) instead of by luck.
//! 2. **Direct, then indirect.** The node pings the target ([`Action::SendPing`]). Without an ack
//!    within `probe_timeout` it asks `indirect_probes` random healthy members to ping the target
//!    on its behalf ([`Action::SendPingReq`]); they forward the target's ack, or answer with a
//!    nack ([`Action::SendNack`]) when they got none, which tells the prober that its own links
//!    work. A probe with no ack by the end of the period fails.
//! 3. **Suspicion, not death.** A failed probe makes the target *suspect*
//!    ([`Event::Suspect`], gossiped with [`Action::GossipSuspect`]), not dead. The suspect hears
//!    the rumor and refutes it with a higher incarnation ([`Action::GossipAlive`]); otherwise,
//!    when the suspicion timeout runs out, it is *confirmed* ([`Event::Confirm`]) and the caller
//!    marks it DOWN through the registry lattice.
//! 4. **Lifeguard suspicion.** The timeout starts at `max = beta · log10(n) · period` and shrinks
//!    towards `min = alpha · log10(n) · period` as independent suspecters confirm it:
//!    `timeout = max(min, max − (max − min) · log(C + 1) / log(K + 1))` for `C` confirmations out
//!    of `K` expected ([`suspicion_timeout`]). A member that one slow node suspects gets a long
//!    time to refute; one that many suspect is declared dead fast. The shrinking applies only
//!    to a node whose own probe of the member failed (a *witness*); a node that only heard the
//!    rumor waits `max`, by which a witness's DOWN mark has normally reached it. So a failure is
//!    confirmed by the few nodes that saw it, not by every node at once, each with a DOWN mark
//!    of its own to spread.
//! 5. **Lifeguard local health.** A node that misses acks because *it* is slow (CPU starved,
//!    overloaded link) would wrongly suspect healthy members. Its local health multiplier (LHM,
//!    `0..=max_health`) rises with every failed probe (by the number of nacks it missed when it
//!    probed indirectly) and every time it must refute a suspicion about itself, and falls with
//!    every successful probe; the probe period and the probe timeout are stretched by `LHM + 1`.
//!
//! Members that are outbound-only cannot be pinged by most nodes and are not probed by them
//! (`probeable = false`); their anchors vouch for them ([`Swim::set_voucher`]), which
//! suppresses suspicion while the voucher holds its connection to them. An anchor that loses
//! that connection reports it with [`Swim::suspect`]. A process killed without closing its
//! connections is only noticed by the transport's idle timeout (30 s), so the anchor also holds
//! a *lease* on each member it vouches for: any message from the member renews it
//! ([`Swim::heard_from`]), a third of [`SwimConfig::vouch_lease`] in silence brings a ping, and
//! a whole lease in silence a suspicion, as a failed probe would. The anchor still probes such
//! a member in its turn, for the updates the pings carry, but does not suspect it when the probe
//! fails: few helpers can reach it, so one lost datagram would be a suspicion, where the
//! lease's pings ride it out.
//!
//! # Incarnations
//!
//! Each member has an incarnation number that only its owner raises: a suspicion at incarnation
//! `i` is refuted by the owner announcing itself alive at an incarnation above `i`. The module
//! treats incarnations as opaque counters; the node maps them onto its record (the heartbeat of
//! the current generation: a record at a higher heartbeat is the refutation). A new generation
//! is a new process: the node removes the member and adds it again.
//!
//! # Driving it
//!
//! Like [`Node`](crate::Node), a [`Swim`] does no I/O and reads no clock: every input carries
//! `now`, outputs are drained with [`Swim::poll_action`] and [`Swim::poll_event`], and the caller
//! calls [`Swim::on_timeout`] at [`Swim::next_deadline`]. How `node.rs` will drive it:
//!
//! - Membership follows the registry: [`Swim::add_member`] for every record learned that is not
//!   LEFT or DOWN (`probeable` when its reachability is public or it holds a connection to us),
//!   [`Swim::remove_member`] when a record turns DOWN or LEFT or a new generation replaces it.
//! - Each wire message maps to one input: `Ping{seq}` → [`Swim::on_ping`], `PingReq{target, seq}`
//!   → [`Swim::on_ping_req`], `Ack{seq}` → [`Swim::on_ack`], `Nack{seq}` → [`Swim::on_nack`]. The
//!   piggybacked updates they carry go to the lattice (records) and to
//!   [`Swim::on_suspect_gossip`] / [`Swim::on_alive_gossip`] (suspicions and refutations); when
//!   those return [`Rumor::Spread`] the node pushes the update into its
//!   [`BroadcastQueue`](crate::broadcast::BroadcastQueue) to pass it on.
//! - Each [`Action`] becomes one datagram: the probe message first, then
//!   [`BroadcastQueue::fill`](crate::broadcast::BroadcastQueue::fill) with the bytes left. A ping
//!   to a member that [`Swim::is_suspect`] also carries the suspicion ahead of the queue's items
//!   (Lifeguard's buddy system), so the suspect hears of it at once and can refute.
//!   [`Action::GossipSuspect`] and [`Action::GossipAlive`] are not datagrams but updates to push
//!   into the broadcast queue (the latter as the node's own record at the new incarnation).
//! - [`Event::Confirm`] marks the member DOWN in the lattice (and the DOWN record spreads through
//!   the queue); [`Event::Suspect`] and [`Event::Alive`] may make a node unroutable early and
//!   routable again.
//!
//! Everything is a function of the [`SwimConfig`], the seed and the inputs with their times.
//!
//! # Layout
//!
//! This file holds the detector's state, its membership and its outputs; the protocol's parts
//! live in submodules that each add to [`Swim`]: `probe` (the probe schedule, pings, ping-reqs
//! and the relays served for others), `suspicion` (suspicions, their Lifeguard timeouts,
//! refutation and confirmation), `vouching` (anchors vouching for outbound-only members, and
//! their leases), `members` (the member table) and `config` ([`SwimConfig`]).

use crate::id::{Directory, NodeId};
use crate::time::Time;
use core::time::Duration;
use foldhash::fast::FixedState;
use hashbrown::HashMap;
use members::Members;
use probe::{Probe, Relay};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use suspicion::Suspicion;

mod config;
mod members;
mod probe;
mod suspicion;
mod vouching;
pub(crate) use config::suspicion_timeout;
pub use config::{SwimConfig, SwimConfigError, MOST_CONFIRMATIONS};

/// A message the caller must send or an update it must spread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Send a ping; the peer answers with an ack carrying `seq`.
    SendPing {
        /// The member to ping.
        to: NodeId,
        /// Echoed in the ack.
        seq: u32,
    },
    /// Ask `via` to ping `target` for us and forward its ack (or send a nack).
    SendPingReq {
        /// The helper.
        via: NodeId,
        /// The member to probe.
        target: NodeId,
        /// Echoed in the forwarded ack or the nack.
        seq: u32,
    },
    /// Answer a ping, or forward an ack for an indirect probe.
    SendAck {
        /// The pinger (or the prober that asked us to ping).
        to: NodeId,
        /// The sequence number from its message.
        seq: u32,
    },
    /// Tell a prober that the target of its ping-req did not answer us in time.
    SendNack {
        /// The prober.
        to: NodeId,
        /// The sequence number from its ping-req.
        seq: u32,
    },
    /// Spread that this node suspects `id` at `incarnation` (push it into the broadcast queue).
    GossipSuspect {
        /// The suspect.
        id: NodeId,
        /// The incarnation suspected.
        incarnation: u64,
    },
    /// Someone suspects this node: spread that it is alive at `incarnation`, above the suspected
    /// one (push the node's own record at this incarnation into the broadcast queue).
    GossipAlive {
        /// The node's new incarnation.
        incarnation: u64,
    },
}

/// A change of a member's standing, for the node and the application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// The member is suspected of having failed.
    Suspect(NodeId),
    /// A suspicion of the member was refuted or lifted.
    Alive(NodeId),
    /// The suspicion ran out: the member has failed; mark it DOWN.
    Confirm(NodeId),
}

/// Whether a gossiped suspicion or refutation was news that should be passed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Rumor {
    /// It changed what this node believes: push it into the broadcast queue.
    Spread,
    /// Known already, stale, about an unknown member, or suppressed: do not pass it on.
    Drop,
}

/// A member's standing; a suspect's [`Suspicion`] is kept in [`Swim::suspected`], so that the
/// entry every node holds for every member of a 10k registry stays 10 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Standing {
    Alive,
    Suspect,
    Confirmed,
}

/// What the detector knows of one member. The incarnation is kept as bytes so that an entry
/// has no alignment padding: 10 bytes instead of 16, in a table that every node holds for
/// every member.
#[derive(Clone, Debug)]
struct Member {
    incarnation: [u8; 8],
    probeable: bool,
    standing: Standing,
}

impl Member {
    fn incarnation(&self) -> u64 {
        u64::from_le_bytes(self.incarnation)
    }

    fn set_incarnation(&mut self, incarnation: u64) {
        self.incarnation = incarnation.to_le_bytes();
    }

    /// Probed in the passes: probeable and not confirmed dead.
    fn is_probed(&self) -> bool {
        self.probeable && self.standing != Standing::Confirmed
    }
}

/// One node's SWIM + Lifeguard failure detector; see the [module docs](self).
#[derive(Clone, Debug)]
pub(crate) struct Swim {
    local: NodeId,
    config: SwimConfig,
    rng: ChaCha8Rng,
    now: Time,
    incarnation: u64,
    health: u8,
    members: Members,
    /// The suspicion of each member whose standing is [`Standing::Suspect`], by member number
    /// (a cut at 10,000 nodes holds tens of millions of them: 4 bytes of key each, not 16).
    suspected: HashMap<u32, Suspicion, FixedState>,
    /// Members vouched for, by their voucher: only an anchor's own outbound-only members, so
    /// kept apart from the member table every node holds for every member.
    vouchers: HashMap<NodeId, NodeId, FixedState>,
    /// The outbound-only members this node anchors (it holds their connections): when each was
    /// last heard from. Kept through a suspicion, so that vouching resumes after the refutation.
    leases: BTreeMap<NodeId, Time>,
    next_lease_check: Time,
    /// The current pass's probe order, computed ([`probe::Pass`]), and the next place in it.
    pass: probe::Pass,
    cursor: u64,
    /// Members probed: probeable and not confirmed dead.
    probed: usize,
    /// Members numbered after the current pass began, to probe in it when the cursor reaches
    /// their place (random, as if inserted there; in 1/2^24ths of a place), by place
    /// ([`Swim::join_order`]).
    joined: Vec<(u64, u32)>,
    passes: u64,
    probe: Option<Probe>,
    next_probe: Time,
    next_seq: u32,
    relays: Vec<Relay>,
    /// The suspicions' deadlines, with their member numbers.
    suspicions: BTreeSet<(Time, u32)>,
    actions: VecDeque<Action>,
    events: VecDeque<Event>,
}

impl Swim {
    /// Adds the heap bytes of the detector's tables to `heap` ([`crate::heap`]).
    pub(crate) fn heap_bytes(&self, heap: &mut crate::heap::HeapBytes) {
        use crate::heap::{array, btree, hash_table};
        self.members.heap_bytes(heap);
        heap.members += array::<(u64, u32)>(self.joined.capacity());
        heap.suspicions += hash_table::<(u32, Suspicion)>(self.suspected.capacity())
            + btree::<(Time, u32)>(self.suspicions.len())
            + hash_table::<(NodeId, NodeId)>(self.vouchers.capacity())
            + btree::<(NodeId, Time)>(self.leases.len());
        heap.other += array::<Relay>(self.relays.capacity())
            + array::<Action>(self.actions.capacity())
            + array::<Event>(self.events.capacity());
    }

    /// A detector for node `local` at incarnation 0 with no members; the first probe falls at a
    /// random point of the first period so that nodes started together do not probe in step.
    ///
    /// `config` should pass [`SwimConfig::validate`]; out-of-range values are clamped.
    pub(crate) fn new(local: NodeId, config: SwimConfig, rng_seed: u64, now: Time) -> Swim {
        let config = config.clamped();
        let mut rng = ChaCha8Rng::seed_from_u64(rng_seed);
        let period = u64::try_from(config.protocol_period.as_micros()).unwrap_or(u64::MAX).max(1);
        let first = now + Duration::from_micros(rng.random_range(0..period));
        Swim {
            local,
            config,
            rng,
            now,
            incarnation: 0,
            health: 0,
            members: Members::default(),
            suspected: HashMap::with_hasher(FixedState::default()),
            vouchers: HashMap::with_hasher(FixedState::default()),
            leases: BTreeMap::new(),
            next_lease_check: Time::NEVER,
            pass: probe::Pass::default(),
            cursor: 0,
            probed: 0,
            joined: Vec::new(),
            passes: 0,
            probe: None,
            next_probe: first,
            next_seq: 0,
            relays: Vec::new(),
            suspicions: BTreeSet::new(),
            actions: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    // ----- membership -------------------------------------------------------------------------

    /// Adds member `id` at `incarnation`, probed directly when `probeable`. A member already known
    /// only has its probeability updated (incarnations move through [`Swim::on_alive_gossip`]).
    /// Returns whether it was new.
    ///
    /// A member is held at the number `dir` holds `id` at; one `dir` does not hold is not added.
    pub(crate) fn add_member(
        &mut self,
        dir: &impl Directory,
        now: Time,
        id: NodeId,
        incarnation: u64,
        probeable: bool,
    ) -> bool {
        self.advance(now);
        if id == self.local {
            return false;
        }
        let Some(n) = dir.number(&id) else { return false };
        let new = !self.members.has(n);
        if new {
            let member = Member { incarnation: incarnation.to_le_bytes(), probeable: false, standing: Standing::Alive };
            self.members.insert(n, member);
        }
        self.set_probeable_at(n, id, probeable);
        new
    }

    /// Forgets member `id` (its record turned DOWN or LEFT, or a new generation replaced it).
    /// Members it vouched for lose the voucher.
    pub(crate) fn remove_member(&mut self, dir: &impl Directory, id: NodeId) -> bool {
        let Some(n) = self.members.number(dir, &id) else { return false };
        if self.members.remove(n).is_some_and(|m| m.is_probed()) {
            self.leave_order(n);
        }
        self.lift_suspicion(n);
        if self.probe.as_ref().is_some_and(|p| p.target == id) {
            self.probe = None;
        }
        self.vouchers.remove(&id);
        self.vouchers.retain(|_, voucher| *voucher != id);
        self.leases.remove(&id);
        true
    }

    /// Whether `id` can be pinged directly (it is public, or holds a connection to us). Members
    /// that are not are never probed.
    pub(crate) fn set_probeable(&mut self, dir: &impl Directory, id: NodeId, probeable: bool) {
        if let Some(n) = self.members.number(dir, &id) {
            self.set_probeable_at(n, id, probeable);
        }
    }

    /// [`Swim::set_probeable`] for member `id`, numbered `n`.
    fn set_probeable_at(&mut self, n: u32, id: NodeId, probeable: bool) {
        let m = self.members.at_mut(n);
        let was = m.is_probed();
        m.probeable = probeable;
        let is = m.is_probed();
        match (was, is) {
            (false, true) => self.join_order(n),
            (true, false) => {
                self.leave_order(n);
                if self.probe.as_ref().is_some_and(|p| p.target == id) {
                    self.probe = None;
                }
            }
            _ => {}
        }
    }

    /// The directory moved what it held at `from` to `to` (it deleted what `to` held, which was
    /// no member): the member at `from`, if any, is at `to` now, with its suspicion. (A pass in
    /// progress may then probe it twice or not at all: passes walk numbers.)
    pub(crate) fn renumber(&mut self, from: u32, to: u32) {
        self.members.renumber(from, to);
        if let Some(j) = self.joined.iter_mut().find(|(_, n)| *n == from) {
            j.1 = to;
        }
        if let Some(s) = self.suspected.remove(&from) {
            let deadline = s.deadline(&self.config);
            self.suspicions.remove(&(deadline, from));
            self.suspicions.insert((deadline, to));
            self.suspected.insert(to, s);
        }
    }

    // ----- time -------------------------------------------------------------------------------

    /// Handles every deadline due at `now`: suspicions that ran out, ping-reqs that got no ack,
    /// the switch to indirect probing, the next protocol period, and the leases.
    pub(crate) fn on_timeout(&mut self, dir: &impl Directory, now: Time) {
        self.advance(now);
        let now = self.now;
        self.expire_suspicions(dir);
        let mut i = 0;
        while i < self.relays.len() {
            if self.relays[i].nack_at <= now {
                let r = self.relays.swap_remove(i);
                self.actions.push_back(Action::SendNack { to: r.origin, seq: r.origin_seq });
            } else {
                i += 1;
            }
        }
        if self.probe.as_ref().and_then(|p| p.indirect_at).is_some_and(|at| at <= now) {
            self.probe_indirectly(dir);
        }
        if self.next_probe <= now {
            self.next_period(dir);
        }
        if self.next_lease_check <= now {
            self.check_leases(dir);
        }
        // A probe that failed just now may have made this node a witness of a suspicion old
        // enough to have run out already: confirm it now rather than leave a past deadline.
        self.expire_suspicions(dir);
    }

    // ----- outputs and state ------------------------------------------------------------------

    /// The next message to send or update to spread.
    pub(crate) fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The next change of a member's standing.
    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Swim::on_timeout`] must be called next.
    pub(crate) fn next_deadline(&self) -> Time {
        let suspicion = self.suspicions.first().map_or(Time::NEVER, |&(at, _)| at);
        let relay = self.relays.iter().map(|r| r.nack_at).min().unwrap_or(Time::NEVER);
        let indirect = self.probe.as_ref().and_then(|p| p.indirect_at).unwrap_or(Time::NEVER);
        suspicion.min(relay).min(indirect).min(self.next_probe).min(self.next_lease_check)
    }

    #[cfg(test)]
    /// The local health multiplier, `0..=max_health`; 0 is healthy.
    pub(crate) fn health(&self) -> u8 {
        self.health
    }

    #[cfg(test)]
    /// This node's incarnation.
    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// This node refuted a suspicion of itself that it handled without [`Swim::on_suspect_gossip`]
    /// (the node keeps its own incarnation in its record): counts against local health as a
    /// refutation through `on_suspect_gossip` would.
    pub(crate) fn note_refuted(&mut self) {
        self.worse_health(1);
    }

    #[cfg(test)]
    /// Raises this node's incarnation to at least `incarnation` (the node moved its record on).
    pub(crate) fn set_incarnation(&mut self, incarnation: u64) {
        self.incarnation = self.incarnation.max(incarnation);
    }

    /// The cluster size the timeouts are computed for: members and this node.
    pub(crate) fn cluster_size(&self) -> usize {
        self.members.len() + 1
    }

    /// True while `id` is suspected.
    pub(crate) fn is_suspect(&self, dir: &impl Directory, id: &NodeId) -> bool {
        self.members.get(dir, id).is_some_and(|m| m.standing == Standing::Suspect)
    }

    #[cfg(test)]
    /// True once a suspicion of `id` ran out (until it is removed).
    pub(crate) fn is_confirmed(&self, dir: &impl Directory, id: &NodeId) -> bool {
        self.members.get(dir, id).is_some_and(|m| m.standing == Standing::Confirmed)
    }

    /// The incarnation known for member `id`.
    pub(crate) fn member_incarnation(&self, dir: &impl Directory, id: &NodeId) -> Option<u64> {
        self.members.get(dir, id).map(Member::incarnation)
    }

    /// The period and probe timeout at the current local health.
    pub(crate) fn scaled_timing(&self) -> (Duration, Duration) {
        let scale = u32::from(self.health) + 1;
        (self.config.protocol_period.saturating_mul(scale), self.config.probe_timeout.saturating_mul(scale))
    }

    // ----- internals --------------------------------------------------------------------------

    /// Time never goes backwards.
    fn advance(&mut self, now: Time) {
        self.now = self.now.max(now);
    }

    fn take_seq(&mut self) -> u32 {
        let s = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        s
    }

    fn worse_health(&mut self, by: usize) {
        let by = u8::try_from(by).unwrap_or(u8::MAX);
        self.health = self.health.saturating_add(by).min(self.config.max_health);
    }
}

#[cfg(test)]
mod tests {
    use super::probe::MAX_RELAYS;
    use super::*;
    use crate::id::Numbered;
    use proptest::prelude::*;

    fn id(n: u64) -> NodeId {
        NodeId::from_u64(n)
    }

    const ME: NodeId = NodeId::from_u64(0);

    fn config() -> SwimConfig {
        SwimConfig::default()
    }

    /// A detector for node 0 with members `1..=n`, all probeable.
    fn swim(n: u64) -> Swim {
        let mut s = Swim::new(ME, config(), 7, Time::ZERO);
        for i in 1..=n {
            s.add_member(&Numbered, Time::ZERO, id(i), 0, true);
        }
        s
    }

    fn actions(s: &mut Swim) -> Vec<Action> {
        core::iter::from_fn(|| s.poll_action()).collect()
    }

    fn events(s: &mut Swim) -> Vec<Event> {
        core::iter::from_fn(|| s.poll_event()).collect()
    }

    /// Runs to the next deadline and returns the actions it produced.
    fn step(s: &mut Swim) -> (Time, Vec<Action>) {
        let at = s.next_deadline();
        s.on_timeout(&Numbered, at);
        (at, actions(s))
    }

    /// Steps until a ping goes out; returns its time, target and seq.
    fn next_ping(s: &mut Swim) -> (Time, NodeId, u32) {
        loop {
            let (at, acts) = step(s);
            for a in acts {
                if let Action::SendPing { to, seq } = a {
                    return (at, to, seq);
                }
            }
        }
    }

    #[test]
    fn detector_is_send_and_small_enums() {
        fn is_send<T: Send>() {}
        is_send::<Swim>();
        assert!(core::mem::size_of::<Action>() <= 48);
        assert!(core::mem::size_of::<Event>() <= 24);
    }

    #[test]
    fn a_bad_config_still_runs_clamped() {
        let c = SwimConfig { protocol_period: Duration::ZERO, probe_timeout: Duration::ZERO, ..config() };
        let mut s = Swim::new(ME, c, 1, Time::ZERO);
        s.add_member(&Numbered, Time::ZERO, id(1), 0, true);
        let (t, to, _) = next_ping(&mut s);
        assert_eq!(to, id(1));
        assert!(t < Time::from_millis(1));
    }

    #[test]
    fn a_ping_is_answered_with_an_ack() {
        let mut s = swim(0);
        s.on_ping(Time::ZERO, id(9), 42);
        assert_eq!(actions(&mut s), vec![Action::SendAck { to: id(9), seq: 42 }]);
    }

    #[test]
    fn one_probe_per_period_and_an_ack_keeps_the_member_alive() {
        let mut s = swim(3);
        let (t0, target, seq) = next_ping(&mut s);
        assert!(t0 < Time::from_secs(1), "first probe within the first period");
        s.on_ack(t0 + Duration::from_millis(10), target, seq);
        let (t1, _, _) = next_ping(&mut s);
        assert_eq!(t1 - t0, Duration::from_secs(1));
        assert!(events(&mut s).is_empty());
        assert_eq!(s.health(), 0);
    }

    #[test]
    fn no_ack_leads_to_indirect_probes_then_suspicion() {
        let mut s = swim(5);
        let (t0, target, seq) = next_ping(&mut s);
        let (t, acts) = step(&mut s);
        assert_eq!(t - t0, Duration::from_millis(500), "indirect after the probe timeout");
        let vias: Vec<NodeId> = acts
            .iter()
            .map(|a| match a {
                Action::SendPingReq { via, target: t, seq: q } => {
                    assert_eq!((*t, *q), (target, seq));
                    *via
                }
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(vias.len(), 3);
        assert!(!vias.contains(&target) && !vias.contains(&ME));
        // Every helper answers with a nack: our links are fine, the target is not.
        for v in &vias {
            s.on_nack(t, *v, seq);
        }
        let (t1, acts) = step(&mut s);
        assert_eq!(t1 - t0, Duration::from_secs(1));
        assert!(acts.contains(&Action::GossipSuspect { id: target, incarnation: 0 }));
        assert_eq!(events(&mut s), vec![Event::Suspect(target)]);
        assert!(s.is_suspect(&Numbered, &target));
        assert_eq!(s.health(), 0, "all nacks came back: no local health penalty");
    }

    #[test]
    fn an_ack_forwarded_by_a_helper_counts() {
        let mut s = swim(5);
        let (_, target, seq) = next_ping(&mut s);
        let (t, acts) = step(&mut s);
        let Some(Action::SendPingReq { via, .. }) = acts.first().copied() else { panic!("{acts:?}") };
        s.on_ack(t, via, seq);
        let (_, acts) = step(&mut s);
        assert!(!acts.iter().any(|a| matches!(a, Action::GossipSuspect { .. })));
        assert!(!s.is_suspect(&Numbered, &target));
        // A stranger's ack for the same seq would not have counted.
        let mut s = swim(5);
        let (_, target, seq) = next_ping(&mut s);
        step(&mut s);
        s.on_ack(Time::from_secs(1), id(99), seq);
        step(&mut s);
        assert!(s.is_suspect(&Numbered, &target));
    }

    #[test]
    fn helpers_relay_pings_and_forward_acks_or_nack() {
        let mut s = swim(0);
        s.on_ping_req(Time::ZERO, id(1), id(2), 77);
        let [Action::SendPing { to, seq }] = actions(&mut s)[..] else { panic!() };
        assert_eq!(to, id(2));
        s.on_ack(Time::from_millis(5), id(2), seq);
        assert_eq!(actions(&mut s), vec![Action::SendAck { to: id(1), seq: 77 }]);

        s.on_ping_req(Time::from_millis(10), id(1), id(3), 78);
        actions(&mut s);
        let mut out = Vec::new();
        while s.now < Time::from_millis(410) {
            let at = s.next_deadline();
            s.on_timeout(&Numbered, at);
            out.extend(actions(&mut s));
        }
        assert_eq!(s.now, Time::from_millis(410), "nack due at 80% of the probe timeout");
        assert_eq!(out, vec![Action::SendNack { to: id(1), seq: 78 }]);
        // A late ack is not forwarded.
        s.on_ack(s.now, id(3), seq.wrapping_add(1));
        assert!(actions(&mut s).is_empty());
    }

    #[test]
    fn relays_are_bounded() {
        let mut s = swim(0);
        for i in 0..(MAX_RELAYS as u64 + 10) {
            s.on_ping_req(Time::ZERO, id(1), id(100 + i), 0);
        }
        assert_eq!(actions(&mut s).len(), MAX_RELAYS);
    }

    #[test]
    fn missed_nacks_and_failed_probes_raise_local_health_and_acks_lower_it() {
        let mut s = swim(5);
        next_ping(&mut s);
        step(&mut s); // ping-reqs to 3 helpers, none answers
        let (t0, acts) = step(&mut s); // the probe fails and the next one starts
        assert_eq!(s.health(), 3, "three missed nacks");
        // The period is now stretched by LHM + 1.
        let (period, timeout) = s.scaled_timing();
        assert_eq!((period, timeout), (Duration::from_secs(4), Duration::from_secs(2)));
        let Some(&Action::SendPing { to, seq }) = acts.iter().find(|a| matches!(a, Action::SendPing { .. })) else {
            panic!("no probe in {acts:?}")
        };
        s.on_ack(t0, to, seq);
        assert_eq!(s.health(), 2);
        let (t1, _, _) = next_ping(&mut s);
        assert_eq!(t1 - t0, Duration::from_secs(4), "period set when the probe started");
    }

    #[test]
    fn local_health_saturates() {
        // One member: no helpers, +1 per failed probe. Vouched, so that it is never confirmed
        // and stays in the probe order.
        let mut s = swim(1);
        s.set_voucher(&Numbered, id(1), Some(id(99)));
        for _ in 0..40 {
            next_ping(&mut s);
            step(&mut s);
        }
        assert_eq!(s.health(), config().max_health);
    }

    #[test]
    fn incarnations_round_trip_through_bytes() {
        let mut m = Member { incarnation: [0; 8], probeable: true, standing: Standing::Alive };
        m.set_incarnation(u64::MAX - 1);
        assert_eq!(m.incarnation(), u64::MAX - 1, "every incarnation round-trips");
    }

    #[test]
    fn a_suspicion_about_ourselves_is_refuted_with_a_higher_incarnation() {
        let mut s = swim(3);
        assert_eq!(s.on_suspect_gossip(&Numbered, Time::ZERO, ME, 5, id(1)), Rumor::Drop);
        assert_eq!(actions(&mut s), vec![Action::GossipAlive { incarnation: 6 }]);
        assert_eq!((s.incarnation(), s.health()), (6, 1));
        // An older rumor needs no new refutation.
        let _ = s.on_suspect_gossip(&Numbered, Time::ZERO, ME, 5, id(2));
        assert!(actions(&mut s).is_empty());
    }

    #[test]
    fn refutation_lifts_a_suspicion_and_stale_news_is_dropped() {
        let mut s = swim(3);
        assert_eq!(s.on_suspect_gossip(&Numbered, Time::ZERO, id(1), 4, id(2)), Rumor::Spread);
        assert_eq!(events(&mut s), vec![Event::Suspect(id(1))]);
        assert_eq!(s.on_alive_gossip(&Numbered, Time::ZERO, id(1), 4), Rumor::Drop, "same incarnation does not refute");
        assert_eq!(s.on_alive_gossip(&Numbered, Time::ZERO, id(1), 5), Rumor::Spread);
        assert_eq!(events(&mut s), vec![Event::Alive(id(1))]);
        assert_eq!(
            s.on_suspect_gossip(&Numbered, Time::ZERO, id(1), 4, id(3)),
            Rumor::Drop,
            "older than the refutation"
        );
        assert!(!s.is_suspect(&Numbered, &id(1)));
        assert_eq!(s.on_suspect_gossip(&Numbered, Time::ZERO, id(77), 0, id(3)), Rumor::Drop, "unknown member");
    }

    #[test]
    fn a_cut_s_suspicions_give_their_room_back_once_lifted_or_confirmed() {
        // A partition: every member suspected at once, then half refuted and half run out.
        let n = 2_000;
        let mut s = swim(n);
        for i in 1..=n {
            assert_eq!(s.on_suspect_gossip(&Numbered, Time::ZERO, id(i), 0, id(n + 1)), Rumor::Spread);
        }
        let full = s.suspected.capacity();
        assert!(full >= n as usize);
        for i in (1..=n).step_by(2) {
            assert_eq!(s.on_alive_gossip(&Numbered, Time::ZERO, id(i), 1), Rumor::Spread);
        }
        s.on_timeout(&Numbered, Time::from_secs(3600));
        assert!(s.suspected.is_empty() && s.suspicions.is_empty());
        assert!((2..=n).step_by(2).all(|i| s.is_confirmed(&Numbered, &id(i))));
        assert!(
            s.suspected.capacity() <= crate::heap::ROOM_KEPT,
            "{} of room kept after holding {full}",
            s.suspected.capacity()
        );
        s.check_invariants(&Numbered).expect("deadlines and suspects agree");
    }

    #[test]
    fn suspicion_runs_out_into_confirmation_and_the_member_is_no_longer_probed() {
        let mut s = swim(3);
        s.suspect(&Numbered, Time::ZERO, id(1));
        // 4 members: no confirmations expected (n - 2 < K), so a witness waits the shortest
        // timeout.
        let (min, _) = config().suspicion_bounds(4);
        assert_eq!(min, Duration::from_secs(4));
        let mut confirmed_at = None;
        while confirmed_at.is_none() {
            let (at, acts) = step(&mut s);
            for a in acts {
                if let Action::SendPing { to, seq } = a {
                    assert!(!s.is_confirmed(&Numbered, &to), "a confirmed member was probed");
                    s.on_ack(at, to, seq);
                }
            }
            if events(&mut s).contains(&Event::Confirm(id(1))) {
                confirmed_at = Some(at);
            }
        }
        assert_eq!(confirmed_at, Some(Time::ZERO + min));
        assert!(s.is_confirmed(&Numbered, &id(1)));
        for _ in 0..10 {
            let (_, to, seq) = next_ping(&mut s);
            assert_ne!(to, id(1));
            s.on_ack(s.now, to, seq);
        }
        assert_eq!(s.on_alive_gossip(&Numbered, Time::ZERO, id(1), 9), Rumor::Drop, "confirmed is final");
        assert!(s.remove_member(&Numbered, id(1)));
    }

    #[test]
    fn independent_confirmations_shorten_the_suspicion() {
        let mut s = swim(20);
        let (min, max) = config().suspicion_bounds(21);
        s.suspect(&Numbered, Time::ZERO, id(1));
        assert_eq!(s.suspicion_deadline(id(1)) - Time::ZERO, max);
        assert_eq!(s.on_suspect_gossip(&Numbered, Time::ZERO, id(1), 0, ME), Rumor::Drop, "same suspecter again");
        let mut last = max;
        for c in 3..=5 {
            assert_eq!(s.on_suspect_gossip(&Numbered, Time::ZERO, id(1), 0, id(c)), Rumor::Spread);
            let now = s.suspicion_deadline(id(1)) - Time::ZERO;
            assert!(now < last, "confirmation {c} did not shorten the timeout");
            last = now;
        }
        assert_eq!(last, min);
        assert_eq!(s.on_suspect_gossip(&Numbered, Time::ZERO, id(1), 0, id(6)), Rumor::Drop, "beyond K is no news");
    }

    #[test]
    fn only_a_witness_confirms_early() {
        let mut s = swim(20);
        let (min, max) = config().suspicion_bounds(21);
        for c in 2..=5 {
            assert_eq!(s.on_suspect_gossip(&Numbered, Time::ZERO, id(1), 0, id(c)), Rumor::Spread);
            assert_eq!(s.suspicion_deadline(id(1)) - Time::ZERO, max, "a rumor alone waits the longest");
        }
        // Our own probe fails too: the confirmations heard so far count at once. The suspecter
        // list is full, so our suspicion is not news to spread.
        s.suspect(&Numbered, Time::from_secs(1), id(1));
        assert_eq!(s.suspicion_deadline(id(1)) - Time::ZERO, min);
        assert!(actions(&mut s).iter().all(|a| !matches!(a, Action::GossipSuspect { .. })));
    }

    #[test]
    fn a_witness_whose_shortened_timeout_has_passed_confirms_in_the_same_timeout() {
        // A rumor heard at 1 s waits `max`; our own pings are answered until `min` has passed,
        // then not. The probe that fails then makes us a witness whose timeout, `min` (one
        // member, so no confirmations are expected), ran out already: the same `on_timeout`
        // confirms it, and no deadline is left in the past.
        let mut s = swim(1);
        let (min, max) = config().suspicion_bounds(s.cluster_size());
        let heard = Time::from_secs(1);
        assert_eq!(s.on_suspect_gossip(&Numbered, heard, id(1), 0, id(9)), Rumor::Spread);
        let mut confirmed = None;
        while confirmed.is_none() && s.next_deadline() < heard + max {
            let now = s.next_deadline();
            s.on_timeout(&Numbered, now);
            assert!(s.next_deadline() > now, "deadline {} left at {now}", s.next_deadline());
            for a in actions(&mut s) {
                if let Action::SendPing { to, seq } = a {
                    if now < heard + min {
                        s.on_ack(now, to, seq);
                    }
                }
            }
            if events(&mut s).contains(&Event::Confirm(id(1))) {
                confirmed = Some(now);
            }
        }
        let at = confirmed.expect("never confirmed");
        assert!(at > heard + min && at < heard + max, "confirmed at {at}");
    }

    #[test]
    fn vouched_members_are_not_suspected_until_the_voucher_goes() {
        let mut s = swim(3);
        s.add_member(&Numbered, Time::ZERO, id(10), 0, false);
        s.set_voucher(&Numbered, id(10), Some(id(1)));
        assert_eq!(s.on_suspect_gossip(&Numbered, Time::ZERO, id(10), 0, id(2)), Rumor::Drop);
        s.suspect(&Numbered, Time::ZERO, id(10));
        assert!(!s.is_suspect(&Numbered, &id(10)));
        s.remove_member(&Numbered, id(1));
        assert_eq!(s.on_suspect_gossip(&Numbered, Time::ZERO, id(10), 0, id(2)), Rumor::Spread);
        assert!(s.is_suspect(&Numbered, &id(10)));
        s.set_voucher(&Numbered, id(10), Some(id(3)));
        assert!(!s.is_suspect(&Numbered, &id(10)));
        assert_eq!(events(&mut s), vec![Event::Suspect(id(10)), Event::Alive(id(10))]);
        // The voucher itself losing the member ends the vouching.
        assert_eq!(s.on_suspect_gossip(&Numbered, Time::ZERO, id(10), 0, id(3)), Rumor::Spread);
        assert!(s.is_suspect(&Numbered, &id(10)));
    }

    #[test]
    fn an_anchor_that_loses_its_member_suspects_it_despite_vouching_for_it() {
        let mut s = swim(2);
        s.add_member(&Numbered, Time::ZERO, id(10), 0, false);
        s.set_voucher(&Numbered, id(10), Some(ME));
        assert_eq!(s.on_suspect_gossip(&Numbered, Time::ZERO, id(10), 0, id(1)), Rumor::Drop, "we hold its connection");
        s.suspect(&Numbered, Time::ZERO, id(10));
        assert!(s.is_suspect(&Numbered, &id(10)));
        assert_eq!(actions(&mut s), vec![Action::GossipSuspect { id: id(10), incarnation: 0 }]);
    }

    #[test]
    fn an_anchor_holds_a_lease_on_its_member_pinging_it_in_silence_and_suspecting_it_after() {
        let lease = config().vouch_lease;
        let mut s = swim(2);
        s.add_member(&Numbered, Time::ZERO, id(10), 0, false);
        s.set_voucher(&Numbered, id(10), Some(ME));
        // Runs to `until`, answering every ping while `answers` says so; returns the pings
        // the member got and the events.
        let run = |s: &mut Swim, until: Time, answers: bool| {
            let (mut pinged, mut evs) = (Vec::new(), Vec::new());
            while s.next_deadline() <= until {
                let (at, acts) = step(s);
                for a in acts {
                    if let Action::SendPing { to, seq } = a {
                        if to == id(10) {
                            pinged.push(at);
                        }
                        if answers || to != id(10) {
                            s.on_ack(at, to, seq);
                        }
                    }
                }
                evs.extend(events(s));
            }
            (pinged, evs)
        };
        // Answering: pinged after a third of the lease in silence, never suspected.
        let (pinged, evs) = run(&mut s, Time::from_secs(60), true);
        assert!(evs.is_empty(), "{evs:?}");
        assert!(pinged.len() >= 15 && pinged.len() <= 60, "{} lease pings in 60 s", pinged.len());
        // Other traffic renews the lease: no pings while it talks to us.
        let mut t = Time::from_secs(60);
        let mut quiet = 0;
        while t < Time::from_secs(70) {
            s.heard_from(t, id(10));
            t = t + Duration::from_millis(500);
            let (pinged, _) = run(&mut s, t, true);
            quiet += pinged.len();
        }
        assert_eq!(quiet, 0, "pinged while it talked to us");
        // Killed at 70 s without a word: suspected a lease after it was last heard.
        let last = Time::from_secs(70).saturating_sub(Duration::from_millis(500));
        let mut suspected = None;
        let mut pings = 0;
        while suspected.is_none() && s.next_deadline() < Time::from_secs(120) {
            let (at, acts) = step(&mut s);
            pings += acts.iter().filter(|a| matches!(a, Action::SendPing { to, .. } if *to == id(10))).count();
            for a in acts {
                if let Action::SendPing { to, seq } = a {
                    if to != id(10) {
                        s.on_ack(at, to, seq);
                    }
                }
            }
            if events(&mut s).contains(&Event::Suspect(id(10))) {
                suspected = Some(at);
            }
        }
        let at = suspected.expect("never suspected");
        assert!(at >= last + lease && at <= last + lease + lease / 6, "suspected at {at}, last heard {last}");
        assert!(pings >= 4, "only {pings} pings before giving up");
        // Its refutation makes the anchor vouch again: others' suspicions are dropped.
        assert_eq!(s.on_alive_gossip(&Numbered, at, id(10), 1), Rumor::Spread);
        assert_eq!(events(&mut s), vec![Event::Alive(id(10))]);
        assert_eq!(s.on_suspect_gossip(&Numbered, at, id(10), 1, id(1)), Rumor::Drop, "we vouch for it again");
        // Losing the connection ends the lease: no more lease pings.
        s.suspect(&Numbered, at, id(10));
        let (pinged, _) = run(&mut s, at + lease * 4, false);
        assert!(pinged.is_empty(), "pinged after the connection closed: {pinged:?}");
    }

    #[test]
    fn unprobeable_members_are_never_probed() {
        let mut s = swim(2);
        s.add_member(&Numbered, Time::ZERO, id(10), 0, false);
        s.add_member(&Numbered, Time::ZERO, id(11), 0, true);
        s.set_probeable(&Numbered, id(11), false);
        for _ in 0..30 {
            let (t, to, seq) = next_ping(&mut s);
            assert!(to == id(1) || to == id(2), "probed {to:?}");
            s.on_ack(t, to, seq);
        }
    }

    /// A directory that deletes as the replica does: the last entry moves into the hole.
    struct Slots(Vec<NodeId>);

    impl Directory for Slots {
        fn number(&self, id: &NodeId) -> Option<u32> {
            self.0.iter().position(|x| x == id).map(|n| n as u32)
        }

        fn id(&self, n: u32) -> NodeId {
            self.0[n as usize]
        }
    }

    #[test]
    fn members_follow_the_directory_when_a_deletion_moves_an_entry() {
        // The local node, members 1, 3, 4 and 5, and at number 2 a tombstone (no member).
        let mut dir = Slots([0, 1, 9, 3, 4, 5].map(id).to_vec());
        let mut s = Swim::new(ME, config(), 7, Time::ZERO);
        for k in [1, 3, 4, 5] {
            assert!(s.add_member(&dir, Time::ZERO, id(k), k, true));
        }
        assert!(!s.add_member(&dir, Time::ZERO, id(77), 0, true), "not in the directory");
        assert_eq!(s.on_suspect_gossip(&dir, Time::ZERO, id(5), 5, id(1)), Rumor::Spread);
        // The tombstone is deleted: 5 moves from number 5 to number 2.
        dir.0.swap_remove(2);
        s.renumber(5, 2);
        assert!(s.is_suspect(&dir, &id(5)) && !s.is_suspect(&dir, &id(4)));
        // Its suspicion, kept by member number, moved with it.
        assert_eq!(s.suspected_since(&dir, &id(5)), Some(Time::ZERO));
        assert_eq!(s.suspicions.iter().map(|&(_, n)| n).collect::<Vec<_>>(), [2]);
        assert_eq!(s.member_incarnation(&dir, &id(5)), Some(5));
        assert_eq!(s.member_incarnation(&dir, &id(3)), Some(3));
        assert!(s.remove_member(&dir, id(3)));
        assert_eq!(s.cluster_size(), 4);
        s.check_invariants(&dir).expect("consistent after the move");
        // Two passes probe 1, 4 and 5 once each, whatever their numbers now.
        let mut probed = Vec::new();
        while probed.len() < 6 {
            let at = s.next_deadline();
            s.on_timeout(&dir, at);
            for a in actions(&mut s) {
                if let Action::SendPing { to, seq } = a {
                    probed.push(to);
                    s.on_ack(at, to, seq);
                }
            }
        }
        for pass in probed.chunks(3) {
            let mut pass = pass.to_vec();
            pass.sort();
            assert_eq!(pass, [1, 4, 5].map(id));
        }
    }

    #[test]
    fn same_seed_same_probes() {
        let run = || {
            let mut s = swim(30);
            (0..60)
                .map(|_| {
                    let (t, to, seq) = next_ping(&mut s);
                    s.on_ack(t, to, seq);
                    (t, to)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }

    impl Swim {
        fn suspicion_deadline(&self, id: NodeId) -> Time {
            match self.members.get(&Numbered, &id).expect("a member").standing {
                Standing::Suspect => self.suspected[&Numbered.number(&id).expect("numbered")].deadline(&self.config),
                _ => Time::NEVER,
            }
        }

        /// The count of probed members is right and the cursor within its pass; the suspicion
        /// deadlines are exactly those of the suspected members.
        fn check_invariants(&self, dir: &impl Directory) -> Result<(), InvariantError> {
            let probed = self.members.iter().filter(|(_, m)| m.is_probed()).count();
            if probed != self.probed {
                return Err(InvariantError::ProbedCount { probed, counted: self.probed });
            }
            if self.cursor > self.pass.len() {
                return Err(InvariantError::CursorOverPass { cursor: self.cursor, len: self.pass.len() });
            }
            let expected: BTreeSet<(Time, u32)> = self
                .members
                .iter()
                .filter_map(|(n, m)| match m.standing {
                    Standing::Suspect => Some((self.suspected.get(&n)?.deadline(&self.config), n)),
                    _ => None,
                })
                .collect();
            let suspects = self.members.iter().filter(|(_, m)| m.standing == Standing::Suspect).count();
            if suspects != self.suspected.len() || expected.len() != suspects {
                return Err(InvariantError::SuspicionCount { suspects, kept: self.suspected.len() });
            }
            if expected != self.suspicions {
                return Err(InvariantError::SuspicionDeadlines { kept: self.suspicions.clone(), expected });
            }
            if self.health > self.config.max_health {
                return Err(InvariantError::HealthOverMax { health: self.health, max: self.config.max_health });
            }
            // Leases are held on members only, and a held lease is checked.
            if let Some(&id) = self.leases.keys().find(|id| !self.members.contains_key(dir, id)) {
                return Err(InvariantError::LeaseOnNonMember { id });
            }
            if !self.leases.is_empty() && self.next_lease_check == Time::NEVER {
                return Err(InvariantError::LeasesUnchecked);
            }
            Ok(())
        }
    }

    /// A broken invariant of [`Swim`]'s bookkeeping. Checking changes nothing.
    #[derive(Debug, thiserror::Error)]
    enum InvariantError {
        /// The count of probed members is off.
        #[error("{probed} members probed, {counted} counted")]
        ProbedCount {
            /// Probeable members not confirmed dead.
            probed: usize,
            /// The count kept.
            counted: usize,
        },
        /// The cursor is past the end of the pass.
        #[error("cursor {cursor} over a pass of {len}")]
        CursorOverPass {
            /// The cursor.
            cursor: u64,
            /// The places in the pass.
            len: u64,
        },
        /// The suspicions kept do not match the suspected members in number.
        #[error("{suspects} suspects, {kept} suspicions kept")]
        SuspicionCount {
            /// Members standing as suspect.
            suspects: usize,
            /// Suspicions kept.
            kept: usize,
        },
        /// The suspicion deadlines do not match those of the suspected members.
        #[error("suspicion deadlines {kept:?}, members say {expected:?}")]
        SuspicionDeadlines {
            /// The deadlines kept.
            kept: BTreeSet<(Time, u32)>,
            /// The deadlines the suspected members have.
            expected: BTreeSet<(Time, u32)>,
        },
        /// Local health is over its maximum.
        #[error("health {health} over {max}")]
        HealthOverMax {
            /// Local health.
            health: u8,
            /// Its maximum.
            max: u8,
        },
        /// A lease is held on a node that is not a member.
        #[error("lease on {id:?}, not a member")]
        LeaseOnNonMember {
            /// The node.
            id: NodeId,
        },
        /// Leases are held but no lease check is scheduled.
        #[error("leases held but never checked")]
        LeasesUnchecked,
    }

    #[derive(Clone, Debug)]
    enum Input {
        Add(u64, u64, bool),
        Remove(u64),
        Probeable(u64, bool),
        Voucher(u64, Option<u64>),
        Suspect(u64),
        Ping(u64, u32),
        PingReq(u64, u64, u32),
        AckProbe(bool),
        Ack(u64, u32),
        Nack(u64, u32),
        SuspectGossip(u64, u64, u64),
        AliveGossip(u64, u64),
        Timeout,
        Incarnation(u64),
        Heard(u64),
    }

    fn input() -> impl Strategy<Value = Input> {
        let n = || 0u64..10; // 0 is this node
        prop_oneof![
            3 => (n(), 0u64..4, any::<bool>()).prop_map(|(a, i, p)| Input::Add(a, i, p)),
            1 => n().prop_map(Input::Remove),
            1 => (n(), any::<bool>()).prop_map(|(a, p)| Input::Probeable(a, p)),
            1 => (n(), prop::option::of(n())).prop_map(|(a, v)| Input::Voucher(a, v)),
            1 => n().prop_map(Input::Suspect),
            1 => (n(), 0u32..6).prop_map(|(a, q)| Input::Ping(a, q)),
            1 => (n(), n(), 0u32..6).prop_map(|(a, b, q)| Input::PingReq(a, b, q)),
            2 => any::<bool>().prop_map(Input::AckProbe),
            1 => (n(), 0u32..6).prop_map(|(a, q)| Input::Ack(a, q)),
            1 => (n(), 0u32..6).prop_map(|(a, q)| Input::Nack(a, q)),
            2 => (n(), 0u64..5, n()).prop_map(|(a, i, f)| Input::SuspectGossip(a, i, f)),
            1 => (n(), 0u64..6).prop_map(|(a, i)| Input::AliveGossip(a, i)),
            4 => Just(Input::Timeout),
            1 => (0u64..8).prop_map(Input::Incarnation),
            1 => n().prop_map(Input::Heard),
        ]
    }

    proptest! {
        /// Any sequence of inputs, at times that may even go backwards: no panic, and the
        /// internal tables stay consistent.
        #[test]
        fn arbitrary_inputs_keep_the_detector_consistent(
            seed in any::<u64>(),
            inputs in prop::collection::vec((input(), 0u64..3_000_000), 1..200),
        ) {
            let mut s = Swim::new(ME, config(), seed, Time::ZERO);
            let mut pings: Vec<(NodeId, u32)> = Vec::new();
            for (i, at) in inputs {
                let now = Time(at);
                match i {
                    Input::Add(a, inc, p) => { s.add_member(&Numbered, now, id(a), inc, p); }
                    Input::Remove(a) => { s.remove_member(&Numbered, id(a)); }
                    Input::Probeable(a, p) => s.set_probeable(&Numbered, id(a), p),
                    Input::Voucher(a, v) => s.set_voucher(&Numbered, id(a), v.map(id)),
                    Input::Suspect(a) => s.suspect(&Numbered, now, id(a)),
                    Input::Ping(a, q) => s.on_ping(now, id(a), q),
                    Input::PingReq(a, b, q) => s.on_ping_req(now, id(a), id(b), q),
                    Input::AckProbe(answer) => {
                        if let Some((to, seq)) = pings.pop() {
                            if answer { s.on_ack(now, to, seq) } else { s.on_nack(now, to, seq) }
                        }
                    }
                    Input::Ack(a, q) => s.on_ack(now, id(a), q),
                    Input::Nack(a, q) => s.on_nack(now, id(a), q),
                    Input::SuspectGossip(a, inc, f) => { let _ = s.on_suspect_gossip(&Numbered, now, id(a), inc, id(f)); }
                    Input::AliveGossip(a, inc) => { let _ = s.on_alive_gossip(&Numbered, now, id(a), inc); }
                    Input::Timeout => { let at = s.next_deadline(); if at != Time::NEVER { s.on_timeout(&Numbered, at); } }
                    Input::Incarnation(inc) => s.set_incarnation(inc),
                    Input::Heard(a) => s.heard_from(now, id(a)),
                }
                for a in actions(&mut s) {
                    match a {
                        Action::SendPing { to, seq } => pings.push((to, seq)),
                        Action::SendPingReq { via, seq, .. } => pings.push((via, seq)),
                        _ => {}
                    }
                }
                for e in events(&mut s) {
                    if let Event::Confirm(dead) = e {
                        prop_assert!(s.is_confirmed(&Numbered, &dead));
                    }
                }
                if let Err(e) = s.check_invariants(&Numbered) {
                    prop_assert!(false, "{}", e);
                }
            }
        }

        /// Random acks, nacks and silence: local health stays within bounds and, within a pass,
        /// no member is probed twice, while members join and leave.
        #[test]
        fn health_is_bounded_and_no_member_is_probed_twice_in_a_pass(
            seed in any::<u64>(),
            steps in prop::collection::vec((0u8..6, 0u64..40), 1..300),
        ) {
            let mut s = Swim::new(ME, config(), seed, Time::ZERO);
            for i in 1..=12 {
                s.add_member(&Numbered, Time::ZERO, id(i), 0, true);
            }
            let mut pass = s.passes;
            let mut seen: Vec<NodeId> = Vec::new();
            for (what, n) in steps {
                let at = s.next_deadline();
                s.on_timeout(&Numbered, at);
                for a in actions(&mut s) {
                    if let Action::SendPing { to, seq } = a {
                        if s.passes != pass {
                            pass = s.passes;
                            seen.clear();
                        }
                        if s.probe.as_ref().is_some_and(|p| p.seq == seq) {
                            prop_assert!(!seen.contains(&to), "{:?} probed twice in pass {}", to, pass);
                            seen.push(to);
                        }
                        if what == 0 {
                            s.on_ack(at, to, seq);
                        }
                    }
                    if let Action::SendPingReq { via, seq, .. } = a {
                        if what == 1 {
                            s.on_nack(at, via, seq);
                        }
                    }
                }
                match what {
                    2 => { s.add_member(&Numbered, at, id(n), 0, true); }
                    3 => {
                        // A member that leaves and joins again is a new member.
                        s.remove_member(&Numbered, id(n));
                        seen.retain(|m| *m != id(n));
                    }
                    4 => { let _ = s.on_suspect_gossip(&Numbered, at, ME, n, id(1)); }
                    _ => {}
                }
                prop_assert!(s.health() <= config().max_health);
                let _ = events(&mut s);
            }
        }
    }
}

#[cfg(test)]
mod failure_detection;
