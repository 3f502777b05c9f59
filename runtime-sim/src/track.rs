//! What the simulator measures and the invariants it checks while running.
//!
//! - Convergence: for sampled record changes (a node's own lifecycle moves), the time until every
//!   node that was live at the change holds a version covering it, and the spreading curve.
//! - Detection: for each silent kill, the time until every node that was routing to the victim
//!   (and separately, every gateway) stopped; plus marks of live, serving nodes as unroutable.
//!   A gateway stops when its registry marks the victim unroutable or when its connection to
//!   the victim times out (it routes only over live connections); the time until every
//!   gateway's registry alone said so is kept apart, as the membership protocol's own figure.
//! - Invariants: per-replica lattice monotonicity of a set of watched records, every node's own
//!   record moving forward, and (in `world.rs` / `sim.rs`) the datagram limit and routing only
//!   to nodes the gateway believes SERVE.

use crate::sim::{id_of, Host, Micros};
use crate::world::Request;
use tela_core::{Lifecycle, Node, NodeId, Version};

/// Changes and deaths tracked at once; bounds the per-merge cost at large scale.
fn tracking_cap(hosts: usize) -> usize {
    if hosts > 2_000 {
        12
    } else {
        48
    }
}

/// Give up on a change or a death after this long.
const TRACK_TIMEOUT: Micros = 120_000_000;

/// Records watched for monotonicity at every replica.
const WATCHED: usize = 8;

#[derive(Clone, Debug)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Bits {
        Bits(vec![0; n.div_ceil(64)])
    }
    /// Hosts added after the set was made (spinner jobs) are never in it.
    fn get(&self, i: u32) -> bool {
        self.0.get(i as usize / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }
    fn set(&mut self, i: u32, v: bool) {
        let Some(w) = self.0.get_mut(i as usize / 64) else { return };
        if v {
            *w |= 1 << (i % 64);
        } else {
            *w &= !(1 << (i % 64));
        }
    }
}

#[derive(Clone, Debug)]
struct Change {
    owner: u32,
    version: Version,
    t0: Micros,
    waiting: Bits,
    remaining: u32,
    total: u32,
    curve: Vec<(u32, u32)>,
    /// When tracing, how many nodes took the change through a datagram of each message tag
    /// (the last slot, beyond the wire's tags: another way, such as a restart).
    via: [u32; 11],
}

#[derive(Clone, Debug)]
struct Detection {
    victim: u32,
    t0: Micros,
    waiting: Bits,
    remaining: u32,
    gateways_remaining: u32,
    /// Gateways whose registry still holds the victim routable.
    registries_waiting: Vec<u32>,
    /// Everyone stopped routing to the victim (`remaining` reached 0, the time is recorded);
    /// kept until the gateways' registries follow.
    routed_around: bool,
}

/// A change that reached every node that had to learn it.
#[derive(Clone, Copy, Debug)]
pub struct Converged {
    /// When it was made.
    pub t0: Micros,
    /// When every live node held it.
    pub all: Micros,
    /// When 99.99% of them did (Serf's measure).
    pub most: Micros,
}

/// A finished spreading curve: (ms after the change, nodes holding it) and the target count.
#[derive(Clone, Debug)]
pub struct Curve {
    /// Points of the curve.
    pub points: Vec<(u32, u32)>,
    /// Nodes that had to learn the change.
    pub total: u32,
}

/// Why a node drained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum DrainCause {
    /// The drain signal before the job's walltime.
    Walltime = 0,
    /// Slurm's preemption signal.
    Preemption = 1,
    /// The spinner released the replica.
    Release = 2,
}

/// Requests caught in drains of one cause.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DrainCount {
    pub drains: u64,
    pub in_flight: u64,
    pub completed: u64,
    pub failed: u64,
}

/// An invariant the run broke. The check records nothing: the tracker's last-seen values stay
/// as they were, and the caller fails the run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Violation {
    /// A node's own record went to an older generation, or to an earlier state in the same one.
    #[error(
        "node {node}'s own record moved backwards: generation {last_generation} {last_state:?} -> generation {generation} {state:?}"
    )]
    OwnRecordBackwards {
        /// The node.
        node: NodeId,
        /// The generation it last announced.
        last_generation: u64,
        /// The state it last announced.
        last_state: Lifecycle,
        /// The generation it announces now.
        generation: u64,
        /// The state it announces now.
        state: Lifecycle,
    },
    /// A watched record in a node's replica went to a version that does not cover the last one.
    #[error("lattice monotonicity: node {node}'s record of {of} moved backwards from {last:?} to {now:?}")]
    WatchedBackwards {
        /// The node whose replica it is.
        node: NodeId,
        /// Whose record.
        of: NodeId,
        /// The version seen last.
        last: Version,
        /// The version now.
        now: Version,
    },
    /// A watched record vanished from a node's replica.
    #[error("node {node}'s replica lost the record of {of} (last {last:?})")]
    WatchedLost {
        /// The node whose replica it is.
        node: NodeId,
        /// Whose record.
        of: NodeId,
        /// The version seen last.
        last: Version,
    },
}

/// All measurements of one run.
#[derive(Default, Debug)]
pub(crate) struct Trackers {
    pub requests: Vec<Request>,
    pub sent: u64,
    pub completed: u64,
    pub failed: u64,
    pub retries: u64,
    pub no_capacity: u64,
    pub no_gateway: u64,
    pub mid_stream: u64,
    pub drains: u64,
    pub drain_in_flight: u64,
    pub drain_completed: u64,
    pub drain_failed: u64,
    /// Of the drains' failed requests, those whose gateway died (the client's side went).
    pub drain_gateway_lost: u64,
    pub drain_by_cause: [DrainCount; 3],
    /// Why each host that is draining (or about to) drains; absent: its walltime.
    pub drain_cause: std::collections::BTreeMap<u32, DrainCause>,
    pub preemptions_scheduled: u64,
    pub preemptions: u64,
    pub preempt_kills: u64,
    pub walltime_kills: u64,
    pub clean_exits: u64,
    pub rejected: u64,
    pub nat_dropped: u64,
    pub connections_timed_out: u64,
    pub bytes: u64,
    pub datagrams: u64,
    pub max_datagram: usize,
    pub per_second: Vec<u64>,
    /// Events processed in each simulated second, all nodes together.
    pub events_per_second: Vec<u64>,
    /// Events processed up to the last second's end.
    events_before: u64,
    pub seconds: u64,
    second_bytes: u64,
    changes: Vec<Change>,
    /// Every change that reached every live node, in the order they did.
    pub converged: Vec<Converged>,
    /// When the federation counts as formed: a minute after the last initial join.
    pub settle_at: Micros,
    pub convergence_incomplete: u64,
    pub curves: Vec<Curve>,
    detections: Vec<Detection>,
    pub detection_ms: Vec<f64>,
    pub detection_gateway_ms: Vec<f64>,
    /// From a kill until every gateway's registry marked the victim unroutable.
    pub detection_gateway_registry_ms: Vec<f64>,
    /// Gateways that stopped routing to a victim because its connection timed out, before
    /// their registry said so.
    pub detection_by_connection: u64,
    pub detection_incomplete: u64,
    /// Kills whose victim restarted before every node had stopped routing to it.
    pub detection_restarted_first: u64,
    pub false_unroutable: u64,
    watched: Vec<u32>,
    watched_last: Vec<Option<Version>>,
    own_last: Vec<Option<(u64, Lifecycle)>>,
    pub liveness_started: Option<Micros>,
    pub liveness_converged: Option<Micros>,
    /// What the datagrams carried (with TELA_SIM_TRACE).
    pub traffic: crate::traffic::Traffic,
    /// `TELA_SIM_TRACE` is set: read once when the run starts, not on every datagram.
    pub tracing: bool,
}

impl Trackers {
    pub fn on_send(&mut self, _now: Micros, len: usize) {
        self.bytes += len as u64;
        self.second_bytes += len as u64;
        self.datagrams += 1;
        self.max_datagram = self.max_datagram.max(len);
    }

    /// A simulated second ended at `now`, with `events` processed since the run began.
    pub fn on_second(&mut self, now: Micros, events: u64) {
        self.events_per_second.push(events - self.events_before);
        self.events_before = events;
        self.per_second.push(self.second_bytes);
        self.second_bytes = 0;
        self.seconds += 1;
        let before = self.changes.len();
        self.changes.retain(|c| now - c.t0 < TRACK_TIMEOUT);
        self.convergence_incomplete += (before - self.changes.len()) as u64;
        let late = self.detections.iter().filter(|d| now - d.t0 >= TRACK_TIMEOUT && !d.routed_around).count();
        self.detections.retain(|d| now - d.t0 < TRACK_TIMEOUT);
        self.detection_incomplete += late as u64;
    }

    /// Changes still spreading: how many, and the age of the oldest at `now` (ms).
    pub fn changes_pending(&self, now: Micros) -> (u64, f64) {
        let oldest = self.changes.iter().map(|c| now - c.t0).max().unwrap_or(0);
        (self.changes.len() as u64, oldest as f64 / 1e3)
    }

    /// Kills some node still routes to: how many, and the age of the oldest at `now` (ms).
    pub fn detections_pending(&self, now: Micros) -> (u64, f64) {
        let pending = self.detections.iter().filter(|d| !d.routed_around);
        let (count, oldest) = pending.fold((0, 0), |(n, age), d| (n + 1, age.max(now - d.t0)));
        (count, oldest as f64 / 1e3)
    }

    pub fn on_host_started(&mut self, h: u32) {
        let n = h as usize + 1;
        if self.own_last.len() < n {
            self.own_last.resize(n, None);
        }
        // A killed node that comes back before everyone stopped routing to it ends its
        // detection: a node that learns of the new process first never marks the old one
        // unroutable, and routing to the new one is right.
        let before = self.detections.len();
        self.detections.retain(|d| d.victim != h || d.routed_around);
        self.detection_restarted_first += (before - self.detections.len()) as u64;
    }

    /// A process ended: it no longer has to learn anything, and its next replica starts empty.
    pub fn on_host_stopped(&mut self, h: u32, now: Micros) {
        if let Some(row) = self.watched_row(h) {
            row.iter_mut().for_each(|v| *v = None);
        }
        for c in &mut self.changes {
            if c.waiting.get(h) {
                c.waiting.set(h, false);
                c.remaining -= 1;
            }
        }
        self.finish_changes(now);
        for d in &mut self.detections {
            if d.waiting.get(h) {
                d.waiting.set(h, false);
                d.remaining -= 1;
            }
            if d.registries_waiting.contains(&h) {
                // As for the gateways' routing: a gateway that died leaves no figure.
                d.registries_waiting.clear();
            }
        }
        self.finish_detections(now, None);
    }

    /// A node's own record changed state or generation.
    pub fn on_local_change(&mut self, h: u32, generation: u64, version: Version, now: Micros, hosts: &[Host]) {
        if self.own_last.len() <= h as usize {
            self.own_last.resize(h as usize + 1, None);
        }
        // Own-record monotonicity is checked in `check_own`; here only tracking.
        self.own_last[h as usize] = Some((generation, version.state));
        if self.changes.len() >= tracking_cap(hosts.len()) {
            return;
        }
        let mut waiting = Bits::new(hosts.len());
        let mut remaining = 0;
        for (i, host) in hosts.iter().enumerate() {
            if i as u32 != h && host.running() {
                waiting.set(i as u32, true);
                remaining += 1;
            }
        }
        if remaining == 0 {
            return;
        }
        self.changes.push(Change {
            owner: h,
            version,
            t0: now,
            waiting,
            remaining,
            total: remaining,
            curve: vec![(0, 0)],
            via: [0; 11],
        });
    }

    /// Drops the changes being followed, recording nothing: a formed federation's own start.
    pub fn forget_changes(&mut self) {
        self.changes.clear();
    }

    /// Checks that a node's own record moves forward, before `on_local_change` records it.
    pub fn check_own(&self, h: u32, generation: u64, state: Lifecycle) -> Result<(), Violation> {
        match self.own_last.get(h as usize).copied().flatten() {
            Some((last_generation, last_state))
                if generation < last_generation || (generation == last_generation && state < last_state) =>
            {
                Err(Violation::OwnRecordBackwards { node: id_of(h), last_generation, last_state, generation, state })
            }
            _ => Ok(()),
        }
    }

    /// Node `h`'s replica changed: does it now hold tracked changes? Returns, when tracing, the
    /// changes `h` was among the last three to take more than 3 s after they began: (owner,
    /// milliseconds).
    pub fn on_merge(&mut self, h: u32, node: &Node, now: Micros, via: Option<u8>) -> Vec<(u32, u64)> {
        let mut late = Vec::new();
        let mut any = false;
        for c in &mut self.changes {
            if !c.waiting.get(h) {
                continue;
            }
            let holds = node.replica().get(&id_of(c.owner)).is_some_and(|s| s.record().version().covers(&c.version));
            if holds {
                c.waiting.set(h, false);
                c.remaining -= 1;
                c.curve.push((((now - c.t0) / 1_000) as u32, c.total - c.remaining));
                any = true;
                c.via[via.map_or(10, |t| usize::from(t).min(10))] += 1;
                if self.tracing && c.remaining < 3 && now - c.t0 > 3_000_000 {
                    late.push((c.owner, (now - c.t0) / 1_000));
                }
            }
        }
        if any {
            self.finish_changes(now);
        }
        late
    }

    fn finish_changes(&mut self, now: Micros) {
        let mut i = 0;
        while i < self.changes.len() {
            if self.changes[i].remaining == 0 {
                let c = self.changes.swap_remove(i);
                if self.tracing {
                    eprintln!(
                        "change of {} {:?} at {:.3}s: {:.0} ms (taken through {}) {:?}",
                        c.owner,
                        c.version,
                        c.t0 as f64 / 1e6,
                        (now - c.t0) as f64 / 1e3,
                        c.via
                            .iter()
                            .enumerate()
                            .filter(|(_, n)| **n > 0)
                            .map(|(t, n)| format!("{} {n}", crate::traffic::tag_name(t)))
                            .collect::<Vec<_>>()
                            .join(", "),
                        c.curve.iter().step_by(8).collect::<Vec<_>>()
                    );
                }
                // A node that stopped counts as done without a point on the curve; when stops
                // carried it past the mark, the time to everyone (a bound) stands.
                let need = (f64::from(c.total) * 0.9999).ceil() as u32;
                let most = c.curve.iter().find(|p| p.1 >= need).map_or(now, |p| c.t0 + Micros::from(p.0) * 1_000);
                self.converged.push(Converged { t0: c.t0, all: now, most });
                if self.curves.len() < 400 {
                    self.curves.push(Curve { points: c.curve, total: c.total });
                }
            } else {
                i += 1;
            }
        }
    }

    /// `victim` is about to be killed silently: who must notice?
    pub fn on_crash(&mut self, victim: u32, now: Micros, hosts: &[Host]) {
        if self.detections.len() >= tracking_cap(hosts.len()) || self.detections.iter().any(|d| d.victim == victim) {
            return;
        }
        let id = id_of(victim);
        let mut waiting = Bits::new(hosts.len());
        let (mut remaining, mut gateways_remaining) = (0, 0);
        let mut registries_waiting = Vec::new();
        for (i, host) in hosts.iter().enumerate() {
            let Some(node) = host.node.as_ref() else {
                continue;
            };
            if i as u32 != victim && node.replica().get(&id).is_some_and(|s| s.is_routable()) {
                waiting.set(i as u32, true);
                remaining += 1;
                if host.gateway {
                    gateways_remaining += 1;
                    registries_waiting.push(i as u32);
                }
            }
        }
        if remaining > 0 {
            self.detections.push(Detection {
                victim,
                t0: now,
                waiting,
                remaining,
                gateways_remaining,
                registries_waiting,
                routed_around: false,
            });
        }
    }

    /// Gateway `gateway`'s connection to the killed `victim` timed out: it routes to it no more.
    pub fn on_tunnel_lost(&mut self, gateway: u32, victim: u32, now: Micros) {
        if let Some(d) = self.detections.iter_mut().find(|d| d.victim == victim) {
            if d.waiting.get(gateway) {
                self.detection_by_connection += 1;
                Self::stopped_routing(d, gateway, true, now, &mut self.detection_gateway_ms);
            }
            self.finish_detections(now, Some(victim));
        }
    }

    /// `observer` (a gateway when `gateway`) stopped routing to the victim of `d`.
    fn stopped_routing(d: &mut Detection, observer: u32, gateway: bool, now: Micros, gateway_ms: &mut Vec<f64>) {
        if !d.waiting.get(observer) {
            return;
        }
        d.waiting.set(observer, false);
        d.remaining -= 1;
        if gateway {
            d.gateways_remaining -= 1;
            if d.gateways_remaining == 0 {
                gateway_ms.push((now - d.t0) as f64 / 1e3);
            }
        }
    }

    /// `observer` stopped routing to `target`; `cut` when an active partition separates them.
    pub fn on_unroutable(&mut self, observer: u32, target: u32, cut: bool, now: Micros, hosts: &[Host]) {
        if let Some(d) = self.detections.iter_mut().find(|d| d.victim == target) {
            let gateway = hosts[observer as usize].gateway;
            Self::stopped_routing(d, observer, gateway, now, &mut self.detection_gateway_ms);
            if let Some(i) = d.registries_waiting.iter().position(|&g| g == observer) {
                d.registries_waiting.swap_remove(i);
                if d.registries_waiting.is_empty() {
                    self.detection_gateway_registry_ms.push((now - d.t0) as f64 / 1e3);
                }
            }
            self.finish_detections(now, Some(target));
            return;
        }
        // A node that marks itself unroutable is draining: its own news, not a judgement; one
        // that a partition cuts off is unreachable, as the observer rightly judges.
        let t = &hosts[target as usize];
        if observer != target && !cut && t.running() && t.state == Lifecycle::Serve {
            self.false_unroutable += 1;
        }
    }

    fn finish_detections(&mut self, now: Micros, _target: Option<u32>) {
        let mut i = 0;
        while i < self.detections.len() {
            let d = &mut self.detections[i];
            if d.remaining == 0 && !d.routed_around {
                d.routed_around = true;
                self.detection_ms.push((now - d.t0) as f64 / 1e3);
                if self.tracing {
                    eprintln!(
                        "detected: node {} killed at {} ms, routed around by every node after {} ms",
                        crate::sim::id_of(d.victim),
                        d.t0 / 1000,
                        (now - d.t0) / 1000
                    );
                }
            }
            if d.routed_around && d.registries_waiting.is_empty() {
                self.detections.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    fn watched_row(&mut self, h: u32) -> Option<&mut [Option<Version>]> {
        let start = h as usize * WATCHED;
        self.watched_last.get_mut(start..start + WATCHED)
    }

    /// Checks that the watched records never move backwards in `h`'s replica.
    pub fn check_watched(&mut self, h: u32, node: &Node) -> Result<(), Violation> {
        if self.watched.is_empty() {
            return Ok(());
        }
        let need = (h as usize + 1) * WATCHED;
        if self.watched_last.len() < need {
            self.watched_last.resize(need, None);
        }
        // Disjoint borrows of two fields: no copy of the watch list on this per-merge path.
        let start = h as usize * WATCHED;
        let row = &mut self.watched_last[start..start + WATCHED];
        for (k, &w) in self.watched.iter().enumerate() {
            let now_v = node.replica().get(&id_of(w)).map(|s| s.record().version());
            match (row[k], now_v) {
                (Some(last), Some(now)) if !now.covers(&last) => {
                    return Err(Violation::WatchedBackwards { node: id_of(h), of: id_of(w), last, now })
                }
                (Some(last), None) => return Err(Violation::WatchedLost { node: id_of(h), of: id_of(w), last }),
                _ => row[k] = now_v,
            }
        }
        Ok(())
    }

    /// Chooses which hosts' records are watched everywhere.
    pub fn watch(&mut self, hosts: &[u32]) {
        self.watched = hosts.iter().copied().take(WATCHED).collect();
    }
}

/// The `q` quantile (0..=1) of `v` (sorted in place), or 0 when empty.
pub fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)]
}
