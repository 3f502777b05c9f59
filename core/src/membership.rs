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
//! [`RECONNECT_INTERVAL`]: crate::anti_entropy::RECONNECT_INTERVAL
//! [`Replica::set_alive`]: crate::replica::Replica::set_alive
//! [`Message::Gossip`]: crate::wire::Message::Gossip

use crate::answers::{Answer, Answers};
use crate::broadcast::{BroadcastQueue, RecordUpdate, Update};
use crate::id::NodeId;
use crate::node::Node;
use crate::record::{Lifecycle, Reachability, Record, SharedRecord, Version};
use crate::swim::{Action, Event as SwimEvent, Rumor, Swim, SwimConfig};
use crate::time::Time;
use crate::timer::Timer;
use crate::wire::{Builder, Message, Piggyback, ProbeBuilder};
use bytes::Bytes;
use core::time::Duration;
use foldhash::fast::FixedState;
use hashbrown::HashMap;
use std::collections::BTreeSet;

/// Running suspicions repeated on each ping, besides the queue's items: a node that missed a
/// refutation learns of it from the next peer it probes (which answers the stale suspicion).
const SUSPICIONS_PER_PING: usize = 2;
/// How often a node tells the members it suspects, directly, that it does; most suspects told at
/// once. The epidemic may miss a suspect (outbound-only members hear only from their anchors), and
/// a suspect that does not hear of its suspicion cannot refute it.
const NOTICE_INTERVAL: Duration = Duration::from_secs(1);
const MAX_NOTICES: usize = 4;
/// How long a fetch waits for its answer before the record is asked of the next announcer: a
/// few round trips. The announcements of one record all come within a few hundred
/// milliseconds, so a lost fetch or answer is retried on this timer, not on the next
/// announcement.
const FETCH_RETRY: Duration = Duration::from_millis(250);
/// Announcers remembered per record being fetched, besides the one asked.
const FALLBACK_ANNOUNCERS: usize = 2;
/// Most records fetched at once; announcements beyond it wait for anti-entropy.
const MAX_FETCHING: usize = 1024;
/// Most datagrams that answer one [`Message::Fetch`]: a fetch names what one datagram of
/// announcements held, and its answer must not be a large multiple of its size.
const MAX_FETCH_ANSWERS: usize = 2;

/// The failure detector's input a probe message carries.
enum Probe {
    Ping(u32),
    PingReq(NodeId, u32),
    Ack(u32),
    Nack(u32),
}

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
    /// Times a record is pushed whole before it is only announced by version
    /// ([`Piggyback::Have`]); a receiver that lacks an announced record fetches it from the
    /// announcer ([`Message::Fetch`]). Of a record's `lambda · ceil(log10(n + 1))` sends, the
    /// first few reach most nodes for the first time and the rest mostly nodes that hold it.
    pub eager_sends: u32,
    /// Datagrams of answers (refutations, DOWN notices, fetched records, news for a pull, a
    /// suspect told of its suspicion) a node sends per gossip round; answers beyond wait for the
    /// next round. None (the default): every answer goes out at once.
    pub answers_per_round: Option<usize>,
    /// Most updates each broadcast queue holds.
    pub queue_capacity: usize,
    /// Time between anti-entropy exchanges ([`crate::anti_entropy`]) with one random peer.
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

/// A suspicion queued for piggybacking. Encoded when sent, not kept encoded: while a partition
/// runs every node queues one for each member cut off, and the encoding would double the item.
#[derive(Clone, Debug)]
pub(crate) struct QueuedSuspicion {
    id: NodeId,
    generation: u64,
    heartbeat: u64,
    from: NodeId,
    encoded_len: u8,
}

impl QueuedSuspicion {
    fn new(id: NodeId, generation: u64, heartbeat: u64, from: NodeId) -> QueuedSuspicion {
        let mut q = QueuedSuspicion { id, generation, heartbeat, from, encoded_len: 0 };
        // At most 53 bytes: a tag, two ids and two varints.
        let len = postcard::experimental::serialized_size(&q.piggyback()).unwrap_or(usize::MAX);
        q.encoded_len = u8::try_from(len).unwrap_or(u8::MAX);
        q
    }

    fn piggyback(&self) -> Piggyback {
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
    /// Records being fetched after an announcement, by node.
    fetching: HashMap<NodeId, Fetching, FixedState>,
    /// The answers budget and the answers owed.
    pub(crate) answers: Answers,
    /// When the next gossip round is due on the round grid (the first round plus whole
    /// intervals), whether or not its timer is armed: a round with nothing to do is skipped,
    /// and the timer is re-armed at the next grid point once there is work again.
    next_round: Time,
}

/// A record asked for after an announcement, until it arrives or no announcer is left to ask.
#[derive(Clone, Debug)]
struct Fetching {
    /// The latest version announced.
    version: Version,
    /// When it was last asked for.
    asked: Time,
    /// Other nodes that announced it, asked in turn if no answer comes within [`FETCH_RETRY`].
    fallbacks: [Option<NodeId>; FALLBACK_ANNOUNCERS],
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
            records: BroadcastQueue::per_decade(lambda, settings.queue_capacity),
            suspicions: BroadcastQueue::new(lambda, settings.queue_capacity),
            suspects: BTreeSet::new(),
            next_notice: now,
            told_down: Vec::new(),
            fetching: HashMap::default(),
            answers: Answers::new(settings.answers_per_round),
            next_round: now,
            detector,
            settings,
        }
    }

    /// Whether a gossip round would do anything: send queued updates, pull (an outbound-only
    /// node), notify suspects, retry fetches, or pay owed answers and renew a spent budget.
    /// A round that would do nothing is skipped, so an idle node sets no gossip wake.
    fn round_has_work(&self, outbound_only: bool) -> bool {
        outbound_only
            || self.records.len() + self.suspicions.len() > 0
            || !self.suspects.is_empty()
            || !self.fetching.is_empty()
            || self.answers.round_has_work()
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
fn repair_interval(reach: &Reachability, settings: &MembershipSettings) -> Duration {
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

    /// `record` encoded as a [`Piggyback::Record`], shared with every node that holds the same
    /// record where the interner pools them.
    pub(crate) fn piggyback_encoding(&self, record: &SharedRecord) -> Option<Bytes> {
        let encode = |record: &Record| {
            let body = postcard::to_allocvec(record).ok()?;
            let mut encoded = Vec::with_capacity(1 + body.len());
            encoded.push(0); // `Piggyback::Record`'s variant index
            encoded.extend_from_slice(&body);
            Some(Bytes::from(encoded))
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
            st.detector.remove_member(id);
            st.suspicions.remove(&id);
            st.suspects.remove(&id);
            if record.state >= Lifecycle::Down {
                return;
            }
        }
        if !st.detector.add_member(now, id, record.heartbeat, probeable)
            && st.detector.on_alive_gossip(now, id, record.heartbeat) == Rumor::Spread
        {
            // The record at the higher heartbeat is the refutation; the suspicion is stale.
            st.suspicions.remove(&id);
        }
        if vouch && !st.detector.is_suspect(&id) {
            // Connected to it and not suspecting it (again): vouch for it.
            st.detector.set_voucher(id, Some(me));
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
        st.detector.set_probeable(peer, probeable);
        if outbound {
            if up {
                st.detector.set_voucher(peer, Some(me));
            } else {
                // We vouched for it while connected: losing the connection is our evidence.
                st.detector.suspect(now, peer);
            }
        }
    }

    /// Every message a peer sends, by kind: the one place a datagram's meaning is decided.
    pub(crate) fn on_message(&mut self, from: NodeId, msg: Message) {
        let now = self.now;
        let (probe, piggyback) = match msg {
            Message::Ping { seq, piggyback } => (Some(Probe::Ping(seq)), piggyback),
            Message::PingReq { target, seq, piggyback } => (Some(Probe::PingReq(target, seq)), piggyback),
            Message::Ack { seq, piggyback } => (Some(Probe::Ack(seq)), piggyback),
            Message::Nack { seq, piggyback } => (Some(Probe::Nack(seq)), piggyback),
            Message::Gossip(piggyback) => (None, piggyback),
            Message::Records(records) => {
                self.heard(from);
                // Many records at once are a bulk transfer (a join, a long separation): news to
                // this replica, old news to the federation, so they are not gossiped on.
                let spread = records.len() <= crate::anti_entropy::BULK_RECORDS;
                for r in records {
                    self.absorb_news(r, spread);
                }
                return;
            }
            Message::Want(ids) => {
                self.heard(from);
                // A want comes from an anti-entropy exchange, which asks for whole buckets.
                let records: Vec<SharedRecord> =
                    ids.iter().filter_map(|id| self.replica.get(id).map(|s| s.record().clone())).collect();
                self.send_records_up_to(from, &records, crate::anti_entropy::MAX_EXCHANGE_DATAGRAMS);
                return;
            }
            Message::Buckets { count, first, hashes } => {
                self.heard(from);
                return self.on_buckets(from, count, first, &hashes);
            }
            Message::BucketEntries { count, complete, entries } => {
                self.heard(from);
                return self.on_bucket_entries(from, count, &complete, &entries);
            }
            Message::Fetch(ids) => {
                self.heard(from);
                return self.on_fetch(from, &ids);
            }
        };
        if probe.is_none() {
            self.heard_from(from);
        }
        self.tell_if_down(from);
        let mut corrections: Vec<SharedRecord> = Vec::new();
        let mut announced: Vec<(NodeId, Version)> = Vec::new();
        for item in piggyback {
            match item {
                Piggyback::Record(r) => self.absorb(r),
                Piggyback::Suspect { id, generation, heartbeat, from: suspecter } => {
                    if let Some(newer) = self.on_suspicion(id, generation, heartbeat, suspecter) {
                        corrections.push(newer);
                    }
                }
                Piggyback::Have { id, version } => announced.push((id, version)),
            }
        }
        if !corrections.is_empty() && self.answer(from, Answer::Records(&corrections)) {
            self.stats.corrections_sent += 1;
        }
        self.fetch_announced(from, &announced);
        if probe.is_none() && self.replica.get(&from).is_some_and(|s| s.record().reach == Reachability::OutboundOnly) {
            // Gossip from a node only its anchors can send to is also its pull: answer with news.
            if self.answer(from, Answer::News) {
                self.stats.news_answers += 1;
            }
        }
        let detector = &mut self.membership.detector;
        match probe {
            Some(Probe::Ping(seq)) => detector.on_ping(now, from, seq),
            Some(Probe::PingReq(target, seq)) => detector.on_ping_req(now, from, target, seq),
            Some(Probe::Ack(seq)) => detector.on_ack(now, from, seq),
            Some(Probe::Nack(seq)) => detector.on_nack(now, from, seq),
            None => {}
        }
    }

    /// A message that is not a probe came from `from`: it renews a lease, and tells a node held
    /// DOWN that it is.
    fn heard(&mut self, from: NodeId) {
        self.heard_from(from);
        self.tell_if_down(from);
    }

    /// A message from `from` that the detector's probe inputs do not see (they renew on their
    /// own): renews the lease an anchor holds on an outbound-only member.
    fn heard_from(&mut self, from: NodeId) {
        let now = self.now;
        self.membership.detector.heard_from(now, from);
    }

    /// A piggybacked suspicion of `id` at `(generation, heartbeat)` raised by `from`. Returns the
    /// record that answers it when the suspicion is stale here (we hold, or are, a later version):
    /// the sender has missed a refutation, and telling it directly is cheaper than letting its
    /// suspicion run out.
    fn on_suspicion(&mut self, id: NodeId, generation: u64, heartbeat: u64, from: NodeId) -> Option<SharedRecord> {
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
        if st.detector.on_suspect_gossip(now, id, heartbeat, from) == Rumor::Spread {
            st.suspicions.push(QueuedSuspicion::new(id, generation, heartbeat, from));
        }
        None
    }

    /// `from` sent us something while we hold it DOWN in its current generation: if it does not
    /// know (it was confirmed failed while cut off), its DOWN record makes it refute at once.
    /// Draining nodes know, so each node is told at most once per [`NOTICE_INTERVAL`].
    fn tell_if_down(&mut self, from: NodeId) {
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

    /// Asks `from` for the records it announced that this replica lacks (after the datagram's
    /// own records were merged), in one [`Message::Fetch`]. A record already asked for is not
    /// asked again; `from` becomes a fallback, asked by [`Node::retry_fetches`] if no answer
    /// comes. The announcer has just sent this datagram, so it can be answered even when it is
    /// outbound-only or not yet known here, as a pull is.
    fn fetch_announced(&mut self, from: NodeId, announced: &[(NodeId, Version)]) {
        if announced.is_empty() {
            return;
        }
        let (now, limit) = (self.now, self.config.max_datagram);
        let st = &mut self.membership;
        let mut b = Builder::fetch(limit);
        for (id, version) in announced {
            if !self.replica.lacks(id, version) {
                continue;
            }
            if let Some(f) = st.fetching.get_mut(id) {
                if !f.version.covers(version) {
                    f.version = *version;
                }
                if !f.fallbacks.contains(&Some(from)) {
                    if let Some(free) = f.fallbacks.iter_mut().find(|a| a.is_none()) {
                        *free = Some(from);
                    }
                }
                continue;
            }
            if st.fetching.len() >= MAX_FETCHING || !b.push(id) {
                break;
            }
            let fallbacks = [None; FALLBACK_ANNOUNCERS];
            st.fetching.insert(*id, Fetching { version: *version, asked: now, fallbacks });
        }
        if !b.is_empty() {
            self.stats.records_fetched += b.len() as u64;
            self.transmit(from, b.finish());
        }
    }

    /// Asks the next announcer for each record whose fetch went unanswered for
    /// [`FETCH_RETRY`], and forgets those that arrived or have nobody left to ask (anti-entropy
    /// repairs what is still missing then). Called every gossip round.
    fn retry_fetches(&mut self) {
        let now = self.now;
        let st = &mut self.membership;
        if st.fetching.is_empty() {
            return;
        }
        let mut asks: Vec<(NodeId, NodeId)> = Vec::new();
        st.fetching.retain(|id, f| {
            if now < f.asked + FETCH_RETRY {
                return true;
            }
            if !self.replica.lacks(id, &f.version) {
                return false;
            }
            let Some(next) = f.fallbacks.iter_mut().find_map(Option::take) else { return false };
            f.asked = now;
            asks.push((next, *id));
            true
        });
        // Sent in id order, not the table's.
        asks.sort_unstable();
        let limit = self.config.max_datagram;
        for group in asks.chunk_by(|a, b| a.0 == b.0) {
            let mut b = Builder::fetch(limit);
            for (_, id) in group {
                if b.push(id) {
                    self.stats.records_fetched += 1;
                }
            }
            self.transmit(group[0].0, b.finish());
        }
    }

    /// A [`Message::Fetch`]: answers `from` with the records it asked for that this replica
    /// holds, as gossip (merged and spread on like any piggybacked news), in at most
    /// [`MAX_FETCH_ANSWERS`] datagrams, paid from the answers budget ([`crate::answers`]).
    pub(crate) fn on_fetch(&mut self, from: NodeId, ids: &[NodeId]) {
        let limit = self.config.max_datagram;
        let mut groups: Vec<Vec<SharedRecord>> = vec![Vec::new()];
        let mut b = ProbeBuilder::gossip(limit);
        for id in ids {
            let Some(record) = self.replica.get(id).map(|s| s.record().clone()) else { continue };
            let Some(encoded) = self.piggyback_encoding(&record) else { continue };
            if !b.push_encoded(&encoded) {
                if groups.len() == MAX_FETCH_ANSWERS {
                    break;
                }
                groups.push(Vec::new());
                b = ProbeBuilder::gossip(limit);
                b.push_encoded(&encoded);
            }
            groups.last_mut().expect("one group at least").push(record);
        }
        for group in groups.iter().filter(|g| !g.is_empty()) {
            if self.answer(from, Answer::Records(group)) {
                self.stats.fetch_answers += 1;
            }
        }
    }

    /// The membership's share of [`Node::handle_timeouts`]: returns false for timers it does not
    /// own.
    pub(crate) fn membership_timer(&mut self, timer: Timer) -> bool {
        let st = &mut self.membership;
        let now = self.now;
        match timer {
            Timer::Probe => st.detector.on_timeout(now),
            Timer::Gossip => {
                let interval = st.settings.gossip_interval;
                let fanout = st.settings.gossip_fanout;
                let notice = (now >= st.next_notice && !st.suspects.is_empty())
                    .then(|| st.suspects.iter().take(MAX_NOTICES).copied().collect::<Vec<_>>());
                if notice.is_some() {
                    st.next_notice = now + NOTICE_INTERVAL;
                }
                self.answer_round();
                let st = &mut self.membership;
                if st.records.len() + st.suspicions.len() > 0 {
                    for peer in self.pick_peers(fanout) {
                        let b = ProbeBuilder::gossip(self.config.max_datagram);
                        if self.send_probe(peer, b, None, true) {
                            self.stats.gossip_rounds_sent += 1;
                        }
                    }
                } else if self.config.reach == Reachability::OutboundOnly {
                    // Nobody can gossip to us but our anchors: pull from as many peers as we
                    // would push to instead.
                    for peer in self.pick_peers(fanout) {
                        self.transmit(peer, ProbeBuilder::gossip(self.config.max_datagram).finish());
                        self.stats.gossip_rounds_sent += 1;
                    }
                }
                for id in notice.unwrap_or_default() {
                    if self.answer(id, Answer::Suspicion) {
                        self.stats.suspicion_notices += 1;
                    }
                }
                self.retry_fetches();
                let st = &mut self.membership;
                st.next_round = self.now + interval;
                if st.round_has_work(self.config.reach == Reachability::OutboundOnly) {
                    self.timers.set(Timer::Gossip, st.next_round);
                } else {
                    self.timers.stop(Timer::Gossip);
                }
            }
            Timer::AntiEntropy => {
                let (interval, ttl) = (repair_interval(&self.config.reach, &st.settings), st.settings.tombstone_ttl);
                self.sync_round(interval, ttl);
            }
            _ => return false,
        }
        true
    }

    /// Re-arms a sleeping gossip round at the next point of the round grid after now once it has work
    /// again, so that skipping idle rounds moves no round that has work. Called after every
    /// input.
    fn wake_gossip(&mut self) {
        if self.timers.get(Timer::Gossip).is_some() {
            return;
        }
        let st = &self.membership;
        if !st.round_has_work(self.config.reach == Reachability::OutboundOnly) {
            return;
        }
        let step = u64::try_from(st.settings.gossip_interval.as_micros()).unwrap_or(u64::MAX).max(1);
        // The first grid point strictly after now: a round due at this very instant was skipped
        // as idle, and a wake at `now` would be a timer that has already passed.
        let behind = (self.now.as_micros() + 1).saturating_sub(st.next_round.as_micros());
        let at = Time(st.next_round.as_micros().saturating_add(behind.div_ceil(step).saturating_mul(step)));
        self.membership.next_round = at;
        self.timers.set(Timer::Gossip, at);
    }

    /// Turns the detector's actions into datagrams and queued updates and its events into
    /// registry changes, then re-arms its timer; then wakes a sleeping gossip round if it has
    /// work. Called after every input.
    pub(crate) fn drive_detector(&mut self) {
        if self.exited {
            return;
        }
        self.drive_detector_actions();
        self.wake_gossip();
    }

    fn drive_detector_actions(&mut self) {
        let me = self.config.id;
        let limit = self.config.max_datagram;
        loop {
            let st = &mut self.membership;
            if let Some(action) = st.detector.poll_action() {
                match action {
                    // Probes are never empty, so always sent.
                    Action::SendPing { to, seq } => {
                        self.send_probe(to, ProbeBuilder::ping(limit, seq), Some(to), false);
                    }
                    Action::SendPingReq { via, target, seq } => {
                        self.send_probe(via, ProbeBuilder::ping_req(limit, target, seq), None, false);
                    }
                    Action::SendAck { to, seq } => {
                        self.send_probe(to, ProbeBuilder::ack(limit, seq), None, false);
                    }
                    Action::SendNack { to, seq } => {
                        self.send_probe(to, ProbeBuilder::nack(limit, seq), None, false);
                    }
                    Action::GossipSuspect { id, incarnation } => {
                        let generation = self.replica.get(&id).map(|s| s.record().generation);
                        if let Some(generation) = generation {
                            self.membership.suspicions.push(QueuedSuspicion::new(id, generation, incarnation, me));
                        }
                    }
                    // The node handles suspicions of itself in `on_suspicion`; the detector only
                    // raises this if it was told about one.
                    Action::GossipAlive { incarnation } => {
                        self.update_local(|r| r.heartbeat = r.heartbeat.max(incarnation));
                    }
                }
                continue;
            }
            if let Some(event) = st.detector.poll_event() {
                match event {
                    SwimEvent::Confirm(id) => {
                        st.suspects.remove(&id);
                        self.confirm_down(id);
                    }
                    SwimEvent::Suspect(id) => {
                        st.suspects.insert(id);
                        self.stats.suspicions_raised += 1;
                        if self.answer(id, Answer::Suspicion) {
                            self.stats.suspicion_notices += 1;
                        }
                        // A suspect gets no new requests while the suspicion runs: a request
                        // sent to a node that has died would only fail over later.
                        if let Some(flip) = self.replica.set_alive(&id, false) {
                            self.emit_routable(id, flip);
                        }
                    }
                    SwimEvent::Alive(id) => {
                        st.suspects.remove(&id);
                        if let Some(flip) = self.replica.set_alive(&id, true) {
                            self.emit_routable(id, flip);
                        }
                    }
                }
                continue;
            }
            let next = st.detector.next_deadline();
            if next == Time::NEVER {
                self.timers.stop(Timer::Probe);
            } else {
                self.timers.set(Timer::Probe, next);
            }
            return;
        }
    }

    /// The detector confirmed `id` failed: mark its record DOWN in the same generation.
    fn confirm_down(&mut self, id: NodeId) {
        let Some(record) = self.replica.get(&id).map(|s| s.record().clone()) else { return };
        if record.state >= Lifecycle::Down {
            return;
        }
        self.stats.confirmed_down += 1;
        // The detector has no member for the local node, so never confirms it.
        debug_assert_ne!(id, self.config.id, "the detector confirmed the local node");
        let down = record.with_down_mark(self.config.identity.mark_down(&record));
        // A mark this node has just signed, on the version its replica holds, is news by
        // construction and needs no check. Checking it cost a signature verification per
        // confirmation, and a partition makes confirmations by the hundred thousand.
        let shared = self.config.interner.record(down);
        self.merge_news(shared, Some(record.generation), true);
    }

    /// Sends one SWIM datagram: the header in `b`, then (for a ping to a suspect) the suspicion
    /// of the target, then suspicions and records from the queues. A gossip datagram with
    /// nothing in it is not sent. Returns whether a datagram was sent.
    pub(crate) fn send_probe(
        &mut self,
        to: NodeId,
        mut b: ProbeBuilder,
        buddy: Option<NodeId>,
        skip_empty: bool,
    ) -> bool {
        let n = self.replica.len();
        let st = &mut self.membership;
        if let Some(target) = buddy {
            // Lifeguard's buddy system: the suspect hears of the suspicion at once. Other running
            // suspicions ride along too, so that a peer that holds the refutation answers it.
            let others = st.suspects.iter().filter(|s| **s != target).take(SUSPICIONS_PER_PING);
            let ids: Vec<NodeId> = st.suspects.get(&target).into_iter().chain(others).copied().collect();
            for id in ids {
                let generation = self.replica.get(&id).map(|s| s.record().generation);
                let heartbeat = st.detector.member_incarnation(&id);
                if let (Some(generation), Some(heartbeat)) = (generation, heartbeat) {
                    b.push(&Piggyback::Suspect { id, generation, heartbeat, from: self.config.id });
                }
            }
        }
        st.suspicions.fill(b.budget(), n, |s, _| {
            b.push(&s.piggyback());
        });
        st.records.fill(b.budget(), n, |r, sends| {
            if r.is_eager(sends) {
                b.push_encoded(r.encoded());
            } else {
                b.push(&r.announcement());
            }
        });
        if skip_empty && b.is_empty() {
            return false;
        }
        self.transmit(to, b.finish());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{Config, Output};

    fn suspicion(heartbeat: u64, from: u64) -> QueuedSuspicion {
        QueuedSuspicion::new(NodeId::from_u64(7), 3, heartbeat, NodeId::from_u64(from))
    }

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
        let ids: Vec<NodeId> = (1..=4).map(NodeId::from_u64).collect();
        for &id in &ids {
            let mut c = Config::new(id, 1);
            c.reach = Reachability::Public(format!("node{id}"));
            h.add(c);
        }
        for &id in &ids[1..] {
            h.connect(ids[0], id);
        }
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
    fn answers_beyond_a_rounds_budget_wait_for_the_next_round_one_datagram_a_peer() {
        let (mut node, five) = node_with_peers(4);
        let per_round = 3;
        node.config.membership.answers_per_round = Some(per_round);
        node.membership.answers = Answers::new(Some(per_round));
        let stale = Piggyback::Suspect { id: five.id, generation: 1, heartbeat: 0, from: NodeId::from_u64(8) };
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
