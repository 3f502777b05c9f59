//! The report's sections: latency percentiles, record-change convergence, failure detection,
//! client requests, drains, batch jobs and the liveness phase.

use crate::track::quantile;
use serde::Serialize;

/// Percentiles of a latency sample, in milliseconds.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Percentiles {
    /// Samples.
    pub count: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Maximum.
    pub p100_ms: f64,
}

impl Percentiles {
    pub(super) fn of(mut v: Vec<f64>) -> Percentiles {
        Percentiles {
            count: v.len(),
            p50_ms: quantile(&mut v, 0.5),
            p99_ms: quantile(&mut v, 0.99),
            p100_ms: quantile(&mut v, 1.0),
        }
    }
}

/// Record-change propagation.
#[derive(Clone, Debug, Serialize)]
pub struct Convergence {
    /// Time for a change to reach every node live at the change.
    #[serde(flatten)]
    pub latency: Percentiles,
    /// Tracked changes that had not reached everyone after 120 s.
    pub incomplete: u64,
    /// Tracked changes still spreading when the run ended (younger than 120 s).
    pub pending_at_end: u64,
    /// The age of the oldest of those at the end, in ms (0 when none).
    pub oldest_pending_ms: f64,
    /// Serf's logistic estimate for 99.99% of nodes, for this size, fanout, interval and loss.
    pub serf_bound_ms: f64,
    /// The same for the changes that began once the federation had formed (a minute after the
    /// scenario's last initial join), apart from the join storm.
    pub settled: Percentiles,
    /// Of those, the changes whose spreading overlapped no partition (from its start to its
    /// heal): the protocol's figure to hold against Serf's bound, which assumes no cut.
    pub apart_from_partitions: Percentiles,
    /// For those changes, the time to reach 99.99% of the nodes that must learn them: what
    /// Serf's bound estimates (at 10,000 nodes, all but one).
    pub apart_from_partitions_9999: Percentiles,
    /// Every change that reached everyone, in the order they did: (when it began, in simulated
    /// seconds; ms until every node had it; ms until 99.99% of them did), to see convergence by
    /// phase of the run (`runtime-sim/results/phases.py`).
    pub changes: Vec<(f64, f64, f64)>,
}

/// Failure detection.
#[derive(Clone, Debug, Serialize)]
pub struct Detection {
    /// From a silent kill to every node that routed to it having stopped.
    #[serde(flatten)]
    pub all_nodes: Percentiles,
    /// From a silent kill to every gateway having stopped routing to it: its registry marked
    /// it unroutable or its connection to it timed out, whichever came first.
    pub gateways: Percentiles,
    /// From a silent kill to every gateway's registry having marked it unroutable: the
    /// membership protocol's own figure, connections aside.
    pub gateways_registry: Percentiles,
    /// Gateways that stopped routing to a victim at their connection's idle timeout, before
    /// their registry marked it.
    pub by_connection: u64,
    /// Kills whose detection had not completed after 120 s.
    pub incomplete: u64,
    /// Kills whose victim restarted before every node that routed to it had stopped (a node
    /// that learns of the new process first never marks the old one unroutable); not in the
    /// figures above.
    pub restarted_first: u64,
    /// Kills some node still routed to when the run ended (younger than 120 s).
    pub pending_at_end: u64,
    /// The age of the oldest of those at the end, in ms (0 when none).
    pub oldest_pending_ms: f64,
    /// Times a node marked a live, serving node unroutable (a node marking itself as it drains,
    /// and nodes an active partition separates, aside).
    pub false_unroutable: u64,
    /// Refutations: nodes that heard themselves declared DOWN while alive (false DOWN marks).
    pub false_down: u64,
    /// DOWN marks signed: confirmations by a node's own failure detector (rather than by a DOWN
    /// record heard first), summed over the nodes running at the end. A kill that every node
    /// confirms on its own costs one signed record per node.
    pub marks_signed: u64,
}

/// Client requests.
#[derive(Clone, Debug, Serialize)]
pub struct Requests {
    /// Arrived at a gateway.
    pub sent: u64,
    /// Completed successfully.
    pub completed: u64,
    /// Failed (no capacity, attempts exhausted, node or gateway died mid-stream).
    pub failed: u64,
    /// Retries after a failure before the first byte.
    pub retries: u64,
    /// Failed because no node could take them.
    pub no_capacity: u64,
    /// Failed after the first byte because the node died.
    pub mid_stream: u64,
    /// Still in flight or waiting for a replica when the run ended.
    pub unfinished: u64,
}

/// Drains and the requests they caught: the in-flight completion.
#[derive(Clone, Debug, Serialize)]
pub struct Drain {
    /// Drains started by a walltime, a preemption or the spinner.
    pub drains: u64,
    /// Requests in flight when those drains started.
    pub in_flight: u64,
    /// Of those, completed.
    pub completed: u64,
    /// Of those, failed (their node was killed, or their gateway died, before they ended).
    pub failed: u64,
    /// Of the failed, those whose gateway died: the client's connection went with it, which no
    /// drain can help.
    pub gateway_lost: u64,
    /// Of those, still streaming when the run ended.
    pub unfinished: u64,
    /// In-flight completion: completed ÷ (completed + failed), in percent (100 with none).
    pub completion_percent: f64,
    /// Drains at the walltime's drain signal.
    pub walltime: DrainPart,
    /// Drains at Slurm's preemption signal.
    pub preemption: DrainPart,
    /// Drains the spinner asked for (replicas released).
    pub release: DrainPart,
}

/// Drains of one cause.
#[derive(Clone, Debug, Serialize)]
pub struct DrainPart {
    /// Drains.
    pub drains: u64,
    /// Requests in flight when they started.
    pub in_flight: u64,
    /// Of those, completed.
    pub completed: u64,
    /// Of those, failed.
    pub failed: u64,
}

impl DrainPart {
    pub(super) fn of(c: &crate::track::DrainCount) -> DrainPart {
        DrainPart { drains: c.drains, in_flight: c.in_flight, completed: c.completed, failed: c.failed }
    }
}

/// Batch-job ends and preemptions.
#[derive(Clone, Debug, Serialize)]
pub struct Jobs {
    /// Preemptions the scenario schedules (static nodes and spinner jobs).
    pub preemptions_scheduled: u64,
    /// Preemption signals delivered (drain now, kill after the grace period).
    pub preemptions: u64,
    /// Jobs killed at the end of a preemption's grace period (not drained by then).
    pub preempt_kills: u64,
    /// Jobs killed at their walltime (not drained by then).
    pub walltime_kills: u64,
    /// Nodes that exited by themselves after draining.
    pub clean_exits: u64,
}

/// Liveness phase after the faults stop.
#[derive(Clone, Debug, Serialize)]
pub struct Liveness {
    /// The bound from the scenario.
    pub bound_s: f64,
    /// Time from the end of faults until every live replica held the same view.
    pub converged_after_ms: Option<f64>,
}

impl Drain {
    /// One line on the in-flight completion.
    pub fn line(&self) -> String {
        format!(
            "drains {}: {} requests in flight, {} completed, {} failed ({} with their gateway), {} unfinished: \
             in-flight completion {:.2}% \
             (walltime {}/{}, preemption {}/{}, spinner release {}/{})",
            self.drains,
            self.in_flight,
            self.completed,
            self.failed,
            self.gateway_lost,
            self.unfinished,
            self.completion_percent,
            self.walltime.completed,
            self.walltime.in_flight,
            self.preemption.completed,
            self.preemption.in_flight,
            self.release.completed,
            self.release.in_flight,
        )
    }
}
