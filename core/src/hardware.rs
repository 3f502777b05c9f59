//! Hardware capabilities of a serving node and the catalog of known GPUs and profiles.
//!
//! The catalog is shared by GPU discovery (which maps an NVML name onto a [`GpuModel`]), the
//! `--hardware-profile` fallback when no driver is present, and placement, which needs VRAM,
//! interconnect and tier per GPU.

use serde::{Deserialize, Serialize};

/// GPU models Tela knows by name. Anything else is [`GpuModel::Other`] with its VRAM from discovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum GpuModel {
    /// No GPU: a CPU-only node (the built-in engine simulator, llama.cpp on CPU).
    None,
    /// NVIDIA GH200 Grace Hopper, 96 GB HBM3.
    Gh200,
    /// NVIDIA H100 80 GB.
    H100,
    /// NVIDIA H200 141 GB.
    H200,
    /// NVIDIA A100 80 GB.
    A100_80,
    /// NVIDIA A100 40 GB.
    A100_40,
    /// NVIDIA L40S 48 GB.
    L40S,
    /// NVIDIA RTX 4090 24 GB.
    Rtx4090,
    /// NVIDIA RTX 3090 24 GB.
    Rtx3090,
    /// NVIDIA V100 32 GB.
    V100,
    /// AMD Instinct MI300X 192 GB.
    Mi300x,
    /// A GPU not in the catalog.
    Other,
}

/// How the GPUs inside one node talk to each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Interconnect {
    /// A single GPU or none: nothing to connect.
    None,
    /// PCIe only (possibly across a host bridge): tensor parallelism is slow.
    Pcie,
    /// NVLink / NVSwitch between all GPUs of the node.
    NvLink,
    /// AMD Infinity Fabric between all GPUs of the node.
    InfinityFabric,
}

/// Static facts about a catalog GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GpuSpec {
    /// The model.
    pub model: GpuModel,
    /// Short lowercase name used in profiles and logs (`h100`).
    pub name: &'static str,
    /// Memory per GPU in MiB.
    pub vram_mib: u32,
    /// Interconnect between GPUs of a typical multi-GPU node with this model.
    pub interconnect: Interconnect,
    /// Performance tier: 1 is the fastest; 0 means no GPU.
    pub tier: u8,
}

const GIB: u32 = 1024;

/// The GPU catalog, fastest tier first.
pub(crate) const GPU_CATALOG: &[GpuSpec] = &[
    GpuSpec { model: GpuModel::Gh200, name: "gh200", vram_mib: 96 * GIB, interconnect: Interconnect::NvLink, tier: 1 },
    GpuSpec { model: GpuModel::H200, name: "h200", vram_mib: 141 * GIB, interconnect: Interconnect::NvLink, tier: 1 },
    GpuSpec { model: GpuModel::H100, name: "h100", vram_mib: 80 * GIB, interconnect: Interconnect::NvLink, tier: 1 },
    GpuSpec {
        model: GpuModel::Mi300x,
        name: "mi300x",
        vram_mib: 192 * GIB,
        interconnect: Interconnect::InfinityFabric,
        tier: 1,
    },
    GpuSpec {
        model: GpuModel::A100_80,
        name: "a100-80",
        vram_mib: 80 * GIB,
        interconnect: Interconnect::NvLink,
        tier: 2,
    },
    GpuSpec {
        model: GpuModel::A100_40,
        name: "a100-40",
        vram_mib: 40 * GIB,
        interconnect: Interconnect::NvLink,
        tier: 2,
    },
    GpuSpec { model: GpuModel::L40S, name: "l40s", vram_mib: 48 * GIB, interconnect: Interconnect::Pcie, tier: 2 },
    GpuSpec { model: GpuModel::V100, name: "v100", vram_mib: 32 * GIB, interconnect: Interconnect::NvLink, tier: 3 },
    GpuSpec {
        model: GpuModel::Rtx4090,
        name: "rtx4090",
        vram_mib: 24 * GIB,
        interconnect: Interconnect::Pcie,
        tier: 3,
    },
    GpuSpec {
        model: GpuModel::Rtx3090,
        name: "rtx3090",
        vram_mib: 24 * GIB,
        interconnect: Interconnect::Pcie,
        tier: 3,
    },
];

impl GpuModel {
    /// The catalog entry, if this is a catalog GPU.
    pub(crate) fn spec(self) -> Option<&'static GpuSpec> {
        GPU_CATALOG.iter().find(|s| s.model == self)
    }

    /// The performance tier (1 fastest); 0 for no GPU, 4 for unknown GPUs.
    pub fn tier(self) -> u8 {
        match self {
            GpuModel::None => 0,
            GpuModel::Other => 4,
            m => m.spec().map_or(4, |s| s.tier),
        }
    }

    /// Maps a driver-reported product name (`"NVIDIA H100 80GB HBM3"`) onto the catalog.
    ///
    /// `vram_mib` tells the two A100 sizes apart.
    pub fn from_product_name(name: &str, vram_mib: u32) -> GpuModel {
        let n = name.to_ascii_lowercase();
        let has = |s: &str| n.contains(s);
        if has("gh200") {
            GpuModel::Gh200
        } else if has("h200") {
            GpuModel::H200
        } else if has("h100") {
            GpuModel::H100
        } else if has("a100") {
            if vram_mib > 48 * GIB {
                GpuModel::A100_80
            } else {
                GpuModel::A100_40
            }
        } else if has("l40s") {
            GpuModel::L40S
        } else if has("4090") {
            GpuModel::Rtx4090
        } else if has("3090") {
            GpuModel::Rtx3090
        } else if has("v100") {
            GpuModel::V100
        } else if has("mi300x") {
            GpuModel::Mi300x
        } else {
            GpuModel::Other
        }
    }
}

/// Identifies a fabric: nodes with the same non-zero fabric id share a fast interconnect
/// (one InfiniBand island), so pipeline splits across them are allowed. Zero means unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FabricId(pub u32);

/// The hardware a serving node offers.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Hardware {
    /// GPU model (all GPUs of a node are assumed alike).
    pub gpu: GpuModel,
    /// Number of GPUs visible to the engine.
    pub gpu_count: u8,
    /// Memory per GPU in MiB.
    pub vram_mib: u32,
    /// Interconnect between this node's GPUs.
    pub interconnect: Interconnect,
    /// The fabric this node sits on.
    pub fabric: FabricId,
}

impl Hardware {
    /// A node without GPUs.
    pub const CPU: Hardware = Hardware {
        gpu: GpuModel::None,
        gpu_count: 0,
        vram_mib: 0,
        interconnect: Interconnect::None,
        fabric: FabricId(0),
    };

    /// `count` catalog GPUs of `model`, with the catalog's VRAM and interconnect.
    pub fn catalog(model: GpuModel, count: u8) -> Hardware {
        let spec = model.spec();
        Hardware {
            gpu: model,
            gpu_count: count,
            vram_mib: spec.map_or(0, |s| s.vram_mib),
            interconnect: if count > 1 {
                spec.map_or(Interconnect::Pcie, |s| s.interconnect)
            } else {
                Interconnect::None
            },
            fabric: FabricId(0),
        }
    }

    /// Total GPU memory of the node in MiB.
    pub fn total_vram_mib(&self) -> u64 {
        u64::from(self.vram_mib) * u64::from(self.gpu_count)
    }

    /// Parses a hardware profile such as `gh200x4`, `a100-80x2`, `rtx4090` or `cpu`.
    ///
    /// The form is `<gpu>[x<count>]` with a catalog GPU name; `cpu` means no GPU.
    pub fn from_profile(profile: &str) -> Result<Hardware, ProfileError> {
        let p = profile.trim().to_ascii_lowercase();
        if p == "cpu" || p == "none" {
            return Ok(Hardware::CPU);
        }
        let find = |name: &str| GPU_CATALOG.iter().find(|s| s.name == name);
        let (spec, count) = match (find(&p), p.rsplit_once('x')) {
            (Some(spec), _) => (spec, 1),
            (None, Some((name, n))) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                let spec = find(name).ok_or_else(|| ProfileError::UnknownGpu(profile.to_string()))?;
                match n.parse::<u8>() {
                    Ok(count) if count > 0 => (spec, count),
                    _ => return Err(ProfileError::BadCount(profile.to_string())),
                }
            }
            _ => return Err(ProfileError::UnknownGpu(profile.to_string())),
        };
        Ok(Hardware::catalog(spec.model, count))
    }
}

/// Why a hardware profile string was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    /// The GPU name is not in the catalog.
    #[error("unknown hardware profile '{0}': use cpu or <gpu>[x<count>] with gpu one of {names}", names = catalog_names())]
    UnknownGpu(String),
    /// The count after `x` is zero or too large.
    #[error("bad GPU count in hardware profile '{0}': expected 1..=255")]
    BadCount(String),
}

fn catalog_names() -> String {
    GPU_CATALOG.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse_into_catalog_hardware() {
        let h = Hardware::from_profile("gh200x4").unwrap();
        assert_eq!(
            (h.gpu, h.gpu_count, h.vram_mib, h.interconnect),
            (GpuModel::Gh200, 4, 96 * 1024, Interconnect::NvLink)
        );
        let h = Hardware::from_profile("a100-80x2").unwrap();
        assert_eq!((h.gpu, h.gpu_count), (GpuModel::A100_80, 2));
        let h = Hardware::from_profile("rtx4090").unwrap();
        assert_eq!((h.gpu, h.gpu_count, h.interconnect), (GpuModel::Rtx4090, 1, Interconnect::None));
        assert_eq!(Hardware::from_profile("cpu").unwrap(), Hardware::CPU);
    }

    #[test]
    fn bad_profiles_say_what_is_accepted() {
        let e = Hardware::from_profile("tpu-v5x8").unwrap_err();
        assert!(e.to_string().contains("gh200"), "{e}");
        assert!(matches!(Hardware::from_profile("h100x0"), Err(ProfileError::BadCount(_))));
        assert!(matches!(Hardware::from_profile("h100x999"), Err(ProfileError::BadCount(_))));
    }

    #[test]
    fn product_names_map_onto_the_catalog() {
        assert_eq!(GpuModel::from_product_name("NVIDIA H100 80GB HBM3", 81559), GpuModel::H100);
        assert_eq!(GpuModel::from_product_name("NVIDIA H200", 143771), GpuModel::H200);
        assert_eq!(GpuModel::from_product_name("NVIDIA A100-SXM4-40GB", 40960), GpuModel::A100_40);
        assert_eq!(GpuModel::from_product_name("NVIDIA A100-SXM4-80GB", 81920), GpuModel::A100_80);
        assert_eq!(GpuModel::from_product_name("NVIDIA GeForce RTX 4090", 24564), GpuModel::Rtx4090);
        assert_eq!(GpuModel::from_product_name("Tesla T4", 15360), GpuModel::Other);
        assert_eq!(GpuModel::Other.tier(), 4);
        assert_eq!(GpuModel::None.tier(), 0);
    }
}
