//! The local Slurm the `slurm_*` tests submit to, and the scenario they run against each
//! backend. `.ci/slurm/start.sh` starts that Slurm and prints (and keeps in
//! `/run/tela-slurm/env`) the variables read here. The tests that need it are ignored when the build found
//! none (`gateway/build.rs`), and fail when it was named but cannot be reached.

#![allow(dead_code)]

use crate::procs;
use std::path::Path;
use std::time::{Duration, Instant};
use tela_batch::template::{sh_quote, JobTemplate};
use tela_batch::{BatchError, BatchJob, BatchJobId, BatchState, BatchSystem, JobRequest, JobSignal};
use tela_core::placement::{Placement, Variant};
use tela_core::{GpuModel, Hardware, Lifecycle, NodeId, Quantization};

pub mod discover;
pub use discover::{slurm_env, SlurmEnv};

/// A one-GPU placement on the fake GPUs of the local node.
pub fn one_gpu() -> Placement {
    Placement {
        shape: 0,
        shape_name: "local".into(),
        hardware: Hardware::catalog(GpuModel::A100_80, 4),
        tensor_parallel: 1,
        pipeline_stages: 1,
        variant: Variant::new("fp16", Quantization::Fp16),
        quantized_fallback: false,
        need_mib: 1000,
    }
}

/// A template whose jobs run the real `tela node` with `tela engine-sim` as the engine,
/// joining `join`, with their files in `dir`.
pub fn template(env: &SlurmEnv, dir: &Path, join: &str) -> JobTemplate {
    let secret = dir.join("join-secret");
    std::fs::write(&secret, format!("{}\n", procs::SECRET)).expect("write the secret file");
    let tela = procs::tela_bin().to_str().expect("utf-8 path").to_string();
    let mut t = JobTemplate::new(
        tela.clone(),
        vec![join.to_string()],
        secret.to_str().expect("utf-8 path"),
        format!("{} engine-sim --host 127.0.0.1 --port {{port}} --model {{model}}", sh_quote(&tela)),
    );
    t.partition = Some(env.partition.clone());
    t.cpus_per_task = 1;
    t.drain_window = Duration::from_secs(10);
    t.working_dir = dir.to_str().expect("utf-8 path").to_string();
    t.environment = vec![("TELA_PROBE_INTERVAL".into(), "200ms".into()), ("RUST_LOG".into(), "info".into())];
    t
}

/// Polls `jobs` until `pred` holds for the job, for at most `within`.
pub async fn wait_job(
    batch: &dyn BatchSystem,
    id: BatchJobId,
    what: &str,
    within: Duration,
    pred: impl Fn(&BatchJob) -> bool,
) -> BatchJob {
    let start = Instant::now();
    loop {
        let jobs = batch.jobs(&[id]).await.unwrap_or_else(|e| panic!("{}: listing job {id}: {e}", batch.name()));
        assert_eq!(jobs.len(), 1, "one answer per id");
        if pred(&jobs[0]) {
            return jobs[0].clone();
        }
        assert!(
            start.elapsed() < within,
            "{}: job {id} not {what} within {within:?}; last seen {:?}",
            batch.name(),
            jobs[0]
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The job's output file (`slurm-<id>.out` in its working directory).
pub fn output(dir: &Path, id: BatchJobId) -> String {
    std::fs::read_to_string(dir.join(format!("slurm-{id}.out"))).unwrap_or_default()
}

/// Whether `squeue` still lists the job as holding (or waiting for) an allocation.
pub fn squeue_lists_live(id: BatchJobId) -> bool {
    let out = std::process::Command::new("squeue")
        .args(["-h", "-t", "PD,R,CG,CF,S,ST", "-o", "%i", "-j", &id.to_string()])
        .output()
        .expect("run squeue");
    String::from_utf8_lossy(&out.stdout).lines().any(|l| l.trim() == id.to_string())
}

/// The scenario both backends must pass against the real Slurm (see the test files).
pub async fn serving_job_drains_and_a_cancelled_job_ends(batch: &dyn BatchSystem, env: &SlurmEnv) {
    let name = batch.name().to_string();
    let dir = tempfile::Builder::new().prefix("tela-slurm-test").tempdir().expect("tempdir");
    let anchor = procs::anchor().await;
    let template = template(env, dir.path(), &anchor.local_addr().to_string());
    let model = format!("slurm-test-{}", name.split_whitespace().next().unwrap_or("x"));

    // 1. A serving node in a job: submitted, listed, linked to its node by the comment.
    let job = template.render(&model, &one_gpu(), Duration::from_secs(600)).expect("renders");
    let id = batch.submit(&job).await.unwrap_or_else(|e| panic!("{name}: submit: {e}"));
    let first = batch.jobs(&[id]).await.expect("lists");
    assert!(matches!(first[0].state, BatchState::Pending | BatchState::Running), "{name}: fresh job is {first:?}");
    let running = wait_job(batch, id, "running with a node id in its comment", Duration::from_secs(60), |j| {
        j.state == BatchState::Running && j.node().is_some()
    })
    .await;
    let node: NodeId = running.node().expect("node id");
    assert!(!running.hosts.is_empty(), "{name}: a running job names its hosts: {running:?}");
    assert!(running.time_left.is_some_and(|l| l <= Duration::from_secs(600)), "{name}: time left {running:?}");

    // The id in the comment is the node that joined the federation and serves the model.
    let serving = |s: &tela_runtime::status::RegistrySnapshot| {
        procs::record_in(s, &node, Lifecycle::Serve).is_some() && s.replica().serving(&model).contains(&node)
    };
    procs::until(&anchor, "the job's node serving the model", Duration::from_secs(60), serving).await;

    // 2. Drain: the batch shell's trap gets the signal, the node leaves, the job ends by itself.
    batch.signal(id, JobSignal::Drain).await.unwrap_or_else(|e| panic!("{name}: drain: {e}"));
    let start = Instant::now();
    while !output(dir.path(), id).contains("tela: SIGUSR1 received") {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{name}: no trap line in the job output:\n{}",
            output(dir.path(), id)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    procs::until(&anchor, "the drained node LEFT", Duration::from_secs(60), |s| {
        procs::record_in(s, &node, Lifecycle::Left).is_some()
    })
    .await;
    let ended =
        wait_job(batch, id, "ended after its drain", Duration::from_secs(60), |j| j.state == BatchState::Ended).await;
    assert_eq!(ended.raw_state, "COMPLETED", "{name}: a drained node exits 0:\n{}", output(dir.path(), id));
    assert!(!squeue_lists_live(id), "{name}: the allocation of job {id} is released");
    let log = output(dir.path(), id);
    assert!(log.contains(&format!("is node {}", node.to_hex())), "{name}: job output:\n{log}");
    assert!(log.contains("tela node exited with status 0"), "{name}: job output:\n{log}");
    // Draining an ended job is not an error.
    batch.signal(id, JobSignal::Drain).await.unwrap_or_else(|e| panic!("{name}: drain after the end: {e}"));

    // 3. Cancel: a running job ends, and its allocation is released.
    let job2 = template.render(&model, &one_gpu(), Duration::from_secs(600)).expect("renders");
    let id2 = batch.submit(&job2).await.unwrap_or_else(|e| panic!("{name}: submit: {e}"));
    assert_ne!(id, id2);
    let second = wait_job(batch, id2, "running", Duration::from_secs(60), |j| {
        j.state == BatchState::Running && j.node().is_some()
    })
    .await;
    assert_ne!(second.node(), Some(node), "{name}: every job is a node of its own");
    batch.cancel(id2).await.unwrap_or_else(|e| panic!("{name}: cancel: {e}"));
    let cancelled =
        wait_job(batch, id2, "ended after cancel", Duration::from_secs(30), |j| j.state == BatchState::Ended).await;
    assert_eq!(cancelled.raw_state, "CANCELLED", "{name}");
    let start = Instant::now();
    while squeue_lists_live(id2) {
        assert!(start.elapsed() < Duration::from_secs(30), "{name}: job {id2} still holds its allocation");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    batch.cancel(id2).await.unwrap_or_else(|e| panic!("{name}: cancelling an ended job: {e}"));

    // 4. Both at once, in the order asked, and a job id Slurm never had is Ended.
    let unknown = BatchJobId(60_000_000);
    let all = batch.jobs(&[id2, unknown, id]).await.expect("lists");
    assert_eq!(
        all.iter().map(|j| (j.id, j.state)).collect::<Vec<_>>(),
        [(id2, BatchState::Ended), (unknown, BatchState::Ended), (id, BatchState::Ended)]
    );
}

/// What the real Slurm says to a job it cannot take reaches the caller.
pub async fn a_refused_job_says_why(batch: &dyn BatchSystem, env: &SlurmEnv) {
    let dir = tempfile::tempdir().expect("tempdir");
    let template = template(env, dir.path(), "127.0.0.1:9");
    let mut job: JobRequest = template.render("refused", &one_gpu(), Duration::from_secs(600)).expect("renders");
    job.partition = Some("no-such-partition".into());
    let err = batch.submit(&job).await.expect_err("no such partition");
    assert!(matches!(err, BatchError::Refused { .. }), "{err}");
    assert!(err.to_string().to_lowercase().contains("partition"), "{err}");
    let mut job = template.render("refused", &one_gpu(), Duration::from_secs(600)).expect("renders");
    job.gpus_per_node = 64;
    let err = batch.submit(&job).await.expect_err("more GPUs than the node has");
    assert!(matches!(err, BatchError::Refused { .. }), "{err}");
}

/// A job near its time limit drains and ends on its own, COMPLETED rather than TIMEOUT: with
/// `via_signal`, by Slurm's `--signal=B:USR1@...` warning that the batch shell's trap passes on
/// (sbatch); without, by the node's own timer from the time left it reads from Slurm (REST,
/// which cannot ask for a batch-shell signal).
pub async fn a_job_near_its_limit_drains_by_itself(batch: &dyn BatchSystem, env: &SlurmEnv, via_signal: bool) {
    let name = batch.name().to_string();
    let dir = tempfile::Builder::new().prefix("tela-slurm-walltime").tempdir().expect("tempdir");
    let anchor = procs::anchor().await;
    let mut template = template(env, dir.path(), &anchor.local_addr().to_string());
    // Two minutes, of which the last 30 s are the drain window: the warning is asked for 90 s
    // before the limit (30 s into the job, up to 30 s late), the node's own timer fires 90 s in.
    template.drain_window = Duration::from_secs(30);
    let job = template.render("slurm-walltime", &one_gpu(), Duration::from_secs(120)).expect("renders");
    let id = batch.submit(&job).await.unwrap_or_else(|e| panic!("{name}: submit: {e}"));
    let running = wait_job(batch, id, "running with a node id", Duration::from_secs(60), |j| {
        j.state == BatchState::Running && j.node().is_some()
    })
    .await;
    let node = running.node().expect("node id");
    // Joined, in whatever state: Slurm checks limits every 30 s, so its warning may come ~30 s
    // into the job, and a node that starts slowly (a loaded machine) gets it while it is still
    // joining and leaves without ever serving, as it should.
    procs::until(&anchor, "the job's node in the registry", Duration::from_secs(60), |s| s.record(&node).is_some())
        .await;
    procs::until(&anchor, "the node LEFT before the limit", Duration::from_secs(150), |s| {
        procs::record_in(s, &node, Lifecycle::Left).is_some()
    })
    .await;
    let ended = wait_job(batch, id, "ended", Duration::from_secs(30), |j| j.state == BatchState::Ended).await;
    let log = output(dir.path(), id);
    assert_eq!(ended.raw_state, "COMPLETED", "{name}: the node left before the limit:\n{log}");
    assert_eq!(log.contains("tela: SIGUSR1 received"), via_signal, "{name}: job output:\n{log}");
    assert!(log.contains("tela node exited with status 0"), "{name}: job output:\n{log}");
}
