//! Turning one [`SpinCommand::Submit`](tela_core::SpinCommand) into a [`JobRequest`]: the
//! resources from the placement and the partition, and a batch script that runs the engine
//! under `tela node`.
//!
//! The script:
//!
//! 1. exports the node's settings (`TELA_JOIN`, `TELA_JOIN_SECRET_FILE`, `TELA_MODELS`,
//!    `TELA_DRAIN_WINDOW`, the partition's hardware profile as the fallback when no GPU driver
//!    answers) and a per-job identity and control socket, and picks the engine's port from the
//!    job id so that jobs sharing a host do not collide;
//! 2. runs the operator's `setup` lines, then `tela node` in the background with the engine
//!    command (`{port}` becomes `$PORT`, expanded by the shell the node runs it with);
//! 3. asks the node for its id (`tela status --json` on the control socket) and writes
//!    `tela-node=<id>` into the job's comment with `scontrol update`, which is how the gateway
//!    links the job to the node ([`tela_runtime::batch::BatchJob::node`]);
//! 4. passes SIGUSR1 (Slurm's warning `drain_window` before the limit, or the gateway's drain)
//!    and SIGTERM (`scancel`) on to the node and waits for it; the node drains, stops the engine
//!    and exits.
//!
//! The node's own drain window is a little shorter than the job's signal lead, so that it is
//! gone before Slurm's SIGTERM even when the warning comes late (Slurm checks limits every 30 s).
//! Nothing secret is written into the script: the join secret stays in its file.

use std::time::Duration;

use tela_core::placement::Placement;
use tela_core::JobId;
use tela_runtime::batch::JobRequest;

use super::config::{JobSettings, Partition, SpinModel};

/// Quotes `s` for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=@,+".contains(&b)) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The engine command with its placeholders filled in; `{port}` becomes `$PORT`.
pub fn engine_command(template: &str, model: &str, placement: &Placement) -> String {
    template
        .replace("{model}", model)
        .replace("{tp}", &placement.tensor_parallel.to_string())
        .replace("{pp}", &placement.pipeline_stages.to_string())
        .replace("{gpus}", &placement.gpus().to_string())
        .replace("{variant}", &placement.variant.label)
        .replace("{port}", "$PORT")
}

/// The node's drain window for a job warned `lead` before its limit: 15 s shorter (a quarter
/// shorter for short leads), so that it has left before the limit.
pub fn node_drain_window(lead: Duration) -> Duration {
    let margin = (lead / 4).min(Duration::from_secs(15));
    lead - margin
}

/// A job name Slurm shows: `tela-<model>-<job>`, with characters outside `[A-Za-z0-9._-]` as `_`.
pub fn job_name(model: &str, job: JobId) -> String {
    let clean: String =
        model.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
    format!("tela-{clean}-{}", job.0)
}

/// The job for one submission.
pub fn render(
    settings: &JobSettings,
    partition: &Partition,
    model: &SpinModel,
    job: JobId,
    placement: &Placement,
    walltime: Duration,
) -> JobRequest {
    let name = model.name();
    let tela = shell_quote(&settings.tela);
    let mut s = String::from("#!/bin/bash\n");
    s.push_str(&format!(
        "# A Tela serving node for model '{name}', started by the gateway (spin job {}).\n# Placement: {placement}\n",
        job.0
    ));
    s.push_str("set -u\n");
    let export = |s: &mut String, k: &str, v: &str| s.push_str(&format!("export {k}={}\n", shell_quote(v)));
    export(&mut s, "TELA_JOIN", &settings.join.join(","));
    export(&mut s, "TELA_JOIN_SECRET_FILE", &settings.join_secret_file);
    export(&mut s, "TELA_TRANSPORT", &settings.transport);
    export(&mut s, "TELA_MODELS", name);
    export(&mut s, "TELA_DRAIN_WINDOW", &format!("{}s", node_drain_window(model.drain_window).as_secs()));
    export(&mut s, "TELA_HARDWARE_PROFILE", &partition.profile);
    s.push_str("JOB=\"${SLURM_JOB_ID:-$$}\"\n");
    s.push_str("STATE=\"${TMPDIR:-/tmp}/tela-job-$JOB\"\nmkdir -p \"$STATE\"\n");
    s.push_str("export TELA_IDENTITY=\"$STATE/node.key\" TELA_CONTROL=\"$STATE/node.sock\"\n");
    s.push_str("export PORT=$((20000 + JOB % 20000))\n");
    for line in &settings.setup {
        s.push_str(line);
        s.push('\n');
    }
    s.push_str(&format!(
        "{tela} node --backend-url \"http://127.0.0.1:$PORT\" --engine-cmd {} &\nNODE=$!\n",
        shell_quote(&engine_command(&model.engine, name, placement))
    ));
    s.push_str("trap 'kill -USR1 $NODE 2>/dev/null || true' USR1\n");
    s.push_str("trap 'kill -TERM $NODE 2>/dev/null || true' TERM\n");
    // The comment names the node once its control socket answers (bounded: 10 minutes).
    s.push_str(&format!(
        "( for _ in $(seq 1 1200); do\n    \
         id=$({tela} status --json 2>/dev/null | sed -n 's/.*\"node\":\"\\([0-9a-f]\\{{32\\}}\\)\".*/\\1/p')\n    \
         if [ -n \"$id\" ]; then scontrol update JobId=\"$JOB\" Comment=\"tela-node=$id\"; break; fi\n    \
         kill -0 $NODE 2>/dev/null || break\n    sleep 0.5\n  done ) &\n"
    ));
    s.push_str(
        "status=0\nwhile true; do\n    if wait $NODE; then status=0; else status=$?; fi\n    \
         kill -0 $NODE 2>/dev/null || break\ndone\nrm -rf \"$STATE\"\nexit \"$status\"\n",
    );
    JobRequest {
        name: job_name(name, job),
        script: s,
        partition: Some(partition.name.clone()),
        account: partition.account.clone().or_else(|| settings.account.clone()),
        nodes: placement.pipeline_stages,
        gpus_per_node: u32::from(placement.tensor_parallel).min(u32::from(partition.hardware.gpu_count)),
        cpus_per_task: partition.cpus_per_task.unwrap_or(settings.cpus_per_task),
        walltime,
        drain_signal_before: model.drain_window,
        working_dir: settings.working_dir.clone(),
        environment: settings.env.clone(),
    }
}
