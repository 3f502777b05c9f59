//! The command line: every flag with its default, and the usage line `--help` prints.

use std::path::PathBuf;

use tela_benches::client::Result;
use tela_benches::process::{find_vllm_router, require_tela};

/// What the command line asked for.
pub(crate) struct Args {
    pub(crate) tela: PathBuf,
    pub(crate) vllm_router: Option<PathBuf>,
    pub(crate) engine: String,
    pub(crate) llama_python: Option<PathBuf>,
    pub(crate) llama_model: Option<PathBuf>,
    pub(crate) engines: usize,
    pub(crate) conversations: usize,
    pub(crate) turns: usize,
    pub(crate) groups: usize,
    pub(crate) system_tokens: usize,
    pub(crate) first_tokens: usize,
    pub(crate) followup_tokens: usize,
    pub(crate) max_tokens: u64,
    pub(crate) ramp_ms: u64,
    pub(crate) phase_seconds: f64,
    pub(crate) ttft_ms: u64,
    pub(crate) prefill_us: u64,
    pub(crate) tokens_per_s: u64,
    pub(crate) kv_cache_tokens: u64,
    pub(crate) max_num_seqs: u64,
    pub(crate) phases: Vec<String>,
    pub(crate) in_flight: usize,
    pub(crate) slots: Option<u64>,
}

impl Args {
    /// What `-slots` phases tell the nodes their engine runs at once: `--engine-slots`, else one
    /// for llama-cpp-python (it serves one request at a time) and `--max-num-seqs` for the
    /// simulator.
    pub(crate) fn engine_slots(&self) -> u64 {
        self.slots.unwrap_or(if self.engine == "llama" { 1 } else { self.max_num_seqs })
    }
}

const USAGE: &str = "tela-affinity [--engine sim|llama] [--engines N] [--conversations N] [--turns N] [--groups N] \
    [--system-tokens N] [--first-tokens N] [--followup-tokens N] [--max-tokens N] [--ramp-ms MS] [--phase-seconds S] \
    [--ttft-ms MS] [--prefill-us US] [--tokens-per-s N] [--kv-cache-tokens N] [--max-num-seqs N] \
    [--phases a,b,..] [--in-flight N] [--engine-slots N] [--tela PATH] [--vllm-router PATH] [--llama-python PATH] [--llama-model PATH]";

/// The arguments of this run, with `--phases` defaulting to every phase of the engine kind;
/// `--help` prints the usage line and exits.
pub(crate) fn parse_args() -> Result<Args> {
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
        slots: None,
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
            "--engine-slots" => args.slots = Some(value()?.parse()?),
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
            "llama" => ["tela-prefix", "tela-prefix-slots", "tela-p2c"].map(String::from).to_vec(),
            _ => ["tela-prefix", "tela-prefix-2gw", "tela-p2c", "vllm-cache_aware", "vllm-round_robin"]
                .map(String::from)
                .to_vec(),
        };
    }
    Ok(args)
}
