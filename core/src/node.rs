//! The node state machine facade: every runtime drives the protocol through [`Node`].

use crate::anti_entropy::AntiEntropy;
use crate::auth::{self, Forgery, Identity, Verifier};
use crate::hardware::Hardware;
use crate::heap::HeapBytes;
use crate::id::NodeId;
use crate::intern::Interner;
use crate::lifecycle::Local;
use crate::membership::{Membership, MembershipSettings};
use crate::record::{Lifecycle, Load, Model, Reachability, Record, Role, SharedRecord};
use crate::replica::Replica;
use crate::swim::{Swim, SwimConfigError};
use crate::time::Time;
use crate::timer::{Timer, TimerTable};
use crate::wire::{self, DecodeError, MAX_DATAGRAM};
use bytes::Bytes;
use core::time::Duration;
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;
use std::collections::VecDeque;

/// How a node is set up. Build with [`Config::with_identity`] (production) or [`Config::new`]
/// (tests and simulations) and adjust fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// This node's identity; must be `identity.id()`.
    pub id: NodeId,
    /// The key this node signs its record and its DOWN marks with ([`crate::auth`]).
    pub identity: Identity,
    /// How records and marks from peers are checked.
    pub verifier: Verifier,
    /// Where merged records are kept: each its own (the default), or shared between the
    /// replicas of a simulation ([`crate::intern`]).
    pub interner: Interner,
    /// The generation to start in; every new process of the same node must start higher than
    /// the last (runtimes use the wall-clock milliseconds at start). Should the federation still
    /// hold a record from an earlier process that this one does not supersede, the node moves
    /// to a generation above it by itself.
    pub generation: u64,
    /// What the node does.
    pub role: Role,
    /// GPUs it offers.
    pub hardware: Hardware,
    /// How peers reach it.
    pub reach: Reachability,
    /// Seed of the node's random choices (gossip peers, jitter).
    pub rng_seed: u64,
    /// How long before the walltime draining starts, and the longest a drain may take.
    pub drain_window: Duration,
    /// How long a node that has LEFT keeps spreading that news before asking to exit.
    pub leave_linger: Duration,
    /// Largest datagram to send, at most [`MAX_DATAGRAM`].
    pub max_datagram: usize,
    /// How the membership protocol runs: failure detection, gossip, anti-entropy, tombstones
    /// ([`crate::membership`]).
    pub membership: MembershipSettings,
}

impl Config {
    /// Defaults for a serving, outbound-only CPU node (1 s probe periods, gossip every 200 ms to
    /// 3 peers while there is news, 15-minute drain window; [`MembershipSettings::default`])
    /// that signs with `identity`, whose key owns its id, and checks peers strictly. What
    /// production runtimes use.
    pub fn with_identity(identity: Identity, generation: u64) -> Config {
        let mut c = Config::new(identity.id(), generation);
        c.identity = identity;
        c.verifier = Verifier::strict();
        c
    }

    /// The same defaults for a node with a *test identity* ([`Identity::for_test`]): a key anyone
    /// can compute from `id`, and a verifier that accepts such keys for [`NodeId::from_u64`] ids
    /// (and checks every other id strictly). For tests and simulations.
    pub fn new(id: NodeId, generation: u64) -> Config {
        Config {
            id,
            identity: Identity::for_test(id),
            verifier: Verifier::with_test_identities(),
            interner: Interner::default(),
            generation,
            role: Role::Serving,
            hardware: Hardware::CPU,
            reach: Reachability::OutboundOnly,
            rng_seed: id.short(),
            drain_window: Duration::from_secs(15 * 60),
            leave_linger: Duration::from_secs(1),
            max_datagram: MAX_DATAGRAM,
            membership: MembershipSettings::default(),
        }
    }

    /// Checks the settings that would make the node misbehave.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(256..=MAX_DATAGRAM).contains(&self.max_datagram) {
            return Err(ConfigError::MaxDatagram(self.max_datagram));
        }
        let m = &self.membership;
        m.detector.validate()?;
        let positive = [
            ("gossip_interval", m.gossip_interval),
            ("anti_entropy_interval", m.anti_entropy_interval),
            ("outbound_anti_entropy_interval", m.outbound_anti_entropy_interval),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, d)| d.is_zero()) {
            return Err(ConfigError::ZeroInterval(name));
        }
        if m.tombstone_ttl < m.anti_entropy_interval * 4 {
            return Err(ConfigError::TombstoneTtl { ttl: m.tombstone_ttl, interval: m.anti_entropy_interval });
        }
        if m.gossip_fanout == 0 {
            return Err(ConfigError::ZeroFanout);
        }
        if m.eager_sends == 0 {
            return Err(ConfigError::ZeroEagerSends);
        }
        if m.answers_per_round == Some(0) {
            return Err(ConfigError::ZeroAnswers);
        }
        Ok(())
    }
}

/// A configuration the node cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// An interval of zero would spin.
    #[error("{0} must be greater than zero")]
    ZeroInterval(&'static str),
    /// Datagram limit out of range.
    #[error("max_datagram {0} out of range 256..={MAX_DATAGRAM}")]
    MaxDatagram(usize),
    /// Nobody to gossip with.
    #[error("gossip_fanout must be at least 1")]
    ZeroFanout,
    /// Records would only ever be announced, never pushed.
    #[error("eager_sends must be at least 1")]
    ZeroEagerSends,
    /// Answers would never be sent.
    #[error("answers_per_round must be at least 1")]
    ZeroAnswers,
    /// Tombstones would be deleted before anti-entropy could spread them.
    #[error("tombstone_ttl ({ttl:?}) must be at least four anti_entropy_intervals ({interval:?}), and far longer than any partition expected to heal")]
    TombstoneTtl {
        /// The configured tombstone lifetime.
        ttl: Duration,
        /// The configured anti-entropy interval.
        interval: Duration,
    },
    /// The failure detector's settings cannot work.
    #[error("failure detector: {0}")]
    Swim(#[from] SwimConfigError),
}

/// Something that happened outside the state machine, fed with [`Node::handle_input`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// The deadline from the last [`Output::Timeout`] has been reached.
    Timeout,
    /// A datagram from an authenticated peer.
    Datagram {
        /// Who sent it (from the transport's authentication, not from the payload).
        from: NodeId,
        /// The bytes as received.
        payload: Bytes,
    },
    /// A connection to `peer` is up (an anchor we dialled, or a node that dialled us); the peer
    /// can now be sent to even if it is outbound-only.
    PeerConnected(NodeId),
    /// The connection to `peer` is gone.
    PeerDisconnected(NodeId),
    /// The engine answers health checks and serves these models.
    EngineReady {
        /// Models from the engine's `/v1/models`.
        models: Vec<Model>,
    },
    /// The engine stopped answering or exited.
    EngineFailed,
    /// Drain now (`tela drain`, SIGTERM, Slurm's warning signal).
    DrainRequested,
    /// The allocation ends at this local time; draining starts one drain window before.
    Walltime(Time),
    /// The current load, from the runtime's request accounting.
    Load(Load),
}

/// Outputs a drained queue keeps room for (see [`Node::poll_output`]).
const OUTPUTS_KEPT: usize = 64;

/// A datagram to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// The peer to send to.
    pub to: NodeId,
    /// At most `max_datagram` bytes.
    pub payload: Bytes,
}

/// News for the embedding application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A node became routable (alive, SERVE, hosting models).
    Routable(NodeId),
    /// A node stopped being routable; send it no new requests.
    Unroutable(NodeId),
    /// A node was learned for the first time.
    Discovered(NodeId),
    /// The local node entered a new state or generation.
    LocalState {
        /// The local generation.
        generation: u64,
        /// The local state.
        state: Lifecycle,
    },
    /// A datagram was rejected; state is unchanged.
    Rejected {
        /// The sender.
        from: NodeId,
        /// Why.
        error: DecodeError,
    },
}

/// Something the runtime must do in the world.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// The node has LEFT: stop the engine it supervises.
    StopEngine,
    /// LEFT has been spread: end the process.
    Exit,
}

/// What [`Node::poll_output`] returns; drain until [`Output::Timeout`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Send a datagram.
    Transmit(Transmit),
    /// Tell the application.
    Event(Event),
    /// Act in the world.
    Command(Command),
    /// Nothing else to do: call back with [`Input::Timeout`] at this time (or earlier, with any
    /// other input). [`Time::NEVER`] when the node has exited.
    Timeout(Time),
}

/// Counters for metrics and simulator reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Datagrams sent.
    pub datagrams_out: u64,
    /// Bytes sent.
    pub bytes_out: u64,
    /// Datagrams received.
    pub datagrams_in: u64,
    /// Bytes received.
    pub bytes_in: u64,
    /// Datagrams rejected by decoding.
    pub rejected: u64,
    /// Records merged that changed the replica.
    pub records_changed: u64,
    /// Generations started after the first (engine recovery, shrunken model sets, refutations).
    pub new_generations: u64,
    /// Refutations: versions of our own record heard that we did not make (a false DOWN, or a
    /// record from an earlier process).
    pub refutations: u64,
    /// Models from the engine dropped because their names are empty or too long for the wire.
    pub models_rejected: u64,
    /// suspicions this node raised.
    pub suspicions_raised: u64,
    /// suspicions of this node it refuted by raising its heartbeat.
    pub suspicions_refuted: u64,
    /// nodes this node's detector confirmed failed and marked DOWN.
    pub confirmed_down: u64,
    /// Anti-entropy exchanges this node started.
    pub syncs_started: u64,
    /// Anti-entropy exchanges this node answered with the entries of differing buckets.
    pub syncs_answered: u64,
    /// Records this node sent or asked for in anti-entropy exchanges it started.
    pub syncs_records: u64,
    /// Records asked for after an announcement that this replica lacked them.
    pub records_fetched: u64,
    /// Gossip datagrams sent in gossip rounds (pushes, and pulls of an outbound-only
    /// node); the five counters below are the gossip datagrams sent outside the rounds.
    pub gossip_rounds_sent: u64,
    /// answers with news to gossip from an outbound-only node (its pulls and pushes).
    pub news_answers: u64,
    /// answers to datagrams that carried stale suspicions, with the records that
    /// refute them.
    pub corrections_sent: u64,
    /// DOWN records sent to nodes held DOWN that sent something.
    pub down_notices: u64,
    /// datagrams answering [`crate::wire::Message::Fetch`].
    pub fetch_answers: u64,
    /// suspects told directly that this node suspects them.
    pub suspicion_notices: u64,
    /// Answers that waited for a later round's budget (the membership's answers budget): each
    /// merged into what was already owed to its peer or queued as owed.
    pub answers_deferred: u64,
    /// Answers dropped: owed to more than 64 peers at once, or owed for longer than a second.
    pub answers_dropped: u64,
    /// Datagrams of owed answers sent at the start of a gossip round.
    pub owed_answers_sent: u64,
    /// Records refused because their owner did not sign them as they are ([`crate::auth`]).
    pub records_forged: u64,
    /// Records refused because of a DOWN mark that its confirmer did not sign, or a state that
    /// does not follow from the mark.
    pub marks_forged: u64,
}

/// One Tela node's protocol state: its registry replica, its own lifecycle and its membership.
///
/// # Driving it
///
/// The node never does I/O and never reads a clock. The runtime owns sockets and timers and:
///
/// 1. creates it with [`Node::new`] (`now` = the runtime's current time);
/// 2. feeds every input with [`Node::handle_input`]`(now, input)` — datagrams, connection changes,
///    engine health, drain requests, load reports, and [`Input::Timeout`] when the last deadline
///    is reached;
/// 3. after each input, calls [`Node::poll_output`] until it returns [`Output::Timeout`], sending
///    each [`Transmit`], acting on each [`Command`] and passing on each [`Event`];
/// 4. sleeps until the returned deadline or the next input, whichever comes first.
///
/// Time never goes backwards: a `now` earlier than one already seen is treated as the latest seen.
/// Everything the node does is a function of its [`Config`] (including `rng_seed`) and the input
/// sequence with its times, which is what lets the simulator replay runs bit for bit.
///
/// ```
/// use tela_core::{Config, Input, Model, Node, NodeId, Output, Time};
///
/// let mut node = Node::new(Config::new(NodeId::from_u64(1), 1), Time::ZERO);
/// node.handle_input(Time::ZERO, Input::EngineReady { models: vec![Model::named("llama")] });
/// let mut now = Time::ZERO;
/// for _ in 0..10 {
///     let deadline = loop {
///         match node.poll_output() {
///             Output::Transmit(t) => { /* socket.send(t.to, &t.payload) */ let _ = t; }
///             Output::Event(e) => { /* tell the application */ let _ = e; }
///             Output::Command(c) => { /* stop the engine, exit */ let _ = c; }
///             Output::Timeout(at) => break at,
///         }
///     };
///     // A real runtime waits for a datagram or the deadline; here time just jumps.
///     now = deadline;
///     node.handle_input(now, Input::Timeout);
/// }
/// assert_eq!(node.replica().serving("llama").to_vec(), [NodeId::from_u64(1)]);
/// ```
#[derive(Debug)]
pub struct Node {
    pub(crate) config: Config,
    pub(crate) now: Time,
    pub(crate) rng: ChaCha8Rng,
    pub(crate) replica: Replica,
    pub(crate) timers: TimerTable,
    pub(crate) outputs: VecDeque<Output>,
    pub(crate) connected: Vec<NodeId>,
    pub(crate) local: Local,
    pub(crate) membership: Membership,
    pub(crate) sync: AntiEntropy,
    pub(crate) stats: Stats,
    pub(crate) exited: bool,
}

impl Node {
    /// A node in state JOIN at time `now`.
    ///
    /// `config` should pass [`Config::validate`]; out-of-range values are clamped so that the
    /// node still runs.
    pub fn new(mut config: Config, now: Time) -> Node {
        config.max_datagram = config.max_datagram.clamp(256, MAX_DATAGRAM);
        let tick = Duration::from_millis(1);
        let m = &mut config.membership;
        for d in [&mut m.gossip_interval, &mut m.anti_entropy_interval, &mut m.outbound_anti_entropy_interval] {
            *d = (*d).max(tick);
        }
        m.gossip_fanout = m.gossip_fanout.max(1);
        m.answers_per_round = m.answers_per_round.map(|a| a.max(1));
        debug_assert_eq!(config.id, config.identity.id(), "the config's id is not its identity's");
        let mut record =
            Record::new(config.id, config.generation, config.role, config.hardware.clone(), config.reach.clone());
        config.identity.seal(&mut record);
        let membership = Membership::new(config.membership.clone(), config.id, config.rng_seed, now);
        let mut node = Node {
            rng: ChaCha8Rng::seed_from_u64(config.rng_seed),
            replica: Replica::new(record, now),
            now,
            timers: TimerTable::default(),
            outputs: VecDeque::new(),
            connected: Vec::new(),
            local: Local::default(),
            membership,
            sync: AntiEntropy::default(),
            stats: Stats::default(),
            exited: false,
            config,
        };
        node.emit_local_state();
        // Heartbeats move only with changes and nothing expires: no heartbeat timer, no sweep.
        node.start_membership();
        node
    }

    /// Feeds one input at time `now`.
    pub fn handle_input(&mut self, now: Time, input: Input) {
        self.now = self.now.max(now);
        if self.exited {
            return;
        }
        match input {
            Input::Timeout => self.handle_timeouts(),
            Input::Datagram { from, payload } => self.handle_datagram(from, &payload),
            Input::PeerConnected(peer) => {
                if let Err(i) = self.connected.binary_search(&peer) {
                    self.connected.insert(i, peer);
                    self.connection_changed(peer, true);
                }
            }
            Input::PeerDisconnected(peer) => {
                if let Ok(i) = self.connected.binary_search(&peer) {
                    self.connected.remove(i);
                    self.connection_changed(peer, false);
                }
            }
            Input::EngineReady { models } => self.engine_ready(models),
            Input::EngineFailed => self.engine_failed(),
            Input::DrainRequested => self.start_drain(),
            Input::Walltime(at) => self.set_walltime(at),
            Input::Load(load) => self.set_load(load),
        }
        self.drive_detector();
    }

    /// Merges a snapshot of the registry at time `now`: records kept across a restart, or a
    /// simulator's federation that has already formed. Each record is checked and merged as one
    /// from an anti-entropy transfer would be (verified, never gossiped on), so a snapshot can
    /// only ever add what a peer could have told this node.
    pub fn restore(&mut self, now: Time, records: &[SharedRecord]) {
        self.now = self.now.max(now);
        if self.exited {
            return;
        }
        for record in records {
            if let Some(before) = self.news_in(record) {
                self.merge_news(record.clone(), before, false);
            }
        }
        self.drive_detector();
    }

    /// The next thing to do; returns [`Output::Timeout`] once nothing else is pending.
    pub fn poll_output(&mut self) -> Output {
        if let Some(output) = self.outputs.pop_front() {
            return output;
        }
        // A burst (a restored snapshot: two events per record) leaves no large queue behind.
        if self.outputs.capacity() > OUTPUTS_KEPT {
            self.outputs.shrink_to(OUTPUTS_KEPT);
        }
        Output::Timeout(self.timers.next_deadline())
    }

    /// The heap bytes of this node's tables, by table ([`crate::heap`]).
    pub fn heap_bytes(&self) -> HeapBytes {
        let mut heap = HeapBytes::default();
        self.replica.heap_bytes(&mut heap);
        self.membership.heap_bytes(&mut heap);
        heap.other += crate::heap::array::<Output>(self.outputs.capacity())
            + crate::heap::array::<NodeId>(self.connected.capacity());
        heap
    }

    /// This node's replica of the registry.
    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    /// This node's own current record.
    pub fn local_record(&self) -> &SharedRecord {
        self.replica.local()
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.config.id
    }

    /// The configuration in use.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The failure detector.
    pub fn swim(&self) -> &Swim {
        &self.membership.detector
    }

    /// Updates waiting to be piggybacked, as (records, suspicions).
    pub fn swim_queued(&self) -> (usize, usize) {
        self.membership.queued()
    }

    /// Counters since start.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// True once [`Command::Exit`] has been issued; the node then ignores all input.
    pub fn has_exited(&self) -> bool {
        self.exited
    }

    /// Peers with a live connection, sorted.
    pub fn connected_peers(&self) -> &[NodeId] {
        &self.connected
    }

    fn handle_timeouts(&mut self) {
        // Fire every due timer, including ones that handling another arms in the past (a drain
        // deadline already behind us), but each timer at most once per call: at the end of time
        // `now + interval` saturates to `now`, and re-firing would never end.
        let mut fired: Vec<Timer> = Vec::with_capacity(Timer::ALL.len());
        while let Some(timer) = self.timers.pop_expired(self.now) {
            if fired.contains(&timer) {
                self.timers.set(timer, self.now);
                break;
            }
            fired.push(timer);
            if self.membership_timer(timer) {
                continue;
            }
            match timer {
                Timer::Probe | Timer::Gossip | Timer::AntiEntropy => {} // the membership's, handled above
                Timer::DrainStart => self.start_drain(),
                Timer::DrainDeadline => self.leave(),
                Timer::Exit => {
                    self.outputs.push_back(Output::Command(Command::Exit));
                    self.timers.stop_all();
                    self.exited = true;
                    return;
                }
            }
        }
    }

    fn handle_datagram(&mut self, from: NodeId, payload: &[u8]) {
        self.stats.datagrams_in += 1;
        self.stats.bytes_in += payload.len() as u64;
        match wire::decode(payload) {
            Ok(msg) => self.on_message(from, msg),
            Err(error) => {
                self.stats.rejected += 1;
                self.outputs.push_back(Output::Event(Event::Rejected { from, error }));
            }
        }
    }

    /// Merges a record from a peer; echoes of our own record that we do not hold are refuted.
    ///
    /// Only records that would change something are checked ([`crate::auth::check`]), and a
    /// forged one is counted and dropped without touching the replica.
    pub(crate) fn absorb(&mut self, record: Record) {
        self.absorb_news(record, true);
    }

    /// [`Node::absorb`]; with `spread` false, news is merged but not gossiped on (the records
    /// of a bulk transfer, old news to everyone but this replica).
    pub(crate) fn absorb_news(&mut self, record: Record, spread: bool) {
        if let Some(before) = self.news_in(&record) {
            let shared = self.config.interner.record(record);
            self.merge_news(shared, before, spread);
        }
    }

    /// Whether `record` is authentic news for this replica: `Some` with the generation held
    /// before (if any) when it is, `None` when it changes nothing or is forged. Echoes of our own
    /// record that we do not hold are refuted here.
    fn news_in(&mut self, record: &Record) -> Option<Option<u64>> {
        if record.id == self.config.id {
            let local = self.replica.local();
            if !local.dominates(record) && self.authentic(record, local.same_owner_version(record)) {
                self.refute(record.generation);
            }
            return None;
        }
        // One lookup: most records received are already held (the epidemic sends each many times).
        let (owner_known, before) = match self.replica.get(&record.id).map(|s| s.record()) {
            Some(k) if k.dominates(record) => return None,
            Some(k) => (k.same_owner_version(record), Some(k.generation)),
            None => (false, None),
        };
        self.authentic(record, owner_known).then_some(before)
    }

    /// Merges an authentic record that [`Node::news_in`] found to be news.
    pub(crate) fn merge_news(&mut self, record: SharedRecord, before: Option<u64>, spread: bool) {
        let id = record.id;
        let merged = self.replica.merge(self.now, record);
        if merged.changed {
            self.stats.records_changed += 1;
            self.record_changed(id, before, spread);
        }
        if merged.new_node {
            self.outputs.push_back(Output::Event(Event::Discovered(id)));
        }
        if let Some(routable) = merged.routable {
            self.emit_routable(id, routable);
        }
    }

    /// Checks a record that would change the replica, counting a forgery. The owner's
    /// signature is not checked again when the replica already holds exactly this owner's version
    /// (`owner_known`: a record that only gained a DOWN mark).
    fn authentic(&mut self, record: &Record, owner_known: bool) -> bool {
        let verdict = if owner_known {
            auth::check_marks(record, &self.config.verifier)
        } else {
            auth::check(record, &self.config.verifier)
        };
        match verdict {
            Ok(()) => true,
            Err(Forgery::Owner) => {
                self.stats.records_forged += 1;
                false
            }
            Err(Forgery::State | Forgery::Mark) => {
                self.stats.marks_forged += 1;
                false
            }
        }
    }

    /// Seals a new version of the local record with this node's key.
    pub(crate) fn seal(&self, record: &mut Record) {
        self.config.identity.seal(record);
    }

    pub(crate) fn emit_routable(&mut self, id: NodeId, routable: bool) {
        let e = if routable { Event::Routable(id) } else { Event::Unroutable(id) };
        self.outputs.push_back(Output::Event(e));
    }

    pub(crate) fn emit_local_state(&mut self) {
        let r = self.replica.local();
        let e = Event::LocalState { generation: r.generation, state: r.state };
        self.outputs.push_back(Output::Event(e));
    }

    pub(crate) fn transmit(&mut self, to: NodeId, payload: Bytes) {
        debug_assert!(payload.len() <= self.config.max_datagram);
        self.stats.datagrams_out += 1;
        self.stats.bytes_out += payload.len() as u64;
        self.outputs.push_back(Output::Transmit(Transmit { to, payload }));
    }

    pub(crate) fn jitter(&mut self, max: Duration) -> Duration {
        use rand::Rng;
        let micros = u64::try_from(max.as_micros()).unwrap_or(u64::MAX).max(1);
        Duration::from_micros(self.rng.random_range(0..micros))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_is_send_and_outputs_stay_small() {
        fn is_send<T: Send>() {}
        is_send::<Node>();
        assert!(core::mem::size_of::<Output>() <= 64, "Output is {} bytes", core::mem::size_of::<Output>());
        assert!(core::mem::size_of::<Input>() <= 64, "Input is {} bytes", core::mem::size_of::<Input>());
    }

    #[test]
    fn config_validation_names_the_problem() {
        let mut c = Config::new(NodeId::from_u64(1), 1);
        assert_eq!(c.validate(), Ok(()));
        c.membership.gossip_interval = Duration::ZERO;
        assert_eq!(c.validate(), Err(ConfigError::ZeroInterval("gossip_interval")));
        c = Config::new(NodeId::from_u64(1), 1);
        c.membership.outbound_anti_entropy_interval = Duration::ZERO;
        assert_eq!(c.validate(), Err(ConfigError::ZeroInterval("outbound_anti_entropy_interval")));
        c = Config::new(NodeId::from_u64(1), 1);
        c.membership.eager_sends = 0;
        assert_eq!(c.validate(), Err(ConfigError::ZeroEagerSends));
        c = Config::new(NodeId::from_u64(1), 1);
        c.membership.detector.probe_timeout = c.membership.detector.protocol_period;
        assert!(c.validate().unwrap_err().to_string().contains("probe_timeout"));
        c = Config::new(NodeId::from_u64(1), 1);
        c.max_datagram = 5000;
        assert!(c.validate().is_err());
    }
}
