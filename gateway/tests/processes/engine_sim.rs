//! The engine simulator over real HTTP on loopback: what an OpenAI client, a prober and a
//! gateway's retry logic see. Tests assert order, counts and shapes, never speed.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderMap, ALLOW, CONTENT_TYPE, HOST};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tela_gateway::engine_sim::{self, EngineSimConfig, EngineSimError, EngineSimHandle, FailMode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bounds every test so a hang fails instead of stalling CI.
async fn within<T>(test: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), test).await.expect("test did not finish within 60 s")
}

/// Near-instant generation, for tests that are not about pacing.
fn fast(models: &[&str]) -> EngineSimConfig {
    EngineSimConfig {
        models: models.iter().map(|m| (*m).to_owned()).collect(),
        ttft: Duration::from_millis(1),
        tokens_per_s: 5_000.0,
        ..EngineSimConfig::default()
    }
}

async fn start(config: EngineSimConfig) -> EngineSimHandle {
    engine_sim::spawn(config, "127.0.0.1:0".parse().expect("loopback address")).await.expect("engine simulator starts")
}

async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.expect("connect to simulator");
    let (sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("HTTP/1.1 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender
}

fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, addr.to_string())
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("valid request")
}

async fn send_on(
    sender: &mut SendRequest<Full<Bytes>>,
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> Result<Response<hyper::body::Incoming>, hyper::Error> {
    sender.ready().await?;
    sender.send_request(request(addr, method, path, body)).await
}

/// One request on a fresh connection; the whole body parsed as JSON.
async fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> (StatusCode, HeaderMap, Value) {
    let mut sender = connect(addr).await;
    let response = send_on(&mut sender, addr, method, path, body).await.expect("response");
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.expect("whole body").to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
    (parts.status, parts.headers, value)
}

async fn post(addr: SocketAddr, path: &str, body: Value) -> (StatusCode, Value) {
    let (status, _, value) = call(addr, "POST", path, &body.to_string()).await;
    (status, value)
}

async fn get(addr: SocketAddr, path: &str) -> (StatusCode, Value) {
    let (status, _, value) = call(addr, "GET", path, "").await;
    (status, value)
}

/// A streamed answer read to its end: content type and raw body text.
async fn stream_text(addr: SocketAddr, path: &str, body: Value) -> (String, String) {
    let mut sender = connect(addr).await;
    let response = send_on(&mut sender, addr, "POST", path, &body.to_string()).await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let content_type =
        response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let bytes = response.into_body().collect().await.expect("whole stream").to_bytes();
    (content_type, String::from_utf8(bytes.to_vec()).expect("UTF-8 stream"))
}

/// Splits an SSE body into its `data` payloads, asserting OpenAI's exact framing: every event
/// is one `data: ` line followed by a blank line, and nothing else is in the body.
fn sse_events(body: &str) -> Vec<String> {
    assert!(body.ends_with("\n\n"), "stream does not end with a blank line: {body:?}");
    body[..body.len() - 2]
        .split("\n\n")
        .map(|event| {
            assert!(!event.contains('\n'), "event is not a single line: {event:?}");
            event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("event without 'data: ' prefix: {event:?}"))
                .to_owned()
        })
        .collect()
}

/// The JSON chunks before `[DONE]`, asserting `[DONE]` is last and appears once.
fn json_chunks(body: &str) -> Vec<Value> {
    let events = sse_events(body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "stream must end with [DONE]");
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("chunk is not JSON ({err}): {e}")))
        .collect()
}

fn chat(model: &str, prompt: &str, extra: Value) -> Value {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": prompt}]});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    body
}

fn assert_error_shape(body: &Value) {
    let error = body["error"].as_object().unwrap_or_else(|| panic!("no error object: {body}"));
    let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["code", "message", "param", "type"], "{body}");
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert!(error["type"].is_string(), "{body}");
}

async fn wait_for(handle: &EngineSimHandle, what: &str, done: impl Fn(&engine_sim::EngineSimStats) -> bool) {
    for _ in 0..600 {
        if done(&handle.stats()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what} never happened; stats: {:?}", handle.stats());
}

#[tokio::test]
async fn models_and_health_list_what_is_served() {
    within(async {
        let engine = start(fast(&["alpha", "beta"])).await;
        let addr = engine.local_addr();

        // Two requests on one keep-alive connection.
        let mut sender = connect(addr).await;
        for _ in 0..2 {
            let response = send_on(&mut sender, addr, "GET", "/v1/models", "").await.expect("models");
            assert_eq!(response.status(), StatusCode::OK);
            let bytes = response.into_body().collect().await.expect("body").to_bytes();
            let body: Value = serde_json::from_slice(&bytes).expect("JSON");
            assert_eq!(body["object"], "list");
            let data = body["data"].as_array().expect("data list");
            let ids: Vec<&str> = data.iter().filter_map(|m| m["id"].as_str()).collect();
            assert_eq!(ids, ["alpha", "beta"]);
            for model in data {
                assert_eq!(model["object"], "model");
                assert_eq!(model["owned_by"], "tela-engine-sim");
                assert!(model["created"].is_u64());
            }
        }

        let (status, model) = get(addr, "/v1/models/beta").await;
        assert_eq!((status, model["id"].as_str()), (StatusCode::OK, Some("beta")));
        let (status, error) = get(addr, "/v1/models/gamma").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(error["error"]["code"], "model_not_found");

        assert_eq!(get(addr, "/health").await, (StatusCode::OK, json!({"status": "ok"})));
        assert_eq!(engine.stats().requests, 5);
        engine.shutdown().await.expect("clean shutdown");
    })
    .await;
}

#[tokio::test]
async fn chat_answers_with_usage_and_respects_max_tokens() {
    within(async {
        let engine = start(fast(&["m"])).await;
        let addr = engine.local_addr();

        let (status, body) =
            post(addr, "/v1/chat/completions", chat("m", "Hello there", json!({"max_tokens": 5}))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["model"], "m");
        assert!(body["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl-")));
        let choices = body["choices"].as_array().expect("choices");
        assert_eq!(choices.len(), 1);
        assert_eq!(choices[0]["message"]["role"], "assistant");
        assert_eq!(choices[0]["finish_reason"], "length");
        let content = choices[0]["message"]["content"].as_str().expect("content").to_owned();
        assert_eq!(content.split_whitespace().count(), 5, "{content:?}");
        let usage = &body["usage"];
        assert_eq!(usage["completion_tokens"], 5);
        let prompt_tokens = usage["prompt_tokens"].as_u64().expect("prompt_tokens");
        assert!(prompt_tokens > 0);
        assert_eq!(usage["total_tokens"].as_u64(), Some(prompt_tokens + 5));

        // Same request, same answer.
        let (_, again) = post(addr, "/v1/chat/completions", chat("m", "Hello there", json!({"max_tokens": 5}))).await;
        assert_eq!(again["choices"][0]["message"]["content"].as_str(), Some(content.as_str()));

        // max_completion_tokens wins over max_tokens; the default is 16.
        let (_, short) = post(
            addr,
            "/v1/chat/completions",
            chat("m", "Hello there", json!({"max_tokens": 5, "max_completion_tokens": 3})),
        )
        .await;
        assert_eq!(short["usage"]["completion_tokens"], 3);
        let (_, default) = post(addr, "/v1/chat/completions", chat("m", "Hello there", json!({}))).await;
        assert!(default["usage"]["completion_tokens"].as_u64().is_some_and(|n| (1..=16).contains(&n)));

        // With room to finish, the answer ends naturally.
        let (_, long) = post(addr, "/v1/chat/completions", chat("m", "Hello there", json!({"max_tokens": 4096}))).await;
        assert_eq!(long["choices"][0]["finish_reason"], "stop");
        assert!(long["choices"][0]["message"]["content"].as_str().is_some_and(|c| c.ends_with('.')));

        // Another seed gives another answer.
        let other = start(EngineSimConfig { seed: 99, ..fast(&["m"]) }).await;
        let (_, reseeded) =
            post(other.local_addr(), "/v1/chat/completions", chat("m", "Hello there", json!({"max_tokens": 5}))).await;
        assert_ne!(reseeded["choices"][0]["message"]["content"].as_str(), Some(content.as_str()));
        assert_eq!(
            engine.stats().tokens_generated,
            5 + 5
                + 3
                + default["usage"]["completion_tokens"].as_u64().unwrap_or(0)
                + long["usage"]["completion_tokens"].as_u64().unwrap_or(0)
        );
    })
    .await;
}

#[tokio::test]
async fn chat_stream_uses_openai_sse_framing() {
    within(async {
        let engine = start(fast(&["m"])).await;
        let addr = engine.local_addr();
        let options = json!({"max_tokens": 4, "stream": true, "stream_options": {"include_usage": true}});
        let (content_type, text) = stream_text(addr, "/v1/chat/completions", chat("m", "stream me", options)).await;
        assert_eq!(content_type, "text/event-stream");
        let chunks = json_chunks(&text);
        // role, 4 tokens, finish, usage
        assert_eq!(chunks.len(), 7, "{text}");
        let id = chunks[0]["id"].as_str().expect("id");
        for chunk in &chunks {
            assert_eq!(chunk["object"], "chat.completion.chunk");
            assert_eq!(chunk["id"], id);
            assert_eq!(chunk["model"], "m");
        }
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let mut streamed = String::new();
        for chunk in &chunks[1..5] {
            let choice = &chunk["choices"][0];
            assert!(choice["finish_reason"].is_null());
            assert!(choice["delta"].get("role").is_none());
            let token = choice["delta"]["content"].as_str().expect("content delta");
            assert_eq!(token.split_whitespace().count(), 1, "one token per chunk: {token:?}");
            streamed.push_str(token);
        }
        assert_eq!(chunks[5]["choices"][0]["finish_reason"], "length");
        assert_eq!(chunks[5]["choices"][0]["delta"], json!({}));
        assert_eq!(chunks[6]["choices"], json!([]));
        assert_eq!(chunks[6]["usage"]["completion_tokens"], 4);

        // The stream carries exactly the non-stream answer.
        let (_, whole) = post(addr, "/v1/chat/completions", chat("m", "stream me", json!({"max_tokens": 4}))).await;
        assert_eq!(whole["choices"][0]["message"]["content"].as_str(), Some(streamed.as_str()));

        // Without include_usage: no usage chunk and no usage field.
        let (_, text) =
            stream_text(addr, "/v1/chat/completions", chat("m", "stream me", json!({"max_tokens": 4, "stream": true})))
                .await;
        let chunks = json_chunks(&text);
        assert_eq!(chunks.len(), 6);
        assert!(chunks.iter().all(|c| c.get("usage").is_none()));
        assert_eq!(engine.stats().completed, 3);
    })
    .await;
}

/// Decodes an HTTP/1.1 chunked body; panics on malformed framing.
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n").expect("chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..line_end]).expect("ASCII size"), 16)
            .expect("hex chunk size");
        raw = &raw[line_end + 2..];
        if size == 0 {
            assert_eq!(raw, b"\r\n", "body must end with the last-chunk marker");
            return out;
        }
        out.extend_from_slice(&raw[..size]);
        assert_eq!(&raw[size..size + 2], b"\r\n");
        raw = &raw[size + 2..];
    }
}

#[tokio::test]
async fn stream_chunks_are_flushed_as_they_are_produced() {
    within(async {
        // Eight tokens 100 ms apart: the server needs at least 0.7 s after the first token
        // before it can send [DONE], so a server that flushes per chunk cannot deliver the
        // whole stream in the read that brings the first token.
        let engine = start(EngineSimConfig { ttft: Duration::ZERO, tokens_per_s: 10.0, ..fast(&["m"]) }).await;
        let body = chat("m", "pace me", json!({"max_tokens": 8, "stream": true})).to_string();
        let mut socket = TcpStream::connect(engine.local_addr()).await.expect("connect");
        socket.set_nodelay(true).expect("nodelay");
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(head.as_bytes()).await.expect("send request");

        let mut raw = Vec::new();
        let mut first_token_read = None;
        let mut done_read = None;
        let mut buf = [0u8; 16 * 1024];
        for read in 0.. {
            let n = socket.read(&mut buf).await.expect("read");
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&buf[..n]);
            let so_far = String::from_utf8_lossy(&raw);
            if first_token_read.is_none() && so_far.matches("\"content\":\"").count() >= 2 {
                first_token_read = Some(read);
            }
            if done_read.is_none() && so_far.contains("[DONE]") {
                done_read = Some(read);
            }
        }
        let (first, done) = (first_token_read.expect("a token arrived"), done_read.expect("[DONE] arrived"));
        assert!(first < done, "the first token and [DONE] arrived in the same read ({first})");

        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("end of headers");
        let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(head.contains("content-type: text/event-stream"), "{head}");
        assert!(head.contains("transfer-encoding: chunked"), "{head}");
        let body = String::from_utf8(dechunk(&raw[split + 4..])).expect("UTF-8 body");
        let chunks = json_chunks(&body);
        assert_eq!(chunks.len(), 1 + 8 + 1, "role, 8 tokens, finish");
    })
    .await;
}

#[tokio::test]
async fn completions_stream_and_non_stream_agree() {
    within(async {
        let engine = start(fast(&["m"])).await;
        let addr = engine.local_addr();
        let request = json!({"model": "m", "prompt": "Once upon a time", "max_tokens": 6});
        let (status, whole) = post(addr, "/v1/completions", request.clone()).await;
        assert_eq!(status, StatusCode::OK, "{whole}");
        assert_eq!(whole["object"], "text_completion");
        assert!(whole["id"].as_str().is_some_and(|id| id.starts_with("cmpl-")));
        assert_eq!(whole["choices"][0]["finish_reason"], "length");
        assert_eq!(whole["usage"]["completion_tokens"], 6);
        let text = whole["choices"][0]["text"].as_str().expect("text");

        let mut streaming = request.clone();
        streaming["stream"] = json!(true);
        let (content_type, body) = stream_text(addr, "/v1/completions", streaming).await;
        assert_eq!(content_type, "text/event-stream");
        let chunks = json_chunks(&body);
        assert_eq!(chunks.len(), 6 + 1, "6 tokens and a finish chunk");
        assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
        let streamed: String =
            chunks[..6].iter().map(|c| c["choices"][0]["text"].as_str().expect("text").to_owned()).collect();
        assert_eq!(streamed, text);
        assert_eq!(chunks[6]["choices"][0]["finish_reason"], "length");
    })
    .await;
}

fn unbase64(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut held = 0;
    let mut out = Vec::new();
    for c in text.bytes().take_while(|&c| c != b'=') {
        let v = ALPHABET.iter().position(|&a| a == c).expect("base64 character") as u32;
        bits = (bits << 6) | v;
        held += 6;
        if held >= 8 {
            held -= 8;
            out.push((bits >> held) as u8);
        }
    }
    out
}

#[tokio::test]
async fn embeddings_are_deterministic_unit_vectors() {
    within(async {
        let engine = start(EngineSimConfig { embedding_dim: 32, ..fast(&["embedder"]) }).await;
        let addr = engine.local_addr();
        // The server sends f32 components; compare them as f32.
        let vector = |body: &Value, i: usize| -> Vec<f32> {
            body["data"][i]["embedding"]
                .as_array()
                .expect("float vector")
                .iter()
                .filter_map(Value::as_f64)
                .map(|x| x as f32)
                .collect()
        };

        let (status, single) = post(addr, "/v1/embeddings", json!({"model": "embedder", "input": "hello"})).await;
        assert_eq!(status, StatusCode::OK, "{single}");
        assert_eq!(single["object"], "list");
        assert_eq!(single["model"], "embedder");
        assert_eq!(single["data"][0]["object"], "embedding");
        assert_eq!(single["data"][0]["index"], 0);
        let hello = vector(&single, 0);
        assert_eq!(hello.len(), 32);
        let norm = hello.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
        let tokens = single["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
        assert!(tokens > 0);
        assert_eq!(single["usage"]["total_tokens"].as_u64(), Some(tokens));

        let (_, batch) =
            post(addr, "/v1/embeddings", json!({"model": "embedder", "input": ["hello", "world", "hello"]})).await;
        let indices: Vec<u64> =
            batch["data"].as_array().expect("data").iter().filter_map(|d| d["index"].as_u64()).collect();
        assert_eq!(indices, [0, 1, 2]);
        assert_eq!(vector(&batch, 0), hello);
        assert_eq!(vector(&batch, 2), hello);
        assert_ne!(vector(&batch, 1), hello);

        // What the official SDK asks for by default: base64 of little-endian f32.
        let (_, encoded) =
            post(addr, "/v1/embeddings", json!({"model": "embedder", "input": "hello", "encoding_format": "base64"}))
                .await;
        let bytes = unbase64(encoded["data"][0]["embedding"].as_str().expect("base64 string"));
        let decoded: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_eq!(decoded, hello);

        let (_, narrow) =
            post(addr, "/v1/embeddings", json!({"model": "embedder", "input": "hello", "dimensions": 8})).await;
        assert_eq!(vector(&narrow, 0).len(), 8);
    })
    .await;
}

/// A request that must fail, and how.
struct ErrorCase {
    method: &'static str,
    path: &'static str,
    body: String,
    status: u16,
    param: Option<&'static str>,
    code: Option<&'static str>,
}

fn fails(method: &'static str, path: &'static str, body: impl ToString, status: u16) -> ErrorCase {
    ErrorCase { method, path, body: body.to_string(), status, param: None, code: None }
}

impl ErrorCase {
    fn param(self, param: &'static str) -> Self {
        Self { param: Some(param), ..self }
    }

    fn code(self, code: &'static str) -> Self {
        Self { code: Some(code), ..self }
    }
}

#[tokio::test]
async fn errors_use_the_openai_shape() {
    within(async {
        let engine = start(fast(&["alpha", "beta"])).await;
        let addr = engine.local_addr();
        const CHAT: &str = "/v1/chat/completions";
        let user = json!([{"role": "user", "content": "x"}]);
        let chat_with = |extra: Value| {
            let mut body = json!({"model": "alpha", "messages": user});
            if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
                body.extend(extra.clone());
            }
            body
        };
        let cases = [
            fails("POST", CHAT, "{not json", 400),
            fails("POST", CHAT, "", 400),
            fails("POST", CHAT, chat_with(json!({"model": "gamma"})), 404).param("model").code("model_not_found"),
            fails("POST", CHAT, json!({"model": "alpha"}), 400).param("messages"),
            fails("POST", CHAT, json!({"messages": user}), 400).param("model"),
            fails("POST", CHAT, chat_with(json!({"n": 2})), 400).param("n"),
            fails("POST", CHAT, chat_with(json!({"max_tokens": 0})), 400).param("max_tokens"),
            fails("POST", CHAT, chat_with(json!({"max_tokens": 999_999})), 400).param("max_tokens"),
            fails("POST", CHAT, chat_with(json!({"max_tokens": "ten"})), 400),
            fails("POST", "/v1/completions", json!({"model": "alpha"}), 400).param("prompt"),
            fails("POST", "/v1/completions", json!({"model": "nope", "prompt": "p"}), 404)
                .param("model")
                .code("model_not_found"),
            fails("POST", "/v1/embeddings", json!({"model": "alpha"}), 400).param("input"),
            fails("POST", "/v1/embeddings", json!({"model": "nope", "input": "x"}), 404)
                .param("model")
                .code("model_not_found"),
            fails("GET", "/v1/nothing", "", 404).code("unknown_url"),
            fails("GET", CHAT, "", 405).code("method_not_allowed"),
            fails("POST", "/v1/models", "", 405).code("method_not_allowed"),
        ];
        for case in cases {
            let (status, headers, error) = call(addr, case.method, case.path, &case.body).await;
            let what = format!("{} {} {}", case.method, case.path, case.body);
            assert_eq!(status.as_u16(), case.status, "{what}: {error}");
            assert_error_shape(&error);
            assert_eq!(error["error"]["param"].as_str(), case.param, "{what}: {error}");
            assert_eq!(error["error"]["code"].as_str(), case.code, "{what}: {error}");
            assert_eq!(error["error"]["type"], "invalid_request_error", "{what}");
            if case.code == Some("model_not_found") {
                let message = error["error"]["message"].as_str().unwrap_or_default();
                assert!(message.contains("alpha, beta"), "names the served models: {message}");
            }
            if case.status == 405 {
                let allow = if case.method == "GET" { "POST" } else { "GET" };
                let got = headers.get(ALLOW).and_then(|v| v.to_str().ok());
                assert_eq!(got, Some(allow), "{what}");
            }
        }
        assert_eq!(engine.stats().completed, 0);
        assert_eq!(engine.stats().in_flight, 0);
    })
    .await;
}

#[tokio::test]
async fn http_500_fault_answers_an_openai_server_error() {
    within(async {
        let engine = start(EngineSimConfig { fail_rate: 1.0, fail_mode: FailMode::Http500, ..fast(&["m"]) }).await;
        let addr = engine.local_addr();
        let (status, error) = post(addr, "/v1/chat/completions", chat("m", "x", json!({"stream": true}))).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_error_shape(&error);
        assert_eq!(error["error"]["type"], "server_error");
        let (status, _) = post(addr, "/v1/embeddings", json!({"model": "m", "input": "x"})).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        // Probes and malformed requests are not faulted.
        assert_eq!(get(addr, "/health").await.0, StatusCode::OK);
        assert_eq!(get(addr, "/v1/models").await.0, StatusCode::OK);
        let (status, _) = post(addr, "/v1/chat/completions", json!({"model": "m"})).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(engine.stats().faults_injected, 2);
    })
    .await;
}

#[tokio::test]
async fn drop_fault_closes_the_connection_without_an_answer() {
    within(async {
        let engine = start(EngineSimConfig { fail_rate: 1.0, fail_mode: FailMode::Drop, ..fast(&["m"]) }).await;
        let addr = engine.local_addr();
        for path in ["/v1/chat/completions", "/v1/completions"] {
            let mut sender = connect(addr).await;
            let body = json!({"model": "m", "prompt": "x", "messages": [{"role": "user", "content": "x"}]});
            let result = send_on(&mut sender, addr, "POST", path, &body.to_string()).await;
            let error = result.expect_err("the connection must close without a response");
            assert!(error.is_incomplete_message() || error.is_closed(), "{path}: {error}");
        }
        assert_eq!(get(addr, "/health").await.0, StatusCode::OK);
        assert_eq!(engine.stats().faults_injected, 2);
    })
    .await;
}

#[tokio::test]
async fn mid_stream_fault_cuts_the_stream_before_done() {
    within(async {
        let engine = start(EngineSimConfig { fail_rate: 1.0, fail_mode: FailMode::MidStream, ..fast(&["m"]) }).await;
        let addr = engine.local_addr();
        let mut sender = connect(addr).await;
        let body = chat("m", "x", json!({"max_tokens": 10, "stream": true})).to_string();
        let response = send_on(&mut sender, addr, "POST", "/v1/chat/completions", &body).await.expect("headers arrive");
        assert_eq!(response.status(), StatusCode::OK);
        let mut body = response.into_body();
        let mut received = Vec::new();
        let error = loop {
            match body.frame().await {
                Some(Ok(frame)) => received.extend_from_slice(frame.data_ref().map_or(&[][..], |d| &d[..])),
                Some(Err(e)) => break Some(e),
                None => break None,
            }
        };
        assert!(error.is_some(), "the stream must end in an error, not cleanly");
        let text = String::from_utf8_lossy(&received);
        let events = sse_events(&text);
        assert!(!events.iter().any(|e| e == "[DONE]"), "{text}");
        assert_eq!(events.len(), 3, "role and two tokens before the cut: {text}");

        let (status, error) = post(addr, "/v1/chat/completions", chat("m", "x", json!({}))).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "non-stream requests fail with 500");
        assert_error_shape(&error);
        wait_for(&engine, "the cut stream leaving in_flight", |s| s.in_flight == 0).await;
        assert_eq!(engine.stats().client_disconnects, 0, "a cut is not a client disconnect");
    })
    .await;
}

#[tokio::test]
async fn faults_follow_the_seed() {
    within(async {
        let pattern = |seed: u64| async move {
            let engine = start(EngineSimConfig { fail_rate: 0.5, seed, ..fast(&["m"]) }).await;
            let mut statuses = Vec::new();
            for _ in 0..16 {
                statuses.push(
                    post(engine.local_addr(), "/v1/chat/completions", chat("m", "x", json!({"max_tokens": 1})))
                        .await
                        .0
                        .as_u16(),
                );
            }
            statuses
        };
        let first = pattern(42).await;
        assert!(first.contains(&200) && first.contains(&500), "{first:?}");
        assert_eq!(pattern(42).await, first, "same seed, same faults");
        assert_ne!(pattern(7).await, first, "another seed, other faults");
    })
    .await;
}

#[tokio::test]
async fn startup_delay_answers_503_until_ready() {
    within(async {
        let engine = start(EngineSimConfig { startup_delay: Duration::from_millis(1500), ..fast(&["m"]) }).await;
        let addr = engine.local_addr();
        for path in ["/health", "/v1/models"] {
            let (status, error) = get(addr, path).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
            assert_error_shape(&error);
            assert_eq!(error["error"]["code"], "engine_loading");
        }
        let (status, _) = post(addr, "/v1/chat/completions", chat("m", "x", json!({}))).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

        let mut ready = false;
        for _ in 0..600 {
            if get(addr, "/health").await.0 == StatusCode::OK {
                ready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(ready, "the engine never became ready");
        assert_eq!(get(addr, "/v1/models").await.0, StatusCode::OK);
    })
    .await;
}

#[tokio::test]
async fn a_client_leaving_mid_stream_does_not_disturb_another() {
    within(async {
        let engine =
            start(EngineSimConfig { ttft: Duration::from_millis(1), tokens_per_s: 50.0, ..fast(&["m"]) }).await;
        let addr = engine.local_addr();

        // A: a long stream whose client hangs up after the first token.
        let long = chat("m", "a long story", json!({"max_tokens": 1000, "stream": true})).to_string();
        let mut leaver = TcpStream::connect(addr).await.expect("connect");
        leaver
            .write_all(
                format!(
                    "POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Length: {}\r\n\r\n{long}",
                    long.len()
                )
                .as_bytes(),
            )
            .await
            .expect("send");

        // B: a short stream running at the same time.
        let stayer = tokio::spawn(async move {
            stream_text(
                addr,
                "/v1/chat/completions",
                chat("m", "a short one", json!({"max_tokens": 8, "stream": true})),
            )
            .await
        });

        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while String::from_utf8_lossy(&seen).matches("\"content\":\"").count() < 2 {
            let n = leaver.read(&mut buf).await.expect("read");
            assert!(n > 0, "stream ended early");
            seen.extend_from_slice(&buf[..n]);
        }
        drop(leaver);

        let (_, text) = stayer.await.expect("B's task");
        let chunks = json_chunks(&text);
        assert_eq!(chunks.len(), 1 + 8 + 1, "B got every chunk");
        let streamed: String =
            chunks[1..9].iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
        let (_, whole) = post(addr, "/v1/chat/completions", chat("m", "a short one", json!({"max_tokens": 8}))).await;
        assert_eq!(whole["choices"][0]["message"]["content"].as_str(), Some(streamed.as_str()));

        wait_for(&engine, "the abandoned stream ending", |s| s.in_flight == 0).await;
        let stats = engine.stats();
        assert_eq!(stats.client_disconnects, 1);
        assert_eq!(stats.completed, 2);
        // A stopped early: it sent fewer tokens than its whole answer holds.
        let sent_to_a = stats.tokens_generated - 8 - 8;
        let (_, whole_a) =
            post(addr, "/v1/chat/completions", chat("m", "a long story", json!({"max_tokens": 1000}))).await;
        let answer_a = whole_a["usage"]["completion_tokens"].as_u64().expect("completion_tokens");
        assert!(sent_to_a < answer_a, "A sent {sent_to_a} of {answer_a} tokens");
    })
    .await;
}

#[tokio::test]
async fn shutdown_lets_a_running_stream_finish() {
    within(async {
        let engine =
            start(EngineSimConfig { ttft: Duration::from_millis(1), tokens_per_s: 100.0, ..fast(&["m"]) }).await;
        let addr = engine.local_addr();
        let mut sender = connect(addr).await;
        let body = chat("m", "x", json!({"max_tokens": 10, "stream": true})).to_string();
        let response = send_on(&mut sender, addr, "POST", "/v1/chat/completions", &body).await.expect("response");
        let mut body = response.into_body();
        let first = body.frame().await.expect("a first chunk").expect("no error");
        assert!(first.is_data());

        let stopping = tokio::spawn(engine.shutdown());
        let rest = body.collect().await.expect("the stream finishes during shutdown").to_bytes();
        assert!(String::from_utf8_lossy(&rest).ends_with("data: [DONE]\n\n"));
        stopping.await.expect("shutdown task").expect("clean shutdown");
        assert!(TcpStream::connect(addr).await.is_err(), "a stopped engine no longer listens");
    })
    .await;
}

#[tokio::test]
async fn invalid_settings_are_refused_before_listening() {
    let refused = |config: EngineSimConfig| async move {
        match engine_sim::spawn(config, "127.0.0.1:0".parse().expect("address")).await {
            Err(EngineSimError::InvalidConfig(message)) => message,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    };
    assert!(refused(EngineSimConfig { models: vec![], ..fast(&[]) }).await.contains("--model"));
    assert!(refused(EngineSimConfig { fail_rate: 1.5, ..fast(&["m"]) }).await.contains("fail rate"));
    assert!(refused(EngineSimConfig { tokens_per_s: 0.0, ..fast(&["m"]) }).await.contains("tokens per second"));
    assert!(refused(fast(&["m", "m"])).await.contains("twice"));
    let huge_cache = EngineSimConfig { kv_cache_tokens: 1 << 40, ..fast(&["m"]) };
    assert!(refused(huge_cache).await.contains("KV cache"));
    let slow_prefill = EngineSimConfig { prefill_per_token: Duration::from_secs(2), ..fast(&["m"]) };
    assert!(refused(slow_prefill).await.contains("prefill"));
}

#[cfg(unix)]
#[tokio::test]
async fn the_binary_prints_its_address_and_stops_on_sigterm() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    within(async {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tela"))
            .args(["engine-sim", "--port", "0", "--model", "cli-model", "--ttft-ms", "0", "--log", "warn"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start tela");
        let stdout = child.stdout.take().expect("stdout");
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufReader::new(stdout).read_line(&mut line).map(|_| line)
        })
        .await
        .expect("reader task")
        .expect("first line");
        let addr: SocketAddr = line
            .trim()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .expect("socket address");
        let (status, models) = get(addr, "/v1/models").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(models["data"][0]["id"], "cli-model");

        let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
        assert!(killed.success());
        for _ in 0..600 {
            if let Some(status) = child.try_wait().expect("wait") {
                assert!(status.success(), "tela exited with {status}");
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = child.kill();
        panic!("tela did not stop on SIGTERM");
    })
    .await;
}

/// One sample of the Prometheus text format.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

impl Sample {
    fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `name="value",…` with the format's escapes; panics on malformed input.
fn parse_labels(mut text: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    while !text.is_empty() {
        let (name, rest) = text.split_once("=\"").unwrap_or_else(|| panic!("label without =\": {text:?}"));
        assert!(is_metric_name(name) && !name.contains(':'), "bad label name {name:?}");
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    other => panic!("bad escape {other:?} in {rest:?}"),
                },
                Some((at, '"')) => break at,
                Some((_, c)) => value.push(c),
                None => panic!("unterminated label value in {rest:?}"),
            }
        };
        labels.push((name.to_owned(), value));
        text = &rest[end + 1..];
        text = text.strip_prefix(',').unwrap_or(text);
    }
    labels
}

/// Parses the Prometheus text format (version 0.0.4) strictly: `# HELP` and `# TYPE` lines,
/// samples `name{labels} value`, every sample after the `# TYPE` of its family (a histogram's
/// `_bucket`, `_count` and `_sum` belong to it). Panics on anything else.
fn parse_prometheus(text: &str) -> Vec<Sample> {
    let mut family: Option<(String, String)> = None;
    let mut samples = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(comment) = line.strip_prefix("# ") {
            let mut parts = comment.splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("TYPE"), Some(name), Some(kind)) => {
                    assert!(is_metric_name(name), "bad metric name in {line:?}");
                    assert!(["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind), "{line:?}");
                    family = Some((name.to_owned(), kind.to_owned()));
                }
                (Some("HELP"), Some(name), _) => assert!(is_metric_name(name), "bad metric name in {line:?}"),
                _ => {}
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("sample without a value: {line:?}"));
        let value: f64 = value.parse().unwrap_or_else(|e| panic!("bad value in {line:?}: {e}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => {
                (name, parse_labels(labels.strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels: {line:?}"))))
            }
            None => (series, Vec::new()),
        };
        assert!(is_metric_name(name), "bad metric name in {line:?}");
        let (family, kind) = family.as_ref().unwrap_or_else(|| panic!("sample before any # TYPE: {line:?}"));
        let belongs = name == family
            || (kind == "histogram"
                && ["_bucket", "_count", "_sum"].iter().any(|s| name.strip_suffix(s) == Some(family.as_str())));
        assert!(belongs, "{line:?} is outside its family {family}");
        samples.push(Sample { name: name.to_owned(), labels, value });
    }
    samples
}

/// `GET /metrics`, parsed; asserts the Prometheus content type.
async fn metrics(addr: SocketAddr) -> Vec<Sample> {
    let mut sender = connect(addr).await;
    let response = send_on(&mut sender, addr, "GET", "/metrics", "").await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    let bytes = response.into_body().collect().await.expect("whole body").to_bytes();
    parse_prometheus(std::str::from_utf8(&bytes).expect("UTF-8 metrics"))
}

/// The value of `name` (with `le` for a histogram bucket) for `model`.
fn metric(samples: &[Sample], name: &str, model: &str, le: Option<&str>) -> f64 {
    samples
        .iter()
        .find(|s| s.name == name && s.label("model_name") == Some(model) && s.label("le") == le)
        .unwrap_or_else(|| panic!("no {name} for model {model} (le {le:?}) in {samples:?}"))
        .value
}

fn usage_tokens(body: &Value) -> (u64, u64) {
    let usage = &body["usage"];
    let prompt = usage["prompt_tokens"].as_u64().unwrap_or_else(|| panic!("no prompt_tokens: {body}"));
    let cached =
        usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or_else(|| panic!("no cached_tokens: {body}"));
    (prompt, cached)
}

#[tokio::test]
async fn a_conversations_next_turn_hits_the_prefix_cache() {
    within(async {
        let engine = start(EngineSimConfig {
            ttft: Duration::from_millis(1),
            prefill_per_token: Duration::from_micros(200),
            kv_cache_tokens: 65_536,
            ..fast(&["m", "other"])
        })
        .await;
        let addr = engine.local_addr();
        // About 2,000 tokens of system prompt: 0.4 s of prefill when uncached.
        let system = "You are the assistant of a federation of GPU nodes. ".repeat(160);
        let turn = |messages: Value| json!({"model": "m", "messages": messages, "max_tokens": 8});

        let first = json!([{"role": "system", "content": system}, {"role": "user", "content": "What is a lattice?"}]);
        let (status, one) = post(addr, "/v1/chat/completions", turn(first.clone())).await;
        assert_eq!(status, StatusCode::OK, "{one}");
        let (p1, cached1) = usage_tokens(&one);
        assert!(p1 > 2_000, "{one}");
        assert_eq!(cached1, 0, "a cold engine has nothing cached");

        // The next turn resends the conversation so far: all of it but the last block is cached.
        let mut second = first.as_array().cloned().unwrap_or_default();
        second.push(json!({"role": "assistant", "content": one["choices"][0]["message"]["content"]}));
        second.push(json!({"role": "user", "content": "And a join?"}));
        let (_, two) = post(addr, "/v1/chat/completions", turn(Value::Array(second.clone()))).await;
        let (p2, cached2) = usage_tokens(&two);
        assert!(cached2 >= p1 - 16 && cached2 < p2, "turn 2: {cached2} of {p2} cached after a {p1}-token turn 1");

        // Another conversation diverges in its first block: nothing is cached. Nor does another
        // model share the first one's blocks.
        let other = json!([{"role": "system", "content": system.replace("You are", "Thou art")},
                            {"role": "user", "content": "What is a lattice?"}]);
        let (_, three) = post(addr, "/v1/chat/completions", turn(other)).await;
        let (p3, cached3) = usage_tokens(&three);
        assert_eq!(cached3, 0);
        let (_, four) =
            post(addr, "/v1/chat/completions", json!({"model": "other", "messages": second, "max_tokens": 8})).await;
        let (p4, cached4) = usage_tokens(&four);
        assert_eq!(cached4, 0, "models do not share blocks");

        // The engine's own accounting, as a gateway polling it would read it.
        let samples = metrics(addr).await;
        assert_eq!(metric(&samples, "vllm:prefix_cache_hits_total", "m", None), cached2 as f64);
        assert_eq!(metric(&samples, "vllm:prefix_cache_queries_total", "m", None), (p1 + p2 + p3) as f64);
        assert_eq!(metric(&samples, "vllm:prompt_tokens_total", "m", None), (p1 + p2 + p3) as f64);
        assert_eq!(metric(&samples, "vllm:prefix_cache_queries_total", "other", None), p4 as f64);
        assert_eq!(metric(&samples, "vllm:prefix_cache_hits_total", "other", None), 0.0);
        // Simulated times to first token: the cached turn is under 40 ms, both cold prompts
        // over 250 ms (about 0.4 s each).
        let ttft = "vllm:time_to_first_token_seconds_bucket";
        assert_eq!(metric(&samples, ttft, "m", Some("0.04")), 1.0);
        assert_eq!(metric(&samples, ttft, "m", Some("0.25")), 1.0);
        assert_eq!(metric(&samples, ttft, "m", Some("+Inf")), 3.0);
        let stats = engine.stats();
        assert_eq!(stats.cached_prompt_tokens, cached2);
        assert_eq!(stats.prompt_tokens, p1 + p2 + p3 + p4);
    })
    .await;
}

#[tokio::test]
async fn metrics_use_vllm_names_and_count_waiting_requests() {
    within(async {
        let engine = start(EngineSimConfig { max_num_seqs: 1, tokens_per_s: 20.0, ..fast(&["m", "other"]) }).await;
        let addr = engine.local_addr();

        let samples = metrics(addr).await;
        for name in [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:gpu_cache_usage_perc",
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
            "vllm:gpu_prefix_cache_hit_rate",
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
            "vllm:time_to_first_token_seconds_count",
        ] {
            for model in ["m", "other"] {
                assert_eq!(metric(&samples, name, model, None), 0.0, "{name} of an idle engine");
            }
        }
        let info = samples.iter().find(|s| s.name == "vllm:cache_config_info").expect("cache_config_info");
        assert_eq!(info.label("block_size"), Some("16"));
        assert_eq!(info.label("num_gpu_blocks"), Some("4096"), "65,536 tokens in blocks of 16");

        // A long stream holds the only slot; the next request waits for it.
        let mut sender = connect(addr).await;
        let long = chat("m", "a long story", json!({"max_tokens": 1000, "stream": true})).to_string();
        let response = send_on(&mut sender, addr, "POST", "/v1/chat/completions", &long).await.expect("headers");
        let mut body = response.into_body();
        body.frame().await.expect("a first chunk").expect("no error");
        let waiter =
            tokio::spawn(async move { post(addr, "/v1/chat/completions", chat("m", "short", json!({}))).await });
        wait_for(&engine, "the second request waiting", |s| s.waiting == 1).await;
        let samples = metrics(addr).await;
        assert_eq!(metric(&samples, "vllm:num_requests_running", "m", None), 1.0);
        assert_eq!(metric(&samples, "vllm:num_requests_waiting", "m", None), 1.0);
        assert_eq!(metric(&samples, "vllm:num_requests_waiting", "other", None), 0.0);
        let usage = metric(&samples, "vllm:kv_cache_usage_perc", "m", None);
        assert!(usage > 0.0 && usage <= 1.0, "{usage}");

        // The stream's client leaves: its slot goes to the waiting request.
        drop(body);
        drop(sender);
        let (status, answer) = waiter.await.expect("waiting request's task");
        assert_eq!(status, StatusCode::OK, "{answer}");
        wait_for(&engine, "both requests ending", |s| s.running == 0 && s.waiting == 0).await;
        let samples = metrics(addr).await;
        assert_eq!(metric(&samples, "vllm:num_requests_running", "m", None), 0.0);
        assert_eq!(metric(&samples, "vllm:kv_cache_usage_perc", "m", None), 0.0);
        assert!(metric(&samples, "vllm:generation_tokens_total", "m", None) >= 2.0);
    })
    .await;
}

#[test]
fn help_lists_the_engine_model_flags() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tela"))
        .args(["engine-sim", "--help"])
        .output()
        .expect("run tela engine-sim --help");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in ["--kv-cache-tokens", "--prefill-us-per-token", "--max-num-seqs", "--ttft-ms", "--tokens-per-s"] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}
