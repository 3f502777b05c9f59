//! Spinning through a real FirecREST v2 server in front of the local Slurm (FirecREST runs
//! sbatch/squeue/sacct/scancel over its own sshd; the backend gets OIDC tokens from the test's
//! own token issuer; all started by `.ci/setup-firecrest.sh`, nothing mocked):
//!
//! - the whole lifecycle of `spinning_on_local_slurm` (cold request answered, walltime drain
//!   from the script's `#SBATCH --signal=B:USR1@…`, replacement, release), through FirecREST;
//! - the time from a request for a cold model to its first token, and the `#SBATCH` lines the
//!   job reached Slurm with;
//! - FirecREST's and the token issuer's refusals reach `/status` and the log in words, and the
//!   spinner backs off instead of hammering them.
//!
//! Ignored (the summary says so) when the build found no FirecREST in the environment
//! (`TELA_FIRECREST_URL`; see `gateway/build.rs`); under CI it must be there.

use crate::common;
use crate::slurm_env::discover;
use crate::spinning_on_local_slurm::scenario;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use discover::{slurm_env, SlurmEnv};
use tela_gateway::config::LoadedConfig;
use tela_gateway::gateway::Gateway;
use tela_gateway::spin::SpinSetup;

/// The `TELA_FIRECREST_*` variable `name`; missing is a failure (the test runs only when the
/// build found FirecREST, or under CI where it must be there).
fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: start FirecREST with `.ci/setup-firecrest.sh` (as root) and export what it prints (`.ci/test` does both)")
    })
}

/// `[spin.backend]` for the FirecREST of `.ci/setup-firecrest.sh`.
pub(crate) fn backend_section() -> String {
    backend_with(
        &var("TELA_FIRECREST_SYSTEM"),
        &format!("client_secret_file = \"{}\"", var("TELA_FIRECREST_SECRET_FILE")),
    )
}

fn backend_with(system: &str, secret_line: &str) -> String {
    format!(
        "kind = \"firecrest\"\nurl = \"{}\"\nsystem = \"{system}\"\ntoken_url = \"{}\"\nclient_id = \"{}\"\n{secret_line}\ntimeout = \"20s\"",
        var("TELA_FIRECREST_URL"),
        var("TELA_FIRECREST_TOKEN_URL"),
        var("TELA_FIRECREST_CLIENT_ID"),
    )
}

/// A gateway that spins model `fc-spun` through `backend`, its node dialling `anchor`.
fn config(env: &SlurmEnv, backend: &str, dir: &Path, anchor: &str) -> String {
    let secret = dir.join("join-secret");
    std::fs::write(&secret, format!("{SECRET}\n")).expect("secret file");
    format!(
        r#"
[spin]
interval = "1s"
max_concurrent_jobs = 2
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
name = "fc-spun"
params = "135M"
quantization = "bf16"
engine = "{tela} engine-sim --host 127.0.0.1 --port {{port}} --model {{model}} --ttft-ms 5 --tokens-per-s 20"
max_replicas = 1
walltime = "10m"
drain_window = "20s"
scale_down_after = "300s"
cooldown = "1s"
"#,
        tela = tela(),
        secret = secret.display(),
        dir = dir.display(),
        partition = env.partition,
    )
}

async fn start_gateway(env: &SlurmEnv, backend: &str, dir: &Path) -> Arc<Gateway> {
    let anchor = format!("127.0.0.1:{}", free_port());
    let loaded = LoadedConfig::parse(&config(env, backend, dir, &anchor), "test").expect("valid config");
    let plan = loaded.spin.expect("[spin]");
    let batch = tela_gateway::spin::backend::connect(&plan.backend).expect("backend");
    let mut gateway_config = gateway_config(dir);
    gateway_config.anchor_listen = anchor.parse().expect("addr");
    gateway_config.spin = Some(SpinSetup { plan, batch });
    Arc::new(Gateway::start(gateway_config).await.expect("gateway starts"))
}

/// The batch script Slurm holds for job `id`.
fn batch_script(id: &str) -> String {
    let out =
        std::process::Command::new("scontrol").args(["write", "batch_script", id, "-"]).output().expect("scontrol");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[cfg_attr(
    not(tela_firecrest),
    ignore = "needs FirecREST: run .ci/test as root, or .ci/setup-firecrest.sh and export what it prints"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spinning_through_firecrest() {
    let env = slurm_env("spinning_through_firecrest", false);
    within(400, scenario(&env, "firecrest")).await;
}

#[cfg_attr(
    not(tela_firecrest),
    ignore = "needs FirecREST: run .ci/test as root, or .ci/setup-firecrest.sh and export what it prints"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_model_streams_its_first_token_through_firecrest() {
    let env = slurm_env("a_cold_model_streams_its_first_token_through_firecrest", false);
    within(200, async {
        let dir = tempfile::tempdir().expect("tempdir");
        let gateway = start_gateway(&env, &backend_section(), dir.path()).await;
        let base = gateway.base_url();

        let started = Instant::now();
        let response =
            send(&base, "POST", "/v1/chat/completions", Some(KEY), Some(chat("fc-spun", true, 8).to_string())).await;
        let streamed = read_stream(response, started).await;
        assert_eq!(streamed.status, 200, "{}\n{:#}", streamed.text(), gateway.status());
        let first_token = streamed
            .chunks
            .iter()
            .find(|(_, c)| String::from_utf8_lossy(c).contains("\"content\""))
            .map(|(t, _)| *t)
            .expect("a token came");
        assert_eq!(streamed.events().last().map(String::as_str), Some("[DONE]"), "{}", streamed.text());
        println!(
            "FIGURE firecrest: cold request to first token {:.2} s (FirecREST submit over ssh, Slurm start, node join, engine start)",
            first_token.as_secs_f64()
        );

        // The job reached Slurm with its resources and walltime warning as #SBATCH lines, and
        // the spinner knows which node it became (read from the job's output through FirecREST).
        let spin = gateway.status()["spin"].clone();
        let id = spin["jobs"][0]["batch_id"].as_str().expect("a job").to_string();
        let script = batch_script(&id);
        for line in ["#SBATCH --nodes=1", "#SBATCH --cpus-per-task=1", "#SBATCH --time=0-00:10:00", "#SBATCH --signal=B:USR1@80"] {
            assert!(script.contains(line), "{line} missing from job {id}'s script:\n{script}");
        }
        let named = eventually(Duration::from_secs(15), || gateway.status()["spin"]["jobs"][0]["node"].is_string()).await;
        assert!(named, "the job's node stays unknown: {:#}", gateway.status());
        assert!(spin["backend"].as_str().is_some_and(|b| b.contains("firecrest")), "{spin:#}");

        let _ = std::process::Command::new("scancel").arg(&id).status();
        if let Ok(gateway) = Arc::try_unwrap(gateway) {
            gateway.shutdown().await;
        }
    })
    .await;
}

#[cfg_attr(
    not(tela_firecrest),
    ignore = "needs FirecREST: run .ci/test as root, or .ci/setup-firecrest.sh and export what it prints"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn firecrest_refusals_reach_status_in_words_and_the_spinner_backs_off() {
    let env = slurm_env("firecrest_refusals_reach_status_in_words_and_the_spinner_backs_off", false);
    within(120, async {
        let dir = tempfile::tempdir().expect("tempdir");
        let wrong = dir.path().join("wrong-secret");
        std::fs::write(&wrong, "not-the-secret\n").expect("write");
        let system = var("TELA_FIRECREST_SYSTEM");
        let cases = [
            // The token issuer refuses the client: 401 invalid_client, in its words.
            (backend_with(&system, &format!("client_secret_file = \"{}\"", wrong.display())), "invalid_client"),
            // FirecREST refuses the request: 4xx with its message.
            (
                backend_with(
                    "no-such-system",
                    &format!("client_secret_file = \"{}\"", var("TELA_FIRECREST_SECRET_FILE")),
                ),
                "System not found",
            ),
        ];
        for (backend, words) in cases {
            let case_dir = tempfile::tempdir().expect("tempdir");
            let gateway = start_gateway(&env, &backend, case_dir.path()).await;
            let base = gateway.base_url();
            // A cold request makes the spinner submit; it waits in the cold-start queue.
            let waiting =
                tokio::spawn(async move { post(&base, "/v1/chat/completions", chat("fc-spun", false, 4)).await });
            let said = eventually(Duration::from_secs(30), || {
                gateway.status()["spin"]["last_error"].as_str().is_some_and(|e| e.contains(words))
            })
            .await;
            assert!(said, "'{words}' never reached /status: {:#}", gateway.status());
            let error = gateway.status()["spin"]["last_error"].as_str().unwrap_or_default().to_string();
            assert!(error.contains("firecrest"), "the error names the backend: {error}");
            assert!(!error.contains("not-the-secret"), "a secret reached /status: {error}");
            // Backing off: the pause doubles with each failed submission in a row (1 s, 2 s,
            // 4 s, ...), so 6 s of 1 s decisions bring at most 3 more, and the words say when.
            assert!(error.contains("next try in"), "{error}");
            let errors_total = |text: &str| -> f64 {
                text.lines()
                    .filter(|l| l.starts_with("tela_gateway_spin_batch_errors_total") && l.contains("submit"))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum()
            };
            let before = errors_total(&call(&gateway.base_url(), "GET", "/metrics", Some(KEY), None).await.text());
            tokio::time::sleep(Duration::from_secs(6)).await;
            let after = errors_total(&call(&gateway.base_url(), "GET", "/metrics", Some(KEY), None).await.text());
            assert!(before >= 1.0, "the failed submission was not counted");
            assert!(after - before <= 3.0, "{} failed submissions in 6 s: no backoff", after - before);
            waiting.abort();
            if let Ok(gateway) = Arc::try_unwrap(gateway) {
                gateway.shutdown().await;
            }
        }
        // An unreachable FirecREST is an error in words too (no answer, not a hang).
        let port = free_port();
        let unreachable = backend_section().replace(&var("TELA_FIRECREST_URL"), &format!("http://127.0.0.1:{port}"));
        let gateway = start_gateway(&env, &unreachable, dir.path()).await;
        let base = gateway.base_url();
        let waiting = tokio::spawn(async move { post(&base, "/v1/chat/completions", chat("fc-spun", false, 4)).await });
        let said = eventually(Duration::from_secs(30), || {
            gateway.status()["spin"]["last_error"].as_str().is_some_and(|e| e.contains("cannot reach"))
        })
        .await;
        assert!(said, "an unreachable FirecREST never reached /status: {:#}", gateway.status());
        waiting.abort();
        if let Ok(gateway) = Arc::try_unwrap(gateway) {
            gateway.shutdown().await;
        }
    })
    .await;
}
