//! Tela's protocol core: node records, the registry lattice, the local lifecycle, the bounded
//! wire format and the sans-IO [`Node`] state machine that every runtime drives.
//!
//! This crate does no I/O. It reads no clock (time is an input: [`Time`]), opens no socket,
//! spawns no thread and draws randomness only from a seeded [`rand_chacha::ChaCha8Rng`] whose
//! seed comes from [`Config::rng_seed`]. The tokio runtime, the simulator, the fuzzers and the
//! tests all drive the same [`Node`]:
//!
//! ```
//! use tela_core::{Config, Input, Model, Node, NodeId, Output, Reachability, Time};
//! use std::collections::VecDeque;
//!
//! // Two public nodes; datagrams "arrive" 1 ms after they are sent.
//! let mk = |n: u64| {
//!     let mut c = Config::new(NodeId::from_u64(n), 1);
//!     c.reach = Reachability::Public(format!("10.0.0.{n}:7000"));
//!     Node::new(c, Time::ZERO)
//! };
//! let mut nodes = [mk(1), mk(2)];
//! nodes[1].handle_input(Time::ZERO, Input::EngineReady { models: vec![Model::named("llama")] });
//! // Node 1 learns of node 2 the way a runtime would: node 2 dialled it.
//! nodes[0].handle_input(Time::ZERO, Input::PeerConnected(NodeId::from_u64(2)));
//!
//! let mut in_flight: VecDeque<(Time, usize, NodeId, bytes::Bytes)> = VecDeque::new();
//! let mut now = Time::ZERO;
//! while now < Time::from_secs(3) {
//!     let mut next = Time::NEVER;
//!     for (i, node) in nodes.iter_mut().enumerate() {
//!         loop {
//!             match node.poll_output() {
//!                 Output::Transmit(t) => {
//!                     let to = (t.to.short() - 1) as usize;
//!                     in_flight.push_back((now + std::time::Duration::from_millis(1), to, NodeId::from_u64(i as u64 + 1), t.payload));
//!                 }
//!                 Output::Event(_) | Output::Command(_) => {}
//!                 Output::Timeout(at) => { next = next.min(at); break; }
//!             }
//!         }
//!     }
//!     if let Some(&(at, ..)) = in_flight.front() { next = next.min(at); }
//!     now = next;
//!     while in_flight.front().is_some_and(|(at, ..)| *at <= now) {
//!         let (_, to, from, payload) = in_flight.pop_front().unwrap();
//!         nodes[to].handle_input(now, Input::Datagram { from, payload });
//!     }
//!     for node in &mut nodes { node.handle_input(now, Input::Timeout); }
//! }
//! assert_eq!(nodes[0].replica().serving("llama").to_vec(), [NodeId::from_u64(2)]);
//! ```
//!
//! Modules by concept: [`record`] (the lattice), [`auth`] (owner signatures and DOWN marks),
//! [`replica`] (the registry and its index), [`intern`] (records shared between replicas),
//! [`wire`] (datagrams), [`routing`] (which node gets a request), [`lifecycle`] (the local state),
//! [`membership`] (who is in the federation and how the registry spreads: SWIM probing, built on
//! [`swim`] (failure detection), [`broadcast`] (piggybacked updates), [`anti_entropy`]
//! (hashed-bucket repair) and [`peers`] (whom to send to)),
//! [`hardware`] (GPU catalog and profiles), [`placement`] (which hardware a model runs on),
//! [`spin`] (demand into batch jobs), [`cold_start`] (requests waiting for a first replica),
//! [`spend`] (API keys' spend per gateway, the lattice that holds budgets across gateways),
//! and `harness` (a multi-node test bench, behind the `harness` feature).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod answers;
pub mod anti_entropy;
pub mod auth;
pub mod broadcast;
pub mod cold_start;
pub mod hardware;
pub mod heap;
pub mod id;
pub mod intern;
pub mod lifecycle;
pub mod membership;
pub mod node;
pub mod peers;
pub mod placement;
pub mod record;
pub mod replica;
pub mod retry;
pub mod routing;
pub mod spend;
pub mod spin;
pub mod swim;
pub mod time;
pub mod timer;
pub mod wire;

#[cfg(feature = "harness")]
pub mod harness;

pub use auth::{DownMark, Forgery, Identity, MarkedDown, Seal, Verifier, Verify};
pub use broadcast::{BroadcastQueue, Queued, RecordUpdate, Update};
pub use cold_start::{ColdStartQueue, Enqueued};
pub use hardware::{FabricId, GpuModel, Hardware, Interconnect};
pub use heap::HeapBytes;
pub use id::NodeId;
pub use intern::{Intern, Interner};
pub use membership::MembershipSettings;
pub use node::{Command, Config, ConfigError, Event, Input, Node, Output, Stats, Transmit};
pub use placement::{place, ModelSpec, NoPlacement, NodeShape, Placement};
pub use record::{Lifecycle, Load, Model, ModelSet, Quantization, Reachability, Record, Role, SharedRecord, Version};
pub use replica::Replica;
pub use routing::{route, route_with, HostState, Prefix, PrefixHasher, RouteError, RoutingPolicy};
pub use spin::{Demand, JobId, ModelPolicy, SpinCommand, SpinConfig, SpinView, Spinner};
pub use swim::{Swim, SwimConfig};
pub use time::Time;
pub use wire::{DecodeError, Message, MAX_DATAGRAM};

/// Puts `item` into a slab whose holes `free` lists: into the last hole freed, or at the end.
/// Returns its slab number.
pub(crate) fn slab_insert<T>(slab: &mut Vec<Option<T>>, free: &mut Vec<u32>, item: T) -> u32 {
    if let Some(n) = free.pop() {
        slab[n as usize] = Some(item);
        return n;
    }
    reserve_one(slab);
    slab.push(Some(item));
    (slab.len() - 1) as u32
}

/// Makes room for one more element in `v`, growing a full vector by a quarter instead of
/// doubling it. For the tables a node keeps per member of the registry (replica slots, routable
/// hosts, the probe order): at 10,000 members doubling leaves up to half of each unused, a
/// quarter-step growth at most a fifth, and the copies stay amortised `O(1)`.
pub(crate) fn reserve_one<T>(v: &mut Vec<T>) {
    if v.len() == v.capacity() {
        v.reserve_exact(v.len() / 4 + 4);
    }
}
