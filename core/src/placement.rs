//! Placement: which free hardware one replica of a model should run on, and how it is split.
//!
//! [`place`] takes a [`ModelSpec`] (parameters, weight format, KV-cache headroom, quantized
//! variants offered) and the free [`NodeShape`]s (a hardware shape, its fabric, how many such
//! nodes are free) and returns a [`Placement`] or a [`NoPlacement`] saying why none exists.
//!
//! # Rules
//!
//! A variant *needs* its weights plus the KV headroom for the context wanted. A set of GPUs hosts
//! it when their VRAM is at least 125% (1.25×) of that need, spread evenly:
//! the 25% covers the engine's activations, CUDA context and allocator fragmentation.
//!
//! 1. **One GPU**, if one GPU of the shape has 1.25× the need.
//! 2. **Tensor parallelism inside one node**, across NVLink or Infinity Fabric peers only, with a
//!    power-of-two degree up to the node's GPU count (engines split attention heads evenly, and
//!    head counts are powers of two).
//! 3. **A quantized variant** the model offers (e.g. AWQ), in the order the spec lists them, each
//!    tried with rules 1–2 on every shape before the next.
//! 4. **A multi-node pipeline**, native weights first, then each variant: stages on several free
//!    nodes of *one* shape whose fabric id is non-zero, each stage with the same tensor-parallel
//!    degree. A shape is one partition on one fabric, so a pipeline never spans fabrics, the WAN
//!    or links of unknown kind ([`FabricId`] 0).
//!
//! Within one step the least capable GPU class that fits wins — the highest [`GpuModel::tier`]
//! number, so an 8B model lands on an RTX 4090 rather than on a GH200 — then the fewest GPUs, then
//! the fewest nodes, then the earlier shape in the caller's list. Scarce top-tier GPUs stay free
//! for the models that only they can host.
//!
//! # PCIe-only nodes
//!
//! Nodes whose GPUs talk over PCIe only (RTX 4090/3090 workstations, L40S servers) host replicas
//! that fit **one** GPU: no tensor parallelism, no pipeline stage. Tensor parallelism all-reduces
//! activations twice per layer; over PCIe — through host memory on consumer cards, which have
//! peer-to-peer disabled — that multiplies the per-token latency of an interactive endpoint, and
//! such nodes sit behind host bridges and commodity Ethernet rather than on a fabric, which
//! DESIGN.md rules out for pipelines. A model too large for one such GPU goes to an NVLink node or
//! a quantized variant, and if neither exists the operator gets a typed reason rather than a
//! replica that is silently slow.
//!
//! # Example
//!
//! ```
//! use tela_core::placement::{place, KvHeadroom, ModelSpec, NodeShape};
//! use tela_core::{GpuModel, Hardware, Quantization};
//!
//! let spec = ModelSpec::new("llama-3-8b", 8_000, Quantization::Int4).with_kv(KvHeadroom::gib(2));
//! let shapes = [
//!     NodeShape::new("gh200", Hardware::catalog(GpuModel::Gh200, 4), 3),
//!     NodeShape::new("workstation", Hardware::catalog(GpuModel::Rtx4090, 1), 2),
//! ];
//! let p = place(&spec, &shapes).unwrap();
//! assert_eq!((p.shape_name.as_str(), p.gpus()), ("workstation", 1));
//! ```

use crate::hardware::{FabricId, GpuModel, Hardware, Interconnect};
use crate::record::Quantization;
use core::cmp::Reverse;
use core::fmt;
use serde::{Deserialize, Serialize};

/// The least VRAM a placement offers, in percent of the weights plus KV headroom it holds.
pub(crate) const VRAM_RATIO_PERCENT: u64 = 125;

const MIB: u64 = 1 << 20;

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KvDtype {
    /// 32-bit floats.
    F32,
    /// fp16 or bf16, the engines' default.
    F16,
    /// fp8 or int8 (`--kv-cache-dtype fp8`).
    F8,
}

impl KvDtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
            KvDtype::F8 => 1,
        }
    }
}

/// The architecture facts that size a KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KvCacheShape {
    /// Transformer layers.
    pub layers: u32,
    /// Key/value heads (fewer than attention heads with grouped-query attention).
    pub kv_heads: u32,
    /// Dimension of one head (`kv_heads × head_dim` is the hidden size without GQA).
    pub head_dim: u32,
    /// Context length wanted per sequence, in tokens.
    pub context_tokens: u32,
    /// Sequences that should fit at full context at once.
    pub sequences: u32,
    /// Element type of the cache.
    pub dtype: KvDtype,
}

impl KvCacheShape {
    /// The cache size in MiB: keys and values for every layer, head and token.
    pub fn mib(&self) -> u64 {
        let bytes = 2
            * u64::from(self.layers)
            * u64::from(self.kv_heads)
            * u64::from(self.head_dim)
            * u64::from(self.context_tokens)
            * u64::from(self.sequences)
            * self.dtype.bytes();
        bytes.div_ceil(MIB)
    }
}

/// GPU memory to reserve for the KV cache beyond the weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KvHeadroom {
    /// A fixed amount in MiB.
    Mib(u64),
    /// Computed from the architecture and the context wanted.
    Cache(KvCacheShape),
}

impl KvHeadroom {
    /// A fixed headroom of `gib` GiB.
    pub fn gib(gib: u64) -> KvHeadroom {
        KvHeadroom::Mib(gib * 1024)
    }

    /// The headroom in MiB.
    pub fn mib(&self) -> u64 {
        match self {
            KvHeadroom::Mib(m) => *m,
            KvHeadroom::Cache(shape) => shape.mib(),
        }
    }
}

/// One checkpoint of a model: its weight format and, when known, its exact size.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Variant {
    /// Short label the job template maps onto a checkpoint (`"fp16"`, `"awq"`).
    pub label: String,
    /// Weight format.
    pub quant: Quantization,
    /// Size of the weights in MiB when known (the checkpoint on disk); otherwise estimated from
    /// the parameter count and the bits per weight of `quant`.
    pub weights_mib: Option<u64>,
}

impl Variant {
    /// A variant whose size is estimated from its format.
    pub fn new(label: impl Into<String>, quant: Quantization) -> Variant {
        Variant { label: label.into(), quant, weights_mib: None }
    }

    /// The weights in MiB for a model of `params_millions` parameters, if the size is known or
    /// can be estimated.
    pub fn weights_mib(&self, params_millions: u64) -> Option<u64> {
        if let Some(m) = self.weights_mib {
            return Some(m);
        }
        let bits_x10 = bits_per_weight_x10(self.quant)?;
        Some((u128::from(params_millions) * 1_000_000 * u128::from(bits_x10) / 80).div_ceil(u128::from(MIB)) as u64)
    }
}

/// Stored bits per parameter, in tenths, for formats whose size follows from the parameter count.
///
/// 4-bit formats count 4.5 bits: group-wise scales and zero points add about a quarter bit, and
/// embeddings and the output head usually stay in 16 bits. GGUF files mix formats per tensor and
/// unknown formats have no rule: give their [`Variant::weights_mib`].
pub(crate) fn bits_per_weight_x10(quant: Quantization) -> Option<u64> {
    match quant {
        Quantization::Fp32 => Some(320),
        Quantization::Bf16 | Quantization::Fp16 => Some(160),
        Quantization::Fp8 | Quantization::Int8 => Some(80),
        Quantization::Int4 | Quantization::Awq | Quantization::Gptq => Some(45),
        Quantization::Unknown | Quantization::Gguf => None,
    }
}

/// What placement needs to know about a model.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ModelSpec {
    /// The name clients put in `model`.
    pub name: String,
    /// Parameters in millions (70B is `70_000`).
    pub params_millions: u64,
    /// The native checkpoint, always preferred when it fits.
    pub weights: Variant,
    /// KV-cache headroom for the context wanted.
    pub kv_headroom: KvHeadroom,
    /// Quantized checkpoints offered as fallbacks, most preferred first.
    pub quantized: Vec<Variant>,
}

impl ModelSpec {
    /// A model of `params_millions` parameters in format `quant`, with no KV headroom and no
    /// quantized variants yet.
    pub fn new(name: impl Into<String>, params_millions: u64, quant: Quantization) -> ModelSpec {
        ModelSpec {
            name: name.into(),
            params_millions,
            weights: Variant::new(quant_label(quant), quant),
            kv_headroom: KvHeadroom::Mib(0),
            quantized: Vec::new(),
        }
    }

    /// Sets the KV headroom.
    pub fn with_kv(mut self, kv: KvHeadroom) -> ModelSpec {
        self.kv_headroom = kv;
        self
    }

    /// Offers a quantized variant, tried after the native weights and earlier variants.
    pub fn with_quantized(mut self, variant: Variant) -> ModelSpec {
        self.quantized.push(variant);
        self
    }

    /// The native weights, then the quantized variants in order.
    pub fn variants(&self) -> impl Iterator<Item = &Variant> {
        core::iter::once(&self.weights).chain(&self.quantized)
    }

    /// Weights plus KV headroom of `variant` in MiB, if its size is known.
    pub fn need_mib(&self, variant: &Variant) -> Option<u64> {
        Some(variant.weights_mib(self.params_millions)?.saturating_add(self.kv_headroom.mib()))
    }
}

fn quant_label(q: Quantization) -> &'static str {
    match q {
        Quantization::Unknown => "unknown",
        Quantization::Fp32 => "fp32",
        Quantization::Bf16 => "bf16",
        Quantization::Fp16 => "fp16",
        Quantization::Fp8 => "fp8",
        Quantization::Int8 => "int8",
        Quantization::Int4 => "int4",
        Quantization::Awq => "awq",
        Quantization::Gptq => "gptq",
        Quantization::Gguf => "gguf",
    }
}

/// A kind of node the batch system can hand out, and how many of them are free now.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeShape {
    /// Operator's name for the shape, e.g. the Slurm partition (`"gpu-a100"`).
    pub name: String,
    /// What one node offers. All nodes of a shape sit on `hardware.fabric`.
    pub hardware: Hardware,
    /// Nodes of this shape free now.
    pub free_nodes: u32,
}

impl NodeShape {
    /// A shape named `name` with `free_nodes` free nodes of `hardware`.
    pub fn new(name: impl Into<String>, hardware: Hardware, free_nodes: u32) -> NodeShape {
        NodeShape { name: name.into(), hardware, free_nodes }
    }

    fn has_gpus(&self) -> bool {
        self.hardware.gpu != GpuModel::None && self.hardware.gpu_count > 0 && self.hardware.vram_mib > 0
    }

    /// The largest tensor-parallel degree rule 2 allows on one node of this shape.
    pub fn max_tensor_parallel(&self) -> u8 {
        let count = self.hardware.gpu_count;
        match self.hardware.interconnect {
            Interconnect::NvLink | Interconnect::InfinityFabric if count > 1 => {
                1 << (u8::BITS - 1 - count.leading_zeros())
            }
            _ => 1,
        }
    }

    /// Whether nodes of this shape may be stages of one pipeline: on a known fabric, not PCIe-only.
    pub fn pipeline_capable(&self) -> bool {
        self.hardware.fabric != FabricId(0) && self.hardware.interconnect != Interconnect::Pcie
    }

    /// GPU memory one replica may use on one node of this shape, in MiB.
    pub fn usable_mib(&self) -> u64 {
        if self.has_gpus() {
            u64::from(self.hardware.vram_mib) * u64::from(self.max_tensor_parallel())
        } else {
            0
        }
    }
}

/// Where one replica runs and how it is split.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Placement {
    /// Index of the chosen shape in the list given to [`place`].
    pub shape: usize,
    /// Name of the chosen shape.
    pub shape_name: String,
    /// The chosen shape's hardware.
    pub hardware: Hardware,
    /// GPUs per node, split by tensor parallelism (1: no split).
    pub tensor_parallel: u8,
    /// Nodes, one pipeline stage each (1: a single node).
    pub pipeline_stages: u32,
    /// The checkpoint to load.
    pub variant: Variant,
    /// Whether `variant` is a quantized fallback rather than the native weights.
    pub quantized_fallback: bool,
    /// Weights plus KV headroom of `variant`, in MiB.
    pub need_mib: u64,
}

impl Placement {
    /// GPUs used in all: tensor-parallel degree × pipeline stages.
    pub fn gpus(&self) -> u32 {
        u32::from(self.tensor_parallel).saturating_mul(self.pipeline_stages)
    }

    /// The GPU tier of the chosen hardware (1 fastest).
    pub fn tier(&self) -> u8 {
        self.hardware.gpu.tier()
    }

    /// VRAM of the GPUs used, in MiB.
    pub fn vram_mib(&self) -> u64 {
        u64::from(self.hardware.vram_mib) * u64::from(self.gpus())
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "'{}' ({:?}, tier {}): {} node(s) × TP {}, {} weights, {} of {}",
            self.shape_name,
            self.hardware.gpu,
            self.tier(),
            self.pipeline_stages,
            self.tensor_parallel,
            self.variant.label,
            gib(self.need_mib),
            gib(self.vram_mib()),
        )
    }
}

/// Why no placement exists. [`place`] is pure: a failure changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoPlacement {
    /// A variant's size cannot be estimated from its format.
    #[error(
        "model '{model}': variant '{variant}' ({quant:?}) has no size rule per parameter; set its weights size in MiB"
    )]
    UnknownWeightSize {
        /// The model.
        model: String,
        /// Label of the variant without a size.
        variant: String,
        /// Its format.
        quant: Quantization,
    },
    /// No shape offered has a GPU and a free node.
    #[error(
        "no free GPU node to place model '{model}' on: {shapes} shape(s) offered, all CPU-only or fully allocated"
    )]
    NoGpuShapes {
        /// The model.
        model: String,
        /// How many shapes were offered.
        shapes: usize,
    },
    /// It would fit only by pipelining across fabrics, across links of unknown kind, or across
    /// PCIe-only nodes.
    #[error(
        "model '{model}' needs {} of GPU memory ({VRAM_RATIO_PERCENT}% of weights + KV headroom, smallest variant) \
         and fits only by pipelining across nodes outside one fabric (different fabrics, unknown links or PCIe-only \
         nodes; the most one fabric offers is {}): free more nodes on one fabric or offer a smaller quantized variant",
        gib(*need_mib), gib(*largest_fabric_mib)
    )]
    WouldCrossFabrics {
        /// The model.
        model: String,
        /// VRAM the smallest variant needs at the 1.25 ratio, in MiB.
        need_mib: u64,
        /// The most VRAM a pipeline inside one fabric could use, in MiB.
        largest_fabric_mib: u64,
    },
    /// Larger than everything free, even pooled.
    #[error(
        "model '{model}' needs {} of GPU memory ({VRAM_RATIO_PERCENT}% of weights + KV headroom, smallest variant); \
         the largest free shape, '{largest_shape}', offers {} per node: offer a quantized variant, a shorter context \
         or larger nodes",
        gib(*need_mib), gib(*largest_mib)
    )]
    TooLarge {
        /// The model.
        model: String,
        /// VRAM the smallest variant needs at the 1.25 ratio, in MiB.
        need_mib: u64,
        /// Name of the free shape with the most usable VRAM per node.
        largest_shape: String,
        /// Its usable VRAM per node (one GPU on PCIe-only nodes), in MiB.
        largest_mib: u64,
    },
}

fn gib(mib: u64) -> String {
    format!("{}.{} GiB", mib / 1024, (mib % 1024) * 10 / 1024)
}

/// VRAM `need_mib` requires at the 1.25 ratio, in MiB (rounded up).
pub(crate) fn required_vram_mib(need_mib: u64) -> u64 {
    need_mib.saturating_mul(VRAM_RATIO_PERCENT).div_ceil(100)
}

/// Whether `gpus` GPUs of `vram_mib` each host `need_mib` at the 1.25 ratio.
fn fits(vram_mib: u32, gpus: u64, need_mib: u64) -> bool {
    u64::from(vram_mib) * gpus * 100 >= need_mib.saturating_mul(VRAM_RATIO_PERCENT)
}

/// One way to host a variant on a shape: (tensor-parallel degree, pipeline stages).
type Split = (u8, u32);

/// The smallest single-node split of `shape` that hosts `need_mib`.
fn single_node(shape: &NodeShape, need_mib: u64) -> Option<Split> {
    let max_tp = shape.max_tensor_parallel();
    let mut tp = 1u8;
    loop {
        if fits(shape.hardware.vram_mib, u64::from(tp), need_mib) {
            return Some((tp, 1));
        }
        if tp >= max_tp {
            return None;
        }
        tp *= 2;
    }
}

/// The multi-node split of `shape` with the fewest GPUs, then the fewest nodes.
fn pipeline(shape: &NodeShape, need_mib: u64) -> Option<Split> {
    if !shape.pipeline_capable() || shape.free_nodes < 2 {
        return None;
    }
    let required = need_mib.saturating_mul(VRAM_RATIO_PERCENT);
    let mut best: Option<Split> = None;
    let mut tp = 1u8;
    loop {
        let per_node = u64::from(shape.hardware.vram_mib) * u64::from(tp) * 100;
        let stages = required.div_ceil(per_node).max(2);
        if stages <= u64::from(shape.free_nodes) {
            let split = (tp, stages as u32);
            let gpus = |(t, s): Split| u64::from(t) * u64::from(s);
            best = match best {
                Some(b) if (gpus(b), b.1) <= (gpus(split), split.1) => Some(b),
                _ => Some(split),
            };
        }
        if tp >= shape.max_tensor_parallel() {
            return best;
        }
        tp *= 2;
    }
}

/// Picks where one replica of `spec` runs among `shapes`; see the module docs for the rules.
pub fn place(spec: &ModelSpec, shapes: &[NodeShape]) -> Result<Placement, NoPlacement> {
    let mut needs = Vec::with_capacity(1 + spec.quantized.len());
    for variant in spec.variants() {
        let need = spec.need_mib(variant).ok_or_else(|| NoPlacement::UnknownWeightSize {
            model: spec.name.clone(),
            variant: variant.label.clone(),
            quant: variant.quant,
        })?;
        needs.push((variant, need));
    }
    let usable: Vec<(usize, &NodeShape)> =
        shapes.iter().enumerate().filter(|(_, s)| s.has_gpus() && s.free_nodes > 0).collect();
    if usable.is_empty() {
        return Err(NoPlacement::NoGpuShapes { model: spec.name.clone(), shapes: shapes.len() });
    }

    // The rule steps in order: every variant in one node, then every variant as a pipeline.
    let steps: [fn(&NodeShape, u64) -> Option<Split>; 2] = [single_node, pipeline];
    for step in steps {
        for (v, &(variant, need)) in needs.iter().enumerate() {
            let best = usable
                .iter()
                .filter_map(|&(i, shape)| step(shape, need).map(|split| (i, shape, split)))
                .min_by_key(|&(i, shape, (tp, stages))| {
                    (Reverse(shape.hardware.gpu.tier()), u64::from(tp) * u64::from(stages), stages, i)
                });
            if let Some((i, shape, (tp, stages))) = best {
                return Ok(Placement {
                    shape: i,
                    shape_name: shape.name.clone(),
                    hardware: shape.hardware.clone(),
                    tensor_parallel: tp,
                    pipeline_stages: stages,
                    variant: variant.clone(),
                    quantized_fallback: v > 0,
                    need_mib: need,
                });
            }
        }
    }

    let smallest = needs.iter().map(|&(_, need)| need).min().unwrap_or(0);
    let required = required_vram_mib(smallest);
    // Everything free pooled, as if pipelines could go anywhere: if even that is too small, the
    // model is simply too large; otherwise only the one-fabric rule stands in the way.
    let pooled = usable
        .iter()
        .fold(0u64, |sum, (_, s)| sum.saturating_add(s.usable_mib().saturating_mul(u64::from(s.free_nodes))));
    if pooled >= required {
        let largest_fabric_mib = usable
            .iter()
            .map(|(_, s)| {
                if s.pipeline_capable() {
                    s.usable_mib().saturating_mul(u64::from(s.free_nodes))
                } else {
                    s.usable_mib()
                }
            })
            .max()
            .unwrap_or(0);
        return Err(NoPlacement::WouldCrossFabrics {
            model: spec.name.clone(),
            need_mib: required,
            largest_fabric_mib,
        });
    }
    // The first of the largest, so the name does not depend on how ties are broken.
    let largest =
        usable.iter().map(|&(_, s)| s).fold(usable[0].1, |a, s| if s.usable_mib() > a.usable_mib() { s } else { a });
    Err(NoPlacement::TooLarge {
        model: spec.name.clone(),
        need_mib: required,
        largest_shape: largest.name.clone(),
        largest_mib: largest.usable_mib(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Llama-3-70B: 80 layers, 8 KV heads of 128, here with an 8k context for one sequence.
    fn kv_70b() -> KvHeadroom {
        KvHeadroom::Cache(KvCacheShape {
            layers: 80,
            kv_heads: 8,
            head_dim: 128,
            context_tokens: 8192,
            sequences: 1,
            dtype: KvDtype::F16,
        })
    }

    fn llama70b(quant: Quantization) -> ModelSpec {
        ModelSpec::new("llama-70b", 70_000, quant).with_kv(kv_70b())
    }

    fn shape(name: &str, gpu: GpuModel, count: u8, free: u32) -> NodeShape {
        NodeShape::new(name, Hardware::catalog(gpu, count), free)
    }

    fn on_fabric(mut s: NodeShape, fabric: u32) -> NodeShape {
        s.hardware.fabric = FabricId(fabric);
        s
    }

    /// What a row expects: a placement (shape name, TP degree, stages, variant label) or an error.
    #[derive(Debug)]
    enum Want {
        At(&'static str, u8, u32, &'static str),
        CrossFabrics,
        TooLarge(&'static str),
        NoGpus,
        UnknownSize,
    }

    #[test]
    fn kv_cache_size_follows_the_architecture() {
        // 2 (K and V) × 80 layers × 8 heads × 128 × 8192 tokens × 2 bytes = 2.5 GiB.
        assert_eq!(kv_70b().mib(), 2560);
        let fp8 = KvCacheShape {
            dtype: KvDtype::F8,
            sequences: 4,
            ..match kv_70b() {
                KvHeadroom::Cache(c) => c,
                KvHeadroom::Mib(_) => unreachable!(),
            }
        };
        assert_eq!(fp8.mib(), 5120);
        assert_eq!(Variant::new("fp16", Quantization::Fp16).weights_mib(70_000), Some(133_515));
        assert_eq!(Variant::new("awq", Quantization::Awq).weights_mib(70_000), Some(37_551));
    }

    #[test]
    fn placement_table_over_the_catalog() {
        use GpuModel::*;
        use Quantization::*;
        let with_awq = llama70b(Fp16).with_quantized(Variant::new("awq", Awq));
        let rows: Vec<(&str, ModelSpec, Vec<NodeShape>, Want)> = vec![
            (
                "70B FP16 goes to tier 1 with TP, never to PCIe 4090s however many",
                llama70b(Fp16),
                vec![
                    shape("rtx4090x8", Rtx4090, 8, 4),
                    shape("rtx3090x4", Rtx3090, 4, 4),
                    shape("l40sx4", L40S, 4, 2),
                    shape("rtx4090", Rtx4090, 1, 16),
                    shape("h100x8", H100, 8, 2),
                ],
                Want::At("h100x8", 4, 1, "fp16"),
            ),
            (
                "8B INT4 takes a 4090 rather than a GH200 when both are free",
                ModelSpec::new("llama-8b", 8_000, Int4).with_kv(KvHeadroom::gib(1)),
                vec![shape("gh200x4", Gh200, 4, 4), shape("rtx4090", Rtx4090, 1, 1)],
                Want::At("rtx4090", 1, 1, "int4"),
            ),
            (
                "70B AWQ fits one A100-80 (an L40S is 0.1 GiB short, A100-40 needs two)",
                llama70b(Awq),
                vec![
                    shape("h100x8", H100, 8, 1),
                    shape("a100-40x8", A100_40, 8, 1),
                    shape("l40sx4", L40S, 4, 1),
                    shape("a100-80x4", A100_80, 4, 1),
                    shape("rtx4090x2", Rtx4090, 2, 1),
                ],
                Want::At("a100-80x4", 1, 1, "awq"),
            ),
            (
                "70B FP16 falls back to its AWQ variant on single-A100-80 allocations",
                with_awq.clone(),
                vec![shape("rtx4090", Rtx4090, 1, 8), shape("a100-80", A100_80, 1, 8)],
                Want::At("a100-80", 1, 1, "awq"),
            ),
            (
                "the native weights win when some node holds them with TP",
                with_awq.clone(),
                vec![shape("a100-80", A100_80, 1, 8), shape("h100x4", H100, 4, 1)],
                Want::At("h100x4", 4, 1, "fp16"),
            ),
            (
                "a pipeline across two fabrics is refused",
                llama70b(Fp16),
                vec![on_fabric(shape("h100x2-a", H100, 2, 1), 1), on_fabric(shape("h100x2-b", H100, 2, 1), 2)],
                Want::CrossFabrics,
            ),
            (
                "a pipeline over links of unknown kind (fabric 0) is refused",
                llama70b(Fp16),
                vec![shape("h100x2", H100, 2, 4)],
                Want::CrossFabrics,
            ),
            (
                "a pipeline inside one fabric uses the fewest GPUs: 3 stages of 1 before 2 stages of TP 2",
                llama70b(Fp16),
                vec![on_fabric(shape("h100x2", H100, 2, 3), 7)],
                Want::At("h100x2", 1, 3, "fp16"),
            ),
            (
                "with two free nodes the pipeline's stages use TP 2",
                llama70b(Fp16),
                vec![on_fabric(shape("h100x2", H100, 2, 2), 7)],
                Want::At("h100x2", 2, 2, "fp16"),
            ),
            (
                "a quantized variant in one node beats a native pipeline",
                with_awq.clone(),
                vec![on_fabric(shape("h100x2", H100, 2, 3), 7)],
                Want::At("h100x2", 1, 1, "awq"),
            ),
            (
                "PCIe-only nodes on a fabric do not form pipelines",
                llama70b(Fp16),
                vec![on_fabric(shape("l40sx4", L40S, 4, 8), 3)],
                Want::CrossFabrics,
            ),
            (
                "within tier 1 the fewest GPUs win: one MI300X over four H100s",
                llama70b(Fp16),
                vec![shape("h100x8", H100, 8, 1), shape("mi300x8", Mi300x, 8, 1)],
                Want::At("mi300x8", 1, 1, "fp16"),
            ),
            (
                "the lower tier wins over fewer GPUs: four A100-80s before one MI300X",
                llama70b(Fp16),
                vec![shape("mi300x8", Mi300x, 8, 1), shape("a100-80x8", A100_80, 8, 1)],
                Want::At("a100-80x8", 4, 1, "fp16"),
            ),
            (
                "GH200 hosts 70B FP16 with TP 2 where H100 needs TP 4",
                llama70b(Fp16),
                vec![shape("h100x8", H100, 8, 1), shape("gh200x4", Gh200, 4, 1)],
                Want::At("gh200x4", 2, 1, "fp16"),
            ),
            (
                "13B FP16 fits a 32 GB V100 but not a 24 GB 4090",
                ModelSpec::new("llama-13b", 13_000, Fp16).with_kv(KvHeadroom::gib(1)),
                vec![shape("rtx4090x8", Rtx4090, 8, 2), shape("v100x8", V100, 8, 1), shape("h100x8", H100, 8, 1)],
                Want::At("v100x8", 1, 1, "fp16"),
            ),
            (
                "8B BF16 takes a 3090 before an L40S",
                ModelSpec::new("llama-8b", 8_000, Bf16).with_kv(KvHeadroom::gib(1)),
                vec![shape("l40s", L40S, 1, 1), shape("rtx3090", Rtx3090, 1, 1)],
                Want::At("rtx3090", 1, 1, "bf16"),
            ),
            (
                "shapes with no free node are skipped",
                ModelSpec::new("llama-8b", 8_000, Bf16).with_kv(KvHeadroom::gib(1)),
                vec![shape("rtx4090", Rtx4090, 1, 0), shape("a100-80", A100_80, 1, 2)],
                Want::At("a100-80", 1, 1, "bf16"),
            ),
            (
                "CPU-only nodes are never chosen for a GPU model",
                ModelSpec::new("qwen-0.5b", 500, Bf16),
                vec![NodeShape::new("cpu", Hardware::CPU, 64), shape("rtx3090", Rtx3090, 1, 1)],
                Want::At("rtx3090", 1, 1, "bf16"),
            ),
            (
                "only CPU-only nodes: a typed reason",
                ModelSpec::new("qwen-0.5b", 500, Bf16),
                vec![NodeShape::new("cpu", Hardware::CPU, 64)],
                Want::NoGpus,
            ),
            (
                "too large for everything, even pooled: names the largest shape",
                ModelSpec::new("llama-405b", 405_000, Fp16).with_kv(KvHeadroom::gib(8)),
                vec![shape("rtx4090x8", Rtx4090, 8, 3), shape("h100x8", H100, 8, 1), shape("a100-40x4", A100_40, 4, 1)],
                Want::TooLarge("h100x8"),
            ),
            (
                "a PCIe-only node offers one GPU, which is what the reason names",
                ModelSpec::new("qwen-32b", 32_000, Bf16),
                vec![shape("rtx4090x8", Rtx4090, 8, 1)],
                Want::TooLarge("rtx4090x8"),
            ),
            (
                "a GGUF checkpoint without a size is a spec error",
                ModelSpec::new("mystery", 7_000, Gguf),
                vec![shape("h100x8", H100, 8, 1)],
                Want::UnknownSize,
            ),
        ];
        for (why, spec, shapes, want) in rows {
            let got = place(&spec, &shapes);
            let ok = match (&want, &got) {
                (Want::At(name, tp, stages, label), Ok(p)) => {
                    (p.shape_name.as_str(), p.tensor_parallel, p.pipeline_stages, p.variant.label.as_str())
                        == (*name, *tp, *stages, *label)
                        && shapes[p.shape].name == p.shape_name
                }
                (Want::CrossFabrics, Err(NoPlacement::WouldCrossFabrics { .. })) => true,
                (Want::TooLarge(name), Err(NoPlacement::TooLarge { largest_shape, .. })) => largest_shape == name,
                (Want::NoGpus, Err(NoPlacement::NoGpuShapes { .. })) => true,
                (Want::UnknownSize, Err(NoPlacement::UnknownWeightSize { .. })) => true,
                _ => false,
            };
            assert!(ok, "{why}: wanted {want:?}, got {got:?}");
        }
    }

    #[test]
    fn reasons_tell_the_operator_what_to_change() {
        let spec = ModelSpec::new("llama-405b", 405_000, Quantization::Fp16);
        let e = place(&spec, &[shape("h100x8", GpuModel::H100, 8, 1)]).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("'llama-405b'") && msg.contains("'h100x8'") && msg.contains("640.0 GiB"), "{msg}");
        let e = place(&llama70b(Quantization::Fp16), &[shape("h100x2", GpuModel::H100, 2, 4)]).unwrap_err();
        assert!(e.to_string().contains("one fabric"), "{e}");
        let p = place(&llama70b(Quantization::Fp16), &[shape("h100x8", GpuModel::H100, 8, 1)]).unwrap();
        assert_eq!(p.to_string(), "'h100x8' (H100, tier 1): 1 node(s) × TP 4, fp16 weights, 132.8 GiB of 320.0 GiB");
    }

    /// A step of the rules, as a sortable key: (pipeline?, variant, least capable tier first, GPUs, stages).
    fn rank(spec: &ModelSpec, p: &Placement) -> (bool, usize, Reverse<u8>, u32, u32) {
        let v = spec.variants().position(|v| *v == p.variant).unwrap_or(usize::MAX);
        (p.pipeline_stages > 1, v, Reverse(p.tier()), p.gpus(), p.pipeline_stages)
    }

    fn arb_spec() -> impl Strategy<Value = ModelSpec> {
        let quant = prop_oneof![
            Just(Quantization::Fp32),
            Just(Quantization::Bf16),
            Just(Quantization::Fp8),
            Just(Quantization::Int4),
            Just(Quantization::Awq),
        ];
        (100u64..500_000, quant.clone(), 0u64..64 * 1024, proptest::collection::vec(quant, 0..3)).prop_map(
            |(params, q, kv, variants)| {
                let mut spec = ModelSpec::new("m", params, q).with_kv(KvHeadroom::Mib(kv));
                for (i, q) in variants.into_iter().enumerate() {
                    spec = spec.with_quantized(Variant::new(format!("v{i}"), q));
                }
                spec
            },
        )
    }

    fn arb_shape() -> impl Strategy<Value = NodeShape> {
        let gpus = [
            GpuModel::None,
            GpuModel::Gh200,
            GpuModel::H100,
            GpuModel::A100_80,
            GpuModel::A100_40,
            GpuModel::L40S,
            GpuModel::Rtx4090,
            GpuModel::Rtx3090,
            GpuModel::V100,
            GpuModel::Mi300x,
            GpuModel::Other,
        ];
        let links = [Interconnect::None, Interconnect::Pcie, Interconnect::NvLink, Interconnect::InfinityFabric];
        (0..gpus.len(), 0u8..=8, proptest::option::of(0..links.len()), 0u32..3, 0u32..4, 8u32..200).prop_map(
            move |(g, count, link, fabric, free, other_gib)| {
                let mut hw = Hardware::catalog(gpus[g], count);
                if gpus[g] == GpuModel::Other {
                    hw.vram_mib = other_gib * 1024;
                }
                if let Some(l) = link {
                    hw.interconnect = links[l];
                }
                hw.fabric = FabricId(fabric);
                NodeShape::new(format!("s{g}x{count}"), hw, free)
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn placements_respect_every_rule(spec in arb_spec(), shapes in proptest::collection::vec(arb_shape(), 0..6)) {
            let Ok(p) = place(&spec, &shapes) else { return Ok(()) };
            let shape = &shapes[p.shape];
            prop_assert_eq!(&shape.hardware, &p.hardware);
            // 1.25 × (weights + KV) per GPU, on GPUs that exist and are free.
            prop_assert!(p.vram_mib() * 100 >= p.need_mib * VRAM_RATIO_PERCENT);
            prop_assert_eq!(Some(p.need_mib), spec.need_mib(&p.variant));
            prop_assert!(p.hardware.gpu != GpuModel::None && p.hardware.vram_mib > 0);
            prop_assert!(p.tensor_parallel.is_power_of_two() && p.tensor_parallel <= p.hardware.gpu_count);
            prop_assert!(p.pipeline_stages >= 1 && p.pipeline_stages <= shape.free_nodes);
            // Splits only over fast links: TP over NVLink / Infinity Fabric, pipelines in one known fabric.
            if p.tensor_parallel > 1 {
                prop_assert!(matches!(p.hardware.interconnect, Interconnect::NvLink | Interconnect::InfinityFabric));
            }
            if p.pipeline_stages > 1 {
                prop_assert!(p.hardware.fabric != FabricId(0) && p.hardware.interconnect != Interconnect::Pcie);
            }
        }

        #[test]
        fn the_choice_is_the_best_any_single_shape_offers(
            spec in arb_spec(),
            shapes in proptest::collection::vec(arb_shape(), 1..6),
        ) {
            let all = place(&spec, &shapes);
            let alone: Vec<_> = shapes.iter().map(|s| place(&spec, core::slice::from_ref(s))).collect();
            match &all {
                Ok(p) => {
                    for (i, r) in alone.iter().enumerate() {
                        if let Ok(q) = r {
                            // Never a higher tier (or more GPUs, or a later rule) than another shape offers.
                            prop_assert!(rank(&spec, p) <= rank(&spec, q), "chose {} over shape {} alone: {}", p, i, q);
                        }
                    }
                    prop_assert!(alone[p.shape].as_ref().is_ok_and(|q| rank(&spec, q) == rank(&spec, p)));
                }
                Err(_) => prop_assert!(alone.iter().all(|r| r.is_err())),
            }
        }
    }
}
