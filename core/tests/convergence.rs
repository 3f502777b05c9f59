//! Replicas converge: once changes stop they are equal record for record, outbound-only nodes
//! converge through their gateways, and a silently killed node stops being routed to
//! everywhere. (Convergence under loss at 3 to 50 nodes is in `membership.rs`.)

mod common;
use common::*;
use std::time::Duration;
use tela_core::harness::Harness;

#[test]
fn replicas_become_identical_once_heartbeats_pause() {
    // With heartbeats far apart the records stop moving, so replicas must be equal record for
    // record, heartbeat and load included.
    let mut h = Harness::new(3);
    h.set_loss(0.05);
    for i in 1..=20 {
        h.add(public(i));
    }
    for i in 2..=20 {
        h.connect(id(1), id(i));
        serve(&mut h, i, &["m"]);
    }
    let identical = |h: &Harness| {
        let first = h.node(id(1)).replica().sorted_records();
        first.len() == 20 && h.running().all(|n| h.node(n).replica().sorted_records() == first)
    };
    assert!(h.run_until(LONG, identical), "replicas differ after {LONG:?}");
}

#[test]
fn outbound_only_nodes_converge_through_gateways() {
    let mut h = Harness::new(5);
    h.set_loss(0.05);
    h.add(gateway(1));
    h.add(gateway(2));
    h.connect(id(1), id(2));
    for i in 3..=30 {
        h.add(outbound(i));
        h.connect(id(1), id(i));
        h.connect(id(2), id(i));
        serve(&mut h, i, &["m"]);
    }
    assert!(h.run_until(LONG, views_agree), "views differ");
    h.run_for(Duration::from_secs(2));
    for g in [id(1), id(2)] {
        assert_eq!(h.node(g).replica().serving("m").len(), 28, "gateway {g} must route to all 28 nodes");
    }
}

#[test]
fn a_silently_killed_node_becomes_unroutable_everywhere() {
    let mut h = Harness::new(9);
    for i in 1..=10 {
        h.add(public(i));
    }
    for i in 2..=10 {
        h.connect(id(1), id(i));
        serve(&mut h, i, &["m"]);
    }
    assert!(h.run_until(LONG, |h| h.running().all(|x| h.node(x).replica().serving("m").len() == 9)));
    h.kill(id(5));
    let killed_at = h.now();
    let gone = |h: &Harness| h.running().all(|x| !h.node(x).replica().serving("m").contains(&id(5)));
    assert!(h.run_until(LONG, gone), "node 5 still routable somewhere");
    let took = h.now() - killed_at;
    // A failed probe and the gossip of the suspicion: well inside the suspicion timeout.
    let bound = Duration::from_secs(5);
    assert!(took <= bound, "took {took:?} to stop routing to a dead node (bound {bound:?})");
}
