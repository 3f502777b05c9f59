//! The `[spin]` configuration as written — one schema for the gateway's `gateway.toml` and the
//! simulator's scenarios — and the checks that turn it into the spinner's inputs.
//!
//! [`ModelSection`] (`[[spin.model]]`), [`PartitionSection`] (`[[spin.partition]]`),
//! [`BudgetSection`] (`budget = { ... }`) and [`ColdStartSection`] (`[spin.cold_start]`) are the
//! tables as written; every table refuses unknown keys. Their checks give a [`ModelPolicy`], a
//! partition's [`Hardware`], a [`SpinConfig`] and a [`ColdStart`], and every refusal is an
//! [`InvalidKey`] that names the key at fault and says why. Keys that only the batch system
//! needs (a model's `engine`, a partition's `account`, `qos`, ...) are part of the schema and
//! checked by the runtime that submits jobs; the simulator has no use for them.
//!
//! ```
//! use tela_core::spin::config::{ModelSection, PartitionSection};
//!
//! let gpu: PartitionSection = toml_like(r#"{"name": "gpu", "shape": "a100-80x4", "nodes": 2}"#);
//! let (_, hardware) = gpu.hardware().unwrap();
//! let shapes = [tela_core::placement::NodeShape::new("gpu", hardware, 2)];
//! let model: ModelSection =
//!     toml_like(r#"{"name": "small", "params": "8B", "quantization": "bf16", "max_replicas": 2}"#);
//! let policy = model.policy(&shapes).unwrap();
//! assert_eq!((policy.spec.name.as_str(), policy.max_replicas), ("small", 2));
//!
//! let refused: ModelSection = toml_like(r#"{"name": "huge", "params": "2000B", "quantization": "bf16"}"#);
//! let e = refused.policy(&shapes).unwrap_err();
//! assert_eq!(e.key, "spin.model[huge]");
//! # fn toml_like<T: serde::de::DeserializeOwned>(s: &str) -> T { serde_json::from_str(s).unwrap() }
//! ```

use super::{GpuHourBudget, ModelPolicy, SpinConfig};
use crate::hardware::{FabricId, Hardware, GPU_CATALOG};
use crate::placement::{place, KvHeadroom, ModelSpec, NoPlacement, NodeShape, Placement, Variant};
use crate::record::Quantization;
use core::time::Duration;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// A configuration key refused, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct InvalidKey {
    /// The key at fault, e.g. `spin.model[llama].walltime`.
    pub key: String,
    /// Why, in words an operator can act on.
    pub reason: String,
}

/// An [`InvalidKey`].
pub(crate) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> InvalidKey {
    InvalidKey { key: key.into(), reason: reason.into() }
}

/// A duration written with its unit: `"90s"`, `"15m"`, `"4h"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Dur, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map(Dur).map_err(|e| {
            serde::de::Error::custom(format!("'{text}' is not a duration ({e}); write e.g. \"90s\", \"15m\" or \"4h\""))
        })
    }
}

impl Serialize for Dur {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(self.0))
    }
}

/// A size written with its unit: `"512MiB"`, `"4GiB"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mib(pub u64);

impl<'de> Deserialize<'de> for Mib {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Mib, D::Error> {
        let text = String::deserialize(d)?;
        parse_mib(&text).map(Mib).ok_or_else(|| {
            serde::de::Error::custom(format!("'{text}' is not a size; write e.g. \"512MiB\" or \"4GiB\""))
        })
    }
}

impl Serialize for Mib {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{}MiB", self.0))
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

/// Millions of parameters from `"8B"` or `"135M"`.
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

/// `value`, or `default` when absent; refused when zero.
pub fn positive(key: &str, value: Option<Dur>, default: Duration) -> Result<Duration, InvalidKey> {
    match value {
        None => Ok(default),
        Some(Dur(d)) if d.is_zero() => Err(invalid(key, "must be longer than zero")),
        Some(Dur(d)) => Ok(d),
    }
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

fn parse_quantization(key: &str, text: &str) -> Result<Quantization, InvalidKey> {
    let t = text.trim().to_ascii_lowercase();
    QUANTIZATIONS.iter().find(|(name, _)| *name == t).map(|(_, q)| *q).ok_or_else(|| {
        let names: Vec<&str> = QUANTIZATIONS.iter().map(|(n, _)| *n).collect();
        invalid(key, format!("unknown quantization '{text}'; use one of {}", names.join(", ")))
    })
}

/// `budget = { gpu_hours = 200, window = "24h" }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSection {
    /// GPU-hours per window.
    pub gpu_hours: u64,
    /// The sliding window (e.g. `"24h"`).
    pub window: Dur,
}

/// The limits over all models: `max_concurrent_jobs` (default 8) and the budget, if any.
pub fn limits(max_concurrent_jobs: Option<u32>, budget: Option<&BudgetSection>) -> Result<SpinConfig, InvalidKey> {
    let max_concurrent_jobs = max_concurrent_jobs.unwrap_or(8);
    if max_concurrent_jobs == 0 {
        return Err(invalid("spin.max_concurrent_jobs", "must be at least 1"));
    }
    let budget = match budget {
        None => None,
        Some(b) if b.window.0.is_zero() => {
            return Err(invalid("spin.budget.window", "must be longer than zero (e.g. \"24h\")"))
        }
        Some(b) if b.gpu_hours == 0 => {
            return Err(invalid("spin.budget.gpu_hours", "must be at least 1 (leave out [spin.budget] for none)"))
        }
        Some(b) => Some(GpuHourBudget { gpu_hours: b.gpu_hours, window: b.window.0 }),
    };
    Ok(SpinConfig { max_concurrent_jobs, budget, first_job_id: 1 })
}

/// `[spin.cold_start]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColdStartSection {
    /// Requests that may wait per model (default 64).
    pub capacity: Option<usize>,
    /// The longest a request waits for a replica (default 10 min).
    pub timeout: Option<Dur>,
}

/// The cold-start queue of each model, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColdStart {
    /// Requests that may wait per model.
    pub capacity: usize,
    /// The longest a request waits.
    pub timeout: Duration,
}

impl ColdStartSection {
    /// `section` checked, with the defaults where it is absent.
    pub fn resolve(section: Option<&ColdStartSection>) -> Result<ColdStart, InvalidKey> {
        let default = ColdStart { capacity: 64, timeout: Duration::from_secs(600) };
        let Some(c) = section else { return Ok(default) };
        let capacity = c.capacity.unwrap_or(default.capacity);
        if capacity == 0 {
            return Err(invalid("spin.cold_start.capacity", "must be at least 1"));
        }
        Ok(ColdStart { capacity, timeout: positive("spin.cold_start.timeout", c.timeout, default.timeout)? })
    }
}

/// `[[spin.partition]]`: one kind of node jobs may ask for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionSection {
    /// The partition's name (the shape's name in placement; the Slurm partition by default).
    pub name: String,
    /// A hardware profile of the core catalog: `a100-80x4`, `h100x8`, `rtx4090`, `cpu`.
    pub shape: Option<String>,
    /// Instead of `shape`: the GPU model (`a100-80`) ...
    pub gpu: Option<String>,
    /// ... and how many a node has.
    pub gpus: Option<u8>,
    /// The most nodes of this partition held at once.
    pub nodes: u32,
    /// The fabric its nodes share (pipelines across nodes need one; 0 or absent: none).
    pub fabric: Option<u32>,
    /// Account to charge for jobs here (batch system only).
    pub account: Option<String>,
    /// Quality of service for jobs here (batch system only).
    pub qos: Option<String>,
    /// The Slurm partition when it is not `name`: several entries may name one Slurm partition
    /// with different accounts or QoS, as alternatives the queue chooses between.
    pub slurm_partition: Option<String>,
    /// CPUs per task for jobs here (batch system only).
    pub cpus_per_task: Option<u32>,
}

impl PartitionSection {
    /// The key of `field` in this partition's table.
    pub fn key(&self, field: &str) -> String {
        format!("spin.partition[{}].{field}", self.name)
    }

    /// The profile its nodes are described by (`a100-80x4`) and what one node offers, fabric
    /// included; refused when the name, the hardware or the node count is not usable.
    pub fn hardware(&self) -> Result<(String, Hardware), InvalidKey> {
        let key = |field: &str| self.key(field);
        if self.name.trim().is_empty() {
            return Err(invalid("spin.partition.name", "must not be empty"));
        }
        let (profile, mut hardware) = match (&self.shape, &self.gpu, self.gpus) {
            (Some(shape), None, None) => {
                let hw = Hardware::from_profile(shape).map_err(|e| invalid(key("shape"), e.to_string()))?;
                (shape.trim().to_ascii_lowercase(), hw)
            }
            (None, Some(gpu), count) => {
                let count = count.unwrap_or(1);
                if count == 0 {
                    return Err(invalid(
                        key("gpus"),
                        "must be at least 1 (use shape = \"cpu\" for nodes without GPUs)",
                    ));
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
        if self.nodes == 0 {
            return Err(invalid(key("nodes"), "must be at least 1"));
        }
        hardware.fabric = FabricId(self.fabric.unwrap_or(0));
        Ok((profile, hardware))
    }
}

/// `quantized = [{ label = "awq", quantization = "awq" }]`: a checkpoint offered as a fallback.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
    /// The engine's command line (batch system only; the gateway requires it); `{model}`,
    /// `{port}`, `{tp}`, `{pp}`, `{gpus}` and `{variant}` are filled in. It must listen on
    /// 127.0.0.1:`{port}`.
    pub engine: Option<String>,
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
    /// Before the time limit, the node is told to drain this long ahead (the gateway's default
    /// 15 min).
    pub drain_window: Option<Dur>,
    /// How long demand must stay low before replicas are released (default 15 min).
    pub scale_down_after: Option<Dur>,
    /// No scale-up for this long after any action (default 2 min).
    pub cooldown: Option<Dur>,
    /// Load, in percent of the thresholds, below which a replica is not needed (default 50).
    pub scale_down_percent: Option<u32>,
}

impl ModelSection {
    /// The key of `field` in this model's table.
    pub fn key(&self, field: &str) -> String {
        format!("spin.model[{}].{field}", self.name)
    }

    /// How the model spins, checked; `shapes` are the partitions with every node free, in the
    /// order written, and the model must have a placement on those it may use.
    pub fn policy(&self, shapes: &[NodeShape]) -> Result<ModelPolicy, InvalidKey> {
        let key = |field: &str| self.key(field);
        if self.name.trim().is_empty() {
            return Err(invalid("spin.model.name", "must not be empty"));
        }
        let params = parse_params(&self.params).ok_or_else(|| {
            invalid(key("params"), format!("'{}' is not a parameter count; write e.g. \"8B\" or \"135M\"", self.params))
        })?;
        let quant = parse_quantization(&key("quantization"), &self.quantization)?;
        let mut spec = ModelSpec::new(self.name.clone(), params, quant)
            .with_kv(KvHeadroom::Mib(self.kv_headroom.map_or(0, |Mib(v)| v)));
        spec.weights.weights_mib = self.weights.map(|Mib(v)| v);
        let mut labels = BTreeSet::from([spec.weights.label.clone()]);
        for (i, v) in self.quantized.iter().enumerate() {
            let vkey = format!("spin.model[{}].quantized[{i}]", self.name);
            if v.label.trim().is_empty() {
                return Err(invalid(format!("{vkey}.label"), "must not be empty"));
            }
            if !labels.insert(v.label.clone()) {
                return Err(invalid(format!("{vkey}.label"), format!("'{}' is used twice", v.label)));
            }
            let q = parse_quantization(&format!("{vkey}.quantization"), &v.quantization)?;
            spec = spec.with_quantized(Variant {
                label: v.label.clone(),
                quant: q,
                weights_mib: v.weights.map(|Mib(x)| x),
            });
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
        for name in &self.partitions {
            if !shapes.iter().any(|s| s.name == *name) {
                let known: Vec<&str> = shapes.iter().map(|s| s.name.as_str()).collect();
                return Err(invalid(
                    key("partitions"),
                    format!("unknown partition '{name}' (known: {})", known.join(", ")),
                ));
            }
        }
        let mut policy = ModelPolicy::new(spec);
        policy.shapes = self.partitions.clone();
        policy.min_replicas = self.min_replicas.unwrap_or(policy.min_replicas);
        policy.max_replicas = self.max_replicas.unwrap_or(policy.max_replicas);
        if policy.max_replicas == 0 {
            return Err(invalid(key("max_replicas"), "must be at least 1"));
        }
        if policy.min_replicas > policy.max_replicas {
            return Err(invalid(
                key("min_replicas"),
                format!("{} is above max_replicas {}", policy.min_replicas, policy.max_replicas),
            ));
        }
        policy.concurrency_per_replica = self.concurrency_per_replica.unwrap_or(policy.concurrency_per_replica);
        if policy.concurrency_per_replica == 0 {
            return Err(invalid(key("concurrency_per_replica"), "must be at least 1"));
        }
        if self.arrivals_per_replica == Some(0) {
            return Err(invalid(key("arrivals_per_replica"), "must be at least 1 (leave it out to ignore the rate)"));
        }
        policy.arrivals_per_replica = self.arrivals_per_replica;
        if let Some(t) = self.latency_target {
            policy.latency_target = Some(positive(&key("latency_target"), Some(t), t.0)?);
        }
        policy.walltime = positive(&key("walltime"), self.walltime, policy.walltime)?;
        if policy.walltime < Duration::from_secs(60) {
            return Err(invalid(key("walltime"), "must be at least one minute, Slurm's granularity"));
        }
        if let Some(d) = self.drain_window {
            positive(&key("drain_window"), Some(d), d.0)?;
        }
        policy.scale_down_after = positive(&key("scale_down_after"), self.scale_down_after, policy.scale_down_after)?;
        policy.cooldown = positive(&key("cooldown"), self.cooldown, policy.cooldown)?;
        policy.scale_down_percent = self.scale_down_percent.unwrap_or(policy.scale_down_percent);
        if !(1..=100).contains(&policy.scale_down_percent) {
            return Err(invalid(
                key("scale_down_percent"),
                format!("{} is outside 1..=100", policy.scale_down_percent),
            ));
        }
        if let Err(reason) = place_on(&policy.spec, &policy.shapes, shapes) {
            let over = if policy.shapes.is_empty() { "any partition" } else { "its partitions" };
            return Err(invalid(format!("spin.model[{}]", self.name), format!("cannot be placed on {over}: {reason}")));
        }
        Ok(policy)
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn units_write_back_what_they_read() {
        let d: Dur = serde_json::from_str("\"4h\"").unwrap();
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"4h\"");
        let m: Mib = serde_json::from_str("\"4GiB\"").unwrap();
        assert_eq!(m, Mib(4096));
        assert_eq!(serde_json::from_str::<Mib>(&serde_json::to_string(&m).unwrap()).unwrap(), m);
    }

    #[test]
    fn limits_and_cold_start_take_defaults_and_refuse_zeros() {
        assert_eq!(limits(None, None).unwrap().max_concurrent_jobs, 8);
        assert_eq!(limits(Some(0), None).unwrap_err().key, "spin.max_concurrent_jobs");
        let b = BudgetSection { gpu_hours: 0, window: Dur(Duration::from_secs(60)) };
        assert_eq!(limits(None, Some(&b)).unwrap_err().key, "spin.budget.gpu_hours");
        assert_eq!(ColdStartSection::resolve(None).unwrap().capacity, 64);
        let c = ColdStartSection { capacity: Some(0), timeout: None };
        assert_eq!(ColdStartSection::resolve(Some(&c)).unwrap_err().key, "spin.cold_start.capacity");
    }
}
