//! Several megabytes through one stream arrive intact and in order, on every transport.

mod common;

use common::{connected, within, ALL};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn pattern(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9u32;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_megabytes_stream_through_intact_in_both_directions() {
    const LEN: usize = 8 * 1024 * 1024;
    let data = pattern(LEN);
    for transport in ALL {
        let p = connected(transport).await;
        // Gateway → node (a tunnelled response in the other direction would look the same),
        // with the node echoing everything back while it is still arriving.
        let send_side = async {
            let (mut send, mut recv) = p.acceptor.open_stream().await.expect("open");
            let writer = async {
                for chunk in data.chunks(64 * 1024) {
                    send.write_all(chunk).await.expect("write");
                }
                send.shutdown().await.expect("finish");
            };
            let reader = async {
                let mut back = Vec::with_capacity(LEN);
                recv.read_to_end(&mut back).await.expect("read echo");
                back
            };
            tokio::join!(writer, reader).1
        };
        let echo_side = async {
            let (mut send, mut recv) = p.dialler.accept_stream().await.expect("accept");
            let copied = tokio::io::copy(&mut recv, &mut send).await.expect("echo");
            send.shutdown().await.expect("finish echo");
            copied
        };
        let (back, copied) = within("8 MiB round trip", async { tokio::join!(send_side, echo_side) }).await;
        assert_eq!(copied, LEN as u64, "{transport}");
        assert!(back == data, "{transport}: the echoed stream differs");
    }
}
