//! Spinning by the queue, on a real Slurm: the model may use two partitions, `queued` first.
//! A 2-CPU job fills `queued` (its nodes are capped at 2 CPUs by `.ci/slurm/start.sh`), so
//! `sbatch --test-only` puts a job there at that job's end, and in `debug` now. A request for the
//! model makes the gateway submit to `debug` — not to its first-listed partition — and `/status`
//! shows the choice with both estimates. Requests that keep coming while the job is pending or
//! starting wait for it: one job is submitted, not one per decision.
//!
//! Needs the local Slurm of `.ci/slurm/start.sh`; ignored (the summary says so) when the build
//! found none in the environment (see `gateway/build.rs`).

use crate::common;
use crate::slurm_env::discover;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use discover::{slurm_env, SlurmEnv};
use tela_gateway::config::LoadedConfig;
use tela_gateway::gateway::Gateway;
use tela_gateway::spin::SpinSetup;

/// The partition `.ci/slurm/start.sh` caps at 2 CPUs per node.
const QUEUED: &str = "queued";

/// Cancels the Slurm jobs it names when dropped, so that a failing test leaves nothing behind.
struct Cancel(Vec<String>);

impl Drop for Cancel {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let _ = Command::new("scancel").args(&self.0).status();
        }
    }
}

fn config(env: &SlurmEnv, dir: &Path, anchor: &str) -> String {
    let secret = dir.join("join-secret");
    std::fs::write(&secret, format!("{SECRET}\n")).expect("secret file");
    format!(
        r#"
[spin]
interval = "1s"
max_concurrent_jobs = 3
start_estimate_timeout = "20s"
[spin.backend]
kind = "sbatch"
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
name = "{QUEUED}"
shape = "a100-80x4"
nodes = 1
[[spin.partition]]
name = "{partition}"
shape = "a100-80x4"
nodes = 1
[[spin.model]]
name = "queue-spun"
params = "135M"
quantization = "bf16"
engine = "{tela} engine-sim --host 127.0.0.1 --port {{port}} --model {{model}} --ttft-ms 5 --tokens-per-s 50"
partitions = ["{QUEUED}", "{partition}"]
max_replicas = 2
concurrency_per_replica = 16
walltime = "5m"
drain_window = "20s"
scale_down_after = "10m"
cooldown = "1s"
"#,
        tela = tela(),
        secret = secret.display(),
        dir = dir.display(),
        partition = env.partition,
    )
}

/// `scontrol show job`'s JobState.
fn job_state(id: &str) -> String {
    let out = Command::new("scontrol").args(["show", "job", id]).output().expect("scontrol");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().find_map(|w| w.strip_prefix("JobState=")).unwrap_or("GONE").to_string()
}

#[cfg_attr(
    not(tela_slurm),
    ignore = "needs a local Slurm: run .ci/test as root, or .ci/slurm/start.sh and export what it prints"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spinning_goes_where_the_queue_starts_soonest() {
    let env = slurm_env("spinning_goes_where_the_queue_starts_soonest", false);
    within(300, async {
        let listed = Command::new("sinfo").args(["-h", "-p", QUEUED, "-o", "%P"]).output().expect("sinfo");
        assert!(
            !String::from_utf8_lossy(&listed.stdout).trim().is_empty(),
            "the local Slurm has no partition '{QUEUED}': re-run .ci/slurm/start.sh (it defines it)"
        );
        // Fill `queued`: its node gives it 2 CPUs in all.
        let blocker = Command::new("sbatch")
            .args(["--parsable", "-p", QUEUED, "-c", "2", "--time=10", "-J", "queue-blocker", "--chdir=/tmp"])
            .args(["--wrap", "sleep 600"])
            .output()
            .expect("sbatch");
        let blocker_id = String::from_utf8_lossy(&blocker.stdout).trim().split(';').next().unwrap_or("").to_string();
        assert!(blocker.status.success(), "blocker refused: {}", String::from_utf8_lossy(&blocker.stderr));
        let mut cancel = Cancel(vec![blocker_id.clone()]);
        let running = eventually(Duration::from_secs(30), || job_state(&blocker_id) == "RUNNING").await;
        assert!(running, "the blocker job {blocker_id} does not run: {}", job_state(&blocker_id));

        let dir = tempfile::tempdir().expect("tempdir");
        let anchor = format!("127.0.0.1:{}", free_port());
        let loaded = LoadedConfig::parse(&config(&env, dir.path(), &anchor), "test").expect("valid config");
        let plan = loaded.spin.expect("[spin]");
        let batch = tela_gateway::spin::backend::connect(&plan.backend).expect("backend");
        let mut gateway_config = gateway_config(dir.path());
        gateway_config.anchor_listen = anchor.parse().expect("addr");
        gateway_config.spin = Some(SpinSetup { plan, batch });
        let gateway = Arc::new(Gateway::start(gateway_config).await.expect("gateway starts"));
        let base = gateway.base_url();
        let spin = |gw: &Gateway| gw.status()["spin"].clone();

        // Several requests at once while nothing serves: one job, where it starts soonest.
        let waiting: Vec<_> = (0..4)
            .map(|_| {
                let base = base.clone();
                tokio::spawn(async move { post(&base, "/v1/chat/completions", chat("queue-spun", false, 4)).await })
            })
            .collect();
        let submitted = eventually(Duration::from_secs(30), || {
            spin(&gateway)["jobs"][0]["batch_id"].as_str().is_some_and(|id| {
                cancel.0.push(id.to_string());
                true
            })
        })
        .await;
        assert!(submitted, "no job: {:#}", spin(&gateway));
        for w in waiting {
            let r = w.await.expect("request task");
            assert_eq!(r.status, 200, "{}\n{:#}", r.text(), gateway.status());
        }

        let s = spin(&gateway);
        let jobs = s["jobs"].as_array().cloned().unwrap_or_default();
        assert_eq!(jobs.len(), 1, "one job serves the burst, no duplicate while it was pending: {s:#}");
        assert_eq!(jobs[0]["partition"], env.partition.as_str(), "{s:#}");
        let choice = &s["models"][0]["last_choice"];
        assert_eq!(choice["partition"], env.partition.as_str(), "{s:#}");
        let start = |v: &serde_json::Value| {
            humantime::parse_rfc3339(v.as_str().unwrap_or_else(|| panic!("no estimate: {s:#}"))).expect("a time")
        };
        let chosen = start(&choice["estimated_start"]);
        let candidates = choice["candidates"].as_array().cloned().unwrap_or_default();
        assert_eq!(candidates.len(), 2, "{s:#}");
        assert_eq!(candidates[0]["partition"], QUEUED, "configured order: {s:#}");
        let later = start(&candidates[0]["estimated_start"]);
        // The blocker holds `queued` for 10 minutes.
        assert!(later > chosen + Duration::from_secs(300), "{QUEUED} {later:?} vs {chosen:?}: {s:#}");
        assert!(choice["asked_at"].is_string(), "{s:#}");

        let metrics = call(&base, "GET", "/metrics", Some(KEY), None).await.text();
        assert!(metrics.contains("tela_gateway_spin_submits_total{model=\"queue-spun\"} 1"), "{metrics}");
        assert!(!metrics.contains("tela_gateway_spin_batch_errors_total"), "{metrics}");
        if let Ok(gateway) = Arc::try_unwrap(gateway) {
            gateway.shutdown().await;
        }
        drop(cancel);
    })
    .await;
}
