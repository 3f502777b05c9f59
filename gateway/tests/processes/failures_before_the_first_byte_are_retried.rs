//! A node that fails before its response begins costs the client nothing: the gateway moves
//! the request to another node at once.

use crate::common;

use common::*;
use tela_gateway::engine_sim::FailMode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_move_to_a_healthy_node_when_one_fails_before_answering() {
    within(90, async {
        // Node 0's engine drops every request (the node answers 502), node 1 is healthy. Random
        // choice sends identical requests to both; under prefix routing, the default, they would
        // all go where their prefix ranks first (conversations_stay_on_one_node covers that).
        let fed = Fed::start(Options {
            engines: vec![failing(FailMode::Drop), engine(&[MODEL])],
            tune: |c| c.routing = tela_core::routing::RoutingPolicy::P2c,
            ..Options::default()
        })
        .await;
        let base = fed.base();
        let healthy = fed.nodes[1].id.to_string();
        for i in 0..12 {
            let stream = i % 2 == 0;
            if stream {
                let s = stream_chat(&base, 4).await;
                assert_eq!(s.status, 200, "{}", s.text());
                assert_eq!(s.node(), healthy);
                assert_eq!(s.events().last().map(String::as_str), Some("[DONE]"));
            } else {
                let r = post(&base, "/v1/chat/completions", chat(MODEL, false, 4)).await;
                assert_eq!(r.status, 200, "{}", r.text());
                assert_eq!(r.header("x-tela-node"), Some(healthy.clone()));
            }
        }
        let metrics = call(&base, "GET", "/metrics", Some(KEY), None).await.text();
        let retries: f64 = metrics
            .lines()
            .filter(|l| l.starts_with("tela_gateway_retries_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert!(retries >= 1.0, "some requests were first sent to the failing node and retried:\n{metrics}");
    })
    .await;
}
