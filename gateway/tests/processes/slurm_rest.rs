//! The slurmrestd backend (OpenAPI v0.0.38, JWT) against the real local Slurm's REST daemon:
//! the same scenario as `slurm_sbatch.rs` (a templated job runs the real `tela node`, its
//! comment names the node, a drain reaches the batch shell and the node leaves, a cancel ends
//! a job and releases its allocation), plus version discovery and token renewal. Ignored (the
//! summary says so, with the reason) when the build found no slurmrestd; see `gateway/build.rs`.

use crate::procs;
use crate::slurm_env;

use std::time::Duration;
use tela_batch::slurmrest::{RestVersion, SlurmRest, SlurmRestConfig};
use tela_batch::{BatchError, BatchJobId, BatchSystem};

fn config(env: &slurm_env::SlurmEnv) -> SlurmRestConfig {
    let (url, user, token) = env.rest.clone().expect("REST settings");
    SlurmRestConfig::new(url, user, token)
}

#[cfg_attr(
    not(tela_slurmrest),
    ignore = "needs slurmrestd: run .ci/test as root, or .ci/slurm/start.sh and export what it prints"
)]
#[test]
fn rest_job_serves_drains_and_cancels() {
    let env = slurm_env::slurm_env("rest_job_serves_drains_and_cancels", true);
    procs::run_test(Duration::from_secs(300), async {
        let batch = SlurmRest::connect(config(&env)).await.expect("connects");
        assert_eq!(batch.version(), RestVersion::V0_0_38, "discovered from the daemon");
        assert_eq!(batch.name(), "slurmrestd v0.0.38");
        slurm_env::serving_job_drains_and_a_cancelled_job_ends(&batch, &env).await;
    });
}

#[cfg_attr(
    not(tela_slurmrest),
    ignore = "needs slurmrestd: run .ci/test as root, or .ci/slurm/start.sh and export what it prints"
)]
#[test]
fn rest_refusals_carry_slurms_words() {
    let env = slurm_env::slurm_env("rest_refusals_carry_slurms_words", true);
    procs::run_test(Duration::from_secs(60), async {
        let batch = SlurmRest::connect(config(&env)).await.expect("connects");
        slurm_env::a_refused_job_says_why(&batch, &env).await;
    });
}

#[cfg_attr(
    not(tela_slurmrest),
    ignore = "needs slurmrestd: run .ci/test as root, or .ci/slurm/start.sh and export what it prints"
)]
#[test]
fn a_renewed_token_file_is_picked_up() {
    let env = slurm_env::slurm_env("a_renewed_token_file_is_picked_up", true);
    procs::run_test(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("jwt");
        std::fs::write(&token, "not-a-token\n").expect("write");
        let mut config = config(&env);
        config.token_file = token.clone();
        config.version = Some(RestVersion::V0_0_38);
        let batch = SlurmRest::connect(config).await.expect("no request needed");
        let unknown = [BatchJobId(60_000_001)];
        let err = batch.jobs(&unknown).await.expect_err("a bad token is refused");
        assert!(matches!(err, BatchError::Refused { .. }), "{err}");
        // The token is renewed in place: the next call uses the new one.
        let real = std::fs::read_to_string(env.rest.as_ref().expect("rest").2.clone()).expect("read the token");
        std::fs::write(&token, real).expect("write");
        let jobs = batch.jobs(&unknown).await.expect("the renewed token works");
        assert_eq!(jobs[0].state, tela_batch::BatchState::Ended);
    });
}

#[cfg_attr(
    not(tela_slurmrest),
    ignore = "needs slurmrestd: run .ci/test as root, or .ci/slurm/start.sh and export what it prints"
)]
#[test]
fn rest_job_drains_on_its_own_timer_before_its_limit() {
    let env = slurm_env::slurm_env("rest_job_drains_on_its_own_timer_before_its_limit", true);
    procs::run_test(Duration::from_secs(240), async {
        let batch = SlurmRest::connect(config(&env)).await.expect("connects");
        slurm_env::a_job_near_its_limit_drains_by_itself(&batch, &env, false).await;
    });
}
