//! What operators read: `/status` (JSON), `/metrics` (Prometheus text), and the same table in
//! the terminal with `tela status --gateway URL`.

use crate::common;

use std::process::Command;

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_metrics_and_tela_status_describe_the_federation() {
    within(90, async {
        let fed = Fed::start(Options::default()).await;
        let base = fed.base();
        for stream in [false, true, false] {
            let r = post(&base, "/v1/chat/completions", chat(MODEL, stream, 4)).await;
            assert_eq!(r.status, 200);
        }
        assert_eq!(post(&base, "/v1/chat/completions", chat("nope", false, 4)).await.status, 404);
        let _ = post(&base, "/v1/embeddings", json!({"model": MODEL, "input": "x"})).await;

        let status = call(&base, "GET", "/status", Some(KEY), None).await.json();
        assert_eq!(status["models"], json!([MODEL]));
        let nodes = status["nodes"].as_array().expect("nodes");
        for n in &fed.nodes {
            let row = nodes.iter().find(|r| r["short"] == n.id.to_string().as_str()).expect("each node is listed");
            assert_eq!(row["state"], "SERVE");
            assert_eq!(row["role"], "serving");
            assert_eq!(row["models"], json!([MODEL]));
            assert_eq!(row["tunnel"], true);
            assert!(row["generation"].as_u64().is_some_and(|g| g > 0));
            assert!(row["gpus"]["model"].is_string() && row["gpus"]["count"].is_u64());
            assert!(row["in_flight"].is_u64() && row["reported_in_flight"].is_u64());
        }
        assert!(nodes.iter().any(|r| r["role"] == "gateway" && r["self"] == true), "the gateway lists itself");

        let metrics = call(&base, "GET", "/metrics", Some(KEY), None).await;
        let text = metrics.text();
        for needle in [
            &format!("tela_gateway_requests_total{{model=\"{MODEL}\",status=\"200\"}} 4"),
            "tela_gateway_requests_total{model=\"unknown\",status=\"404\"} 1",
            "tela_gateway_request_duration_seconds_bucket{",
            "stream=\"true\"",
            "tela_gateway_added_seconds_count 4",
            "tela_gateway_routing_seconds_count",
            "tela_gateway_in_flight{node=",
            "tela_gateway_nodes{state=\"SERVE\"} 3",
            "# EOF",
        ] {
            assert!(text.contains(needle), "/metrics lacks {needle}:\n{text}");
        }

        let out = Command::new(tela())
            .args(["status", "--gateway", &base, "--api-key", KEY])
            .output()
            .expect("run tela status");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let table = String::from_utf8_lossy(&out.stdout);
        for n in &fed.nodes {
            let line = table.lines().find(|l| l.starts_with(&n.id.to_string())).unwrap_or_else(|| panic!("{table}"));
            assert!(line.contains("SERVE") && line.contains(MODEL), "{line}");
        }
        let out =
            Command::new(tela()).args(["status", "--gateway", &base]).env_remove("TELA_API_KEY").output().expect("run");
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("--api-key"), "{}", String::from_utf8_lossy(&out.stderr));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_status_serves_status_and_metrics_without_a_key_but_not_the_api() {
    within(60, async {
        let fed = Fed::start(Options {
            engines: vec![engine(&[MODEL])],
            tune: |c| c.open_status = true,
            ..Options::default()
        })
        .await;
        let base = fed.base();
        assert_eq!(call(&base, "GET", "/status", None, None).await.status, 200);
        assert_eq!(call(&base, "GET", "/metrics", None, None).await.status, 200);
        assert_eq!(call(&base, "GET", "/v1/models", None, None).await.status, 401);
    })
    .await;
}
