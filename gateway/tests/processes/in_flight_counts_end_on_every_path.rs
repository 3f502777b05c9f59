//! The gateway counts a request in flight on its node from routing until the response body
//! ends — completed, broken, or abandoned by a client that went away — so routing's load
//! figures and the concurrency limit never leak.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use tela_gateway::engine_sim::FailMode;

fn in_flight(fed: &Fed, node: &str) -> u64 {
    let status = fed.gateway.status();
    status["nodes"]
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["short"] == node))
        .and_then(|n| n["in_flight"].as_u64())
        .unwrap_or(u64::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_broken_and_abandoned_responses_all_leave() {
    within(60, async {
        let fed = Fed::start(Options {
            engines: vec![paced(10.0)],
            tune: |c| c.limits.max_concurrent = 1,
            ..Options::default()
        })
        .await;
        let base = fed.base();
        let node = fed.nodes[0].id.to_string();

        // Completed.
        let s = stream_chat(&base, 4).await;
        assert_eq!(s.events().last().map(String::as_str), Some("[DONE]"));
        assert_eq!(in_flight(&fed, &node), 0);

        // Abandoned: the client reads the head and goes away mid-stream.
        let response =
            send(&base, "POST", "/v1/chat/completions", Some(KEY), Some(chat(MODEL, true, 60).to_string())).await;
        assert_eq!(response.status(), 200);
        assert_eq!(in_flight(&fed, &node), 1, "counted while the stream is open");
        drop(response);
        let released = eventually(Duration::from_secs(2), || in_flight(&fed, &node) == 0).await;
        assert!(released, "an abandoned stream still counts: {}", in_flight(&fed, &node));
        // ...and the single concurrency permit is free again.
        let r = post(&base, "/v1/chat/completions", chat(MODEL, false, 2)).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(in_flight(&fed, &node), 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stream_leaves_too() {
    within(60, async {
        let fed = Fed::start(Options { engines: vec![failing(FailMode::MidStream)], ..Options::default() }).await;
        let node = fed.nodes[0].id.to_string();
        let started = Instant::now();
        let response =
            send(&fed.base(), "POST", "/v1/chat/completions", Some(KEY), Some(chat(MODEL, true, 50).to_string())).await;
        let s = read_stream(response, started).await;
        assert!(s.text().contains("upstream_stream_broken"), "{}", s.text());
        assert!(eventually(Duration::from_secs(2), || in_flight(&fed, &node) == 0).await);
    })
    .await;
}
