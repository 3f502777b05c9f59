//! Gateways route by the load the engines report: a node whose engine is busy with requests
//! this gateway never sent (clients talking to the engine directly) gets no new requests while
//! an idle one is there, and once the node stops reporting, the gateway forgets the figures
//! after the staleness window and balances on its own in-flight counts again.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::Value;
use tela_core::routing::RoutingPolicy;
use tela_gateway::engine_sim::EngineSimConfig;
use tela_gateway::routing::REPORT_MAX_AGE;
use tela_transports::Identity;

/// Two generation slots, a token every five seconds after the first: an answer (at least
/// eight tokens) holds a slot for most of a minute, and more than two requests wait.
fn two_slow_slots() -> EngineSimConfig {
    EngineSimConfig { max_num_seqs: 2, shutdown_grace: Duration::from_millis(100), ..paced(0.2) }
}

/// The gateway's `/status` entry of node `i`.
fn node_status(fed: &Fed, i: usize) -> Value {
    fed.node_row(i).unwrap_or_else(|| panic!("node {i} is not in /status: {:#}", fed.gateway.status()))
}

fn signal(node: &NodeProc, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(node.pid() as i32), signal).expect("signal the node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_engine_gets_no_new_requests_until_its_reports_go_stale() {
    within(120, async {
        let mut fed = Fed::start(Options {
            engines: vec![],
            tune: |config| {
                config.routing = RoutingPolicy::LeastLoaded;
                // Long enough that a stopped node keeps its connection while its report ages.
                config.node_idle_timeout = Duration::from_secs(30);
            },
            ..Options::default()
        })
        .await;
        let base = fed.base();
        // Least-loaded breaks ties by the lowest node id: with equal loads, that node gets every
        // request. Make its engine the busy one, so only its reports can steer requests away.
        let ids: Vec<_> = (0..2)
            .map(|i| Identity::load_or_create(&fed.dir.path().join(format!("node-{i}.key"))).expect("key").node_id())
            .collect();
        let busy = if ids[0] < ids[1] { 0 } else { 1 };
        let idle = 1 - busy;
        for i in 0..2 {
            fed.add_node(if i == busy { two_slow_slots() } else { engine(&[MODEL]) }, &[]).await;
        }
        fed.wait_routable(2).await;
        assert_eq!(fed.nodes[busy].id, ids[busy]);
        let (busy_short, idle_short) = (fed.nodes[busy].id.to_string(), fed.nodes[idle].id.to_string());

        let reply = post(&base, "/v1/chat/completions", chat(MODEL, false, 1)).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.header("x-tela-node").as_deref(), Some(busy_short.as_str()), "idle nodes tie");
        let reported = eventually(Duration::from_secs(10), || node_status(&fed, busy)["engine"]["fresh"] == true).await;
        assert!(reported, "the node reports its engine's load: {:#}", node_status(&fed, busy));

        // Six long streams straight to the busy node's engine: two run, four wait. The gateway
        // has nothing in flight there.
        let engine = format!("http://{}", fed.engines[busy].local_addr());
        let streams: Vec<_> = (0..6)
            .map(|_| {
                let engine = engine.clone();
                tokio::spawn(async move {
                    let body = chat(MODEL, true, 1000).to_string();
                    let response = send(&engine, "POST", "/v1/chat/completions", None, Some(body)).await;
                    let _ = http_body_util::BodyExt::collect(response.into_body()).await;
                })
            })
            .collect();
        let seen = eventually(Duration::from_secs(10), || {
            let e = &node_status(&fed, busy)["engine"];
            e["running"] == 2 && e["waiting"] == 4 && e["fresh"] == true
        })
        .await;
        let node = node_status(&fed, busy);
        assert!(seen, "the gateway sees the engine's running and waiting requests: {node:#}");
        assert_eq!(node["in_flight"], 0, "none of them came through this gateway: {node:#}");
        assert_eq!(node["load"], 6, "the load routing gets counts them: {node:#}");
        assert_eq!(node["engine"]["models"][0]["model"], MODEL, "{node:#}");

        for i in 0..6 {
            // At the busy engine it would wait behind the others for most of a minute.
            let reply = tokio::time::timeout(
                Duration::from_secs(10),
                post(&base, "/v1/chat/completions", chat(MODEL, false, 1)),
            )
            .await
            .unwrap_or_else(|_| panic!("request {i} waited at the busy engine: {:#}", fed.gateway.status()));
            assert_eq!(reply.status, 200, "{}", reply.text());
            assert_eq!(
                reply.header("x-tela-node").as_deref(),
                Some(idle_short.as_str()),
                "request {i} went to the busy node: {:#}",
                fed.gateway.status()
            );
        }

        // The node stops reporting (frozen: its connection stays up, nothing comes from it).
        // Once its last report is older than the staleness window, the gateway ignores it and
        // the node's load is this gateway's in-flight count again.
        signal(&fed.nodes[busy], nix::sys::signal::Signal::SIGSTOP);
        let stopped = std::time::Instant::now();
        let forgotten =
            eventually(REPORT_MAX_AGE + Duration::from_secs(5), || node_status(&fed, busy)["engine"]["fresh"] == false)
                .await;
        let node = node_status(&fed, busy);
        assert!(forgotten, "the report never went stale: {node:#}");
        // The last report left at most a refresh (1 s) before the stop.
        assert!(
            stopped.elapsed() + Duration::from_millis(1200) >= REPORT_MAX_AGE,
            "stale too soon, {:?} after the last report could have been sent: {node:#}",
            stopped.elapsed()
        );
        assert!(node["engine"]["age_ms"].as_u64().unwrap_or(0) >= REPORT_MAX_AGE.as_millis() as u64, "{node:#}");
        assert_eq!(node["engine"]["running"], 2, "the last report is still shown: {node:#}");
        assert_eq!(node["load"], 0, "a stale report does not count: {node:#}");

        // Reporting again, the node is busy again at once.
        signal(&fed.nodes[busy], nix::sys::signal::Signal::SIGCONT);
        let back = eventually(Duration::from_secs(10), || {
            let node = node_status(&fed, busy);
            node["engine"]["fresh"] == true && node["load"] == 6
        })
        .await;
        assert!(back, "reports resume: {:#}", node_status(&fed, busy));
        for stream in streams {
            stream.abort();
        }
    })
    .await;
}
