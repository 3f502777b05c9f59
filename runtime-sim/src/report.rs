//! The run report: a human summary on stdout and a JSON file.

use crate::sim::{micros, Micros, Sim};
use crate::track::{quantile, Converged, Curve};
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
    fn of(mut v: Vec<f64>) -> Percentiles {
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
    /// seconds; ms until every node had it), to see convergence by phase of the run.
    pub changes: Vec<(f64, f64)>,
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
    fn of(c: &crate::track::DrainCount) -> DrainPart {
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

impl Drain {
    /// One line on the in-flight completion.
    pub fn line(&self) -> String {
        format!(
            "drains {}: {} requests in flight, {} completed, {} failed, {} unfinished: in-flight completion {:.2}% \
             (walltime {}/{}, preemption {}/{}, spinner release {}/{})",
            self.drains,
            self.in_flight,
            self.completed,
            self.failed,
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

/// Serf's convergence estimate: the fraction of `n` nodes reached after `rounds` rounds of
/// gossip with `fanout` under `loss` (its convergence simulator's logistic formula).
pub fn serf_fraction(n: f64, fanout: f64, loss: f64, rounds: f64) -> f64 {
    let contact = fanout * (1.0 - loss) * 0.5;
    1.0 / (1.0 + (n + 1.0) * (-contact * rounds).exp())
}

/// Rounds until Serf's estimate reaches `target`.
pub fn serf_rounds(n: f64, fanout: f64, loss: f64, target: f64) -> f64 {
    let contact = fanout * (1.0 - loss) * 0.5;
    ((n + 1.0) * target / (1.0 - target)).ln() / contact
}

/// ", 3 still pending at the end, the oldest 41000 ms old", or nothing when none were.
fn pending(count: u64, oldest_ms: f64) -> String {
    if count == 0 {
        return String::new();
    }
    format!(", {count} still pending at the end, the oldest {oldest_ms:.0} ms old")
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
                changes: t.converged.iter().map(|c| (c.t0 as f64 / 1e6, (c.all - c.t0) as f64 / 1e3)).collect(),
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

    /// A few lines for humans.
    pub fn summary(&self) -> String {
        let c = &self.convergence;
        let d = &self.detection;
        let r = &self.requests;
        format!(
            "{scenario} seed {seed}{swarm}: {nodes} nodes, {sim:.0} s simulated in {wall:.1} s wall{setup} ({eps:.0} events/s; {wakes:.0}% timer wakes, {deliveries:.0}% datagrams), peak RSS {rss} MB, hash {hash}\n\
             {seconds}\n\
             {heap}\
             network: loss {loss:.3}, dup {dup:.3}, reorder {reo:.3}, {parts} partition(s), {idle} connection(s) timed out; max datagram {maxd} B; {bps:.0} B/s per node (steady {tail:.0})\n\
             convergence: p50 {c50:.0} ms, p99 {c99:.0} ms, max {c100:.0} ms over {cn} changes ({cinc} incomplete{cpend}); Serf 99.99% bound {serf:.0} ms; once formed: p50 {s50:.0} ms, p99 {s99:.0} ms over {sn}; apart from partitions: p50 {a50:.0} ms, p99 {a99:.0} ms, max {a100:.0} ms over {an} (to 99.99%: p99 {m99:.0} ms, max {m100:.0} ms)\n\
             detection: p50 {d50:.0} ms, max {d100:.0} ms over {dn} kills (gateways max {g100:.0} ms, {byc} at a connection's timeout; gateway registries max {r100:.0} ms; {dinc} incomplete, {drst} restarted first{dpend}); false unroutable {fu}, false DOWN {fd}, DOWN marks signed {dm}\n\
             requests: {sent} sent, {done} completed, {failed} failed ({nocap} no capacity, {mid} mid-stream), {retries} retries, {unf} unfinished\n\
             {drain}\n\
             jobs: {pre} preemptions ({pre_s} scheduled), {pkill} killed after the grace period, {wkill} killed at the walltime, {exits} clean exits\n\
             {spin}\
             {auth}\
             liveness: {live}\n\
             {verdict}",
            scenario = self.scenario,
            seed = self.seed,
            swarm = if self.swarm { " (swarm)" } else { "" },
            nodes = self.nodes,
            sim = self.sim_s,
            wall = self.wall_s,
            setup = if self.setup_wall_s >= 1.0 { format!(", {:.1} s of it forming", self.setup_wall_s) } else { String::new() },
            eps = self.events_per_s,
            wakes = self.events_by_kind.share(self.events_by_kind.wakes),
            deliveries = self.events_by_kind.share(self.events_by_kind.deliveries),
            rss = self.peak_rss_mb,
            seconds = self.seconds.line(),
            heap = self.heap.as_ref().map_or(String::new(), |h| format!("{}\n", h.line())),
            hash = self.hash,
            loss = self.network.loss,
            dup = self.network.duplicate,
            reo = self.network.reorder,
            parts = self.partitions,
            idle = self.connections_timed_out,
            maxd = self.max_datagram_bytes,
            bps = self.bytes_per_node_per_s,
            tail = self.bytes_per_node_per_s_tail,
            c50 = c.latency.p50_ms,
            c99 = c.latency.p99_ms,
            c100 = c.latency.p100_ms,
            cn = c.latency.count,
            cinc = c.incomplete,
            cpend = pending(c.pending_at_end, c.oldest_pending_ms),
            s50 = c.settled.p50_ms,
            s99 = c.settled.p99_ms,
            sn = c.settled.count,
            a50 = c.apart_from_partitions.p50_ms,
            a99 = c.apart_from_partitions.p99_ms,
            a100 = c.apart_from_partitions.p100_ms,
            an = c.apart_from_partitions.count,
            m99 = c.apart_from_partitions_9999.p99_ms,
            m100 = c.apart_from_partitions_9999.p100_ms,
            serf = c.serf_bound_ms,
            d50 = d.all_nodes.p50_ms,
            d100 = d.all_nodes.p100_ms,
            dn = d.all_nodes.count,
            g100 = d.gateways.p100_ms,
            byc = d.by_connection,
            r100 = d.gateways_registry.p100_ms,
            dinc = d.incomplete,
            drst = d.restarted_first,
            dpend = pending(d.pending_at_end, d.oldest_pending_ms),
            fu = d.false_unroutable,
            fd = d.false_down,
            dm = d.marks_signed,
            sent = r.sent,
            done = r.completed,
            failed = r.failed,
            nocap = r.no_capacity,
            mid = r.mid_stream,
            retries = r.retries,
            unf = r.unfinished,
            drain = self.drain.line(),
            pre = self.jobs.preemptions,
            pre_s = self.jobs.preemptions_scheduled,
            pkill = self.jobs.preempt_kills,
            wkill = self.jobs.walltime_kills,
            exits = self.jobs.clean_exits,
            spin = self.spin.as_ref().map_or(String::new(), |s| format!("{}\n", s.summary())),
            auth = self.authenticity.as_ref().map_or(String::new(), crate::liar::AuthReport::line),
            live = match self.liveness.converged_after_ms {
                Some(ms) => format!("all live replicas equal {:.0} ms after faults stopped (bound {} s)", ms, self.liveness.bound_s),
                None => format!("live replicas NOT equal within the run (bound {} s)", self.liveness.bound_s),
            },
            verdict = match (&self.violation, &self.aborted) {
                (Some(v), _) => format!("FAILED: {v}"),
                (None, Some(a)) => format!("ABORTED: {a}"),
                (None, None) if self.liveness.converged_after_ms.is_none() => "FAILED: liveness phase did not converge".to_string(),
                _ => "ok".to_string(),
            }
        )
    }
}

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

    #[test]
    fn serf_formula_matches_its_published_anchor() {
        // 10,000 nodes, fanout 3, no loss: 99.99% in about 13 rounds (2.6 s at 200 ms).
        let r = serf_rounds(10_000.0, 3.0, 0.0, 0.9999);
        assert!((12.0..13.5).contains(&r), "{r}");
        assert!((serf_fraction(10_000.0, 3.0, 0.0, r) - 0.9999).abs() < 1e-6);
    }
}
