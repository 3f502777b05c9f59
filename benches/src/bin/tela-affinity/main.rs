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
//! one restored), and the phases are Tela prefix, Tela prefix with the engines' slots told
//! and Tela p2c.
//!
//! A phase name ending in `-slots` (e.g. `tela-prefix-slots`) starts its nodes with
//! `--engine-slots` (`--engine-slots N` here, else 1 for llama-cpp-python, which serves one
//! request at a time, and `--max-num-seqs` for the simulator), so the gateways send a turn to
//! an engine with a free slot rather than queue it behind another conversation.
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
//!
//! The modules: `args` (the command line), `workload` (what the conversations say),
//! `conversation` (the clients and their figures), `routers` (the engines and the router each
//! phase starts) and `report` (the table).

mod args;
mod conversation;
mod report;
mod routers;
mod workload;

use std::sync::Arc;

use tela_benches::client::Result;
use tela_benches::process::{Procs, Tela, TempDir};

use args::parse_args;
use conversation::run_conversations;
use routers::{cache_hit_share, start_engines, start_front};
use workload::Workload;

const MODEL: &str = "bench";
const SECRET: &str = "tela-affinity benchmark secret";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = parse_args()?;
    let dir = TempDir::new("tela-affinity")?;
    let tela = Tela { bin: args.tela.clone(), dir: dir.path().to_path_buf(), secret: SECRET.into() };
    let work = Arc::new(Workload::new(&args));
    report::header(&args);
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
        let hits = cache_hit_share(&engines).await;
        report::row(phase, &r, hits);
        drop(procs);
    }
    Ok(())
}
