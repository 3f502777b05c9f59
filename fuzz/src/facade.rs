//! The `node_facade` target: one [`Node`] driven by an arbitrary sequence of inputs.
//!
//! # Input layout
//!
//! The bytes are read front to back; once they run out every further read yields zero, and the
//! run ends. First twelve bytes of [`Config`] (see [`config`]), then up to [`MAX_STEPS`]
//! operations, each one byte (`% OPS`) naming the operation followed by its parameters. The seed
//! corpus is written with the same layout (`src/seeds.rs`).
//!
//! # What is checked
//!
//! Only what the core guarantees:
//!
//! - nothing panics (the debug assertions inside the core included);
//! - every transmitted datagram is at most the configured `max_datagram` (≤ [`MAX_DATAGRAM`]),
//!   and decodes whenever the node's own record is within the wire limits (the models an engine
//!   reports are not validated, so a node told to serve an empty or over-long model name sends
//!   records its peers reject);
//! - the node's own record never moves backwards: the generation never decreases, and within a
//!   generation neither the state nor the heartbeat does; [`Event::LocalState`] reports every
//!   change and agrees with the record;
//! - a version of the node's own record that it does not hold is refuted if it is authentic
//!   ([`tela_core::Verifier::check`]): afterwards its record dominates the one it heard (unless that
//!   one's generation is `u64::MAX`, above which no generation exists); a forged one changes
//!   nothing;
//! - every other authentic record received ends up merged: the replica's record dominates it;
//!   a forged one (unsigned, altered, or with a DOWN mark its confirmer did not sign) never
//!   changes the replica, and is counted unless the replica already held something newer;
//! - `Routable`/`Unroutable` events alternate per node and match the replica's routable slots,
//!   and `Replica::serving` lists exactly the routable hosts of each model name;
//! - after [`Input::Timeout`] the next deadline lies after `now` (or is [`Time::NEVER`]);
//! - `StopEngine` is issued at most once and only in LEFT, `Exit` only after it, and an exited
//!   node ignores every input.

use arbitrary::Unstructured;
use bytes::Bytes;
use core::time::Duration;
use std::collections::BTreeSet;
use tela_core::harness::wire::{self, Builder, Message, Piggyback, ProbeBuilder};
use tela_core::{
    Command, Config, Event, GpuModel, Hardware, Identity, Input, Lifecycle, Load, Model, ModelSet, Node, NodeId,
    Output, Quantization, Reachability, Record, Role, Time, Version, MAX_DATAGRAM,
};

/// The fuzzed node's id.
pub(crate) const OWN: NodeId = NodeId::from_u64(1);
/// Records, digests and senders use ids `1..=IDS`; the node's own id is one of them.
const IDS: u64 = 6;
/// Most operations one input runs.
const MAX_STEPS: usize = 256;
/// Model names peers and the engine draw from.
const NAMES: [&str; 6] = ["llama", "qwen", "mistral", "phi", "gemma", "zz"];

/// Operation codes: the byte that starts each operation, taken modulo [`op::OPS`].
pub(crate) mod op {
    /// `[]`: a timeout at the node's deadline (or now, if it has none in the future).
    pub const TIMEOUT_AT_DEADLINE: u8 = 0;
    /// `[ms/4: u16]`: time advances, then a timeout.
    pub const TIMEOUT_AFTER: u8 = 1;
    /// `[ms: u16]`: a timeout stamped earlier than the latest time fed.
    pub const TIMEOUT_STALE: u8 = 2;
    /// `[from, len: u16, bytes..]`: a datagram of arbitrary bytes.
    pub const RAW_DATAGRAM: u8 = 3;
    /// `[from, count, record..]`: a `Records` datagram (see `peer_record`: signed, DOWN-marked or
    /// forged).
    pub const RECORDS: u8 = 4;
    /// `[from, tweak, amount]`: the node's own record, altered, sent back to it.
    pub const OWN_ECHO: u8 = 5;
    /// `[from, count, (id, generation, state, heartbeat: u16)..]`: a `Gossip` datagram of
    /// announcements (`Piggyback::Have`), which the node may answer with a `Fetch`.
    pub const ANNOUNCE: u8 = 6;
    /// `[from, count, id..]`: a `Want` datagram, or a `Fetch` when `count >= 128`.
    pub const WANT: u8 = 7;
    /// `[from, record, position: u16, xor]`: a one-record datagram with one byte altered (which
    /// breaks its signature, if it still decodes).
    pub const MUTATED: u8 = 8;
    /// `[count, model..]`: the engine is ready with these models (see `engine_models`).
    pub const ENGINE_READY: u8 = 9;
    /// `[]`: the engine failed.
    pub const ENGINE_FAILED: u8 = 10;
    /// `[]`: drain requested.
    pub const DRAIN: u8 = 11;
    /// `[past, 100 ms: u16]`: the walltime, that far in the future (or the past if `past` is odd).
    pub const WALLTIME: u8 = 12;
    /// `[load]`: in flight `load % 4`, queued `load / 4`.
    pub const LOAD: u8 = 13;
    /// `[id]`: a connection to node `id % 8` is up.
    pub const CONNECT: u8 = 14;
    /// `[id]`: the connection to node `id % 8` is gone.
    pub const DISCONNECT: u8 = 15;
    /// `[from, kind, seq: u16, target, count, item..]`: a SWIM message (`kind % 5`: ping,
    /// ping-req for `target`, ack, nack, gossip) carrying `count % 5` piggybacked items (see
    /// `piggyback`).
    pub const PROBE: u8 = 16;
    /// Number of operations.
    pub const OPS: u8 = PROBE + 1;
}

/// Feeds a [`Node`] the sequence of inputs encoded in `data` and checks its guarantees after
/// every input (see the module docs for the layout and the properties).
pub fn node_facade(data: &[u8]) {
    drive(data);
}

/// Runs `data` as in [`node_facade`] and returns the final state for tests to inspect.
pub(crate) fn drive(data: &[u8]) -> Run {
    let mut u = Unstructured::new(data);
    let config = config(&mut u);
    let mut run = Run::new(config);
    for _ in 0..MAX_STEPS {
        if u.is_empty() {
            break;
        }
        run.step(&mut u);
    }
    run
}

fn byte(u: &mut Unstructured<'_>) -> u8 {
    u.arbitrary().unwrap_or(0)
}

fn word(u: &mut Unstructured<'_>) -> u16 {
    u.arbitrary().unwrap_or(0)
}

fn peer_id(u: &mut Unstructured<'_>) -> NodeId {
    NodeId::from_u64(1 + u64::from(byte(u)) % IDS)
}

/// A duration byte: 0 keeps `default`, 255 means zero, anything else is `b * unit`.
fn duration(u: &mut Unstructured<'_>, default: Duration, unit: Duration) -> Duration {
    match byte(u) {
        0 => default,
        255 => Duration::ZERO,
        b => unit * u32::from(b),
    }
}

/// Twelve bytes: flags (bit 0 gateway, bit 1 public, bits 2–3 the generation's kind), generation,
/// rng seed, gossip interval (10 ms units), gossip fanout, anti-entropy interval (20 ms),
/// outbound-only anti-entropy interval (50 ms), eager sends, drain window (250 ms), leave linger
/// (20 ms), max datagram (`200 + 4 b`) and the protocol period (10 ms). Zero bytes keep the
/// defaults; values [`Node::new`] must clamp (zero intervals, zero fanout, datagram limits out
/// of range) are allowed.
fn config(u: &mut Unstructured<'_>) -> Config {
    let flags = byte(u);
    let g = u64::from(byte(u));
    let generation = match (flags >> 2) & 3 {
        0 => 1 + g,
        1 => u64::MAX - g % 4,
        2 => 0,
        _ => (1 << 40) + g,
    };
    let mut c = Config::new(OWN, generation);
    if flags & 1 != 0 {
        c.role = Role::Gateway;
    }
    if flags & 2 != 0 {
        c.reach = Reachability::Public("10.0.0.1:7000".to_string());
    }
    c.rng_seed = u64::from(byte(u));
    let ms = Duration::from_millis;
    let m = &mut c.membership;
    m.gossip_interval = duration(u, m.gossip_interval, ms(10));
    m.gossip_fanout = match byte(u) {
        0 => m.gossip_fanout,
        b => usize::from(b % 6),
    };
    m.anti_entropy_interval = duration(u, m.anti_entropy_interval, ms(20));
    m.outbound_anti_entropy_interval = duration(u, m.outbound_anti_entropy_interval, ms(50));
    m.eager_sends = match byte(u) {
        0 => m.eager_sends,
        b => u32::from(b % 6),
    };
    c.drain_window = duration(u, c.drain_window, ms(250));
    c.leave_linger = duration(u, c.leave_linger, ms(20));
    c.max_datagram = match byte(u) {
        0 => c.max_datagram,
        b => 200 + 4 * usize::from(b),
    };
    // Zero and periods under the probe timeout are allowed: the detector clamps them.
    let detector = &mut c.membership.detector;
    detector.protocol_period = match byte(u) {
        0 => detector.protocol_period,
        255 => Duration::ZERO,
        b => ms(10) * u32::from(b),
    };
    c
}

/// A valid record of a node `1..=IDS`: `[id, generation % 4, state % 4, heartbeat: u16, flags
/// (bit 0 gateway, bit 1 public, bit 2 GPUs), models % 5, model.., load]`, each model one byte
/// (name `b % 6`, format `b / 6 % 3`).
fn peer_record(u: &mut Unstructured<'_>) -> Record {
    let id = peer_id(u);
    let generation = u64::from(byte(u) % 4);
    let state = lifecycle(byte(u));
    let heartbeat = u64::from(word(u));
    let flags = byte(u);
    let role = if flags & 1 != 0 { Role::Gateway } else { Role::Serving };
    let reach = if flags & 2 != 0 {
        Reachability::Public(format!("10.0.0.{}:7000", id.short()))
    } else {
        Reachability::OutboundOnly
    };
    let hardware = if flags & 4 != 0 { Hardware::catalog(GpuModel::H100, 8) } else { Hardware::CPU };
    let mut r = Record::new(id, generation, role, hardware, reach);
    r.state = state;
    r.heartbeat = heartbeat;
    let n = byte(u) % 5;
    r.models = ModelSet::from_models((0..n).map(|_| pooled_model(byte(u))).collect());
    let load = byte(u);
    r.load = Load { in_flight: u32::from(load % 4), queued: u32::from(load / 4) };
    seal_peer_record(r, flags)
}

/// Flags bit 4 (16) leaves the record unsigned, a forgery; otherwise its owner's test identity
/// seals it, and bit 3 (8) has the next peer mark it DOWN (a mark by the owner itself when the
/// next peer is the fuzzed node is still a valid mark).
fn seal_peer_record(mut r: Record, flags: u8) -> Record {
    if flags & 16 != 0 {
        return r;
    }
    Identity::for_test(r.id).seal(&mut r);
    if flags & 8 != 0 {
        let confirmer = NodeId::from_u64(r.id.short() % IDS + 1);
        r = r.with_down_mark(Identity::for_test(confirmer).mark_down(&r));
    }
    r
}

fn lifecycle(b: u8) -> Lifecycle {
    [Lifecycle::Join, Lifecycle::Serve, Lifecycle::Down, Lifecycle::Left][usize::from(b % 4)]
}

fn pooled_model(b: u8) -> Model {
    let quant = [Quantization::Unknown, Quantization::Bf16, Quantization::Awq];
    Model {
        name: NAMES[usize::from(b) % NAMES.len()].to_string(),
        quant: quant[usize::from(b) / NAMES.len() % quant.len()],
    }
}

/// `[count % 10, model..]`: a model byte below 0xc0 is a pooled name (as in `peer_record`); from
/// 0xc0 up it is followed by a length byte and that many bytes of name, which may be empty, over
/// the wire's limit or not UTF-8 (replaced lossily) — what a misbehaving engine could report.
fn engine_models(u: &mut Unstructured<'_>) -> Vec<Model> {
    let n = byte(u) % 10;
    (0..n)
        .map(|_| match byte(u) {
            b if b < 0xc0 => pooled_model(b),
            _ => {
                let len = usize::from(byte(u)).min(u.len());
                let raw = u.bytes(len).unwrap_or_default();
                Model::named(String::from_utf8_lossy(raw))
            }
        })
        .collect()
}

/// The node under test and what its outputs have told so far.
pub(crate) struct Run {
    pub(crate) node: Node,
    /// The latest time fed.
    now: Time,
    /// The deadline from the last `Output::Timeout`.
    deadline: Time,
    /// The last `LocalState` event.
    local_state: (u64, Lifecycle),
    pub(crate) routable: BTreeSet<NodeId>,
    discovered: BTreeSet<NodeId>,
    transmits: u64,
    stopped_engine: bool,
    exited: bool,
    /// `Routable` and `Unroutable` events seen.
    pub(crate) flips: u64,
    /// Datagrams fed that the node rejected.
    pub(crate) rejected: u64,
}

impl Run {
    fn new(config: Config) -> Run {
        let node = Node::new(config, Time::ZERO);
        let own = node.local_record().version();
        let mut run = Run {
            node,
            now: Time::ZERO,
            deadline: Time::ZERO,
            local_state: (own.generation, own.state),
            routable: BTreeSet::new(),
            discovered: BTreeSet::new(),
            transmits: 0,
            stopped_engine: false,
            exited: false,
            flips: 0,
            rejected: 0,
        };
        run.drain(false, false, own);
        run
    }

    /// Decodes and feeds one operation.
    fn step(&mut self, u: &mut Unstructured<'_>) {
        let code = byte(u) % op::OPS;
        let ms = |n: u64| Duration::from_millis(n);
        match code {
            op::TIMEOUT_AT_DEADLINE => {
                let at = if self.deadline == Time::NEVER { self.now + ms(1000) } else { self.deadline.max(self.now) };
                self.feed(at, Input::Timeout);
            }
            op::TIMEOUT_AFTER => {
                let at = self.now + ms(4 * u64::from(word(u)));
                self.feed(at, Input::Timeout);
            }
            op::TIMEOUT_STALE => {
                let at = self.now.saturating_sub(ms(u64::from(word(u))));
                self.feed(at, Input::Timeout);
            }
            op::RAW_DATAGRAM => {
                let from = peer_id(u);
                let len = (usize::from(word(u)) % 1200).min(u.len());
                let payload = u.bytes(len).unwrap_or_default().to_vec();
                self.datagram(from, payload);
            }
            op::RECORDS => {
                let from = peer_id(u);
                let n = 1 + byte(u) % 4;
                let records: Vec<Record> = (0..n).map(|_| peer_record(u)).collect();
                self.datagram(from, records_datagram(&records).to_vec());
            }
            op::OWN_ECHO => {
                let from = peer_id(u);
                let echo = self.own_echo(byte(u), byte(u));
                self.datagram(from, records_datagram(&[echo]).to_vec());
            }
            op::ANNOUNCE => {
                let from = peer_id(u);
                let n = 1 + byte(u) % 8;
                let mut b = ProbeBuilder::gossip(MAX_DATAGRAM);
                for _ in 0..n {
                    let id = peer_id(u);
                    let version = Version {
                        generation: u64::from(byte(u) % 4),
                        state: lifecycle(byte(u)),
                        heartbeat: u64::from(word(u)),
                    };
                    b.push(&Piggyback::Have { id, version });
                }
                self.datagram(from, b.finish().to_vec());
            }
            op::WANT => {
                let from = peer_id(u);
                let count = byte(u);
                let n = 1 + count % 6;
                let mut b =
                    if count >= 128 { Builder::fetch(MAX_DATAGRAM) } else { Builder::<NodeId>::new(MAX_DATAGRAM) };
                for _ in 0..n {
                    b.push(&peer_id(u));
                }
                self.datagram(from, b.finish().to_vec());
            }
            op::MUTATED => {
                let from = peer_id(u);
                let record = peer_record(u);
                let mut payload = records_datagram(&[record]).to_vec();
                let at = usize::from(word(u)) % payload.len().max(1);
                let xor = byte(u).max(1);
                if let Some(b) = payload.get_mut(at) {
                    *b ^= xor;
                }
                self.datagram(from, payload);
            }
            op::ENGINE_READY => {
                let models = engine_models(u);
                self.feed(self.now, Input::EngineReady { models });
            }
            op::ENGINE_FAILED => self.feed(self.now, Input::EngineFailed),
            op::DRAIN => self.feed(self.now, Input::DrainRequested),
            op::WALLTIME => {
                let past = byte(u) % 2 == 1;
                let d = ms(100 * u64::from(word(u)));
                let at = if past { self.now.saturating_sub(d) } else { self.now + d };
                self.feed(self.now, Input::Walltime(at));
            }
            op::LOAD => {
                let b = byte(u);
                let load = Load { in_flight: u32::from(b % 4), queued: u32::from(b / 4) };
                self.feed(self.now, Input::Load(load));
            }
            op::CONNECT => {
                let peer = NodeId::from_u64(u64::from(byte(u) % 8));
                self.feed(self.now, Input::PeerConnected(peer));
            }
            op::DISCONNECT => {
                let peer = NodeId::from_u64(u64::from(byte(u) % 8));
                self.feed(self.now, Input::PeerDisconnected(peer));
            }
            _ => {
                let from = peer_id(u);
                let kind = byte(u) % 5;
                let seq = u32::from(word(u));
                let target = peer_id(u);
                let limit = self.node.config().max_datagram;
                let mut b = match kind {
                    0 => ProbeBuilder::ping(limit, seq),
                    1 => ProbeBuilder::ping_req(limit, target, seq),
                    2 => ProbeBuilder::ack(limit, seq),
                    3 => ProbeBuilder::nack(limit, seq),
                    _ => ProbeBuilder::gossip(limit),
                };
                for _ in 0..byte(u) % 5 {
                    let item = self.piggyback(u);
                    b.push(&item);
                }
                self.datagram(from, b.finish().to_vec());
            }
        }
    }

    /// One piggybacked item: `[kind]`, then for an odd kind a record as in `peer_record`, for
    /// `kind % 4 == 2` an announcement `[id, generation, state, heartbeat: u16]` (generation and
    /// state `% 4`), and otherwise a suspicion `[id, generation, heartbeat: u16, from]`
    /// (generation `% 4`, or the node's own current one when `generation % 5 == 4`, so that
    /// suspicions of the node itself reach its refutation).
    fn piggyback(&self, u: &mut Unstructured<'_>) -> Piggyback {
        let kind = byte(u);
        if kind % 2 == 1 {
            return Piggyback::Record(peer_record(u));
        }
        let id = peer_id(u);
        if kind % 4 == 2 {
            let generation = u64::from(byte(u) % 4);
            let state = [Lifecycle::Join, Lifecycle::Serve, Lifecycle::Down, Lifecycle::Left][usize::from(byte(u) % 4)];
            let version = Version { generation, state, heartbeat: u64::from(word(u)) };
            return Piggyback::Have { id, version };
        }
        let generation = match byte(u) {
            g if g % 5 == 4 => self.node.local_record().generation,
            g => u64::from(g % 4),
        };
        let heartbeat = u64::from(word(u));
        Piggyback::Suspect { id, generation, heartbeat, from: peer_id(u), age: word(u) }
    }

    /// The node's own record as a peer might hold it: `tweak % 9` picks the change, `amount`
    /// sizes it.
    /// Tweaks 2 to 8 re-seal the record with the node's own key (a version from an earlier
    /// process, or another process holding the same key); 1 adds a peer's valid DOWN mark; 9
    /// alters the state without re-sealing, a forgery.
    fn own_echo(&self, tweak: u8, amount: u8) -> Record {
        let mut r = (**self.node.local_record()).clone();
        let k = u64::from(amount);
        match tweak % 10 {
            0 => {}
            1 => {
                let confirmer = NodeId::from_u64(u64::from(amount) % (IDS - 1) + 2);
                return r.with_down_mark(Identity::for_test(confirmer).mark_down(&r));
            }
            9 => {
                r.state = Lifecycle::Left;
                r.heartbeat = r.heartbeat.saturating_add(1);
                return r;
            }
            2 => r.state = Lifecycle::Left,
            3 => r.heartbeat = r.heartbeat.saturating_add(1 + k),
            4 => r.generation = r.generation.saturating_sub(1 + k % 4),
            5 => r.generation = r.generation.saturating_add(k),
            6 => r.generation = u64::MAX,
            7 => {
                r.models = r.models.union(&ModelSet::from_models(vec![pooled_model(amount)]));
            }
            _ => {
                r.role = Role::Gateway;
                r.reach = Reachability::Public(format!("192.0.2.{amount}:7000"));
            }
        }
        Identity::for_test(OWN).seal(&mut r);
        r
    }

    /// Feeds a datagram and checks that the records in it were merged (or refuted).
    fn datagram(&mut self, from: NodeId, payload: Vec<u8>) {
        let decoded = wire::decode(&payload);
        let was_exited = self.node.has_exited();
        let before = self.node.replica().sorted_records();
        let own_before = self.node.local_record().clone();
        let forged_before = self.node.stats().records_forged + self.node.stats().marks_forged;
        self.feed(self.now, Input::Datagram { from, payload: Bytes::from(payload) });
        let (Ok(msg), false) = (decoded, was_exited) else {
            return;
        };
        let records: Vec<&Record> = match &msg {
            Message::Records(records) => records.iter().collect(),
            other => other
                .piggyback()
                .iter()
                .filter_map(|p| match p {
                    Piggyback::Record(r) => Some(r),
                    Piggyback::Suspect { .. } | Piggyback::Have { .. } => None,
                })
                .collect(),
        };
        if msg.piggyback().iter().all(|p| matches!(p, Piggyback::Have { .. })) && !msg.piggyback().is_empty() {
            // Announcements only ask; they change nothing held.
            assert_eq!(before, self.node.replica().sorted_records(), "an announcement changed the replica");
        }
        let verifier = self.node.config().verifier.clone();
        let forgeries = records.iter().filter(|r| verifier.check(r).is_err()).count() as u64;
        let forged_after = self.node.stats().records_forged + self.node.stats().marks_forged;
        assert!(forged_after - forged_before <= forgeries, "an authentic record was counted as forged");
        if forgeries == records.len() as u64 {
            // Only forgeries: the records of their ids stay as they were, and nobody refutes.
            let held = |set: &[tela_core::SharedRecord], id: NodeId| set.iter().find(|x| x.id == id).cloned();
            let after = self.node.replica().sorted_records();
            for r in &records {
                if r.id != OWN {
                    assert_eq!(held(&before, r.id), held(&after, r.id), "a forged record changed the replica");
                }
            }
            assert_eq!(
                own_before.generation,
                self.node.local_record().generation,
                "a forged record made the node refute"
            );
        }
        for r in records {
            if verifier.check(r).is_err() {
                let held = self.node.replica().get(&r.id).map(|s| (**s.record()).clone());
                assert!(held.as_ref() != Some(r) || before.iter().any(|b| **b == *r), "forged {} held", r.id);
                continue;
            }
            if r.id == OWN {
                if r.generation < u64::MAX {
                    assert!(
                        self.node.local_record().dominates(r),
                        "own record {:?} not refuted by {:?}",
                        r.version(),
                        self.node.local_record().version()
                    );
                }
            } else {
                let held = self.node.replica().get(&r.id).map(|s| s.record().clone());
                assert!(held.is_some_and(|h| h.dominates(r)), "record of {} not merged", r.id);
            }
        }
    }

    /// Feeds one input at `at` and drains the outputs.
    fn feed(&mut self, at: Time, input: Input) {
        let timeout = input == Input::Timeout;
        let was_exited = self.node.has_exited();
        let before = self.node.local_record().version();
        self.node.handle_input(at, input);
        // Time never goes backwards: an earlier `at` counts as the latest time seen.
        self.now = self.now.max(at);
        self.drain(timeout, was_exited, before);
    }

    /// Drains outputs until the timeout and checks every guarantee.
    fn drain(&mut self, timeout: bool, was_exited: bool, before: Version) {
        let limit = self.node.config().max_datagram;
        assert!(limit <= MAX_DATAGRAM, "max_datagram {limit} not clamped");
        let own_valid = self.node.local_record().validate().is_ok();
        loop {
            let out = self.node.poll_output();
            assert!(!was_exited || out == Output::Timeout(Time::NEVER), "an exited node produced {out:?}");
            match out {
                Output::Transmit(t) => {
                    self.transmits += 1;
                    assert!(t.payload.len() <= limit, "{}-byte datagram over the {limit}-byte limit", t.payload.len());
                    if own_valid {
                        if let Err(e) = wire::decode(&t.payload) {
                            panic!("the node sent a datagram that does not decode: {e}");
                        }
                    }
                }
                Output::Event(Event::LocalState { generation, state }) => {
                    let (g, s) = self.local_state;
                    assert!(
                        generation > g || (generation == g && state >= s),
                        "local state went from {g}/{s:?} back to {generation}/{state:?}"
                    );
                    self.local_state = (generation, state);
                }
                Output::Event(Event::Routable(id)) => {
                    self.flips += 1;
                    assert!(self.routable.insert(id), "{id} routable twice");
                }
                Output::Event(Event::Unroutable(id)) => {
                    self.flips += 1;
                    assert!(self.routable.remove(&id), "{id} unroutable twice");
                }
                Output::Event(Event::Discovered(id)) => {
                    assert_ne!(id, OWN, "the node discovered itself");
                    assert!(self.discovered.insert(id), "{id} discovered twice");
                }
                Output::Event(Event::Rejected { .. }) => self.rejected += 1,
                Output::Command(Command::StopEngine) => {
                    assert!(!self.stopped_engine, "StopEngine issued twice");
                    self.stopped_engine = true;
                }
                Output::Command(Command::Exit) => {
                    assert!(self.stopped_engine, "Exit before StopEngine");
                    assert!(!self.exited, "Exit issued twice");
                    self.exited = true;
                }
                Output::Timeout(at) => {
                    self.deadline = at;
                    break;
                }
            }
        }
        if timeout {
            assert!(self.deadline > self.now, "deadline {} not after the timeout at {}", self.deadline, self.now);
        }
        self.check_state(before);
    }

    fn check_state(&mut self, before: Version) {
        let node = &self.node;
        assert_eq!(node.has_exited(), self.exited);
        assert_eq!(node.stats().datagrams_out, self.transmits);
        let own = node.local_record().version();
        assert!(
            own.generation > before.generation
                || (own.generation == before.generation
                    && own.state >= before.state
                    && own.heartbeat >= before.heartbeat),
            "own record moved back from {before:?} to {own:?}"
        );
        assert_eq!((own.generation, own.state), self.local_state, "LocalState events disagree with the record");
        if self.stopped_engine {
            assert_eq!(own.state, Lifecycle::Left, "engine stopped outside LEFT");
        }

        let replica = node.replica();
        let routable: BTreeSet<NodeId> =
            replica.slots().iter().filter(|s| s.is_routable()).map(|s| s.record().id).collect();
        assert_eq!(routable, self.routable, "Routable events disagree with the replica");
        for slot in replica.slots() {
            let r = slot.record();
            for m in r.models.as_slice() {
                let listed = replica.serving(&m.name).contains(&r.id);
                assert_eq!(listed, slot.is_routable(), "index of '{}' wrong for {}", m.name, r.id);
            }
        }
        for name in replica.routable_models() {
            let hosts = replica.serving(name);
            let unique: BTreeSet<NodeId> = hosts.iter().collect();
            assert_eq!(unique.len(), hosts.len(), "'{name}' lists a host twice");
            for id in hosts.iter() {
                let slot = replica.get(&id);
                assert!(
                    slot.is_some_and(|s| s.is_routable() && s.record().models.contains_name(name)),
                    "'{name}' lists {id}, which is not a routable host of it"
                );
            }
        }
    }
}

/// A `Records` datagram of as many of `records` as fit.
fn records_datagram(records: &[Record]) -> Bytes {
    let mut b = Builder::<Record>::new(MAX_DATAGRAM);
    for r in records {
        b.push(r);
    }
    b.finish()
}
