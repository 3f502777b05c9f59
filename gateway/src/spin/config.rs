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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use tela_batch::firecrest::ClientSecret;
use tela_core::hardware::GPU_CATALOG;
use tela_core::placement::{place, KvHeadroom, ModelSpec, NoPlacement, NodeShape, Placement, Variant};
use tela_core::spin::{GpuHourBudget, ModelPolicy, SpinConfig, Spinner};
use tela_core::{FabricId, GpuModel, Hardware, Quantization};

/// Why a configuration file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the configuration file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not have the expected shape (an unknown key, a wrong
    /// type); the message quotes the line.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message, with the line and key.
        message: String,
    },
    /// A value is out of range or inconsistent with another one.
    #[error("{key}: {reason}")]
    Invalid {
        /// The key at fault, as a TOML path (`spin.model[llama].min_replicas`).
        key: String,
        /// Why, and what to write instead.
        reason: String,
    },
}

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key: key.into(), reason: reason.into() }
}

/// A duration written the human way: `"90s"`, `"15m"`, `"4h"`, `"1h 30m"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Dur, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map(Dur).map_err(|e| {
            serde::de::Error::custom(format!("'{text}' is not a duration ({e}); write e.g. \"90s\", \"15m\" or \"4h\""))
        })
    }
}

/// A size written with a unit: `"512MiB"`, `"4GiB"`, `"1.5GiB"` (MB and GB are read as MiB and GiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mib(pub u64);

impl<'de> Deserialize<'de> for Mib {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Mib, D::Error> {
        let text = String::deserialize(d)?;
        parse_mib(&text).map(Mib).ok_or_else(|| {
            serde::de::Error::custom(format!("'{text}' is not a size; write e.g. \"512MiB\" or \"4GiB\""))
        })
    }
}

fn parse_mib(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = t.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match unit.trim().to_ascii_lowercase().as_str() {
        "mib" | "mb" | "m" => 1.0,
        "gib" | "gb" | "g" => 1024.0,
        "tib" | "tb" | "t" => 1024.0 * 1024.0,
        _ => return None,
    };
    let mib = number * factor;
    (mib.is_finite() && mib >= 0.0).then(|| mib.ceil() as u64)
}

/// A parameter count: `"8B"`, `"70B"`, `"135M"`, `"0.5B"`; in millions.
fn parse_params(text: &str) -> Option<u64> {
    let t = text.trim();
    let (number, factor) = match t.chars().last()?.to_ascii_uppercase() {
        'B' => (&t[..t.len() - 1], 1000.0),
        'M' => (&t[..t.len() - 1], 1.0),
        _ => return None,
    };
    let millions = number.trim().parse::<f64>().ok()? * factor;
    (millions.is_finite() && millions >= 1.0).then(|| millions.round() as u64)
}

const QUANTIZATIONS: &[(&str, Quantization)] = &[
    ("fp32", Quantization::Fp32),
    ("bf16", Quantization::Bf16),
    ("fp16", Quantization::Fp16),
    ("fp8", Quantization::Fp8),
    ("int8", Quantization::Int8),
    ("int4", Quantization::Int4),
    ("awq", Quantization::Awq),
    ("gptq", Quantization::Gptq),
    ("gguf", Quantization::Gguf),
];

fn parse_quantization(key: &str, text: &str) -> Result<Quantization, ConfigError> {
    let t = text.trim().to_ascii_lowercase();
    QUANTIZATIONS.iter().find(|(name, _)| *name == t).map(|(_, q)| *q).ok_or_else(|| {
        let names: Vec<&str> = QUANTIZATIONS.iter().map(|(n, _)| *n).collect();
        invalid(key, format!("unknown quantization '{text}'; use one of {}", names.join(", ")))
    })
}

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

/// `[spin.batch]`: short, backfill-friendly jobs for the batch API's backlog.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSpinSection {
    /// Pending batch requests of a model that justify one replica.
    pub backlog_per_replica: u32,
    /// Most replicas the backlog of one model may want (default 1; `max_replicas` still caps).
    pub max_replicas: Option<u32>,
    /// Time limit of a job started for the backlog only (default 1 h).
    pub job_walltime: Option<Dur>,
    /// The least time limit Slurm may shrink such a job to, to start it in a backfill window
    /// (`--time-min`; default: half the walltime).
    pub job_time_min: Option<Dur>,
}

/// `[spin.batch]`, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchSpin {
    /// Pending batch requests that justify one replica.
    pub backlog_per_replica: u32,
    /// Most replicas one model's backlog wants.
    pub max_replicas: u32,
    /// Time limit of a backlog job.
    pub job_walltime: Duration,
    /// Its least time limit (`--time-min`).
    pub job_time_min: Duration,
}

fn resolve_batch_spin(b: &BatchSpinSection) -> Result<BatchSpin, ConfigError> {
    if b.backlog_per_replica == 0 {
        return Err(invalid("spin.batch.backlog_per_replica", "must be at least 1 (leave out [spin.batch] for none)"));
    }
    let max_replicas = b.max_replicas.unwrap_or(1);
    if max_replicas == 0 {
        return Err(invalid("spin.batch.max_replicas", "must be at least 1 (leave out [spin.batch] for none)"));
    }
    let job_walltime = positive("spin.batch.job_walltime", b.job_walltime, Duration::from_secs(3600))?;
    if job_walltime < Duration::from_secs(60) {
        return Err(invalid("spin.batch.job_walltime", "must be at least one minute, Slurm's granularity"));
    }
    let job_time_min = positive("spin.batch.job_time_min", b.job_time_min, job_walltime / 2)?;
    if job_time_min > job_walltime {
        return Err(invalid("spin.batch.job_time_min", "must not be longer than spin.batch.job_walltime"));
    }
    Ok(BatchSpin { backlog_per_replica: b.backlog_per_replica, max_replicas, job_walltime, job_time_min })
}

/// `[spin.budget]` / `budget = { ... }`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSection {
    /// GPU-hours per window.
    pub gpu_hours: u64,
    /// The sliding window (e.g. `"24h"`).
    pub window: Dur,
}

/// Which front door to the batch system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// `sbatch`, `squeue` and `scancel` on this host.
    Sbatch,
    /// Slurm's REST daemon.
    Slurmrest,
    /// CSCS's FirecREST v2, with OIDC client credentials.
    Firecrest,
}

/// `[spin.backend]` as written; which keys apply depends on `kind`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSection {
    /// `"sbatch"`, `"slurmrest"` or `"firecrest"`.
    pub kind: BackendKind,
    /// sbatch: the `sbatch` program (default: looked up in `PATH`).
    pub sbatch: Option<PathBuf>,
    /// sbatch: the `squeue` program.
    pub squeue: Option<PathBuf>,
    /// sbatch: the `scancel` program.
    pub scancel: Option<PathBuf>,
    /// sbatch: arguments added to every `sbatch` call (e.g. `["--qos=serve"]`).
    pub sbatch_args: Option<Vec<String>>,
    /// sbatch: arguments added to every `squeue` and `scancel` call.
    pub query_args: Option<Vec<String>>,
    /// slurmrest, firecrest: the service's base URL (`http://slurm-rest:6820`, or `https://`).
    pub url: Option<String>,
    /// slurmrest, firecrest: a PEM file of CA certificates trusted for `https://` URLs besides
    /// the system's (a site's own CA).
    pub ca_cert: Option<PathBuf>,
    /// slurmrest: the Slurm user the token belongs to.
    pub user: Option<String>,
    /// slurmrest: a file holding the JWT (`scontrol token`), re-read on every call.
    pub token_file: Option<PathBuf>,
    /// slurmrest: the OpenAPI version (default `v0.0.38`).
    pub version: Option<String>,
    /// firecrest: the system (cluster) name in FirecREST's paths.
    pub system: Option<String>,
    /// firecrest: the OIDC provider's token endpoint (client-credentials grant).
    pub token_url: Option<String>,
    /// firecrest: the OIDC client id.
    pub client_id: Option<String>,
    /// firecrest: a file whose first line is the client secret (re-read on every token request).
    pub client_secret_file: Option<PathBuf>,
    /// firecrest: an environment variable holding the client secret.
    pub client_secret_env: Option<String>,
    /// Longest one call to the batch system may take (default 30 s).
    pub timeout: Option<Dur>,
}

/// `[spin.job]`: what every job runs and how its node joins.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSection {
    /// The `tela` binary as the compute nodes see it.
    pub tela: String,
    /// The gateways or anchors the node dials.
    pub join: Vec<String>,
    /// A file holding the join secret, readable on the compute nodes (never put into the script).
    pub join_secret_file: String,
    /// Transport for the node's dials: `auto`, `quic` or `tcp` (default `auto`).
    pub transport: Option<String>,
    /// Working directory of the job (default `/tmp`); its output file goes there.
    pub working_dir: Option<String>,
    /// Account to charge, unless the partition names its own.
    pub account: Option<String>,
    /// CPUs per task, unless the partition says (default 4).
    pub cpus_per_task: Option<u32>,
    /// Lines run before the node starts (`module load cuda`, `source venv/bin/activate`).
    pub setup: Option<Vec<String>>,
    /// Extra environment of the job's processes.
    pub env: Option<BTreeMap<String, String>>,
}

/// `[spin.cold_start]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColdStartSection {
    /// Requests that may wait per model (default 64).
    pub capacity: Option<usize>,
    /// The longest a request waits for a replica (default 10 min).
    pub timeout: Option<Dur>,
}

/// `[[spin.partition]]`: one kind of node jobs may ask for.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionSection {
    /// The Slurm partition.
    pub name: String,
    /// A hardware profile of the core catalog: `a100-80x4`, `h100x8`, `rtx4090`, `cpu`.
    pub shape: Option<String>,
    /// Instead of `shape`: the GPU model (`a100-80`) ...
    pub gpu: Option<String>,
    /// ... and how many a node has.
    pub gpus: Option<u8>,
    /// The most nodes of this partition the gateway holds at once.
    pub nodes: u32,
    /// The fabric its nodes share (pipelines across nodes need one; 0 or absent: none).
    pub fabric: Option<u32>,
    /// Account to charge for jobs here.
    pub account: Option<String>,
    /// Quality of service for jobs here.
    pub qos: Option<String>,
    /// The Slurm partition when it is not `name`: several entries may name one Slurm partition
    /// with different accounts or QoS, as alternatives the queue chooses between.
    pub slurm_partition: Option<String>,
    /// CPUs per task for jobs here.
    pub cpus_per_task: Option<u32>,
}

/// `quantized = [{ label = "awq", quantization = "awq" }]`: a checkpoint offered as a fallback.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantSection {
    /// The label the engine command sees as `{variant}`.
    pub label: String,
    /// Its weight format.
    pub quantization: String,
    /// Its size on disk, when it cannot be estimated from the format (`"38GiB"`).
    pub weights: Option<Mib>,
}

/// `[[spin.model]]`: one model that may spin.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// The name clients put in `model`.
    pub name: String,
    /// Parameters: `"8B"`, `"135M"`.
    pub params: String,
    /// The native weight format (`bf16`, `fp16`, `awq`, ...).
    pub quantization: String,
    /// The native checkpoint's size on disk, when the format gives no estimate (GGUF).
    pub weights: Option<Mib>,
    /// GPU memory kept for the KV cache beyond the weights (default 0).
    pub kv_headroom: Option<Mib>,
    /// Quantized checkpoints to fall back on, most preferred first.
    #[serde(default)]
    pub quantized: Vec<VariantSection>,
    /// The engine's command line; `{model}`, `{port}`, `{tp}`, `{pp}`, `{gpus}` and `{variant}`
    /// are filled in. It must listen on 127.0.0.1:`{port}`.
    pub engine: String,
    /// Partitions it may use, most preferred first (default: any).
    #[serde(default)]
    pub partitions: Vec<String>,
    /// Replicas kept without demand (default 0).
    pub min_replicas: Option<u32>,
    /// Most replicas at once (default 4).
    pub max_replicas: Option<u32>,
    /// Requests one replica carries before another is wanted (default 16).
    pub concurrency_per_replica: Option<u32>,
    /// Arrivals per minute one replica absorbs, if the rate should drive scaling.
    pub arrivals_per_replica: Option<u32>,
    /// p95 time to first byte above which one more replica is wanted.
    pub latency_target: Option<Dur>,
    /// Time limit of each job (default 4 h).
    pub walltime: Option<Dur>,
    /// Before the time limit, the node is told to drain this long ahead (default 15 min).
    pub drain_window: Option<Dur>,
    /// How long demand must stay low before replicas are released (default 15 min).
    pub scale_down_after: Option<Dur>,
    /// No scale-up for this long after any action (default 2 min).
    pub cooldown: Option<Dur>,
    /// Load, in percent of the thresholds, below which a replica is not needed (default 50).
    pub scale_down_percent: Option<u32>,
}

/// The batch system's front door, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendPlan {
    /// The Slurm commands.
    Sbatch {
        /// `sbatch`.
        sbatch: PathBuf,
        /// `squeue`.
        squeue: PathBuf,
        /// `scancel`.
        scancel: PathBuf,
        /// Added to every `sbatch`.
        sbatch_args: Vec<String>,
        /// Added to every `squeue` and `scancel`.
        query_args: Vec<String>,
        /// Per call.
        timeout: Duration,
    },
    /// slurmrestd.
    Slurmrest {
        /// Base URL.
        url: String,
        /// Slurm user.
        user: String,
        /// JWT file.
        token_file: PathBuf,
        /// OpenAPI version.
        version: String,
        /// Per call.
        timeout: Duration,
        /// Extra CA certificates for `https://`.
        ca_cert: Option<PathBuf>,
    },
    /// FirecREST v2.
    Firecrest {
        /// Base URL.
        url: String,
        /// System name.
        system: String,
        /// Token endpoint.
        token_url: String,
        /// OIDC client id.
        client_id: String,
        /// Where the client secret is.
        client_secret: ClientSecret,
        /// Per call.
        timeout: Duration,
        /// Extra CA certificates for `https://`.
        ca_cert: Option<PathBuf>,
    },
}

impl fmt::Display for BackendPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendPlan::Sbatch { sbatch, .. } => write!(f, "sbatch ({})", sbatch.display()),
            BackendPlan::Slurmrest { url, user, version, .. } => write!(f, "slurmrestd {version} at {url} as {user}"),
            BackendPlan::Firecrest { url, system, client_id, .. } => {
                write!(f, "FirecREST v2 at {url}, system {system}, as client {client_id}")
            }
        }
    }
}

/// What every job runs, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSettings {
    /// The `tela` binary on the compute nodes.
    pub tela: String,
    /// Where nodes dial.
    pub join: Vec<String>,
    /// The join secret's file on the compute nodes.
    pub join_secret_file: String,
    /// `auto`, `quic` or `tcp`.
    pub transport: String,
    /// The job's working directory.
    pub working_dir: String,
    /// Default account.
    pub account: Option<String>,
    /// Default CPUs per task.
    pub cpus_per_task: u32,
    /// Lines run before the node starts.
    pub setup: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
}

/// A partition, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// The Slurm partition.
    pub name: String,
    /// The profile its nodes are described by (`a100-80x4`), for the node's hardware fallback.
    pub profile: String,
    /// What one node offers.
    pub hardware: Hardware,
    /// The most nodes the gateway holds at once.
    pub nodes: u32,
    /// Account for jobs here.
    pub account: Option<String>,
    /// Quality of service for jobs here.
    pub qos: Option<String>,
    /// The Slurm partition jobs ask for (`name` unless `slurm_partition` says otherwise).
    pub slurm_partition: String,
    /// CPUs per task for jobs here.
    pub cpus_per_task: Option<u32>,
}

impl Partition {
    /// The partition as a placement shape with `free` free nodes.
    pub fn shape(&self, free: u32) -> NodeShape {
        NodeShape::new(self.name.clone(), self.hardware.clone(), free)
    }
}

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
        let max_concurrent_jobs = section.max_concurrent_jobs.unwrap_or(8);
        if max_concurrent_jobs == 0 {
            return Err(invalid("spin.max_concurrent_jobs", "must be at least 1"));
        }
        let budget = match &section.budget {
            None => None,
            Some(b) => {
                if b.window.0.is_zero() {
                    return Err(invalid("spin.budget.window", "must be longer than zero (e.g. \"24h\")"));
                }
                if b.gpu_hours == 0 {
                    return Err(invalid(
                        "spin.budget.gpu_hours",
                        "must be at least 1 (leave out [spin.budget] for none)",
                    ));
                }
                Some(GpuHourBudget { gpu_hours: b.gpu_hours, window: b.window.0 })
            }
        };
        let backend = resolve_backend(section.backend.as_ref())?;
        let job = resolve_job(section.job.as_ref())?;
        let (cold_start_capacity, cold_start_timeout) = match &section.cold_start {
            None => (64, Duration::from_secs(600)),
            Some(c) => {
                let capacity = c.capacity.unwrap_or(64);
                if capacity == 0 {
                    return Err(invalid("spin.cold_start.capacity", "must be at least 1"));
                }
                (capacity, positive("spin.cold_start.timeout", c.timeout, Duration::from_secs(600))?)
            }
        };
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
        let limits = SpinConfig { max_concurrent_jobs, budget, first_job_id: 1 };
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
            cold_start_capacity,
            cold_start_timeout,
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

/// [`place`] over the shapes a model may use (`allowed`, in order; all when empty), with the
/// placement's index pointing into `shapes`.
pub fn place_on(spec: &ModelSpec, allowed: &[String], shapes: &[NodeShape]) -> Result<Placement, NoPlacement> {
    let indices: Vec<usize> = if allowed.is_empty() {
        (0..shapes.len()).collect()
    } else {
        allowed.iter().filter_map(|n| shapes.iter().position(|s| s.name == *n)).collect()
    };
    let candidates: Vec<NodeShape> = indices.iter().map(|&i| shapes[i].clone()).collect();
    place(spec, &candidates).map(|p| Placement { shape: indices[p.shape], ..p })
}

fn positive(key: &str, value: Option<Dur>, default: Duration) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(Dur(d)) if d.is_zero() => Err(invalid(key, "must be longer than zero")),
        Some(Dur(d)) => Ok(d),
    }
}

fn resolve_backend(section: Option<&BackendSection>) -> Result<BackendPlan, ConfigError> {
    let Some(b) = section else {
        return Err(invalid(
            "spin.backend",
            "missing: add [spin.backend] with kind = \"sbatch\", \"slurmrest\" or \"firecrest\"",
        ));
    };
    let timeout = positive("spin.backend.timeout", b.timeout, Duration::from_secs(30))?;
    let reject = |present: bool, key: &str, kind: &str| {
        if present {
            Err(invalid(format!("spin.backend.{key}"), format!("only applies to kind = \"{kind}\"")))
        } else {
            Ok(())
        }
    };
    let not_firecrest = || -> Result<(), ConfigError> {
        reject(b.system.is_some(), "system", "firecrest")?;
        reject(b.token_url.is_some(), "token_url", "firecrest")?;
        reject(b.client_id.is_some(), "client_id", "firecrest")?;
        reject(b.client_secret_file.is_some(), "client_secret_file", "firecrest")?;
        reject(b.client_secret_env.is_some(), "client_secret_env", "firecrest")
    };
    match b.kind {
        BackendKind::Sbatch => {
            not_firecrest()?;
            reject(b.url.is_some(), "url", "slurmrest")?;
            reject(b.user.is_some(), "user", "slurmrest")?;
            reject(b.token_file.is_some(), "token_file", "slurmrest")?;
            reject(b.version.is_some(), "version", "slurmrest")?;
            reject(b.ca_cert.is_some(), "ca_cert", "slurmrest\" or \"firecrest")?;
            Ok(BackendPlan::Sbatch {
                sbatch: b.sbatch.clone().unwrap_or_else(|| "sbatch".into()),
                squeue: b.squeue.clone().unwrap_or_else(|| "squeue".into()),
                scancel: b.scancel.clone().unwrap_or_else(|| "scancel".into()),
                sbatch_args: b.sbatch_args.clone().unwrap_or_default(),
                query_args: b.query_args.clone().unwrap_or_default(),
                timeout,
            })
        }
        BackendKind::Slurmrest => {
            not_firecrest()?;
            reject(b.sbatch.is_some(), "sbatch", "sbatch")?;
            reject(b.squeue.is_some(), "squeue", "sbatch")?;
            reject(b.scancel.is_some(), "scancel", "sbatch")?;
            reject(b.sbatch_args.is_some(), "sbatch_args", "sbatch")?;
            reject(b.query_args.is_some(), "query_args", "sbatch")?;
            let required = |v: &Option<String>, key: &str, example: &str| {
                v.clone().filter(|s| !s.trim().is_empty()).ok_or_else(|| {
                    invalid(
                        format!("spin.backend.{key}"),
                        format!("required for kind = \"slurmrest\" (e.g. {example})"),
                    )
                })
            };
            let url = web_url(required(&b.url, "url", "\"http://slurm-rest:6820\"")?, "url")?;
            let ca_cert = ca_cert_for(b.ca_cert.as_ref(), &[&url])?;
            let user = required(&b.user, "user", "\"tela\"")?;
            let token_file = b.token_file.clone().ok_or_else(|| {
                invalid(
                    "spin.backend.token_file",
                    "required for kind = \"slurmrest\": a file holding the JWT from `scontrol token`",
                )
            })?;
            let version = b.version.clone().unwrap_or_else(|| "v0.0.38".into());
            if let Err(e) = version.parse::<tela_batch::slurmrest::RestVersion>() {
                return Err(invalid("spin.backend.version", e.to_string()));
            }
            Ok(BackendPlan::Slurmrest { url, user, token_file, version, timeout, ca_cert })
        }
        BackendKind::Firecrest => {
            for (present, key) in [
                (b.sbatch.is_some(), "sbatch"),
                (b.squeue.is_some(), "squeue"),
                (b.scancel.is_some(), "scancel"),
                (b.sbatch_args.is_some(), "sbatch_args"),
                (b.query_args.is_some(), "query_args"),
            ] {
                reject(present, key, "sbatch")?;
            }
            for (present, key) in
                [(b.user.is_some(), "user"), (b.token_file.is_some(), "token_file"), (b.version.is_some(), "version")]
            {
                reject(present, key, "slurmrest")?;
            }
            let required = |v: &Option<String>, key: &str, example: &str| {
                v.clone().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).ok_or_else(|| {
                    invalid(
                        format!("spin.backend.{key}"),
                        format!("required for kind = \"firecrest\" (e.g. {example})"),
                    )
                })
            };
            let url = web_url(required(&b.url, "url", "\"https://api.example.org/v2\"")?, "url")?;
            let system = required(&b.system, "system", "\"daint\"")?;
            if system.contains(['/', '?', '#', ' ']) {
                return Err(invalid("spin.backend.system", format!("'{system}' must be one path segment")));
            }
            let token_url = web_url(
                required(&b.token_url, "token_url", "\"https://idp/realms/hpc/protocol/openid-connect/token\"")?,
                "token_url",
            )?;
            let ca_cert = ca_cert_for(b.ca_cert.as_ref(), &[&url, &token_url])?;
            let client_id = required(&b.client_id, "client_id", "\"tela-spinner\"")?;
            let client_secret = match (&b.client_secret_file, &b.client_secret_env) {
                (Some(file), None) => ClientSecret::File(file.clone()),
                (None, Some(var)) if !var.trim().is_empty() => ClientSecret::Env(var.trim().to_string()),
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        "spin.backend.client_secret_env",
                        "give the secret one way: client_secret_file or client_secret_env, not both",
                    ))
                }
                _ => {
                    return Err(invalid(
                        "spin.backend.client_secret_file",
                        "required for kind = \"firecrest\": a file holding the OIDC client secret (or client_secret_env, a variable holding it)",
                    ))
                }
            };
            Ok(BackendPlan::Firecrest { url, system, token_url, client_id, client_secret, timeout, ca_cert })
        }
    }
}

/// A REST backend's URL (`key`), `http://` or `https://`, without a trailing `/`.
fn web_url(url: String, key: &str) -> Result<String, ConfigError> {
    let url = url.trim().trim_end_matches('/').to_string();
    let has_host = |rest: &str| !rest.is_empty() && !rest.starts_with(['/', ':']);
    match url.strip_prefix("https://").or_else(|| url.strip_prefix("http://")) {
        Some(rest) if has_host(rest) => Ok(url),
        _ => Err(invalid(
            format!("spin.backend.{key}"),
            format!("'{url}' is not an http:// or https:// URL (e.g. https://slurm-rest.example.org:6820)"),
        )),
    }
}

/// `ca_cert`, which only means something when one of `urls` is `https://`.
fn ca_cert_for(ca_cert: Option<&PathBuf>, urls: &[&str]) -> Result<Option<PathBuf>, ConfigError> {
    match ca_cert {
        Some(path) if !urls.iter().any(|u| u.starts_with("https://")) => Err(invalid(
            "spin.backend.ca_cert",
            format!("{} is given but no URL is https://: drop it, or name the service's https:// URL", path.display()),
        )),
        _ => Ok(ca_cert.cloned()),
    }
}

fn resolve_job(section: Option<&JobSection>) -> Result<JobSettings, ConfigError> {
    let Some(j) = section else {
        return Err(invalid(
            "spin.job",
            "missing: add [spin.job] with tela (the binary on compute nodes), join and join_secret_file",
        ));
    };
    if j.tela.trim().is_empty() {
        return Err(invalid("spin.job.tela", "must name the tela binary as the compute nodes see it"));
    }
    if j.join.is_empty() || j.join.iter().any(|a| a.trim().is_empty()) {
        return Err(invalid(
            "spin.job.join",
            "must list the address(es) nodes dial, e.g. [\"gateway.example.org:7000\"]",
        ));
    }
    if j.join_secret_file.trim().is_empty() {
        return Err(invalid(
            "spin.job.join_secret_file",
            "must name a file holding the join secret on the compute nodes",
        ));
    }
    let transport = j.transport.clone().unwrap_or_else(|| "auto".into());
    if !matches!(transport.as_str(), "auto" | "quic" | "tcp") {
        return Err(invalid("spin.job.transport", format!("'{transport}': use auto, quic or tcp")));
    }
    if j.cpus_per_task == Some(0) {
        return Err(invalid("spin.job.cpus_per_task", "must be at least 1"));
    }
    let mut env = Vec::new();
    for (name, value) in j.env.clone().unwrap_or_default() {
        if name.is_empty()
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            || name.starts_with(|c: char| c.is_ascii_digit())
        {
            return Err(invalid(format!("spin.job.env.{name}"), "is not a valid environment variable name"));
        }
        env.push((name, value));
    }
    Ok(JobSettings {
        tela: j.tela.clone(),
        join: j.join.clone(),
        join_secret_file: j.join_secret_file.clone(),
        transport,
        working_dir: j.working_dir.clone().unwrap_or_else(|| "/tmp".into()),
        account: j.account.clone(),
        cpus_per_task: j.cpus_per_task.unwrap_or(4),
        setup: j.setup.clone().unwrap_or_default(),
        env,
    })
}

fn resolve_partition(p: &PartitionSection) -> Result<Partition, ConfigError> {
    let key = |field: &str| format!("spin.partition[{}].{field}", p.name);
    if p.name.trim().is_empty() {
        return Err(invalid("spin.partition.name", "must not be empty"));
    }
    let (profile, mut hardware) = match (&p.shape, &p.gpu, p.gpus) {
        (Some(shape), None, None) => {
            let hw = Hardware::from_profile(shape).map_err(|e| invalid(key("shape"), e.to_string()))?;
            (shape.trim().to_ascii_lowercase(), hw)
        }
        (None, Some(gpu), count) => {
            let count = count.unwrap_or(1);
            if count == 0 {
                return Err(invalid(key("gpus"), "must be at least 1 (use shape = \"cpu\" for nodes without GPUs)"));
            }
            let name = gpu.trim().to_ascii_lowercase();
            if !GPU_CATALOG.iter().any(|s| s.name == name) {
                let names: Vec<&str> = GPU_CATALOG.iter().map(|s| s.name).collect();
                return Err(invalid(key("gpu"), format!("unknown GPU '{gpu}'; use one of {}", names.join(", "))));
            }
            let profile = format!("{name}x{count}");
            let hw = Hardware::from_profile(&profile).map_err(|e| invalid(key("gpu"), e.to_string()))?;
            (profile, hw)
        }
        (None, None, Some(_)) => return Err(invalid(key("gpus"), "needs gpu = \"<model>\" beside it")),
        (None, None, None) => {
            return Err(invalid(
                key("shape"),
                "missing: give shape = \"<profile>\" (e.g. \"a100-80x4\", \"cpu\") or gpu and gpus",
            ))
        }
        (Some(_), _, _) => return Err(invalid(key("shape"), "give either shape or gpu/gpus, not both")),
    };
    if p.nodes == 0 {
        return Err(invalid(key("nodes"), "must be at least 1"));
    }
    if p.cpus_per_task == Some(0) {
        return Err(invalid(key("cpus_per_task"), "must be at least 1"));
    }
    for (field, value) in [("qos", &p.qos), ("slurm_partition", &p.slurm_partition)] {
        if value.as_ref().is_some_and(|v| v.trim().is_empty() || v.contains(char::is_whitespace)) {
            return Err(invalid(
                key(field),
                "must be a Slurm name (not empty, no spaces); leave it out for the default",
            ));
        }
    }
    hardware.fabric = FabricId(p.fabric.unwrap_or(0));
    Ok(Partition {
        name: p.name.clone(),
        profile,
        hardware,
        nodes: p.nodes,
        account: p.account.clone(),
        qos: p.qos.clone(),
        slurm_partition: p.slurm_partition.clone().unwrap_or_else(|| p.name.clone()),
        cpus_per_task: p.cpus_per_task,
    })
}

fn resolve_model(m: &ModelSection, partitions: &[Partition]) -> Result<SpinModel, ConfigError> {
    let key = |field: &str| format!("spin.model[{}].{field}", m.name);
    if m.name.trim().is_empty() {
        return Err(invalid("spin.model.name", "must not be empty"));
    }
    let params = parse_params(&m.params).ok_or_else(|| {
        invalid(key("params"), format!("'{}' is not a parameter count; write e.g. \"8B\" or \"135M\"", m.params))
    })?;
    let quant = parse_quantization(&key("quantization"), &m.quantization)?;
    let mut spec =
        ModelSpec::new(m.name.clone(), params, quant).with_kv(KvHeadroom::Mib(m.kv_headroom.map_or(0, |Mib(v)| v)));
    spec.weights.weights_mib = m.weights.map(|Mib(v)| v);
    let mut labels = BTreeSet::from([spec.weights.label.clone()]);
    for (i, v) in m.quantized.iter().enumerate() {
        let vkey = format!("spin.model[{}].quantized[{i}]", m.name);
        if v.label.trim().is_empty() {
            return Err(invalid(format!("{vkey}.label"), "must not be empty"));
        }
        if !labels.insert(v.label.clone()) {
            return Err(invalid(format!("{vkey}.label"), format!("'{}' is used twice", v.label)));
        }
        let q = parse_quantization(&format!("{vkey}.quantization"), &v.quantization)?;
        spec =
            spec.with_quantized(Variant { label: v.label.clone(), quant: q, weights_mib: v.weights.map(|Mib(x)| x) });
    }
    for variant in spec.variants() {
        if spec.need_mib(variant).is_none() {
            let which = if variant == &spec.weights { key("weights") } else { key("quantized") };
            return Err(invalid(
                which,
                format!(
                    "the size of the '{}' weights cannot be estimated from the format; give weights = \"<size>GiB\"",
                    variant.label
                ),
            ));
        }
    }
    if m.engine.trim().is_empty() {
        return Err(invalid(key("engine"), "must be the engine's command line"));
    }
    if !m.engine.contains("{port}") {
        return Err(invalid(
            key("engine"),
            "must contain {port}: the engine listens on 127.0.0.1:{port}, where the node probes it",
        ));
    }
    for name in &m.partitions {
        if !partitions.iter().any(|p| p.name == *name) {
            let known: Vec<&str> = partitions.iter().map(|p| p.name.as_str()).collect();
            return Err(invalid(
                key("partitions"),
                format!("unknown partition '{name}' (known: {})", known.join(", ")),
            ));
        }
    }
    let mut policy = ModelPolicy::new(spec);
    policy.shapes = m.partitions.clone();
    policy.min_replicas = m.min_replicas.unwrap_or(policy.min_replicas);
    policy.max_replicas = m.max_replicas.unwrap_or(policy.max_replicas);
    if policy.max_replicas == 0 {
        return Err(invalid(key("max_replicas"), "must be at least 1"));
    }
    if policy.min_replicas > policy.max_replicas {
        return Err(invalid(
            key("min_replicas"),
            format!("{} is above max_replicas {}", policy.min_replicas, policy.max_replicas),
        ));
    }
    policy.concurrency_per_replica = m.concurrency_per_replica.unwrap_or(policy.concurrency_per_replica);
    if policy.concurrency_per_replica == 0 {
        return Err(invalid(key("concurrency_per_replica"), "must be at least 1"));
    }
    if m.arrivals_per_replica == Some(0) {
        return Err(invalid(key("arrivals_per_replica"), "must be at least 1 (leave it out to ignore the rate)"));
    }
    policy.arrivals_per_replica = m.arrivals_per_replica;
    if let Some(t) = m.latency_target {
        policy.latency_target = Some(positive(&key("latency_target"), Some(t), t.0)?);
    }
    policy.walltime = positive(&key("walltime"), m.walltime, policy.walltime)?;
    if policy.walltime < Duration::from_secs(60) {
        return Err(invalid(key("walltime"), "must be at least one minute, Slurm's granularity"));
    }
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
    policy.scale_down_after = positive(&key("scale_down_after"), m.scale_down_after, policy.scale_down_after)?;
    policy.cooldown = positive(&key("cooldown"), m.cooldown, policy.cooldown)?;
    policy.scale_down_percent = m.scale_down_percent.unwrap_or(policy.scale_down_percent);
    if !(1..=100).contains(&policy.scale_down_percent) {
        return Err(invalid(key("scale_down_percent"), format!("{} is outside 1..=100", policy.scale_down_percent)));
    }
    let shapes: Vec<NodeShape> = partitions.iter().map(|p| p.shape(p.nodes)).collect();
    let placement = match place_on(&policy.spec, &policy.shapes, &shapes) {
        Ok(p) => p,
        Err(reason) => {
            let over = if policy.shapes.is_empty() { "any partition" } else { "its partitions" };
            return Err(invalid(format!("spin.model[{}]", m.name), format!("cannot be placed on {over}: {reason}")));
        }
    };
    let model = SpinModel { policy, engine: m.engine.clone(), drain_window };
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
    if let Err(e) = super::job::render(&settings, partition, &model, &placement, model.policy.walltime, None) {
        return Err(invalid(key("engine"), e.to_string()));
    }
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LoadedConfig;

    const EXAMPLE: &str = include_str!("../../examples/gateway.toml");

    fn minimal() -> String {
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

    fn refused(text: &str) -> String {
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
    fn a_batch_section_gives_short_backfill_jobs_and_refuses_times_that_cannot_serve() {
        let plain = LoadedConfig::parse(&minimal(), "t").expect("valid").spin.expect("[spin]");
        assert_eq!((plain.batch, plain.models[0].policy.batch_walltime), (None, None), "off by default");
        let on = minimal().replace("[spin.job]", "[spin.batch]\nbacklog_per_replica = 100\n[spin.job]");
        let plan = LoadedConfig::parse(&on, "t").expect("valid").spin.expect("[spin]");
        let b = plan.batch.expect("[spin.batch]");
        assert_eq!(
            (b.backlog_per_replica, b.max_replicas, b.job_walltime, b.job_time_min),
            (100, 1, Duration::from_secs(3600), Duration::from_secs(1800))
        );
        assert_eq!(plan.models[0].policy.batch_walltime, Some(Duration::from_secs(3600)));
        let set = |extra: &str| minimal().replace("[spin.job]", &format!("[spin.batch]\n{extra}\n[spin.job]"));
        let short = set("backlog_per_replica = 5\nmax_replicas = 2\njob_walltime = \"30m\"\njob_time_min = \"10m\"");
        let short = short.replace("engine = ", "drain_window = \"5m\"\nengine = ");
        let b = LoadedConfig::parse(&short, "t").expect("valid").spin.expect("[spin]").batch.expect("batch");
        assert_eq!(
            (b.max_replicas, b.job_walltime, b.job_time_min),
            (2, Duration::from_secs(1800), Duration::from_secs(600))
        );
        for (extra, key, why) in [
            ("backlog_per_replica = 0", "spin.batch.backlog_per_replica", "at least 1"),
            ("backlog_per_replica = 1\nmax_replicas = 0", "spin.batch.max_replicas", "at least 1"),
            ("backlog_per_replica = 1\njob_walltime = \"30s\"", "spin.batch.job_walltime", "at least one minute"),
            ("backlog_per_replica = 1\njob_time_min = \"2h\"", "spin.batch.job_time_min", "not be longer"),
            ("backlog_per_replica = 1\njob_time_min = \"10m\"", "spin.batch.job_time_min", "could not serve"),
            ("backlog_per_replica = 1\nqueue = 3", "queue", "unknown field"),
        ] {
            let err = refused(&set(extra));
            assert!(err.contains(key) && err.contains(why), "{extra}: {err}");
        }
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

    #[test]
    fn sizes_and_parameter_counts_read_their_units() {
        assert_eq!(parse_mib("512MiB"), Some(512));
        assert_eq!(parse_mib("1.5GiB"), Some(1536));
        assert_eq!(parse_mib("2 GB"), Some(2048));
        assert_eq!(parse_mib("2"), None);
        assert_eq!(parse_params("8B"), Some(8000));
        assert_eq!(parse_params("0.5B"), Some(500));
        assert_eq!(parse_params("135M"), Some(135));
        assert_eq!(parse_params("8"), None);
    }
}

#[cfg(test)]
mod firecrest_tests {
    use super::*;
    use crate::config::LoadedConfig;

    fn with_backend(backend: &str) -> String {
        format!(
            "[spin]\n[spin.backend]\n{backend}\n[spin.job]\ntela = \"/opt/tela\"\njoin = [\"gw:7000\"]\njoin_secret_file = \"/s\"\n\
             [[spin.partition]]\nname = \"gpu\"\nshape = \"a100-80x4\"\nnodes = 2\n\
             [[spin.model]]\nname = \"small\"\nparams = \"8B\"\nquantization = \"bf16\"\nkv_headroom = \"2GiB\"\nengine = \"serve --port {{port}}\"\n"
        )
    }

    const FIRECREST: &str = "kind = \"firecrest\"\nurl = \"http://127.0.0.1:8000/\"\nsystem = \"daint\"\n\
        token_url = \"http://idp/token\"\nclient_id = \"tela\"\nclient_secret_file = \"/etc/tela/fc-secret\"";

    fn refused(backend: &str) -> String {
        match LoadedConfig::parse(&with_backend(backend), "test.toml") {
            Ok(_) => panic!("accepted:\n{backend}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_firecrest_backend_is_read_with_its_secret_from_a_file_or_a_variable() {
        let plan = LoadedConfig::parse(&with_backend(FIRECREST), "t.toml").expect("valid").spin.expect("[spin]");
        assert_eq!(
            plan.backend,
            BackendPlan::Firecrest {
                url: "http://127.0.0.1:8000".into(),
                system: "daint".into(),
                token_url: "http://idp/token".into(),
                client_id: "tela".into(),
                client_secret: ClientSecret::File("/etc/tela/fc-secret".into()),
                timeout: Duration::from_secs(30),
                ca_cert: None,
            }
        );
        assert_eq!(plan.backend.to_string(), "FirecREST v2 at http://127.0.0.1:8000, system daint, as client tela");
        let env =
            FIRECREST.replace("client_secret_file = \"/etc/tela/fc-secret\"", "client_secret_env = \"FC_SECRET\"");
        let plan = LoadedConfig::parse(&with_backend(&env), "t.toml").expect("valid").spin.expect("[spin]");
        assert!(
            matches!(plan.backend, BackendPlan::Firecrest { client_secret: ClientSecret::Env(ref v), .. } if v == "FC_SECRET")
        );
    }

    #[test]
    fn rest_backends_take_https_urls_and_a_site_ca() {
        let https = FIRECREST
            .replace("http://127.0.0.1:8000/", "https://api.cscs.ch/v2/")
            .replace("http://idp/token", "https://auth.cscs.ch/token");
        let plan = LoadedConfig::parse(&with_backend(&format!("{https}\nca_cert = \"/etc/tela/ca.pem\"")), "t.toml")
            .expect("valid")
            .spin
            .expect("[spin]");
        assert!(
            matches!(&plan.backend, BackendPlan::Firecrest { url, token_url, ca_cert: Some(ca), .. }
                if url == "https://api.cscs.ch/v2" && token_url == "https://auth.cscs.ch/token" && ca.ends_with("ca.pem")),
            "{:?}",
            plan.backend
        );
        // One https:// URL is enough for a CA file to mean something.
        let mixed =
            format!("{FIRECREST}\nca_cert = \"/etc/tela/ca.pem\"").replace("http://idp/token", "https://idp/token");
        LoadedConfig::parse(&with_backend(&mixed), "t.toml").expect("a CA for the token URL alone");
        let slurm =
            "kind = \"slurmrest\"\nurl = \"https://slurm:6820/\"\nuser = \"tela\"\ntoken_file = \"/etc/tela/jwt\"";
        let plan = LoadedConfig::parse(&with_backend(slurm), "t.toml").expect("valid").spin.expect("[spin]");
        assert!(
            matches!(&plan.backend, BackendPlan::Slurmrest { url, ca_cert: None, .. } if url == "https://slurm:6820"),
            "{:?}",
            plan.backend
        );
    }

    #[test]
    fn firecrest_refusals_name_the_key() {
        let cases = [
            (FIRECREST.replace("system = \"daint\"\n", ""), "spin.backend.system", "required for kind = \"firecrest\""),
            (FIRECREST.replace("client_id = \"tela\"\n", ""), "spin.backend.client_id", "required"),
            (
                FIRECREST.replace("client_secret_file = \"/etc/tela/fc-secret\"", ""),
                "spin.backend.client_secret_file",
                "required",
            ),
            (format!("{FIRECREST}\nclient_secret_env = \"X\""), "spin.backend.client_secret_env", "not both"),
            (
                FIRECREST.replace("http://127.0.0.1:8000/", "ftp://api.cscs.ch"),
                "spin.backend.url",
                "not an http:// or https:// URL",
            ),
            (
                FIRECREST.replace("http://idp/token", "idp/token"),
                "spin.backend.token_url",
                "not an http:// or https://",
            ),
            (FIRECREST.replace("http://idp/token", "https:///token"), "spin.backend.token_url", "not an http://"),
            (format!("{FIRECREST}\nca_cert = \"/etc/tela/ca.pem\""), "spin.backend.ca_cert", "no URL is https://"),
            (
                "kind = \"sbatch\"\nca_cert = \"/etc/tela/ca.pem\"".to_string(),
                "spin.backend.ca_cert",
                "only applies to kind = \"slurmrest\" or \"firecrest\"",
            ),
            (format!("{FIRECREST}\nuser = \"u\""), "spin.backend.user", "only applies to kind = \"slurmrest\""),
            (
                "kind = \"sbatch\"\nsystem = \"daint\"".to_string(),
                "spin.backend.system",
                "only applies to kind = \"firecrest\"",
            ),
        ];
        for (backend, key, why) in cases {
            let err = refused(&backend);
            assert!(err.contains(key) && err.contains(why), "{backend}\n→ {err}\n(wanted {key}: {why})");
        }
    }
}
