//! `tela-sim`: a deterministic discrete-event simulator that drives Tela's protocol core — the
//! very same [`tela_core::Node`] state machines as production — at federation scale.
//!
//! One thread, virtual time, one root seed split into named random streams. The network model
//! has sites with intra-site and WAN latency and jitter, loss, duplication, reordering, symmetric
//! and one-way partitions, NAT in front of outbound-only nodes, per-node clock offset and drift,
//! and the 1,100-byte datagram limit enforced on every send. Connections to gateways close at
//! once when a process exits, but a killed process (`kill -9`, Slurm's kill) closes nothing: its
//! peers keep the connection, and a gateway keeps routing over it (each request fails before
//! its first byte and is retried elsewhere), until the idle timeout (`network.idle_timeout_s`,
//! 5 s like `tela gateway`'s node connections). The world model has Slurm-like jobs
//! (queue waits, walltimes with their drain, preemptions with a grace period, crashes), engines
//! (start-up time, token rate) and clients whose requests simulated gateways route with the
//! core's own routing decision. A scenario either has its nodes join over its first seconds
//! or starts with the federation formed (`federation.formed`: every replica restored with
//! every record through [`tela_core::Node::restore`]), which is how the 10,000-node scenario
//! measures a running federation.
//!
//! Scenarios with a `[spin]` section also drive the core's spin controller
//! ([`tela_core::spin::Spinner`]): a simulated gateway measures demand per model, requests with no
//! replica wait in core cold-start queues, and the spinner's submit, cancel and drain commands
//! become simulated Slurm jobs on partitions of different GPUs (queue waits, walltimes and their
//! drains, preemptions). The report then adds the in-flight completion of drains, cold-start
//! waits, GPU-hours against an oracle that knows the demand in advance, and flaps
//! ([`report_spin`] defines each).
//!
//! While running it checks invariants (lattice monotonicity of watched records at every
//! replica, own records only moving forward, no oversized datagram, no request routed to a node
//! its gateway believes non-SERVE, no datagram from a correct peer rejected), then, after the
//! faults stop, a liveness phase: every live replica must hold the same view within the
//! scenario's bound. Same scenario and seed give the same event trace and the same `hash`.
//!
//! Drive it from the command line (`tela-sim run smoke-100 --seed 7 --report r.json --plot
//! out/`) or from code. Two environment variables print more to stderr: `TELA_SIM_DEBUG` how
//! replicas differ when a liveness phase fails, `TELA_SIM_TRACE` every tracked change with its
//! spreading curve and how many nodes took it through each kind of message (`Records`, a
//! transfer; `Gossip`; `Ping`; ...), each of the last three nodes to take a change more
//! than 3 s after it began with how the others then held that node (a slow tail's make-up), and,
//! every 5 simulated seconds and for the whole run, datagrams and bytes by message kind, the
//! records and suspicions they carried by kind, and the updates queued per node (`traffic.rs`:
//! where the bytes of a partition's cut and heal go).
//!
//!
//! ```
//! use tela_sim::{Limits, Scenario, Sim};
//! let mut sc = Scenario::parse("duration_s = 20\nfaults_until_s = 10\n[federation]\nnodes = 12").unwrap();
//! sc.name = "doc".into();
//! let report = Sim::new(sc, 1, false, Limits::default()).run();
//! assert!(report.passed(), "{}", report.summary());
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod heap;
pub mod liar;
pub mod plot;
mod pool;
pub mod report;
pub mod report_spin;
pub mod rng;
pub mod scenario;
mod sim;
mod spin;
mod track;
mod traffic;
mod world;

pub use report::Report;
pub use scenario::Scenario;
pub use sim::{Limits, Sim};
pub use track::Curve;

/// The command that replays a run.
pub fn replay_command(scenario: &str, seed: u64, swarm: bool) -> String {
    format!("cargo run --release -p tela-sim -- run {scenario} --seed {seed}{}", if swarm { " --swarm" } else { "" })
}
