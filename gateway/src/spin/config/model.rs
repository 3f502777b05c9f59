//! `[[spin.model]]`: the models that may spin, as written and checked, and where a model is
//! placed among the partitions it may use.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Deserialize;
use tela_core::placement::{place, KvHeadroom, ModelSpec, NoPlacement, NodeShape, Placement, Variant};
use tela_core::spin::ModelPolicy;
use tela_core::Quantization;

use super::error::{invalid, ConfigError};
use super::job::JobSettings;
use super::partition::Partition;
use super::units::{parse_params, positive, Dur, Mib};

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

pub(super) fn resolve_model(m: &ModelSection, partitions: &[Partition]) -> Result<SpinModel, ConfigError> {
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
    if let Err(e) = crate::spin::job::render(&settings, partition, &model, &placement, model.policy.walltime, None) {
        return Err(invalid(key("engine"), e.to_string()));
    }
    Ok(model)
}
