//! The clients: each conversation's streamed turns (TTFT to the first content chunk, the answer
//! appended to the history), all conversations of a phase run at once, and their figures.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use serde_json::{json, Value};
use tela_benches::client::connect;
use tokio::sync::Semaphore;

use super::args::Args;
use super::workload::Workload;
use super::MODEL;

/// A turn whose answer has not ended within this counts as an error (and ends its conversation).
const TURN_TIMEOUT: Duration = Duration::from_secs(120);

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

/// The figures of one phase: every TTFT, sorted, and the totals.
pub(crate) struct PhaseResult {
    pub(crate) ttfts: Vec<Duration>,
    pub(crate) later: Vec<Duration>,
    pub(crate) turns: usize,
    pub(crate) tokens: u64,
    pub(crate) errors: usize,
    pub(crate) wall: Duration,
}

/// Runs every conversation of a phase against `targets`, their starts spread over the ramp.
pub(crate) async fn run_conversations(args: &Args, work: &Arc<Workload>, targets: &[SocketAddr]) -> PhaseResult {
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
