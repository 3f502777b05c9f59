//! `tela-batch-load`: does a batch running on the federation slow interactive requests?
//!
//! One run starts two engine simulators (`tela engine-sim`: 50 ms to the first token, 100
//! tokens/s, at most 8 requests running each, later ones waiting for a slot — as vLLM's
//! `max_num_seqs`), a `tela gateway` (`--batch-node-slots 4`) and two `tela node`s, then, for
//! `--seconds` each:
//!
//! 1. **alone** — interactive clients only: `--interactive` workers, each sending a streamed
//!    chat request (16 tokens), waiting for its end, pausing 50 ms, and again; the time to the
//!    first byte of each answer (TTFT) is recorded;
//! 2. **with a batch** — the same clients while a batch of chat requests (32 tokens each, more
//!    than the phase can finish) runs through the Batch API; the batch's throughput is its
//!    completed requests' tokens per second over the phase;
//! 3. **with a naive loop** — the same clients while `--naive` workers send the same requests
//!    through the interactive API as fast as they are answered (what a user without the Batch
//!    API writes);
//! 4. **batch alone** — a batch with no interactive clients, for its throughput on idle nodes.
//!
//! ```text
//! cargo build --release -p tela-gateway -p tela-benches --bin tela --bin tela-batch-load
//! target/release/tela-batch-load [--seconds S] [--interactive N] [--naive N] [--tela PATH]
//! ```
//!
//! Every phase is bounded in time, and every process started is killed on exit.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tela_benches::client::{self, connect, percentile_ms as pct, serving_nodes, Result};
use tela_benches::process::{Procs, Tela, TempDir};

const MODEL: &str = "bench";
const KEY: &str = "tela-batch-load-benchmark-key";
const SECRET: &str = "tela-batch-load benchmark secret";
const BATCH_TOKENS: u64 = 32;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// One request with the benchmark's key on a fresh connection; the status and the whole body.
async fn call(addr: SocketAddr, method: &str, path: &str, content_type: &str, body: Bytes) -> Result<(u16, Bytes)> {
    client::call(addr, method, path, Some(KEY), content_type, body).await
}

fn chat(max_tokens: u64, stream: bool, text: &str) -> serde_json::Value {
    serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

/// Uploads a batch of `n` chat requests and creates the batch; its id.
async fn start_batch(gateway: SocketAddr, n: usize, tag: &str) -> Result<String> {
    let lines: Vec<String> = (0..n)
        .map(|i| {
            serde_json::json!({"custom_id": format!("{tag}-{i}"), "method": "POST", "url": "/v1/chat/completions",
                               "body": chat(BATCH_TOKENS, false, &format!("Batch item {i}: label it."))})
            .to_string()
        })
        .collect();
    let boundary = "tela-batch-load-boundary";
    let mut form = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\n\
         Content-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n"
    )
    .into_bytes();
    form.extend_from_slice(lines.join("\n").as_bytes());
    form.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let (status, file) =
        call(gateway, "POST", "/v1/files", &format!("multipart/form-data; boundary={boundary}"), form.into()).await?;
    let file: serde_json::Value = serde_json::from_slice(&file)?;
    if status != 200 {
        return Err(format!("upload answered {status}: {file}").into());
    }
    let create = serde_json::json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"});
    let (status, batch) = call(gateway, "POST", "/v1/batches", "application/json", create.to_string().into()).await?;
    let batch: serde_json::Value = serde_json::from_slice(&batch)?;
    if status != 200 {
        return Err(format!("creating the batch answered {status}: {batch}").into());
    }
    Ok(batch["id"].as_str().ok_or("no batch id")?.to_string())
}

async fn batch_state(gateway: SocketAddr, id: &str) -> Result<(String, u64)> {
    let (_, b) = call(gateway, "GET", &format!("/v1/batches/{id}"), "application/json", Bytes::new()).await?;
    let b: serde_json::Value = serde_json::from_slice(&b)?;
    Ok((b["status"].as_str().unwrap_or("").to_string(), b["request_counts"]["completed"].as_u64().unwrap_or(0)))
}

/// Interactive clients for `seconds`: each TTFT, and the errors.
async fn interactive(gateway: SocketAddr, workers: usize, seconds: f64) -> (Vec<Duration>, usize) {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for w in 0..workers {
        tasks.push(tokio::spawn(async move {
            let (mut ttfts, mut errors) = (Vec::new(), 0);
            let mut i = 0;
            while Instant::now() < deadline {
                i += 1;
                let body = chat(16, true, &format!("Interactive question {w}-{i}?")).to_string();
                let exchange = async {
                    let mut sender = connect(gateway).await.ok()?;
                    let req = hyper::Request::post("/v1/chat/completions")
                        .header("host", gateway.to_string())
                        .header("authorization", format!("Bearer {KEY}"))
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from(body)))
                        .ok()?;
                    let t0 = Instant::now();
                    let resp = sender.send_request(req).await.ok()?;
                    if resp.status() != 200 {
                        return None;
                    }
                    let mut body = resp.into_body();
                    body.frame().await?.ok()?;
                    let ttft = t0.elapsed();
                    while let Some(frame) = body.frame().await {
                        frame.ok()?;
                    }
                    Some(ttft)
                };
                match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await.ok().flatten() {
                    Some(t) => ttfts.push(t),
                    None => errors += 1,
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (ttfts, errors)
        }));
    }
    let (mut all, mut errors) = (Vec::new(), 0);
    for t in tasks {
        if let Ok((t, e)) = t.await {
            all.extend(t);
            errors += e;
        }
    }
    all.sort();
    (all, errors)
}

/// A naive client loop for `seconds`: requests answered.
async fn naive(gateway: SocketAddr, workers: usize, seconds: f64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for w in 0..workers {
        tasks.push(tokio::spawn(async move {
            let mut done = 0u64;
            let mut i = 0;
            while Instant::now() < deadline {
                i += 1;
                let body = chat(BATCH_TOKENS, false, &format!("Loop item {w}-{i}: label it.")).to_string();
                if let Ok((200, _)) =
                    call(gateway, "POST", "/v1/chat/completions", "application/json", body.into()).await
                {
                    done += 1;
                }
            }
            done
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap_or(0);
    }
    total
}

/// Runs a batch over a phase of `seconds` (with `during` running meanwhile); tokens per second.
async fn batch_phase<F: std::future::Future>(
    gateway: SocketAddr,
    tag: &str,
    seconds: f64,
    during: F,
) -> Result<(f64, F::Output)> {
    let id = start_batch(gateway, 5000, tag).await?;
    // Past validation and into the steady state before measuring.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_, before) = batch_state(gateway, &id).await?;
    let t0 = Instant::now();
    let out = during.await;
    let (_, after) = batch_state(gateway, &id).await?;
    let rate = (after - before) as f64 * BATCH_TOKENS as f64 / t0.elapsed().as_secs_f64().max(seconds.min(1.0));
    call(gateway, "POST", &format!("/v1/batches/{id}/cancel"), "application/json", Bytes::new()).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while batch_state(gateway, &id).await?.0 != "cancelled" && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((rate, out))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let exe = std::env::current_exe()?;
    let (mut tela, mut seconds, mut workers, mut naive_workers) = (exe.with_file_name("tela"), 15.0, 4usize, 16usize);
    let mut argv = std::env::args().skip(1);
    while let Some(a) = argv.next() {
        let mut value = || argv.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--tela" => tela = PathBuf::from(value()?),
            "--seconds" => seconds = value()?.parse()?,
            "--interactive" => workers = value()?.parse()?,
            "--naive" => naive_workers = value()?.parse()?,
            _ => return Err("tela-batch-load [--seconds S] [--interactive N] [--naive N] [--tela PATH]".into()),
        }
    }
    let dir = TempDir::new("tela-batch-load")?;
    let tela = Tela { bin: tela, dir: dir.path().to_path_buf(), secret: SECRET.into() };
    let mut procs = Procs::default();
    let mut engines = Vec::new();
    for _ in 0..2 {
        engines.push(tela.engine_sim(
            &mut procs,
            &["--model", MODEL, "--ttft-ms", "50", "--tokens-per-s", "100", "--max-num-seqs", "8"],
        )?);
    }
    std::fs::write(dir.path().join("keys"), tela.hash_key(KEY, None)?)?;
    let gw = tela.gateway(
        &mut procs,
        "gw",
        &["--batch-node-slots", "4", "--api-keys", &tela.file("keys"), "--ledger", &tela.file("gateway.db")],
    )?;
    let gateway = gw.api;
    for (i, e) in engines.iter().enumerate() {
        tela.node(&mut procs, &format!("node{i}"), &[&gw.anchor], &format!("http://{e}"), &[])?;
    }
    serving_nodes(gateway, 2, Duration::from_secs(30)).await?;

    let (alone, alone_errors) = interactive(gateway, workers, seconds).await;
    let (batch_rate, (with_batch, batch_errors)) =
        batch_phase(gateway, "b1", seconds, interactive(gateway, workers, seconds)).await?;
    let t0 = Instant::now();
    let ((with_naive, naive_errors), naive_done) =
        tokio::join!(interactive(gateway, workers, seconds), naive(gateway, naive_workers, seconds));
    let naive_rate = naive_done as f64 * BATCH_TOKENS as f64 / t0.elapsed().as_secs_f64();
    let (idle_rate, ()) =
        batch_phase(gateway, "b2", seconds, tokio::time::sleep(Duration::from_secs_f64(seconds))).await?;

    println!("| phase | interactive requests | TTFT p50 ms | TTFT p99 ms | errors | bulk tokens/s |");
    println!("|---|---|---|---|---|---|");
    let row = |name: &str, t: &[Duration], e: usize, rate: Option<f64>| {
        let rate = rate.map_or_else(|| "-".to_string(), |r| format!("{r:.0}"));
        println!("| {name} | {} | {:.1} | {:.1} | {e} | {rate} |", t.len(), pct(t, 0.5), pct(t, 0.99));
    };
    row("interactive alone", &alone, alone_errors, None);
    row("with a batch (Batch API)", &with_batch, batch_errors, Some(batch_rate));
    row(&format!("with a naive loop ({naive_workers} workers)"), &with_naive, naive_errors, Some(naive_rate));
    row("batch alone", &[], 0, Some(idle_rate));
    Ok(())
}
