//! `[[spin.partition]]`: the kinds of node jobs may ask for, as written and checked.

use serde::Deserialize;
use tela_core::hardware::GPU_CATALOG;
use tela_core::placement::NodeShape;
use tela_core::{FabricId, Hardware};

use super::error::{invalid, ConfigError};

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

pub(super) fn resolve_partition(p: &PartitionSection) -> Result<Partition, ConfigError> {
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
