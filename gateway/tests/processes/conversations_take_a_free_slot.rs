//! Engines that run one request at a time (a llama.cpp server with `--parallel 1`; here engine
//! simulators with one slot), their nodes started with `--engine-slots 1`: the gateway learns
//! the slot count from the nodes' load reports (`/status` shows it), and a turn whose own node
//! is busy with another request goes to a node with a free slot instead of queueing behind a
//! whole generation. Once its node is free again, the conversation's next turn goes back to it.
//!
//! Without the slot count the busy node would keep the turn: one request in flight is well
//! within the load bound (two requests above the mean are allowed), as the core's unit tests
//! show for the same loads.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tela_gateway::engine_sim::EngineSimConfig;

/// One generation slot, twenty tokens a second: a 200-token answer holds it for ten seconds.
fn one_slot() -> EngineSimConfig {
    EngineSimConfig { max_num_seqs: 1, shutdown_grace: Duration::from_millis(100), ..paced(20.0) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_takes_a_free_slot_rather_than_queue_behind_another_conversation() {
    within(90, async {
        let fed = Fed::start(Options {
            engines: vec![one_slot(), one_slot()],
            node_args: vec!["--engine-slots", "1"],
            ..Options::default()
        })
        .await;
        let base = fed.base();
        let told = eventually(Duration::from_secs(10), || {
            (0..2).all(|i| fed.node_row(i).is_some_and(|row| row["engine"]["slots"] == 1))
        })
        .await;
        assert!(told, "the nodes' reports never said their slots: {:#}", fed.gateway.status());

        // Conversation 0, and another conversation ranked first on the same node.
        let home = ranking(&fed, 0)[0].clone();
        let other = (1..100).find(|&i| ranking(&fed, i)[0] == home).expect("a conversation that shares the node");
        let (mut messages, first) = opening(0);
        assert_eq!(next_turn(&base, &mut messages, &first).await, home, "idle nodes: its first-ranked node");

        // The other conversation's long answer takes the node's one slot.
        let (mut long_messages, long_first) = opening(other);
        let mut long = turn(&mut long_messages, &long_first);
        long["max_tokens"] = json!(200);
        long["stream"] = json!(true);
        let long_base = base.clone();
        let streaming = tokio::spawn(async move {
            let started = Instant::now();
            let response = send(&long_base, "POST", "/v1/chat/completions", Some(KEY), Some(long.to_string())).await;
            read_stream(response, started).await
        });
        let home_index = fed.node_index(&home).expect("the home node is one of ours");
        let busy =
            eventually(Duration::from_secs(5), || fed.node_row(home_index).is_some_and(|row| row["in_flight"] == 1))
                .await;
        assert!(busy, "the long answer never started on {home}: {:#}", fed.gateway.status());

        // The next turn goes to the idle node, and at once: it does not wait for the slot.
        let started = Instant::now();
        let moved = next_turn(&base, &mut messages, "And then?").await;
        assert_ne!(moved, home, "the turn queued behind the other conversation's answer");
        assert!(started.elapsed() < Duration::from_secs(5), "the turn waited {:?}", started.elapsed());

        // Once the long answer is over, the conversation is back on its own node.
        let long = streaming.await.expect("the long stream's task");
        assert_eq!((long.status, long.node()), (200, home.clone()), "{}", long.text());
        assert_eq!(next_turn(&base, &mut messages, "One more thing.").await, home, "back on its node");
    })
    .await;
}
