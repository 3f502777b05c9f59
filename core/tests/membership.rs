//! The membership protocol: replicas converge under loss, a crashed node is confirmed DOWN
//! everywhere, a falsely suspected node refutes, restarts and drains spread, and an idle
//! federation costs little more than its probes.

mod common;
use common::*;
use std::time::Duration;
use tela_core::harness::wire::{encode_unbounded, Message, Piggyback};
use tela_core::harness::Harness;
use tela_core::{Input, Lifecycle, Load, NodeId, SwimConfig};

fn converge(n: u64, seed: u64, loss: f64) {
    let mut h = star_serving_two_models(n, seed, loss, public);
    let started = h.now();
    let ok = h.run_until(LONG, |h| {
        views_agree(h)
            && h.running().all(|x| {
                let r = h.node(x).replica();
                r.len() == n as usize && r.serving("llama").len() + r.serving("qwen").len() == n as usize - 1
            })
    });
    assert!(ok, "{n} nodes at {loss} loss did not converge within {LONG:?} (seed {seed})");
    eprintln!("{n} nodes, seed {seed}: converged in {:?}", h.now() - started);
    // Nobody was taken for dead on the way.
    for x in h.running() {
        assert_eq!(h.node(x).stats().confirmed_down, 0, "node {x} confirmed a live node dead (seed {seed})");
    }
}

#[test]
fn three_nodes_converge_under_5_percent_loss() {
    for seed in 0..5 {
        converge(3, seed, 0.05);
    }
}

#[test]
fn ten_nodes_converge_under_5_percent_loss() {
    for seed in 0..3 {
        converge(10, seed, 0.05);
    }
}

#[test]
fn fifty_nodes_converge_under_5_percent_loss() {
    converge(50, 11, 0.05);
}

#[test]
fn a_node_joining_a_formed_federation_pulls_the_registry_by_anti_entropy() {
    // 100 nodes agree; a new outbound-only node dials node 1 and, from that one connection,
    // pulls every record in bucket exchanges that follow each other while they find
    // differences, long before the 10 s anti-entropy interval would come round again.
    const N: u64 = 100;
    let mut h = star_serving_two_models(N, 3, 0.01, public);
    assert!(h.run_until(LONG, views_agree), "the federation did not form");
    let joined = h.now();
    let late = tela_core::NodeId::from_u64(N + 1);
    h.add(tela_core::Config::new(late, 1));
    h.connect(late, id(1));
    let ok = h.run_until(Duration::from_secs(8), |h| h.node(late).replica().len() == N as usize + 1);
    assert!(ok, "the new node holds {} of {} records", h.node(late).replica().len(), N + 1);
    eprintln!("a node joining {N} pulled the registry in {:?}", h.now() - joined);
    assert!(h.run_until(LONG, views_agree), "the new node's record did not spread");
}

#[test]
fn a_crashed_node_is_confirmed_down_by_everyone_within_the_bound() {
    const N: u64 = 10;
    let detector = SwimConfig::default();
    // One pass of probes for a first prober to reach it, the longest suspicion, and a few periods
    // for DOWN to spread.
    let (_, longest) = detector.suspicion_bounds(N as usize);
    let bound = detector.protocol_period * (N as u32 - 1) + longest + detector.protocol_period * 10;
    for seed in [1u64, 2, 3] {
        let mut h = federation_of(N, seed, public);
        let victim = id(2 + seed % (N - 1));
        let g = h.node(victim).local_record().generation;
        h.kill(victim);
        let killed_at = h.now();
        let down = |h: &Harness| agreed_state(h, victim) == Some((g, Lifecycle::Down));
        assert!(h.run_until(bound, down), "seed {seed}: {victim} not DOWN everywhere within {bound:?}");
        let took = h.now() - killed_at;
        eprintln!("seed {seed}: {victim} confirmed DOWN by all {} others in {took:?} (bound {bound:?})", N - 1);
        assert!(h.running().all(|x| !h.node(x).replica().serving("m").contains(&victim)));
        // Only the victim was confirmed dead.
        assert!(h.running().all(|x| h.node(x).stats().new_generations == 0), "seed {seed}: a live node was confirmed");
    }
}

#[test]
fn a_falsely_suspected_node_refutes_and_is_never_marked_down() {
    let mut h = federation_of(12, 6, public);
    let victim = id(3);
    let own = h.node(victim).local_record().clone();
    // Node 8 claims that node 3 is suspect at its current heartbeat.
    let rumor =
        Piggyback::Suspect { id: victim, generation: own.generation, heartbeat: own.heartbeat, from: id(8), age: 0 };
    let payload = encode_unbounded(&Message::Gossip(vec![rumor]));
    for x in [id(1), id(2), victim] {
        h.input(x, Input::Datagram { from: id(8), payload: payload.clone().into() });
    }
    assert!(h.node(id(1)).suspects(&victim));
    assert_eq!(h.node(victim).stats().suspicions_refuted, 1);
    assert!(h.node(victim).local_record().heartbeat > own.heartbeat);
    // The refutation lifts the suspicion, and a long lossy run confirms nobody.
    assert!(h.run_until(Duration::from_secs(10), |h| h.running().all(|x| !h.node(x).suspects(&victim))));
    h.run_for(Duration::from_secs(600));
    for x in h.running() {
        let s = h.node(x).stats();
        assert_eq!((s.confirmed_down, s.new_generations), (0, 0), "node {x}: {s:?}");
        assert_eq!(h.node(x).replica().serving("m").len(), 11, "node {x} lost a serving node");
    }
    assert_eq!(agreed_state(&h, victim), Some((own.generation, Lifecycle::Serve)));
    let raised: u64 = h.running().map(|x| h.node(x).stats().suspicions_raised).sum();
    let refuted: u64 = h.running().map(|x| h.node(x).stats().suspicions_refuted).sum();
    eprintln!("600 s at 5% loss: {raised} suspicions raised, {refuted} refuted, none confirmed");
}

#[test]
fn restarted_node_replaces_its_old_record_everywhere() {
    let mut h = federation_of(10, 5, public);
    let r = id(6);
    let generation = restart_replaces_the_old_record(&mut h, 6, public);
    // The new process is probed as the new generation, and nobody confirms it dead.
    h.run_for(Duration::from_secs(60));
    assert_eq!(agreed_state(&h, r), Some((generation, Lifecycle::Serve)));
}

#[test]
fn drained_node_is_seen_down_then_left_by_everyone() {
    let mut h = federation_of(12, 1, public);
    let d = id(7);
    h.input(d, Input::Load(Load { in_flight: 3, queued: 0 }));
    h.input(d, Input::DrainRequested);
    assert!(h.run_until(Duration::from_secs(10), |h| agreed_state(h, d).is_some_and(|(_, s)| s == Lifecycle::Down)));
    assert!(h.running().filter(|x| *x != d).all(|x| !h.node(x).replica().serving("m").contains(&d)));
    h.input(d, Input::Load(Load::default()));
    assert_eq!(h.node(d).local_record().state, Lifecycle::Left);
    assert!(h.run_until(Duration::from_secs(5), |h| h.node(d).has_exited()));
    assert!(
        h.run_until(Duration::from_secs(10), |h| agreed_state(h, d).is_some_and(|(_, s)| s == Lifecycle::Left)),
        "LEFT did not reach everyone"
    );
}

#[test]
fn tombstones_are_deleted_everywhere_after_their_lifetime_and_stay_deleted() {
    let ttl = Duration::from_secs(120);
    let with_ttl = |n: u64| {
        let mut c = public(n);
        c.membership.tombstone_ttl = ttl;
        c
    };
    let mut h = federation_of(12, 4, with_ttl);
    let d = id(7);
    h.input(d, Input::DrainRequested);
    assert!(h.run_until(Duration::from_secs(10), |h| agreed_state(h, d).is_some_and(|(_, s)| s == Lifecycle::Left)));
    let tombstone = h.node(id(2)).replica().get(&d).map(|s| (**s.record()).clone()).expect("held");
    // Half-way through its lifetime everyone still holds it; after the lifetime and a round of
    // anti-entropy, nobody does, and exchanges do not bring it back.
    h.run_for(ttl / 2);
    assert!(h.running().all(|x| h.node(x).replica().get(&d).is_some()));
    h.run_for(ttl / 2 + Duration::from_secs(15));
    assert!(h.running().all(|x| h.node(x).replica().get(&d).is_none()), "a tombstone outlived its lifetime");
    h.run_for(Duration::from_secs(30));
    assert!(h.running().all(|x| h.node(x).replica().get(&d).is_none()), "a deleted tombstone came back");
    // A stale peer replaying it is refused by the watermark.
    let payload = bytes::Bytes::from(encode_unbounded(&Message::Records(vec![tombstone])));
    h.input(id(3), Input::Datagram { from: id(2), payload });
    assert!(h.node(id(3)).replica().get(&d).is_none());
    assert_eq!(h.node(id(3)).replica().resurrections_refused(), 1);
    assert!(views_agree(&h));
}

#[test]
fn a_node_held_down_for_the_tombstone_lifetime_is_forgotten_everywhere() {
    let ttl = Duration::from_secs(120);
    let mut h = federation_of(12, 4, |n| {
        let mut c = public(n);
        c.membership.tombstone_ttl = ttl;
        c
    });
    let d = id(9);
    h.kill(d);
    assert!(h.run_until(LONG, |h| agreed_state(h, d).is_some_and(|(_, s)| s == Lifecycle::Down)));
    h.run_for(ttl / 2);
    assert!(h.running().all(|x| h.node(x).replica().get(&d).is_some()), "reaped before its lifetime");
    h.run_for(ttl / 2 + Duration::from_secs(15));
    assert!(h.running().all(|x| h.node(x).replica().get(&d).is_none()), "a DOWN record outlived its lifetime");
    h.run_for(Duration::from_secs(30));
    assert!(h.running().all(|x| h.node(x).replica().get(&d).is_none()), "a reaped DOWN record came back");
    assert!(views_agree(&h));
}

#[test]
fn sides_that_confirmed_each_other_down_talk_again_after_the_heal() {
    // Connections survive the cut (the harness never closes them), as they do in a partition
    // shorter than the transport's idle timeout. Peers are picked among the living, so it is
    // the exchanges with members held DOWN that bring the sides back together.
    for seed in [21u64, 22, 23] {
        let mut h = federation_of(12, seed, public);
        let (a, b): (Vec<NodeId>, Vec<NodeId>) = (1..=12).map(id).partition(|x| x.short() <= 6);
        for &x in &a {
            for &y in &b {
                h.cut(x, y);
            }
        }
        let holds_down = |h: &Harness, from: &[NodeId], of: &[NodeId]| {
            from.iter().all(|&x| {
                of.iter().all(|y| h.node(x).replica().get(y).is_some_and(|s| s.record().state == Lifecycle::Down))
            })
        };
        let split = h.run_until(Duration::from_secs(120), |h| holds_down(h, &a, &b) && holds_down(h, &b, &a));
        assert!(split, "seed {seed}: the sides did not confirm each other DOWN");
        h.heal();
        let healed = h.run_until(Duration::from_secs(40), |h| {
            views_agree(h)
                && h.running().all(|x| {
                    h.running().all(|y| h.node(x).replica().get(&y).is_some_and(|s| s.record().state < Lifecycle::Down))
                })
        });
        assert!(healed, "seed {seed}: the sides never found each other again after the heal");
    }
}

/// Two gateways anchoring `n - 2` outbound-only serving nodes, at 5% loss.
fn anchored(n: u64, seed: u64) -> Harness {
    let mut h = Harness::new(seed);
    h.set_loss(0.05);
    h.add(gateway(1));
    h.add(gateway(2));
    h.connect(id(1), id(2));
    for i in 3..=n {
        h.add(outbound(i));
        h.connect(id(1), id(i));
        h.connect(id(2), id(i));
        serve(&mut h, i, &["m"]);
    }
    h
}

#[test]
fn outbound_only_nodes_hear_and_refute_suspicions_through_their_anchors() {
    // Outbound-only nodes hear only from their gateways, so the epidemic alone can miss them;
    // suspecters tell suspects directly, and peers answer stale suspicions with the refutation.
    for seed in [7u64, 12, 13, 18, 19] {
        let mut h = anchored(30, seed);
        h.run_for(Duration::from_secs(600));
        let confirmed: Vec<_> = h.running().filter(|x| h.node(*x).stats().confirmed_down > 0).collect();
        assert!(confirmed.is_empty(), "seed {seed}: {confirmed:?} confirmed a live node dead");
        assert!(h.running().all(|x| h.node(x).stats().new_generations == 0), "seed {seed}");
    }
}

#[test]
fn outbound_only_nodes_repair_their_replicas_more_often() {
    // Their pulls are answered only from what peers still have queued, so what they miss waits
    // for an anti-entropy exchange: they run one every 2 s, public nodes every 10 s.
    let mut h = anchored(12, 4);
    assert!(h.run_until(2 * LONG, views_agree), "views differ");
    let started = |h: &Harness| h.running().map(|x| (x, h.node(x).stats().syncs_started)).collect::<Vec<_>>();
    let before = started(&h);
    h.run_for(Duration::from_secs(60));
    for ((x, b), (_, a)) in before.iter().zip(started(&h)) {
        let n = a - b;
        eprintln!("{x}: {n} exchanges in 60 s");
        if [id(1), id(2)].contains(x) {
            assert!((4..=12).contains(&n), "gateway {x} started {n} exchanges in 60 s, expected ~6");
        } else {
            assert!((25..=40).contains(&n), "outbound-only {x} started {n} exchanges in 60 s, expected ~30");
        }
    }
    assert!(views_agree(&h));
}

#[test]
fn outbound_only_nodes_are_vouched_for_and_a_lost_connection_is_suspected() {
    let mut h = anchored(20, 5);
    let all =
        |h: &Harness| views_agree(h) && [id(1), id(2)].iter().all(|g| h.node(*g).replica().serving("m").len() == 18);
    // Signed records (~130 bytes) ride fewer to a datagram than unsigned ones did, so with some
    // seeds the last outbound-only node completes its view only at the second anti-entropy round.
    assert!(h.run_until(2 * LONG, all), "views differ");
    // Node 9's job dies: both gateways see its connections drop.
    let victim = id(9);
    let g = h.node(victim).local_record().generation;
    h.kill(victim);
    h.input(id(1), Input::PeerDisconnected(victim));
    h.input(id(2), Input::PeerDisconnected(victim));
    let down = |h: &Harness| agreed_state(h, victim) == Some((g, Lifecycle::Down));
    assert!(h.run_until(LONG, down), "the lost outbound-only node was not marked DOWN everywhere");
    // A connection still held keeps it from being suspected: the rest stay up.
    h.run_for(Duration::from_secs(120));
    for x in h.running() {
        assert_eq!(h.node(x).stats().new_generations, 0, "node {x} was confirmed dead while connected");
    }
}

#[test]
fn anchors_do_not_suspect_an_outbound_only_node_silent_for_less_than_a_lease() {
    // Few helpers can reach an outbound-only node, so a probe of it that lost a datagram would
    // turn into a suspicion at once. Its anchors watch it by their leases instead (pinging it
    // every half second once it has been quiet for one, suspecting it after 3 s of silence):
    // cut off from both for less than that, it is never suspected; for longer, it is.
    let member = id(3);
    let anchors = [id(1), id(2)];
    let suspected = |h: &Harness| anchors.iter().any(|a| h.node(*a).suspects(&member));
    for seed in 1..=5u64 {
        let mut h = anchored(3, seed);
        h.set_loss(0.0);
        assert!(h.run_until(LONG, views_agree), "seed {seed}: views differ");
        h.run_for(Duration::from_secs(10));
        for a in anchors {
            h.cut(a, member);
        }
        assert!(!h.run_until(Duration::from_millis(1800), suspected), "seed {seed}: suspected within 1.8 s");
        h.heal();
        assert!(!h.run_until(Duration::from_secs(10), suspected), "seed {seed}: suspected after the heal");
        for a in anchors {
            h.cut(a, member);
        }
        assert!(h.run_until(Duration::from_secs(5), suspected), "seed {seed}: not suspected in 5 s of silence");
        h.heal();
        h.run_for(Duration::from_secs(20));
        assert!(h.running().all(|x| h.node(x).stats().confirmed_down == 0), "seed {seed}: confirmed dead");
    }
}

#[test]
fn an_idle_federation_costs_only_its_probes() {
    const N: u64 = 20;
    let mut h = federation_of(N, 8, public);
    // Let the start-up news run out of transmissions.
    h.run_for(Duration::from_secs(30));
    let before: Vec<u64> = h.running().map(|x| h.node(x).stats().bytes_out).collect();
    let window = Duration::from_secs(120);
    h.run_for(window);
    let after: Vec<u64> = h.running().map(|x| h.node(x).stats().bytes_out).collect();
    let worst = before.iter().zip(&after).map(|(b, a)| a - b).max().unwrap_or(0) as f64 / window.as_secs_f64();
    let mean = before.iter().zip(&after).map(|(b, a)| a - b).sum::<u64>() as f64 / N as f64 / window.as_secs_f64();
    eprintln!("idle, {N} nodes at 5% loss: {mean:.0} B/s per node on average, {worst:.0} B/s at most");
    assert!(worst <= 2048.0, "idle cost {worst:.0} B/s exceeds the 2 KB/s target");
    for x in h.running() {
        let (records, suspicions) = h.node(x).swim_queued();
        assert!(records + suspicions <= 2, "node {x} still has {records} records and {suspicions} suspicions queued");
    }
}

#[test]
fn nodes_configured_for_a_small_mtu_stay_under_it() {
    // The harness fails the run on any datagram over its MTU: probes, piggybacks, gossip,
    // corrections and anti-entropy must all respect `max_datagram`.
    let mut h = Harness::new(1);
    h.set_mtu(300);
    h.set_loss(0.05);
    for i in 1..=40 {
        let mut c = public(i);
        c.max_datagram = 300;
        h.add(c);
        if i > 1 {
            h.connect(id(1), id(i));
            serve(&mut h, i, &["m"]);
        }
    }
    assert!(h.run_until(LONG, views_agree));
    h.kill(id(17));
    h.run_for(Duration::from_secs(60));
    assert!(h.running().all(|x| h.node(x).replica().get(&id(17)).is_some_and(|s| s.record().state == Lifecycle::Down)));
}
