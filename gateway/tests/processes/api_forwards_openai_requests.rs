//! The OpenAI API through the gateway: every endpoint forwarded to a node and back, bodies and
//! streams unchanged, the serving node and the gateway's own time named in headers, over
//! HTTP/1.1 and HTTP/2.

use crate::common;

use std::collections::HashSet;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_is_forwarded_and_answered_in_openai_shape() {
    within(90, async {
        // Random choice, so that identical requests spread over both nodes: prefix routing, the
        // default, keeps them on one (conversations_stay_on_one_node checks that).
        let fed =
            Fed::start(Options { tune: |c| c.routing = tela_core::routing::RoutingPolicy::P2c, ..Options::default() })
                .await;
        let base = fed.base();

        let models = call(&base, "GET", "/v1/models", Some(KEY), None).await;
        assert_eq!(models.status, 200, "{}", models.text());
        let m = models.json();
        assert_eq!(m["object"], "list");
        assert_eq!(m["data"][0]["id"], MODEL);

        let one = call(&base, "GET", &format!("/v1/models/{MODEL}"), Some(KEY), None).await;
        assert_eq!(one.json()["id"], MODEL);

        let reply = post(&base, "/v1/chat/completions", chat(MODEL, false, 8)).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let v = reply.json();
        assert_eq!(v["object"], "chat.completion");
        assert!(v["choices"][0]["message"]["content"].as_str().is_some_and(|c| !c.is_empty()));
        let node = reply.header("x-tela-node").expect("x-tela-node");
        assert!(fed.node_index(&node).is_some(), "x-tela-node {node} names one of the nodes");
        let ms: f64 = reply.header("x-tela-gateway-ms").expect("x-tela-gateway-ms").parse().expect("a number");
        assert!(ms >= 0.0);

        let reply = post(&base, "/v1/completions", json!({"model": MODEL, "prompt": "Once", "max_tokens": 5})).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["object"], "text_completion");

        let reply = post(&base, "/v1/embeddings", json!({"model": MODEL, "input": ["a", "b"]})).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["data"].as_array().map(Vec::len), Some(2));

        let streamed = stream_chat(&base, 6).await;
        assert_eq!(streamed.status, 200);
        assert!(streamed.headers["content-type"].to_str().unwrap_or("").starts_with("text/event-stream"));
        let events = streamed.events();
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{}", streamed.text());
        assert!(!streamed.text().contains("\"error\""), "{}", streamed.text());

        // The same request answered directly by an engine and through the gateway is the same
        // text (bodies pass unchanged; the simulator is deterministic per seed and prompt).
        let direct = call(
            &format!("http://{}", fed.engines[0].local_addr()),
            "POST",
            "/v1/chat/completions",
            None,
            Some(chat(MODEL, false, 8)),
        )
        .await;
        let mut seen = HashSet::new();
        for _ in 0..20 {
            let r = post(&base, "/v1/chat/completions", chat(MODEL, false, 8)).await;
            assert_eq!(r.status, 200);
            seen.insert(r.header("x-tela-node").expect("node"));
            if fed.node_index(&r.header("x-tela-node").expect("node")) == Some(0) {
                assert_eq!(
                    r.json()["choices"][0]["message"]["content"],
                    direct.json()["choices"][0]["message"]["content"]
                );
            }
        }
        assert_eq!(seen.len(), 2, "requests are spread over both nodes: {seen:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_are_served_too() {
    within(60, async {
        let fed = Fed::start(Options { engines: vec![engine(&[MODEL])], ..Options::default() }).await;
        let addr = fed.gateway.local_addr();
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 prior-knowledge handshake");
        tokio::spawn(conn);
        for _ in 0..3 {
            let req = hyper::Request::post(format!("http://{addr}/v1/chat/completions"))
                .header("authorization", format!("Bearer {KEY}"))
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(chat(MODEL, true, 4).to_string())))
                .expect("request");
            let response = sender.send_request(req).await.expect("response over h2");
            assert_eq!(response.status(), 200);
            assert_eq!(response.version(), hyper::Version::HTTP_2);
            let body = response.into_body().collect().await.expect("body").to_bytes();
            assert!(String::from_utf8_lossy(&body).trim_end().ends_with("data: [DONE]"));
        }
    })
    .await;
}
