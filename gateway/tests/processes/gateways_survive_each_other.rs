//! Several gateways: nodes that joined one gateway connect to every gateway they learn of
//! from the registry; killing one leaves the others serving, and the nodes come back to it
//! by themselves when it returns.

use crate::common;

use std::time::{Duration, Instant};

use common::*;

async fn serves(base: &str) {
    for _ in 0..5 {
        let r = post(base, "/v1/chat/completions", chat(MODEL, false, 4)).await;
        assert_eq!(r.status, 200, "{base}: {}", r.text());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_one_gateway_leaves_the_other_serving_and_nodes_return_to_it() {
    within(150, async {
        // The nodes are told only about gateway A.
        let fed = Fed::start(Options::default()).await;
        let (api, anchor) = (free_port(), free_port());
        let b = spawn_gateway(&fed, &format!("127.0.0.1:{api}"), anchor, &[]);
        assert!(
            wait_tunnels(&b.base, 2, Duration::from_secs(30)).await,
            "the nodes connected to gateway B, learned from the registry; B log:\n{}",
            std::fs::read_to_string(fed.dir.path().join("gateway-b.log")).unwrap_or_default()
        );
        serves(&b.base).await;
        serves(&fed.base()).await;

        // kill -9 gateway B while a stream runs through A.
        let started = Instant::now();
        let open =
            send(&fed.base(), "POST", "/v1/chat/completions", Some(KEY), Some(chat(MODEL, true, 30).to_string())).await;
        drop(b);
        serves(&fed.base()).await;
        let s = read_stream(open, started).await;
        assert_eq!(s.events().last().map(String::as_str), Some("[DONE]"), "{}", s.text());

        // B comes back on the same addresses with the same identity: the nodes redial it.
        let b = spawn_gateway(&fed, &format!("127.0.0.1:{api}"), anchor, &[]);
        assert!(
            wait_tunnels(&b.base, 2, Duration::from_secs(60)).await,
            "the nodes reconnected to the returning gateway; B log:\n{}",
            std::fs::read_to_string(fed.dir.path().join("gateway-b.log")).unwrap_or_default()
        );
        serves(&b.base).await;
    })
    .await;
}
