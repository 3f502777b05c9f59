//! A stream that breaks after its first byte cannot be retried; the client gets an SSE error
//! event and a clean end instead of a silent cut.

use crate::common;

use common::*;
use serde_json::Value;
use tela_gateway::engine_sim::FailMode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_dying_mid_stream_ends_in_an_error_event() {
    within(60, async {
        let fed = Fed::start(Options { engines: vec![failing(FailMode::MidStream)], ..Options::default() }).await;
        let s = stream_chat(&fed.base(), 50).await;
        assert_eq!(s.status, 200);
        assert!(!s.cut, "the response ends cleanly, not with a cut connection");
        let events = s.events();
        assert!(events.len() >= 2, "some chunks arrived before the break: {}", s.text());
        let last: Value = serde_json::from_str(events.last().expect("an event")).expect("the last event is JSON");
        assert_eq!(last["error"]["code"], "upstream_stream_broken", "{last}");
        assert!(last["error"]["message"].as_str().is_some_and(|m| m.contains(&fed.nodes[0].id.to_string())));
        assert!(!events.iter().any(|e| e == "[DONE]"), "no [DONE] after a broken stream");
        // Everything before the error event is the engine's own chunks.
        for e in &events[..events.len() - 1] {
            let v: Value = serde_json::from_str(e).expect("chunk is JSON");
            assert_eq!(v["object"], "chat.completion.chunk");
        }
        let metrics = call(&fed.base(), "GET", "/metrics", Some(KEY), None).await.text();
        assert!(metrics.contains("tela_gateway_broken_streams_total 1"), "{metrics}");
    })
    .await;
}
