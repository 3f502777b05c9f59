//! Tela's tokio runtime: the thin glue that runs the sans-IO protocol core
//! ([`tela_core::Node`]) in a real process. It owns sockets, timers, tasks and child
//! processes; every protocol decision stays in the core.
//!
//! # Roles
//!
//! - [`node`] — `tela node`, a serving node: probes or launches the inference engine,
//!   discovers its GPUs ([`gpu`]), dials out to the gateways and anchors (`--join`), serves
//!   the requests they tunnel to it ([`forward`]), pushes the engine's own load to the
//!   gateways ([`engine::report_load`], [`load_report`]), and drains before its walltime
//!   ([`walltime`], signals, `tela drain` over the [`control`] socket).
//! - [`anchor`] — a public member with no engine that outbound-only nodes dial; the gateway
//!   embeds one, `tela anchor` runs one alone.
//! - [`join`] — the flags with which every role joins the federation (`--join`, the join
//!   secret, `--transport`, `--identity`), written once and flattened into each role's.
//! - [`relay`] — `tela relay`, which forwards nodes' TCP+TLS tunnels to allowed gateways
//!   without terminating them; nodes reach gateways directly, through it or through the login
//!   host's `ssh` ([`ssh`]), as their [`path`] says.
//!
//! The spinner's way into batch systems (the Slurm command-line, `slurmrestd` and FirecREST v2
//! backends, and the job template that runs `tela node`) is a crate of its own, `tela-batch`,
//! which the gateway uses; this crate runs the jobs' nodes, it does not submit them.
//!
//! # Driving the core
//!
//! [`Runtime::start`] spawns the driver task that owns the [`Node`](tela_core::Node) (see
//! `driver.rs`): it feeds the core every datagram from every connection, connection ups and
//! downs, timer expiry (`sleep_until` the core's deadline), in-flight counts and local news
//! from [`LocalInputs`]; it executes transmits as datagrams (dialling public peers on
//! demand), publishes [`Event`](tela_core::Event)s to subscribers and the log, stops the
//! engine and ends itself when the core says so. The application reads the registry through
//! [`RegistrySnapshot`](status::RegistrySnapshot)s, which the driver publishes into a
//! [`SnapshotCell`](snapshot::SnapshotCell) that request handlers read without waiting.
//!
//! Load reports do not go through the core: they are the runtime's own datagrams, told apart
//! from the core's by their first byte ([`load_report`]). A node sends them with
//! [`RuntimeView::send_to_gateways`]; the connection tasks of a receiving runtime keep the
//! latest of each node in [`RuntimeView::load_reports`], which the gateway routes by.
//! Other datagrams tagged the same way (first byte `0xF1` and up) go to handlers the
//! application registers with [`RuntimeView::tagged`] ([`tagged`]): gateways exchange their keys'
//! spend so ([`tela_core::spend`]).
//!
//! ```no_run
//! use tela_core::{Config, Model};
//! use tela_runtime::{anchor::{Anchor, AnchorConfig}, Runtime, RuntimeConfig};
//! use tela_transports::{Endpoint, EndpointConfig, Identity, JoinSecret, TransportMode};
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let secret = JoinSecret::new("federation secret")?;
//! // A public anchor...
//! let anchor = Anchor::start(AnchorConfig {
//!     listen: "127.0.0.1:0".parse()?,
//!     advertise: None,
//!     identity: Identity::generate()?,
//!     join_secret: secret.clone(),
//!     join: vec![],
//!     transport: TransportMode::Auto,
//!     drain_window: Duration::from_secs(5),
//! }).await?;
//!
//! // ...and a serving node that dials it and announces a model.
//! let identity = Identity::generate()?;
//! let mut config = RuntimeConfig::new(Config::with_identity(identity.signer().clone(), tela_runtime::clock::generation_now()));
//! config.join = vec![anchor.local_addr().to_string()];
//! let endpoint = Endpoint::dialer(EndpointConfig::new(identity, secret))?;
//! let node = Runtime::start(config, endpoint, tela_runtime::runtime::refuse_streams());
//! node.inputs().engine_ready(vec![Model::named("llama")]).await?;
//!
//! // The anchor's replica learns that the node serves "llama".
//! let seen = anchor.runtime().wait_for(Duration::from_secs(10), |s| !s.replica().serving("llama").is_empty()).await;
//! assert!(seen.is_some());
//! # Ok(()) }
//! ```
//!
//! # Shared state and its loom tests
//!
//! State shared between tasks is kept to three small types, each model-checked with
//! [loom](https://docs.rs/loom) over every interleaving of its writer and readers:
//! [`SnapshotCell`](snapshot::SnapshotCell) (readers always get a complete snapshot and never
//! block the writer for longer than an `Arc` clone), [`InFlight`](inflight::InFlight) (the
//! in-flight counter never loses or invents a request) and [`PeerTable`](peers::PeerTable)
//! (a redial never leaves a peer without a connection). The one other, the load-report table
//! ([`LoadReports`](load_report::LoadReports)), is a mutex around a map whose every use is one
//! short critical section that calls out to nothing. Run the loom tests with
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p tela-runtime --lib --release loom
//! ```
//!
//! Under `--cfg loom` only these three modules are compiled (and only `tela-core` and `loom`
//! among the dependencies), so the run takes seconds to build; the separate
//! target directory keeps it from invalidating the normal build.
//!
//! # Tests
//!
//! Unit tests live beside the code. The integration tests that drive real `tela node` and
//! `tela anchor` processes live in `gateway/tests/processes/` (the package that owns the `tela` binary,
//! so Cargo builds it before any test's clock starts): `federation_forms_*`,
//! `admission_refusals_say_why`, `engine_death_turns_node_down`, `sigusr1_drains_open_streams`,
//! `real_engine_llama_cpp`, `slurm_sbatch`, `slurm_rest`, the walltime test, and the login-host
//! paths (`nodes_reach_the_gateway_through_ssh_or_a_relay`,
//! `nodes_behind_a_login_host_in_network_namespaces`).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod inflight;
pub mod peers;
pub mod snapshot;
mod sync;

#[cfg(not(loom))]
pub mod anchor;
#[cfg(not(loom))]
pub mod backoff;
#[cfg(not(loom))]
pub mod clock;
#[cfg(not(loom))]
pub mod control;
#[cfg(not(loom))]
mod driver;
#[cfg(not(loom))]
pub mod engine;
#[cfg(not(loom))]
pub mod forward;
#[cfg(not(loom))]
pub mod gpu;
#[cfg(not(loom))]
pub mod identity;
#[cfg(not(loom))]
pub mod join;
#[cfg(not(loom))]
pub mod load_report;
#[cfg(not(loom))]
pub mod node;
#[cfg(not(loom))]
pub mod path;
#[cfg(not(loom))]
pub mod relay;
#[cfg(not(loom))]
pub mod runtime;
#[cfg(not(loom))]
pub mod signals;
#[cfg(not(loom))]
pub mod ssh;
#[cfg(not(loom))]
pub mod status;
#[cfg(not(loom))]
pub mod tagged;
#[cfg(not(loom))]
pub mod walltime;

#[cfg(not(loom))]
pub use runtime::{Exit, IncomingStream, LocalInputs, Runtime, RuntimeConfig, RuntimeView, StreamHandler};
