//! The `[spin]` section of `gateway.toml`: what the gateway may start, where, and within which
//! limits. [`SpinSection`] is the file as written (every table refuses unknown keys);
//! [`SpinPlan::resolve`] checks it and turns it into what the spin task runs with, and every
//! refusal names the key at fault and says why ([`ConfigError::Invalid`]).
//!
//! ```toml
//! [spin]
//! interval = "5s"               # how often demand is looked at (also on every cold start)
//! max_concurrent_jobs = 8       # live jobs at once, all models together
//! start_estimate_timeout = "10s" # ask the queue where a job starts soonest ("0s": don't)
//! budget = { gpu_hours = 200, window = "24h" }
//!
//! [spin.backend]
//! kind = "sbatch"               # or "slurmrest" with url, user, token_file, version; or
//!                               # "firecrest" with url, system, token_url, client_id and
//!                               # client_secret_file or client_secret_env; the REST kinds'
//!                               # URLs are http:// or https:// (ca_cert = "site-ca.pem")
//!
//! [spin.job]
//! tela = "/opt/tela/bin/tela"   # the binary, as compute nodes see it
//! join = ["gateway.example.org:7000"]
//! join_secret_file = "/home/tela/.tela/join-secret"
//!
//! [spin.cold_start]
//! capacity = 64                 # waiting requests per model
//! timeout = "10m"
//!
//! [[spin.partition]]
//! name = "gpu-a100"
//! shape = "a100-80x4"           # a hardware profile, or gpu = "a100-80" with gpus = 4
//! nodes = 4                     # the most nodes of it the gateway holds at once
//!
//! [[spin.model]]
//! name = "llama-3.1-8b"
//! params = "8B"
//! quantization = "bf16"
//! kv_headroom = "4GiB"
//! engine = "vllm serve meta-llama/Llama-3.1-8B-Instruct --port {port} --tensor-parallel-size {tp}"
//! ```
//!
//! A commented example with every key is `gateway/examples/gateway.toml`.

mod backend;
mod batch;
mod error;
mod job;
mod model;
mod partition;

use std::time::Duration;

use serde::Deserialize;
use tela_core::placement::{NoPlacement, NodeShape, Placement};
use tela_core::spin::{SpinConfig, Spinner};
use tela_core::GpuModel;

pub use backend::{BackendKind, BackendPlan, BackendSection};
pub use batch::{BatchSpin, BatchSpinSection};
pub use error::ConfigError;
pub use job::{JobSection, JobSettings};
pub use model::SpinModel;
pub use partition::Partition;
pub use tela_core::spin::config::{
    place_on, BudgetSection, ColdStartSection, Dur, Mib, ModelSection, PartitionSection, VariantSection,
};

use backend::resolve_backend;
use batch::resolve_batch_spin;
use error::invalid;
use job::resolve_job;
use model::resolve_model;
use partition::resolve_partition;
use tela_core::spin::config::positive;

/// `[spin]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpinSection {
    /// How often the spin task looks at demand (default 5 s).
    pub interval: Option<Dur>,
    /// Live jobs at once, all models together (default 8).
    pub max_concurrent_jobs: Option<u32>,
    /// How long the scheduler may take to estimate a job's start before each submission
    /// (default 10 s; "0s": do not ask, keep the configured order).
    pub start_estimate_timeout: Option<Dur>,
    /// GPU-hours the jobs submitted within one window may use.
    pub budget: Option<BudgetSection>,
    /// The batch system's front door.
    pub backend: Option<BackendSection>,
    /// What every job runs.
    pub job: Option<JobSection>,
    /// The cold-start queue.
    pub cold_start: Option<ColdStartSection>,
    /// The partitions jobs may go to (`[[spin.partition]]`).
    #[serde(default)]
    pub partition: Vec<PartitionSection>,
    /// The models that may spin (`[[spin.model]]`).
    #[serde(default)]
    pub model: Vec<ModelSection>,
    /// Spinning for the batch API's backlog (`[spin.batch]`; default: off, only requests
    /// waiting or in flight count).
    pub batch: Option<BatchSpinSection>,
}

/// `[spin]`, checked: everything the spin task needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpinPlan {
    /// How often demand is looked at.
    pub interval: Duration,
    /// How long start estimates may take before a submission (zero: none asked).
    pub start_estimate_timeout: Duration,
    /// Limits over all models.
    pub limits: SpinConfig,
    /// The batch system's front door.
    pub backend: BackendPlan,
    /// What every job runs.
    pub job: JobSettings,
    /// Waiting requests per model.
    pub cold_start_capacity: usize,
    /// The longest a request waits.
    pub cold_start_timeout: Duration,
    /// Where jobs may go, in the order written.
    pub partitions: Vec<Partition>,
    /// What may spin, in the order written.
    pub models: Vec<SpinModel>,
    /// Spinning for the batch backlog, when `[spin.batch]` is set.
    pub batch: Option<BatchSpin>,
}

/// Where one replica of a model would go with every partition free.
#[derive(Clone, Debug)]
pub struct PlannedModel {
    /// The model.
    pub model: String,
    /// The placement, or why there is none.
    pub placement: Result<Placement, NoPlacement>,
}

impl SpinPlan {
    /// Checks `[spin]` and resolves it; see the module docs.
    pub fn resolve(section: &SpinSection) -> Result<SpinPlan, ConfigError> {
        let interval = positive("spin.interval", section.interval, Duration::from_secs(5))?;
        let limits = tela_core::spin::config::limits(section.max_concurrent_jobs, section.budget.as_ref())?;
        let backend = resolve_backend(section.backend.as_ref())?;
        let job = resolve_job(section.job.as_ref())?;
        let cold_start = ColdStartSection::resolve(section.cold_start.as_ref())?;
        if section.partition.is_empty() {
            return Err(invalid(
                "spin.partition",
                "no partition: add at least one [[spin.partition]] with a name, shape and nodes",
            ));
        }
        let mut partitions = Vec::new();
        for p in &section.partition {
            let partition = resolve_partition(p)?;
            if partitions.iter().any(|q: &Partition| q.name == partition.name) {
                return Err(invalid(format!("spin.partition[{}]", p.name), "is defined twice"));
            }
            partitions.push(partition);
        }
        if section.model.is_empty() {
            return Err(invalid("spin.model", "no model: add at least one [[spin.model]]"));
        }
        let batch = section.batch.as_ref().map(resolve_batch_spin).transpose()?;
        let mut models: Vec<SpinModel> = Vec::new();
        for m in &section.model {
            let mut model = resolve_model(m, &partitions)?;
            if let Some(b) = batch {
                // Even a job Slurm shrank to its least time must leave time to serve.
                let least = model.drain_window + tela_batch::template::DRAIN_SIGNAL_SLACK;
                if b.job_time_min <= least {
                    return Err(invalid(
                        "spin.batch.job_time_min",
                        format!(
                            "{} is not longer than model '{}''s drain window plus {} ({}): a shrunk job could not serve",
                            humantime::format_duration(b.job_time_min),
                            m.name,
                            humantime::format_duration(tela_batch::template::DRAIN_SIGNAL_SLACK),
                            humantime::format_duration(least)
                        ),
                    ));
                }
                model.policy.batch_walltime = Some(b.job_walltime);
            }
            if models.iter().any(|q| q.name() == model.name()) {
                return Err(invalid(format!("spin.model[{}]", m.name), "is defined twice"));
            }
            models.push(model);
        }
        // The core's own checks, for anything the ones above do not cover.
        Spinner::new(limits, models.iter().map(|m| m.policy.clone()).collect())
            .map_err(|e| invalid("spin.model", e.to_string()))?;
        let start_estimate_timeout = section.start_estimate_timeout.map_or(Duration::from_secs(10), |d| d.0);
        Ok(SpinPlan {
            interval,
            start_estimate_timeout,
            limits,
            backend,
            job,
            cold_start_capacity: cold_start.capacity,
            cold_start_timeout: cold_start.timeout,
            partitions,
            models,
            batch,
        })
    }

    /// The model named `name`.
    pub fn model(&self, name: &str) -> Option<&SpinModel> {
        self.models.iter().find(|m| m.name() == name)
    }

    /// The partition named `name`.
    pub fn partition(&self, name: &str) -> Option<&Partition> {
        self.partitions.iter().find(|p| p.name == name)
    }

    /// The partitions as shapes with every node free.
    pub fn shapes(&self) -> Vec<NodeShape> {
        self.partitions.iter().map(|p| p.shape(p.nodes)).collect()
    }

    /// Where each model's first replica would go.
    pub fn placements(&self) -> Vec<PlannedModel> {
        self.models
            .iter()
            .map(|m| PlannedModel {
                model: m.name().to_string(),
                placement: place_on(&m.policy.spec, &m.policy.shapes, &self.shapes()),
            })
            .collect()
    }

    /// The plan for people (`tela gateway --check-config`).
    pub fn describe(&self) -> String {
        let mut out = format!(
            "spinning with {} every {}; at most {} live jobs",
            self.backend,
            humantime::format_duration(self.interval),
            self.limits.max_concurrent_jobs
        );
        if let Some(b) = self.limits.budget {
            out.push_str(&format!(", {} GPU-hours per {}", b.gpu_hours, humantime::format_duration(b.window)));
        }
        if self.start_estimate_timeout.is_zero() {
            out.push_str("; partitions tried in configured order (no start estimates)");
        } else {
            out.push_str(&format!(
                "; each job goes where the queue starts it soonest (estimates within {})",
                humantime::format_duration(self.start_estimate_timeout)
            ));
        }
        out.push_str(&format!(
            "\ncold start: up to {} requests per model wait up to {}\njobs run {} and join {}\n\npartitions:\n",
            self.cold_start_capacity,
            humantime::format_duration(self.cold_start_timeout),
            self.job.tela,
            self.job.join.join(", ")
        ));
        for p in &self.partitions {
            let gpus = match p.hardware.gpu {
                GpuModel::None => "no GPU".to_string(),
                _ => format!("{} x {:?}, {} MiB each", p.hardware.gpu_count, p.hardware.gpu, p.hardware.vram_mib),
            };
            let mut slurm = Vec::new();
            if p.slurm_partition != p.name {
                slurm.push(format!("Slurm partition {}", p.slurm_partition));
            }
            if let Some(q) = &p.qos {
                slurm.push(format!("QoS {q}"));
            }
            let slurm = if slurm.is_empty() { String::new() } else { format!(" ({})", slurm.join(", ")) };
            out.push_str(&format!("  {:<16} {:<12} {gpus}; at most {} node(s){slurm}\n", p.name, p.profile, p.nodes));
        }
        out.push_str("\nmodels (where one replica goes with every partition free):\n");
        for (m, planned) in self.models.iter().zip(self.placements()) {
            let p = &m.policy;
            let place = match &planned.placement {
                Ok(pl) => format!(
                    "{}: {} node(s) x TP {} = {} GPU(s), {} weights{}",
                    pl.shape_name,
                    pl.pipeline_stages,
                    pl.tensor_parallel,
                    pl.gpus(),
                    pl.variant.label,
                    if pl.quantized_fallback { " (quantized fallback)" } else { "" }
                ),
                Err(e) => format!("nowhere: {e}"),
            };
            out.push_str(&format!(
                "  {:<20} -> {place}\n  {:<20}    replicas {}..={}, {} requests each, walltime {}, drain {} before, \
                 release after {} idle, cooldown {}\n",
                planned.model,
                "",
                p.min_replicas,
                p.max_replicas,
                p.concurrency_per_replica,
                humantime::format_duration(p.walltime),
                humantime::format_duration(m.drain_window),
                humantime::format_duration(p.scale_down_after),
                humantime::format_duration(p.cooldown),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LoadedConfig;

    const EXAMPLE: &str = include_str!("../../../examples/gateway.toml");

    pub(super) fn minimal() -> String {
        r#"
[spin]
[spin.backend]
kind = "sbatch"
[spin.job]
tela = "/opt/tela"
join = ["gw:7000"]
join_secret_file = "/etc/secret"
[[spin.partition]]
name = "gpu"
shape = "a100-80x4"
nodes = 2
[[spin.model]]
name = "small"
params = "8B"
quantization = "bf16"
kv_headroom = "2GiB"
engine = "serve --port {port}"
"#
        .to_string()
    }

    pub(super) fn refused(text: &str) -> String {
        match LoadedConfig::parse(text, "test.toml") {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_example_parses_and_places_every_model() {
        let loaded = LoadedConfig::parse(EXAMPLE, "gateway/examples/gateway.toml").expect("the example is valid");
        assert_eq!(loaded.file.listen, Some("0.0.0.0:8443".parse().expect("addr")));
        let plan = loaded.spin.expect("[spin]");
        assert_eq!(plan.models.len(), 2);
        assert_eq!(plan.cold_start_timeout, Duration::from_secs(600));
        assert_eq!(plan.limits.budget.map(|b| b.gpu_hours), Some(500));
        let placed: Vec<(String, String, u8)> = plan
            .placements()
            .into_iter()
            .map(|p| {
                let pl = p.placement.expect("placed");
                (p.model, pl.shape_name, pl.tensor_parallel)
            })
            .collect();
        // The A100s are the least capable GPUs that hold both (the 70B one with TP 4).
        assert_eq!(
            placed,
            [("llama-3.1-8b".into(), "gpu-a100".into(), 1), ("llama-3.1-70b".into(), "gpu-a100".into(), 4)]
        );
        let text = plan.describe();
        assert!(text.contains("llama-3.1-70b") && text.contains("gpu-a100: 1 node(s) x TP 4"), "{text}");
        assert_eq!(plan.model("llama-3.1-8b").map(|m| m.policy.shapes.len()), Some(3));
        let low = plan.partition("gpu-a100-low").expect("the QoS alternative");
        assert_eq!((low.slurm_partition.as_str(), low.qos.as_deref()), ("gpu-a100", Some("low")));
        assert_eq!(plan.start_estimate_timeout, Duration::from_secs(10));
    }

    #[test]
    fn a_minimal_file_gets_the_defaults() {
        let plan = LoadedConfig::parse(&minimal(), "t").expect("valid").spin.expect("[spin]");
        let m = &plan.models[0];
        assert_eq!(
            (m.policy.walltime, m.drain_window, m.policy.max_replicas, plan.interval, plan.cold_start_capacity),
            (Duration::from_secs(4 * 3600), Duration::from_secs(900), 4, Duration::from_secs(5), 64)
        );
        assert_eq!(plan.backend.to_string(), "sbatch (sbatch)");
        assert!(LoadedConfig::parse("", "t").expect("empty is valid").spin.is_none());
    }

    #[test]
    fn every_refusal_names_the_key_and_the_reason() {
        let m = minimal();
        let cases: Vec<(String, &str, &str)> = vec![
            (m.replace("nodes = 2", "nodes = 2\nflavour = 1"), "flavour", "unknown field"),
            (format!("listen = 5\n{m}"), "listen", "invalid type"),
            (m.replace("shape = \"a100-80x4\"", "shape = \"tpu-v5\""), "spin.partition[gpu].shape", "unknown hardware profile"),
            (m.replace("shape = \"a100-80x4\"", "gpu = \"b300\"\ngpus = 8"), "spin.partition[gpu].gpu", "unknown GPU"),
            (m.replace("nodes = 2", "nodes = 0"), "spin.partition[gpu].nodes", "at least 1"),
            (m.replace("nodes = 2", "nodes = 2\nqos = \"\""), "spin.partition[gpu].qos", "must be a Slurm name"),
            (m.replace("nodes = 2", "nodes = 2\nslurm_partition = \"a b\""), "spin.partition[gpu].slurm_partition", "must be a Slurm name"),
            (format!("{m}min_replicas = 3\nmax_replicas = 2\n"), "spin.model[small].min_replicas", "above max_replicas 2"),
            (format!("{m}walltime = \"0s\"\n"), "spin.model[small].walltime", "longer than zero"),
            (format!("{m}cooldown = \"soon\"\n"), "cooldown", "not a duration"),
            (format!("{m}drain_window = \"5h\"\n"), "spin.model[small].drain_window", "not shorter than the walltime"),
            (m.replace("params = \"8B\"", "params = \"400B\""), "spin.model[small]", "cannot be placed on any partition"),
            (m.replace("params = \"8B\"", "params = \"lots\""), "spin.model[small].params", "not a parameter count"),
            (m.replace("quantization = \"bf16\"", "quantization = \"q9\""), "spin.model[small].quantization", "unknown quantization"),
            (m.replace("quantization = \"bf16\"", "quantization = \"gguf\""), "spin.model[small].weights", "cannot be estimated"),
            (m.replace("serve --port {port}", "serve"), "spin.model[small].engine", "must contain {port}"),
            (m.replace("serve --port {port}", "serve --port {port} {flavour}"), "spin.model[small].engine", "unknown placeholder {flavour}"),
            (format!("{m}walltime = \"16m\"\n"), "spin.model[small].drain_window", "not shorter than the walltime"),
            (
                m.replace("kind = \"sbatch\"", "kind = \"slurmrest\"\nurl = \"http://r:6820\"\nuser = \"u\"\ntoken_file = \"/t\"\nversion = \"v9\""),
                "spin.backend.version",
                "not a slurmrestd version",
            ),
            (format!("{m}partitions = [\"gpu\", \"h100\"]\n"), "spin.model[small].partitions", "unknown partition 'h100'"),
            (format!("{m}scale_down_percent = 0\n"), "spin.model[small].scale_down_percent", "outside 1..=100"),
            (m.replace("kind = \"sbatch\"", "kind = \"pbs\""), "kind", "unknown variant"),
            (m.replace("kind = \"sbatch\"", "kind = \"slurmrest\""), "spin.backend.url", "required for kind = \"slurmrest\""),
            (
                m.replace("kind = \"sbatch\"", "kind = \"slurmrest\"\nurl = \"http://r:6820\"\nuser = \"u\""),
                "spin.backend.token_file",
                "required",
            ),
            (m.replace("kind = \"sbatch\"", "kind = \"sbatch\"\nurl = \"http://r\""), "spin.backend.url", "only applies to kind = \"slurmrest\""),
            (m.replace("[spin.backend]\nkind = \"sbatch\"\n", ""), "spin.backend", "missing"),
            (m.replace("join = [\"gw:7000\"]", "join = []"), "spin.job.join", "must list"),
            (m.replace("[spin]\n", "[spin]\ninterval = \"0s\"\n"), "spin.interval", "longer than zero"),
            (m.replace("[spin]\n", "[spin]\nmax_concurrent_jobs = 0\n"), "spin.max_concurrent_jobs", "at least 1"),
            (m.replace("[spin]\n", "[spin]\nbudget = { gpu_hours = 10, window = \"0s\" }\n"), "spin.budget.window", "longer than zero"),
            (format!("{m}[spin.cold_start]\ncapacity = 0\n"), "spin.cold_start.capacity", "at least 1"),
            (format!("{m}[[spin.model]]\nname = \"small\"\nparams = \"1B\"\nquantization = \"bf16\"\nengine = \"x {{port}}\"\n"), "spin.model[small]", "defined twice"),
        ];
        for (text, key, reason) in cases {
            let e = refused(&text);
            assert!(e.contains(key) && e.contains(reason), "wanted '{key}' and '{reason}' in: {e}");
        }
    }
}
