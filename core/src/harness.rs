//! A small multi-node test bench in the manner of quinn-proto's `Pair`: it owns virtual time,
//! per-link latency and loss, and an MTU — any datagram larger than the MTU fails the test.
//!
//! One thread, one seeded RNG, deterministic for a given seed and sequence of calls. The
//! large-scale, fault-rich simulator is `tela-sim`; this harness is for the core's own tests.
//!
//! It also opens two internals that production code never needs, for the tests, fuzzers,
//! benchmarks and the simulator that craft or inspect datagrams: [`wire`] (the messages and
//! their bounded encoders) and [`auth`] (the signed bytes and the key checks behind a
//! [`Verifier`](crate::Verifier)).
//!
//! ```
//! use tela_core::harness::Harness;
//! use tela_core::{Config, Input, Model, NodeId, Reachability};
//! use std::time::Duration;
//!
//! let mut h = Harness::new(7);
//! for n in 1..=3 {
//!     let mut c = Config::new(NodeId::from_u64(n), 1);
//!     c.reach = Reachability::Public(format!("node{n}"));
//!     h.add(c);
//! }
//! h.connect(NodeId::from_u64(1), NodeId::from_u64(2));
//! h.connect(NodeId::from_u64(1), NodeId::from_u64(3));
//! h.input(NodeId::from_u64(3), Input::EngineReady { models: vec![Model::named("m")] });
//! h.run_for(Duration::from_secs(5));
//! assert!(h.running().all(|n| h.node(n).replica().serving("m").to_vec() == [NodeId::from_u64(3)]));
//! ```

/// The wire format: every message a node sends, and the bounded encoders it fills datagrams with.
pub mod wire {
    pub use crate::wire::{
        decode, encode_buckets, encode_piggyback, encode_unbounded, BucketEntry, Builder, EntriesBuilder, Message,
        Piggyback, ProbeBuilder, WireItem,
    };
}

/// What records' owners and DOWN marks sign, and the key checks a custom [`Verify`](crate::Verify)
/// can reuse.
pub mod auth {
    pub use crate::auth::{mark_message, owner_message, CheckedKey, Strict};
}

use crate::id::NodeId;
use crate::node::{Command, Config, Event, Input, Node, Output};
use crate::time::Time;
use crate::wire::MAX_DATAGRAM;
use bytes::Bytes;
use core::cmp::Ordering;
use core::time::Duration;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

/// A datagram on the wire.
#[derive(Debug)]
struct Flight {
    at: Time,
    seq: u64,
    from: NodeId,
    to: NodeId,
    payload: Bytes,
}

impl PartialEq for Flight {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Flight {}
impl PartialOrd for Flight {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Flight {
    // Reversed: BinaryHeap is a max-heap and we want the earliest first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// A node in the harness and everything it told the world.
#[derive(Debug)]
pub struct Member {
    /// The state machine.
    pub node: Node,
    /// Its next deadline.
    pub deadline: Time,
    /// Every event it emitted, in order.
    pub events: Vec<Event>,
    /// Every command it issued, in order.
    pub commands: Vec<Command>,
    /// False once it exited or was killed.
    pub running: bool,
}

/// Virtual time, lossy links and an MTU check around a set of [`Node`]s.
#[derive(Debug)]
pub struct Harness {
    now: Time,
    seq: u64,
    rng: ChaCha8Rng,
    flights: BinaryHeap<Flight>,
    members: BTreeMap<NodeId, Member>,
    latency: Duration,
    link_latency: BTreeMap<(NodeId, NodeId), Duration>,
    loss: f64,
    mtu: usize,
    cut: BTreeSet<(NodeId, NodeId)>,
    /// Datagrams delivered so far.
    pub delivered: u64,
    /// Datagrams dropped by loss or cuts so far.
    pub dropped: u64,
}

impl Harness {
    /// An empty harness: 1 ms links, no loss, a [`MAX_DATAGRAM`] MTU.
    pub fn new(seed: u64) -> Harness {
        Harness {
            now: Time::ZERO,
            seq: 0,
            rng: ChaCha8Rng::seed_from_u64(seed),
            flights: BinaryHeap::new(),
            members: BTreeMap::new(),
            latency: Duration::from_millis(1),
            link_latency: BTreeMap::new(),
            loss: 0.0,
            mtu: MAX_DATAGRAM,
            cut: BTreeSet::new(),
            delivered: 0,
            dropped: 0,
        }
    }

    /// Current virtual time.
    pub fn now(&self) -> Time {
        self.now
    }

    /// Sets the default one-way latency.
    pub fn set_latency(&mut self, d: Duration) {
        self.latency = d;
    }

    /// Sets the one-way latency from `a` to `b` (one direction).
    pub fn set_link_latency(&mut self, a: NodeId, b: NodeId, d: Duration) {
        self.link_latency.insert((a, b), d);
    }

    /// Sets the probability that any datagram is lost.
    pub fn set_loss(&mut self, p: f64) {
        self.loss = p;
    }

    /// Sets the MTU; a larger datagram panics.
    pub fn set_mtu(&mut self, mtu: usize) {
        self.mtu = mtu;
    }

    /// Drops everything between `a` and `b`, both ways, until [`Harness::heal`].
    pub fn cut(&mut self, a: NodeId, b: NodeId) {
        self.cut.insert((a, b));
        self.cut.insert((b, a));
    }

    /// Removes every cut.
    pub fn heal(&mut self) {
        self.cut.clear();
    }

    /// Starts a node at the current time. Replaces (restarts) a node with the same id.
    pub fn add(&mut self, config: Config) -> NodeId {
        let id = config.id;
        let node = Node::new(config, self.now);
        let member = Member { node, deadline: self.now, events: Vec::new(), commands: Vec::new(), running: true };
        self.members.insert(id, member);
        self.flush(id);
        id
    }

    /// Starts nodes `1..=n`, public, each configured by `configure`, and connects every other
    /// one to node 1 (as nodes that joined through it); returns their ids in order.
    pub fn public_star(&mut self, n: u64, configure: impl Fn(&mut Config)) -> Vec<NodeId> {
        let ids: Vec<NodeId> = (1..=n).map(NodeId::from_u64).collect();
        for &id in &ids {
            let mut c = Config::new(id, 1);
            c.reach = crate::Reachability::Public(format!("node{id}"));
            configure(&mut c);
            self.add(c);
        }
        for &id in &ids[1..] {
            self.connect(ids[0], id);
        }
        ids
    }

    /// Tells both nodes a connection between them is up, as after `b` dialled `a`.
    pub fn connect(&mut self, a: NodeId, b: NodeId) {
        self.input(a, Input::PeerConnected(b));
        self.input(b, Input::PeerConnected(a));
    }

    /// Feeds an input to a running node at the current time.
    pub fn input(&mut self, id: NodeId, input: Input) {
        let now = self.now;
        if let Some(m) = self.members.get_mut(&id).filter(|m| m.running) {
            m.node.handle_input(now, input);
            self.flush(id);
        }
    }

    /// Stops a node silently, as `kill -9` would.
    pub fn kill(&mut self, id: NodeId) {
        if let Some(m) = self.members.get_mut(&id) {
            m.running = false;
        }
    }

    /// The node with this id (running or not).
    ///
    /// # Panics
    /// If no node with this id was ever added.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.member(id).node
    }

    /// The member with this id.
    ///
    /// # Panics
    /// If no node with this id was ever added.
    pub fn member(&self, id: NodeId) -> &Member {
        self.members.get(&id).unwrap_or_else(|| panic!("no node {id} in the harness"))
    }

    /// Ids of running nodes, in id order.
    pub fn running(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.members.iter().filter(|(_, m)| m.running).map(|(id, _)| *id)
    }

    /// Advances virtual time by `d`, delivering datagrams and firing timers on the way.
    pub fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.step(end) {}
        self.now = end;
    }

    /// Runs until `done` holds (checked after every step) or `limit` has passed; returns whether
    /// `done` held.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Harness) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            if done(self) {
                return true;
            }
            if !self.step(end) {
                self.now = end;
                return done(self);
            }
        }
    }

    /// Processes the next delivery or timer at or before `end`; false if there is none.
    fn step(&mut self, end: Time) -> bool {
        let next_flight = self.flights.peek().map_or(Time::NEVER, |f| f.at);
        let next_timer = self.members.values().filter(|m| m.running).map(|m| m.deadline).min().unwrap_or(Time::NEVER);
        let at = next_flight.min(next_timer);
        if at > end || at == Time::NEVER {
            return false;
        }
        self.now = self.now.max(at);
        if next_flight <= next_timer {
            let f = self.flights.pop().expect("peeked");
            self.deliver(f);
        } else {
            let due: Vec<NodeId> =
                self.members.iter().filter(|(_, m)| m.running && m.deadline <= at).map(|(id, _)| *id).collect();
            for id in due {
                self.input(id, Input::Timeout);
            }
        }
        true
    }

    fn deliver(&mut self, f: Flight) {
        let now = self.now;
        match self.members.get_mut(&f.to).filter(|m| m.running) {
            Some(m) => {
                self.delivered += 1;
                m.node.handle_input(now, Input::Datagram { from: f.from, payload: f.payload });
                self.flush(f.to);
            }
            None => self.dropped += 1,
        }
    }

    /// Drains a node's outputs: datagrams onto the wire, events and commands into its log.
    fn flush(&mut self, id: NodeId) {
        loop {
            let Some(m) = self.members.get_mut(&id) else {
                return;
            };
            match m.node.poll_output() {
                Output::Timeout(at) => {
                    m.deadline = at;
                    if m.node.has_exited() {
                        m.running = false;
                    }
                    return;
                }
                Output::Event(e) => m.events.push(e),
                Output::Command(c) => m.commands.push(c),
                Output::Transmit(t) => {
                    assert!(
                        t.payload.len() <= self.mtu,
                        "node {id} sent a datagram of {} bytes to {}, over the {}-byte MTU",
                        t.payload.len(),
                        t.to,
                        self.mtu
                    );
                    let lost = self.loss > 0.0 && self.rng.random_bool(self.loss.clamp(0.0, 1.0));
                    if lost || self.cut.contains(&(id, t.to)) {
                        self.dropped += 1;
                        continue;
                    }
                    let latency = self.link_latency.get(&(id, t.to)).copied().unwrap_or(self.latency);
                    self.seq += 1;
                    self.flights.push(Flight {
                        at: self.now + latency,
                        seq: self.seq,
                        from: id,
                        to: t.to,
                        payload: t.payload,
                    });
                }
            }
        }
    }
}
