//! The usage ledger: after streamed and non-streamed requests from two keys, the gateway's
//! database holds one row per request with the engine's own token counts, the key, its hash
//! and its account; a streamed client that did not ask for usage receives none (and one that
//! asked receives it); `/metrics` counts requests and tokens per key and model; `tela usage`
//! sums them per key and account as a table, CSV and JSON; a ledger that cannot be written
//! leaves requests working; and a `tela gateway` killed with SIGKILL keeps the rows of
//! requests answered two seconds earlier, in a file that opens cleanly.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use tela_gateway::auth::key_line;
use tela_gateway::gateway::Gateway;
use tela_gateway::ledger::LedgerConfig;

const KEY_A: &str = "ledger-key-a-0123456789";
const KEY_B: &str = "ledger-key-b-0123456789";

/// The content of every chat request, so that they share a prompt token count.
const PROMPT: &str = "Count the tokens of this request, please.";

fn key_file() -> String {
    format!(
        "{} name=lab-a owner=ada account=proj-a tpm=100000\n{} name=lab-b account=proj-b\n",
        key_line(KEY_A),
        key_line(KEY_B)
    )
}

/// The first 12 hex digits of a key's hash, as the ledger keeps it.
fn hash_of(key: &str) -> String {
    let line = key_line(key);
    line["sha256:".len().."sha256:".len() + 12].to_string()
}

/// A gateway whose ledger is at `ledger(dir)`, with one node.
async fn federation(ledger: impl FnOnce(&Path) -> PathBuf) -> (Fed, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("api-keys"), key_file()).expect("write the key file");
    let path = ledger(dir.path());
    let mut config = gateway_config(dir.path());
    config.ledger = Some(LedgerConfig::new(path.clone(), 90));
    let gateway = Gateway::start(config).await.expect("gateway starts");
    let mut fed = Fed { gateway, nodes: Vec::new(), engines: Vec::new(), dir };
    fed.add_node(engine(&[MODEL]), &[]).await;
    fed.wait_routable(1).await;
    (fed, path)
}

fn chat_body(stream: bool, max_tokens: u32, include_usage: bool) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": stream,
        "max_tokens": max_tokens,
    });
    if include_usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

async fn stream_as(base: &str, key: &str, body: Value) -> Streamed {
    let started = Instant::now();
    let response = send(base, "POST", "/v1/chat/completions", Some(key), Some(body.to_string())).await;
    read_stream(response, started).await
}

/// The events of a stream as JSON (without the final `[DONE]`).
fn chunks(s: &Streamed) -> Vec<Value> {
    let events = s.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{}", s.text());
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("event is not JSON ({err}): {e}")))
        .collect()
}

/// The tokens of content a stream carried: one per content chunk.
fn content_chunks(chunks: &[Value]) -> u64 {
    chunks.iter().filter(|c| c["choices"][0]["delta"]["content"].as_str().is_some_and(|t| !t.is_empty())).count() as u64
}

/// One ledger row, as the test reads it.
#[derive(Debug, Clone, PartialEq)]
struct LedgerRow {
    key: Option<String>,
    hash: Option<String>,
    account: Option<String>,
    model: String,
    node: Option<String>,
    endpoint: String,
    stream: bool,
    status: i64,
    outcome: String,
    prompt: Option<i64>,
    completion: Option<i64>,
    ttft: Option<i64>,
}

fn rows(path: &Path) -> Vec<LedgerRow> {
    let conn = tela_gateway::db::open_read_only(path, 1).expect("the ledger opens");
    let mut statement = conn
        .prepare(
            "SELECT key_name, key_hash, account, model, node, endpoint, stream, status, outcome, prompt_tokens,
                    completion_tokens, ttft_ms FROM requests ORDER BY id",
        )
        .expect("prepare");
    let rows = statement
        .query_map([], |r| {
            Ok(LedgerRow {
                key: r.get(0)?,
                hash: r.get(1)?,
                account: r.get(2)?,
                model: r.get(3)?,
                node: r.get(4)?,
                endpoint: r.get(5)?,
                stream: r.get(6)?,
                status: r.get(7)?,
                outcome: r.get(8)?,
                prompt: r.get(9)?,
                completion: r.get(10)?,
                ttft: r.get(11)?,
            })
        })
        .expect("query");
    rows.map(|r| r.expect("row")).collect()
}

/// Waits (bounded) until the ledger has `n` rows.
async fn wait_rows(path: &Path, n: usize) -> Vec<LedgerRow> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = if path.exists() { rows(path) } else { Vec::new() };
        if got.len() >= n || Instant::now() > deadline {
            assert_eq!(got.len(), n, "rows: {got:#?}");
            return got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn tela_usage(args: &[&str]) -> String {
    let out = Command::new(tela()).arg("usage").args(args).output().expect("run tela usage");
    assert!(out.status.success(), "tela usage {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

fn metric(text: &str, line_start: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric {line_start}:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_has_each_request_with_the_engines_token_counts() {
    within(120, async {
        let (fed, path) = federation(|dir| dir.join("state").join("gateway.db")).await;
        let base = fed.base();

        // lab-a: a plain answer, whose usage the client sees, and a stream that did not ask
        // for usage.
        let plain = call(&base, "POST", "/v1/chat/completions", Some(KEY_A), Some(chat_body(false, 5, false))).await;
        assert_eq!(plain.status, 200, "{}", plain.text());
        let plain_usage = plain.json()["usage"].clone();
        let prompt_tokens = plain_usage["prompt_tokens"].as_i64().expect("prompt tokens");
        assert_eq!(plain_usage["completion_tokens"], 5);
        let unasked = stream_as(&base, KEY_A, chat_body(true, 6, false)).await;
        assert_eq!(unasked.status, 200);
        let unasked_chunks = chunks(&unasked);
        // Exactly what the client would have received without the gateway's request for
        // usage: no usage event, no `"usage": null` on the others.
        assert!(!unasked.text().contains("usage"), "{}", unasked.text());
        assert!(unasked_chunks.iter().all(|c| c["choices"].as_array().is_some_and(|a| !a.is_empty())));
        let unasked_completion = content_chunks(&unasked_chunks) as i64;
        assert_eq!(unasked_completion, 6);

        // lab-b: a stream that asked for usage gets it, as the engine sent it; and a model
        // nobody serves, answered by the gateway itself.
        let asked = stream_as(&base, KEY_B, chat_body(true, 7, true)).await;
        assert_eq!(asked.status, 200);
        let asked_chunks = chunks(&asked);
        let usage_chunk = asked_chunks.last().expect("chunks");
        assert_eq!(usage_chunk["choices"], json!([]), "the usage event is last: {}", asked.text());
        assert_eq!(usage_chunk["usage"]["completion_tokens"], 7);
        assert_eq!(usage_chunk["usage"]["prompt_tokens"].as_i64(), Some(prompt_tokens));
        assert!(asked_chunks[..asked_chunks.len() - 1].iter().all(|c| c["usage"].is_null()));
        let unknown = call(&base, "POST", "/v1/chat/completions", Some(KEY_B), Some(json!({"model": "nope"}))).await;
        assert_eq!(unknown.status, 404);

        let got = wait_rows(&path, 4).await;
        let node = Some(fed.nodes[0].id.to_string());
        let row = |key: &str, account: &str, stream: bool, status: i64, outcome: &str| LedgerRow {
            key: Some(key.into()),
            hash: Some(hash_of(if key == "lab-a" { KEY_A } else { KEY_B })),
            account: Some(account.into()),
            model: MODEL.into(),
            node: node.clone(),
            endpoint: "/v1/chat/completions".into(),
            stream,
            status,
            outcome: outcome.into(),
            prompt: Some(prompt_tokens),
            completion: None,
            ttft: None,
        };
        let ttft_blind = |r: &LedgerRow| LedgerRow { ttft: None, ..r.clone() };
        assert_eq!(
            ttft_blind(&got[0]),
            LedgerRow { completion: Some(5), ..row("lab-a", "proj-a", false, 200, "complete") }
        );
        assert_eq!(
            ttft_blind(&got[1]),
            LedgerRow { completion: Some(unasked_completion), ..row("lab-a", "proj-a", true, 200, "complete") }
        );
        assert_eq!(
            ttft_blind(&got[2]),
            LedgerRow { completion: Some(7), ..row("lab-b", "proj-b", true, 200, "complete") }
        );
        assert_eq!(
            got[3],
            LedgerRow {
                model: "nope".into(),
                node: None,
                prompt: None,
                ..row("lab-b", "proj-b", false, 404, "refused")
            }
        );
        assert!(got[1].ttft.is_some() && got[2].ttft.is_some(), "streams have a time to first byte: {got:#?}");

        // /metrics counts requests and the engines' tokens per key and model.
        let metrics = call(&base, "GET", "/metrics", Some(KEY_B), None).await.text();
        assert_eq!(metric(&metrics, r#"tela_gateway_key_requests_total{key="lab-a"}"#), 2.0);
        assert_eq!(metric(&metrics, r#"tela_gateway_key_requests_total{key="lab-b"}"#), 2.0);
        assert_eq!(
            metric(&metrics, r#"tela_gateway_key_tokens_total{key="lab-a",kind="completion"}"#),
            (5 + unasked_completion) as f64
        );
        assert_eq!(
            metric(&metrics, &format!(r#"tela_gateway_model_tokens_total{{model="{MODEL}",kind="prompt"}}"#)),
            (3 * prompt_tokens) as f64
        );
        assert_eq!(metric(&metrics, "tela_gateway_ledger_errors_total"), 0.0);

        // `tela usage`, read while the gateway keeps writing.
        let file = path.to_str().expect("utf-8");
        let a_tokens = 2 * prompt_tokens + 5 + unasked_completion;
        let csv = tela_usage(&["--ledger", file, "--by", "key", "--format", "csv"]);
        let mut lines = csv.lines();
        assert_eq!(
            lines.next(),
            Some("key,requests,errors,prompt_tokens,completion_tokens,total_tokens,request_seconds"),
            "{csv}"
        );
        let lab_a: Vec<&str> = csv.lines().find(|l| l.starts_with("lab-a,")).expect("lab-a").split(',').collect();
        assert_eq!(
            lab_a[..6],
            [
                "lab-a".to_string(),
                "2".into(),
                "0".into(),
                (2 * prompt_tokens).to_string(),
                (5 + unasked_completion).to_string(),
                a_tokens.to_string()
            ]
        );
        let lab_b: Vec<&str> = csv.lines().find(|l| l.starts_with("lab-b,")).expect("lab-b").split(',').collect();
        assert_eq!(lab_b[1..4], ["2", "1", &prompt_tokens.to_string()], "one request refused: {csv}");

        let json: Value = serde_json::from_str(&tela_usage(&["--ledger", file, "--by", "account", "--format", "json"]))
            .expect("JSON");
        let proj_a = json["rows"].as_array().expect("rows").iter().find(|r| r["account"] == "proj-a").expect("proj-a");
        assert_eq!(proj_a["total_tokens"].as_i64(), Some(a_tokens));
        assert_eq!(json["total"]["requests"], 4);

        let table = tela_usage(&["--ledger", file, "--by", "account"]);
        let proj_b: Vec<&str> =
            table.lines().find(|l| l.starts_with("proj-b")).expect("proj-b's line").split_whitespace().collect();
        assert_eq!(proj_b[..4], ["proj-b", "2", "1", &prompt_tokens.to_string()], "{table}");
        assert!(table.lines().any(|l| l.starts_with("TOTAL")), "{table}");
        // Two gateways' ledgers are summed (here the same file twice, to see the sum).
        let twice = tela_usage(&["--ledger", file, "--ledger", file, "--by", "account", "--format", "json"]);
        let twice: Value = serde_json::from_str(&twice).expect("JSON");
        assert_eq!(twice["total"]["requests"], 8);

        fed.gateway.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_ledger_leaves_requests_working() {
    within(90, async {
        let (fed, path) = federation(|dir| {
            let read_only = dir.join("read-only");
            std::fs::create_dir(&read_only).expect("dir");
            let mut perms = std::fs::metadata(&read_only).expect("meta").permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o555);
            std::fs::set_permissions(&read_only, perms).expect("chmod");
            if std::fs::write(read_only.join("probe"), "x").is_ok() {
                // Root writes anywhere: a path under a regular file is what nobody can create.
                let blocker = dir.join("not-a-directory");
                std::fs::write(&blocker, "x").expect("file");
                blocker.join("gateway.db")
            } else {
                read_only.join("gateway.db")
            }
        })
        .await;
        let base = fed.base();
        for i in 0..4 {
            let r =
                call(&base, "POST", "/v1/chat/completions", Some(KEY_A), Some(chat_body(i % 2 == 1, 4, false))).await;
            assert_eq!(r.status, 200, "{}", r.text());
        }
        let streamed = stream_as(&base, KEY_B, chat_body(true, 4, false)).await;
        assert_eq!(streamed.status, 200);
        assert!(!path.exists());
        let errors = async {
            loop {
                let metrics = call(&base, "GET", "/metrics", Some(KEY_A), None).await.text();
                if metric(&metrics, "tela_gateway_ledger_errors_total") >= 1.0 {
                    return metrics;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let metrics = tokio::time::timeout(Duration::from_secs(10), errors).await.expect("the failure is counted");
        assert_eq!(metric(&metrics, r#"tela_gateway_key_requests_total{key="lab-a"}"#), 4.0);
        assert_eq!(metric(&metrics, "tela_gateway_ledger_rows_total"), 0.0);
        fed.gateway.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateway_keeps_rows_answered_two_seconds_before() {
    within(120, async {
        let dir = tempfile::tempdir().expect("tempdir");
        let keys = dir.path().join("api-keys");
        std::fs::write(&keys, key_file()).expect("keys");
        let ledger = dir.path().join("gateway.db");
        let mut gw = start_lone_gateway(dir.path(), &keys);
        let (base, anchor) = (gw.base.clone(), gw.anchor.clone());
        let engine = tela_gateway::engine_sim::spawn(engine(&[MODEL]), "127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("engine");
        let _node = spawn_node(dir.path(), "n0", std::slice::from_ref(&anchor), engine.local_addr(), &[]);
        let ready = async {
            loop {
                let s = call(&base, "GET", "/status", Some(KEY_A), None).await.json();
                if s["nodes"].as_array().is_some_and(|n| n.iter().any(|n| n["tunnel"] == true)) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), ready).await.expect("the node connects");

        // lab-a's requests are answered, then two seconds pass; lab-b's come just before
        // the kill, and may or may not make it.
        for i in 0..10 {
            let r =
                call(&base, "POST", "/v1/chat/completions", Some(KEY_A), Some(chat_body(i % 2 == 0, 3, false))).await;
            assert_eq!(r.status, 200, "{}", r.text());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        for _ in 0..3 {
            let r = call(&base, "POST", "/v1/chat/completions", Some(KEY_B), Some(chat_body(false, 3, false))).await;
            assert_eq!(r.status, 200);
        }
        let _ = gw.child.0.kill(); // SIGKILL
        let _ = gw.child.0.wait();

        // The file opens (recovering its write-ahead log) and is intact.
        let conn = tela_gateway::db::open(&ledger).expect("the ledger opens after the kill");
        let check: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).expect("integrity check");
        assert_eq!(check, "ok");
        let a_rows: i64 = conn
            .query_row("SELECT COUNT(*) FROM requests WHERE key_name = 'lab-a' AND status = 200", [], |r| r.get(0))
            .expect("count");
        assert_eq!(a_rows, 10, "every request answered two seconds before the kill has its row");
        let tokens: i64 = conn
            .query_row("SELECT SUM(completion_tokens) FROM requests WHERE key_name = 'lab-a'", [], |r| r.get(0))
            .expect("sum");
        assert_eq!(tokens, 30, "the engine's counts, streams included");
        drop(conn);
        let report = tela_usage(&["--ledger", ledger.to_str().expect("utf-8"), "--by", "key", "--format", "csv"]);
        assert!(report.lines().any(|l| l.starts_with("lab-a,10,0,")), "{report}");
    })
    .await;
}
