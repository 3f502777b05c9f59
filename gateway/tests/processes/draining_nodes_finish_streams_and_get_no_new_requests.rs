//! Draining a node (`tela drain`, as Slurm's warning signal or a walltime would) lets its open
//! streams finish while the gateway sends it nothing new.

use crate::common;

use std::time::{Duration, Instant};

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_open_streams_complete_and_new_requests_go_elsewhere() {
    within(120, async {
        // 20 tokens per second and 40 tokens: each stream stays open about two seconds.
        let mut fed = Fed::start(Options { engines: vec![paced(20.0), paced(20.0)], ..Options::default() }).await;
        let base = fed.base();
        let mut streams = Vec::new();
        for _ in 0..20 {
            let base = base.clone();
            let started = Instant::now();
            let response =
                send(&base, "POST", "/v1/chat/completions", Some(KEY), Some(chat(MODEL, true, 40).to_string())).await;
            assert_eq!(response.status(), 200);
            let node = response.headers()["x-tela-node"].to_str().expect("node").to_string();
            streams.push((node, tokio::spawn(read_stream(response, started))));
        }
        let target = fed.nodes[0].id.to_string();
        let on_target = streams.iter().filter(|(n, _)| *n == target).count();
        assert!(on_target > 0, "some streams are on node 0");

        drain(&fed.nodes[0]);
        // Once the gateway knows (the DOWN record arrives by gossip), node 0 gets nothing new.
        let gw = &fed.gateway;
        let known = eventually(Duration::from_secs(5), || {
            gw.status()["nodes"]
                .as_array()
                .is_some_and(|ns| ns.iter().any(|n| n["short"] == target.as_str() && n["state"] == "DOWN"))
        })
        .await;
        assert!(known, "the gateway learned of the drain: {:#}", gw.status());
        for _ in 0..10 {
            let r = post(&base, "/v1/chat/completions", chat(MODEL, false, 2)).await;
            assert_eq!(r.status, 200, "{}", r.text());
            assert_ne!(r.header("x-tela-node"), Some(target.clone()), "a draining node got a new request");
        }

        for (node, stream) in streams {
            let s = stream.await.expect("stream task");
            assert_eq!(
                s.events().last().map(String::as_str),
                Some("[DONE]"),
                "a stream on node {node} did not complete: {}",
                s.text()
            );
            assert!(!s.text().contains("\"error\""), "{}", s.text());
        }
        // The drained node leaves and exits 0 once its streams are done.
        let code = fed.nodes[0].wait_exit(Duration::from_secs(20)).await;
        assert_eq!(code, Some(0), "node log:\n{}", fed.nodes[0].log_text());
    })
    .await;
}
