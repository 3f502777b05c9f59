//! The node state machine facade: every runtime drives the protocol through [`Node`]. This file
//! holds the node, its inputs and outputs and its counters; `config` holds [`Config`] and
//! [`ConfigError`], and `merge` how records from peers are checked and merged.

use crate::anti_entropy::AntiEntropy;
use crate::heap::HeapBytes;
use crate::id::NodeId;
use crate::lifecycle::Local;
use crate::membership::Membership;
use crate::record::{Lifecycle, Load, Model, Record, SharedRecord};
use crate::replica::Replica;
use crate::time::Time;
use crate::timer::{Timer, TimerTable};
use crate::wire::{self, DecodeError, MAX_DATAGRAM};
use bytes::Bytes;
use core::time::Duration;
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;
use std::collections::VecDeque;

mod config;
mod merge;

pub use config::{Config, ConfigError};

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
    /// suspicions this node withdrew when it found they dated from a cut that has healed (a
    /// member it held in doubt suspected it too, or it refuted one of itself while holding most
    /// members in doubt).
    pub suspicions_withdrawn: u64,
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
    /// datagrams answering a peer's fetch of records it lacked.
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
    /// Records refused because their owner did not sign them as they are
    /// ([`Verifier::check`](crate::Verifier::check)).
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

    /// The heap bytes of this node's tables, by table; see [`HeapBytes`].
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

    /// Whether the failure detector suspects `id` now: a suspicion raised and not yet refuted
    /// or confirmed.
    pub fn suspects(&self, id: &NodeId) -> bool {
        self.membership.detector.is_suspect(&self.replica, id)
    }

    /// Updates waiting to be piggybacked, as (records, suspicions); both run out once a quiet
    /// federation has spread its news.
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
}
