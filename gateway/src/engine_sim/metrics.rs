//! `GET /metrics`: the engine's state in the Prometheus text format (version 0.0.4), under the
//! names vLLM's V1 engine uses, so that whatever reads a vLLM engine's load reads the simulator's
//! too.
//!
//! Every series carries `model_name="<model>"` and `engine="0"`, as vLLM labels them; an engine
//! serving several models has one series per model (the KV-cache figures are the engine's, the
//! same for each). Served:
//!
//! - `vllm:num_requests_running`, `vllm:num_requests_waiting` (gauges);
//! - `vllm:kv_cache_usage_perc` and its older name `vllm:gpu_cache_usage_perc` (gauges, 0–1: the
//!   share of the cache's blocks held by running requests);
//! - `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total` (counters, in tokens) and
//!   their older names `vllm:gpu_prefix_cache_queries_total`, `vllm:gpu_prefix_cache_hits_total`;
//!   `vllm:gpu_prefix_cache_hit_rate` (gauge, hits / queries since start, as vLLM 0.6 served);
//! - `vllm:prompt_tokens_total`, `vllm:generation_tokens_total` (counters);
//! - `vllm:time_to_first_token_seconds` (histogram with vLLM's buckets; the simulated time from
//!   arrival to the first token, waiting for a slot included);
//! - `vllm:cache_config_info` (`block_size`, `enable_prefix_caching`, `num_gpu_blocks`).

use std::fmt::Write;

use super::kv_cache::BLOCK_TOKENS;
use super::scheduler::{EngineSnapshot, ModelSnapshot, TTFT_BUCKETS};

/// The `Content-Type` of the Prometheus text format.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Renders `snapshot` in the Prometheus text format.
pub(crate) fn render(snapshot: &EngineSnapshot) -> String {
    let mut out = String::with_capacity(4096);
    let usage = snapshot.kv_cache_usage;
    let per_model: [Family; 11] = [
        family(
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            |m, _| m.running as f64,
        ),
        family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", |m, _| {
            m.waiting as f64
        }),
        family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", |_, usage| usage),
        family(
            "vllm:gpu_cache_usage_perc",
            "gauge",
            "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
            |_, usage| usage,
        ),
        family(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            |m, _| m.queried_tokens as f64,
        ),
        family(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            |m, _| m.hit_tokens as f64,
        ),
        family(
            "vllm:gpu_prefix_cache_queries_total",
            "counter",
            "GPU prefix cache queries, in terms of number of queried tokens. DEPRECATED: Use vllm:prefix_cache_queries instead.",
            |m, _| m.queried_tokens as f64,
        ),
        family(
            "vllm:gpu_prefix_cache_hits_total",
            "counter",
            "GPU prefix cache hits, in terms of number of cached tokens. DEPRECATED: Use vllm:prefix_cache_hits instead.",
            |m, _| m.hit_tokens as f64,
        ),
        family("vllm:gpu_prefix_cache_hit_rate", "gauge", "GPU prefix cache block hit rate.", |m, _| {
            if m.queried_tokens == 0 {
                0.0
            } else {
                m.hit_tokens as f64 / m.queried_tokens as f64
            }
        }),
        family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", |m, _| m.prompt_tokens as f64),
        family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", |m, _| {
            m.generation_tokens as f64
        }),
    ];
    for Family { name, kind, help, value } in per_model {
        header(&mut out, name, kind, help);
        for (model, counters) in &snapshot.models {
            let _ = writeln!(out, "{name}{} {}", labels(model, &[]), number(value(counters, usage)));
        }
    }

    let name = "vllm:time_to_first_token_seconds";
    header(&mut out, name, "histogram", "Histogram of time to first token in seconds.");
    for (model, counters) in &snapshot.models {
        for (bound, count) in TTFT_BUCKETS.iter().zip(&counters.ttft_cumulative) {
            let le = number(*bound);
            let _ = writeln!(out, "{name}_bucket{} {}", labels(model, &[("le", &le)]), number(*count as f64));
        }
        let total = counters.ttft_cumulative.last().copied().unwrap_or(0);
        let _ = writeln!(out, "{name}_bucket{} {}", labels(model, &[("le", "+Inf")]), number(total as f64));
        let _ = writeln!(out, "{name}_count{} {}", labels(model, &[]), number(total as f64));
        let _ = writeln!(out, "{name}_sum{} {}", labels(model, &[]), number(counters.ttft_sum.as_secs_f64()));
    }

    let name = "vllm:cache_config_info";
    header(&mut out, name, "gauge", "Information of the LLMEngine CacheConfig");
    let _ = writeln!(
        out,
        "{name}{{block_size=\"{BLOCK_TOKENS}\",enable_prefix_caching=\"{}\",engine=\"0\",num_gpu_blocks=\"{}\"}} 1.0",
        if snapshot.prefix_caching { "True" } else { "False" },
        snapshot.num_blocks,
    );
    out
}

/// A metric with one series per model.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    /// Its value from a model's counters and the engine's KV-cache usage.
    value: fn(&ModelSnapshot, f64) -> f64,
}

fn family(name: &'static str, kind: &'static str, help: &'static str, value: fn(&ModelSnapshot, f64) -> f64) -> Family {
    Family { name, kind, help, value }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// `{model_name="…",engine="0"}` with `extra` labels after them.
fn labels(model: &str, extra: &[(&str, &str)]) -> String {
    let mut out = format!("{{model_name=\"{}\",engine=\"0\"", escape(model));
    for (name, value) in extra {
        let _ = write!(out, ",{name}=\"{}\"", escape(value));
    }
    out.push('}');
    out
}

/// A label value as the text format requires: backslash, double quote and newline escaped.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A sample value; whole numbers keep a `.0`, as Python's client writes them.
fn number(value: f64) -> String {
    if value.is_finite() && value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.1}")
    } else {
        format!("{value}")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn snapshot() -> EngineSnapshot {
        let model = |running, hits| ModelSnapshot {
            running,
            waiting: 2,
            prompt_tokens: 100,
            queried_tokens: 100,
            hit_tokens: hits,
            generation_tokens: 7,
            ttft_cumulative: (0..=TTFT_BUCKETS.len() as u64).map(|i| i.min(3)).collect(),
            ttft_sum: Duration::from_millis(1500),
        };
        EngineSnapshot {
            models: vec![("llama \"3\"".to_owned(), model(1, 64)), ("b".to_owned(), model(0, 0))],
            kv_cache_usage: 0.25,
            num_blocks: 4096,
            prefix_caching: true,
        }
    }

    #[test]
    fn each_model_gets_labelled_series_in_vllm_names() {
        let text = render(&snapshot());
        for line in [
            "# TYPE vllm:num_requests_running gauge",
            r#"vllm:num_requests_running{model_name="llama \"3\"",engine="0"} 1.0"#,
            r#"vllm:num_requests_running{model_name="b",engine="0"} 0.0"#,
            r#"vllm:num_requests_waiting{model_name="b",engine="0"} 2.0"#,
            r#"vllm:kv_cache_usage_perc{model_name="b",engine="0"} 0.25"#,
            r#"vllm:gpu_cache_usage_perc{model_name="b",engine="0"} 0.25"#,
            "# TYPE vllm:prefix_cache_hits_total counter",
            r#"vllm:prefix_cache_hits_total{model_name="llama \"3\"",engine="0"} 64.0"#,
            r#"vllm:prefix_cache_queries_total{model_name="llama \"3\"",engine="0"} 100.0"#,
            r#"vllm:gpu_prefix_cache_hit_rate{model_name="llama \"3\"",engine="0"} 0.64"#,
            r#"vllm:gpu_prefix_cache_hit_rate{model_name="b",engine="0"} 0.0"#,
            r#"vllm:generation_tokens_total{model_name="b",engine="0"} 7.0"#,
            "# TYPE vllm:time_to_first_token_seconds histogram",
            r#"vllm:time_to_first_token_seconds_bucket{model_name="b",engine="0",le="0.001"} 0.0"#,
            r#"vllm:time_to_first_token_seconds_bucket{model_name="b",engine="0",le="2560.0"} 3.0"#,
            r#"vllm:time_to_first_token_seconds_bucket{model_name="b",engine="0",le="+Inf"} 3.0"#,
            r#"vllm:time_to_first_token_seconds_count{model_name="b",engine="0"} 3.0"#,
            r#"vllm:time_to_first_token_seconds_sum{model_name="b",engine="0"} 1.5"#,
            r#"vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",num_gpu_blocks="4096"} 1.0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
        }
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn every_sample_follows_its_type_line() {
        let text = render(&snapshot());
        let mut family = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap_or_default().to_owned();
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap_or_default();
                let base = ["_bucket", "_count", "_sum"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
                assert!(name == family || base == family, "{line} outside its family {family}");
                let value = line.rsplit(' ').next().unwrap_or_default();
                assert!(value.parse::<f64>().is_ok(), "{line}");
            }
        }
    }
}
