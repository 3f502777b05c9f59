//! The phases' processes: the engines (engine-sims or llama-cpp-python servers), the router in
//! front of them (Tela gateways with a node per engine, or vllm-router), and the engines'
//! prefix-cache figures.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use tela_benches::client::{call, wait_until, Result};
use tela_benches::process::{free_port, Procs, Tela};

use super::args::Args;
use super::MODEL;

/// The share of prompt tokens the engines found cached, from their vLLM-style `/metrics`.
pub(crate) async fn cache_hit_share(engines: &[SocketAddr]) -> Option<f64> {
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
pub(crate) async fn start_engines(args: &Args, tela: &Tela, procs: &mut Procs) -> Result<Vec<SocketAddr>> {
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
pub(crate) async fn start_front(
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
    // A phase ending in `-slots` tells the nodes how many requests their engine runs at once.
    let (base, told_slots) = match phase.strip_suffix("-slots") {
        Some(base) => (base, true),
        None => (phase, false),
    };
    let (routing, gateways) = match base {
        "tela-prefix" => ("prefix", 1),
        "tela-prefix-2gw" => ("prefix", 2),
        "tela-p2c" => ("p2c", 1),
        "tela-p2c-2gw" => ("p2c", 2),
        _ => return Err(format!("unknown phase {phase}").into()),
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
    let slots = args.engine_slots().to_string();
    let node_flags: &[&str] = if told_slots { &["--engine-slots", &slots] } else { &[] };
    for (i, e) in engines.iter().enumerate() {
        tela.node(procs, &format!("{phase}-node{i}"), &join, &format!("http://{e}"), node_flags)?;
    }
    for api in &apis {
        tunnels(*api, engines.len()).await?;
    }
    Ok(apis)
}
