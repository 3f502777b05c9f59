//! The Batch API: a JSONL file uploaded with `POST /v1/files` becomes a batch whose every good
//! line is answered once in the output file, in OpenAI's format (custom_id kept), whose bad
//! lines (malformed, unknown model, wrong url) are each in the error file with a code, with
//! request counts, listing with `limit`/`after`, cancellation and expiry (what was done kept,
//! the rest in the error file), a size cap, and another key
//! seeing none of it (404); batch usage lands in the usage ledger marked with the batch. A
//! `tela gateway` killed with SIGKILL mid-batch and started again on the same database resumes
//! the batch, and the output has every custom_id exactly once; a node killed mid-batch is a
//! retry on the other; a node whose interactive requests fill its batch slots gets no batch
//! request until they end. The official OpenAI SDK's
//! `files.create`, `batches.create`, `batches.retrieve` and `files.content` work end to end.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tela_gateway::auth::key_line;
use tela_gateway::batch::BatchConfig;
use tela_gateway::gateway::Gateway;
use tela_gateway::ledger::LedgerConfig;

/// A second key, which must see none of the first key's files and batches.
const OTHER: &str = "batch-other-key-0123456789";

/// The input files' size cap in the in-process federation.
const MAX_FILE: usize = 64 * 1024;

fn key_file(dir: &Path) -> PathBuf {
    let path = dir.join("api-keys");
    let text = format!("{} name=batcher account=proj-b\n{} name=other\n", key_line(KEY), key_line(OTHER));
    std::fs::write(&path, text).expect("write the key file");
    path
}

/// `POST /v1/files` with a multipart form: `purpose` and the file `content`.
pub(crate) async fn upload(base: &str, key: &str, purpose: &str, content: &[u8]) -> Reply {
    let boundary = "tela-test-boundary-7f3a";
    let mut body = Vec::new();
    body.extend_from_slice(
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n{purpose}\r\n").as_bytes(),
    );
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"input.jsonl\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let uri: hyper::Uri = format!("{base}/v1/files").parse().expect("uri");
    let addr = format!("{}:{}", uri.host().expect("host"), uri.port_u16().expect("port"));
    let stream = tokio::net::TcpStream::connect(&addr).await.expect("connect to the gateway");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("handshake");
    tokio::spawn(conn);
    let request = hyper::Request::builder()
        .method("POST")
        .uri("/v1/files")
        .header("host", addr)
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", format!("multipart/form-data; boundary={boundary}"))
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let (parts, body) = response.into_parts();
    let body = tokio::time::timeout(Duration::from_secs(30), body.collect())
        .await
        .expect("body within 30 s")
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    Reply { status: parts.status.as_u16(), headers: parts.headers, body }
}

pub(crate) fn chat_line(id: &str, model: &str, max_tokens: u32) -> String {
    json!({
        "custom_id": id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": format!("say {id}")}], "max_tokens": max_tokens},
    })
    .to_string()
}

/// Polls the batch until it is in a final status.
pub(crate) async fn wait_final(base: &str, key: &str, id: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let b = call(base, "GET", &format!("/v1/batches/{id}"), Some(key), None).await;
        assert_eq!(b.status, 200, "{}", b.text());
        let b = b.json();
        if ["completed", "failed", "expired", "cancelled"].contains(&b["status"].as_str().unwrap_or("")) {
            return b;
        }
        assert!(Instant::now() < deadline, "the batch did not end within {within:?}: {b:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The lines of a file's content as JSON.
pub(crate) async fn file_lines(base: &str, key: &str, id: &str) -> Vec<Value> {
    let r = call(base, "GET", &format!("/v1/files/{id}/content"), Some(key), None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.text().lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_answer_each_line_once_and_report_bad_lines_per_line() {
    within(120, async {
        let dir = tempfile::tempdir().expect("tempdir");
        key_file(dir.path());
        let db = dir.path().join("gateway.db");
        let mut config = gateway_config(dir.path());
        config.ledger = Some(LedgerConfig::new(db.clone(), 0));
        let mut batch = BatchConfig::new(db.clone());
        batch.max_file_bytes = MAX_FILE;
        config.batch = Some(batch);
        let gateway = Gateway::start(config).await.expect("gateway starts");
        let mut fed = Fed { gateway, nodes: Vec::new(), engines: Vec::new(), dir };
        fed.add_node(engine(&[MODEL]), &[]).await;
        fed.add_node(engine(&[MODEL]), &[]).await;
        fed.wait_routable(2).await;
        let base = fed.base();

        let mut lines: Vec<String> = (0..6).map(|i| chat_line(&format!("c{i}"), MODEL, 3)).collect();
        lines.insert(2, "{not json".into());
        lines.push(chat_line("unknown", "no-such-model", 3));
        lines.push(
            json!({"custom_id": "wrong-url", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": "x"}})
                .to_string(),
        );
        let file = upload(&base, KEY, "batch", lines.join("\n").as_bytes()).await;
        assert_eq!(file.status, 200, "{}", file.text());
        let file = file.json();
        assert_eq!((file["object"].as_str(), file["purpose"].as_str()), (Some("file"), Some("batch")));
        let file_id = file["id"].as_str().expect("file id").to_string();
        assert!(file_id.starts_with("file-"), "{file}");

        let created = post(
            &base,
            "/v1/batches",
            json!({"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h",
                   "metadata": {"job": "labels"}}),
        )
        .await;
        assert_eq!(created.status, 200, "{}", created.text());
        let created = created.json();
        assert_eq!(created["object"], "batch");
        assert_eq!(created["status"], "validating");
        assert_eq!(created["metadata"]["job"], "labels");
        let id = created["id"].as_str().expect("batch id").to_string();

        // Another key sees none of it, exactly as if it did not exist.
        for path in [
            format!("/v1/batches/{id}"),
            format!("/v1/files/{file_id}"),
            format!("/v1/files/{file_id}/content"),
        ] {
            let r = call(&base, "GET", &path, Some(OTHER), None).await;
            assert_eq!(r.status, 404, "{path}: {}", r.text());
            assert_eq!(r.json()["error"]["type"], "invalid_request_error", "{}", r.text());
        }
        let r = call(&base, "POST", &format!("/v1/batches/{id}/cancel"), Some(OTHER), None).await;
        assert_eq!(r.status, 404, "{}", r.text());
        let listed = call(&base, "GET", "/v1/batches", Some(OTHER), None).await.json();
        assert_eq!(listed["data"].as_array().map(Vec::len), Some(0), "{listed}");

        let done = wait_final(&base, KEY, &id, Duration::from_secs(60)).await;
        assert_eq!(done["status"], "completed", "{done:#}");
        assert_eq!(done["request_counts"], json!({"total": 9, "completed": 6, "failed": 3}), "{done:#}");
        for t in ["in_progress_at", "finalizing_at", "completed_at"] {
            assert!(done[t].as_i64().is_some(), "{t}: {done:#}");
        }
        let output = file_lines(&base, KEY, done["output_file_id"].as_str().expect("output file")).await;
        let mut ids: Vec<&str> = output.iter().map(|l| l["custom_id"].as_str().expect("custom_id")).collect();
        ids.sort();
        assert_eq!(ids, ["c0", "c1", "c2", "c3", "c4", "c5"], "each good line once");
        for l in &output {
            assert_eq!(l["response"]["status_code"], 200, "{l}");
            assert_eq!(l["error"], Value::Null, "{l}");
            assert_eq!(l["response"]["body"]["object"], "chat.completion", "{l}");
            assert_eq!(l["response"]["body"]["usage"]["completion_tokens"], 3, "{l}");
            assert!(l["id"].as_str().is_some_and(|i| i.starts_with("batch_req_")), "{l}");
        }
        let errors = file_lines(&base, KEY, done["error_file_id"].as_str().expect("error file")).await;
        let codes: Vec<(Value, Value)> = errors.iter().map(|l| (l["custom_id"].clone(), l["error"]["code"].clone())).collect();
        assert_eq!(
            codes,
            [
                (Value::Null, json!("invalid_json")),
                (json!("unknown"), json!("model_not_found")),
                (json!("wrong-url"), json!("invalid_url")),
            ],
            "{errors:#?}"
        );
        let r = call(&base, "POST", &format!("/v1/batches/{id}/cancel"), Some(KEY), None).await;
        assert_eq!(r.status, 400, "a completed batch cannot be cancelled: {}", r.text());

        // The ledger has one row per answered request, marked with the batch.
        let conn = tela_gateway::db::open_read_only(&db, 2).expect("the database opens");
        let (rows, tokens, key, account): (i64, i64, String, String) = conn
            .query_row(
                "SELECT COUNT(*), SUM(completion_tokens), MAX(key_name), MAX(account) FROM requests WHERE batch_id = ?1",
                [&id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .expect("ledger rows");
        assert_eq!((rows, tokens, key.as_str(), account.as_str()), (6, 18, "batcher", "proj-b"));
        drop(conn);
        let usage = Command::new(tela())
            .args(["usage", "--ledger", db.to_str().expect("utf-8"), "--by", "account,kind", "--format", "csv"])
            .output()
            .expect("run tela usage");
        let usage = String::from_utf8_lossy(&usage.stdout).into_owned();
        assert!(usage.lines().any(|l| l.starts_with("proj-b,batch,6,0,")), "tela usage splits batch use: {usage}");
        let metrics = call(&base, "GET", "/metrics", Some(KEY), None).await.text();
        assert!(
            metrics.contains(r#"tela_gateway_key_tokens_total{key="batcher",kind="completion"} 18"#),
            "batch tokens are counted per key: {metrics}"
        );

        // A second batch (embeddings), then listing pages newest first.
        let emb: Vec<String> = (0..3)
            .map(|i| {
                json!({"custom_id": format!("e{i}"), "method": "POST", "url": "/v1/embeddings",
                       "body": {"model": MODEL, "input": format!("text {i}")}})
                .to_string()
            })
            .collect();
        let file2 = upload(&base, KEY, "batch", emb.join("\n").as_bytes()).await.json();
        let second = post(
            &base,
            "/v1/batches",
            json!({"input_file_id": file2["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}),
        )
        .await
        .json();
        let second_id = second["id"].as_str().expect("id").to_string();
        let page = call(&base, "GET", "/v1/batches?limit=1", Some(KEY), None).await.json();
        assert_eq!(page["data"][0]["id"].as_str(), Some(second_id.as_str()), "{page:#}");
        assert_eq!(page["has_more"], true);
        let page = call(&base, "GET", &format!("/v1/batches?limit=5&after={second_id}"), Some(KEY), None).await.json();
        assert_eq!(page["data"][0]["id"].as_str(), Some(id.as_str()), "{page:#}");
        assert_eq!(page["has_more"], false);
        let done = wait_final(&base, KEY, &second_id, Duration::from_secs(60)).await;
        assert_eq!(done["request_counts"], json!({"total": 3, "completed": 3, "failed": 0}), "{done:#}");
        assert_eq!(done["error_file_id"], Value::Null, "no error file when nothing failed");
        let output = file_lines(&base, KEY, done["output_file_id"].as_str().expect("output file")).await;
        assert!(output.iter().all(|l| l["response"]["body"]["data"][0]["embedding"].is_array()), "{output:#?}");

        // Limits and bad requests, each in OpenAI's error shape.
        let big = vec![b'x'; MAX_FILE + 1];
        let r = upload(&base, KEY, "batch", &big).await;
        assert_eq!(r.status, 413, "{}", r.text());
        assert!(r.json()["error"]["message"].as_str().is_some_and(|m| m.contains("limit")), "{}", r.text());
        let r = upload(&base, KEY, "fine-tune", b"{}").await;
        assert_eq!((r.status, r.json()["error"]["param"].clone()), (400, json!("purpose")), "{}", r.text());
        let r = post(&base, "/v1/batches", json!({"input_file_id": file_id, "endpoint": "/v1/images", "completion_window": "24h"}))
            .await;
        assert_eq!((r.status, r.json()["error"]["param"].clone()), (400, json!("endpoint")), "{}", r.text());
        let r = post(&base, "/v1/batches", json!({"input_file_id": "file-nope", "endpoint": "/v1/embeddings"})).await;
        assert_eq!(r.status, 404, "{}", r.text());
        let empty = upload(&base, KEY, "batch", b"\n\n").await.json();
        let r = post(&base, "/v1/batches", json!({"input_file_id": empty["id"], "endpoint": "/v1/embeddings"})).await.json();
        let failed = wait_final(&base, KEY, r["id"].as_str().expect("id"), Duration::from_secs(10)).await;
        assert_eq!(failed["status"], "failed", "{failed:#}");
        assert_eq!(failed["errors"]["data"][0]["code"], "empty_file", "{failed:#}");
    })
    .await;
}

/// A `tela gateway` on fixed ports, with its database in `dir` (killed on drop).
fn gateway_process(dir: &Path, port: u16, anchor: u16) -> (ChildGuard, String) {
    use std::io::BufRead;
    let mut child = Command::new(tela())
        .args(["gateway", "--listen", &format!("127.0.0.1:{port}"), "--anchor-listen", &format!("127.0.0.1:{anchor}")])
        .args(["--identity", dir.join("gw.key").to_str().expect("utf-8")])
        .args(["--api-keys", dir.join("api-keys").to_str().expect("utf-8")])
        .args(["--ledger", dir.join("gateway.db").to_str().expect("utf-8")])
        .args(["--batch-node-slots", "3"])
        .env("TELA_JOIN_SECRET", SECRET)
        .env("RUST_LOG", "warn")
        .env_remove("TELA_JOIN")
        .env_remove("TELA_LEDGER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join(format!("gateway-{port}.log"))).expect("log"))
        .spawn()
        .expect("start tela gateway");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read the first line");
    let base = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected: {line}")).to_string();
    // The pipe stays open in a thread so that later lines never block the gateway.
    std::thread::spawn(move || {
        let mut sink = String::new();
        while stdout.read_line(&mut sink).is_ok_and(|n| n > 0) {
            sink.clear();
        }
    });
    (ChildGuard(child), base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_mid_batch_resumes_it_and_answers_each_line_once() {
    within(240, async {
        let dir = tempfile::tempdir().expect("tempdir");
        key_file(dir.path());
        // About 0.2 s per request, three at a time: the batch takes a few seconds.
        let engine =
            tela_gateway::engine_sim::spawn(paced(25.0), "127.0.0.1:0".parse().expect("addr")).await.expect("engine");
        let (port, anchor) = (free_port(), free_port());
        let (mut gw, base) = gateway_process(dir.path(), port, anchor);
        let _node = spawn_node(dir.path(), "n0", &[format!("127.0.0.1:{anchor}")], engine.local_addr(), &[]);
        assert!(wait_tunnels(&base, 1, Duration::from_secs(30)).await, "the node connects");

        const LINES: usize = 60;
        let lines: Vec<String> = (0..LINES).map(|i| chat_line(&format!("r{i}"), MODEL, 5)).collect();
        let file = upload(&base, KEY, "batch", lines.join("\n").as_bytes()).await;
        assert_eq!(file.status, 200, "{}", file.text());
        let created =
            post(&base, "/v1/batches", json!({"input_file_id": file.json()["id"], "endpoint": "/v1/chat/completions"}))
                .await;
        assert_eq!(created.status, 200, "{}", created.text());
        let id = created.json()["id"].as_str().expect("id").to_string();

        // Kill it once some lines are done and most are not.
        let deadline = Instant::now() + Duration::from_secs(60);
        let before = loop {
            let b = call(&base, "GET", &format!("/v1/batches/{id}"), Some(KEY), None).await.json();
            let completed = b["request_counts"]["completed"].as_u64().unwrap_or(0);
            if completed >= 6 {
                break completed;
            }
            assert!(Instant::now() < deadline, "the batch made no progress: {b:#}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let _ = gw.0.kill(); // SIGKILL, with requests in flight
        let _ = gw.0.wait();
        assert!((before as usize) < LINES, "killed before the end");
        let sent_before = engine.stats().requests;

        // The same database, ports and identity: the node comes back, the batch resumes.
        let (_gw, base) = gateway_process(dir.path(), port, anchor);
        let done = wait_final(&base, KEY, &id, Duration::from_secs(120)).await;
        assert_eq!(done["status"], "completed", "{done:#}");
        assert_eq!(done["request_counts"], json!({"total": LINES, "completed": LINES, "failed": 0}), "{done:#}");
        let output = file_lines(&base, KEY, done["output_file_id"].as_str().expect("output file")).await;
        assert_eq!(output.len(), LINES, "one line per request");
        let mut ids: Vec<String> =
            output.iter().map(|l| l["custom_id"].as_str().expect("custom_id").to_string()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), LINES, "every custom_id exactly once");
        assert!(engine.stats().requests > sent_before, "the restarted gateway sent the rest");
        let conn = tela_gateway::db::open_read_only(&dir.path().join("gateway.db"), 2).expect("opens");
        let rows: i64 = conn
            .query_row("SELECT COUNT(*) FROM requests WHERE batch_id = ?1", [&id], |r| r.get(0))
            .expect("ledger rows");
        assert_eq!(rows as usize, LINES, "one ledger row per line, none for requests cut by the kill");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_batch_is_a_retry_elsewhere() {
    within(120, async {
        let dir = tempfile::tempdir().expect("tempdir");
        key_file(dir.path());
        let db = dir.path().join("gateway.db");
        let mut config = gateway_config(dir.path());
        config.ledger = Some(LedgerConfig::new(db.clone(), 0));
        config.batch = Some(BatchConfig::new(db));
        let gateway = Gateway::start(config).await.expect("gateway starts");
        let mut fed = Fed { gateway, nodes: Vec::new(), engines: Vec::new(), dir };
        fed.add_node(paced(25.0), &[]).await;
        fed.add_node(paced(25.0), &[]).await;
        fed.wait_routable(2).await;
        let base = fed.base();
        const LINES: usize = 30;
        let lines: Vec<String> = (0..LINES).map(|i| chat_line(&format!("k{i}"), MODEL, 5)).collect();
        let file = upload(&base, KEY, "batch", lines.join("\n").as_bytes()).await.json();
        let created =
            post(&base, "/v1/batches", json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions"})).await;
        let id = created.json()["id"].as_str().expect("id").to_string();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let b = call(&base, "GET", &format!("/v1/batches/{id}"), Some(KEY), None).await.json();
            if b["request_counts"]["completed"].as_u64().unwrap_or(0) >= 4 {
                break;
            }
            assert!(Instant::now() < deadline, "the batch made no progress: {b:#}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Both nodes have batch requests in flight; one dies with its requests.
        fed.nodes[0].kill();
        let done = wait_final(&base, KEY, &id, Duration::from_secs(90)).await;
        assert_eq!(done["request_counts"], json!({"total": LINES, "completed": LINES, "failed": 0}), "{done:#}");
        let output = file_lines(&base, KEY, done["output_file_id"].as_str().expect("output file")).await;
        let mut ids: Vec<&str> = output.iter().map(|l| l["custom_id"].as_str().expect("custom_id")).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), LINES, "every custom_id exactly once");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_and_expired_batches_keep_what_was_done_and_list_the_rest_as_errors() {
    within(120, async {
        let dir = tempfile::tempdir().expect("tempdir");
        key_file(dir.path());
        let db = dir.path().join("gateway.db");
        let mut config = gateway_config(dir.path());
        config.ledger = Some(LedgerConfig::new(db.clone(), 0));
        config.batch = Some(BatchConfig::new(db));
        let gateway = Gateway::start(config).await.expect("gateway starts");
        let mut fed = Fed { gateway, nodes: Vec::new(), engines: Vec::new(), dir };
        fed.add_node(paced(25.0), &[]).await;
        fed.wait_routable(1).await;
        let base = fed.base();
        const LINES: usize = 40;
        // About 0.4 s per request, four at a time: the whole batch would take about 4 s.
        let lines: Vec<String> = (0..LINES).map(|i| chat_line(&format!("x{i}"), MODEL, 10)).collect();
        let file = upload(&base, KEY, "batch", lines.join("\n").as_bytes()).await.json();
        for (window, end, code) in [("24h", "cancelled", "batch_cancelled"), ("2s", "expired", "batch_expired")] {
            let created = post(
                &base,
                "/v1/batches",
                json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": window}),
            )
            .await;
            assert_eq!(created.status, 200, "{}", created.text());
            let id = created.json()["id"].as_str().expect("id").to_string();
            if end == "cancelled" {
                tokio::time::sleep(Duration::from_millis(600)).await;
                let r = call(&base, "POST", &format!("/v1/batches/{id}/cancel"), Some(KEY), None).await;
                assert_eq!(r.status, 200, "{}", r.text());
                assert!(
                    ["cancelling", "cancelled"].contains(&r.json()["status"].as_str().unwrap_or("")),
                    "{}",
                    r.text()
                );
            }
            let done = wait_final(&base, KEY, &id, Duration::from_secs(30)).await;
            assert_eq!(done["status"], end, "{done:#}");
            let counts = &done["request_counts"];
            let (completed, failed) =
                (counts["completed"].as_u64().unwrap_or(0), counts["failed"].as_u64().unwrap_or(0));
            assert_eq!(counts["total"], LINES, "{done:#}");
            assert_eq!(completed + failed, LINES as u64, "every line ends in one file or the other: {done:#}");
            assert!(completed > 0 && failed > 0, "stopped part way: {done:#}");
            let output = file_lines(&base, KEY, done["output_file_id"].as_str().expect("output")).await;
            let errors = file_lines(&base, KEY, done["error_file_id"].as_str().expect("errors")).await;
            assert_eq!(output.len() as u64, completed);
            assert!(errors.iter().all(|l| l["error"]["code"] == code), "{errors:#?}");
            let mut ids: Vec<&str> =
                output.iter().chain(errors.iter()).map(|l| l["custom_id"].as_str().expect("custom_id")).collect();
            ids.sort();
            ids.dedup();
            assert_eq!(ids.len(), LINES, "each custom_id in exactly one of the files");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_requests_wait_while_interactive_ones_fill_the_node() {
    within(120, batch_waits_while_two_streams_run(2, &[])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_requests_wait_while_interactive_ones_fill_the_engines_slots() {
    // Eight batch slots per node, but the engine runs two requests at once, and its node says so.
    within(120, batch_waits_while_two_streams_run(8, &["--engine-slots", "2"])).await;
}

/// Two interactive streams on the one node, whose batch work may use `node_slots` slots (its
/// node started with `node_args`): a batch created meanwhile sends nothing until they end.
async fn batch_waits_while_two_streams_run(node_slots: u32, node_args: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    key_file(dir.path());
    let db = dir.path().join("gateway.db");
    let mut config = gateway_config(dir.path());
    config.ledger = Some(LedgerConfig::new(db.clone(), 0));
    let mut batch = BatchConfig::new(db);
    batch.node_slots = node_slots;
    config.batch = Some(batch);
    let gateway = Gateway::start(config).await.expect("gateway starts");
    let mut fed = Fed { gateway, nodes: Vec::new(), engines: Vec::new(), dir };
    fed.add_node(paced(2.0), node_args).await;
    fed.wait_routable(1).await;
    let base = fed.base();
    if !node_args.is_empty() {
        let told =
            eventually(Duration::from_secs(10), || fed.node_row(0).is_some_and(|r| r["engine"]["slots"] == 2)).await;
        assert!(told, "the node never said its engine's slots: {:#}", fed.gateway.status());
    }

    // Two interactive streams of some twenty seconds (the simulator's natural answer to
    // their prompt, some 45 tokens at 2 a second) take the node's two slots.
    let started = Instant::now();
    let streams: Vec<_> = (0..2)
        .map(|_| {
            let base = base.clone();
            tokio::spawn(async move { stream_chat(&base, 75).await })
        })
        .collect();
    let engine = &fed.engines[0];
    // Generation requests only: `in_flight` also counts the node's health probes and load
    // reads while the engine answers them.
    let generating = || {
        let stats = engine.stats();
        stats.running + stats.waiting
    };
    assert!(eventually(Duration::from_secs(5), || generating() == 2).await, "the streams run");
    let lines: Vec<String> = (0..4).map(|i| chat_line(&format!("w{i}"), MODEL, 2)).collect();
    let file = upload(&base, KEY, "batch", lines.join("\n").as_bytes()).await.json();
    let created =
        post(&base, "/v1/batches", json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions"})).await;
    let id = created.json()["id"].as_str().expect("id").to_string();
    // While they run, the batch sends nothing to the node. (Checked only well before either
    // stream can end: as one ends, the engine may count it a moment after the gateway has
    // let a batch request take its slot, and a loaded machine can make the client see the
    // end later still.)
    let until = (Instant::now() + Duration::from_millis(1500)).min(started + Duration::from_secs(15));
    while Instant::now() < until && streams.iter().all(|s| !s.is_finished()) {
        assert!(generating() <= 2, "a batch request ran beside a full node's interactive ones");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b = call(&base, "GET", &format!("/v1/batches/{id}"), Some(KEY), None).await.json();
    assert_eq!(b["status"], "in_progress", "{b:#}");
    assert_eq!(b["request_counts"]["completed"], 0, "{b:#}");
    for s in streams {
        let s = s.await.expect("stream task");
        assert!(s.text().contains("[DONE]"), "the interactive streams end normally: {}", s.text());
    }
    // Once they are over, the batch runs.
    let done = wait_final(&base, KEY, &id, Duration::from_secs(30)).await;
    assert_eq!(done["request_counts"]["completed"], 4, "{done:#}");
}

/// The SDK's Python: `$TELA_SDK_PYTHON`, else the venv `.ci/setup-python.sh` makes.
fn sdk_python() -> PathBuf {
    if let Some(p) = std::env::var_os("TELA_SDK_PYTHON") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.ci/cache/sdk-venv/bin/python")
}

const SDK_SCRIPT: &str = r#"
import json, os, sys, time, io
from openai import OpenAI, NotFoundError
client = OpenAI(base_url=os.environ["TELA_BASE_URL"], api_key=os.environ["TELA_API_KEY"], max_retries=0)
model = os.environ["TELA_MODEL"]
lines = [json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                     "body": {"model": model, "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 2}})
         for i in range(4)]
f = client.files.create(file=("in.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
assert f.purpose == "batch" and f.bytes > 0, f
b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
assert b.status == "validating", b
for _ in range(300):
    b = client.batches.retrieve(b.id)
    if b.status in ("completed", "failed", "expired", "cancelled"):
        break
    time.sleep(0.1)
assert b.status == "completed", b
assert b.request_counts.total == 4 and b.request_counts.completed == 4, b
out = client.files.content(b.output_file_id).text
ids = sorted(json.loads(l)["custom_id"] for l in out.splitlines())
assert ids == ["q0", "q1", "q2", "q3"], ids
page = client.batches.list(limit=10)
assert any(x.id == b.id for x in page.data), page
try:
    client.batches.retrieve("batch_missing")
    sys.exit("expected NotFoundError")
except NotFoundError:
    pass
print("sdk batch ok")
"#;

#[cfg_attr(
    not(tela_sdk),
    ignore = "needs the OpenAI Python SDK: run .ci/test, or export what .ci/setup-python.sh prints"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_runs_a_batch_end_to_end() {
    within(120, async {
        let dir = tempfile::tempdir().expect("tempdir");
        key_file(dir.path());
        let db = dir.path().join("gateway.db");
        let mut config = gateway_config(dir.path());
        config.ledger = Some(LedgerConfig::new(db.clone(), 0));
        config.batch = Some(BatchConfig::new(db));
        let gateway = Gateway::start(config).await.expect("gateway starts");
        let mut fed = Fed { gateway, nodes: Vec::new(), engines: Vec::new(), dir };
        fed.add_node(engine(&[MODEL]), &[]).await;
        fed.wait_routable(1).await;
        let python = sdk_python();
        let base = format!("{}/v1", fed.base());
        let out = tokio::task::block_in_place(|| {
            Command::new(&python)
                .args(["-c", SDK_SCRIPT])
                .env("TELA_BASE_URL", base)
                .env("TELA_API_KEY", KEY)
                .env("TELA_MODEL", MODEL)
                .env_remove("OPENAI_API_KEY")
                .env_remove("OPENAI_BASE_URL")
                .output()
                .expect("run python")
        });
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains("sdk batch ok"), "the SDK's batch calls failed:\n{text}");
    })
    .await;
}
