//! Helpers shared by the harness tests.
#![allow(dead_code)]

use std::time::Duration;
use tela_core::harness::Harness;
use tela_core::{Config, Input, Lifecycle, Model, NodeId, Reachability, Record, Role};

pub fn id(n: u64) -> NodeId {
    NodeId::from_u64(n)
}

/// A public node `n` with test-friendly timings.
pub fn public(n: u64) -> Config {
    let mut c = Config::new(id(n), 100);
    c.reach = Reachability::Public(format!("10.0.0.{n}:7000"));
    c.rng_seed = n * 7919;
    c
}

/// An outbound-only serving node `n`.
pub fn outbound(n: u64) -> Config {
    let mut c = public(n);
    c.reach = Reachability::OutboundOnly;
    c
}

/// A gateway (public anchor) `n`.
pub fn gateway(n: u64) -> Config {
    let mut c = public(n);
    c.role = Role::Gateway;
    c
}

pub fn serve(h: &mut Harness, n: u64, models: &[&str]) {
    h.input(id(n), Input::EngineReady { models: models.iter().map(|m| Model::named(*m)).collect() });
}

/// What every replica must agree on: records without the ever-moving heartbeat and load.
pub fn view(h: &Harness, of: NodeId) -> Vec<(NodeId, u64, Lifecycle, Vec<Model>)> {
    h.node(of)
        .replica()
        .sorted_records()
        .iter()
        .map(|r: &std::sync::Arc<Record>| (r.id, r.generation, r.state, r.models.as_slice().to_vec()))
        .collect()
}

/// True when all running nodes hold the same view.
pub fn views_agree(h: &Harness) -> bool {
    let mut ids = h.running();
    let Some(first) = ids.next() else { return true };
    let v = view(h, first);
    ids.all(|n| view(h, n) == v)
}

/// The state every running replica holds for `of`, if all agree.
pub fn agreed_state(h: &Harness, of: NodeId) -> Option<(u64, Lifecycle)> {
    let mut states = h
        .running()
        .filter(|n| *n != of)
        .map(|n| h.node(n).replica().get(&of).map(|s| (s.record().generation, s.record().state)));
    let first = states.next()??;
    states.all(|s| s == Some(first)).then_some(first)
}

pub const LONG: Duration = Duration::from_secs(60);

/// `n` public nodes at 5% loss, all dialled to node 1, nodes 2..=n serving model "m"; returns
/// once every node routes to every serving node and all views agree.
pub fn federation(n: u64, seed: u64) -> Harness {
    federation_of(n, seed, public)
}

/// [`federation`] with node `i` configured by `config(i)`.
pub fn federation_of(n: u64, seed: u64, config: impl Fn(u64) -> Config) -> Harness {
    let mut h = Harness::new(seed);
    h.set_loss(0.05);
    for i in 1..=n {
        h.add(config(i));
    }
    for i in 2..=n {
        h.connect(id(1), id(i));
        serve(&mut h, i, &["m"]);
    }
    let all = (n - 1) as usize;
    let ready = |h: &Harness| views_agree(h) && h.running().all(|x| h.node(x).replica().serving("m").len() == all);
    assert!(h.run_until(LONG, ready), "{n} nodes did not converge (seed {seed})");
    h
}

/// `n` nodes made by `config` at `loss`, none knowing another but node 1 (every node dialled it,
/// as nodes dial a gateway); nodes 2..=n serve `llama` (even) or `qwen` (odd).
pub fn star_serving_two_models(n: u64, seed: u64, loss: f64, config: impl Fn(u64) -> Config) -> Harness {
    let mut h = Harness::new(seed);
    h.set_loss(loss);
    h.set_latency(Duration::from_millis(5));
    for i in 1..=n {
        h.add(config(i));
    }
    for i in 2..=n {
        h.connect(id(1), id(i));
    }
    for i in 2..=n {
        serve(&mut h, i, &[if i % 2 == 0 { "llama" } else { "qwen" }]);
    }
    h
}

/// Restarts node `r` of a [`federation_of`] (made by `config`) in the next generation serving
/// `other` instead of `m`, and checks that the new record replaced the old one everywhere.
/// Returns the new generation.
pub fn restart_replaces_the_old_record(h: &mut Harness, r: u64, config: impl Fn(u64) -> Config) -> u64 {
    let node = id(r);
    let old = h.node(node).local_record().generation;
    h.kill(node);
    // Runtimes start each process in a higher generation (wall-clock milliseconds at start).
    let mut c = config(r);
    c.generation = old + 1;
    h.add(c);
    h.connect(id(1), node);
    // The new incarnation serves a different model: the old one must vanish everywhere.
    serve(h, r, &["other"]);
    assert!(h.run_until(LONG, |h| agreed_state(h, node) == Some((old + 1, Lifecycle::Serve))));
    assert!(h.run_until(LONG, views_agree));
    assert!(h.run_until(LONG, |h| h.running().all(|x| h.node(x).replica().serving("other").to_vec() == [node])));
    for x in h.running() {
        assert!(!h.node(x).replica().serving("m").contains(&node), "node {x} still routes m to the old incarnation");
    }
    old + 1
}
