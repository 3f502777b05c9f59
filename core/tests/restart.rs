//! A restarted node's new generation replaces the old record everywhere, and a node refutes
//! a false DOWN by moving to a new generation.

mod common;
use common::*;
use tela_core::harness::wire::{encode_unbounded, Message};
use tela_core::{Identity, Input, Lifecycle};

#[test]
fn restarted_node_replaces_its_old_record_everywhere() {
    let mut h = federation(10, 5);
    restart_replaces_the_old_record(&mut h, 6, public);
}

#[test]
fn restart_with_a_stale_generation_moves_past_the_old_record() {
    // The clock went backwards (or nothing was persisted): the new process starts in a
    // generation below the one the federation remembers, and must climb above it by itself.
    let mut h = federation(10, 7);
    let r = id(6);
    let old = h.node(r).local_record().generation;
    h.kill(r);
    let mut c = public(6);
    c.generation = old - 50;
    h.add(c);
    h.connect(id(1), r);
    serve(&mut h, 6, &["m"]);
    assert!(h.run_until(LONG, |h| agreed_state(h, r).is_some_and(|(g, s)| g > old && s == Lifecycle::Serve)));
    assert!(h.node(r).stats().new_generations >= 1);
}

#[test]
fn a_false_down_is_refuted_with_a_new_generation() {
    let mut h = federation(8, 6);
    let victim = id(3);
    let record = (**h.node(victim).local_record()).clone();
    let forged = record.with_down_mark(Identity::for_test(id(8)).mark_down(&record));
    let forged_gen = forged.generation;
    // A peer (node 8) claims, with a DOWN mark it signed, that node 3 is DOWN in its current
    // generation.
    let payload = encode_unbounded(&Message::Records(vec![forged.clone()]));
    for x in [id(1), id(2), victim] {
        h.input(x, Input::Datagram { from: id(8), payload: payload.clone().into() });
    }
    assert_eq!(h.node(id(1)).replica().get(&victim).unwrap().record().state, Lifecycle::Down);
    // The victim refutes; everyone ends up routing to it again, in a newer generation.
    assert!(h.node(victim).local_record().generation > forged_gen);
    assert!(
        h.run_until(LONG, |h| agreed_state(h, victim).is_some_and(|(g, s)| g > forged_gen && s == Lifecycle::Serve))
    );
    assert!(h.run_until(LONG, |h| h.running().filter(|x| *x != victim).all(|x| h
        .node(x)
        .replica()
        .serving("m")
        .contains(&victim))));
}

#[test]
fn a_down_without_a_signed_mark_is_refused_and_forces_no_new_generation() {
    let mut h = federation(8, 6);
    let victim = id(3);
    let mut forged = (**h.node(victim).local_record()).clone();
    forged.state = Lifecycle::Down;
    let generation = forged.generation;
    let payload = encode_unbounded(&Message::Records(vec![forged]));
    for x in [id(1), victim] {
        h.input(x, Input::Datagram { from: id(8), payload: payload.clone().into() });
    }
    assert_eq!(h.node(id(1)).replica().get(&victim).unwrap().record().state, Lifecycle::Serve);
    assert_eq!(h.node(id(1)).stats().records_forged, 1);
    assert_eq!(h.node(victim).stats().records_forged, 1);
    assert_eq!(h.node(victim).local_record().generation, generation, "a forgery must not cost a generation");
}
