//! `tela-affinity`: multi-turn conversations through routers that do and do not keep a
//! conversation on the engine that holds its KV cache.
//!
//! Each conversation opens with a long system prompt shared by its group of conversations and a
//! long first user message of its own (a pasted document), then asks short follow-up questions;
//! every turn resends the whole history (as the OpenAI API requires), streamed, and the time to
//! its first content chunk (TTFT) is measured at the client. All conversations run at once, each
//! sending its next turn as soon as the last answer ends; their starts are spread over
//! `--ramp-ms`. `--in-flight N` lets at most N turns run at once (first come, first served;
//! the wait is not counted in TTFT), which on engines that serve one request at a time
//! separates the cost of cache misses from the time spent queueing. The conversations, and (the simulator's text being a function of the prompt)
//! the answers, are the same in every phase.
//!
//! With `--engine sim` (the default) every phase starts `--engines` fresh `tela engine-sim`s —
//! prefix cache of `--kv-cache-tokens`, `--ttft-ms` plus `--prefill-us` per uncached prompt
//! token, `--tokens-per-s`, at most `--max-num-seqs` requests generating at once — and puts in
//! front of them, in turn:
//!
//! - **tela prefix** — `tela gateway --routing prefix` and one `tela node` per engine;
//! - **tela prefix, 2 gateways** — the same with a second gateway (joined to the first; every
//!   node joins both); each conversation alternates gateways turn by turn;
//! - **tela p2c** — `tela gateway --routing p2c` (the less loaded of two random nodes);
//! - **vllm-router cache_aware** and **round_robin** — vllm-router (0.1.17 from
//!   `benches/setup-vllm-router.sh`, or `--vllm-router PATH`) with its default thresholds.
//!
//! With `--engine llama` the engines are llama-cpp-python servers (`--llama-python`,
//! `--llama-model`, or `TELA_LLAMA_PYTHON` / `TELA_LLAMA_MODEL` from `.ci/setup-engine.sh`)
//! with their prompt cache on (`--cache true`: KV states kept in RAM and the longest matching
//! one restored), and the phases are Tela prefix and Tela p2c only.
//!
//! Each row: TTFT p50 and p90 over every turn, TTFT p50 over turns 2 and later (where affinity
//! can help), turns and answer tokens per second over the phase, errors, and the share of
//! prompt tokens the engines found in their prefix caches (from their vLLM-style `/metrics`;
//! "-" for llama.cpp). Everything binds loopback; every phase is bounded in turns and in time,
//! and every process started is killed on exit.
//!
//! ```text
//! cargo build --release -p tela-gateway -p tela-benches --bin tela --bin tela-affinity
//! benches/setup-vllm-router.sh
//! target/release/tela-affinity [--conversations 64] [--turns 10] [--groups 4] [--engines 4]
//!     [--phases tela-prefix,tela-prefix-2gw,tela-p2c,vllm-cache_aware,vllm-round_robin]
//! eval "$(.ci/setup-engine.sh | grep '^export ')"
//! target/release/tela-affinity --engine llama --engines 2 --conversations 4 --turns 6 --groups 2 \
//!     --system-tokens 250 --first-tokens 250 --followup-tokens 15 --max-tokens 16 --in-flight 1
//! ```
//!
//! `benches/results/affinity.md` has the figures and what they say.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use serde_json::{json, Value};
use tela_benches::client::{call, connect, percentile_ms as pct, wait_until, Result};
use tela_benches::process::{find_vllm_router, free_port, require_tela, Procs, Tela, TempDir};
use tokio::sync::Semaphore;

const MODEL: &str = "bench";
const SECRET: &str = "tela-affinity benchmark secret";
/// A turn whose answer has not ended within this counts as an error (and ends its conversation).
const TURN_TIMEOUT: Duration = Duration::from_secs(120);
/// The words the prompts are made of (~4 characters and a space each).
const WORDS: &[&str] = &[
    "data", "node", "slurm", "queue", "model", "token", "cache", "batch", "graph", "tensor", "shard", "layer",
    "kernel", "stream", "route", "block", "prefix", "merge", "epoch", "score", "field", "table", "index", "query",
];

struct Args {
    tela: PathBuf,
    vllm_router: Option<PathBuf>,
    engine: String,
    llama_python: Option<PathBuf>,
    llama_model: Option<PathBuf>,
    engines: usize,
    conversations: usize,
    turns: usize,
    groups: usize,
    system_tokens: usize,
    first_tokens: usize,
    followup_tokens: usize,
    max_tokens: u64,
    ramp_ms: u64,
    phase_seconds: f64,
    ttft_ms: u64,
    prefill_us: u64,
    tokens_per_s: u64,
    kv_cache_tokens: u64,
    max_num_seqs: u64,
    phases: Vec<String>,
    in_flight: usize,
}

const USAGE: &str = "tela-affinity [--engine sim|llama] [--engines N] [--conversations N] [--turns N] [--groups N] \
    [--system-tokens N] [--first-tokens N] [--followup-tokens N] [--max-tokens N] [--ramp-ms MS] [--phase-seconds S] \
    [--ttft-ms MS] [--prefill-us US] [--tokens-per-s N] [--kv-cache-tokens N] [--max-num-seqs N] \
    [--phases a,b,..] [--in-flight N] [--tela PATH] [--vllm-router PATH] [--llama-python PATH] [--llama-model PATH]";

fn parse_args() -> Result<Args> {
    let mut args = Args {
        tela: std::env::current_exe()?.with_file_name("tela"),
        vllm_router: find_vllm_router(),
        engine: "sim".into(),
        llama_python: std::env::var_os("TELA_LLAMA_PYTHON").map(PathBuf::from),
        llama_model: std::env::var_os("TELA_LLAMA_MODEL").map(PathBuf::from),
        engines: 4,
        conversations: 64,
        turns: 10,
        groups: 4,
        system_tokens: 1000,
        first_tokens: 300,
        followup_tokens: 40,
        max_tokens: 64,
        ramp_ms: 2000,
        phase_seconds: 180.0,
        ttft_ms: 20,
        prefill_us: 150,
        tokens_per_s: 100,
        kv_cache_tokens: 65536,
        max_num_seqs: 16,
        phases: Vec::new(),
        in_flight: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--tela" => args.tela = PathBuf::from(value()?),
            "--vllm-router" => args.vllm_router = Some(PathBuf::from(value()?)),
            "--engine" => args.engine = value()?,
            "--llama-python" => args.llama_python = Some(PathBuf::from(value()?)),
            "--llama-model" => args.llama_model = Some(PathBuf::from(value()?)),
            "--engines" => args.engines = value()?.parse()?,
            "--conversations" => args.conversations = value()?.parse()?,
            "--turns" => args.turns = value()?.parse()?,
            "--groups" => args.groups = value()?.parse()?,
            "--system-tokens" => args.system_tokens = value()?.parse()?,
            "--first-tokens" => args.first_tokens = value()?.parse()?,
            "--followup-tokens" => args.followup_tokens = value()?.parse()?,
            "--max-tokens" => args.max_tokens = value()?.parse()?,
            "--ramp-ms" => args.ramp_ms = value()?.parse()?,
            "--phase-seconds" => args.phase_seconds = value()?.parse()?,
            "--ttft-ms" => args.ttft_ms = value()?.parse()?,
            "--prefill-us" => args.prefill_us = value()?.parse()?,
            "--tokens-per-s" => args.tokens_per_s = value()?.parse()?,
            "--kv-cache-tokens" => args.kv_cache_tokens = value()?.parse()?,
            "--max-num-seqs" => args.max_num_seqs = value()?.parse()?,
            "--phases" => args.phases = value()?.split(',').map(str::to_string).collect(),
            "--in-flight" => args.in_flight = value()?.parse()?,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}; usage: {USAGE}").into()),
        }
    }
    require_tela(&args.tela)?;
    if args.engines == 0 || args.conversations == 0 || args.turns == 0 || args.groups == 0 {
        return Err("--engines, --conversations, --turns and --groups must be at least 1".into());
    }
    if args.phases.is_empty() {
        args.phases = match args.engine.as_str() {
            "llama" => vec!["tela-prefix".into(), "tela-p2c".into()],
            _ => ["tela-prefix", "tela-prefix-2gw", "tela-p2c", "vllm-cache_aware", "vllm-round_robin"]
                .map(String::from)
                .to_vec(),
        };
    }
    Ok(args)
}

/// Deterministic filler text of about `tokens` tokens (4 characters each) drawn by `seed`.
fn text(seed: u64, tokens: usize) -> String {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut s = String::with_capacity(tokens * 4 + 8);
    while s.len() < tokens * 4 {
        // xorshift64: enough to make every text its own.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
        s.push(' ');
    }
    s
}

/// What every conversation says, the same in every phase.
struct Workload {
    systems: Vec<String>,
    firsts: Vec<String>,
    followup_tokens: usize,
    turns: usize,
    max_tokens: u64,
}

impl Workload {
    fn new(args: &Args) -> Workload {
        let systems = (0..args.groups)
            .map(|g| {
                format!(
                    "You are assistant number {g} of the research computing centre. {}",
                    text(1000 + g as u64, args.system_tokens)
                )
            })
            .collect();
        let firsts = (0..args.conversations)
            .map(|c| format!("Conversation {c}. Here is my document: {}", text(50_000 + c as u64, args.first_tokens)))
            .collect();
        Workload {
            systems,
            firsts,
            followup_tokens: args.followup_tokens,
            turns: args.turns,
            max_tokens: args.max_tokens,
        }
    }

    fn user_turn(&self, conversation: usize, turn: usize) -> String {
        if turn == 0 {
            return self.firsts[conversation].clone();
        }
        let seed = 1_000_000 + (conversation * 1000 + turn) as u64;
        format!("Question {turn}: {}?", text(seed, self.followup_tokens))
    }
}

/// One conversation's figures.
#[derive(Default)]
struct Conversation {
    /// (turn, TTFT) of every turn answered.
    ttfts: Vec<(usize, Duration)>,
    /// Content chunks received (one token each, for both engines).
    tokens: u64,
    errors: usize,
}

/// Why a turn got no complete answer. The conversation ends there (its history would lack
/// the answer).
#[derive(Debug, thiserror::Error)]
enum TurnError {
    /// No connection to the router.
    #[error("connect: {0}")]
    Connect(#[source] Box<dyn std::error::Error>),
    /// The request could not be built.
    #[error(transparent)]
    Request(hyper::http::Error),
    /// The kept-alive connection broke before the request was sent.
    #[error("connection: {0}")]
    Connection(#[source] hyper::Error),
    /// The request was sent and no response head came back.
    #[error("request: {0}")]
    Send(#[source] hyper::Error),
    /// The router answered with an error status.
    #[error("{status}: {body}")]
    Status {
        /// The status.
        status: hyper::StatusCode,
        /// The error body, as text.
        body: String,
    },
    /// The streamed body broke.
    #[error("stream: {0}")]
    Stream(#[source] hyper::Error),
    /// An SSE event's data is not JSON.
    #[error("not JSON: {data}")]
    NotJson {
        /// The event's data.
        data: String,
        /// What the parser said.
        #[source]
        source: serde_json::Error,
    },
    /// The stream carried an error event.
    #[error("error event: {data}")]
    ErrorEvent {
        /// The event's data.
        data: String,
    },
    /// The stream ended without `data: [DONE]`.
    #[error("the stream ended without [DONE]")]
    NoDone,
    /// The stream ended without a content chunk.
    #[error("no content")]
    NoContent,
    /// No answer within [`TURN_TIMEOUT`].
    #[error("timed out")]
    TimedOut,
}

/// One streamed turn: TTFT (to the first non-empty content delta), the answer's text and its
/// chunks; or why it failed.
async fn turn(
    sender: &mut SendRequest<Full<Bytes>>,
    addr: SocketAddr,
    body: Bytes,
) -> std::result::Result<(Duration, String, u64), TurnError> {
    let req = hyper::Request::post("/v1/chat/completions")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(body))
        .map_err(TurnError::Request)?;
    let t0 = Instant::now();
    sender.ready().await.map_err(TurnError::Connection)?;
    let resp = sender.send_request(req).await.map_err(TurnError::Send)?;
    let status = resp.status();
    let mut body = resp.into_body();
    if status != 200 {
        let text = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
        return Err(TurnError::Status { status, body: String::from_utf8_lossy(&text).into_owned() });
    }
    let (mut buf, mut content, mut ttft, mut chunks, mut done) = (Vec::new(), String::new(), None, 0, false);
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(TurnError::Stream)?.into_data() else { continue };
        buf.extend_from_slice(&data);
        // SSE lines end with \n (engine-sim) or \r\n (llama-cpp-python's server).
        while let Some(end) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim_end().strip_prefix("data:") else { continue };
            let data = data.trim_start();
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let v = serde_json::from_str::<Value>(data)
                .map_err(|source| TurnError::NotJson { data: data.to_string(), source })?;
            if v.get("error").is_some() {
                return Err(TurnError::ErrorEvent { data: data.to_string() });
            }
            if let Some(c) = v["choices"][0]["delta"]["content"].as_str().filter(|c| !c.is_empty()) {
                ttft.get_or_insert_with(|| t0.elapsed());
                content.push_str(c);
                chunks += 1;
            }
        }
    }
    if !done {
        return Err(TurnError::NoDone);
    }
    Ok((ttft.ok_or(TurnError::NoContent)?, content, chunks))
}

/// Runs conversation `c` to its end (or the deadline), turn `t` through `targets[t % len]`.
async fn conversation(
    c: usize,
    targets: Vec<SocketAddr>,
    work: Arc<Workload>,
    deadline: Instant,
    turns: Arc<Semaphore>,
) -> Conversation {
    let mut out = Conversation::default();
    let mut senders: Vec<Option<SendRequest<Full<Bytes>>>> = targets.iter().map(|_| None).collect();
    let group = c % work.systems.len();
    let mut messages = vec![json!({"role": "system", "content": work.systems[group]})];
    for t in 0..work.turns {
        if Instant::now() > deadline {
            break;
        }
        let i = t % targets.len();
        let addr = targets[i];
        messages.push(json!({"role": "user", "content": work.user_turn(c, t)}));
        let body = json!({"model": MODEL, "messages": messages, "max_tokens": work.max_tokens, "temperature": 0, "stream": true});
        let exchange = async {
            // A keep-alive connection idle while other conversations' turns ran may have been
            // closed by the server: open a new one then, as an HTTP client pool would.
            let sender = match &mut senders[i] {
                Some(s) if !s.is_closed() => s,
                slot => slot.insert(connect(addr).await.map_err(TurnError::Connect)?),
            };
            turn(sender, addr, Bytes::from(body.to_string())).await
        };
        let Ok(_turn) = turns.acquire().await else { break };
        let outcome = tokio::time::timeout(TURN_TIMEOUT, exchange).await.unwrap_or(Err(TurnError::TimedOut));
        match outcome {
            Ok((ttft, answer, tokens)) => {
                out.ttfts.push((t, ttft));
                out.tokens += tokens;
                messages.push(json!({"role": "assistant", "content": answer}));
            }
            Err(why) => {
                // The history now lacks an answer: the conversation ends here.
                if out.errors == 0 {
                    eprintln!("conversation {c}, turn {}: {why}", t + 1);
                }
                out.errors += 1;
                break;
            }
        }
    }
    out
}

struct PhaseResult {
    ttfts: Vec<Duration>,
    later: Vec<Duration>,
    turns: usize,
    tokens: u64,
    errors: usize,
    wall: Duration,
}

async fn run_conversations(args: &Args, work: &Arc<Workload>, targets: &[SocketAddr]) -> PhaseResult {
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.phase_seconds);
    let mut tasks = Vec::new();
    // Turns in flight at once, granted first come, first served (0: no limit).
    let turns = Arc::new(Semaphore::new(if args.in_flight == 0 { Semaphore::MAX_PERMITS } else { args.in_flight }));
    for c in 0..args.conversations {
        let (targets, work, turns) = (targets.to_vec(), Arc::clone(work), Arc::clone(&turns));
        let delay = Duration::from_millis(args.ramp_ms * c as u64 / args.conversations as u64);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            conversation(c, targets, work, deadline, turns).await
        }));
    }
    let mut r = PhaseResult { ttfts: vec![], later: vec![], turns: 0, tokens: 0, errors: 0, wall: Duration::ZERO };
    for t in tasks {
        let Ok(conv) = t.await else {
            r.errors += 1;
            continue;
        };
        r.turns += conv.ttfts.len();
        r.tokens += conv.tokens;
        r.errors += conv.errors;
        for (turn, ttft) in conv.ttfts {
            r.ttfts.push(ttft);
            if turn > 0 {
                r.later.push(ttft);
            }
        }
    }
    r.wall = started.elapsed();
    r.ttfts.sort();
    r.later.sort();
    r
}

/// The share of prompt tokens the engines found cached, from their vLLM-style `/metrics`.
async fn cache_hit_share(engines: &[SocketAddr]) -> Option<f64> {
    let (mut hits, mut queries) = (0.0, 0.0);
    for e in engines {
        let (status, body) = call(*e, "GET", "/metrics", None, "text/plain", Bytes::new()).await.ok()?;
        if status != 200 {
            return None;
        }
        for line in String::from_utf8_lossy(&body).lines() {
            let value = || line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            if line.starts_with("vllm:prefix_cache_hits_total{") {
                hits += value();
            } else if line.starts_with("vllm:prefix_cache_queries_total{") {
                queries += value();
            }
        }
    }
    (queries > 0.0).then(|| hits / queries)
}

/// Starts the phase's engines; their addresses.
async fn start_engines(args: &Args, tela: &Tela, procs: &mut Procs) -> Result<Vec<SocketAddr>> {
    let mut engines = Vec::new();
    if args.engine == "llama" {
        let python = args.llama_python.as_ref().ok_or("--engine llama needs --llama-python (or TELA_LLAMA_PYTHON)")?;
        let model = args.llama_model.as_ref().ok_or("--engine llama needs --llama-model (or TELA_LLAMA_MODEL)")?;
        for _ in 0..args.engines {
            let port = free_port()?;
            procs.spawn(
                Command::new(python)
                    .args(["-m", "llama_cpp.server", "--model"])
                    .arg(model)
                    .args(["--model_alias", MODEL, "--host", "127.0.0.1", "--port", &port.to_string()])
                    .args(["--n_ctx", "4096", "--verbose", "false", "--interrupt_requests", "false"])
                    // The prompt cache: KV states kept in RAM, the longest matching one restored.
                    .args(["--cache", "true", "--cache_type", "ram"]),
                0,
            )?;
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
            wait_until(addr, "/v1/models", None, Duration::from_secs(60), |_| true).await?;
            // Its first request takes seconds (the weights page in): not the workload's cost.
            let warm = json!({"model": MODEL, "messages": [{"role": "user", "content": "Hello."}], "max_tokens": 1});
            call(addr, "POST", "/v1/chat/completions", None, "application/json", Bytes::from(warm.to_string())).await?;
            engines.push(addr);
        }
        return Ok(engines);
    }
    let flags = [
        ("--ttft-ms", args.ttft_ms),
        ("--prefill-us-per-token", args.prefill_us),
        ("--tokens-per-s", args.tokens_per_s),
        ("--kv-cache-tokens", args.kv_cache_tokens),
        ("--max-num-seqs", args.max_num_seqs),
    ]
    .map(|(f, v)| (f, v.to_string()));
    let mut argv = vec!["--model", MODEL];
    for (f, v) in &flags {
        argv.extend([*f, v.as_str()]);
    }
    for _ in 0..args.engines {
        engines.push(tela.engine_sim(procs, &argv)?);
    }
    Ok(engines)
}

/// Waits until the gateway at `api` has a tunnel to `n` routable nodes.
async fn tunnels(api: SocketAddr, n: usize) -> Result<()> {
    wait_until(api, "/status", None, Duration::from_secs(60), |b| {
        serde_json::from_slice::<Value>(b).is_ok_and(|v| {
            v["nodes"]
                .as_array()
                .is_some_and(|ns| ns.iter().filter(|n| n["routable"] == true && n["tunnel"] == true).count() >= n)
        })
    })
    .await
}

/// Starts the phase's router in front of `engines`; the addresses clients alternate between.
async fn start_front(
    phase: &str,
    args: &Args,
    tela: &Tela,
    procs: &mut Procs,
    engines: &[SocketAddr],
) -> Result<Vec<SocketAddr>> {
    if let Some(policy) = phase.strip_prefix("vllm-") {
        let bin = args.vllm_router.as_ref().ok_or("vllm-router not found: run benches/setup-vllm-router.sh")?;
        let port = free_port()?;
        let mut cmd = Command::new(bin);
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string(), "--policy", policy, "--log-level", "warning"])
            .args(["--prometheus-port", &free_port()?.to_string()])
            .arg("--worker-urls")
            .args(engines.iter().map(|e| format!("http://{e}")));
        procs.spawn(&mut cmd, 0)?;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        wait_until(addr, "/v1/models", None, Duration::from_secs(60), |_| true).await?;
        return Ok(vec![addr]);
    }
    let (routing, gateways) = match phase {
        "tela-prefix" => ("prefix", 1),
        "tela-prefix-2gw" => ("prefix", 2),
        "tela-p2c" => ("p2c", 1),
        "tela-p2c-2gw" => ("p2c", 2),
        other => return Err(format!("unknown phase {other}").into()),
    };
    let flags = ["--no-auth", "--no-ledger", "--open-status", "--routing", routing];
    let first = tela.gateway(procs, &format!("{phase}-gw0"), &flags)?;
    let mut anchors = vec![first.anchor.clone()];
    let mut apis = vec![first.api];
    for g in 1..gateways {
        let mut more = flags.to_vec();
        more.extend(["--join", &first.anchor]);
        let gw = tela.gateway(procs, &format!("{phase}-gw{g}"), &more)?;
        anchors.push(gw.anchor);
        apis.push(gw.api);
    }
    let join: Vec<&str> = anchors.iter().map(String::as_str).collect();
    // llama-cpp-python's server answers one request at a time, health probes included: a probe
    // queued behind a few seconds of prefills times out (5 s) and three in a row (2 s apart by
    // default) would turn the node DOWN mid-run. Probing every 30 s keeps it up.
    let node_flags: &[&str] = if args.engine == "llama" { &["--probe-interval", "30s"] } else { &[] };
    for (i, e) in engines.iter().enumerate() {
        tela.node(procs, &format!("{phase}-node{i}"), &join, &format!("http://{e}"), node_flags)?;
    }
    for api in &apis {
        tunnels(*api, engines.len()).await?;
    }
    Ok(apis)
}

fn label(phase: &str) -> &str {
    match phase {
        "tela-prefix" => "Tela prefix, 1 gateway",
        "tela-prefix-2gw" => "Tela prefix, 2 gateways",
        "tela-p2c" => "Tela p2c, 1 gateway",
        "tela-p2c-2gw" => "Tela p2c, 2 gateways",
        "vllm-cache_aware" => "vllm-router cache_aware",
        "vllm-round_robin" => "vllm-router round_robin",
        other => other,
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = parse_args()?;
    let dir = TempDir::new("tela-affinity")?;
    let tela = Tela { bin: args.tela.clone(), dir: dir.path().to_path_buf(), secret: SECRET.into() };
    let work = Arc::new(Workload::new(&args));
    if args.engine == "llama" {
        println!(
            "{} llama-cpp-python engines (prompt cache on); {} conversations x {} turns, {} system prompts of ~{} tokens \
             (4 chars each), first message ~{}, follow-ups ~{}, answers <= {} tokens",
            args.engines, args.conversations, args.turns, args.groups, args.system_tokens, args.first_tokens,
            args.followup_tokens, args.max_tokens
        );
    } else {
        println!(
            "{} engine-sims per phase: TTFT {} ms + {} us per uncached prompt token, {} tokens/s, KV cache {} tokens, \
             {} requests at once; {} conversations x {} turns, {} system prompts of ~{} tokens, first message ~{}, \
             follow-ups ~{}, answers <= {} tokens",
            args.engines,
            args.ttft_ms,
            args.prefill_us,
            args.tokens_per_s,
            args.kv_cache_tokens,
            args.max_num_seqs,
            args.conversations,
            args.turns,
            args.groups,
            args.system_tokens,
            args.first_tokens,
            args.followup_tokens,
            args.max_tokens
        );
    }
    println!(
        "| router | TTFT p50 ms | TTFT p90 ms | p50 turns 2+ ms | turns | turns/s | tokens/s | errors | prefix-cache hits |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for phase in &args.phases {
        let mut procs = Procs::default();
        let engines = start_engines(&args, &tela, &mut procs).await?;
        let targets = match start_front(phase, &args, &tela, &mut procs, &engines).await {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{phase}: could not start ({e}); left out");
                continue;
            }
        };
        let r = run_conversations(&args, &work, &targets).await;
        let hits = cache_hit_share(&engines).await.map_or_else(|| "-".to_string(), |h| format!("{:.0}%", h * 100.0));
        let secs = r.wall.as_secs_f64();
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {} | {:.1} | {:.0} | {} | {} |",
            label(phase),
            pct(&r.ttfts, 0.5),
            pct(&r.ttfts, 0.9),
            pct(&r.later, 0.5),
            r.turns,
            r.turns as f64 / secs,
            r.tokens as f64 / secs,
            r.errors,
            hits
        );
        drop(procs);
    }
    Ok(())
}
