//! Every error the gateway answers itself: the status code an OpenAI SDK maps to the right
//! exception, OpenAI's error JSON, and `Retry-After` where retrying helps.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tela_gateway::auth::key_line;
use tela_gateway::engine_sim::FailMode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn assert_openai_error(reply: &Reply, status: u16, code: &str) -> Value {
    assert_eq!(reply.status, status, "{}", reply.text());
    let v = reply.json();
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    assert_eq!(reply.header("content-type").as_deref(), Some("application/json"));
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_required_checked_and_reloaded() {
    within(60, async {
        let fed = Fed::start(Options { engines: vec![engine(&[MODEL])], ..Options::default() }).await;
        let base = fed.base();
        let body = Some(chat(MODEL, false, 4));
        let missing = call(&base, "POST", "/v1/chat/completions", None, body.clone()).await;
        assert_openai_error(&missing, 401, "invalid_api_key");
        let wrong = call(&base, "POST", "/v1/chat/completions", Some("not-a-key"), body.clone()).await;
        assert_openai_error(&wrong, 401, "invalid_api_key");
        assert_openai_error(&call(&base, "GET", "/v1/models", None, None).await, 401, "invalid_api_key");
        assert_openai_error(&call(&base, "GET", "/status", None, None).await, 401, "invalid_api_key");
        assert_openai_error(&call(&base, "GET", "/metrics", None, None).await, 401, "invalid_api_key");
        assert_eq!(call(&base, "GET", "/status", Some(KEY), None).await.status, 200);

        // Health and the dashboard page are open and say nothing secret.
        let health = call(&base, "GET", "/health", None, None).await;
        assert_eq!(health.status, 200);
        assert_eq!(health.json()["status"], "ok");
        let page = call(&base, "GET", "/", None, None).await;
        assert_eq!(page.status, 200);
        assert!(!page.text().contains(KEY));

        // A key added to the file works without a restart; a removed one stops working.
        let keys = fed.dir.path().join("api-keys");
        std::fs::write(&keys, format!("{} new\n", key_line("second-key"))).expect("rewrite the key file");
        let mut accepted = false;
        for _ in 0..100 {
            if call(&base, "GET", "/v1/models", Some("second-key"), None).await.status == 200 {
                accepted = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(accepted, "the new key was not accepted within 10 s");
        assert_eq!(call(&base, "GET", "/v1/models", Some(KEY), None).await.status, 401, "the old key was removed");

        // A broken edit keeps the keys in force.
        std::fs::write(&keys, "sha256:nonsense\n").expect("rewrite the key file");
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(call(&base, "GET", "/v1/models", Some("second-key"), None).await.status, 200);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_and_unknown_models_and_paths() {
    within(60, async {
        let fed = Fed::start(Options { engines: vec![engine(&[MODEL, "other-model"])], ..Options::default() }).await;
        let base = fed.base();
        let v = assert_openai_error(
            &post(&base, "/v1/chat/completions", chat("gpt-unknown", false, 4)).await,
            404,
            "model_not_found",
        );
        let message = v["error"]["message"].as_str().expect("message");
        assert!(
            message.contains("gpt-unknown") && message.contains(MODEL) && message.contains("other-model"),
            "{message}"
        );

        let not_json = send(&base, "POST", "/v1/chat/completions", Some(KEY), Some("{not json".into())).await;
        assert_eq!(not_json.status(), 400);
        assert_openai_error(&post(&base, "/v1/completions", json!({"prompt": "x"})).await, 400, "invalid_value");
        assert_openai_error(
            &call(&base, "GET", "/v1/chat/completions", Some(KEY), None).await,
            405,
            "method_not_allowed",
        );
        assert_openai_error(&call(&base, "GET", "/v1/nothing", Some(KEY), None).await, 404, "unknown_url");
        assert_openai_error(&call(&base, "GET", "/elsewhere", None, None).await, 404, "unknown_url");
        let model = call(&base, "GET", "/v1/models/nope", Some(KEY), None).await;
        assert_openai_error(&model, 404, "model_not_found");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_slow_and_excess_requests_are_refused() {
    within(60, async {
        let fed = Fed::start(Options {
            engines: vec![paced(20.0)],
            tune: |c| {
                c.limits.max_body_bytes = 2048;
                c.limits.body_timeout = Duration::from_millis(500);
                c.limits.header_timeout = Duration::from_millis(500);
                c.limits.max_concurrent = 1;
            },
            ..Options::default()
        })
        .await;
        let base = fed.base();

        let big = json!({"model": MODEL, "prompt": "x".repeat(4096)});
        assert_openai_error(&post(&base, "/v1/completions", big).await, 413, "request_too_large");

        // A body that never finishes: 408 after the body timeout.
        let addr = fed.gateway.local_addr();
        let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"model\""
        );
        tcp.write_all(head.as_bytes()).await.expect("write");
        let mut answer = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut answer)).await.expect("answered").expect("read");
        let text = String::from_utf8_lossy(&answer[..n]);
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("request_timeout"), "{text}");

        // Headers that never finish: the connection is closed after the header timeout.
        let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        tcp.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n").await.expect("write");
        let closed = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut answer)).await.expect("closed in time");
        assert!(matches!(closed, Ok(0) | Err(_)), "the connection was closed");

        // One request at a time: a second one while a stream is open gets 429.
        let started = std::time::Instant::now();
        let open = send(&base, "POST", "/v1/chat/completions", Some(KEY), Some(chat(MODEL, true, 40).to_string())).await;
        assert_eq!(open.status(), 200);
        let second = post(&base, "/v1/chat/completions", chat(MODEL, false, 2)).await;
        assert_openai_error(&second, 429, "concurrency_limit");
        assert_eq!(second.header("retry-after").as_deref(), Some("1"));
        let done = read_stream(open, started).await;
        assert_eq!(done.events().last().map(String::as_str), Some("[DONE]"));
        // The permit is back once the stream has ended.
        assert_eq!(post(&base, "/v1/chat/completions", chat(MODEL, false, 2)).await.status, 200);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_capacity_is_503_with_retry_after() {
    within(60, async {
        // Both engines drop every request: each node answers 502, the gateway tries both and
        // then gives up with 503.
        let fed = Fed::start(Options {
            engines: vec![failing(FailMode::Drop), failing(FailMode::Drop)],
            ..Options::default()
        })
        .await;
        let reply = post(&fed.base(), "/v1/chat/completions", chat(MODEL, false, 4)).await;
        let v = assert_openai_error(&reply, 503, "no_capacity");
        assert_eq!(reply.header("retry-after").as_deref(), Some("1"));
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("502")), "{v}");
    })
    .await;
}
