//! Nothing outlives its owner: after connections are closed and endpoints dropped, every task
//! this crate spawned (drivers, control streams, accept loops, handshakes) has ended.

mod common;

use common::{connected, ALL};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

async fn alive_tasks_settle_at(expected: usize) -> usize {
    let metrics = tokio::runtime::Handle::current().metrics();
    for _ in 0..200 {
        if metrics.num_alive_tasks() == expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    metrics.num_alive_tasks()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_and_dropping_ends_every_spawned_task() {
    for transport in ALL {
        let p = connected(transport).await;
        // Leave a stream open in each direction and a datagram in flight.
        let (mut s, _r) = p.acceptor.open_stream().await.expect("open");
        s.write_all(b"x").await.expect("write");
        let _ = p.dialler.send_datagram(bytes::Bytes::from_static(b"gossip"));
        p.dialler.close("shutting down");
        let _ = p.acceptor.closed().await;
        drop((s, _r, p));
        assert_eq!(alive_tasks_settle_at(0).await, 0, "{transport}: tasks leaked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_every_handle_closes_the_connection_for_the_peer() {
    for transport in ALL {
        let p = connected(transport).await;
        let acceptor = p.acceptor.clone();
        let common::Pair { dialler, endpoints, .. } = p;
        drop(dialler);
        let reason = common::within("peer notices", acceptor.closed()).await;
        assert!(!matches!(reason, tela_transports::CloseReason::Local { .. }), "{transport}: {reason:?}");
        drop(endpoints);
    }
}
