//! Hosts: the machines of the simulation (gateways and serving nodes), each with its own
//! skewed clock, the process on it if any, its connections and its requests in flight.

use super::{Micros, Sim};
use rand::Rng;
use std::collections::BTreeSet;
use tela_core::{Hardware, Lifecycle, Model, Node, NodeId, Time};

/// Added to every local clock so that negative offsets never reach zero.
const CLOCK_BASE: i128 = 10_000_000_000;

/// A machine in the simulation: a gateway or a serving node, and the process on it if any.
#[derive(Debug)]
pub(crate) struct Host {
    pub id: NodeId,
    pub gateway: bool,
    pub public: bool,
    pub site: u32,
    offset_us: i128,
    drift_ppm: i128,
    pub node: Option<Node>,
    /// Incarnation counter: events for an earlier job are stale.
    pub job: u32,
    /// The global time of the node's pending wake-up (`Micros::MAX`: none).
    pub(super) wake_at: Micros,
    /// Outbound-only hosts: peers this host sent to, and until when the NAT keeps the path.
    pub(super) nat: Vec<(u32, Micros)>,
    /// Hosts with a live connection to this one.
    pub links: BTreeSet<u32>,
    /// Requests in flight on this (serving) host.
    pub in_flight: Vec<u32>,
    /// The node's own lifecycle state, mirrored from its events.
    pub state: Lifecycle,
    /// The current job is ending (walltime or preemption): its drain counts in the drain report.
    pub ending: bool,
    /// When the current job's walltime ends, if it does within the run.
    pub walltime: Option<Micros>,
    pub models: Vec<Model>,
    pub hardware: Hardware,
    /// Gateways only: requests in flight per serving host.
    pub gw_load: Vec<(u32, u32)>,
}

impl Host {
    pub fn running(&self) -> bool {
        self.node.is_some()
    }

    /// This host's clock at global time `g`.
    pub fn local(&self, g: Micros) -> Time {
        let g = i128::from(g);
        let l = CLOCK_BASE + self.offset_us + g + g * self.drift_ppm / 1_000_000;
        Time(l.max(0) as u64)
    }

    /// The earliest global time at which this host's clock reads at least `l`.
    pub(super) fn global_of(&self, l: Time, not_before: Micros) -> Micros {
        if l == Time::NEVER {
            return Micros::MAX;
        }
        let num = (i128::from(l.0) - CLOCK_BASE - self.offset_us) * 1_000_000;
        let mut g = (num / (1_000_000 + self.drift_ppm)).max(i128::from(not_before)) as Micros;
        // The estimate can be off by a few microseconds either way (integer rounding of drift).
        while g > not_before && self.local(g - 1) >= l {
            g -= 1;
        }
        while self.local(g) < l {
            g += 1;
        }
        g
    }

    pub fn load_of(&self, node: u32) -> u32 {
        self.gw_load.iter().find(|(n, _)| *n == node).map_or(0, |(_, c)| *c)
    }

    pub fn add_load(&mut self, node: u32, delta: i32) {
        match self.gw_load.iter_mut().find(|(n, _)| *n == node) {
            Some((_, c)) => *c = c.saturating_add_signed(delta),
            None if delta > 0 => self.gw_load.push((node, delta as u32)),
            None => {}
        }
        self.gw_load.retain(|(_, c)| *c > 0);
    }
}

/// The host index behind a node id.
pub(crate) fn host_of(id: &NodeId) -> u32 {
    (id.short() as u32).wrapping_sub(1)
}

/// The node id of a host index.
pub(crate) fn id_of(h: u32) -> NodeId {
    NodeId::from_u64(u64::from(h) + 1)
}

impl Sim {
    /// Adds a host with a clock offset and drift drawn from the world stream.
    pub(crate) fn new_host(&mut self, gateway: bool, public: bool, site: u32, hardware: Hardware, models: Vec<Model>) {
        let c = &self.sc.clock;
        let offset =
            if c.max_offset_ms > 0.0 { self.world_rng.random_range(-c.max_offset_ms..c.max_offset_ms) } else { 0.0 };
        let drift =
            if c.max_drift_ppm > 0.0 { self.world_rng.random_range(-c.max_drift_ppm..c.max_drift_ppm) } else { 0.0 };
        let h = self.hosts.len() as u32;
        self.hosts.push(Host {
            id: id_of(h),
            gateway,
            public,
            site,
            offset_us: (offset * 1e3) as i128,
            drift_ppm: drift as i128,
            node: None,
            job: 0,
            wake_at: Micros::MAX,
            nat: Vec::new(),
            links: BTreeSet::new(),
            in_flight: Vec::new(),
            state: Lifecycle::Left,
            ending: false,
            walltime: None,
            models,
            hardware,
            gw_load: Vec::new(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skewed_clocks_map_deadlines_back_exactly() {
        for (offset, drift) in [(0, 0), (-2_000_000, 80), (1_500_000, -90), (3, 1)] {
            let h = Host {
                id: id_of(0),
                gateway: false,
                public: true,
                site: 0,
                offset_us: offset,
                drift_ppm: drift,
                node: None,
                job: 0,
                wake_at: 0,
                nat: vec![],
                links: BTreeSet::new(),
                in_flight: vec![],
                state: Lifecycle::Join,
                ending: false,
                walltime: None,
                models: vec![],
                hardware: Hardware::CPU,
                gw_load: vec![],
            };
            for g in [0u64, 1, 999_999, 123_456_789, 600_000_000] {
                let l = h.local(g);
                let back = h.global_of(l, 0);
                assert!(h.local(back) >= l && back <= g, "offset {offset} drift {drift} g {g} back {back}");
                assert!(back == 0 || h.local(back - 1) < l);
                assert!(h.local(g + 1) >= l, "clocks never go backwards");
            }
        }
    }
}
