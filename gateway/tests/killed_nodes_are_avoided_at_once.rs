//! `kill -9` of a node in the middle of a stream: its client gets an error event, streams on
//! other nodes are untouched, and new requests stop going to the dead node within a second —
//! the gateway sees the tunnel connection close, it does not wait for gossip to call it dead.
//!
//! The nodes dial over TCP here: a killed process's TCP connections are closed by the kernel
//! at once. Over QUIC nothing tells the gateway; it notices after its node idle timeout
//! (`--node-idle-timeout`, 5 s by default), which `a_node_that_vanishes_over_quic_...` checks.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_fails_only_its_own_stream_and_is_avoided_within_a_second() {
    within(120, async {
        let mut fed = Fed::start(Options {
            engines: vec![paced(10.0), paced(10.0), paced(10.0)],
            node_args: vec!["--transport", "tcp"],
            ..Options::default()
        })
        .await;
        let base = fed.base();
        // Open streams until every node carries at least one.
        let mut streams = Vec::new();
        for _ in 0..30 {
            let started = Instant::now();
            let response =
                send(&base, "POST", "/v1/chat/completions", Some(KEY), Some(chat(MODEL, true, 60).to_string())).await;
            assert_eq!(response.status(), 200);
            let node = response.headers()["x-tela-node"].to_str().expect("node").to_string();
            streams.push((node, tokio::spawn(read_stream(response, started))));
            let covered = fed.nodes.iter().all(|n| streams.iter().any(|(s, _)| *s == n.id.to_string()));
            if covered && streams.len() >= 6 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let victim = fed.nodes[0].id.to_string();
        fed.nodes[0].kill();
        let killed_at = Instant::now();

        // Within a second the gateway has dropped the node's tunnel.
        let gw = &fed.gateway;
        let gone = eventually(Duration::from_secs(1), || {
            gw.status()["nodes"]
                .as_array()
                .is_some_and(|ns| ns.iter().any(|n| n["short"] == victim.as_str() && n["tunnel"] == false))
        })
        .await;
        assert!(gone, "the dead node's tunnel was still listed {:?} after the kill", killed_at.elapsed());
        for _ in 0..10 {
            let r = post(&base, "/v1/chat/completions", chat(MODEL, false, 2)).await;
            assert_eq!(r.status, 200, "{}", r.text());
            assert_ne!(r.header("x-tela-node"), Some(victim.clone()));
        }

        for (node, stream) in streams {
            let s = stream.await.expect("stream task");
            assert!(!s.cut, "no silent cut on node {node}");
            let last = s.events().last().cloned().unwrap_or_default();
            if node == victim {
                let v: Value = serde_json::from_str(&last).unwrap_or_else(|_| panic!("error event, got {}", s.text()));
                assert_eq!(v["error"]["code"], "upstream_stream_broken");
            } else {
                assert_eq!(last, "[DONE]", "a stream on a healthy node was disturbed: {}", s.text());
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_vanishes_over_quic_is_dropped_after_the_idle_timeout() {
    within(60, async {
        let mut fed = Fed::start(Options {
            engines: vec![engine(&[MODEL]), engine(&[MODEL])],
            node_args: vec!["--transport", "quic"],
            tune: |c| c.node_idle_timeout = Duration::from_secs(2),
            ..Options::default()
        })
        .await;
        let victim = fed.nodes[0].id.to_string();
        fed.nodes[0].kill();
        let gw = &fed.gateway;
        let gone = eventually(Duration::from_secs(4), || {
            gw.status()["nodes"]
                .as_array()
                .is_some_and(|ns| ns.iter().any(|n| n["short"] == victim.as_str() && n["tunnel"] == false))
        })
        .await;
        assert!(gone, "the vanished node was not dropped within twice the idle timeout");
        for _ in 0..5 {
            let r = post(&fed.base(), "/v1/chat/completions", chat(MODEL, false, 2)).await;
            assert_eq!(r.status, 200);
            assert_ne!(r.header("x-tela-node"), Some(victim.clone()));
        }
    })
    .await;
}
