//! The built-in engine simulator (`tela engine-sim`): an OpenAI-compatible HTTP server that
//! stands in for vLLM or llama.cpp in demos and tests.
//!
//! **It is not a model.** It answers with deterministic placeholder text — words drawn from a
//! small fixed list by a RNG seeded from `(seed, prompt)` — paced like a real engine with a
//! prefix cache (below). The same seed and prompt always give the same text, so tests can
//! compare runs, and a stream's content always equals the non-stream answer to the same request.
//!
//! # The engine model
//! - **Tokens.** There is no tokenizer: a token is 4 characters of the prompt text (at least one
//!   token per prompt), for `usage` and for the cache alike. A chat request's prompt is its
//!   messages in order, each flattened to `role: content\n`, so a conversation's next turn
//!   starts with exactly the text of the turn before.
//! - **Prefix cache.** Like vLLM's automatic prefix caching: the sequence is cut into blocks of
//!   [`BLOCK_TOKENS`] tokens (64 characters), each keyed by a hash chained over the model and
//!   every block before it, so a block is a hit only if the whole text before it matches; only
//!   full blocks are cached and the block holding the prompt's last token is always computed.
//!   When a request starts, its prompt is looked up and the whole sequence — prompt, then the
//!   answer as a next turn resends it (`assistant: <answer>` for chat) — is cached, as an engine
//!   keeps the KV blocks of what it computed. At most [`EngineSimConfig::kv_cache_tokens`]
//!   tokens are held, least recently used blocks evicted first (a chain's tail before its
//!   head); 0 turns caching off. `usage.prompt_tokens_details.cached_tokens` says how many
//!   prompt tokens were found.
//! - **Time to first token** = [`EngineSimConfig::ttft`] + uncached prompt tokens ×
//!   [`EngineSimConfig::prefill_per_token`], counted from when the request starts running; then
//!   one token every `1 / tokens_per_s`. With the defaults (50 ms, 200 µs per token), a
//!   2,000-token prompt takes 0.45 s to its first token cold and about 50 ms once cached.
//!   Each request's prefill is costed alone: concurrent prefills do not slow each other.
//! - **Slots.** At most [`EngineSimConfig::max_num_seqs`] generation requests run at once;
//!   later ones wait for a slot (their response headers come when they start running).
//!   Running requests hold KV blocks for their prompt and answer; their share of the cache's
//!   capacity is the reported KV-cache usage.
//! - **Serial.** With [`EngineSimConfig::serial`] (`--serial`) the server takes one request at
//!   a time, whatever the endpoint, as llama-cpp-python's does: `GET /health` and
//!   `GET /v1/models` wait in line behind a generation until its last byte has been sent.
//!
//! The cache and counters are shared by all connections of one engine, behind one mutex held
//! for a lookup and an insert per request.
//!
//! # Endpoints
//! - `GET /health` — `200 {"status":"ok"}` once ready, `503` while the simulated weights load.
//! - `GET /metrics` — the Prometheus text format with vLLM's metric names, each series labelled
//!   `model_name="<model>",engine="0"`: `vllm:num_requests_running`,
//!   `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (and the older
//!   `vllm:gpu_cache_usage_perc`), `vllm:prefix_cache_queries_total` and
//!   `vllm:prefix_cache_hits_total` in tokens (and the older `vllm:gpu_prefix_cache_*_total`
//!   and `vllm:gpu_prefix_cache_hit_rate`), `vllm:prompt_tokens_total`,
//!   `vllm:generation_tokens_total`, the histogram `vllm:time_to_first_token_seconds` and
//!   `vllm:cache_config_info`.
//! - `GET /v1/models`, `GET /v1/models/{id}` — the served models, `owned_by: "tela-engine-sim"`.
//! - `POST /v1/chat/completions`, `POST /v1/completions` — `stream: true|false`,
//!   `stream_options.include_usage`, `max_tokens` / `max_completion_tokens` (default 16, at most
//!   [`EngineSimConfig::max_tokens_limit`]), `n` = 1 only. Other sampling parameters are accepted
//!   and ignored. Streams use OpenAI's SSE framing: `data: {json}\n\n` per chunk (the first chat
//!   chunk carries the role, then one token per chunk, then a chunk with `finish_reason`, the
//!   optional usage chunk) and `data: [DONE]\n\n`.
//! - `POST /v1/embeddings` — a string or a list of strings; deterministic unit vectors derived
//!   from a hash of each text (`encoding_format: "base64"` and `dimensions` are honoured).
//! - `POST /v1/responses`, `/v1/audio/transcriptions` (multipart), `/v1/images/generations`,
//!   `/v1/rerank` — small deterministic answers in OpenAI's shapes, so that the gateway's
//!   forwarding of every OpenAI route can be tested (`routes.rs` says what each returns).
//!
//! Errors use OpenAI's shape `{"error":{"message","type","param","code"}}`: malformed JSON or a
//! missing field → 400 `invalid_request_error`; an unknown model → 404 `model_not_found`
//! naming the served models; an unknown path → 404; a wrong method → 405.
//!
//! # Faults
//! With [`EngineSimConfig::fail_rate`] > 0, each otherwise valid inference request (chat,
//! completions, embeddings) fails with that probability, drawn from an RNG seeded by
//! [`EngineSimConfig::seed`] in arrival order, in the way [`FailMode`] says. Malformed requests
//! keep their 4xx answers and `/health` / `/v1/models` never fail, so a prober still sees a
//! healthy engine that drops work — the case a gateway's retry logic must handle.
//!
//! # Embedding
//! [`serve`] runs on a listener you bound; [`spawn`] binds, starts the server on the current
//! tokio runtime and returns an [`EngineSimHandle`] with the bound address and live
//! [`EngineSimStats`], so one process (the demo, a test) can run several engines.

mod cli;
mod generate;
mod http;
mod kv_cache;
mod metrics;
mod openai;
mod routes;
mod scheduler;
pub mod sse;
mod stream;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

pub use cli::EngineSimArgs;
pub use kv_cache::BLOCK_TOKENS;

use scheduler::{Scheduler, SchedulerSettings};

/// Default prefix-cache capacity, in tokens.
pub const DEFAULT_KV_CACHE_TOKENS: u64 = 65_536;

/// Default prefill cost of one uncached prompt token, in microseconds.
pub const DEFAULT_PREFILL_US_PER_TOKEN: u64 = 200;

/// Default number of requests generating at once (vLLM's `--max-num-seqs` default).
pub const DEFAULT_MAX_NUM_SEQS: u32 = 256;

/// The largest prefix cache the simulator accepts, in tokens.
const MAX_KV_CACHE_TOKENS: u64 = 100_000_000;

/// The largest prefill cost per token the simulator accepts.
const MAX_PREFILL_PER_TOKEN: Duration = Duration::from_secs(1);

/// What `owned_by` says in `/v1/models`, so nobody mistakes the simulator for a real engine.
pub const OWNED_BY: &str = "tela-engine-sim";

/// The longest delay (time to first token, startup delay) the simulator accepts.
const MAX_DELAY: Duration = Duration::from_secs(24 * 3600);

/// How a request chosen by [`EngineSimConfig::fail_rate`] fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FailMode {
    /// Answer `500` with an OpenAI-shaped `server_error` before any other byte.
    #[default]
    #[value(name = "http-500")]
    Http500,
    /// Close the connection without answering.
    #[value(name = "drop")]
    Drop,
    /// Streams: cut the connection after a few chunks, with no `[DONE]`. Non-stream: `500`.
    #[value(name = "mid-stream")]
    MidStream,
}

impl std::fmt::Display for FailMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FailMode::Http500 => "http-500",
            FailMode::Drop => "drop",
            FailMode::MidStream => "mid-stream",
        })
    }
}

/// Everything that shapes a simulated engine. [`Default`] gives the CLI's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSimConfig {
    /// Model ids served; requests naming any other get `404 model_not_found`. At least one.
    pub models: Vec<String>,
    /// Time to first token of a prompt found entirely in the prefix cache; uncached prompt
    /// tokens add [`EngineSimConfig::prefill_per_token`] each.
    pub ttft: Duration,
    /// Prefix-cache capacity in tokens (whole blocks of [`BLOCK_TOKENS`]); 0 turns prefix
    /// caching off, so every prompt token is prefilled.
    pub kv_cache_tokens: u64,
    /// Prefill time of each prompt token not found in the prefix cache.
    pub prefill_per_token: Duration,
    /// Requests generating at once; more wait for a slot. 0 means no limit.
    pub max_num_seqs: u32,
    /// Tokens per second after the first; must be at least 0.001.
    pub tokens_per_s: f64,
    /// Length of embedding vectors when the request gives no `dimensions`.
    pub embedding_dim: usize,
    /// Probability in `[0, 1]` that an inference request fails.
    pub fail_rate: f64,
    /// How a failing request fails.
    pub fail_mode: FailMode,
    /// The server listens at once but answers `503` until this has passed since it started.
    pub startup_delay: Duration,
    /// Seeds the generated text and the fault draws.
    pub seed: u64,
    /// The largest `max_tokens` accepted (the simulated context length).
    pub max_tokens_limit: u32,
    /// How long a stopping server waits for in-flight responses before cutting them.
    pub shutdown_grace: Duration,
    /// Serve one request at a time, every endpoint included, like llama-cpp-python's server:
    /// a request (even `GET /health`) waits until the one before has sent its last byte.
    pub serial: bool,
}

impl Default for EngineSimConfig {
    fn default() -> Self {
        Self {
            models: vec!["sim-model".to_owned()],
            ttft: Duration::from_millis(50),
            kv_cache_tokens: DEFAULT_KV_CACHE_TOKENS,
            prefill_per_token: Duration::from_micros(DEFAULT_PREFILL_US_PER_TOKEN),
            max_num_seqs: DEFAULT_MAX_NUM_SEQS,
            tokens_per_s: 100.0,
            embedding_dim: 64,
            fail_rate: 0.0,
            fail_mode: FailMode::Http500,
            startup_delay: Duration::ZERO,
            seed: 0,
            max_tokens_limit: 4096,
            shutdown_grace: Duration::from_secs(10),
            serial: false,
        }
    }
}

impl EngineSimConfig {
    /// Checks every field; the message says which one is wrong and what would be accepted.
    pub fn validate(&self) -> Result<(), EngineSimError> {
        let invalid = |msg: String| Err(EngineSimError::InvalidConfig(msg));
        if self.models.is_empty() {
            return invalid("serve at least one model (--model NAME)".into());
        }
        for (i, model) in self.models.iter().enumerate() {
            if model.trim().is_empty() {
                return invalid("model names must not be empty".into());
            }
            if self.models[..i].contains(model) {
                return invalid(format!("model '{model}' is listed twice"));
            }
        }
        if !(self.tokens_per_s.is_finite() && self.tokens_per_s >= 0.001) {
            return invalid(format!("tokens per second must be a number of at least 0.001, not {}", self.tokens_per_s));
        }
        if !(0.0..=1.0).contains(&self.fail_rate) {
            return invalid(format!("fail rate is a probability between 0 and 1, not {}", self.fail_rate));
        }
        if !(1..=65_536).contains(&self.embedding_dim) {
            return invalid(format!("embedding dimension must be between 1 and 65536, not {}", self.embedding_dim));
        }
        if self.max_tokens_limit == 0 || self.max_tokens_limit > 1_000_000 {
            return invalid(format!("max tokens limit must be between 1 and 1000000, not {}", self.max_tokens_limit));
        }
        if self.kv_cache_tokens > MAX_KV_CACHE_TOKENS {
            return invalid(format!(
                "KV cache capacity must be at most {MAX_KV_CACHE_TOKENS} tokens, not {}",
                self.kv_cache_tokens
            ));
        }
        if self.prefill_per_token > MAX_PREFILL_PER_TOKEN {
            return invalid(format!(
                "prefill cost per token must be at most 1 s (1000000 µs), not {:?}",
                self.prefill_per_token
            ));
        }
        for (name, delay) in [
            ("time to first token", self.ttft),
            ("startup delay", self.startup_delay),
            ("shutdown grace", self.shutdown_grace),
        ] {
            if delay > MAX_DELAY {
                return invalid(format!("{name} must be at most 24 hours, not {delay:?}"));
            }
        }
        Ok(())
    }

    /// The pause between two tokens.
    fn token_interval(&self) -> Duration {
        // validate() bounds tokens_per_s to [0.001, inf), so this is at most 1000 s.
        Duration::from_secs_f64(1.0 / self.tokens_per_s)
    }
}

/// Why a simulated engine could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum EngineSimError {
    /// A setting is out of range; nothing was started.
    #[error("invalid engine simulator setting: {0}")]
    InvalidConfig(String),
    /// The address could not be bound; nothing was started.
    #[error("cannot listen on {addr}: {source} (is the port in use? --port 0 picks a free one)")]
    Bind {
        /// The address asked for.
        addr: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A socket operation failed.
    #[error("engine simulator I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The server task panicked or was cancelled.
    #[error("engine simulator task ended abnormally: {0}")]
    Task(String),
}

/// A snapshot of a simulated engine's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineSimStats {
    /// HTTP requests received, whatever their outcome.
    pub requests: u64,
    /// Requests being answered now; a stream counts until its last byte is handed to the
    /// connection or its client goes away.
    pub in_flight: u64,
    /// Inference requests answered in full (a stream counts once it sent `[DONE]`).
    pub completed: u64,
    /// Streams abandoned by their client before `[DONE]`.
    pub client_disconnects: u64,
    /// Requests failed on purpose by `fail_rate`.
    pub faults_injected: u64,
    /// Tokens sent so far, streamed or not.
    pub tokens_generated: u64,
    /// Generation requests running now (holding one of the `max_num_seqs` slots).
    pub running: u64,
    /// Generation requests waiting for a slot.
    pub waiting: u64,
    /// Prompt tokens of every generation request that ran.
    pub prompt_tokens: u64,
    /// Of those, the tokens found in the prefix cache.
    pub cached_prompt_tokens: u64,
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    in_flight: AtomicU64,
    completed: AtomicU64,
    client_disconnects: AtomicU64,
    faults_injected: AtomicU64,
    tokens_generated: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64, by: u64) {
        counter.fetch_add(by, Ordering::Relaxed);
    }
}

/// State shared by every connection of one simulated engine.
#[derive(Debug)]
struct Shared {
    config: EngineSimConfig,
    counters: Counters,
    /// Set when `serve` starts; `/health` says ready once this instant has passed.
    ready_at: OnceLock<Instant>,
    faults: Mutex<ChaCha8Rng>,
    /// Slots, prefix cache and the counters of `/metrics`.
    scheduler: Arc<Scheduler>,
    /// With [`EngineSimConfig::serial`]: the one permit a request holds until its last byte.
    serial: Arc<tokio::sync::Semaphore>,
    next_request_id: AtomicU64,
    /// Unix seconds at creation: the `created` of every model.
    created: u64,
}

impl Shared {
    fn is_ready(&self) -> bool {
        self.ready_at.get().is_some_and(|ready_at| Instant::now() >= *ready_at)
    }

    /// Draws whether the next valid inference request fails. One draw per request, in arrival
    /// order, so a seed replays the same fault pattern for the same request sequence.
    fn draw_fault(&self) -> Option<FailMode> {
        let rate = self.config.fail_rate;
        if rate <= 0.0 {
            return None;
        }
        // A poisoned lock only means another request panicked mid-draw; the RNG is still valid.
        let mut rng = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        // 53 random bits give a uniform f64 in [0, 1).
        let draw = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        (draw < rate).then(|| {
            Counters::bump(&self.counters.faults_injected, 1);
            self.config.fail_mode
        })
    }

    /// The index of `model` in the served models (0 if it is not served).
    fn model_index(&self, model: &str) -> usize {
        self.config.models.iter().position(|m| m == model).unwrap_or(0)
    }

    fn request_id(&self, prefix: &str) -> String {
        let n = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let mixed = generate::fnv1a64(&[&self.config.seed.to_le_bytes(), &n.to_le_bytes()]);
        format!("{prefix}-{mixed:016x}")
    }
}

/// Holds a request in the `in_flight` count until dropped.
struct InFlight(Arc<Shared>);

impl InFlight {
    fn enter(shared: &Arc<Shared>) -> Self {
        Counters::bump(&shared.counters.requests, 1);
        Counters::bump(&shared.counters.in_flight, 1);
        InFlight(Arc::clone(shared))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// One simulated engine: its configuration and live counters. Cheap to clone; clones share
/// the counters.
#[derive(Debug, Clone)]
pub struct EngineSim {
    shared: Arc<Shared>,
}

impl EngineSim {
    /// Checks `config` and prepares an engine; nothing listens until [`EngineSim::serve`].
    pub fn new(config: EngineSimConfig) -> Result<Self, EngineSimError> {
        config.validate()?;
        let faults = ChaCha8Rng::seed_from_u64(config.seed ^ 0x6661_756c_7473); // "faults"
        let scheduler = Scheduler::new(
            &config.models,
            SchedulerSettings {
                ttft_base: config.ttft,
                prefill_per_token: config.prefill_per_token,
                kv_cache_tokens: config.kv_cache_tokens,
                max_num_seqs: config.max_num_seqs,
            },
        );
        Ok(Self {
            shared: Arc::new(Shared {
                config,
                counters: Counters::default(),
                ready_at: OnceLock::new(),
                faults: Mutex::new(faults),
                scheduler: Arc::new(scheduler),
                serial: Arc::new(tokio::sync::Semaphore::new(1)),
                next_request_id: AtomicU64::new(0),
                created: unix_now(),
            }),
        })
    }

    /// The configuration this engine runs with.
    pub fn config(&self) -> &EngineSimConfig {
        &self.shared.config
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> EngineSimStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let models = self.shared.scheduler.snapshot().models;
        let sum = |field: fn(&scheduler::ModelSnapshot) -> u64| models.iter().map(|(_, m)| field(m)).sum();
        EngineSimStats {
            requests: get(&c.requests),
            in_flight: get(&c.in_flight),
            completed: get(&c.completed),
            client_disconnects: get(&c.client_disconnects),
            faults_injected: get(&c.faults_injected),
            tokens_generated: get(&c.tokens_generated),
            running: sum(|m| m.running),
            waiting: sum(|m| m.waiting),
            prompt_tokens: sum(|m| m.prompt_tokens),
            cached_prompt_tokens: sum(|m| m.hit_tokens),
        }
    }

    /// Serves HTTP/1.1 with keep-alive on `listener` until `shutdown` resolves, then stops
    /// accepting, lets in-flight responses finish for up to
    /// [`EngineSimConfig::shutdown_grace`], cuts what is left and returns. The startup delay
    /// counts from this call.
    pub async fn serve(&self, listener: TcpListener, shutdown: impl Future<Output = ()>) -> Result<(), EngineSimError> {
        let config = &self.shared.config;
        self.shared.ready_at.get_or_init(|| Instant::now() + config.startup_delay);
        let graceful = GracefulShutdown::new();
        let mut connections = JoinSet::new();
        let service = hyper::service::service_fn({
            let shared = Arc::clone(&self.shared);
            move |request| http::handle(Arc::clone(&shared), request)
        });
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => {
                    let (socket, peer) = match accepted {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            // Usually out of file descriptors: back off instead of spinning.
                            tracing::warn!("engine simulator cannot accept a connection: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    if let Err(e) = socket.set_nodelay(true) {
                        tracing::warn!(%peer, "cannot set TCP_NODELAY: {e}");
                    }
                    tracing::debug!(%peer, "connection accepted");
                    let connection = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(socket), service.clone());
                    let connection = graceful.watch(connection);
                    connections.spawn(async move {
                        if let Err(e) = connection.await {
                            tracing::debug!(%peer, "connection ended: {e}");
                        }
                    });
                }
                Some(ended) = connections.join_next(), if !connections.is_empty() => {
                    if let Err(e) = ended {
                        tracing::error!("connection task failed: {e}");
                    }
                }
            }
        }
        drop(listener);
        tracing::info!(in_flight = self.stats().in_flight, "engine simulator stopping; finishing in-flight responses");
        if tokio::time::timeout(config.shutdown_grace, graceful.shutdown()).await.is_err() {
            tracing::warn!("in-flight responses outlived the {:?} shutdown grace; cutting them", config.shutdown_grace);
        }
        connections.shutdown().await;
        Ok(())
    }
}

/// Serves `config` on `listener` until `shutdown` resolves (see [`EngineSim::serve`]).
pub async fn serve(
    config: EngineSimConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), EngineSimError> {
    EngineSim::new(config)?.serve(listener, shutdown).await
}

/// Binds `addr` (port 0 picks a free port) and serves `config` there on a task of the current
/// tokio runtime. The returned handle owns the server: dropping it stops the server too.
pub async fn spawn(config: EngineSimConfig, addr: SocketAddr) -> Result<EngineSimHandle, EngineSimError> {
    let engine = EngineSim::new(config)?;
    let listener =
        TcpListener::bind(addr).await.map_err(|source| EngineSimError::Bind { addr: addr.to_string(), source })?;
    let local_addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn({
        let engine = engine.clone();
        async move {
            // A dropped sender stops the server just like an explicit stop.
            let shutdown = async {
                let _ = stopped.await;
            };
            engine.serve(listener, shutdown).await
        }
    });
    Ok(EngineSimHandle { local_addr, engine, stop: Some(stop), task })
}

/// A running simulated engine started by [`spawn`].
#[derive(Debug)]
pub struct EngineSimHandle {
    local_addr: SocketAddr,
    engine: EngineSim,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), EngineSimError>>,
}

impl EngineSimHandle {
    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The OpenAI base URL, e.g. `http://127.0.0.1:41234/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.local_addr)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> EngineSimStats {
        self.engine.stats()
    }

    /// Stops accepting, waits for in-flight responses (bounded by the shutdown grace) and
    /// returns how the server ended.
    pub async fn shutdown(mut self) -> Result<(), EngineSimError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.map_err(|e| EngineSimError::Task(e.to_string()))?
    }
}
