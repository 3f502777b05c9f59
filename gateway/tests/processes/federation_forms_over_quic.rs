//! Three `tela node` processes and an anchor form a federation over real QUIC on loopback and
//! agree on the registry.

use crate::procs;

#[test]
fn three_nodes_and_an_anchor_agree_on_the_registry_over_quic() {
    procs::federation_agrees("quic", tela_transports::Transport::Quic);
}
