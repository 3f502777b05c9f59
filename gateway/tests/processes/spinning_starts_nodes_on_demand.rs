//! Model spinning end to end on one machine: a request for a spinnable model that nobody serves
//! waits in the cold-start queue while the gateway submits a job; the job (here a local stand-in
//! for Slurm that runs the rendered batch script with bash) starts `tela node` and the engine
//! simulator, the node joins, and the waiting request is answered. Once demand is gone the node
//! is drained and its job ends. A second gateway, whose jobs never start, shows the queue's
//! limits: a full queue answers 429, a client that leaves gives its place back, and a request
//! that waited too long gets 503 with `Retry-After`, all in OpenAI's error shape.

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use serde_json::Value;
use tela_batch::{BatchError, BatchFuture, BatchJob, BatchJobId, BatchState, BatchSystem, JobRequest, JobSignal};
use tela_gateway::config::LoadedConfig;
use tela_gateway::gateway::Gateway;
use tela_gateway::spin::SpinSetup;

/// A batch system on this machine: each job is its batch script run by bash in its own process
/// group, with `SLURM_JOB_ID` set and an `scontrol` on `PATH` that records the job's comment.
/// `start_jobs: false` leaves every job pending forever. Job `n`'s script is `job-<n>.sh` in
/// `dir`. Other files' tests use it too.
///
/// Each instance numbers its jobs from its own block of ids ([`LocalBatch::first`] on): a job's
/// engine listens on `20000 + id mod 10000` (the job template's rule), so two tests running at
/// once with the same job ids would start engines on the same ports and take each other's.
pub(crate) struct LocalBatch {
    dir: PathBuf,
    start_jobs: bool,
    first: u64,
    next: AtomicU64,
    jobs: Mutex<HashMap<u64, Option<Child>>>,
    /// What was asked of it, in order: `submit <name>`, `cancel <id>`, `drain <id>`.
    log: Mutex<Vec<String>>,
}

/// The next block of job ids a [`LocalBatch`] takes; far above the ids the real Slurm of the
/// other tests hands out.
static NEXT_BLOCK: AtomicU64 = AtomicU64::new(5_000);

/// Job ids each [`LocalBatch`] may use.
const BLOCK: u64 = 100;

impl LocalBatch {
    pub(crate) fn new(dir: &Path, start_jobs: bool) -> Arc<LocalBatch> {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).expect("bin dir");
        let scontrol = bin.join("scontrol");
        std::fs::write(
            &scontrol,
            "#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in JobId=*) id=\"${a#*=}\";; Comment=*) c=\"${a#*=}\";; esac; done\n\
             printf '%s' \"$c\" > \"$LOCAL_BATCH_DIR/comment-$id\"\n",
        )
        .expect("scontrol shim");
        let executable = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755);
        std::fs::set_permissions(&scontrol, executable).expect("chmod");
        let first = NEXT_BLOCK.fetch_add(BLOCK, Ordering::Relaxed);
        Arc::new(LocalBatch {
            dir: dir.to_path_buf(),
            start_jobs,
            first,
            next: AtomicU64::new(first),
            jobs: Mutex::default(),
            log: Mutex::default(),
        })
    }

    /// The id of the first job submitted to it; the rest follow in submission order.
    pub(crate) fn first(&self) -> u64 {
        self.first
    }

    pub(crate) fn log(&self) -> Vec<String> {
        self.log.lock().expect("log").clone()
    }

    pub(crate) fn output(&self, id: u64) -> String {
        std::fs::read_to_string(self.dir.join(format!("job-{id}.out"))).unwrap_or_default()
    }

    /// The last `lines` lines of every job's output, each under a `--- job <id>:` heading.
    pub(crate) fn outputs(&self, lines: usize) -> String {
        (self.first..self.next.load(Ordering::Relaxed))
            .map(|id| {
                let out = self.output(id);
                let tail: Vec<&str> = out.lines().rev().take(lines).collect();
                format!("--- job {id}:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn kill_group(child: &Child, signal: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(child.id() as i32), signal);
    }
}

impl Drop for LocalBatch {
    fn drop(&mut self) {
        let mut jobs = self.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for child in jobs.values_mut().flatten() {
            LocalBatch::kill_group(child, nix::sys::signal::Signal::SIGTERM);
        }
        std::thread::sleep(Duration::from_secs(2));
        for child in jobs.values_mut().flatten() {
            LocalBatch::kill_group(child, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
        }
    }
}

impl BatchSystem for LocalBatch {
    fn name(&self) -> &str {
        "local"
    }

    fn submit<'a>(&'a self, job: &'a JobRequest) -> BatchFuture<'a, BatchJobId> {
        Box::pin(async move {
            let id = self.next.fetch_add(1, Ordering::Relaxed);
            self.log.lock().expect("log").push(format!("submit {}", job.name));
            let child = if self.start_jobs {
                let script = self.dir.join(format!("job-{id}.sh"));
                std::fs::write(&script, &job.script)
                    .map_err(|e| BatchError::Refused { backend: "local", detail: e.to_string() })?;
                let out = std::fs::File::create(self.dir.join(format!("job-{id}.out"))).expect("output file");
                let path = format!("{}:{}", self.dir.join("bin").display(), std::env::var("PATH").unwrap_or_default());
                let mut cmd = Command::new("bash");
                cmd.arg(&script)
                    .current_dir(&self.dir)
                    .envs(job.environment.iter().cloned())
                    .env("SLURM_JOB_ID", id.to_string())
                    .env("TMPDIR", &self.dir)
                    .env("PATH", path)
                    .env("LOCAL_BATCH_DIR", &self.dir)
                    .env("RUST_LOG", "info")
                    .env_remove("TELA_JOIN")
                    .env_remove("TELA_CONTROL")
                    .stdin(Stdio::null())
                    .stdout(out.try_clone().expect("dup"))
                    .stderr(out);
                std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
                Some(cmd.spawn().map_err(|e| BatchError::Unreachable { backend: "local", detail: e.to_string() })?)
            } else {
                None
            };
            self.jobs.lock().expect("jobs").insert(id, child);
            Ok(BatchJobId(id))
        })
    }

    fn jobs<'a>(&'a self, ids: &'a [BatchJobId]) -> BatchFuture<'a, Vec<BatchJob>> {
        Box::pin(async move {
            let mut jobs = self.jobs.lock().expect("jobs");
            Ok(ids
                .iter()
                .map(|id| {
                    let state = match jobs.get_mut(&id.0) {
                        None => BatchState::Ended,
                        Some(None) => BatchState::Pending,
                        Some(Some(child)) => match child.try_wait() {
                            Ok(None) => BatchState::Running,
                            _ => BatchState::Ended,
                        },
                    };
                    let comment =
                        std::fs::read_to_string(self.dir.join(format!("comment-{}", id.0))).unwrap_or_default();
                    BatchJob {
                        id: *id,
                        state,
                        raw_state: format!("{state:?}").to_uppercase(),
                        comment,
                        hosts: if state == BatchState::Running { vec!["localhost".into()] } else { vec![] },
                        time_left: None,
                    }
                })
                .collect())
        })
    }

    fn cancel(&self, id: BatchJobId) -> BatchFuture<'_, ()> {
        Box::pin(async move {
            self.log.lock().expect("log").push(format!("cancel {id}"));
            let mut jobs = self.jobs.lock().expect("jobs");
            if let Some(Some(child)) = jobs.get(&id.0) {
                LocalBatch::kill_group(child, nix::sys::signal::Signal::SIGTERM);
            } else {
                jobs.remove(&id.0);
            }
            Ok(())
        })
    }

    fn signal(&self, id: BatchJobId, _signal: JobSignal) -> BatchFuture<'_, ()> {
        Box::pin(async move {
            self.log.lock().expect("log").push(format!("drain {id}"));
            let jobs = self.jobs.lock().expect("jobs");
            if let Some(Some(child)) = jobs.get(&id.0) {
                // The batch shell alone, as `scancel --batch --signal=USR1`.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(child.id() as i32),
                    nix::sys::signal::Signal::SIGUSR1,
                );
            }
            Ok(())
        })
    }
}

/// `[spin]` with its backend and job tables: jobs run `tela node` joining `anchor` over TCP,
/// with the federation secret written to `dir`. Other files' tests use it too.
pub(crate) fn spin_header(dir: &Path, anchor: &str) -> String {
    let secret = dir.join("join-secret");
    std::fs::write(&secret, SECRET).expect("secret file");
    format!(
        r#"
[spin]
interval = "300ms"
max_concurrent_jobs = 4
[spin.backend]
kind = "sbatch"
[spin.job]
tela = "{tela}"
join = ["{anchor}"]
join_secret_file = "{secret}"
transport = "tcp"
working_dir = "{dir}"
"#,
        tela = tela(),
        secret = secret.display(),
        dir = dir.display(),
    )
}

/// The spin section for models `spun` (the engine simulator) on one small partition.
fn spin_toml(dir: &Path, anchor: &str, timeout: &str, capacity: usize) -> String {
    format!(
        r#"{header}[spin.cold_start]
capacity = {capacity}
timeout = "{timeout}"
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
concurrency_per_replica = 8
walltime = "10m"
drain_window = "1m"
scale_down_after = "3s"
cooldown = "1s"
"#,
        header = spin_header(dir, anchor),
        tela = tela(),
    )
}

async fn start_gateway(dir: &Path, batch: Arc<LocalBatch>, timeout: &str, capacity: usize) -> Gateway {
    let port = free_port();
    let anchor = format!("127.0.0.1:{port}");
    let loaded = LoadedConfig::parse(&spin_toml(dir, &anchor, timeout, capacity), "test").expect("valid config");
    let mut config = gateway_config(dir);
    config.anchor_listen = anchor.parse().expect("addr");
    config.spin = Some(SpinSetup { plan: loaded.spin.expect("[spin]"), batch });
    Gateway::start(config).await.expect("gateway starts")
}

fn spin_status(gateway: &Gateway) -> Value {
    gateway.status()["spin"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_a_model_nobody_serves_starts_a_node_and_is_answered() {
    within(150, async {
        let dir = tempfile::tempdir().expect("tempdir");
        let batch = LocalBatch::new(dir.path(), true);
        let gateway = start_gateway(dir.path(), batch.clone(), "60s", 8).await;
        let base = gateway.base_url();

        // Listed before any node serves it.
        let models = call(&base, "GET", "/v1/models", Some(KEY), None).await.json();
        assert!(models["data"].as_array().expect("list").iter().any(|m| m["id"] == "spun"), "{models}");
        // Models that cannot spin still fail at once.
        let r = post(&base, "/v1/chat/completions", chat("nobody-has-this", false, 4)).await;
        assert_eq!((r.status, r.json()["error"]["code"].as_str()), (404, Some("model_not_found")));

        // Three requests wait together; one job is enough for them (8 per replica).
        let waiting: Vec<_> = (0..3)
            .map(|_| {
                let base = base.clone();
                tokio::spawn(async move { post(&base, "/v1/chat/completions", chat("spun", false, 8)).await })
            })
            .collect();
        for w in waiting {
            let r = w.await.expect("request task");
            assert_eq!(r.status, 200, "{}\njob output:\n{}", r.text(), batch.output(batch.first()));
            assert!(r.json()["choices"][0]["message"]["content"].as_str().is_some_and(|c| !c.is_empty()));
        }
        assert_eq!(batch.log(), ["submit tela-spun"], "one job for three waiting requests");
        let spin = spin_status(&gateway);
        let job = &spin["jobs"][0];
        assert_eq!(
            (job["batch_id"].as_str(), job["state"].as_str()),
            (Some(batch.first().to_string().as_str()), Some("RUNNING")),
            "{spin:#}"
        );
        assert!(job["node"].as_str().is_some_and(|n| n.len() == 32), "the job names its node: {spin:#}");
        assert_eq!(spin["models"][0]["supply"], 1, "{spin:#}");
        let metrics = call(&base, "GET", "/metrics", Some(KEY), None).await.text();
        assert!(metrics.contains("tela_gateway_spin_submits_total{model=\"spun\"} 1"), "{metrics}");
        assert!(metrics.contains("tela_gateway_cold_start_wait_seconds_count{outcome=\"ready\"} 3"), "{metrics}");

        // Now served: a request goes straight through.
        let r = post(&base, "/v1/chat/completions", chat("spun", true, 4)).await;
        assert_eq!(r.status, 200);
        assert!(r.text().contains("[DONE]"));

        // Idle for `scale_down_after`: the node is drained, leaves, and its job ends.
        let ended = eventually(Duration::from_secs(40), || {
            let s = spin_status(&gateway);
            batch.log().iter().any(|l| *l == format!("drain {}", batch.first()))
                && s["jobs"].as_array().is_some_and(Vec::is_empty)
        })
        .await;
        assert!(
            ended,
            "log {:?}; status {:#}\njob output:\n{}",
            batch.log(),
            gateway.status(),
            batch.output(batch.first())
        );
        let node = job["node_short"].as_str().expect("node").to_string();
        let gone = gateway.status()["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .filter(|n| n["short"] == node.as_str())
            .all(|n| n["routable"] == false);
        assert!(gone, "{:#}", gateway.status());
        let metrics = call(&base, "GET", "/metrics", Some(KEY), None).await.text();
        assert!(metrics.contains("tela_gateway_spin_drains_total{model=\"spun\"} 1"), "{metrics}");
        gateway.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cold_start_queue_is_bounded_in_size_and_time_and_forgets_clients_that_leave() {
    within(60, async {
        let dir = tempfile::tempdir().expect("tempdir");
        let batch = LocalBatch::new(dir.path(), false);
        let gateway = start_gateway(dir.path(), batch.clone(), "3s", 2).await;
        let base = gateway.base_url();

        let first = {
            let base = base.clone();
            tokio::spawn(async move { post(&base, "/v1/chat/completions", chat("spun", false, 4)).await })
        };
        let leaving = {
            let base = base.clone();
            tokio::spawn(async move { post(&base, "/v1/chat/completions", chat("spun", false, 4)).await })
        };
        let queued = |n: u64| {
            let gw = &gateway;
            move || spin_status(gw)["models"][0]["queued"] == n
        };
        assert!(eventually(Duration::from_secs(5), queued(2)).await, "{:#}", spin_status(&gateway));

        // Full: refused at once, in OpenAI's shape.
        let r = post(&base, "/v1/chat/completions", chat("spun", false, 4)).await;
        assert_eq!(r.status, 429, "{}", r.text());
        assert_eq!(r.json()["error"]["code"], "cold_start_queue_full");
        assert!(r.header("retry-after").is_some());

        // A client that goes away frees its place.
        leaving.abort();
        assert!(eventually(Duration::from_secs(5), queued(1)).await, "{:#}", spin_status(&gateway));

        // The job never starts: the first request times out with 503 and Retry-After.
        let r = first.await.expect("request task");
        assert_eq!(r.status, 503, "{}", r.text());
        let error = r.json();
        assert_eq!(error["error"]["code"], "model_starting", "{error}");
        assert_eq!(error["error"]["type"], "server_error");
        assert!(error["error"]["message"].as_str().is_some_and(|m| m.contains("'spun' is starting")), "{error}");
        assert!(r.header("retry-after").is_some());
        let spin = spin_status(&gateway);
        assert_eq!(spin["jobs"][0]["state"], "PENDING", "{spin:#}");

        // Nobody waits any more: after the idle period the pending job is cancelled.
        assert!(
            eventually(Duration::from_secs(20), || batch.log().iter().any(|l| l.starts_with("cancel "))).await,
            "{:?} {:#}",
            batch.log(),
            spin_status(&gateway)
        );
        let metrics = call(&base, "GET", "/metrics", Some(KEY), None).await.text();
        assert!(metrics.contains("tela_gateway_cold_start_wait_seconds_count{outcome=\"timeout\"} 1"), "{metrics}");
        assert!(metrics.contains("tela_gateway_spin_cancels_total{model=\"spun\"} 1"), "{metrics}");
        gateway.shutdown().await;
    })
    .await;
}

/// A batch system that refuses every submission (a wrong partition, an expired account).
#[derive(Default)]
struct RefusingBatch {
    submits: AtomicU64,
}

impl BatchSystem for RefusingBatch {
    fn name(&self) -> &str {
        "refusing"
    }

    fn submit<'a>(&'a self, _job: &'a JobRequest) -> BatchFuture<'a, BatchJobId> {
        self.submits.fetch_add(1, Ordering::Relaxed);
        Box::pin(async { Err(BatchError::Refused { backend: "refusing", detail: "invalid partition".into() }) })
    }

    fn jobs<'a>(&'a self, ids: &'a [BatchJobId]) -> BatchFuture<'a, Vec<BatchJob>> {
        Box::pin(async move {
            Ok(ids
                .iter()
                .map(|id| BatchJob {
                    id: *id,
                    state: BatchState::Ended,
                    raw_state: "GONE".into(),
                    comment: String::new(),
                    hosts: vec![],
                    time_left: None,
                })
                .collect())
        })
    }

    fn cancel(&self, _id: BatchJobId) -> BatchFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }

    fn signal(&self, _id: BatchJobId, _signal: JobSignal) -> BatchFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_batch_system_is_asked_again_less_and_less_often_and_the_gateway_carries_on() {
    within(60, async {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let anchor = format!("127.0.0.1:{port}");
        let loaded = LoadedConfig::parse(&spin_toml(dir.path(), &anchor, "4s", 64), "test").expect("valid config");
        let batch = Arc::new(RefusingBatch::default());
        let mut config = gateway_config(dir.path());
        config.anchor_listen = anchor.parse().expect("addr");
        config.spin = Some(SpinSetup { plan: loaded.spin.expect("[spin]"), batch: batch.clone() });
        let gateway = Gateway::start(config).await.expect("gateway starts");
        let base = gateway.base_url();
        // A request every 100 ms for 4 s, each waiting 4 s: each wakes the spinner, yet the
        // pauses after each refusal (0.3, 0.6, 1.2, 2.4 s) allow only a handful of submissions.
        let mut waiting = Vec::new();
        for _ in 0..40 {
            let base = base.clone();
            waiting
                .push(tokio::spawn(async move { post(&base, "/v1/chat/completions", chat("spun", false, 4)).await }));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for w in waiting {
            let r = w.await.expect("request task");
            assert_eq!((r.status, r.json()["error"]["code"].as_str()), (503, Some("model_starting")), "{}", r.text());
        }
        // About 8 s of waiting requests: decisions at 0, 0.3, 0.9, 2.1 and 4.5 s, one
        // submission each; without the pauses there would be one every 300 ms or less.
        let submits = batch.submits.load(Ordering::Relaxed);
        assert!((3..=6).contains(&submits), "{submits} submissions in 8 s");
        let spin = spin_status(&gateway);
        assert!(spin["last_error"].as_str().is_some_and(|e| e.contains("invalid partition")), "{spin:#}");
        let metrics = call(&base, "GET", "/metrics", Some(KEY), None).await.text();
        assert!(metrics.contains("tela_gateway_spin_batch_errors_total{op=\"submit\"}"), "{metrics}");
        // Other paths are unaffected.
        assert_eq!(call(&base, "GET", "/health", None, None).await.status, 200);
        gateway.shutdown().await;
    })
    .await;
}
