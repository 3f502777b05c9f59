//! How a node learns who is in the federation and spreads the registry: SWIM failure detection
//! with Lifeguard-style suspicion, changes piggybacked on the probes, hashed-bucket
//! anti-entropy, and anchor leases for outbound-only nodes. There is one membership protocol;
//! every member runs it (a member of another wire version is refused at admission).
//!
//! Heartbeats are not flooded (at 10,000 nodes every node would hear 10,000 a second). A node:
//!
//! - probes one member per protocol period with the [`Swim`] failure detector (ping, then
//!   ping-req through helpers) and lets Lifeguard's suspicion decide who failed; a confirmed
//!   failure marks the record DOWN in the same generation, a monotone mark of the lattice that
//!   spreads like any change, and the failed node, should it still be alive, refutes it with a
//!   new generation (the usual refute path). Nodes whose own probes of it failed confirm
//!   first; the others wait the longest suspicion timeout for their mark instead of each
//!   signing one ([`crate::swim`], point 4);
//! - piggybacks updates on every probe datagram: the probe header first, then suspicions, then
//!   records, each from its own [`BroadcastQueue`] (one item per node in each, so a suspicion
//!   never replaces a record or the other way round), as many as fit below `max_datagram`;
//! - spreads only changes: its own record whenever it changes, and every merged record that was
//!   news, unless it came in a bulk transfer (a joining node pulling the registry, which is old
//!   news to everyone else). The heartbeat is not bumped on a timer; it moves with the owner's
//!   changes and with refutations, so within a generation it is the SWIM incarnation. A suspected node
//!   refutes by bumping its heartbeat above the suspected one and spreading its record;
//! - pushes each record whole for its first `eager_sends` sends only, then announces it by id
//!   and version ([`Piggyback::Have`], ~23 bytes against ~160) for the rest of its sends
//!   (Plumtree's eager and lazy push, without the tree): by then nearly every node holds it,
//!   and each further whole copy would be a duplicate. A node that lacks an announced record
//!   asks the announcer for it ([`Message::Fetch`], answered with gossip of the records, which
//!   the node then spreads like any news), and if no answer comes within 250 ms the
//!   next node that announced it;
//! - sends a piggyback-only [`Message::Gossip`] to `gossip_fanout` random peers every
//!   `gossip_interval`, but only while a queue holds something: an idle federation costs the
//!   probes (and the anti-entropy below) alone. Nobody but its anchors can send to an
//!   outbound-only node, so it pulls: with nothing to spread it sends an empty gossip datagram
//!   to `gossip_fanout` random peers each round, and a gossip datagram from an outbound-only
//!   node is answered with the receiver's news, if it has any (a change is queued only until
//!   it has been sent a few times, so one pull a round found it gone too often);
//! - makes sure a suspect hears of its suspicion, since the epidemic can miss it (an
//!   outbound-only node hears only from its anchors): the suspecter tells a reachable suspect
//!   directly when the suspicion starts and once a second while it runs, and repeats its running
//!   suspicions on its pings. A node that receives a suspicion older than the record it holds
//!   (or is) answers the sender with that record, so a node that missed a refutation learns of
//!   it from the next peer it talks to;
//! - after a cut heals, does not make the two sides refute each other's suspicions (each
//!   refutation a record spread to every node): a suspicion that a member held in doubt here
//!   raised or passed on is not taken in; one of this node from such a member shows mutual
//!   doubt, which a failure never makes, and the node withdraws its own suspicions instead of
//!   refuting (a node that holds most members in doubt, the side cut off, refutes, then
//!   withdraws). Suspicions carry their age, and a node that withdrew takes in none raised
//!   before it did, so members cut off together cannot hand each other theirs back, while a
//!   member that did fail is suspected afresh by whoever probes it next
//!   (`Node::on_suspicion`);
//! - runs one anti-entropy exchange of hashed buckets ([`crate::anti_entropy`]) with a random
//!   peer every `anti_entropy_interval` (`outbound_anti_entropy_interval` on an outbound-only
//!   node, whose pulls miss what has already left its peers' queues), and one with every peer
//!   that connects (a joining node learns the registry this way), each going on with the same
//!   peer while it finds differences, so that partitions heal and whatever piggybacking missed
//!   is repaired; and every [`RECONNECT_INTERVAL`] one more with a random member it holds DOWN
//!   and can reach (Serf reconnects to failed members likewise): peers are otherwise picked
//!   among the living, so the sides of a partition that outlasted the suspicion timeout, each
//!   holding the other DOWN, would never talk again;
//! - keeps LEFT records as tombstones for `tombstone_ttl`, and DOWN records as long (a node
//!   held DOWN for hours is gone): advertised for the first half, then deleted, with a GC
//!   watermark that refuses a stale copy ([`crate::anti_entropy`]);
//! - answers a datagram from a node it holds DOWN in that node's current generation with the
//!   DOWN record (at most once a second per node), so a node confirmed failed
//!   while it was only cut off learns of it, and refutes, as soon as it talks to anyone.
//!
//! Every answer above (news for a pull, refutations of stale suspicions, DOWN notices, fetched
//! records, a suspect told of its suspicion) can be paid from a budget of
//! [`MembershipSettings::answers_per_round`] datagrams per gossip round: beyond it, answers
//! wait for the next round, all of one peer's in one datagram. So what a node sends besides
//! its probes and exchanges is bounded per round whatever it receives. The budget is off by
//! default: measured, it removes the heal's burst but slows the repair after it (see
//! `answers.rs`).
//!
//! Liveness comes from the detector's standing, not from heartbeats: nothing in the replica
//! expires, and a node stops being routable when its record
//! turns DOWN (confirmed failure, drain, engine failure) or LEFT. A node suspected here (by this
//! node's probes or by a suspicion gossiped to it) is not routable while the suspicion runs
//! ([`Replica::set_alive`]): a node that died silently stops getting requests after one failed
//! probe round and the gossip of it, not after the whole suspicion timeout. A refutation (a
//! higher heartbeat) makes it routable again at once.
//!
//! Outbound-only nodes are probed only by peers holding a connection to them, which vouch for
//! them ([`Swim::set_voucher`]): suspicions of them from anyone else are dropped while a
//! voucher holds the connection. A voucher that loses the connection raises the suspicion
//! itself, and so does one that hears nothing from the node for a lease (3 s; every message from
//! it counts, and a silent one is pinged every half second from a third of the lease on): a
//! killed process's connection would otherwise linger until the transport's idle timeout. A
//! voucher's probe of such a node carries updates to it but judges nothing: few helpers can
//! reach it, and one lost datagram would be a suspicion.
//!
//! The load summary in records is not refreshed by gossip (it would have to be flooded);
//! routing reads load from the gateway's own accounting.
//!
//! Every message a node receives goes through one dispatch, `Node::on_message`.
//!
//! # Layout
//!
//! This file holds the settings, the membership's state in a node and how the registry and
//! the connections feed the failure detector; the rest adds to [`Node`] in submodules:
//! `dispatch` (every message received, by kind), `detector` (the detector's actions into
//! datagrams and its events into registry changes), `suspicion` (queued suspicions, stale ones
//! answered, nodes held DOWN told so), `fetch` (records announced and fetched) and `gossip`
//! (the gossip round and the membership's timers).
//!
//! [`RECONNECT_INTERVAL`]: crate::anti_entropy::RECONNECT_INTERVAL
//! [`Replica::set_alive`]: crate::replica::Replica::set_alive
//! [`Message::Gossip`]: crate::wire::Message::Gossip
//! [`Message::Fetch`]: crate::wire::Message::Fetch
//! [`Piggyback::Have`]: crate::wire::Piggyback::Have

use crate::answers::Answers;
use crate::broadcast::{BroadcastQueue, Order, RecordUpdate};
use crate::id::NodeId;
use crate::intern::Encoding;
use crate::node::Node;
use crate::record::{Lifecycle, Reachability, Record, SharedRecord};
use crate::swim::{Rumor, Swim, SwimConfig};
use crate::time::Time;
use crate::timer::Timer;
use core::time::Duration;
use foldhash::fast::FixedState;
use hashbrown::HashMap;
use std::collections::BTreeSet;

mod detector;
mod dispatch;
mod fetch;
mod gossip;
mod suspicion;

use fetch::Fetching;
use suspicion::QueuedSuspicion;

/// How the membership protocol runs ([`crate::Config::membership`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipSettings {
    /// The failure detector's settings.
    pub detector: SwimConfig,
    /// Time between piggyback-only gossip rounds (sent only while there is news).
    pub gossip_interval: Duration,
    /// Peers sent each gossip round.
    pub gossip_fanout: usize,
    /// `lambda`: each suspicion is sent `ceil(lambda · log2(n + 1))` times in a cluster of `n`,
    /// each record `lambda · ceil(log10(n + 1))` times (memberlist's limit: records are large,
    /// and anti-entropy repairs what the epidemic misses).
    pub retransmit_mult: u32,
    /// Times a record is pushed whole before it is only announced by its id and [`Version`](crate::Version); a
    /// receiver that lacks an announced record fetches it from the announcer.
    /// Of a record's `lambda · ceil(log10(n + 1))` sends, the first few reach most nodes for the
    /// first time and the rest mostly nodes that hold it.
    pub eager_sends: u32,
    /// Datagrams of answers (refutations, DOWN notices, fetched records, news for a pull, a
    /// suspect told of its suspicion) a node sends per gossip round; answers beyond wait for the
    /// next round. None (the default): every answer goes out at once.
    pub answers_per_round: Option<usize>,
    /// Most updates each broadcast queue holds.
    pub queue_capacity: usize,
    /// Time between anti-entropy exchanges (hashed buckets of the registry compared and
    /// repaired) with one random peer.
    pub anti_entropy_interval: Duration,
    /// The same for an outbound-only node (at most `anti_entropy_interval`). Nobody can gossip
    /// to it but its anchors; its pulls are answered only with what the peer still has queued,
    /// which is gone a second after a change has spread, so a pull it loses leaves it behind
    /// until its next exchange. Exchanges are cheap when nothing differs (one datagram of
    /// bucket hashes, at most ~550 bytes), so these nodes run them more often.
    pub outbound_anti_entropy_interval: Duration,
    /// How long a LEFT or DOWN record is kept: advertised for half of it, then deleted at the
    /// end, its generation remembered for as long again so that a stale copy is refused. Must be
    /// far longer than the longest partition expected to heal.
    pub tombstone_ttl: Duration,
}

impl Default for MembershipSettings {
    /// The detector's defaults (1 s periods), gossip every 200 ms to 3 peers while there is news,
    /// `lambda` 4, queues of 4,096 updates, anti-entropy every 10 s (every 2 s on outbound-only
    /// nodes), tombstones kept 6 h.
    fn default() -> MembershipSettings {
        MembershipSettings {
            detector: SwimConfig::default(),
            gossip_interval: Duration::from_millis(200),
            gossip_fanout: 3,
            retransmit_mult: 4,
            eager_sends: 4,
            answers_per_round: None,
            queue_capacity: 4096,
            anti_entropy_interval: Duration::from_secs(10),
            outbound_anti_entropy_interval: Duration::from_secs(2),
            tombstone_ttl: Duration::from_secs(6 * 3600),
        }
    }
}

/// The membership protocol's state in a node: the failure detector, the piggyback queues,
/// suspicions running here, and records being fetched.
#[derive(Clone, Debug)]
pub(crate) struct Membership {
    settings: MembershipSettings,
    pub(crate) detector: Swim,
    records: BroadcastQueue<RecordUpdate>,
    suspicions: BroadcastQueue<QueuedSuspicion>,
    /// Members suspected here right now.
    suspects: BTreeSet<NodeId>,
    /// When the suspects are next told of their suspicion directly.
    next_notice: Time,
    /// Nodes held DOWN that were sent their DOWN record, and when; pruned as it grows.
    told_down: Vec<(NodeId, Time)>,
    /// When this node last withdrew its suspicions after a healed cut: suspicions raised before
    /// are the cut's and not taken in again.
    withdrawn: Option<Time>,
    /// Records being fetched after an announcement, by node.
    fetching: HashMap<NodeId, Fetching, FixedState>,
    /// The answers budget and the answers owed.
    pub(crate) answers: Answers,
    /// When the next gossip round is due on the round grid (the first round plus whole
    /// intervals), whether or not its timer is armed: a round with nothing to do is skipped,
    /// and the timer is re-armed at the next grid point once there is work again.
    next_round: Time,
}

impl Membership {
    /// Adds the heap bytes of the membership's tables to `heap` ([`crate::heap`]).
    pub(crate) fn heap_bytes(&self, heap: &mut crate::heap::HeapBytes) {
        use crate::heap::{array, btree, hash_table};
        self.detector.heap_bytes(heap);
        heap.queues += self.records.heap_bytes() + self.suspicions.heap_bytes();
        heap.suspicions += btree::<NodeId>(self.suspects.len());
        heap.other += array::<(NodeId, Time)>(self.told_down.capacity())
            + hash_table::<(NodeId, Fetching)>(self.fetching.capacity())
            + self.answers.heap_bytes();
    }

    pub(crate) fn new(settings: MembershipSettings, local: NodeId, rng_seed: u64, now: Time) -> Membership {
        let detector = Swim::new(local, settings.detector.clone(), rng_seed ^ 0x5157_494d, now);
        let lambda = f64::from(settings.retransmit_mult);
        Membership {
            records: BroadcastQueue::per_decade(lambda, settings.queue_capacity).in_order(Order::Newest),
            suspicions: BroadcastQueue::new(lambda, settings.queue_capacity),
            suspects: BTreeSet::new(),
            next_notice: now,
            told_down: Vec::new(),
            withdrawn: None,
            fetching: HashMap::default(),
            answers: Answers::new(settings.answers_per_round),
            next_round: now,
            detector,
            settings,
        }
    }

    /// Updates waiting to be piggybacked, records and suspicions.
    pub(crate) fn queued(&self) -> (usize, usize) {
        (self.records.len(), self.suspicions.len())
    }

    /// Whether this node suspects `id` right now.
    pub(crate) fn is_suspect(&self, id: &NodeId) -> bool {
        self.suspects.contains(id)
    }
}

/// The time between anti-entropy exchanges of a node reachable as `reach`: shorter when it is
/// outbound-only.
pub(super) fn repair_interval(reach: &Reachability, settings: &MembershipSettings) -> Duration {
    if *reach == Reachability::OutboundOnly {
        settings.outbound_anti_entropy_interval.min(settings.anti_entropy_interval)
    } else {
        settings.anti_entropy_interval
    }
}

impl Node {
    /// Arms the membership's timers and queues the node's first record.
    pub(crate) fn start_membership(&mut self) {
        let st = &self.membership;
        let gossip = st.settings.gossip_interval;
        let first_repair = repair_interval(&self.config.reach, &st.settings).min(gossip.saturating_mul(10));
        let jitter = self.jitter(gossip);
        self.membership.next_round = self.now + jitter;
        self.timers.set(Timer::Gossip, self.now + jitter);
        let jitter = self.jitter(first_repair);
        self.timers.set(Timer::AntiEntropy, self.now + jitter);
        self.spread_local_change();
        self.drive_detector();
    }

    /// Queues the local record after the owner changed it.
    pub(crate) fn spread_local_change(&mut self) {
        let own = self.replica.local().clone();
        self.queue_record(own);
    }

    fn queue_record(&mut self, record: SharedRecord) {
        let Some(encoded) = self.piggyback_encoding(&record) else { return };
        let st = &mut self.membership;
        st.records.push(RecordUpdate::with_encoding(record, encoded, st.settings.eager_sends));
    }

    /// `record` encoded as a [`Piggyback::Record`](crate::wire::Piggyback::Record), shared with every node that holds the same
    /// record where the interner pools them.
    pub(crate) fn piggyback_encoding(&self, record: &SharedRecord) -> Option<Encoding> {
        let encode = |record: &Record| {
            let body = postcard::to_allocvec(record).ok()?;
            let mut encoded = Vec::with_capacity(1 + body.len());
            encoded.push(0); // `Piggyback::Record`'s variant index
            encoded.extend_from_slice(&body);
            Some(Encoding::from(encoded))
        };
        self.config.interner.encoding(record, &encode)
    }

    /// A merge changed `id`'s record (it was at `before`, a generation, if known): spread it
    /// (unless `spread` is false) and bring the detector's membership in line.
    pub(crate) fn record_changed(&mut self, id: NodeId, before: Option<u64>, spread: bool) {
        let Some(slot) = self.replica.get(&id) else { return };
        let record = slot.record().clone();
        let probeable = self.reachable(&record);
        let vouch = record.reach == Reachability::OutboundOnly && self.connected.binary_search(&id).is_ok();
        if spread {
            self.queue_record(record.clone());
        }
        let (now, me) = (self.now, self.config.id);
        let st = &mut self.membership;
        if record.state >= Lifecycle::Down || before.is_some_and(|g| g != record.generation) {
            st.detector.remove_member(&self.replica, id);
            st.suspicions.remove(&id);
            st.suspects.remove(&id);
            if record.state >= Lifecycle::Down {
                return;
            }
        }
        if !st.detector.add_member(&self.replica, now, id, record.heartbeat, probeable)
            && st.detector.on_alive_gossip(&self.replica, now, id, record.heartbeat) == Rumor::Spread
        {
            // The record at the higher heartbeat is the refutation; the suspicion is stale.
            st.suspicions.remove(&id);
        }
        if vouch && !st.detector.is_suspect(&self.replica, &id) {
            // Connected to it and not suspecting it (again): vouch for it.
            st.detector.set_voucher(&self.replica, id, Some(me));
        }
    }

    /// A connection to `peer` came up or went away.
    pub(crate) fn connection_changed(&mut self, peer: NodeId, up: bool) {
        let (now, me) = (self.now, self.config.id);
        let record = self.replica.get(&peer).map(|s| s.record().clone());
        if up {
            // Joining (or rejoining) the registry: an anti-entropy exchange at once, which goes
            // on with this peer until the registries agree.
            self.start_sync(peer);
        }
        let Some(record) = record.filter(|r| r.state < Lifecycle::Down) else { return };
        let probeable = self.reachable(&record);
        let outbound = record.reach == Reachability::OutboundOnly;
        let st = &mut self.membership;
        st.detector.set_probeable(&self.replica, peer, probeable);
        if outbound {
            if up {
                st.detector.set_voucher(&self.replica, peer, Some(me));
            } else {
                // We vouched for it while connected: losing the connection is our evidence.
                st.detector.suspect(&self.replica, now, peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fetch::{FETCH_RETRY, MAX_FETCH_ANSWERS};
    use super::*;
    use crate::answers::Answers;
    use crate::node::{Config, Output};
    use crate::wire::{Message, Piggyback, ProbeBuilder};

    #[test]
    fn a_lone_node_neither_beats_nor_sends_and_queues_its_record() {
        let mut node = Node::new(Config::new(NodeId::from_u64(1), 1), Time::ZERO);
        assert_eq!(node.swim_queued(), (1, 0));
        // Alone, it sends nothing however long it runs, and its heartbeat stays put.
        let mut now = Time::ZERO;
        for _ in 0..200 {
            loop {
                match node.poll_output() {
                    Output::Transmit(t) => panic!("a lone node sent {t:?}"),
                    Output::Timeout(at) => {
                        now = at;
                        break;
                    }
                    _ => {}
                }
            }
            node.handle_input(now, crate::node::Input::Timeout);
        }
        assert!(now > Time::from_secs(30), "only {now} passed");
        assert_eq!(node.local_record().heartbeat, 0);
    }

    #[test]
    fn idle_rounds_set_no_wake_and_news_wakes_them_on_the_round_grid() {
        use crate::harness::Harness;
        let mut h = Harness::new(3);
        let ids = h.public_star(4, |_| {});
        h.run_for(core::time::Duration::from_secs(20));
        let grid =
            |n: &Node| n.membership.next_round.as_micros() % n.membership.settings.gossip_interval.as_micros() as u64;
        let phases: Vec<u64> = ids.iter().map(|&id| grid(h.node(id))).collect();
        for &id in &ids {
            let n = h.node(id);
            assert_eq!(n.swim_queued(), (0, 0), "{id} has nothing left to gossip");
            assert_eq!(n.timers.get(Timer::Gossip), None, "{id} sleeps between rounds when idle");
        }
        // A change on one node wakes its round on the same grid, and reaches every node.
        h.input(ids[2], crate::node::Input::EngineReady { models: vec![crate::Model::named("m")] });
        let woken = h.node(ids[2]).timers.get(Timer::Gossip).expect("woken by news");
        assert!(woken >= h.now());
        assert_eq!(grid(h.node(ids[2])), phases[2], "on its round grid");
        assert!(h.run_until(core::time::Duration::from_secs(5), |h| {
            ids.iter().all(|&id| h.node(id).replica().serving("m").to_vec() == [ids[2]])
        }));
        h.run_for(core::time::Duration::from_secs(10));
        assert!(ids.iter().all(|&id| h.node(id).timers.get(Timer::Gossip).is_none()), "asleep again");
    }

    /// The detector's members are exactly the replica's other nodes not DOWN or LEFT, each
    /// found at its slot number.
    fn detector_matches_replica(n: &Node) -> bool {
        let (replica, detector) = (&n.replica, &n.membership.detector);
        let live: Vec<NodeId> = replica
            .slots()
            .iter()
            .map(|s| s.record())
            .filter(|r| r.id != n.config.id && r.state < Lifecycle::Down)
            .map(|r| r.id)
            .collect();
        detector.cluster_size() == live.len() + 1
            && live.iter().all(|id| detector.member_incarnation(replica, id).is_some())
    }

    #[test]
    fn deleted_tombstones_move_slots_and_the_detector_follows() {
        use crate::harness::Harness;
        use core::time::Duration;
        let mut h = Harness::new(5);
        let ids = h.public_star(6, |c| c.membership.tombstone_ttl = Duration::from_secs(20));
        h.run_for(Duration::from_secs(10));
        let down = |h: &Harness, who: NodeId| {
            h.running().all(|n| h.node(n).replica().get(&who).is_none_or(|s| s.record().state >= Lifecycle::Down))
        };
        // Node 2's slot is not the last on any node: deleting it moves another slot into it.
        h.kill(ids[1]);
        assert!(h.run_until(Duration::from_secs(20), |h| down(h, ids[1])), "node 2 held DOWN");
        assert!(h.run_until(Duration::from_secs(60), |h| h.running().all(|n| h
            .node(n)
            .replica()
            .get(&ids[1])
            .is_none())));
        for n in h.running() {
            assert!(detector_matches_replica(h.node(n)), "{n}: detector and replica agree after the deletion");
        }
        // Whichever member moved is still probed where it now is: killing each in turn is seen.
        for &victim in &ids[2..5] {
            h.kill(victim);
            assert!(h.run_until(Duration::from_secs(20), |h| down(h, victim)), "{victim} held DOWN");
        }
        h.run_for(Duration::from_secs(5));
        for n in h.running() {
            assert!(detector_matches_replica(h.node(n)), "{n}: detector and replica agree");
        }
    }

    /// Counts the signature checks it is asked for, and answers as [`crate::auth::Strict`] does.
    #[derive(Debug, Default)]
    struct Counting(std::sync::atomic::AtomicUsize);

    impl crate::auth::Verify for Counting {
        fn verify(
            &self,
            signer: &NodeId,
            key: &crate::auth::PublicKey,
            message: &[u8],
            signature: &crate::auth::SignatureBytes,
        ) -> bool {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            crate::auth::Strict { test_identities: true }.verify(signer, key, message, signature)
        }
    }

    #[test]
    fn a_node_merges_its_own_down_mark_unchecked_and_gossips_it() {
        let counting = std::sync::Arc::new(Counting::default());
        let mut c = Config::new(NodeId::from_u64(1), 1);
        c.verifier = crate::auth::Verifier::custom(counting.clone());
        let mut node = Node::new(c, Time::ZERO);
        let peer = NodeId::from_u64(2);
        let mut record =
            Record::new(peer, 5, crate::Role::Serving, crate::Hardware::CPU, crate::Reachability::OutboundOnly);
        crate::auth::Identity::for_test(peer).seal(&mut record);
        node.absorb(record);
        let checks = counting.0.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(checks, 1, "a peer's record is checked");

        node.confirm_down(peer);
        let held = node.replica.get(&peer).expect("held").record().clone();
        assert_eq!(held.state, Lifecycle::Down);
        let mark = held.down_mark().expect("marked");
        assert_eq!(mark.by, NodeId::from_u64(1), "the mark is this node's");
        assert_eq!(crate::auth::check(&held, &crate::auth::Verifier::with_test_identities()), Ok(()), "and valid");
        assert_eq!(counting.0.load(std::sync::atomic::Ordering::Relaxed), checks, "its own mark is not checked");
        assert_eq!(node.stats().confirmed_down, 1);
        let st = &node.membership;
        let queued = st.records.get(&peer).expect("queued for gossip").record();
        assert!(std::sync::Arc::ptr_eq(queued, &held), "the DOWN record replaced the peer's queued record");
    }

    /// A node, its id 1, that holds the signed records of public peers 8 and 9 and
    /// of node 5 at heartbeat 1; returns it with node 5's record.
    fn node_with_peers(eager_sends: u32) -> (Node, Record) {
        let mut c = Config::new(NodeId::from_u64(1), 1);
        c.membership.eager_sends = eager_sends;
        let mut node = Node::new(c, Time::ZERO);
        let signed = |n: u64, reach: Reachability| {
            let mut r = Record::new(NodeId::from_u64(n), 1, crate::Role::Serving, crate::Hardware::CPU, reach);
            r.state = Lifecycle::Serve;
            r.heartbeat = 1;
            crate::auth::Identity::for_test(NodeId::from_u64(n)).seal(&mut r);
            r
        };
        for n in [8, 9] {
            node.absorb(signed(n, Reachability::Public(format!("10.0.0.{n}:7000"))));
        }
        let five = signed(5, Reachability::OutboundOnly);
        node.absorb(five.clone());
        drain(&mut node);
        (node, five)
    }

    /// The datagrams the node sent since the last call, decoded, with their receivers.
    fn drain(node: &mut Node) -> Vec<(NodeId, Message)> {
        let mut out = Vec::new();
        loop {
            match node.poll_output() {
                Output::Transmit(t) => out.push((t.to, crate::wire::decode(&t.payload).expect("decodes"))),
                Output::Timeout(_) => return out,
                _ => {}
            }
        }
    }

    fn gossip(node: &mut Node, at: Time, from: u64, items: Vec<Piggyback>) -> Vec<(NodeId, Message)> {
        let payload = crate::wire::encode_unbounded(&Message::Gossip(items));
        node.handle_input(at, crate::node::Input::Datagram { from: NodeId::from_u64(from), payload: payload.into() });
        drain(node)
    }

    fn fetches(sent: &[(NodeId, Message)]) -> Vec<(u64, Vec<NodeId>)> {
        let to_u64 = |id: &NodeId| u64::from_be_bytes(id.0[8..].try_into().expect("8 bytes"));
        sent.iter()
            .filter_map(|(to, m)| match m {
                Message::Fetch(ids) => Some((to_u64(to), ids.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_record_is_pushed_whole_its_eager_sends_then_only_announced() {
        let (mut node, five) = node_with_peers(2);
        let id = five.id;
        let mut forms = Vec::new();
        for _ in 0..6 {
            node.send_probe(NodeId::from_u64(8), ProbeBuilder::gossip(crate::wire::MAX_DATAGRAM), None, true);
            for (_, m) in drain(&mut node) {
                for p in m.piggyback() {
                    match p {
                        Piggyback::Record(r) if r.id == id => forms.push("record"),
                        Piggyback::Have { id: h, version } if *h == id => {
                            assert_eq!(*version, five.version());
                            forms.push("have");
                        }
                        _ => {}
                    }
                }
            }
        }
        // Three nodes: 4 · ceil(log10(4)) = 4 sends, the first two whole.
        assert_eq!(forms, ["record", "record", "have", "have"]);
    }

    #[test]
    fn an_announced_record_is_fetched_once_and_from_the_next_announcer_when_no_answer_comes() {
        let (mut node, five) = node_with_peers(4);
        let mut newer = five.clone();
        newer.heartbeat = 2;
        crate::auth::Identity::for_test(five.id).seal(&mut newer);
        let have = |r: &Record| Piggyback::Have { id: r.id, version: r.version() };
        let t = Time::from_secs(1);

        // What the node holds is not fetched; a later version is, from the announcer.
        assert!(fetches(&gossip(&mut node, t, 8, vec![have(&five)])).is_empty());
        assert_eq!(fetches(&gossip(&mut node, t, 8, vec![have(&newer)])), [(8, vec![five.id])]);
        // A second announcer while the fetch is out is not asked, only remembered.
        assert!(fetches(&gossip(&mut node, t + Duration::from_millis(10), 9, vec![have(&newer)])).is_empty());
        // No answer: the next gossip round after the retry time asks node 9.
        let mut asked = Vec::new();
        let mut now = t;
        while now < t + Duration::from_secs(1) && asked.is_empty() {
            now = now + Duration::from_millis(50);
            node.handle_input(now, crate::node::Input::Timeout);
            asked = fetches(&drain(&mut node));
        }
        assert_eq!(asked, [(9, vec![five.id])]);
        assert!(now >= t + FETCH_RETRY, "asked again after {:?}", now - t);
        // Node 9's answer is merged; announcements of it ask nothing more.
        gossip(&mut node, now, 9, vec![Piggyback::Record(newer.clone())]);
        assert_eq!(node.replica.get(&five.id).map(|s| s.record().version()), Some(newer.version()));
        assert!(fetches(&gossip(&mut node, now, 8, vec![have(&newer)])).is_empty());
        assert_eq!(node.stats().records_fetched, 2);
        // The fetch is forgotten at the next round past the retry time.
        node.handle_input(now + Duration::from_secs(1), crate::node::Input::Timeout);
        assert!(node.membership.fetching.is_empty());
    }

    #[test]
    fn suspicions_from_members_in_doubt_are_ignored_and_mutual_doubt_withdraws_a_nodes_own() {
        let (mut node, five) = node_with_peers(4);
        let [me, five, eight, nine] = [node.config.id, five.id, NodeId::from_u64(8), NodeId::from_u64(9)];
        // At `at`, `sender` gossips suspicions of `(suspect, raised by)` raised `age` hundredths
        // of a second before, at each member's current version.
        let tell = |node: &mut Node, at: Time, sender: u64, age: u16, of: &[(NodeId, NodeId)]| {
            let items = of
                .iter()
                .map(|&(id, from)| {
                    let (generation, heartbeat) = if id == node.config.id {
                        (node.replica.local().generation, node.replica.local().heartbeat)
                    } else {
                        (1, 1)
                    };
                    Piggyback::Suspect { id, generation, heartbeat, from, age }
                })
                .collect();
            gossip(node, at, sender, items);
        };
        let own_heartbeat = |node: &Node| node.replica.local().heartbeat;
        let t = Time::from_secs(10);
        // Node 9 tells of its suspicion of node 8: taken in.
        tell(&mut node, t, 9, 0, &[(eight, nine)]);
        assert!(node.membership.is_suspect(&eight));
        // What node 8, suspected here, raises or passes on is not: neither its suspicion of
        // node 5 nor node 9's of node 5 that it relays.
        tell(&mut node, t, 8, 0, &[(five, eight), (five, nine)]);
        assert!(!node.membership.is_suspect(&five));
        // A suspicion of this node that members not in doubt raised and passed on is refuted,
        // and this node, holding one member in three in doubt, keeps its suspicions.
        let before = own_heartbeat(&node);
        tell(&mut node, t, 9, 0, &[(me, five)]);
        assert!(own_heartbeat(&node) > before);
        assert!(node.membership.is_suspect(&eight));
        // Node 8's suspicion of this node, passed on by node 9: the doubt is mutual, so the cut
        // between them has healed. No refutation; this node withdraws its suspicion of node 8.
        let before = own_heartbeat(&node);
        tell(&mut node, t, 9, 0, &[(me, eight)]);
        assert_eq!(own_heartbeat(&node), before, "a suspecter held in doubt is not answered");
        assert!(!node.membership.is_suspect(&eight));
        assert_eq!(node.stats().suspicions_withdrawn, 1);
        assert_eq!(node.membership.queued().1, 0, "withdrawn suspicions are not gossiped on");
        assert!(node.replica.get(&eight).is_some_and(|s| s.is_alive()), "routable again");
        // Two seconds on, node 9 passes on suspicions of node 8 and node 5 raised three seconds
        // before, during the cut: not taken in again.
        let t = t + Duration::from_secs(2);
        tell(&mut node, t, 9, 300, &[(eight, nine), (five, nine)]);
        assert!(!node.membership.is_suspect(&eight) && !node.membership.is_suspect(&five));
        // Raised a second ago, after the withdrawal: taken in as ever.
        tell(&mut node, t, 9, 100, &[(eight, nine), (five, nine)]);
        assert!(node.membership.is_suspect(&eight) && node.membership.is_suspect(&five));

        // Nodes 5 and 8 in doubt: two members of three, this node is cut off. It refutes
        // whoever suspects it, then withdraws its suspicions.
        assert_eq!(node.membership.queued().1, 2);
        let before = own_heartbeat(&node);
        tell(&mut node, t, 8, 0, &[(me, eight)]);
        assert!(own_heartbeat(&node) > before, "a node cut off refutes whoever tells it");
        assert!(!node.membership.is_suspect(&eight) && !node.membership.is_suspect(&five));
        assert_eq!(node.stats().suspicions_withdrawn, 3);
        assert_eq!(node.membership.queued().1, 0);
        // A suspicion of this node at its new heartbeat, raised before it withdrew, dates from
        // the cut: no refutation. One raised after is refuted.
        let (t, before) = (t + Duration::from_secs(1), own_heartbeat(&node));
        tell(&mut node, t, 9, 150, &[(me, nine)]);
        assert_eq!(own_heartbeat(&node), before);
        tell(&mut node, t, 9, 50, &[(me, nine)]);
        assert!(own_heartbeat(&node) > before);
    }

    #[test]
    fn answers_beyond_a_rounds_budget_wait_for_the_next_round_one_datagram_a_peer() {
        let (mut node, five) = node_with_peers(4);
        let per_round = 3;
        node.config.membership.answers_per_round = Some(per_round);
        node.membership.answers = Answers::new(Some(per_round));
        let stale = Piggyback::Suspect { id: five.id, generation: 1, heartbeat: 0, from: NodeId::from_u64(8), age: 0 };
        let askers: Vec<u64> = (100..110).collect();
        // Who got a correction (five's record) at each instant.
        let corrected = |sent: &[(NodeId, Message)]| -> Vec<NodeId> {
            sent.iter()
                .filter(|(to, m)| {
                    askers.iter().any(|a| NodeId::from_u64(*a) == *to)
                        && m.piggyback().iter().any(|p| matches!(p, Piggyback::Record(r) if r.id == five.id))
                })
                .map(|(to, _)| *to)
                .collect()
        };
        let t = Time::from_millis(10);
        let mut got: Vec<NodeId> = Vec::new();
        for a in &askers {
            got.extend(corrected(&gossip(&mut node, t, *a, vec![stale.clone()])));
        }
        // The last asker asks again while it is owed: still one answer.
        got.extend(corrected(&gossip(&mut node, t, 109, vec![stale.clone()])));
        assert_eq!(got.len(), per_round, "at once, only the round's budget");
        assert!(node.stats().answers_deferred >= (askers.len() - per_round) as u64);
        let mut now = t;
        while now < t + Duration::from_secs(2) {
            now = now + Duration::from_millis(20);
            node.handle_input(now, crate::node::Input::Timeout);
            let round = corrected(&drain(&mut node));
            assert!(round.len() <= per_round, "a round sent {} answers", round.len());
            got.extend(round);
        }
        got.sort();
        let want: Vec<NodeId> = askers.iter().map(|a| NodeId::from_u64(*a)).collect();
        assert_eq!(got, want, "every asker answered once, none dropped");
        assert_eq!(node.stats().answers_dropped, 0);
    }

    #[test]
    fn a_fetch_is_answered_with_the_records_held_as_gossip_in_at_most_two_datagrams() {
        let (mut node, five) = node_with_peers(4);
        let ids: Vec<NodeId> = [5, 8, 9, 77].into_iter().map(NodeId::from_u64).collect();
        let payload = crate::wire::encode_unbounded(&Message::Fetch(ids));
        node.handle_input(
            Time::from_secs(1),
            crate::node::Input::Datagram { from: NodeId::from_u64(8), payload: payload.into() },
        );
        let sent = drain(&mut node);
        let records: Vec<u64> = sent
            .iter()
            .filter(|(to, _)| *to == NodeId::from_u64(8))
            .flat_map(|(_, m)| match m {
                Message::Gossip(items) => items.clone(),
                _ => Vec::new(),
            })
            .filter_map(|p| match p {
                Piggyback::Record(r) => Some(u64::from_be_bytes(r.id.0[8..].try_into().expect("8 bytes"))),
                _ => None,
            })
            .collect();
        assert_eq!(records, [5, 8, 9], "the unknown node 77 is skipped");
        assert!(sent
            .iter()
            .any(|(_, m)| matches!(m, Message::Gossip(items) if items.contains(&Piggyback::Record(five.clone())))));
        // Far more ids than two datagrams of records hold: two datagrams, no more.
        let many: Vec<NodeId> = std::iter::repeat([5, 8, 9]).flatten().take(60).map(NodeId::from_u64).collect();
        let payload = crate::wire::encode_unbounded(&Message::Fetch(many));
        node.handle_input(
            Time::from_secs(2),
            crate::node::Input::Datagram { from: NodeId::from_u64(9), payload: payload.into() },
        );
        let answers = drain(&mut node)
            .into_iter()
            .filter(|(to, m)| *to == NodeId::from_u64(9) && matches!(m, Message::Gossip(_)))
            .count();
        assert_eq!(answers, MAX_FETCH_ANSWERS);
    }
}
