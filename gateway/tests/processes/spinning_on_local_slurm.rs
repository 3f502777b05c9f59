//! Spinning on a real Slurm, through each front door (`sbatch`, slurmrestd, and FirecREST v2 in
//! `spinning_through_firecrest`): a request for a
//! spinnable model that nobody serves makes the gateway submit a job; the job's `tela node`
//! starts the engine simulator and joins; the waiting request is answered. The job's short
//! walltime then brings Slurm's warning (or the node's own walltime timer): the node turns
//! DOWN, the streams open on it complete, and the job ends COMPLETED before Slurm's time limit
//! kills it. Demand keeps asking meanwhile, so a replacement job is submitted; once demand stops,
//! the idle period passes and that job is released (drained or cancelled) and its allocation
//! freed.
//!
//! Needs the local Slurm of `.ci/slurm/start.sh`; ignored (the summary says so) when the build
//! found none in the environment (see `gateway/build.rs`).

use crate::common;
use crate::slurm_env::discover;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use discover::{slurm_env, SlurmEnv};
use serde_json::Value;
use tela_gateway::config::LoadedConfig;
use tela_gateway::gateway::Gateway;
use tela_gateway::spin::SpinSetup;

fn config(env: &SlurmEnv, backend: &str, dir: &Path, anchor: &str) -> String {
    let secret = dir.join("join-secret");
    std::fs::write(&secret, format!("{SECRET}\n")).expect("secret file");
    let backend = match backend {
        "sbatch" => "kind = \"sbatch\"".to_string(),
        "firecrest" => crate::spinning_through_firecrest::backend_section(),
        _ => {
            let (url, user, token) = env.rest.clone().expect("slurmrestd settings");
            let token = token.display();
            format!("kind = \"slurmrest\"\nurl = \"{url}\"\nuser = \"{user}\"\ntoken_file = \"{token}\"")
        }
    };
    format!(
        r#"
[spin]
interval = "1s"
max_concurrent_jobs = 3
[spin.backend]
{backend}
[spin.job]
tela = "{tela}"
join = ["{anchor}"]
join_secret_file = "{secret}"
transport = "tcp"
working_dir = "{dir}"
cpus_per_task = 1
env = {{ TELA_PROBE_INTERVAL = "200ms", RUST_LOG = "info" }}
[spin.cold_start]
capacity = 16
timeout = "90s"
[[spin.partition]]
name = "{partition}"
shape = "a100-80x4"
nodes = 2
[[spin.model]]
name = "slurm-spun"
params = "135M"
quantization = "bf16"
engine = "{tela} engine-sim --host 127.0.0.1 --port {{port}} --model {{model}} --ttft-ms 5 --tokens-per-s 20"
max_replicas = 1
concurrency_per_replica = 16
walltime = "2m"
drain_window = "20s"
scale_down_after = "8s"
cooldown = "1s"
"#,
        tela = tela(),
        secret = secret.display(),
        dir = dir.display(),
        partition = env.partition,
    )
}

fn spin(gateway: &Gateway) -> Value {
    gateway.status()["spin"].clone()
}

fn job_outputs(dir: &Path) -> String {
    let mut out = String::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with("slurm-") {
            out.push_str(&format!("--- {name}\n{}\n", std::fs::read_to_string(entry.path()).unwrap_or_default()));
        }
    }
    out
}

/// `scontrol show job`'s JobState, e.g. `COMPLETED`, `TIMEOUT`, `CANCELLED`.
fn job_state(id: &str) -> String {
    let out = std::process::Command::new("scontrol").args(["show", "job", id]).output().expect("scontrol");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().find_map(|w| w.strip_prefix("JobState=")).unwrap_or("GONE").to_string()
}

/// The whole lifecycle through `backend` (`sbatch`, `slurmrest` or `firecrest`).
pub(crate) async fn scenario(env: &SlurmEnv, backend: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let anchor = format!("127.0.0.1:{}", free_port());
    let loaded = LoadedConfig::parse(&config(env, backend, dir.path(), &anchor), "test").expect("valid config");
    let plan = loaded.spin.expect("[spin]");
    let batch = tela_gateway::spin::backend::connect(&plan.backend).expect("backend");
    let mut gateway_config = gateway_config(dir.path());
    gateway_config.anchor_listen = anchor.parse().expect("addr");
    gateway_config.spin = Some(SpinSetup { plan, batch });
    let gateway = Arc::new(Gateway::start(gateway_config).await.expect("gateway starts"));
    let base = gateway.base_url();
    let context = |gw: &Gateway| format!("{backend}: status {:#}\n{}", gw.status(), job_outputs(dir.path()));

    // 1. Nobody serves the model: the request waits for the job's node and is answered.
    let started = Instant::now();
    let r = post(&base, "/v1/chat/completions", chat("slurm-spun", false, 4)).await;
    assert_eq!(r.status, 200, "{}\n{}", r.text(), context(&gateway));
    println!("{backend}: first answer after {:?} (sbatch, Slurm start, node join, engine start)", started.elapsed());
    // Demand goes on, one small request a second, until step 4 stops it: the idle period then
    // starts at a known moment, well before the replacement's own walltime warning (Slurm sends
    // it a minute and a drain window before the end), so the release is the spinner's doing.
    let demand = {
        let base = base.clone();
        tokio::spawn(async move {
            loop {
                let base = base.clone();
                tokio::spawn(async move { post(&base, "/v1/chat/completions", chat("slurm-spun", false, 4)).await });
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    // The job's comment names its node once the spin task has looked at the job again.
    let named = eventually(Duration::from_secs(10), || spin(&gateway)["jobs"][0]["node"].is_string()).await;
    assert!(named, "{}", context(&gateway));
    let first = spin(&gateway)["jobs"][0].clone();
    let first_id = first["batch_id"].as_str().expect("batch id").to_string();

    // 2. Keep streams open on it until its walltime drains it (Slurm's warning comes with up to
    //    30 s of slack): each must complete; the node turns DOWN; a replacement is wanted.
    let mut streams = Vec::new();
    let drain_seen = loop {
        let s = spin(&gateway);
        let down = gateway.status()["nodes"].as_array().is_some_and(|ns| {
            ns.iter().any(|n| Some(n["id"].as_str()) == Some(first["node"].as_str()) && n["state"] != "SERVE")
        });
        if down {
            break Instant::now();
        }
        assert!(started.elapsed() < Duration::from_secs(150), "the node never drained: {s:#}\n{}", context(&gateway));
        let base = base.clone();
        streams.push(tokio::spawn(async move {
            let t = Instant::now();
            let response =
                send(&base, "POST", "/v1/chat/completions", Some(KEY), Some(chat("slurm-spun", true, 60).to_string()))
                    .await;
            read_stream(response, t).await
        }));
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    println!("{backend}: the first node drained {:?} after the first answer", drain_seen - started);
    for s in streams {
        let s = s.await.expect("stream task");
        assert_eq!(s.status, 200, "{}", s.text());
        assert_eq!(s.events().last().map(String::as_str), Some("[DONE]"), "a stream did not complete: {}", s.text());
    }
    // The job ends by itself, before the time limit.
    let deadline = Instant::now() + Duration::from_secs(90);
    while !matches!(job_state(&first_id).as_str(), "COMPLETED" | "TIMEOUT" | "CANCELLED" | "FAILED" | "GONE") {
        assert!(Instant::now() < deadline, "job {first_id} still {}: {}", job_state(&first_id), context(&gateway));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        job_state(&first_id),
        "COMPLETED",
        "job {first_id} was not left to end by itself: {}",
        context(&gateway)
    );

    // 3. Demand goes on while the node drains: a replacement job is submitted and serves the
    //    requests that keep coming (they wait for it in the cold-start queue if need be).
    let replaced = eventually(Duration::from_secs(90), || {
        spin(&gateway)["jobs"].as_array().is_some_and(|js| js.iter().any(|j| j["batch_id"].as_str() != Some(&first_id)))
    })
    .await;
    assert!(replaced, "no replacement job: {}", context(&gateway));
    let r = post(&base, "/v1/chat/completions", chat("slurm-spun", false, 4)).await;
    assert_eq!(r.status, 200, "the replacement serves: {}\n{}", r.text(), context(&gateway));
    let metrics = call(&base, "GET", "/metrics", Some(KEY), None).await.text();
    assert!(metrics.contains("tela_gateway_spin_submits_total{model=\"slurm-spun\"} 2"), "{metrics}");

    // 4. Demand stops: after the idle period the replacement is released and nothing stays.
    demand.abort();
    let released =
        eventually(Duration::from_secs(90), || spin(&gateway)["jobs"].as_array().is_some_and(Vec::is_empty)).await;
    assert!(released, "jobs left: {}", context(&gateway));
    let metrics = call(&base, "GET", "/metrics", Some(KEY), None).await.text();
    assert!(
        metrics.contains("tela_gateway_spin_drains_total{model=\"slurm-spun\"} 1")
            || metrics.contains("tela_gateway_spin_cancels_total{model=\"slurm-spun\"} 1"),
        "the replacement was neither drained nor cancelled: {metrics}"
    );
    assert!(!metrics.contains("tela_gateway_spin_batch_errors_total"), "{metrics}");
    if let Ok(gateway) = Arc::try_unwrap(gateway) {
        gateway.shutdown().await;
    }
}

#[cfg_attr(
    not(tela_slurm),
    ignore = "needs a local Slurm: run .ci/test as root, or .ci/slurm/start.sh and export what it prints"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spinning_through_sbatch() {
    let env = slurm_env("spinning_through_sbatch", false);
    within(400, scenario(&env, "sbatch")).await;
}

#[cfg_attr(
    not(tela_slurmrest),
    ignore = "needs slurmrestd: run .ci/test as root, or .ci/slurm/start.sh and export what it prints"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spinning_through_slurmrestd() {
    let env = slurm_env("spinning_through_slurmrestd", true);
    within(400, scenario(&env, "slurmrest")).await;
}
