//! The report: what the run sets up, then one Markdown table row per phase.

use tela_benches::client::percentile_ms as pct;

use super::args::Args;
use super::conversation::PhaseResult;

/// Prints what every phase runs (engines, workload) and the table's head.
pub(crate) fn header(args: &Args) {
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
}

/// Prints the row of `phase`: its figures and the engines' prefix-cache hit share ("-": unknown).
pub(crate) fn row(phase: &str, r: &PhaseResult, hits: Option<f64>) {
    let hits = hits.map_or_else(|| "-".to_string(), |h| format!("{:.0}%", h * 100.0));
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
}

fn label(phase: &str) -> &str {
    match phase {
        "tela-prefix" => "Tela prefix, 1 gateway",
        "tela-prefix-2gw" => "Tela prefix, 2 gateways",
        "tela-prefix-slots" => "Tela prefix, slots told, 1 gateway",
        "tela-prefix-2gw-slots" => "Tela prefix, slots told, 2 gateways",
        "tela-p2c" => "Tela p2c, 1 gateway",
        "tela-p2c-2gw" => "Tela p2c, 2 gateways",
        "vllm-cache_aware" => "vllm-router cache_aware",
        "vllm-round_robin" => "vllm-router round_robin",
        other => other,
    }
}
