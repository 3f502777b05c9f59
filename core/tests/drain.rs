//! A draining node is seen DOWN at once by everyone, finishes its in-flight requests, is seen
//! LEFT, then stops its engine and exits.

mod common;
use common::*;
use std::time::Duration;
use tela_core::{Command, Input, Lifecycle, Load};

#[test]
fn drained_node_is_seen_down_then_left_by_everyone() {
    let mut h = federation(12, 1);
    let d = id(7);
    h.input(d, Input::Load(Load { in_flight: 3, queued: 0 }));
    h.input(d, Input::DrainRequested);
    assert_eq!(h.node(d).local_record().state, Lifecycle::Down);
    // Everyone learns DOWN and stops routing there, well before the drain window ends.
    assert!(h.run_until(Duration::from_secs(10), |h| agreed_state(h, d).is_some_and(|(_, s)| s == Lifecycle::Down)));
    assert!(h.running().filter(|x| *x != d).all(|x| !h.node(x).replica().serving("m").contains(&d)));
    // In-flight requests keep it DOWN, not LEFT.
    h.run_for(Duration::from_secs(5));
    assert_eq!(h.node(d).local_record().state, Lifecycle::Down);
    assert!(h.member(d).commands.is_empty());
    // The last request finishes: LEFT, engine stopped, exit after spreading the news.
    h.input(d, Input::Load(Load::default()));
    assert_eq!(h.node(d).local_record().state, Lifecycle::Left);
    assert_eq!(h.member(d).commands, vec![Command::StopEngine]);
    assert!(h.run_until(Duration::from_secs(5), |h| h.node(d).has_exited()));
    assert_eq!(h.member(d).commands, vec![Command::StopEngine, Command::Exit]);
    assert!(
        h.run_until(Duration::from_secs(10), |h| agreed_state(h, d).is_some_and(|(_, s)| s == Lifecycle::Left)),
        "LEFT did not reach everyone"
    );
}

#[test]
fn walltime_starts_the_drain_one_window_early_and_the_deadline_ends_it() {
    let mut h = federation(5, 2);
    let d = id(3);
    let mut c = public(3);
    c.drain_window = Duration::from_secs(20);
    // Restart node 3 with a 20 s drain window and a walltime 60 s from now.
    h.add(c);
    serve(&mut h, 3, &["m"]);
    let end = h.now() + Duration::from_secs(60);
    h.input(d, Input::Walltime(end));
    h.input(d, Input::Load(Load { in_flight: 1, queued: 0 }));
    h.run_for(Duration::from_secs(39));
    assert_eq!(h.node(d).local_record().state, Lifecycle::Serve, "drain started early");
    h.run_for(Duration::from_secs(2));
    assert_eq!(h.node(d).local_record().state, Lifecycle::Down, "drain did not start at walltime - window");
    // The stuck request never finishes: the deadline (the walltime) forces LEFT.
    assert!(h.run_until(Duration::from_secs(30), |h| h.node(d).local_record().state == Lifecycle::Left));
    let left_at = h.now();
    assert!(left_at >= end && left_at <= end + Duration::from_millis(1), "left at {left_at}, walltime {end}");
}

#[test]
fn a_walltime_already_inside_the_window_drains_at_once() {
    let mut h = federation(3, 3);
    let d = id(2);
    let end = h.now() + Duration::from_secs(60); // default window is 15 minutes
    h.input(d, Input::Walltime(end));
    // Nothing in flight: straight to LEFT.
    assert_eq!(h.node(d).local_record().state, Lifecycle::Left);
}

#[test]
fn engine_failure_turns_the_node_down_and_recovery_starts_a_new_generation() {
    let mut h = federation(6, 4);
    let d = id(4);
    let g0 = h.node(d).local_record().generation;
    h.input(d, Input::EngineFailed);
    assert!(h.run_until(LONG, |h| agreed_state(h, d) == Some((g0, Lifecycle::Down))));
    // Not draining: DOWN is not LEFT, and no command is issued.
    assert!(h.member(d).commands.is_empty());
    serve(&mut h, 4, &["m"]);
    let g1 = h.node(d).local_record().generation;
    assert!(g1 > g0);
    assert!(h.run_until(LONG, |h| agreed_state(h, d) == Some((g1, Lifecycle::Serve))));
    assert!(h.run_until(Duration::from_secs(2), |h| h.running().all(|x| h
        .node(x)
        .replica()
        .serving("m")
        .contains(&d))));
}
