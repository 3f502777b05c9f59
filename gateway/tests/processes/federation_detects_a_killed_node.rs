//! An anchor and three `tela node` processes over real QUIC on loopback: a node killed without a
//! word (SIGKILL, so it never drains) is taken out of routing by SWIM's failure detector and
//! confirmed DOWN, while the survivors keep serving and their replicas agree on the news.
//! (`killed_nodes_are_avoided_at_once` checks the gateway's own, faster reaction to a dropped
//! tunnel; this checks the membership's verdict, which every member acts on.)

use crate::procs;

use nix::sys::signal::Signal;
use procs::*;
use std::time::{Duration, Instant};
use tela_core::Lifecycle;

#[test]
fn a_node_killed_without_a_word_is_suspected_then_confirmed_down() {
    // Above the sum of the steps' own limits (110 s), so that a slow step fails with its name.
    run_test(Duration::from_secs(150), async {
        let dir = tempfile::tempdir().expect("tempdir");
        let anchor = anchor().await;
        let (procs, nodes) = three_nodes(&anchor, dir.path(), &[]);
        until(&anchor, "all three nodes routable at the anchor", Duration::from_secs(30), |s| {
            nodes.iter().all(|(id, _)| routable(s, id))
        })
        .await;

        // Kill node0 (procs: engine0, node0, engine1, node1, ...) without a chance to drain.
        let (victim, _) = &nodes[0];
        let killed = Instant::now();
        procs[1].signal(Signal::SIGKILL);
        until(&anchor, "the killed node unroutable at the anchor", Duration::from_secs(15), |s| !routable(s, victim))
            .await;
        eprintln!("killed node unroutable at the anchor after {:?}", killed.elapsed());
        until(&anchor, "the killed node confirmed DOWN at the anchor", Duration::from_secs(30), |s| {
            s.record(victim).is_some_and(|(r, _)| r.state >= Lifecycle::Down)
        })
        .await;
        eprintln!("killed node DOWN at the anchor after {:?}", killed.elapsed());
        // The survivors keep serving and learn the news too.
        let survivors = &nodes[1..];
        until(&anchor, "the survivors still routable", Duration::from_secs(5), |s| {
            survivors.iter().all(|(id, _)| routable(s, id))
        })
        .await;
        replicas_agree(&anchor, survivors, 4).await;
        drop(procs);
    });
}
