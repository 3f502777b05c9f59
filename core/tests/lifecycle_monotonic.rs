//! Property: whatever a node is fed, its own record never moves backwards — the generation
//! never decreases, and within a generation neither the state nor the heartbeat does.

use proptest::prelude::*;
use std::time::Duration;
use tela_core::harness::wire::{encode_unbounded, Message, Piggyback};
use tela_core::{
    Config, Hardware, Input, Lifecycle, Load, Model, Node, NodeId, Output, Reachability, Record, Role, Time, Version,
    MAX_DATAGRAM,
};

const ME: NodeId = NodeId::from_u64(1);

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Ready(Vec<u8>),
    Failed,
    Drain,
    Walltime(u64),
    Load(u32),
    /// A record of our own id as some peer holds it.
    Echo(u64, u8, u64),
    /// A peer's suspicion of us, or its announcement of a version of our record.
    Suspect(u64, u64),
    Have(u64, u8, u64),
    Garbage(Vec<u8>),
    Connect(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..3_000).prop_map(Op::Advance),
        2 => prop::collection::vec(0u8..4, 0..4).prop_map(Op::Ready),
        1 => Just(Op::Failed),
        1 => Just(Op::Drain),
        1 => (0u64..2_000_000).prop_map(Op::Walltime),
        2 => (0u32..3).prop_map(Op::Load),
        2 => (0u64..4, 0u8..4, 0u64..20).prop_map(|(g, s, h)| Op::Echo(g, s, h)),
        1 => (0u64..4, 0u64..20).prop_map(|(g, h)| Op::Suspect(g, h)),
        1 => (0u64..4, 0u8..4, 0u64..20).prop_map(|(g, s, h)| Op::Have(g, s, h)),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Op::Garbage),
        1 => (2u64..5).prop_map(Op::Connect),
    ]
}

fn state(s: u8) -> Lifecycle {
    [Lifecycle::Join, Lifecycle::Serve, Lifecycle::Down, Lifecycle::Left][usize::from(s % 4)]
}

fn input(op: &Op, now: Time) -> Option<Input> {
    let from = NodeId::from_u64(2);
    Some(match op {
        Op::Advance(_) => Input::Timeout,
        Op::Ready(ms) => Input::EngineReady { models: ms.iter().map(|m| Model::named(format!("m{m}"))).collect() },
        Op::Failed => Input::EngineFailed,
        Op::Drain => Input::DrainRequested,
        Op::Walltime(ms) => Input::Walltime(now + Duration::from_millis(*ms)),
        Op::Load(n) => Input::Load(Load { in_flight: *n, queued: 0 }),
        Op::Echo(g, s, h) => {
            let mut r = Record::new(ME, *g, Role::Serving, Hardware::CPU, Reachability::OutboundOnly);
            r.state = state(*s);
            r.heartbeat = *h;
            Input::Datagram { from, payload: encode_unbounded(&Message::Records(vec![r])).into() }
        }
        Op::Suspect(g, h) => {
            let p = Piggyback::Suspect { id: ME, generation: *g, heartbeat: *h, from, age: 0 };
            Input::Datagram { from, payload: encode_unbounded(&Message::Gossip(vec![p])).into() }
        }
        Op::Have(g, s, h) => {
            let version = Version { generation: *g, state: state(*s), heartbeat: *h };
            let p = Piggyback::Have { id: ME, version };
            Input::Datagram { from, payload: encode_unbounded(&Message::Gossip(vec![p])).into() }
        }
        Op::Garbage(b) => Input::Datagram { from, payload: b.clone().into() },
        Op::Connect(n) => Input::PeerConnected(NodeId::from_u64(*n)),
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn own_record_never_moves_backwards(ops in prop::collection::vec(op(), 1..120)) {
        let mut now = Time::ZERO;
        let mut node = Node::new(Config::new(ME, 1), now);
        let mut last = node.local_record().version();
        let mut deadline = Time::NEVER;
        for op in &ops {
            if let Op::Advance(ms) = op {
                now = now + Duration::from_millis(*ms);
                if now < deadline { continue; }
            }
            if let Some(i) = input(op, now) {
                node.handle_input(now, i);
            }
            loop {
                match node.poll_output() {
                    Output::Transmit(t) => prop_assert!(t.payload.len() <= MAX_DATAGRAM),
                    Output::Timeout(at) => { deadline = at; break; }
                    _ => {}
                }
            }
            let v = node.local_record().version();
            prop_assert!(v.generation >= last.generation, "generation went back: {:?} -> {:?}", last, v);
            if v.generation == last.generation {
                prop_assert!(v.state >= last.state, "state went back within a generation: {:?} -> {:?}", last, v);
                prop_assert!(v.heartbeat >= last.heartbeat, "heartbeat went back: {:?} -> {:?}", last, v);
            }
            if matches!(op, Op::Advance(_)) {
                // After a timeout nothing is left overdue: the next deadline is in the future.
                prop_assert!(deadline > now, "deadline {} not after {}", deadline, now);
            }
            last = v;
        }
    }

    #[test]
    fn a_drained_node_always_ends_left_and_exits(ops in prop::collection::vec(op(), 0..60)) {
        let mut now = Time::ZERO;
        let mut c = Config::new(ME, 1);
        c.drain_window = Duration::from_secs(30);
        let mut node = Node::new(c, now);
        for op in &ops {
            if let Op::Advance(ms) = op { now = now + Duration::from_millis(*ms); }
            if let Some(i) = input(op, now) { node.handle_input(now, i); }
            while !matches!(node.poll_output(), Output::Timeout(_)) {}
        }
        node.handle_input(now, Input::DrainRequested);
        // Whatever happened before, a drain ends in LEFT and an exit within the window plus linger.
        let limit = now + Duration::from_secs(32);
        let mut exited = node.has_exited();
        while now <= limit && !exited {
            loop {
                match node.poll_output() {
                    Output::Command(tela_core::Command::Exit) => exited = true,
                    Output::Timeout(at) => { now = at.max(now); break; }
                    _ => {}
                }
            }
            node.handle_input(now, Input::Timeout);
        }
        prop_assert!(exited, "no exit by {limit}");
        prop_assert_eq!(node.local_record().state, Lifecycle::Left);
    }
}

#[test]
fn the_end_of_time_does_not_hang() {
    let mut node = Node::new(Config::new(ME, 1), Time::ZERO);
    node.handle_input(Time::NEVER, Input::Timeout);
    while !matches!(node.poll_output(), Output::Timeout(_)) {}
    node.handle_input(Time::NEVER, Input::Timeout);
}

#[test]
fn model_names_the_wire_cannot_carry_are_dropped() {
    let mut node = Node::new(Config::new(ME, 1), Time::ZERO);
    let models = vec![Model::named(""), Model::named("x".repeat(200)), Model::named("ok")];
    node.handle_input(Time::ZERO, Input::EngineReady { models });
    assert_eq!(node.local_record().models.as_slice(), &[Model::named("ok")]);
    assert_eq!(node.stats().models_rejected, 2);
    assert!(node.local_record().validate().is_ok());
}
