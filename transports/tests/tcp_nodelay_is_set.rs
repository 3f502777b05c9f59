//! TCP_NODELAY is on for both ends of every TCP connection (tunnelled token streams must not
//! wait for Nagle's algorithm).

mod common;

use common::connected;
use tela_transports::Transport;

#[tokio::test]
async fn both_ends_of_a_tcp_connection_have_nodelay() {
    let p = connected(Transport::Tcp).await;
    assert_eq!(p.dialler.tcp_nodelay(), Some(true));
    assert_eq!(p.acceptor.tcp_nodelay(), Some(true));

    let q = connected(Transport::Quic).await;
    assert_eq!(q.dialler.tcp_nodelay(), None, "QUIC has no TCP socket");
}
