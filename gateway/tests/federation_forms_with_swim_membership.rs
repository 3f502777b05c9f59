//! An anchor and three `tela node` processes run the SWIM membership (`--membership swim`) over
//! real QUIC on loopback: they form the federation and agree on the registry, and a node killed
//! without a word (SIGKILL) is taken out of routing by the failure detector and confirmed DOWN.

mod procs;

use nix::sys::signal::Signal;
use procs::*;
use std::time::{Duration, Instant};
use tela_core::Lifecycle;
use tela_runtime::Membership;

#[test]
fn a_swim_federation_forms_and_detects_a_killed_node() {
    // Above the sum of the steps' own limits (140 s), so that a slow step fails with its name.
    run_test(Duration::from_secs(180), async {
        let dir = tempfile::tempdir().expect("tempdir");
        let anchor = anchor_with(Membership::Swim).await;
        let (procs, nodes) = three_nodes(&anchor, dir.path(), &["--membership", "swim"]);
        until(&anchor, "all three nodes routable at the anchor", Duration::from_secs(30), |s| {
            nodes.iter().all(|(id, _)| routable(s, id))
        })
        .await;
        replicas_agree(&anchor, &nodes, 4).await;

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
