//! The official `openai` Python SDK against the gateway (the pytest suite in `tests/python/`):
//! chat, completions, embeddings and models, streamed and not, and every error case raising
//! the SDK's matching exception class.
//!
//! The suite runs twice: behind nodes with the built-in engine simulator, and behind a node
//! with the real llama.cpp engine (SmolLM2-135M). It needs the SDK's virtual environment from
//! `.ci/setup-python.sh` (or `TELA_SDK_PYTHON`), and for the second run the engine from
//! `.ci/setup-engine.sh` (`TELA_LLAMA_PYTHON`, `TELA_LLAMA_MODEL`). Built without them in the
//! environment each test shows as ignored, with the reason; with `CI=true` they always run, so
//! CI cannot pass without them.
//!
//! Each run starts gateway A (body limit 64 KiB, two requests at a time) with its nodes, and
//! gateway B, which joins A and so knows the nodes, but advertises an address nobody can dial:
//! no node has a tunnel to it, which is the 503 "no capacity" case.

use crate::common;

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use tela_gateway::gateway::Gateway;

const MAX_BODY: usize = 64 * 1024;
const MAX_CONCURRENT: usize = 2;

/// The SDK's Python: `$TELA_SDK_PYTHON`, else the venv `.ci/setup-python.sh` makes. These tests
/// run only when the build found the SDK named (see `gateway/build.rs`), so a missing one fails.
fn sdk_python() -> PathBuf {
    if let Some(p) = std::env::var_os("TELA_SDK_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.ci/cache/sdk-venv/bin/python");
    assert!(venv.exists(), "no OpenAI SDK environment: run .ci/setup-python.sh and export what it prints");
    venv
}

async fn no_capacity_gateway(fed: &Fed) -> Gateway {
    let mut config = gateway_config(fed.dir.path());
    config.join = vec![fed.gateway.anchor_addr().to_string()];
    // Advertised, but nothing listens there: nodes learn of this gateway and cannot reach it.
    config.public_addr = Some("127.0.0.1:1".into());
    let gateway = Gateway::start(config).await.expect("gateway B starts");
    let nodes: Vec<String> = fed.nodes.iter().map(|n| n.id.to_string()).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = gateway.status();
        let known = status["nodes"].as_array().map_or(0, |ns| {
            ns.iter().filter(|n| n["routable"] == true && nodes.iter().any(|id| n["short"] == id.as_str())).count()
        });
        if known == nodes.len() {
            return gateway;
        }
        assert!(Instant::now() < deadline, "gateway B did not learn of the nodes: {status:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The SDK suite failed; the federation is left as it was for the caller to stop.
#[derive(Debug, thiserror::Error)]
#[error("the OpenAI SDK suite failed against the {engine} federation:\n{output}")]
struct SuiteFailed {
    /// Which engine the federation ran.
    engine: String,
    /// What pytest printed.
    output: String,
}

fn run_pytest(
    python: &PathBuf,
    fed: &Fed,
    no_capacity: &Gateway,
    model: &str,
    engine: &str,
    broken: Option<&str>,
) -> Result<(), SuiteFailed> {
    let suite = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python");
    let mut cmd = Command::new(python);
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(&suite)
        .env("TELA_BASE_URL", format!("{}/v1", fed.base()))
        .env("TELA_API_KEY", KEY)
        .env("TELA_MODEL", model)
        .env("TELA_ENGINE", engine)
        .env("TELA_NO_CAPACITY_URL", format!("{}/v1", no_capacity.base_url()))
        .env("TELA_MAX_BODY_BYTES", MAX_BODY.to_string())
        .env("TELA_MAX_CONCURRENT", MAX_CONCURRENT.to_string())
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL");
    match broken {
        Some(b) => cmd.env("TELA_BROKEN_MODEL", b),
        None => cmd.env_remove("TELA_BROKEN_MODEL"),
    };
    let out = cmd.output().expect("run pytest");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let _ = writeln!(std::io::stderr(), "pytest ({engine}):\n{text}");
    if out.status.success() {
        Ok(())
    } else {
        Err(SuiteFailed { engine: engine.to_string(), output: text })
    }
}

fn tune(c: &mut tela_gateway::gateway::GatewayConfig) {
    c.limits.max_body_bytes = MAX_BODY;
    c.limits.max_concurrent = MAX_CONCURRENT;
}

#[cfg_attr(
    not(tela_sdk),
    ignore = "needs the OpenAI Python SDK: run .ci/test, or export what .ci/setup-python.sh prints"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_against_engine_simulators() {
    let python = sdk_python();
    within(300, async {
        let mut slow = engine(&[MODEL]);
        // Slow enough that two streams still hold both permits when the 429 case asks.
        slow.tokens_per_s = 10.0;
        let mut fed = Fed::start(Options { engines: vec![slow.clone(), slow], tune, ..Options::default() }).await;
        let mut broken = failing(tela_gateway::engine_sim::FailMode::MidStream);
        broken.models = vec!["broken-model".into()];
        fed.add_node(broken, &[]).await;
        fed.wait_routable(3).await;
        let b = no_capacity_gateway(&fed).await;
        let python = python.clone();
        let result = tokio::task::block_in_place(|| run_pytest(&python, &fed, &b, MODEL, "sim", Some("broken-model")));
        b.shutdown().await;
        if let Err(e) = result {
            panic!("{e}");
        }
    })
    .await;
}

#[cfg_attr(
    not(all(tela_sdk, tela_llama)),
    ignore = "needs the OpenAI Python SDK and llama.cpp: run .ci/test, or export what .ci/setup-python.sh and .ci/setup-engine.sh print"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_against_llama_cpp() {
    let python = sdk_python();
    let (Some(llama), Some(gguf)) = (std::env::var_os("TELA_LLAMA_PYTHON"), std::env::var_os("TELA_LLAMA_MODEL"))
    else {
        panic!("TELA_LLAMA_PYTHON / TELA_LLAMA_MODEL are not set; run .ci/setup-engine.sh and export what it prints");
    };
    within(400, async {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = gateway_config(dir.path());
        tune(&mut config);
        let gateway = Gateway::start(config).await.expect("gateway");
        let port = free_port();
        let engine_cmd = format!(
            "exec '{}' -m llama_cpp.server --model '{}' --model_alias smollm2 --host 127.0.0.1 --port {port} \
             --n_ctx 2048 --verbose false --interrupt_requests false --embedding true \
             --kv_overrides llama.pooling_type=int:1",
            llama.to_string_lossy(),
            gguf.to_string_lossy()
        );
        let backend: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let node = spawn_node(
            dir.path(),
            "llama-node",
            &[gateway.anchor_addr().to_string()],
            backend,
            &["--engine-cmd", &engine_cmd, "--engine-stop-grace", "10s"],
        );
        let fed = Fed { gateway, nodes: vec![node], engines: Vec::new(), dir };
        let deadline = Instant::now() + Duration::from_secs(180);
        while !fed.gateway.status()["models"].as_array().is_some_and(|m| m.iter().any(|m| m == "smollm2")) {
            assert!(Instant::now() < deadline, "the llama.cpp node never served: {}", fed.nodes[0].log_text());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let b = no_capacity_gateway(&fed).await;
        let python = python.clone();
        let result = tokio::task::block_in_place(|| run_pytest(&python, &fed, &b, "smollm2", "llama", None));
        b.shutdown().await;
        // SIGTERM, not SIGKILL: the node stops the engine it launched before it exits.
        let mut fed = fed;
        let code = fed.nodes[0].terminate(Duration::from_secs(60)).await;
        if let Err(e) = result {
            panic!("{e}");
        }
        assert_eq!(code, Some(0), "{}", fed.nodes[0].log_text());
    })
    .await;
}
