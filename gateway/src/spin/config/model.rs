//! `[[spin.model]]`: the models that may spin, checked: the core's spin policy
//! ([`ModelSection::policy`], placement included) and what running a job needs (the engine
//! command and the drain window before the walltime).

use std::time::Duration;

use tela_core::spin::config::{positive, ModelSection};
use tela_core::spin::ModelPolicy;

use super::error::{invalid, ConfigError};
use super::job::JobSettings;
use super::partition::Partition;

/// A spinnable model, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpinModel {
    /// How it spins (its spec, replicas, timers and partitions).
    pub policy: ModelPolicy,
    /// The engine command template.
    pub engine: String,
    /// How long before its time limit a job is told to drain.
    pub drain_window: Duration,
}

impl SpinModel {
    /// The model's name.
    pub fn name(&self) -> &str {
        &self.policy.spec.name
    }
}

pub(super) fn resolve_model(m: &ModelSection, partitions: &[Partition]) -> Result<SpinModel, ConfigError> {
    let key = |field: &str| m.key(field);
    let engine = m.engine.clone().unwrap_or_default();
    if engine.trim().is_empty() {
        return Err(invalid(key("engine"), "must be the engine's command line"));
    }
    if !engine.contains("{port}") {
        return Err(invalid(
            key("engine"),
            "must contain {port}: the engine listens on 127.0.0.1:{port}, where the node probes it",
        ));
    }
    let shapes: Vec<_> = partitions.iter().map(|p| p.shape(p.nodes)).collect();
    let policy = m.policy(&shapes)?;
    let drain_window = positive(&key("drain_window"), m.drain_window, Duration::from_secs(15 * 60))?;
    let slack = tela_batch::template::DRAIN_SIGNAL_SLACK;
    if drain_window + slack >= policy.walltime {
        return Err(invalid(
            key("drain_window"),
            format!(
                "{} plus the {} by which Slurm's warning comes ahead of it is not shorter than the walltime {}",
                humantime::format_duration(drain_window),
                humantime::format_duration(slack),
                humantime::format_duration(policy.walltime)
            ),
        ));
    }
    let placement = tela_core::spin::config::place_on(&policy.spec, &policy.shapes, &shapes)
        .map_err(|reason| invalid(format!("spin.model[{}]", m.name), reason.to_string()))?;
    let model = SpinModel { policy, engine, drain_window };
    // The job template's own checks (placeholders, values a script cannot hold), on a job
    // rendered with stand-in settings.
    let settings = JobSettings {
        tela: "tela".into(),
        join: vec!["check:1".into()],
        join_secret_file: "secret".into(),
        transport: "auto".into(),
        working_dir: "/tmp".into(),
        account: None,
        cpus_per_task: 1,
        setup: Vec::new(),
        env: Vec::new(),
    };
    let partition = &partitions[placement.shape];
    if let Err(e) = crate::spin::job::render(&settings, partition, &model, &placement, model.policy.walltime, None) {
        return Err(invalid(key("engine"), e.to_string()));
    }
    Ok(model)
}
