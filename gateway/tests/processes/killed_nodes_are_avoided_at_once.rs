//! `kill -9` of a node in the middle of a stream: its client gets an error event, streams on
//! other nodes are untouched, and new requests stop going to the dead node within a second —
//! the gateway sees the tunnel connection close, it does not wait for gossip to call it dead.
//!
//! Over TCP a killed process's connections are closed by the kernel at once. Over QUIC nothing
//! tells the gateway: the first requests written to the dead node are not accepted within the
//! accept timeout (`--node-accept-timeout`, 500 ms), move to another node, and mark the node
//! silent, so later requests skip it; the connection itself goes after the idle timeout.
//! `a_node_that_vanishes_over_quic_...` checks that.

use crate::common;

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
async fn a_node_that_vanishes_over_quic_is_passed_over_within_a_second() {
    within(60, async {
        let mut fed = Fed::start(Options {
            engines: vec![engine(&[MODEL]), engine(&[MODEL])],
            node_args: vec!["--transport", "quic"],
            tune: |c| c.node_idle_timeout = Duration::from_secs(3),
            ..Options::default()
        })
        .await;
        // The victim is the node these requests go to while the gateway is idle (routing is
        // deterministic for the same request and the same loads), so at least the first request
        // after the kill is sent to it, whatever the node ids and however fast the others end.
        let probe = post(&fed.base(), "/v1/chat/completions", chat(MODEL, false, 2)).await;
        assert_eq!(probe.status, 200, "{}", probe.text());
        let preferred = probe.header("x-tela-node").expect("the serving node is named");
        let at = fed.nodes.iter().position(|n| n.id.to_string() == preferred).expect("a node of the federation");
        let victim = fed.nodes[at].id.to_string();
        fed.nodes[at].kill();
        let killed_at = Instant::now();

        // Nothing tells the gateway; concurrent requests land on the dead node first. Each one
        // sent to it is not accepted, and moves to the live one after the accept timeout.
        let burst = (0..6).map(|_| {
            let base = fed.base();
            tokio::spawn(async move { post(&base, "/v1/chat/completions", chat(MODEL, false, 2)).await })
        });
        for r in futures::future::join_all(burst).await {
            let r = r.expect("request task");
            assert_eq!(r.status, 200, "{}", r.text());
            assert_ne!(r.header("x-tela-node"), Some(victim.clone()));
        }
        let gw = &fed.gateway;
        let silent = |gw: &tela_gateway::gateway::Gateway| {
            gw.status()["nodes"].as_array().is_some_and(|ns| {
                ns.iter().any(|n| n["short"] == victim.as_str() && (n["silent"] == true || n["tunnel"] == false))
            })
        };
        assert!(silent(gw), "the dead node is still taken as usable {:?} after the kill", killed_at.elapsed());
        let passed_over = killed_at.elapsed();
        eprintln!("the dead node was passed over {passed_over:?} after the kill");
        assert!(passed_over < Duration::from_secs(1), "requests avoided the dead node only after {passed_over:?}");
        let retries = call(&fed.base(), "GET", "/metrics", Some(KEY), None).await.text();
        assert!(retries.contains(r#"reason="unresponsive""#), "the silent node shows in the retries:\n{retries}");

        // From now on no request waits for it.
        for _ in 0..5 {
            let r = post(&fed.base(), "/v1/chat/completions", chat(MODEL, false, 2)).await;
            assert_eq!(r.status, 200);
            assert_ne!(r.header("x-tela-node"), Some(victim.clone()));
        }
        // And the transport drops the connection after its idle timeout.
        let gone = eventually(Duration::from_secs(6), || {
            gw.status()["nodes"]
                .as_array()
                .is_some_and(|ns| ns.iter().any(|n| n["short"] == victim.as_str() && n["tunnel"] == false))
        })
        .await;
        assert!(gone, "the vanished node's connection was not dropped within twice the idle timeout");
    })
    .await;
}
