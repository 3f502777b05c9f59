//! Reading an engine's load from its Prometheus `/metrics` page.
//!
//! Three dialects are understood, by their gauges' names (a page may mix them; each is read
//! where present):
//!
//! | engine    | running                      | waiting                      | KV-cache usage (0–1)        |
//! |-----------|------------------------------|------------------------------|-----------------------------|
//! | vLLM      | `vllm:num_requests_running`  | `vllm:num_requests_waiting`  | `vllm:kv_cache_usage_perc`, else the older `vllm:gpu_cache_usage_perc` |
//! | SGLang    | `sglang:num_running_reqs`    | `sglang:num_queue_reqs`      | `sglang:token_usage`        |
//! | llama.cpp | `llamacpp:requests_processing` | `llamacpp:requests_deferred` | `llamacpp:kv_cache_usage_ratio` (older builds only) |
//!
//! Samples are grouped by their `model_name` label (none: the whole engine, as on llama.cpp).
//! Within a model, series that differ by a data-parallel rank (`engine` on vLLM, `dp_rank` on
//! SGLang) are separate schedulers and are summed; series that differ by anything else (a
//! tensor- or pipeline-parallel rank) describe the same scheduler and the largest is taken.
//! KV usage is the largest over a model's series: a new request may land on the fullest one.
//!
//! The parser is deliberately small and tolerant — a line it cannot read is skipped, never an
//! error — since it only needs a few gauges: `name{labels} value [timestamp]`, label values
//! with `\\`, `\"` and `\n` escapes, `# HELP` / `# TYPE` comments, OpenMetrics' `# EOF`. A
//! family declared by `# TYPE` but without samples yet (SGLang before its first batch) reads
//! as zero. A page with none of these families is not an engine this reader knows:
//! [`parse_engine_metrics`] returns `None`.

use std::collections::BTreeMap;

use crate::load_report::ModelLoad;

/// What a gauge measures.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Gauge {
    Running,
    Waiting,
    KvUsage,
    /// vLLM's older name of the KV usage, read only where the newer one is absent.
    KvUsageOld,
}

fn gauge(name: &str) -> Option<Gauge> {
    Some(match name {
        "vllm:num_requests_running" | "sglang:num_running_reqs" | "llamacpp:requests_processing" => Gauge::Running,
        "vllm:num_requests_waiting" | "sglang:num_queue_reqs" | "llamacpp:requests_deferred" => Gauge::Waiting,
        "vllm:kv_cache_usage_perc" | "sglang:token_usage" | "llamacpp:kv_cache_usage_ratio" => Gauge::KvUsage,
        "vllm:gpu_cache_usage_perc" => Gauge::KvUsageOld,
        _ => return None,
    })
}

/// One scheduler's figures (the largest of its series).
#[derive(Default)]
struct Scheduler {
    running: f64,
    waiting: f64,
    kv: Option<f64>,
    kv_old: Option<f64>,
}

/// The per-model load on a `/metrics` page, or `None` when the page has none of the known
/// gauges (see the module docs).
pub fn parse_engine_metrics(text: &str) -> Option<Vec<ModelLoad>> {
    let mut known = false;
    // (model, data-parallel rank) → figures; ordered, so reports list models alike every time.
    let mut schedulers: BTreeMap<(String, String), Scheduler> = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.split_whitespace();
            if matches!(words.next(), Some("TYPE" | "HELP")) {
                let is_load =
                    words.next().and_then(gauge).is_some_and(|g| matches!(g, Gauge::Running | Gauge::Waiting));
                known |= is_load;
            }
            continue;
        }
        let Some(sample) = Sample::parse(line) else { continue };
        let Some(which) = gauge(sample.name) else { continue };
        if !sample.value.is_finite() || sample.value < 0.0 {
            continue;
        }
        known |= matches!(which, Gauge::Running | Gauge::Waiting);
        let s = schedulers.entry((sample.model, sample.rank)).or_default();
        let v = sample.value;
        match which {
            Gauge::Running => s.running = s.running.max(v),
            Gauge::Waiting => s.waiting = s.waiting.max(v),
            Gauge::KvUsage => s.kv = Some(s.kv.unwrap_or(0.0).max(v)),
            Gauge::KvUsageOld => s.kv_old = Some(s.kv_old.unwrap_or(0.0).max(v)),
        }
    }
    if !known {
        return None;
    }
    let mut models: Vec<ModelLoad> = Vec::new();
    for ((model, _rank), s) in schedulers {
        let kv = s.kv.or(s.kv_old).map(|f| (f.min(1.0) * 1000.0).round() as u16);
        let (running, waiting) = (count(s.running), count(s.waiting));
        match models.last_mut() {
            Some(m) if m.model == model => {
                m.running = m.running.saturating_add(running);
                m.waiting = m.waiting.saturating_add(waiting);
                m.kv_permille = m.kv_permille.max(kv);
            }
            _ => models.push(ModelLoad { model, running, waiting, kv_permille: kv }),
        }
    }
    if models.is_empty() {
        models.push(ModelLoad { model: String::new(), running: 0, waiting: 0, kv_permille: None });
    }
    Some(models)
}

/// A gauge value as a request count.
fn count(v: f64) -> u32 {
    v.round().min(f64::from(u32::MAX)) as u32
}

/// One sample line, as far as the load needs it.
struct Sample<'a> {
    name: &'a str,
    model: String,
    rank: String,
    value: f64,
}

impl<'a> Sample<'a> {
    /// `name{labels} value [timestamp]`; `None` for a line of any other shape.
    fn parse(line: &'a str) -> Option<Sample<'a>> {
        let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
        let (name, mut rest) = line.split_at(name_end);
        let (mut model, mut rank) = (String::new(), String::new());
        if let Some(labels) = rest.strip_prefix('{') {
            let (pairs, after) = parse_labels(labels)?;
            for (key, value) in pairs {
                match key {
                    "model_name" => model = value,
                    "engine" | "dp_rank" => rank = value,
                    _ => {}
                }
            }
            rest = after;
        }
        let value = rest.split_whitespace().next()?.parse().ok()?;
        Some(Sample { name, model, rank, value })
    }
}

/// Reads `key="value",...}` up to the closing brace; returns the pairs and what follows.
fn parse_labels(mut s: &str) -> Option<(Vec<(&str, String)>, &str)> {
    let mut pairs = Vec::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(after) = s.strip_prefix('}') {
            return Some((pairs, after));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim();
        s = s[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()? {
                    (_, 'n') => value.push('\n'),
                    (_, c) => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        pairs.push((key, value));
        s = &s[end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(model: &str, running: u32, waiting: u32, kv_permille: Option<u16>) -> ModelLoad {
        ModelLoad { model: model.into(), running, waiting, kv_permille }
    }

    #[test]
    fn vllm_pages_read_per_model_and_sum_data_parallel_engines() {
        let page = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.4567
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.1
vllm:gpu_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.99
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
"#;
        assert_eq!(
            parse_engine_metrics(page),
            Some(vec![load("meta-llama/Llama-3.1-8B-Instruct", 5, 4, Some(457))]),
            "the newer KV name wins over the older one"
        );
        // vLLM before the v1 engine: no `engine` label, only the older KV name.
        let old = "vllm:num_requests_running{model_name=\"a\"} 1.0\nvllm:num_requests_waiting{model_name=\"a\"} 2.0\n\
                   vllm:gpu_cache_usage_perc{model_name=\"a\"} 0.25\nvllm:num_requests_running{model_name=\"b\"} 7\n";
        assert_eq!(parse_engine_metrics(old), Some(vec![load("a", 1, 2, Some(250)), load("b", 7, 0, None)]));
    }

    #[test]
    fn sglang_pages_take_the_largest_tensor_rank_and_sum_dp_ranks() {
        let page = r#"# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen3-8B",tp_rank="0",dp_rank="0"} 8.0
sglang:num_running_reqs{model_name="Qwen/Qwen3-8B",tp_rank="1",dp_rank="0"} 8.0
sglang:num_running_reqs{model_name="Qwen/Qwen3-8B",tp_rank="0",dp_rank="1"} 2.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="Qwen/Qwen3-8B",tp_rank="0",dp_rank="0"} 4
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="Qwen/Qwen3-8B",tp_rank="0",dp_rank="0"} 0.28
sglang:token_usage{model_name="Qwen/Qwen3-8B",tp_rank="0",dp_rank="1"} 0.52
"#;
        assert_eq!(parse_engine_metrics(page), Some(vec![load("Qwen/Qwen3-8B", 10, 4, Some(520))]));
        // Declared but no sample yet (before the first batch): idle, not unknown.
        let idle =
            "# HELP sglang:num_running_reqs The number of running requests.\n# TYPE sglang:num_running_reqs gauge\n";
        assert_eq!(parse_engine_metrics(idle), Some(vec![load("", 0, 0, None)]));
    }

    #[test]
    fn llama_cpp_pages_are_the_whole_engine() {
        let page = "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n\
                    # TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 6886\n\
                    # HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.\n\
                    # TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.125\n\
                    # HELP llamacpp:requests_processing Number of requests processing.\n\
                    # TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n\
                    # HELP llamacpp:requests_deferred Number of requests deferred.\n\
                    # TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 1\n";
        assert_eq!(parse_engine_metrics(page), Some(vec![load("", 2, 1, Some(125))]));
        // Current builds no longer export the KV ratio.
        let current = "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n";
        assert_eq!(parse_engine_metrics(current), Some(vec![load("", 1, 0, None)]));
    }

    #[test]
    fn odd_labels_timestamps_and_garbage_are_tolerated() {
        let page = "vllm:num_requests_running{model_name=\"we\\\"ird,{name}\\\\\",engine=\"0\"} 2 1733000000000\n\
                    vllm:num_requests_running {model_name=\"broken\"\n\
                    vllm:num_requests_waiting{model_name=\"we\\\"ird,{name}\\\\\",engine=\"0\"} NaN\n\
                    vllm:num_requests_waiting{model_name=\"we\\\"ird,{name}\\\\\",engine=\"0\"} -3\n\
                    vllm:kv_cache_usage_perc{model_name=\"we\\\"ird,{name}\\\\\",engine=\"0\"} 7\n\
                    vllm:num_requests_running{model_name=\"x\"} +Inf\n\
                    vllm:num_requests_running{model_name=\"x\"} many\n\
                    # EOF\n";
        assert_eq!(
            parse_engine_metrics(page),
            Some(vec![load("we\"ird,{name}\\", 2, 0, Some(1000))]),
            "a timestamp is ignored, unreadable and negative values are skipped, KV usage is capped at 100 %"
        );
        for garbage in [
            "",
            "<html><body>Not Found</body></html>",
            "{\"error\":{\"code\":501,\"message\":\"This server does not support metrics endpoint.\"}}",
            "# HELP tgi_queue_size Current queue size\ntgi_queue_size 3\n",
            "vllm:kv_cache_usage_perc{model_name=\"a\"} 0.5\n",
            "\u{0}\u{1}\u{2}{{{}}}\"\"\\\\ = = =",
        ] {
            assert_eq!(parse_engine_metrics(garbage), None, "{garbage:?}");
        }
    }
}
