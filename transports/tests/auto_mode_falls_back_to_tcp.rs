//! Auto mode tries QUIC first and falls back to TCP+TLS, within a bounded time, when nothing
//! answers on UDP; forced QUIC fails there with a typed timeout.

mod common;

use common::{admitted, config, dialer, listener, within, SECRET};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};
use tela_transports::{ConnectError, Endpoint, Transport, TransportMode};

/// A UDP socket that swallows everything (a site whose firewall drops UDP) and a TCP-only
/// gateway on the same port number.
fn udp_black_hole_with_tcp_gateway() -> (UdpSocket, Endpoint, SocketAddr) {
    // The UDP port number may be taken on TCP by someone else: try a few.
    for _ in 0..16 {
        let hole = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind UDP");
        let addr = hole.local_addr().expect("addr");
        let mut c = config(SECRET);
        c.listen_quic = false;
        if let Ok(gateway) = Endpoint::listen(addr, c) {
            return (hole, gateway, addr);
        }
    }
    panic!("no port number free on both UDP and TCP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_falls_back_to_tcp_when_udp_gets_no_answer() {
    let (_hole, gateway, addr) = udp_black_hole_with_tcp_gateway();
    let node = dialer(SECRET); // falls back after 500 ms (see common::config)
    let started = Instant::now();
    let (dialled, accepted) = tokio::join!(node.connect(addr, TransportMode::Auto), admitted(&gateway));
    let conn = dialled.expect("auto mode connects over TCP");
    assert_eq!(conn.transport(), Transport::Tcp);
    assert_eq!(accepted.peer_id(), node.node_id());
    // Bounded: the fallback delay plus a TCP handshake, not the QUIC idle timeout.
    assert!(started.elapsed() < Duration::from_secs(10), "fallback took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_quic_times_out_where_udp_is_dropped() {
    let (_hole, _gateway, addr) = udp_black_hole_with_tcp_gateway();
    let mut c = config(SECRET);
    c.handshake_timeout = Duration::from_secs(1);
    let node = Endpoint::dialer(c).expect("dialer");
    let err = within("forced QUIC", node.connect(addr, TransportMode::Quic)).await.expect_err("nothing answers on UDP");
    assert!(matches!(err, ConnectError::TimedOut { transport: Transport::Quic, .. }), "{err:?}");
    assert!(err.to_string().contains("--transport tcp"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_prefers_quic_when_it_answers() {
    let gateway = listener();
    let node = dialer(SECRET);
    let addr = gateway.local_addr().expect("listening");
    let (dialled, _accepted) = tokio::join!(node.connect(addr, TransportMode::Auto), admitted(&gateway));
    assert_eq!(dialled.expect("connects").transport(), Transport::Quic);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_reports_both_failures_when_nothing_listens() {
    // Bind and release a port so that nothing listens there.
    let addr = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind").local_addr().expect("addr");
    let node = dialer(SECRET);
    let err = within("dial nothing", node.connect(addr, TransportMode::Auto)).await.expect_err("nothing listens");
    assert!(matches!(err, ConnectError::NeitherTransport { .. }), "{err:?}");
    assert!(err.is_unreachable());
}
