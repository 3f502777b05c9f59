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
//! # The facade, by group
//!
//! Everything public is listed here; the rest of the crate is internal.
//!
//! **Driving a node** (at the root). [`Node`] is the state machine, and its doc comment says how
//! a runtime drives it: create it with [`Node::new`], feed each [`Input`] to
//! [`Node::handle_input`] with the current [`Time`], then drain [`Node::poll_output`] — each
//! [`Output`] a [`Transmit`] to send, an [`Event`] to pass on or a [`Command`] to carry out —
//! until it returns the next deadline, and sleep until that deadline or the next input. A node
//! is built from a [`Config`] ([`Config::validate`] refuses it with a [`ConfigError`]) whose
//! [`MembershipSettings`] hold the failure detector's [`SwimConfig`] ([`SwimConfigError`]).
//! [`NodeId`] names nodes; [`Stats`] and [`HeapBytes`] count what a node did and what it holds;
//! an [`Interner`] (an [`Intern`] pool) lets the nodes of one process share equal records.
//!
//! **Records and the registry** (at the root). A node's [`Record`] ([`SharedRecord`] once
//! shared, ordered by its [`Version`], refused as an [`InvalidRecord`] beyond [`MAX_MODELS`],
//! [`MAX_MODEL_NAME`] or [`MAX_ADDR`]) says what the node is ([`Role`]; [`Hardware`]: a
//! [`GpuModel`], its [`Interconnect`] and [`FabricId`], or a [`ProfileError`] for a profile that
//! names none), how to reach it ([`Reachability`]), what it serves ([`Model`]s in a
//! [`ModelSet`], each with its [`Quantization`]), how busy it is ([`Load`]) and where it stands
//! ([`Lifecycle`]). [`Node::replica`] is the node's view of the federation: a [`Replica`] of
//! [`Slot`]s that answers which nodes are [`Serving`] a model; [`Replica::merge`] is the
//! lattice's join ([`Merged`]).
//!
//! **Authenticity** (at the root). An [`Identity`] seals its own record ([`Seal`]: a
//! [`PublicKey`] and [`SignatureBytes`]) and marks failed nodes down ([`DownMark`], kept in a
//! [`MarkedDown`]); a [`Verifier`] (built-in, or any [`Verify`]) checks both, and
//! [`Verifier::check`] says what was forged ([`Forgery`]). The rules are on [`Verifier`].
//!
//! **Datagrams** (at the root). Every datagram is at most [`MAX_DATAGRAM`] bytes and starts with
//! [`WIRE_VERSION`]; one that does not decode is an [`Event::Rejected`] with its
//! [`DecodeError`], and the node's state is unchanged.
//!
//! **The request path's decisions** (a module each). [`routing`] picks the node for a request:
//! [`routing::route`] and [`routing::route_with`] by a [`routing::RoutingPolicy`], keeping a
//! conversation on one node by its [`routing::Prefix`]. [`retry`] decides whether a request that
//! failed before its first byte moves to another node. [`cold_start`] holds requests for a model
//! with no replica yet ([`cold_start::ColdStartQueue`]). [`spend`] is the lattice of API keys'
//! spend that gateways exchange, in datagrams of their own.
//!
//! **Spinning and placement** (a module each). [`spin`] turns demand into batch jobs: a
//! [`spin::Spinner`] decides from a [`spin::SpinView`] and returns [`spin::SpinCommand`]s, and
//! [`spin::config`] is the `[spin]` configuration schema the gateway and the simulator share.
//! [`placement`] decides which hardware a model runs on.
//!
//! With the `harness` feature (test tooling, off in production) `harness` adds a multi-node test
//! bench and, in `harness::wire` and `harness::auth`, the wire messages and signature internals
//! that tests, fuzzers, benchmarks and the simulator craft and inspect datagrams with.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
// The facade above is the whole public API: anything else is `pub(crate)`, and no public
// signature leaks a type users cannot name. (Without `harness` the items only it re-exports
// are `pub` but unreachable, which is intended.)
#![cfg_attr(feature = "harness", warn(unreachable_pub))]
#![warn(unnameable_types)]

mod answers;
mod anti_entropy;
mod auth;
mod broadcast;
pub mod cold_start;
mod hardware;
mod heap;
mod id;
mod intern;
mod lifecycle;
mod membership;
mod node;
mod peers;
pub mod placement;
mod record;
mod replica;
pub mod retry;
pub mod routing;
pub mod spend;
pub mod spin;
mod swim;
mod time;
mod timer;
mod wire;

#[cfg(feature = "harness")]
pub mod harness;

pub use auth::{DownMark, Forgery, Identity, MarkedDown, PublicKey, Seal, SignatureBytes, Verifier, Verify};
pub use hardware::{FabricId, GpuModel, Hardware, Interconnect, ProfileError};
pub use heap::HeapBytes;
pub use id::NodeId;
pub use intern::{Encoding, Intern, Interner};
pub use membership::MembershipSettings;
pub use node::{Command, Config, ConfigError, Event, Input, Node, Output, Stats, Transmit};
pub use record::{
    InvalidRecord, Lifecycle, Load, Model, ModelSet, Quantization, Reachability, Record, Role, SharedRecord, Version,
    MAX_ADDR, MAX_MODELS, MAX_MODEL_NAME,
};
pub use replica::{Merged, Replica, Serving, Slot};
pub use swim::{SwimConfig, SwimConfigError, MOST_CONFIRMATIONS};
pub use time::Time;
pub use wire::{DecodeError, MAX_DATAGRAM, WIRE_VERSION};

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

/// Makes room for one more element in `v`, growing a full vector by a sixteenth instead of
/// doubling it. For the tables a node keeps per member of the registry (replica slots, the
/// detector's members, routable hosts): at 10,000 members doubling leaves up
/// to half of each unused, a sixteenth-step growth at most 6%, and the copies stay amortised
/// `O(1)` (each element is copied about sixteen times while a table grows from empty).
pub(crate) fn reserve_one<T>(v: &mut Vec<T>) {
    if v.len() == v.capacity() {
        v.reserve_exact(growth(v.len()));
    }
}

/// How many elements [`reserve_one`] adds to a full table of `len`.
pub(crate) fn growth(len: usize) -> usize {
    len / 16 + 4
}
