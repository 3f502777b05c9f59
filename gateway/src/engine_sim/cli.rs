//! `tela engine-sim`: the command-line face of the simulator.

use std::io::Write;
use std::time::Duration;

use super::{
    EngineSim, EngineSimConfig, EngineSimError, FailMode, DEFAULT_KV_CACHE_TOKENS, DEFAULT_MAX_NUM_SEQS,
    DEFAULT_PREFILL_US_PER_TOKEN,
};

/// Run the engine simulator: an OpenAI-compatible server that generates placeholder text.
///
/// It stands in for vLLM or llama.cpp in demos and tests. It is NOT a model: answers are
/// words from a fixed list, chosen deterministically from the seed and the prompt. It models
/// an engine's prefix cache (blocks of 16 tokens of ~4 characters, least recently used evicted
/// first): the first token comes --ttft-ms plus --prefill-us-per-token for each prompt token
/// not already cached, the rest at --tokens-per-s. GET /metrics serves vLLM's Prometheus
/// metrics (running and waiting requests, KV-cache usage, prefix-cache hits). The first line
/// on stdout is the bound address (`listening on http://HOST:PORT`); logs go to stderr.
/// Ctrl-C or SIGTERM stops it after in-flight responses finish.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineSimArgs {
    /// Address to listen on. Loopback by default: the simulator has no authentication.
    #[arg(long, default_value = "127.0.0.1", value_name = "HOST")]
    pub host: String,

    /// Port to listen on; 0 picks a free port (read it from the first line of stdout).
    #[arg(long, default_value_t = 8000, value_name = "PORT")]
    pub port: u16,

    /// Model id to serve; repeat for several. Requests for other models get 404.
    #[arg(long = "model", value_name = "NAME", default_values_t = [String::from("sim-model")])]
    pub models: Vec<String>,

    /// Time to first token of a fully cached prompt, in milliseconds (uncached tokens add more).
    #[arg(long, default_value_t = 50, value_name = "MS")]
    pub ttft_ms: u64,

    /// Prefill cost of each prompt token not in the prefix cache, in microseconds.
    #[arg(long, default_value_t = DEFAULT_PREFILL_US_PER_TOKEN, value_name = "US")]
    pub prefill_us_per_token: u64,

    /// Prefix-cache capacity in tokens (16-token blocks, LRU eviction); 0 turns caching off.
    #[arg(long, default_value_t = DEFAULT_KV_CACHE_TOKENS, value_name = "TOKENS")]
    pub kv_cache_tokens: u64,

    /// Requests generating at once; more wait in a queue (vllm:num_requests_waiting). 0: no limit.
    #[arg(long, default_value_t = DEFAULT_MAX_NUM_SEQS, value_name = "N")]
    pub max_num_seqs: u32,

    /// Tokens generated per second after the first.
    #[arg(long, default_value_t = 100.0, value_name = "RATE")]
    pub tokens_per_s: f64,

    /// Length of the vectors /v1/embeddings returns (unless the request sets `dimensions`).
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub embedding_dim: usize,

    /// Probability (0 to 1) that an inference request fails on purpose.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    pub fail_rate: f64,

    /// How a request chosen by --fail-rate fails.
    #[arg(long, value_enum, default_value_t = FailMode::Http500, value_name = "MODE")]
    pub fail_mode: FailMode,

    /// Answer 503 on every endpoint for this long after starting, like an engine loading
    /// its weights. The port is open at once.
    #[arg(long, default_value_t = 0, value_name = "MS")]
    pub startup_delay_ms: u64,

    /// Seed for the generated text and the fault draws.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Serve one request at a time, like llama-cpp-python's server: every request, GET /health
    /// included, waits until the one before has sent its last byte.
    #[arg(long)]
    pub serial: bool,
}

impl EngineSimArgs {
    /// The configuration these flags describe.
    pub fn config(&self) -> EngineSimConfig {
        EngineSimConfig {
            models: self.models.clone(),
            ttft: Duration::from_millis(self.ttft_ms),
            prefill_per_token: Duration::from_micros(self.prefill_us_per_token),
            kv_cache_tokens: self.kv_cache_tokens,
            max_num_seqs: self.max_num_seqs,
            tokens_per_s: self.tokens_per_s,
            embedding_dim: self.embedding_dim,
            fail_rate: self.fail_rate,
            fail_mode: self.fail_mode,
            startup_delay: Duration::from_millis(self.startup_delay_ms),
            seed: self.seed,
            serial: self.serial,
            ..EngineSimConfig::default()
        }
    }

    /// Binds, prints `listening on http://ADDR` as the first line of stdout, and serves until
    /// Ctrl-C or SIGTERM.
    pub async fn run(self) -> Result<(), EngineSimError> {
        let engine = EngineSim::new(self.config())?;
        // Before the address is printed: whoever reads it may signal right away.
        let shutdown = tela_runtime::signals::terminate()?;
        let wanted = format!("{}:{}", self.host, self.port);
        let listener = tokio::net::TcpListener::bind((self.host.as_str(), self.port))
            .await
            .map_err(|source| EngineSimError::Bind { addr: wanted, source })?;
        let local_addr = listener.local_addr()?;
        {
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "listening on http://{local_addr}")?;
            stdout.flush()?;
        }
        tracing::info!(
            models = ?engine.config().models,
            "engine simulator listening on http://{local_addr} (placeholder text, not a model)"
        );
        engine.serve(listener, shutdown).await?;
        tracing::info!("engine simulator stopped");
        Ok(())
    }
}
