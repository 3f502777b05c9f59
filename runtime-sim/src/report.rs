//! The run report: a human summary on stdout and a JSON file.
//!
//! This module holds the report itself and builds it from a finished run; `sections` holds its
//! parts, `summary` the human text, `cost` what the run cost the simulator, `serf` the reference
//! estimate.

mod cost;
mod sections;
mod serf;
mod summary;

pub use cost::{current_rss_mb, peak_rss_mb, EventKinds, Seconds};
pub use sections::{Convergence, Detection, Drain, DrainPart, Jobs, Liveness, Percentiles, Requests};
pub use serf::{serf_fraction, serf_rounds};

use crate::sim::{micros, Micros, Sim};
use crate::track::{Converged, Curve};
use serde::Serialize;

/// Everything a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Serving nodes plus gateways.
    pub nodes: usize,
    /// Root seed.
    pub seed: u64,
    /// Swarm mode (fault mix drawn from the seed).
    pub swarm: bool,
    /// Simulated seconds run.
    pub sim_s: f64,
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// Of those, the seconds spent building the world before the first event: in a formed
    /// federation, every replica restoring every record.
    pub setup_wall_s: f64,
    /// Events processed.
    pub events: u64,
    /// Events per wall-clock second of the event loop (setup excluded).
    pub events_per_s: f64,
    /// The events by what they were: what a node costs the simulator.
    pub events_by_kind: EventKinds,
    /// Events by simulated second: the busiest and the heal's first.
    pub seconds: Seconds,
    /// Peak resident memory.
    pub peak_rss_mb: u64,
    /// Where the memory was when the most was live ([`crate::heap`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heap: Option<crate::heap::HeapSample>,
    /// Determinism hash over the event trace: equal for equal scenario and seed.
    pub hash: String,
    /// Largest datagram sent.
    pub max_datagram_bytes: usize,
    /// Datagrams sent.
    pub datagrams: u64,
    /// Connections closed by the idle timeout: the peers' sides of a killed process's, and
    /// those a partition cut for that long.
    pub connections_timed_out: u64,
    /// Bytes sent per node per simulated second, averaged over the run.
    pub bytes_per_node_per_s: f64,
    /// Bytes per node per second over the last 10 seconds (steady state).
    pub bytes_per_node_per_s_tail: f64,
    /// Record-change propagation.
    pub convergence: Convergence,
    /// Failure detection.
    pub detection: Detection,
    /// Client requests.
    pub requests: Requests,
    /// Drains and the in-flight completion.
    pub drain: Drain,
    /// Batch-job ends and preemptions.
    pub jobs: Jobs,
    /// Model spinning, for scenarios that spin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spin: Option<crate::report_spin::SpinReport>,
    /// Forged records from lying nodes, for scenarios with liars.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authenticity: Option<crate::liar::AuthReport>,
    /// Liveness phase.
    pub liveness: Liveness,
    /// The effective network faults (after swarm draws).
    pub network: crate::scenario::Network,
    /// Partitions applied.
    pub partitions: usize,
    /// Invariant violations (a run with any fails).
    pub violation: Option<String>,
    /// Why the run stopped early, if it did.
    pub aborted: Option<String>,
    /// Bytes sent in each simulated second, all nodes together.
    #[serde(skip)]
    pub per_second_bytes: Vec<u64>,
    /// Spreading curves of completed changes.
    #[serde(skip)]
    pub curves: Vec<Curve>,
    /// Gossip fanout (for the Serf reference line).
    #[serde(skip)]
    pub fanout: u32,
    /// Gossip interval in ms (for the Serf reference line).
    #[serde(skip)]
    pub gossip_interval_ms: u64,
}

/// Percentiles, in ms, of `until(c) - c.t0` over the changes `c` that pass `keep`.
fn ms(converged: &[Converged], keep: impl Fn(&Converged) -> bool, until: impl Fn(&Converged) -> Micros) -> Percentiles {
    Percentiles::of(converged.iter().filter(|c| keep(c)).map(|c| (until(c) - c.t0) as f64 / 1e3).collect())
}

impl Report {
    pub(crate) fn build(sim: &Sim, wall_s: f64) -> Report {
        let t = &sim.t;
        let nodes = sim.hosts.len();
        let sim_s = sim.now as f64 / 1e6;
        let tail: Vec<u64> = t.per_second.iter().rev().take(10).copied().collect();
        let tail_bps =
            if tail.is_empty() { 0.0 } else { tail.iter().sum::<u64>() as f64 / tail.len() as f64 / nodes as f64 };
        // Every node gossips at the core's default pace: a scenario sets no gossip interval or fanout.
        let membership = tela_core::MembershipSettings::default();
        let fanout = membership.gossip_fanout as u32;
        let gossip_interval_ms = membership.gossip_interval.as_millis() as u64;
        let serf_ms =
            serf_rounds(nodes as f64, f64::from(fanout), sim.sc.network.loss, 0.9999) * gossip_interval_ms as f64;
        // Changes made once formed; of those, the ones whose spreading no partition overlapped.
        let settled = |c: &Converged| c.t0 >= t.settle_at;
        let clear = |c: &Converged| {
            settled(c) && !sim.partitions.iter().any(|p| micros(p.start_s) <= c.all && c.t0 <= micros(p.end_s))
        };
        let running = || sim.hosts.iter().filter_map(|h| h.node.as_ref()).map(|n| n.stats());
        let false_down = running().map(|s| s.refutations).sum();
        let marks_signed = running().map(|s| s.confirmed_down).sum();
        let in_flight_end = t.requests.iter().filter(|r| !r.is_done()).count() as u64;
        let unfinished = in_flight_end + sim.spin_waiting();
        let mut violation = sim.violation.clone();
        if violation.is_none() && sim.aborted.is_none() && t.completed + t.failed + unfinished != t.sent {
            violation = Some(format!(
                "request accounting: {} sent but {} completed + {} failed + {} unfinished",
                t.sent, t.completed, t.failed, unfinished
            ));
        }
        let drain_unfinished = t.drain_in_flight.saturating_sub(t.drain_completed + t.drain_failed);
        let answered = t.drain_completed + t.drain_failed;
        let changes_pending = t.changes_pending(sim.now);
        let detections_pending = t.detections_pending(sim.now);
        Report {
            scenario: sim.sc.name.clone(),
            nodes,
            seed: sim.seed,
            swarm: sim.swarm,
            sim_s,
            wall_s,
            setup_wall_s: sim.setup_wall_s,
            events: sim.events,
            events_per_s: sim.events as f64 / (wall_s - sim.setup_wall_s).max(1e-9),
            events_by_kind: sim.events_by_kind,
            seconds: Seconds::build(&t.events_per_second, nodes, &sim.sc.partition),
            peak_rss_mb: peak_rss_mb(),
            heap: sim.heap.clone(),
            hash: format!("{:016x}", sim.trace_hash()),
            max_datagram_bytes: t.max_datagram,
            datagrams: t.datagrams,
            connections_timed_out: t.connections_timed_out,
            bytes_per_node_per_s: t.bytes as f64 / nodes.max(1) as f64 / sim_s.max(1e-9),
            bytes_per_node_per_s_tail: tail_bps,
            convergence: Convergence {
                latency: ms(&t.converged, |_| true, |c| c.all),
                incomplete: t.convergence_incomplete,
                pending_at_end: changes_pending.0,
                oldest_pending_ms: changes_pending.1,
                serf_bound_ms: serf_ms,
                settled: ms(&t.converged, settled, |c| c.all),
                apart_from_partitions: ms(&t.converged, clear, |c| c.all),
                apart_from_partitions_9999: ms(&t.converged, clear, |c| c.most),
                changes: t
                    .converged
                    .iter()
                    .map(|c| (c.t0 as f64 / 1e6, (c.all - c.t0) as f64 / 1e3, (c.most - c.t0) as f64 / 1e3))
                    .collect(),
            },
            detection: Detection {
                all_nodes: Percentiles::of(t.detection_ms.clone()),
                gateways: Percentiles::of(t.detection_gateway_ms.clone()),
                gateways_registry: Percentiles::of(t.detection_gateway_registry_ms.clone()),
                by_connection: t.detection_by_connection,
                incomplete: t.detection_incomplete,
                restarted_first: t.detection_restarted_first,
                pending_at_end: detections_pending.0,
                oldest_pending_ms: detections_pending.1,
                false_unroutable: t.false_unroutable,
                false_down,
                marks_signed,
            },
            requests: Requests {
                sent: t.sent,
                completed: t.completed,
                failed: t.failed,
                retries: t.retries,
                no_capacity: t.no_capacity,
                mid_stream: t.mid_stream,
                unfinished,
            },
            drain: Drain {
                drains: t.drains,
                in_flight: t.drain_in_flight,
                completed: t.drain_completed,
                failed: t.drain_failed,
                gateway_lost: t.drain_gateway_lost,
                unfinished: drain_unfinished,
                completion_percent: if answered == 0 {
                    100.0
                } else {
                    100.0 * t.drain_completed as f64 / answered as f64
                },
                walltime: DrainPart::of(&t.drain_by_cause[0]),
                preemption: DrainPart::of(&t.drain_by_cause[1]),
                release: DrainPart::of(&t.drain_by_cause[2]),
            },
            jobs: Jobs {
                preemptions_scheduled: t.preemptions_scheduled,
                preemptions: t.preemptions,
                preempt_kills: t.preempt_kills,
                walltime_kills: t.walltime_kills,
                clean_exits: t.clean_exits,
            },
            spin: sim.spin.as_ref().map(|s| crate::report_spin::SpinReport::build(sim, s)),
            authenticity: sim.liar.as_ref().map(|l| l.report()),
            liveness: Liveness {
                bound_s: sim.sc.liveness_bound_s,
                converged_after_ms: t.liveness_converged.map(|m| m as f64 / 1e3),
            },
            network: sim.sc.network.clone(),
            partitions: sim.partitions.len(),
            violation,
            aborted: sim.aborted.clone(),
            per_second_bytes: t.per_second.clone(),
            curves: t.curves.clone(),
            fanout,
            gossip_interval_ms,
        }
    }

    /// True when the run finished with no violation and the liveness phase converged.
    pub fn passed(&self) -> bool {
        self.violation.is_none() && self.aborted.is_none() && self.liveness.converged_after_ms.is_some()
    }
}
