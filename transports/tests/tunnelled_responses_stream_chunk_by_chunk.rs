//! A tunnelled request: the gateway opens a stream toward the node, sends the request head
//! and body; the node answers with a response head and body chunks that reach the gateway one
//! by one, as they are written — never held back until the response ends.

mod common;

use common::{connected, within, ALL};
use tela_transports::tunnel::{
    read_request_head, read_response_head, write_request_head, write_response_head, RequestHead, ResponseHead,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_stream_through_the_tunnel_chunk_by_chunk() {
    for transport in ALL {
        let p = connected(transport).await;
        let request = RequestHead {
            method: "POST".into(),
            path_and_query: "/v1/chat/completions".into(),
            headers: vec![("content-type".into(), b"application/json".to_vec())],
        };
        let body = br#"{"model":"m","stream":true}"#;
        let (first_seen_tx, first_seen_rx) = oneshot::channel::<()>();

        let gateway = async {
            let (mut send, mut recv) = p.acceptor.open_stream().await.expect("open");
            write_request_head(&mut send, &request).await.expect("head");
            send.write_all(body).await.expect("body");
            send.shutdown().await.expect("finish");
            let head = read_response_head(&mut recv).await.expect("response head");
            assert_eq!(head.status, 200);
            let first = b"data: first token\n\n";
            let mut got = vec![0u8; first.len()];
            recv.read_exact(&mut got).await.expect("first chunk");
            assert_eq!(&got, first);
            // Only now does the node write the rest: the first chunk was not held back.
            first_seen_tx.send(()).expect("node waiting");
            let mut rest = Vec::new();
            recv.read_to_end(&mut rest).await.expect("rest");
            assert_eq!(rest, b"data: [DONE]\n\n");
        };
        let node = async {
            let (mut send, mut recv) = p.dialler.accept_stream().await.expect("accept");
            let head = read_request_head(&mut recv).await.expect("request head");
            assert_eq!(head, request);
            let mut got = Vec::new();
            recv.read_to_end(&mut got).await.expect("request body");
            assert_eq!(got, body);
            let response =
                ResponseHead { status: 200, headers: vec![("content-type".into(), b"text/event-stream".to_vec())] };
            write_response_head(&mut send, &response).await.expect("head");
            send.write_all(b"data: first token\n\n").await.expect("chunk");
            send.flush().await.expect("flush");
            first_seen_rx.await.expect("gateway saw the first chunk");
            send.write_all(b"data: [DONE]\n\n").await.expect("chunk");
            send.shutdown().await.expect("finish");
        };
        within(&format!("tunnel over {transport}"), async { tokio::join!(gateway, node) }).await;
    }
}
