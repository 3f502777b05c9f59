//! GPU discovery: what hardware a node announces.
//!
//! With an NVIDIA driver, NVML (loaded at run time; nothing is linked at build time) says
//! the GPU model ([`GpuModel::from_product_name`]), how many GPUs this process may use
//! (respecting `CUDA_VISIBLE_DEVICES`, as the engine will), their memory, and whether device 0
//! has an active NVLink (to another GPU directly, or through NVSwitch). Without a driver — a
//! CPU machine, a container without the driver mounted, a login node — the node logs one line
//! saying so and announces the `--hardware-profile` from the core's catalog instead.
//!
//! `tela hardware` (or `tela node --print-hardware`) prints the result, so discovery can be
//! checked on a GPU machine with one command (`.ci/gpu-check.sh`). On an NVIDIA H200 (driver
//! 580.159.04) that script finds `1 x H200, 143771 MiB per GPU`, follows every
//! `CUDA_VISIBLE_DEVICES` form it tries (index, UUID, UUID prefix, duplicates, empty, MIG,
//! missing index) as CUDA does, and `tela demo`'s nodes announce `1x H200` in `tela status`.

use nvml_wrapper::Nvml;
use std::fmt;
use tela_core::ProfileError;
use tela_core::{GpuModel, Hardware, Interconnect};

/// NVLink links per device that NVML can report.
const MAX_NVLINKS: u32 = 18;

/// One GPU as NVML described it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    /// NVML's device index.
    pub index: u32,
    /// The product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// The device UUID (`GPU-…`).
    pub uuid: String,
    /// Total memory in MiB.
    pub memory_mib: u32,
    /// Active NVLink links.
    pub active_nvlinks: u32,
}

/// Where the announced hardware came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HardwareSource {
    /// Discovered with NVML.
    Nvml {
        /// The driver version.
        driver: String,
        /// The GPUs this process may use.
        gpus: Vec<GpuInfo>,
    },
    /// The `--hardware-profile` fallback.
    Profile {
        /// The profile.
        profile: String,
        /// Why discovery did not apply.
        reason: String,
    },
}

/// The hardware to announce and how it was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Discovery {
    /// What the node announces.
    pub hardware: Hardware,
    /// How it was found.
    pub source: HardwareSource,
}

impl fmt::Display for Discovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = &self.hardware;
        if h.gpu_count == 0 {
            writeln!(f, "hardware: no GPU")?;
        } else {
            writeln!(
                f,
                "hardware: {} x {:?}, {} MiB per GPU, interconnect {:?}",
                h.gpu_count, h.gpu, h.vram_mib, h.interconnect
            )?;
        }
        match &self.source {
            HardwareSource::Nvml { driver, gpus } => {
                writeln!(f, "source: NVML (driver {driver})")?;
                for g in gpus {
                    writeln!(
                        f,
                        "  gpu {}: {} ({}), {} MiB, {} active NVLink links",
                        g.index, g.name, g.uuid, g.memory_mib, g.active_nvlinks
                    )?;
                }
                Ok(())
            }
            HardwareSource::Profile { profile, reason } => {
                writeln!(f, "source: hardware profile '{profile}' ({reason})")
            }
        }
    }
}

impl Discovery {
    /// The result as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let h = &self.hardware;
        let source = match &self.source {
            HardwareSource::Nvml { driver, gpus } => serde_json::json!({
                "kind": "nvml",
                "driver": driver,
                "gpus": gpus.iter().map(|g| serde_json::json!({
                    "index": g.index, "name": g.name, "uuid": g.uuid,
                    "memory_mib": g.memory_mib, "active_nvlinks": g.active_nvlinks,
                })).collect::<Vec<_>>(),
            }),
            HardwareSource::Profile { profile, reason } => serde_json::json!({
                "kind": "profile", "profile": profile, "reason": reason,
            }),
        };
        serde_json::json!({
            "gpu": format!("{:?}", h.gpu),
            "gpu_count": h.gpu_count,
            "vram_mib": h.vram_mib,
            "interconnect": format!("{:?}", h.interconnect),
            "source": source,
        })
    }
}

/// Discovers the GPUs, or falls back to `profile` (logging one line that says why).
pub fn discover(profile: &str) -> Result<Discovery, ProfileError> {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    match discover_nvml(visible.as_deref()) {
        Ok(d) => Ok(d),
        Err(reason) => {
            let hardware = Hardware::from_profile(profile)?;
            tracing::info!("{reason}; using hardware profile '{profile}' from --hardware-profile");
            let reason = reason.to_string();
            Ok(Discovery { hardware, source: HardwareSource::Profile { profile: profile.to_string(), reason } })
        }
    }
}

/// Why NVML does not describe this node's GPUs; its text is the fallback line. Nothing is
/// changed: discovery falls back to the hardware profile.
#[derive(Debug, thiserror::Error)]
enum NvmlError {
    /// NVML would not start: no driver, or no GPU machine.
    #[error("no NVIDIA driver found ({0})")]
    NoDriver(#[source] nvml_wrapper::error::NvmlError),
    /// The driver would not count its GPUs.
    #[error("the NVIDIA driver cannot list GPUs ({0})")]
    CannotList(#[source] nvml_wrapper::error::NvmlError),
    /// The driver would not open one GPU.
    #[error("the NVIDIA driver cannot open GPU {index} ({source})")]
    CannotOpen {
        /// The GPU's NVML index.
        index: u32,
        /// What the driver said.
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// GPUs exist, but `CUDA_VISIBLE_DEVICES` hides all of them.
    #[error(
        "NVIDIA driver {driver} found, but no GPU is visible to this process ({count} present, CUDA_VISIBLE_DEVICES={})",
        .visible.as_deref().unwrap_or("<unset>")
    )]
    NoneVisible {
        /// The driver version.
        driver: String,
        /// GPUs present.
        count: u32,
        /// `CUDA_VISIBLE_DEVICES`, if set.
        visible: Option<String>,
    },
}

/// NVML's view, or why it does not apply (the text of the fallback line).
fn discover_nvml(visible: Option<&str>) -> Result<Discovery, NvmlError> {
    let nvml = Nvml::init().map_err(NvmlError::NoDriver)?;
    let driver = nvml.sys_driver_version().unwrap_or_else(|_| "unknown".into());
    let count = nvml.device_count().map_err(NvmlError::CannotList)?;
    let mut all = Vec::new();
    for index in 0..count {
        let device = nvml.device_by_index(index).map_err(|source| NvmlError::CannotOpen { index, source })?;
        let memory_mib =
            device.memory_info().map(|m| u32::try_from(m.total / (1024 * 1024)).unwrap_or(u32::MAX)).unwrap_or(0);
        let active_nvlinks =
            (0..MAX_NVLINKS).filter(|&l| device.link_wrapper_for(l).is_active().unwrap_or(false)).count() as u32;
        all.push(GpuInfo {
            index,
            name: device.name().unwrap_or_else(|_| "unknown".into()),
            uuid: device.uuid().unwrap_or_default(),
            memory_mib,
            active_nvlinks,
        });
    }
    let gpus = select_visible(&all, visible);
    if gpus.is_empty() {
        return Err(NvmlError::NoneVisible { driver, count, visible: visible.map(str::to_string) });
    }
    let hardware = hardware_of(&gpus);
    Ok(Discovery { hardware, source: HardwareSource::Nvml { driver, gpus } })
}

/// The node's hardware from its visible GPUs (all assumed alike; the smallest memory counts).
pub fn hardware_of(gpus: &[GpuInfo]) -> Hardware {
    let Some(first) = gpus.first() else {
        return Hardware::CPU;
    };
    let vram_mib = gpus.iter().map(|g| g.memory_mib).min().unwrap_or(0);
    let count = u8::try_from(gpus.len()).unwrap_or(u8::MAX);
    // Any active link on the first visible GPU means the GPUs talk over NVLink, directly
    // or through NVSwitch (whose links end at the switch, not at another GPU).
    let interconnect = if count < 2 {
        Interconnect::None
    } else if first.active_nvlinks > 0 {
        Interconnect::NvLink
    } else {
        Interconnect::Pcie
    };
    Hardware {
        gpu: GpuModel::from_product_name(&first.name, first.memory_mib),
        gpu_count: count,
        vram_mib,
        interconnect,
        fabric: tela_core::FabricId(0),
    }
}

/// The GPUs `CUDA_VISIBLE_DEVICES` lets this process use, in its order. As CUDA does: unset
/// means all; entries are indices, or UUIDs (a unique prefix of `GPU-…` suffices); the list
/// stops at the first entry that matches nothing; an empty value means none. MIG instances
/// (`MIG-…`) are not GPUs Tela can announce and end the list too.
pub fn select_visible(all: &[GpuInfo], visible: Option<&str>) -> Vec<GpuInfo> {
    let Some(list) = visible else {
        return all.to_vec();
    };
    let mut out: Vec<GpuInfo> = Vec::new();
    for entry in list.split(',').map(str::trim) {
        let found = if let Ok(i) = entry.parse::<u32>() {
            all.iter().find(|g| g.index == i)
        } else if entry.starts_with("GPU-") {
            let matches: Vec<&GpuInfo> = all.iter().filter(|g| g.uuid.starts_with(entry)).collect();
            if matches.len() == 1 {
                Some(matches[0])
            } else {
                None
            }
        } else {
            None
        };
        match found {
            Some(g) if !out.iter().any(|o| o.index == g.index) => out.push(g.clone()),
            Some(_) => {}
            None => break,
        }
    }
    out
}

/// Print what GPU discovery finds on this machine: the hardware `tela node` would announce
/// (NVML when an NVIDIA driver is present, else the --hardware-profile).
#[derive(Debug, Clone, clap::Args)]
pub struct HardwareArgs {
    /// The profile to fall back to when no NVIDIA driver is found (cpu, gh200x4, a100-80x2,
    /// rtx4090, ...).
    #[arg(long, env = "TELA_HARDWARE_PROFILE", default_value = "cpu", value_name = "PROFILE")]
    pub hardware_profile: String,

    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

impl HardwareArgs {
    /// Discovers and prints.
    pub fn run(&self) -> Result<(), ProfileError> {
        let d = discover(&self.hardware_profile)?;
        if self.json {
            println!("{}", d.to_json());
        } else {
            print!("{d}");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, name: &str, mib: u32, links: u32) -> GpuInfo {
        GpuInfo {
            index,
            name: name.into(),
            uuid: format!("GPU-{index}a{index}b-0000"),
            memory_mib: mib,
            active_nvlinks: links,
        }
    }

    #[test]
    fn visible_devices_follow_cuda_rules() {
        let all: Vec<GpuInfo> = (0..4).map(|i| gpu(i, "NVIDIA H100 80GB HBM3", 81559, 18)).collect();
        assert_eq!(select_visible(&all, None).len(), 4);
        assert_eq!(select_visible(&all, Some("")).len(), 0);
        let idx: Vec<u32> = select_visible(&all, Some("2,0")).iter().map(|g| g.index).collect();
        assert_eq!(idx, vec![2, 0]);
        let idx: Vec<u32> = select_visible(&all, Some("1,7,2")).iter().map(|g| g.index).collect();
        assert_eq!(idx, vec![1], "the list stops at an invalid entry");
        let idx: Vec<u32> = select_visible(&all, Some("GPU-3a3b,1,1")).iter().map(|g| g.index).collect();
        assert_eq!(idx, vec![3, 1], "uuid prefixes work and duplicates count once");
        assert!(select_visible(&all, Some("MIG-abc")).is_empty());
        assert!(select_visible(&all, Some("-1")).is_empty());
    }

    #[test]
    fn hardware_comes_from_the_visible_gpus() {
        let four: Vec<GpuInfo> = (0..4).map(|i| gpu(i, "NVIDIA H200", 143771, 18)).collect();
        let h = hardware_of(&four);
        assert_eq!((h.gpu, h.gpu_count, h.vram_mib, h.interconnect), (GpuModel::H200, 4, 143771, Interconnect::NvLink));
        let pcie: Vec<GpuInfo> = (0..2).map(|i| gpu(i, "NVIDIA GeForce RTX 4090", 24564, 0)).collect();
        assert_eq!(hardware_of(&pcie).interconnect, Interconnect::Pcie);
        let one = [gpu(0, "NVIDIA A100-SXM4-40GB", 40960, 12)];
        let h = hardware_of(&one);
        assert_eq!((h.gpu, h.interconnect), (GpuModel::A100_40, Interconnect::None));
        assert_eq!(hardware_of(&[]), Hardware::CPU);
    }

    #[test]
    fn without_a_driver_the_profile_is_used_and_says_why() {
        // This machine has no NVIDIA driver; on one that has, discovery must not fail either.
        let d = discover("a100-80x2").expect("valid profile");
        if let HardwareSource::Profile { profile, reason } = &d.source {
            assert_eq!(profile, "a100-80x2");
            assert!(reason.contains("NVIDIA"), "{reason}");
            assert_eq!((d.hardware.gpu, d.hardware.gpu_count), (GpuModel::A100_80, 2));
        }
        assert!(d.to_string().starts_with("hardware: "));
        if matches!(d.source, HardwareSource::Profile { .. }) {
            assert!(discover("tpu").is_err(), "a bad profile is an error when it is needed");
        }
    }
}
