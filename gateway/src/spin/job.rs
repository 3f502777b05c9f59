//! Turning one [`SpinCommand::Submit`](tela_core::spin::SpinCommand) into a [`JobRequest`], with the
//! runtime's job template ([`JobTemplate`]): the batch script that runs `tela node` with the
//! model's engine command, names the node in the job's comment, and passes the drain signal on.
//!
//! The gateway fills the template from its plan: `[spin.job]` (binary, join addresses, secret
//! file, working directory, account, CPUs, environment), the partition (Slurm partition, account,
//! QoS, CPUs)
//! and the model (engine command, drain window). Each job also gets `TELA_TRANSPORT`,
//! `TELA_MODELS` (the node announces the model under the name clients use, whatever the
//! engine calls it) and `TELA_HARDWARE_PROFILE` (the partition's shape, for nodes where no GPU
//! driver answers). The `setup` lines of `[spin.job]` run right after the script's first line.

use std::time::Duration;

use tela_batch::template::{JobTemplate, TemplateError};
use tela_batch::JobRequest;
use tela_core::placement::Placement;

use super::config::{JobSettings, Partition, SpinModel};

/// The job for one submission of `model` on `placement`; `time_min`: a backfill-friendly job
/// Slurm may shrink to that time limit (`--time-min`, for the batch backlog's jobs).
pub fn render(
    settings: &JobSettings,
    partition: &Partition,
    model: &SpinModel,
    placement: &Placement,
    walltime: Duration,
    time_min: Option<Duration>,
) -> Result<JobRequest, TemplateError> {
    let mut template = JobTemplate::new(
        settings.tela.clone(),
        settings.join.clone(),
        settings.join_secret_file.clone(),
        model.engine.clone(),
    );
    template.drain_window = model.drain_window;
    template.time_min = time_min;
    template.partition = Some(partition.slurm_partition.clone());
    template.account = partition.account.clone().or_else(|| settings.account.clone());
    template.qos = partition.qos.clone();
    template.cpus_per_task = partition.cpus_per_task.unwrap_or(settings.cpus_per_task);
    template.working_dir = settings.working_dir.clone();
    template.environment = vec![
        ("TELA_TRANSPORT".into(), settings.transport.clone()),
        ("TELA_MODELS".into(), model.name().to_string()),
        ("TELA_HARDWARE_PROFILE".into(), partition.profile.clone()),
    ];
    template.environment.extend(settings.env.iter().cloned());
    let mut job = template.render(model.name(), placement, walltime)?;
    if !settings.setup.is_empty() {
        let (first, rest) = job.script.split_once('\n').unwrap_or((job.script.as_str(), ""));
        job.script = format!("{first}\n{}\n{rest}", settings.setup.join("\n"));
    }
    Ok(job)
}
