//! What a run costs the simulator: events by kind and by simulated second, and resident memory.

use serde::Serialize;

/// Events per simulated second, per node: what the protocol's busiest moments cost.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Seconds {
    /// The simulated second with the most events (second `i` is `[i, i + 1)` s).
    pub busiest_at_s: u64,
    /// Its events per node.
    pub busiest_per_node: f64,
    /// Events per node in the first second after the first scheduled partition healed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heal_first_per_node: Option<f64>,
    /// Events in every simulated second, all nodes together.
    pub events: Vec<u64>,
}

impl Seconds {
    pub(crate) fn build(events: &[u64], nodes: usize, partitions: &[crate::scenario::Partition]) -> Seconds {
        let per_node = |n: u64| n as f64 / nodes.max(1) as f64;
        let (busiest_at_s, busiest) = events
            .iter()
            .enumerate()
            .max_by_key(|&(i, n)| (*n, core::cmp::Reverse(i)))
            .map_or((0, 0), |(i, n)| (i as u64, *n));
        let heal = partitions.first().map(|p| p.end_s.floor() as usize);
        Seconds {
            busiest_at_s,
            busiest_per_node: per_node(busiest),
            heal_first_per_node: heal.and_then(|s| events.get(s)).map(|n| per_node(*n)),
            events: events.to_vec(),
        }
    }

    /// One line for the summary.
    pub fn line(&self) -> String {
        let heal = self.heal_first_per_node.map_or(String::new(), |h| format!("; the heal's first second {h:.0}"));
        format!("events per node in the busiest second {:.0} (at {} s){heal}", self.busiest_per_node, self.busiest_at_s)
    }
}

/// Events by kind: a node's timer firing, a datagram arriving, and the world's own (jobs,
/// faults, clients, samples).
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct EventKinds {
    /// A node woken at the deadline its state machine asked for (stale wakes, for a deadline
    /// the node has moved since, included: they are events all the same).
    pub wakes: u64,
    /// A datagram delivered (or dropped at a stopped host or a NAT).
    pub deliveries: u64,
    /// Everything else.
    pub other: u64,
}

impl EventKinds {
    /// Counts one event.
    pub(crate) fn count(&mut self, kind: &crate::sim::Kind) {
        match kind {
            crate::sim::Kind::Wake(_) => self.wakes += 1,
            crate::sim::Kind::Deliver { .. } => self.deliveries += 1,
            _ => self.other += 1,
        }
    }

    /// `n` as a percentage of all events counted.
    pub fn share(&self, n: u64) -> f64 {
        100.0 * n as f64 / (self.wakes + self.deliveries + self.other).max(1) as f64
    }
}

/// Resident memory now, in MB (Linux; 0 elsewhere).
pub fn current_rss_mb() -> u64 {
    proc_status_kb("VmRSS:") / 1024
}

/// Peak resident memory, in MB (Linux; 0 elsewhere).
pub fn peak_rss_mb() -> u64 {
    proc_status_kb("VmHWM:") / 1024
}

fn proc_status_kb(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_second_and_the_heals_first_are_per_node() {
        let partition = crate::scenario::Partition { start_s: 1.0, end_s: 3.0, sites: vec![1], one_way: false };
        let s = Seconds::build(&[10, 40, 40, 30, 5], 10, &[partition]);
        // Ties go to the earlier second.
        assert_eq!((s.busiest_at_s, s.busiest_per_node), (1, 4.0));
        assert_eq!(s.heal_first_per_node, Some(3.0));
        assert!(s.line().contains("busiest second 4 (at 1 s); the heal's first second 3"), "{}", s.line());
        let none = Seconds::build(&[], 10, &[]);
        assert_eq!((none.busiest_per_node, none.heal_first_per_node), (0.0, None));
    }
}
