//! Helpers shared by the integration tests: endpoints on loopback and connected pairs over
//! each transport.

#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;
use tela_core::NodeId;
use tela_transports::{Accepted, Connection, Endpoint, EndpointConfig, Identity, JoinSecret, Transport, TransportMode};

pub const SECRET: &str = "federation secret";

/// Every transport a `Connection` can run over.
pub const ALL: [Transport; 3] = [Transport::Quic, Transport::Tcp, Transport::Memory];

pub fn loopback() -> SocketAddr {
    (Ipv4Addr::LOCALHOST, 0).into()
}

pub fn config(secret: &str) -> EndpointConfig {
    let mut c = EndpointConfig::new(
        Identity::generate().expect("generate identity"),
        JoinSecret::new(secret).expect("non-empty secret"),
    );
    c.quic_fallback_after = Duration::from_millis(500);
    c
}

pub fn listener() -> Endpoint {
    Endpoint::listen(loopback(), config(SECRET)).expect("listen on loopback")
}

pub fn dialer(secret: &str) -> Endpoint {
    Endpoint::dialer(config(secret)).expect("dialer")
}

/// Fails the test instead of hanging it.
pub async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f).await.unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// The next admitted connection on `listener`; fails on a refusal.
pub async fn admitted(listener: &Endpoint) -> Connection {
    match within("accept", listener.accept()).await {
        Some(Accepted::Admitted(c)) => c,
        other => panic!("expected an admitted connection, got {other:?}"),
    }
}

/// Two connected ends over `transport`, plus the endpoints that keep them alive.
pub struct Pair {
    pub dialler: Connection,
    pub acceptor: Connection,
    pub dialler_id: NodeId,
    pub acceptor_id: NodeId,
    pub endpoints: Vec<Endpoint>,
}

pub async fn connected(transport: Transport) -> Pair {
    let mode = match transport {
        Transport::Quic => TransportMode::Quic,
        Transport::Tcp => TransportMode::Tcp,
        Transport::Memory => {
            let (a, b) = (NodeId::from_u64(1), NodeId::from_u64(2));
            let (dialler, acceptor) = Connection::pair(a, b).await;
            return Pair { dialler, acceptor, dialler_id: a, acceptor_id: b, endpoints: Vec::new() };
        }
    };
    let gateway = listener();
    let node = dialer(SECRET);
    let addr = gateway.local_addr().expect("listening");
    let (dialled, accepted) = tokio::join!(node.connect(addr, mode), admitted(&gateway));
    let dialler = dialled.unwrap_or_else(|e| panic!("connect over {transport}: {e}"));
    assert_eq!(dialler.transport(), transport);
    assert_eq!(accepted.transport(), transport);
    Pair {
        dialler,
        acceptor: accepted,
        dialler_id: node.node_id(),
        acceptor_id: gateway.node_id(),
        endpoints: vec![gateway, node],
    }
}
