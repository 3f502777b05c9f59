//! Every OpenAI route that names a model is forwarded unchanged, not only chat, completions and
//! embeddings: Responses, audio transcriptions (a multipart form), image generation and rerank
//! reach a node that serves the model and come back in OpenAI's shape; a form with no model or
//! an unknown one gets the same errors a JSON request does.

use crate::common;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

const BOUNDARY: &str = "tela-test-boundary-7d1f";

/// A `multipart/form-data` body of text fields and one file.
fn form(fields: &[(&str, &str)], file: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, value) in fields {
        body.extend_from_slice(
            format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").as_bytes(),
        );
    }
    body.extend_from_slice(
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"talk.wav\"\r\n\
             Content-Type: audio/wav\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(file);
    body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    body
}

/// `POST path` with a multipart body; the status and the body as text.
async fn post_form(addr: std::net::SocketAddr, path: &str, body: Vec<u8>) -> (u16, String) {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("handshake");
    tokio::spawn(conn);
    let req = hyper::Request::post(path)
        .header("host", addr.to_string())
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", format!("multipart/form-data; boundary={BOUNDARY}"))
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    let response = sender.send_request(req).await.expect("response");
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_audio_images_and_rerank_are_forwarded_to_a_node_serving_the_model() {
    within(90, async {
        let fed = Fed::start(Options::default()).await;
        let base = fed.base();

        let reply =
            post(&base, "/v1/responses", json!({"model": MODEL, "input": "Say hello", "max_output_tokens": 8})).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let v = reply.json();
        assert_eq!(v["object"], "response");
        assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
        assert!(fed.node_index(&reply.header("x-tela-node").expect("x-tela-node")).is_some());

        let reply =
            post(&base, "/v1/images/generations", json!({"model": MODEL, "prompt": "a lighthouse", "n": 2})).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["data"].as_array().map(Vec::len), Some(2));

        let reply = post(
            &base,
            "/v1/rerank",
            json!({"model": MODEL, "query": "gpu", "documents": ["a gpu", "a cat", "a gpu cluster"], "top_n": 2}),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let results = reply.json()["results"].as_array().cloned().unwrap_or_default();
        assert_eq!(results.len(), 2, "{}", reply.text());
        assert!(results[0]["relevance_score"].as_f64() >= results[1]["relevance_score"].as_f64());

        // A form: the gateway reads its model field and forwards the bytes unchanged, so the
        // transcript is the one the engine gives the same form directly.
        let addr = fed.gateway.local_addr();
        let audio: Vec<u8> = (0u32..4096).map(|i| (i * 7 % 251) as u8).collect();
        let body = form(&[("model", MODEL)], &audio);
        let (status, text) = post_form(addr, "/v1/audio/transcriptions", body.clone()).await;
        assert_eq!(status, 200, "{text}");
        let via_gateway: Value = serde_json::from_str(&text).expect("json");
        let (status, direct) = post_form(fed.engines[0].local_addr(), "/v1/audio/transcriptions", body).await;
        assert_eq!(status, 200, "{direct}");
        let direct: Value = serde_json::from_str(&direct).expect("json");
        assert!(via_gateway["text"].as_str().is_some_and(|t| !t.is_empty()));
        assert_eq!(via_gateway["text"], direct["text"]);

        // The form's errors are the JSON requests' errors.
        let (status, text) = post_form(addr, "/v1/audio/transcriptions", form(&[], &audio)).await;
        assert_eq!(status, 400, "{text}");
        let error: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(error["error"]["param"], "model", "{text}");
        let (status, text) =
            post_form(addr, "/v1/audio/transcriptions", form(&[("model", "nobody-serves-this")], &audio)).await;
        assert_eq!(status, 404, "{text}");
        let (status, text) = post_form(addr, "/v1/audio/transcriptions", b"not a form".to_vec()).await;
        assert_eq!(status, 400, "{text}");
        assert!(text.contains("\"error\""), "{text}");

        // A route nobody's engine has is the engine's 404, forwarded; a GET that names no
        // model is the gateway's.
        let reply = post(&base, "/v1/audio/speech", json!({"model": MODEL, "input": "hi", "voice": "alloy"})).await;
        assert_eq!(reply.status, 404, "{}", reply.text());
        let reply = call(&base, "GET", "/v1/responses/resp_1", Some(KEY), None).await;
        assert_eq!(reply.status, 404, "{}", reply.text());
    })
    .await;
}
