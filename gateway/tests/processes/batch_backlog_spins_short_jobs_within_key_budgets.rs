//! Spinning for the Batch API's backlog (`[spin.batch]`): a batch for a spinnable model that no
//! node serves starts a short, backfill-friendly job (`--time-min` in its script, marked as a
//! batch job in `/status`, its GPU-hours charged to the key), the batch completes on the node it
//! started, and the node is drained once the backlog is gone. A key whose `batch_gpu_hours` are
//! spent — charges a previous run of the gateway wrote to the same database — starts no job:
//! its backlog is shown as over budget and its batch waits for nodes that exist.

use crate::common;
use crate::spinning_starts_nodes_on_demand::LocalBatch;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tela_gateway::auth::key_line;
use tela_gateway::batch::BatchConfig;
use tela_gateway::config::LoadedConfig;
use tela_gateway::gateway::Gateway;
use tela_gateway::spin::SpinSetup;

use crate::batch_api_survives_restarts::{file_lines, upload, wait_final};

/// `[spin]` with one spinnable model on one partition, and `[spin.batch]`: one replica per 2
/// pending requests, 5-minute jobs Slurm may shrink to 3 minutes.
fn spin_toml(dir: &Path, anchor: &str) -> String {
    let secret = dir.join("join-secret");
    std::fs::write(&secret, SECRET).expect("secret file");
    format!(
        r#"
[spin]
interval = "300ms"
max_concurrent_jobs = 4
[spin.batch]
backlog_per_replica = 2
max_replicas = 1
job_walltime = "5m"
job_time_min = "3m"
[spin.backend]
kind = "sbatch"
[spin.job]
tela = "{tela}"
join = ["{anchor}"]
join_secret_file = "{secret}"
transport = "tcp"
working_dir = "{dir}"
[[spin.partition]]
name = "local"
shape = "rtx4090"
nodes = 2
[[spin.model]]
name = "spun"
params = "135M"
quantization = "bf16"
engine = "{tela} engine-sim --port {{port}} --model {{model}} --ttft-ms 5 --tokens-per-s 400"
max_replicas = 2
walltime = "10m"
drain_window = "1m"
scale_down_after = "3s"
cooldown = "1s"
"#,
        tela = tela(),
        secret = secret.display(),
        dir = dir.display(),
    )
}

/// A gateway with batches in `dir/gateway.db`, spinning with `batch`, the key `KEY` holding
/// `fields`.
async fn start(dir: &Path, batch: Arc<LocalBatch>, fields: &str) -> Gateway {
    std::fs::write(dir.join("api-keys"), format!("{} {fields}\n", key_line(KEY))).expect("key file");
    let anchor = format!("127.0.0.1:{}", free_port());
    let loaded = LoadedConfig::parse(&spin_toml(dir, &anchor), "test").expect("valid config");
    let mut config = gateway_config(dir);
    config.anchor_listen = anchor.parse().expect("addr");
    config.batch = Some(BatchConfig::new(dir.join("gateway.db")));
    config.spin = Some(SpinSetup { plan: loaded.spin.expect("[spin]"), batch });
    Gateway::start(config).await.expect("gateway starts")
}

/// Creates a batch of `n` chat requests for `spun`; gives its id.
async fn create_batch(base: &str, n: usize) -> String {
    let lines: Vec<String> = (0..n)
        .map(|i| {
            json!({"custom_id": format!("r{i}"), "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": "spun", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}})
            .to_string()
        })
        .collect();
    let file = upload(base, KEY, "batch", lines.join("\n").as_bytes()).await;
    assert_eq!(file.status, 200, "{}", file.text());
    let created =
        post(base, "/v1/batches", json!({"input_file_id": file.json()["id"], "endpoint": "/v1/chat/completions"}))
            .await;
    assert_eq!(created.status, 200, "{}", created.text());
    created.json()["id"].as_str().expect("batch id").to_string()
}

fn spin_status(gateway: &Gateway) -> Value {
    gateway.status()["spin"].clone()
}

/// The hash prefix the batch store keeps for `KEY`.
fn key_prefix() -> String {
    key_line(KEY)["sha256:".len()..][..12].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_for_a_model_nobody_serves_starts_a_short_batch_job_and_completes() {
    within(150, async {
        let dir = tempfile::tempdir().expect("tempdir");
        let batch = LocalBatch::new(dir.path(), true);
        let gateway = start(dir.path(), batch.clone(), "name=batcher batch_gpu_hours=10/day").await;
        let base = gateway.base_url();

        let id = create_batch(&base, 4).await;
        let done = wait_final(&base, KEY, &id, Duration::from_secs(90)).await;
        assert_eq!(done["status"], "completed", "{done:#}\njob output:\n{}", batch.output(batch.first()));
        assert_eq!(done["request_counts"]["completed"], 4, "{done:#}");
        let output = file_lines(&base, KEY, done["output_file_id"].as_str().expect("output file")).await;
        assert_eq!(output.len(), 4);
        assert!(output.iter().all(|l| l["response"]["status_code"] == 200), "{output:#?}");

        // One short, backfill-friendly job, marked as a batch job and charged to the key.
        assert_eq!(batch.log().first().map(String::as_str), Some("submit tela-spun"), "{:?}", batch.log());
        let script =
            std::fs::read_to_string(dir.path().join(format!("job-{}.sh", batch.first()))).expect("the job's script");
        assert!(script.contains("--time-min=180s"), "{script}");
        let spin = spin_status(&gateway);
        let job = &spin["jobs"][0];
        assert_eq!((job["batch"].as_bool(), job["charged_to"].as_str()), (Some(true), Some("batcher")), "{spin:#}");
        let conn = tela_gateway::db::open(&dir.path().join("gateway.db")).expect("the database");
        let spent = tela_gateway::spin::batch_demand::spent(&conn, &key_prefix(), 0, i64::MAX).expect("charges");
        assert_eq!(spent, 300, "one GPU for the 5-minute limit");

        // The backlog is gone: the node is drained and its job ends.
        let ended = eventually(Duration::from_secs(40), || {
            batch.log().iter().any(|l| *l == format!("drain {}", batch.first()))
                && spin_status(&gateway)["jobs"].as_array().is_some_and(Vec::is_empty)
        })
        .await;
        assert!(ended, "log {:?}; status {:#}", batch.log(), spin_status(&gateway));
        assert_eq!(batch.log().iter().filter(|l| l.starts_with("submit")).count(), 1, "{:?}", batch.log());
        gateway.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_its_batch_gpu_hours_starts_no_job_even_after_a_restart() {
    within(60, async {
        let dir = tempfile::tempdir().expect("tempdir");
        // A previous run spent the key's hour today.
        {
            let conn = tela_gateway::db::open(&dir.path().join("gateway.db")).expect("the database");
            let now = tela_gateway::batch::now_s();
            tela_gateway::spin::batch_demand::charge(&conn, &key_prefix(), "spun", now, 3600).expect("charged");
        }
        let batch = LocalBatch::new(dir.path(), false);
        let gateway = start(dir.path(), batch.clone(), "name=spent batch_gpu_hours=1/day").await;
        let base = gateway.base_url();

        let id = create_batch(&base, 4).await;
        let counted = eventually(Duration::from_secs(10), || {
            spin_status(&gateway)["models"][0]["batch_backlog_over_budget"] == 4
        })
        .await;
        assert!(counted, "{:#}", spin_status(&gateway));
        // Several decisions later: still no job, and the batch waits.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let spin = spin_status(&gateway);
        assert!(batch.log().is_empty(), "{:?} {spin:#}", batch.log());
        assert_eq!(
            (spin["models"][0]["batch_backlog"].as_u64(), spin["models"][0]["wanted"].as_u64()),
            (Some(0), Some(0))
        );
        let b = call(&base, "GET", &format!("/v1/batches/{id}"), Some(KEY), None).await.json();
        assert_eq!(b["status"], "in_progress", "{b:#}");
        gateway.shutdown().await;
    })
    .await;
}
