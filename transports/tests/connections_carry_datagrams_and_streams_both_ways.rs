//! One test body, run over QUIC, TCP+TLS and the in-memory pair: the same behaviour on each.

mod common;

use bytes::Bytes;
use common::{connected, within, Pair, ALL};
use std::time::Duration;
use tela_transports::{CloseReason, Connection, ConnectionError, DatagramError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends `payload` until it arrives (datagrams are unreliable by contract, though loopback
/// does not drop them) and checks it arrives intact.
async fn datagram_gets_through(from: &Connection, to: &Connection, payload: &'static [u8]) {
    within("datagram delivery", async {
        loop {
            from.send_datagram(Bytes::from_static(payload)).expect("send datagram");
            if let Ok(got) = tokio::time::timeout(Duration::from_millis(200), to.read_datagram()).await {
                assert_eq!(got.expect("read datagram"), payload);
                return;
            }
        }
    })
    .await
}

/// `opener` opens a stream and sends `request`; the other side answers `request` reversed.
async fn request_reply(opener: &Connection, answerer: &Connection, request: Vec<u8>) {
    let ask = async {
        let (mut send, mut recv) = opener.open_stream().await.expect("open stream");
        send.write_all(&request).await.expect("write request");
        send.shutdown().await.expect("finish request");
        let mut reply = Vec::new();
        recv.read_to_end(&mut reply).await.expect("read reply");
        reply
    };
    let answer = async {
        let (mut send, mut recv) = answerer.accept_stream().await.expect("accept stream");
        let mut got = Vec::new();
        recv.read_to_end(&mut got).await.expect("read request");
        got.reverse();
        send.write_all(&got).await.expect("write reply");
        send.shutdown().await.expect("finish reply");
    };
    let (reply, ()) = within("request and reply", async { tokio::join!(ask, answer) }).await;
    let mut expected = request;
    expected.reverse();
    assert_eq!(reply, expected);
}

async fn exercise(p: Pair) {
    let transport = p.dialler.transport();
    // Each side knows who the other is.
    assert_eq!(p.dialler.peer_id(), p.acceptor_id, "{transport}");
    assert_eq!(p.acceptor.peer_id(), p.dialler_id, "{transport}");

    datagram_gets_through(&p.dialler, &p.acceptor, b"gossip from the node").await;
    datagram_gets_through(&p.acceptor, &p.dialler, b"gossip from the gateway").await;

    // The acceptor (gateway) opens streams toward the dialler (outbound-only node)...
    request_reply(&p.acceptor, &p.dialler, b"GET /v1/models".to_vec()).await;
    // ...and the dialler toward the acceptor.
    request_reply(&p.dialler, &p.acceptor, b"anti-entropy buckets".to_vec()).await;

    // Many concurrent streams from the acceptor, answered concurrently.
    let opens = (0..32u8).map(|i| {
        let conn = p.acceptor.clone();
        async move {
            let (mut send, mut recv) = conn.open_stream().await.expect("open");
            send.write_all(&[i; 1000]).await.expect("write");
            send.shutdown().await.expect("finish");
            let mut back = Vec::new();
            recv.read_to_end(&mut back).await.expect("read");
            assert_eq!(back, vec![i.wrapping_add(1); 1000]);
        }
    });
    let answers = (0..32).map(|_| {
        let conn = p.dialler.clone();
        async move {
            let (mut send, mut recv) = conn.accept_stream().await.expect("accept");
            let mut got = Vec::new();
            recv.read_to_end(&mut got).await.expect("read");
            let back: Vec<u8> = got.iter().map(|b| b.wrapping_add(1)).collect();
            send.write_all(&back).await.expect("write");
            send.shutdown().await.expect("finish");
        }
    });
    within("32 concurrent streams", async {
        tokio::join!(futures::future::join_all(opens), futures::future::join_all(answers))
    })
    .await;

    // Closing carries the reason to the peer and fails further use on both sides.
    p.dialler.close("walltime reached");
    assert_eq!(
        within("peer sees the close", p.acceptor.closed()).await,
        CloseReason::Peer { reason: "walltime reached".into() },
        "{transport}"
    );
    assert_eq!(p.dialler.close_reason(), Some(CloseReason::Local { reason: "walltime reached".into() }));
    assert!(matches!(p.dialler.send_datagram(Bytes::from_static(b"late")), Err(DatagramError::Closed(_))));
    assert!(matches!(within("open after close", p.acceptor.open_stream()).await, Err(ConnectionError::Closed(_))));
    assert!(matches!(within("read after close", p.acceptor.read_datagram()).await, Err(ConnectionError::Closed(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transport_carries_datagrams_and_streams_both_ways() {
    for transport in ALL {
        exercise(connected(transport).await).await;
    }
}
