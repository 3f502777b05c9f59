//! `[[spin.partition]]`: the kinds of node jobs may ask for, checked: the core's hardware checks
//! ([`PartitionSection::hardware`]) and the batch system's keys (account, QoS, CPUs).

use tela_core::placement::NodeShape;
use tela_core::spin::config::PartitionSection;
use tela_core::Hardware;

use super::error::{invalid, ConfigError};

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
    let key = |field: &str| p.key(field);
    let (profile, hardware) = p.hardware()?;
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
