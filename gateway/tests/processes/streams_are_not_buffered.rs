//! Server-sent events pass through as they are produced: the first chunk reaches the client
//! long before the engine produces the last one.

use crate::common;

use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_chunk_arrives_before_the_last_is_produced() {
    within(60, async {
        // 10 tokens per second, 20 tokens: the engine needs about two seconds.
        let fed = Fed::start(Options { engines: vec![paced(10.0)], ..Options::default() }).await;
        let s = stream_chat(&fed.base(), 20).await;
        assert_eq!(s.status, 200);
        assert_eq!(s.events().last().map(String::as_str), Some("[DONE]"));
        let first = s.chunks.first().expect("a chunk").0;
        let last = s.chunks.last().expect("a chunk").0;
        assert!(
            last.saturating_sub(first) > Duration::from_millis(1000),
            "chunks arrived as produced (first at {first:?}, last at {last:?}), not all at once"
        );
        assert!(s.chunks.len() >= 10, "chunks were not merged: {}", s.chunks.len());
    })
    .await;
}
