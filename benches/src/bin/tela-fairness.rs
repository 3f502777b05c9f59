//! `tela-fairness`: a well-behaved key's latency with and without a flooding neighbour, with
//! the gateway's fair queueing between keys on and off.
//!
//! Each mode starts one engine simulator (`tela engine-sim`: 4 requests at once, the rest in its
//! FIFO queue, 500 tokens/s, so a 16-token request takes ~35 ms), `tela gateway` and `tela
//! node`, on loopback. The gateway runs either with fair queueing (`--fair-slots-per-node 4`,
//! the engine's own slot count: beyond them, requests wait in per-key queues served by deficit
//! round robin) or without it (`--fair-slots-per-node 0`: every request goes to the engine,
//! which serves them first come, first served). In each mode:
//!
//! - **alone** — the polite key sends one request at a time for `--seconds`;
//! - **flooded** — the same, while the flooding key keeps `--flood` requests open at once
//!   (each of its clients sends its next request as soon as one ends; a 429 — its own queue
//!   full — is retried after 10 ms).
//!
//! Latency is request sent to last body byte, on one keep-alive HTTP/1.1 connection per client.
//! Every phase is bounded in time and every process started is killed on exit.
//!
//! ```text
//! cargo build --release -p tela-gateway -p tela-benches --bin tela --bin tela-fairness
//! target/release/tela-fairness [--seconds S] [--flood N] [--tela PATH]
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use tela_benches::client::{connect, percentile_ms as pct, short_chat, Result};
use tela_benches::process::{require_tela, Procs, Tela, TempDir};

const MODEL: &str = "bench";
const POLITE: &str = "tela-fairness-polite-key";
const FLOOD: &str = "tela-fairness-flooding-key";
const SECRET: &str = "tela-fairness benchmark secret";
/// The engine's slots, and the gateway's slots per node when fair queueing is on.
const SLOTS: usize = 4;
/// A request not answered within this counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

struct Args {
    tela: PathBuf,
    seconds: f64,
    flood: usize,
}

fn parse_args() -> Result<Args> {
    let mut args = Args { tela: std::env::current_exe()?.with_file_name("tela"), seconds: 8.0, flood: 32 };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--tela" => args.tela = PathBuf::from(value()?),
            "--seconds" => args.seconds = value()?.parse()?,
            "--flood" => args.flood = value()?.parse()?,
            "-h" | "--help" => {
                println!("tela-fairness [--seconds S] [--flood N] [--tela PATH]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other} (see --help)").into()),
        }
    }
    require_tela(&args.tela)?;
    Ok(args)
}

/// One chat request of `key`: its status, or `None` when it failed.
async fn request(sender: &mut SendRequest<Full<Bytes>>, addr: SocketAddr, key: &str) -> Option<u16> {
    let req = hyper::Request::post("/v1/chat/completions")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(short_chat(MODEL, false)))
        .ok()?;
    let exchange = async {
        sender.ready().await.ok()?;
        let resp = sender.send_request(req).await.ok()?;
        let status = resp.status().as_u16();
        resp.into_body().collect().await.ok()?;
        Some(status)
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange).await.ok().flatten()
}

/// Starts an engine, a gateway with `--fair-slots-per-node slots` and a node; the API address.
async fn federation(tela: &Tela, procs: &mut Procs, slots: usize) -> Result<SocketAddr> {
    let seqs = SLOTS.to_string();
    let engine = tela.engine_sim(
        procs,
        &[
            "--model",
            MODEL,
            "--ttft-ms",
            "5",
            "--prefill-us-per-token",
            "0",
            "--tokens-per-s",
            "500",
            "--max-num-seqs",
            &seqs,
        ],
    )?;
    let keys = format!("keys-{slots}");
    std::fs::write(
        tela.dir.join(&keys),
        tela.hash_key(POLITE, Some("polite"))? + &tela.hash_key(FLOOD, Some("flood"))?,
    )?;
    let (slots_flag, keys) = (slots.to_string(), tela.file(&keys));
    let gw = tela.gateway(
        procs,
        &format!("gw-{slots}"),
        &["--no-ledger", "--fair-slots-per-node", &slots_flag, "--fair-queue-per-key", "64", "--api-keys", &keys],
    )?;
    let gateway = gw.api;
    tela.node(procs, &format!("node-{slots}"), &[&gw.anchor], &format!("http://{engine}"), &[])?;
    // Ready when the polite key is answered.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut s) = connect(gateway).await {
            if request(&mut s, gateway, POLITE).await == Some(200) {
                return Ok(gateway);
            }
        }
        if Instant::now() > deadline {
            return Err("the federation did not answer within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Phase {
    polite: Vec<Duration>,
    polite_errors: usize,
    flood_done: usize,
    flood_refused: usize,
}

/// The polite key, one request at a time for `seconds`, beside `flood` flooding clients.
async fn phase(gateway: SocketAddr, seconds: f64, flood: usize) -> Result<Phase> {
    let stop = Arc::new(AtomicBool::new(false));
    let (done, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut flooders = Vec::new();
    for _ in 0..flood {
        let (stop, done, refused) = (stop.clone(), done.clone(), refused.clone());
        flooders.push(tokio::spawn(async move {
            let Ok(mut sender) = connect(gateway).await else { return };
            while !stop.load(Ordering::Relaxed) {
                match request(&mut sender, gateway, FLOOD).await {
                    Some(200) => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(_) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    None => match connect(gateway).await {
                        Ok(s) => sender = s,
                        Err(_) => return,
                    },
                }
            }
        }));
    }
    if flood > 0 {
        // Let the flood fill the engine and the queues first.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (mut polite, mut polite_errors) = (Vec::new(), 0);
    let mut sender = connect(gateway).await?;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < deadline {
        let t0 = Instant::now();
        match request(&mut sender, gateway, POLITE).await {
            Some(200) => polite.push(t0.elapsed()),
            _ => {
                polite_errors += 1;
                sender = connect(gateway).await?;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        let _ = tokio::time::timeout(REQUEST_TIMEOUT, f).await;
    }
    polite.sort();
    Ok(Phase {
        polite,
        polite_errors,
        flood_done: done.load(Ordering::Relaxed),
        flood_refused: refused.load(Ordering::Relaxed),
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = parse_args()?;
    let dir = TempDir::new("tela-fairness")?;
    let tela = Tela { bin: args.tela.clone(), dir: dir.path().to_path_buf(), secret: SECRET.into() };
    println!(
        "one engine ({SLOTS} slots, FIFO queue, ~35 ms per request); polite key: one request at a time for {} s; \
         flood: {} clients",
        args.seconds, args.flood
    );
    println!("| gateway | neighbour | polite requests | polite p50 ms | polite p99 ms | polite errors | flood done | flood 429 |");
    println!("|---|---|---|---|---|---|---|---|");
    for (label, slots) in [("fair queueing", SLOTS), ("no fair queueing", 0)] {
        let mut procs = Procs::default();
        let gateway = federation(&tela, &mut procs, slots).await?;
        for (neighbour, flood) in [("none", 0), ("flooding", args.flood)] {
            let p = phase(gateway, args.seconds, flood).await?;
            println!(
                "| {label} | {neighbour} | {} | {:.1} | {:.1} | {} | {} | {} |",
                p.polite.len(),
                pct(&p.polite, 0.5),
                pct(&p.polite, 0.99),
                p.polite_errors,
                p.flood_done,
                p.flood_refused
            );
        }
        drop(procs);
    }
    Ok(())
}
