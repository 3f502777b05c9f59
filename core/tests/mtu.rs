//! The harness fails any test in which a node sends a datagram over the MTU.

mod common;
use common::*;
use std::time::Duration;
use tela_core::harness::Harness;

#[test]
#[should_panic(expected = "over the 300-byte MTU")]
fn an_oversized_datagram_fails_the_run() {
    // Nodes build datagrams up to 1,100 bytes; a 300-byte link must trip the check as soon as
    // gossip and anti-entropy grow past it. (`membership.rs` checks that nodes configured for a
    // small MTU stay under it.)
    let mut h = Harness::new(1);
    h.set_mtu(300);
    for i in 1..=40 {
        h.add(public(i));
        if i > 1 {
            h.connect(id(1), id(i));
        }
    }
    h.run_for(Duration::from_secs(30));
}
