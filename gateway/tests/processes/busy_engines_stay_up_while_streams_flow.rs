//! An engine that serves one request at a time (llama-cpp-python; here `tela engine-sim
//! --serial`) answers the node's health probes only after the generation in front of them:
//! during a stream longer than three probe timeouts, every probe times out. The node sees the
//! stream's bytes arriving and counts the engine as busy, not failed — it stays SERVE and
//! routable, and the stream finishes. Killing that engine mid-stream still turns the node DOWN
//! within a second or two: a refused probe is a failure whatever is flowing.

use crate::common::*;
use crate::procs::engine_sim;

use serde_json::Value;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The node's probe timeout (`EngineConfig::default`), and the probes that must fail in a row.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
const FAILURES_BEFORE_DOWN: u32 = 3;

/// The gateway's `/status` entry for the node.
fn node_status(fed: &Fed) -> Value {
    fed.node_row(0).unwrap_or(Value::Null)
}

fn serves(node: &Value) -> bool {
    node["routable"] == true && node["state"] == "SERVE"
}

/// A chat stream of `tokens` tokens through the gateway, read to its end in a task.
fn start_stream(fed: &Fed, tokens: u32) -> tokio::task::JoinHandle<Streamed> {
    let base = fed.base();
    tokio::spawn(async move { stream_chat(&base, tokens).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_serial_engine_stays_up_and_a_killed_one_goes_down() {
    within(120, async {
        let mut fed = Fed::start(Options { engines: vec![], ..Options::default() }).await;
        // Two tokens a second: a 44-token answer streams for 22 s, more than the three probe
        // timeouts (and the probe interval between them) that would turn the node DOWN.
        let (mut engine, url) = engine_sim("engine", MODEL, &["--serial", "--tokens-per-s", "2", "--ttft-ms", "10"]);
        let engine_addr: SocketAddr = url.trim_start_matches("http://").parse().expect("engine address");
        let join = vec![fed.gateway.anchor_addr().to_string()];
        let node = spawn_node(fed.dir.path(), "node-0", &join, engine_addr, &[]);
        fed.nodes.push(node);
        fed.wait_routable(1).await;

        let started = Instant::now();
        let stream = start_stream(&fed, 44);
        tokio::time::sleep(Duration::from_millis(500)).await;
        // The premise: the engine's /health waits behind the stream, so the node's probes
        // time out (without this the test would pass without the fix).
        let health = tokio::time::timeout(Duration::from_secs(2), send(&url, "GET", "/health", None, None)).await;
        assert!(health.is_err(), "the serial engine answered /health while streaming");

        let must_survive = (PROBE_TIMEOUT + Duration::from_millis(200)) * FAILURES_BEFORE_DOWN + Duration::from_secs(2);
        while started.elapsed() < must_survive {
            let node = node_status(&fed);
            assert!(
                serves(&node),
                "the node left SERVE {:?} into a stream of a busy engine: {node:#}\nnode log:\n{}",
                started.elapsed(),
                fed.nodes[0].log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let streamed =
            tokio::time::timeout(Duration::from_secs(30), stream).await.expect("the stream ends").expect("task");
        assert_eq!(streamed.status, 200, "{}", streamed.text());
        assert!(!streamed.cut, "the stream was cut: {}", streamed.text());
        assert_eq!(streamed.events().last().map(String::as_str), Some("[DONE]"), "{}", streamed.text());
        let lasted = streamed.chunks.last().map(|(at, _)| *at).unwrap_or_default();
        assert!(lasted > must_survive, "the stream ended after {lasted:?}, before the probes could fail");
        let log = fed.nodes[0].log_text();
        assert!(log.contains("too busy to answer probes"), "the node says why it kept the engine up:\n{log}");
        assert!(!log.contains("the node is DOWN"), "{log}");
        // Still routable once the engine is free: a new request is answered.
        let reply = post(&fed.base(), "/v1/chat/completions", chat(MODEL, false, 2)).await;
        assert_eq!(reply.status, 200, "{}", reply.text());

        // Kill the engine in the middle of another long stream: no byte flows any more and
        // probes are refused, so the node goes DOWN after a few probe intervals.
        let stream = start_stream(&fed, 44);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(serves(&node_status(&fed)), "{:#}", node_status(&fed));
        engine.kill();
        let killed = Instant::now();
        let down = eventually(Duration::from_secs(5), || !serves(&node_status(&fed))).await;
        assert!(
            down,
            "the node still serves 5 s after its engine was killed: {:#}\nnode log:\n{}",
            node_status(&fed),
            fed.nodes[0].log_text()
        );
        eprintln!("the node left SERVE {:?} after its engine was killed", killed.elapsed());
        let _ = tokio::time::timeout(Duration::from_secs(10), stream).await;
    })
    .await;
}
