//! The same federation with the TCP+TLS fallback forced (`--transport tcp`), as at sites that
//! block UDP.

use crate::procs;

#[test]
fn three_nodes_and_an_anchor_agree_on_the_registry_over_tcp() {
    procs::federation_agrees("tcp", tela_transports::Transport::Tcp);
}
