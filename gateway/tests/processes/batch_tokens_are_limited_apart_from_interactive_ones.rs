//! A key's batch requests are limited apart from its interactive ones: a batch running for the
//! key takes nothing from its interactive `tpm` (its interactive requests keep getting 200
//! while the batch runs), `batch_tpm` paces the batch (it lasts as long as the limit makes
//! it), and once `batch_budget_tokens` is spent the batch's remaining requests go to its error
//! file with code `budget_exceeded` while the key's interactive requests are still served.

use crate::batch_api_survives_restarts::{chat_line, file_lines, upload, wait_final};
use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use tela_gateway::auth::key_line;
use tela_gateway::batch::BatchConfig;
use tela_gateway::gateway::Gateway;
use tela_gateway::ledger::LedgerConfig;

/// A key without limits, to learn what a line costs.
const PROBE: &str = "batch-probe-key-0123456789";

/// Starts a gateway whose key `KEY` has `limits`, with one fast node and `node_slots`.
async fn federation(dir: tempfile::TempDir, limits: &str, node_slots: u32) -> Fed {
    let keys = format!("{} name=limited {limits}\n{} name=probe\n", key_line(KEY), key_line(PROBE));
    std::fs::write(dir.path().join("api-keys"), keys).expect("write the key file");
    let db = dir.path().join("gateway.db");
    let mut config = gateway_config(dir.path());
    config.ledger = Some(LedgerConfig::new(db.clone(), 0));
    let mut batch = BatchConfig::new(db);
    batch.node_slots = node_slots;
    config.batch = Some(batch);
    let gateway = Gateway::start(config).await.expect("gateway starts");
    let mut fed = Fed { gateway, nodes: Vec::new(), engines: Vec::new(), dir };
    fed.add_node(engine(&[MODEL]), &[]).await;
    fed.wait_routable(1).await;
    fed
}

/// Uploads `n` identical lines (but for their custom_id) and creates their batch; gives its id.
async fn start_batch(base: &str, n: usize, max_tokens: u32) -> String {
    let lines: Vec<String> = (0..n).map(|i| same_line(&format!("l{i}"), max_tokens)).collect();
    let file = upload(base, KEY, "batch", lines.join("\n").as_bytes()).await;
    assert_eq!(file.status, 200, "{}", file.text());
    let created =
        post(base, "/v1/batches", json!({"input_file_id": file.json()["id"], "endpoint": "/v1/chat/completions"}))
            .await;
    assert_eq!(created.status, 200, "{}", created.text());
    created.json()["id"].as_str().expect("batch id").to_string()
}

/// A batch line whose body is the same whatever its id, so every line costs the same.
fn same_line(id: &str, max_tokens: u32) -> String {
    let mut line: Value = serde_json::from_str(&chat_line("x", MODEL, max_tokens)).expect("a line");
    line["custom_id"] = json!(id);
    line.to_string()
}

/// The tokens one line costs: the gateway's estimate and the engine's usage, the smaller.
async fn cost_of_a_line(base: &str, max_tokens: u32) -> u64 {
    let line: Value = serde_json::from_str(&same_line("probe", max_tokens)).expect("a line");
    let body = line["body"].clone();
    let estimate = tela_gateway::limits::estimate_tokens("/v1/chat/completions", body.to_string().as_bytes());
    let r = call(base, "POST", "/v1/chat/completions", Some(PROBE), Some(body)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let usage = r.json()["usage"]["total_tokens"].as_u64().expect("the engine reports usage");
    estimate.min(usage)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_leaves_the_keys_interactive_minute_alone_and_is_paced_by_batch_tpm() {
    within(120, async {
        const BATCH_TPM: u64 = 300;
        let fed = federation(tempfile::tempdir().expect("tempdir"), &format!("tpm=100 batch_tpm={BATCH_TPM}"), 4).await;
        let base = fed.base();
        let cost = cost_of_a_line(&base, 20).await;
        // Enough lines to outlast the first minute's full bucket by some 6 s of refill.
        let n = (BATCH_TPM + BATCH_TPM / 10).div_ceil(cost);
        let paced_at_least = Duration::from_secs_f64((n * cost - BATCH_TPM) as f64 * 60.0 / BATCH_TPM as f64);
        assert!(paced_at_least >= Duration::from_secs(4), "{n} lines of {cost} tokens: {paced_at_least:?}");

        let started = Instant::now();
        let id = start_batch(&base, usize::try_from(n).expect("n"), 20).await;
        // Interactive requests of the same key, one a second, all the while the batch runs: the
        // batch's several hundred tokens would have emptied this key's `tpm=100` many times over.
        let body = chat(MODEL, false, 1);
        let estimate = tela_gateway::limits::estimate_tokens("/v1/chat/completions", body.to_string().as_bytes());
        let (mut interactive, mut used) = (0, 0);
        loop {
            let r = post(&base, "/v1/chat/completions", body.clone()).await;
            assert_eq!(r.status, 200, "an interactive request beside the key's batch: {}", r.text());
            let remaining: u64 =
                r.header("x-ratelimit-remaining-tokens").and_then(|v| v.parse().ok()).expect("the tokens header");
            // The bucket holds at most what this key's own interactive requests took out.
            assert!(
                remaining + used + estimate >= 100,
                "the batch's tokens were charged to the interactive minute: {remaining} left after {used} + {estimate}"
            );
            used += r.json()["usage"]["total_tokens"].as_u64().expect("usage");
            interactive += 1;
            let b = call(&base, "GET", &format!("/v1/batches/{id}"), Some(KEY), None).await.json();
            if b["status"] != "in_progress" && b["status"] != "validating" {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(90), "the batch never ended: {b:#}");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let done = wait_final(&base, KEY, &id, Duration::from_secs(30)).await;
        let took = started.elapsed();
        assert_eq!(done["request_counts"]["completed"], n, "{done:#}");
        assert!(interactive >= 3, "interactive requests ran during the batch: {interactive}");
        assert!(took >= paced_at_least, "{n} lines of {cost}+ tokens under batch_tpm={BATCH_TPM} took {took:?}");
        // Not slower than the limit either: the runner asks again at least every 250 ms.
        assert!(took <= paced_at_least * 2 + Duration::from_secs(10), "{took:?} for {paced_at_least:?} of pacing");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_batch_budget_fails_the_rest_with_budget_exceeded() {
    within(120, async {
        // One batch request at a time, so each is charged before the next is asked for.
        let fed = federation(tempfile::tempdir().expect("tempdir"), "tpm=1000 batch_budget_tokens=60/day", 1).await;
        let base = fed.base();
        let cost = cost_of_a_line(&base, 20).await;
        let id = start_batch(&base, 8, 20).await;
        let done = wait_final(&base, KEY, &id, Duration::from_secs(60)).await;
        assert_eq!(done["status"], "completed", "{done:#}");
        let (completed, failed) =
            (done["request_counts"]["completed"].as_u64(), done["request_counts"]["failed"].as_u64());
        let completed = completed.expect("completed");
        assert!((1..=60u64.div_ceil(cost)).contains(&completed), "{cost} tokens a line, 60 to spend: {done:#}");
        assert_eq!(failed, Some(8 - completed), "{done:#}");
        let errors = file_lines(&base, KEY, done["error_file_id"].as_str().expect("an error file")).await;
        assert_eq!(errors.len() as u64, 8 - completed);
        for e in &errors {
            assert_eq!(e["error"]["code"], "budget_exceeded", "{e}");
            assert_eq!(e["response"], Value::Null, "{e}");
            assert!(e["custom_id"].as_str().is_some_and(|c| c.starts_with('l')), "{e}");
            let message = e["error"]["message"].as_str().unwrap_or("");
            assert!(message.contains("batch budget of 60 tokens per day"), "{e}");
        }
        // The batch budget is the batch's alone: the key's interactive requests go on.
        let r = post(&base, "/v1/chat/completions", chat(MODEL, false, 5)).await;
        assert_eq!(r.status, 200, "{}", r.text());
    })
    .await;
}
