//! The `sbatch`/`squeue`/`scancel` backend against the real local Slurm: a job rendered by the
//! job template runs the real `tela node` (with `tela engine-sim`), its comment names the node
//! that joins the federation, a drain reaches the batch shell's trap and the node leaves, a
//! cancel ends a job and releases its allocation. Ignored (the summary says
//! so, with the reason) when the build found no local Slurm; see `gateway/build.rs`.

use crate::procs;
use crate::slurm_env;

use std::time::Duration;
use tela_batch::sbatch::{Sbatch, SbatchConfig};

#[cfg_attr(
    not(tela_slurm),
    ignore = "needs a local Slurm: run .ci/test as root, or .ci/slurm/start.sh and export what it prints"
)]
#[test]
fn sbatch_job_serves_drains_and_cancels() {
    let env = slurm_env::slurm_env("sbatch_job_serves_drains_and_cancels", false);
    procs::run_test(Duration::from_secs(300), async {
        let batch = Sbatch::new(SbatchConfig::default());
        slurm_env::serving_job_drains_and_a_cancelled_job_ends(&batch, &env).await;
    });
}

#[cfg_attr(
    not(tela_slurm),
    ignore = "needs a local Slurm: run .ci/test as root, or .ci/slurm/start.sh and export what it prints"
)]
#[test]
fn sbatch_refusals_carry_slurms_words() {
    let env = slurm_env::slurm_env("sbatch_refusals_carry_slurms_words", false);
    procs::run_test(Duration::from_secs(60), async {
        let batch = Sbatch::new(SbatchConfig::default());
        slurm_env::a_refused_job_says_why(&batch, &env).await;
    });
}

#[test]
fn a_missing_sbatch_is_unreachable_not_a_panic() {
    procs::run_test(Duration::from_secs(30), async {
        use tela_batch::{BatchError, BatchJobId, BatchSystem};
        let batch = Sbatch::new(SbatchConfig { squeue: "/nonexistent/squeue".into(), ..SbatchConfig::default() });
        let err = batch.jobs(&[BatchJobId(1)]).await.unwrap_err();
        assert!(matches!(err, BatchError::Unreachable { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/squeue"), "{err}");
        let slow = Sbatch::new(SbatchConfig {
            scancel: "sleep".into(),
            timeout: Duration::from_millis(300),
            ..SbatchConfig::default()
        });
        // `sleep 1` stands in for a hung scancel: killed at the timeout.
        let err = slow.cancel(BatchJobId(1)).await.unwrap_err();
        assert!(err.to_string().contains("did not finish within"), "{err}");
    });
}

#[cfg_attr(
    not(tela_slurm),
    ignore = "needs a local Slurm: run .ci/test as root, or .ci/slurm/start.sh and export what it prints"
)]
#[test]
fn sbatch_job_drains_on_slurms_warning_before_its_limit() {
    let env = slurm_env::slurm_env("sbatch_job_drains_on_slurms_warning_before_its_limit", false);
    procs::run_test(Duration::from_secs(240), async {
        let batch = Sbatch::new(SbatchConfig::default());
        slurm_env::a_job_near_its_limit_drains_by_itself(&batch, &env, true).await;
    });
}
