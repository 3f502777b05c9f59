//! Benchmarks of Tela's protocol core (`tela-core`), and the realistic fixtures they share.
//!
//! The benches in `benches/core.rs` measure the three hot paths a node or gateway runs all the
//! time:
//!
//! - **merge** — [`Replica::merge`] of a record whose heartbeat advanced (the common gossip case)
//!   into a registry of 10,000 nodes, and a raw [`Record::join`] of two versions of one
//!   generation; reported as merges per second;
//! - **datagram** — filling a [`tela_core::harness::wire::Builder`] with records (two models each, public
//!   address) until it is full, finishing it and decoding it again with
//!   [`tela_core::harness::wire::decode`]; reported in bytes per second and time per full datagram;
//! - **lookup** — [`Replica::serving`] in a registry of 10,000 nodes whose models are spread over
//!   [`MODEL_NAMES`] names (about 500 hosts per model), and the lookup of a model nobody hosts.
//!
//! Run them with
//!
//! ```text
//! cargo bench -p tela-benches
//! cargo bench -p tela-benches -- merge          # only the benches whose name contains "merge"
//! cargo bench -p tela-benches -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Each bench keeps its sample count and measurement time small, so the whole suite takes about
//! a minute. Figures vary with the machine; tests never assert on them.
//!
//! The load tools in `src/bin` (`tela-load`, `tela-batch-load`, `tela-fairness`, `tela-paths`,
//! `tela-affinity`) share [`process`] (starting engine simulators, gateways and nodes on
//! loopback, and killing them on exit) and [`client`] (the HTTP client and percentiles).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod client;
pub mod process;

use std::sync::Arc;
use tela_core::{
    FabricId, GpuModel, Hardware, Lifecycle, Load, Model, ModelSet, NodeId, Quantization, Reachability, Record,
    Replica, Role, Time,
};

/// Number of distinct model names in [`registry`].
pub const MODEL_NAMES: u64 = 20;

/// A generation as a runtime would pick it: wall-clock milliseconds at start.
const GENERATION_BASE: u64 = 1_760_000_000_000;

/// The name of model number `k` (taken modulo [`MODEL_NAMES`]), shaped like a Hugging Face id.
pub fn model_name(k: u64) -> String {
    format!("org-{:02}/model-{:02}-8b-instruct", k % MODEL_NAMES, k % MODEL_NAMES)
}

/// A realistic record of node `n` in state SERVE: eight H100s on NVLink, a public address, a
/// wall-clock generation, a running heartbeat, some load, and `models` in bf16.
pub fn record(n: u64, models: &[&str]) -> Record {
    let mut hardware = Hardware::catalog(GpuModel::H100, 8);
    hardware.fabric = FabricId(1 + (n % 4) as u32);
    let [_, _, _, _, _, a, b, c] = n.to_be_bytes();
    let mut r = Record::new(
        NodeId::from_u64(n),
        GENERATION_BASE + n,
        Role::Serving,
        hardware,
        Reachability::Public(format!("10.{a}.{b}.{c}:7946")),
    );
    r.state = Lifecycle::Serve;
    r.heartbeat = 1_000 + n % 977;
    r.models = ModelSet::from_models(
        models.iter().map(|name| Model { name: (*name).to_string(), quant: Quantization::Bf16 }).collect(),
    );
    r.load = Load { in_flight: (n % 17) as u32, queued: (n % 5) as u32 };
    r
}

/// The record of node `n` in [`registry`]: `models_per_node` consecutive model names starting at
/// `n`'s own.
pub fn registry_record(n: u64, models_per_node: u64) -> Record {
    let names: Vec<String> = (0..models_per_node).map(|j| model_name(n + j)).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    record(n, &names)
}

/// A replica held by node 0 (a gateway) that knows nodes `1..=nodes`, each serving
/// `models_per_node` of [`MODEL_NAMES`] models, all alive and routable at [`Time::ZERO`].
pub fn registry(nodes: u64, models_per_node: u64) -> Replica {
    let mut local = Record::new(
        NodeId::from_u64(0),
        GENERATION_BASE,
        Role::Gateway,
        Hardware::CPU,
        Reachability::Public("203.0.113.1:7946".to_string()),
    );
    local.state = Lifecycle::Serve;
    let mut replica = Replica::new(local, Time::ZERO);
    for n in 1..=nodes {
        replica.merge(Time::ZERO, Arc::new(registry_record(n, models_per_node)));
    }
    replica
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_spreads_hosts_evenly_over_the_models() {
        let replica = registry(10_000, 1);
        assert_eq!(replica.len(), 10_001);
        assert_eq!(replica.serving(&model_name(7)).len(), 500);
        assert!(replica.serving("absent").is_empty());
    }

    #[test]
    fn fixture_records_are_valid_and_serve_their_models() {
        let r = record(70_000, &["a", "b"]);
        assert_eq!(r.validate(), Ok(()));
        assert_eq!(r.models.len(), 2);
        assert_eq!(r.reach, Reachability::Public("10.1.17.112:7946".to_string()));
    }
}
