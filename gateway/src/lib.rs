//! Tela's HTTP face and the home of the single `tela` binary.
//!
//! Each `tela` subcommand is a thin wrapper in `src/main.rs` around a module of this library, so
//! that tests, the demo and other binaries can embed the same logic in one process:
//!
//! - [`gateway`] — `tela gateway`, the **ingress**: an embedded anchor that serving nodes dial,
//!   and the OpenAI-compatible API that routes every request over one of their tunnels. Its
//!   parts: [`service`] (paths, auth, limits), [`proxy`] (forwarding with retries before the
//!   first byte), [`routing`] (the core's decision plus live tunnels and in-flight counts),
//!   [`body`] (streamed responses and the SSE error event), [`auth`] (hashed, named API keys,
//!   reloaded), [`limits`] (each key's rates, concurrency and token budget, and its batches' own), [`budgets`]
//!   (budgets held across gateways), [`fairness`] (keys share a saturated model fairly, by
//!   [`fair_queue`]), [`ledger`] (one
//!   row per request in the gateway's SQLite database, [`db`]), [`batch`] (OpenAI's Batch
//!   API, run on spare capacity and kept in that database), [`server`]
//!   (TCP/TLS, HTTP/1.1 and HTTP/2), [`metrics`], [`status`] and [`dashboard`]. With a
//!   `[spin]` section in its configuration file ([`config`]) it also starts serving nodes in
//!   batch jobs on demand and holds requests for them ([`spin`]); with `[[overflow]]`
//!   sections, keys allowed to overflow are served by outside OpenAI-compatible providers when
//!   the federation cannot take their requests ([`overflow`], over [`client_tls`] for HTTPS).
//! - [`demo`] — `tela demo`, a gateway, three nodes and three engine simulators on loopback.
//! - [`cli`] — the flags of `tela gateway` and `tela status --gateway`.
//! - [`usage`] — `tela usage`, requests and tokens per key, account, model or day from one or
//!   several gateways' ledgers.
//! - [`engine_sim`] — `tela engine-sim`, the built-in **engine simulator**: an OpenAI-compatible
//!   HTTP server that stands in for vLLM or llama.cpp in demos and tests. It generates
//!   deterministic placeholder text from a fixed word list; it is not a model.
//! - [`logging`] — the `tracing` subscriber every subcommand installs (`--log` or `RUST_LOG`).
//!
//! Start several simulated engines in one process and talk to them over loopback:
//!
//! ```no_run
//! use tela_gateway::engine_sim::{self, EngineSimConfig};
//!
//! # async fn demo() -> Result<(), engine_sim::EngineSimError> {
//! let mut config = EngineSimConfig::default();
//! config.models = vec!["llama-3-8b".into()];
//! let engine = engine_sim::spawn(config, "127.0.0.1:0".parse().unwrap()).await?;
//! println!("engine at http://{}/v1", engine.local_addr());
//! // ... send OpenAI requests to it ...
//! println!("served {} requests", engine.stats().requests);
//! engine.shutdown().await?;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod api_error;
pub mod auth;
pub mod batch;
pub mod body;
pub mod budgets;
pub mod cli;
pub mod client_tls;
pub mod config;
pub mod dashboard;
pub mod db;
pub mod demo;
pub mod engine_sim;
pub mod fair_queue;
pub mod fairness;
pub mod gateway;
pub mod ledger;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod overflow;
pub mod proxy;
pub mod routing;
pub mod server;
pub mod service;
pub mod spin;
pub mod status;
pub mod usage;
