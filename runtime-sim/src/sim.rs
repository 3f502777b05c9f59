//! The event loop: virtual time, the hosts that run core nodes, and the network between them.
//!
//! One thread, one priority queue of `(time, sequence)` events. A host is woken only at the
//! deadline its node reported (stale wake-ups are recognised and skipped), so idle nodes cost
//! nothing. Each host has its own clock (offset and drift): the node is always fed its local
//! time, and its local deadlines are mapped back onto the global timeline.

use crate::rng::{self, Stream};
use crate::scenario::{Partition, Scenario};
use crate::track::Trackers;
use bytes::Bytes;
use foldhash::fast::FixedState;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::cmp::Ordering;
use std::collections::{BTreeSet, BinaryHeap};
use std::hash::BuildHasher;
use tela_core::{Hardware, Input, Lifecycle, Model, Node, NodeId, Output, Time, MAX_DATAGRAM};

/// Microseconds on the global (true) timeline.
pub type Micros = u64;

/// Added to every local clock so that negative offsets never reach zero.
const CLOCK_BASE: i128 = 10_000_000_000;

/// The wait before redial `attempt` (0 for the first after a loss), as the runtime's backoff
/// draws it with its defaults: a step of 500 ms doubling up to 10 s, the wait uniform between
/// half and all of the step.
fn redial_delay(attempt: u8, rng: &mut ChaCha8Rng) -> Micros {
    let step = 500_000u64.saturating_mul(1 << attempt.min(5)).min(10_000_000);
    rng.random_range(step / 2..=step)
}

/// True if partition `p` drops traffic from site `a` to site `b` (while it is active).
fn cuts(p: &Partition, a: u32, b: u32) -> bool {
    let (in_a, in_b) = (p.sites.contains(&a), p.sites.contains(&b));
    in_a != in_b && (!p.one_way || in_a)
}

/// How a process ended, as its peers see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// It exited and closed its connections.
    Exit,
    /// It was killed: its connections were never closed.
    Kill,
}

/// What happens at one point of the global timeline.
#[derive(Debug)]
pub(crate) enum Kind {
    /// A host's node deadline (stale if the host re-armed since).
    Wake(u32),
    /// A datagram arrives.
    Deliver { to: u32, from: u32, payload: Bytes },
    /// A connection from `dialer` to gateway `gateway` completes its handshake (the dial's
    /// `attempt`, from 0, sets the backoff before the next one if it cannot).
    Connect { dialer: u32, gateway: u32, attempt: u8 },
    /// A host's process (a job) starts.
    Start(u32),
    /// The engine of a job answers health checks.
    EngineUp { host: u32, job: u32 },
    /// A job reaches its walltime: Slurm kills what is left.
    JobEnd { host: u32, job: u32 },
    /// Slurm preempts a job: drain signal now, kill after the grace period.
    Preempt(u32),
    /// The kill that follows a preemption.
    Kill { host: u32, job: u32 },
    /// `kill -9` of a host, restarted later.
    Crash(u32),
    /// `peer`'s connection to `of`, whose process was killed, reaches its idle timeout.
    LinkTimeout { peer: u32, of: u32 },
    /// The connection between `a` and `b`, cut by partition `partition`, reaches its idle
    /// timeout if the partition still holds.
    PartitionIdle { a: u32, b: u32, partition: u32 },
    /// A partition starts.
    PartitionStart(u32),
    /// A partition heals.
    PartitionEnd(u32),
    /// A client request arrives at a gateway.
    Arrival,
    /// A request's response finishes streaming.
    RequestDone(u32),
    /// Once a simulated second: bandwidth sample and resource guards.
    Sample,
    /// Faults have stopped: the liveness phase begins.
    FaultsEnd,
    /// Liveness phase: are all live replicas equal yet?
    LivenessCheck,
    /// The spinner's periodic decision.
    SpinTick,
    /// An extra decision: a request found no replica.
    SpinDecide,
    /// A candidate arrival for a spinnable model.
    SpinArrival,
    /// A spinner job leaves the batch queue and starts.
    SpinStart(u32),
    /// A cold-start queue's oldest request reaches its deadline.
    ColdExpire { gateway: u32, model: u32 },
    /// Slurm preempts one of the spinner's running jobs.
    SpinPreempt,
    /// Once a simulated minute: the spinning timeline.
    SpinMinute,
}

impl Kind {
    fn tag(&self) -> (u8, u32, u32) {
        match self {
            Kind::Wake(h) => (0, *h, 0),
            Kind::Deliver { to, from, payload } => (1, *to, *from ^ ((payload.len() as u32) << 16)),
            Kind::Connect { dialer, gateway, .. } => (2, *dialer, *gateway),
            Kind::Start(h) => (3, *h, 0),
            Kind::EngineUp { host, job } => (4, *host, *job),
            Kind::JobEnd { host, job } => (5, *host, *job),
            Kind::Preempt(h) => (6, *h, 0),
            Kind::Kill { host, job } => (7, *host, *job),
            Kind::Crash(h) => (8, *h, 0),
            Kind::PartitionStart(p) => (9, *p, 0),
            Kind::PartitionEnd(p) => (10, *p, 0),
            Kind::Arrival => (11, 0, 0),
            Kind::RequestDone(r) => (12, *r, 0),
            Kind::Sample => (13, 0, 0),
            Kind::FaultsEnd => (14, 0, 0),
            Kind::LivenessCheck => (15, 0, 0),
            Kind::SpinTick => (16, 0, 0),
            Kind::SpinDecide => (17, 0, 0),
            Kind::SpinArrival => (18, 0, 0),
            Kind::SpinStart(j) => (19, *j, 0),
            Kind::ColdExpire { gateway, model } => (20, *gateway, *model),
            Kind::SpinPreempt => (21, 0, 0),
            Kind::SpinMinute => (22, 0, 0),
            Kind::LinkTimeout { peer, of } => (23, *peer, *of),
            Kind::PartitionIdle { a, b, .. } => (24, *a, *b),
        }
    }
}

#[derive(Debug)]
struct Ev {
    at: Micros,
    seq: u64,
    kind: Kind,
}

impl PartialEq for Ev {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Ev {}
impl PartialOrd for Ev {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ev {
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

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
    wake_at: Micros,
    /// Outbound-only hosts: peers this host sent to, and until when the NAT keeps the path.
    nat: Vec<(u32, Micros)>,
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
    fn global_of(&self, l: Time, not_before: Micros) -> Micros {
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

/// The running simulation.
pub struct Sim {
    pub(crate) sc: Scenario,
    pub(crate) seed: u64,
    pub(crate) swarm: bool,
    pub(crate) now: Micros,
    pub(crate) end: Micros,
    seq: u64,
    queue: BinaryHeap<Ev>,
    pub(crate) hosts: Vec<Host>,
    pub(crate) net_rng: ChaCha8Rng,
    pub(crate) fault_rng: ChaCha8Rng,
    pub(crate) work_rng: ChaCha8Rng,
    pub(crate) world_rng: ChaCha8Rng,
    dial_rng: ChaCha8Rng,
    pub(crate) partitions: Vec<crate::scenario::Partition>,
    pub(crate) active_partitions: Vec<u32>,
    pub(crate) t: Trackers,
    trace: u64,
    pub(crate) events: u64,
    /// Of those, node timer wakes and datagram deliveries; the rest are the world's.
    pub(crate) events_by_kind: crate::report::EventKinds,
    pub(crate) violation: Option<String>,
    pub(crate) aborted: Option<String>,
    /// The heap sample with the most bytes live so far (every five simulated seconds).
    pub(crate) heap: Option<crate::heap::HeapSample>,
    pub(crate) limits: Limits,
    started: std::time::Instant,
    /// Wall seconds spent building the world (a formed federation's restore) before the first
    /// event.
    pub(crate) setup_wall_s: f64,
    /// Wall seconds after `started` at which the next progress line is due.
    progress_at: f64,
    /// Model spinning, when the scenario has it.
    pub(crate) spin: Option<Box<crate::spin::SpinWorld>>,
    /// Lying nodes, once they have started.
    pub(crate) liar: Option<Box<crate::liar::Liars>>,
}

/// Resource guards for a run. They stop a run that would take the machine down; a stopped run
/// reports `aborted` with what it measured so far.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Stop when the resident set exceeds this.
    pub max_rss_mb: u64,
    /// Stop after this much wall time.
    pub max_wall_s: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_rss_mb: 12_000, max_wall_s: 3_600.0 }
    }
}

/// A long run says how far it has got on stderr every this many wall seconds.
const PROGRESS_EVERY_S: f64 = 30.0;

pub(crate) fn micros(s: f64) -> Micros {
    (s * 1e6).max(0.0) as Micros
}

impl Sim {
    /// A simulation of `sc` with root seed `seed`; `swarm` draws the fault mix from the seed.
    pub fn new(mut sc: Scenario, seed: u64, swarm: bool, limits: Limits) -> Sim {
        let mut swarm_rng = rng::stream(seed, Stream::Swarm);
        if swarm {
            crate::world::draw_swarm(&mut sc, &mut swarm_rng);
        }
        let partitions = sc.partition.clone();
        Sim {
            end: micros(sc.duration_s),
            sc,
            seed,
            swarm,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            hosts: Vec::new(),
            net_rng: rng::stream(seed, Stream::Network),
            fault_rng: rng::stream(seed, Stream::Faults),
            work_rng: rng::stream(seed, Stream::Workload),
            world_rng: rng::stream(seed, Stream::World),
            dial_rng: rng::stream(seed, Stream::Dial),
            partitions,
            active_partitions: Vec::new(),
            t: Trackers::default(),
            trace: 0,
            events: 0,
            events_by_kind: crate::report::EventKinds::default(),
            violation: None,
            aborted: None,
            heap: None,
            limits,
            started: std::time::Instant::now(),
            setup_wall_s: 0.0,
            progress_at: PROGRESS_EVERY_S,
            spin: None,
            liar: None,
        }
    }

    /// Runs to the end and reports.
    pub fn run(mut self) -> crate::report::Report {
        self.started = std::time::Instant::now();
        self.t.tracing = std::env::var_os("TELA_SIM_TRACE").is_some();
        self.setup();
        self.setup_wall_s = self.started.elapsed().as_secs_f64();
        while let Some(ev) = self.queue.pop() {
            if ev.at > self.end {
                break;
            }
            self.now = ev.at;
            self.events += 1;
            self.events_by_kind.count(&ev.kind);
            let (tag, a, b) = ev.kind.tag();
            self.trace = FixedState::default().hash_one((self.trace, ev.at, tag, a, b));
            self.dispatch(ev.kind);
            if self.violation.is_some() || self.aborted.is_some() {
                break;
            }
        }
        self.now = self.now.min(self.end);
        if self.t.tracing {
            eprintln!("{}", self.t.traffic.totals());
            let per_node: Vec<u64> = self.t.per_second.iter().step_by(5).map(|b| b / self.hosts.len() as u64).collect();
            eprintln!("bytes/s per node every 5 s: {per_node:?}");
        }
        crate::report::Report::build(&self, self.started.elapsed().as_secs_f64())
    }

    /// The determinism hash of the event trace so far.
    pub(crate) fn trace_hash(&self) -> u64 {
        self.trace
    }

    pub(crate) fn at(&mut self, at: Micros, kind: Kind) {
        self.seq += 1;
        self.queue.push(Ev { at, seq: self.seq, kind });
    }

    pub(crate) fn after(&mut self, delay: Micros, kind: Kind) {
        self.at(self.now.saturating_add(delay), kind);
    }

    pub(crate) fn fail(&mut self, what: String) {
        if self.violation.is_none() {
            self.violation = Some(format!("t={:.3}s: {what}", self.now as f64 / 1e6));
        }
    }

    fn dispatch(&mut self, kind: Kind) {
        match kind {
            Kind::Wake(h) => {
                let host = &mut self.hosts[h as usize];
                if host.wake_at == self.now && host.running() {
                    host.wake_at = Micros::MAX;
                    self.feed(h, Input::Timeout);
                }
            }
            Kind::Deliver { to, from, payload } => self.deliver(to, from, payload),
            Kind::Connect { dialer, gateway, attempt } => self.connect(dialer, gateway, attempt),
            Kind::Start(h) => self.start(h),
            Kind::EngineUp { host, job } => self.engine_up(host, job),
            Kind::JobEnd { host, job } => self.job_end(host, job),
            Kind::Preempt(h) => self.preempt(h),
            Kind::Kill { host, job } => self.kill_job(host, job),
            Kind::Crash(h) => self.crash(h),
            Kind::LinkTimeout { peer, of } => self.link_timeout(peer, of),
            Kind::PartitionIdle { a, b, partition } => self.partition_idle(a, b, partition),
            Kind::PartitionStart(p) => self.partition_start(p),
            Kind::PartitionEnd(p) => self.active_partitions.retain(|x| *x != p),
            Kind::Arrival => self.arrival(),
            Kind::RequestDone(r) => self.request_done(r),
            Kind::Sample => self.sample(),
            Kind::FaultsEnd => {
                self.t.liveness_started = Some(self.now);
                self.liveness_check();
            }
            Kind::LivenessCheck => self.liveness_check(),
            Kind::SpinTick => self.spin_decide(true),
            Kind::SpinDecide => self.spin_decide(false),
            Kind::SpinArrival => self.spin_arrival(),
            Kind::SpinStart(j) => self.spin_start(u64::from(j)),
            Kind::ColdExpire { gateway, model } => self.cold_expire(gateway, model),
            Kind::SpinPreempt => self.spin_preempt(),
            Kind::SpinMinute => self.spin_minute(),
        }
    }

    /// Feeds one input to a host's node at the host's local time, then drains its outputs.
    pub(crate) fn feed(&mut self, h: u32, input: Input) {
        let now = self.now;
        let host = &mut self.hosts[h as usize];
        let local = host.local(now);
        let Some(node) = host.node.as_mut() else {
            return;
        };
        let before = node.stats().records_changed;
        node.handle_input(local, input);
        let changed = node.stats().records_changed != before;
        if changed {
            self.after_merge(h);
        }
        self.pump(h);
    }

    /// Drains a host's outputs.
    pub(crate) fn pump(&mut self, h: u32) {
        loop {
            let Some(node) = self.hosts[h as usize].node.as_mut() else {
                return;
            };
            match node.poll_output() {
                Output::Transmit(t) => self.send(h, t.to, t.payload),
                Output::Event(e) => self.on_event(h, e),
                Output::Command(c) => self.on_command(h, c),
                Output::Timeout(deadline) => {
                    let now = self.now;
                    let host = &mut self.hosts[h as usize];
                    let at = host.global_of(deadline, now);
                    if at != host.wake_at {
                        host.wake_at = at;
                        if at != Micros::MAX {
                            self.at(at, Kind::Wake(h));
                        }
                    }
                    return;
                }
            }
        }
    }

    /// One-way latency between two hosts.
    pub(crate) fn latency(&mut self, a: u32, b: u32) -> Micros {
        let n = &self.sc.network;
        let base = if self.hosts[a as usize].site == self.hosts[b as usize].site { n.intra_site_ms } else { n.wan_ms };
        let jitter = if n.jitter_ms > 0.0 { self.net_rng.random_range(0.0..n.jitter_ms) } else { 0.0 };
        micros((base + jitter) / 1e3)
    }

    /// True if an active partition drops traffic from site `a` to site `b`.
    pub(crate) fn blocked(&self, a: u32, b: u32) -> bool {
        self.active_partitions.iter().any(|&p| cuts(&self.partitions[p as usize], a, b))
    }

    fn send(&mut self, from: u32, to: NodeId, payload: Bytes) {
        let len = payload.len();
        if len > MAX_DATAGRAM {
            self.fail(format!("node {} sent a {len}-byte datagram (limit {MAX_DATAGRAM})", id_of(from)));
            return;
        }
        self.t.on_send(self.now, len);
        if self.t.tracing {
            self.t.traffic.on_datagram(&payload);
        }
        let to = host_of(&to);
        if to as usize >= self.hosts.len() {
            self.fail(format!("node {} sent to unknown node {to}", id_of(from)));
            return;
        }
        if !self.hosts[from as usize].public {
            let until = self.now + micros(self.sc.network.nat_timeout_s);
            let nat = &mut self.hosts[from as usize].nat;
            match nat.iter_mut().find(|(p, _)| *p == to) {
                Some(e) => e.1 = until,
                None => nat.push((to, until)),
            }
        }
        let (sa, sb) = (self.hosts[from as usize].site, self.hosts[to as usize].site);
        if self.blocked(sa, sb) {
            return;
        }
        let n = &self.sc.network;
        let (loss, dup, reorder) = (n.loss, n.duplicate, n.reorder);
        if loss > 0.0 && self.net_rng.random_bool(loss) {
            return;
        }
        let copies = if dup > 0.0 && self.net_rng.random_bool(dup) { 2 } else { 1 };
        for _ in 0..copies {
            let mut delay = self.latency(from, to);
            if reorder > 0.0 && self.net_rng.random_bool(reorder) {
                delay += self.net_rng.random_range(1_000..20_000);
            }
            self.after(delay, Kind::Deliver { to, from, payload: payload.clone() });
        }
    }

    fn deliver(&mut self, to: u32, from: u32, payload: Bytes) {
        let now = self.now;
        let host = &mut self.hosts[to as usize];
        if !host.running() {
            return;
        }
        if !host.public && !host.links.contains(&from) {
            // Behind NAT: only answers on paths this host opened recently get through.
            host.nat.retain(|(_, until)| *until >= now);
            if !host.nat.iter().any(|(p, _)| *p == from) {
                self.t.nat_dropped += 1;
                return;
            }
        }
        self.feed(to, Input::Datagram { from: id_of(from), payload });
    }

    pub(crate) fn connect(&mut self, dialer: u32, gateway: u32, attempt: u8) {
        let (d, g) = (&self.hosts[dialer as usize], &self.hosts[gateway as usize]);
        if !d.running() || d.links.contains(&gateway) {
            return;
        }
        if !g.running() || self.blocked(d.site, g.site) || self.blocked(g.site, d.site) {
            // Nothing answers, or the handshake cannot complete: try again later, backing off
            // as the runtime does (it redials a gateway for as long as its record is not LEFT).
            let next = attempt.saturating_add(1);
            let wait = redial_delay(next, &mut self.dial_rng);
            self.after(wait, Kind::Connect { dialer, gateway, attempt: next });
            return;
        }
        self.hosts[dialer as usize].links.insert(gateway);
        self.hosts[gateway as usize].links.insert(dialer);
        self.feed(dialer, Input::PeerConnected(id_of(gateway)));
        self.feed(gateway, Input::PeerConnected(id_of(dialer)));
    }

    /// Ends a host's process: in-flight requests fail and its connections drop. A process that
    /// exits closes them, and its peers know at once; one that is killed does not: each peer
    /// keeps its side of the connection (a gateway still routes over it, and each request fails
    /// before its first byte) until it reaches the idle timeout.
    pub(crate) fn stop_process(&mut self, h: u32, how: Stop) {
        let host = &mut self.hosts[h as usize];
        if host.node.take().is_none() {
            return;
        }
        host.wake_at = Micros::MAX;
        host.state = Lifecycle::Left;
        host.nat.clear();
        host.gw_load.clear();
        let failed = std::mem::take(&mut host.in_flight);
        let links = std::mem::take(&mut host.links);
        for r in failed {
            self.fail_request(r);
        }
        let idle = micros(self.sc.network.idle_timeout_s);
        for l in links {
            match how {
                Stop::Exit => {
                    self.hosts[l as usize].links.remove(&h);
                    self.feed(l, Input::PeerDisconnected(id_of(h)));
                }
                Stop::Kill => self.after(idle, Kind::LinkTimeout { peer: l, of: h }),
            }
        }
        self.t.on_host_stopped(h, self.now);
    }

    /// Partition `p` starts: every connection it cuts will reach its idle timeout unless the
    /// partition heals first.
    fn partition_start(&mut self, p: u32) {
        self.active_partitions.push(p);
        let idle = micros(self.sc.network.idle_timeout_s);
        let mut cut = Vec::new();
        for (a, host) in self.hosts.iter().enumerate() {
            for &b in host.links.range(a as u32 + 1..) {
                if self.separates(p, host.site, self.hosts[b as usize].site) {
                    cut.push((a as u32, b));
                }
            }
        }
        for (a, b) in cut {
            self.after(idle, Kind::PartitionIdle { a, b, partition: p });
        }
    }

    /// Whether partition `p` stops traffic between sites `x` and `y` in either direction (a
    /// connection needs both: QUIC acknowledges what it receives).
    fn separates(&self, p: u32, x: u32, y: u32) -> bool {
        let p = &self.partitions[p as usize];
        cuts(p, x, y) || cuts(p, y, x)
    }

    /// A connection cut by partition `p` for the idle timeout closes at both ends; the end
    /// that dialled it dials again, with backoff, until the partition heals.
    fn partition_idle(&mut self, a: u32, b: u32, p: u32) {
        if !self.active_partitions.contains(&p) || !self.hosts[a as usize].links.contains(&b) {
            return;
        }
        self.hosts[a as usize].links.remove(&b);
        self.hosts[b as usize].links.remove(&a);
        self.t.connections_timed_out += 1;
        self.feed(a, Input::PeerDisconnected(id_of(b)));
        self.feed(b, Input::PeerDisconnected(id_of(a)));
        self.redial(a, b);
    }

    /// After `a` lost its connection with `b`, the end that dialled it dials again (nodes dial
    /// gateways; of two gateways, the later one dials), with the runtime's backoff.
    fn redial(&mut self, a: u32, b: u32) {
        let (dialer, gateway) = match (self.hosts[a as usize].gateway, self.hosts[b as usize].gateway) {
            (true, false) => (b, a),
            (false, true) => (a, b),
            (true, true) => (a.max(b), a.min(b)),
            (false, false) => return,
        };
        if self.hosts[dialer as usize].running() {
            let wait = redial_delay(0, &mut self.dial_rng);
            self.after(wait, Kind::Connect { dialer, gateway, attempt: 0 });
        }
    }

    /// `peer`'s connection to the killed process `of` reached the idle timeout, unless it is
    /// gone already (a partition closed it) or `of` came back and connected again meanwhile
    /// (the new connection replaced it). A gateway stops routing to `of` here, whatever its
    /// registry says; a node whose gateway was killed dials it again.
    fn link_timeout(&mut self, peer: u32, of: u32) {
        let p = &self.hosts[peer as usize];
        let replaced = self.hosts[of as usize].running() && self.hosts[of as usize].links.contains(&peer);
        if !p.running() || !p.links.contains(&of) || replaced {
            return;
        }
        self.hosts[peer as usize].links.remove(&of);
        self.t.connections_timed_out += 1;
        if self.hosts[peer as usize].gateway {
            self.t.on_tunnel_lost(peer, of, self.now);
        }
        self.feed(peer, Input::PeerDisconnected(id_of(of)));
        self.redial(peer, of);
    }

    /// Builds the hosts and schedules the world (see `world.rs`).
    fn setup(&mut self) {
        crate::world::build(self);
    }

    fn sample(&mut self) {
        self.t.on_second(self.now, self.events);
        let wall = self.started.elapsed().as_secs_f64();
        if wall >= self.progress_at {
            self.progress_at = wall + PROGRESS_EVERY_S;
            eprintln!(
                "{} seed {}: {:.0} of {:.0} simulated s after {wall:.0} s wall ({} events, {} MB)",
                self.sc.name,
                self.seed,
                self.now as f64 / 1e6,
                self.sc.duration_s,
                self.events,
                crate::report::current_rss_mb()
            );
        }
        crate::liar::tick(self);
        if self.t.seconds % 5 == 0 {
            self.sample_heap();
            if self.t.tracing {
                let running = || self.hosts.iter().filter_map(|h| h.node.as_ref());
                let nodes = running().count();
                let (records, suspicions) =
                    running().map(|n| n.swim_queued()).fold((0, 0), |(r, s), (qr, qs)| (r + qr, s + qs));
                let per = nodes.max(1) as f64;
                let senders = running().map(|n| crate::traffic::Senders::of(n.stats())).sum();
                eprintln!(
                    "at {} s, queued per node: {:.1} records, {:.1} suspicions; {}\n  {}",
                    self.t.seconds,
                    records as f64 / per,
                    suspicions as f64 / per,
                    self.t.traffic.window(nodes, 5),
                    self.t.traffic.senders_window(senders, nodes, 5),
                );
            }
            let rss = crate::report::current_rss_mb();
            if rss > self.limits.max_rss_mb {
                self.aborted =
                    Some(format!("resident memory {rss} MB exceeded the {} MB limit", self.limits.max_rss_mb));
            }
            if self.started.elapsed().as_secs_f64() > self.limits.max_wall_s {
                self.aborted = Some(format!("wall time exceeded {} s", self.limits.max_wall_s));
            }
        }
        self.after(1_000_000, Kind::Sample);
    }

    /// Sums the running nodes' tables; keeps the sample if it has the most bytes live so far.
    fn sample_heap(&mut self) {
        let running = || self.hosts.iter().filter_map(|h| h.node.as_ref());
        let sample = crate::heap::HeapSample::take(
            self.t.seconds,
            running().map(|n| n.heap_bytes()).sum(),
            running().count(),
            running().map(|n| n.replica().len() as u64).sum(),
            crate::pool::pooled_records(),
        );
        if self.t.tracing {
            eprintln!("{}", sample.line());
        }
        let size = |s: &crate::heap::HeapSample| (s.live_bytes, s.tables_total());
        if self.heap.as_ref().map_or(true, |kept| size(&sample) > size(kept)) {
            self.heap = Some(sample);
        }
    }

    fn liveness_check(&mut self) {
        let Some(start) = self.t.liveness_started else {
            return;
        };
        if self.t.liveness_converged.is_some() {
            return;
        }
        let mut views = self.hosts.iter().filter_map(|h| h.node.as_ref()).map(|n| n.replica().view_hash());
        let first = views.next();
        if first.is_some() && views.all(|v| Some(v) == first) {
            self.t.liveness_converged = Some(self.now - start);
            return;
        }
        let bound = micros(self.sc.liveness_bound_s);
        if self.now - start > bound {
            if std::env::var_os("TELA_SIM_DEBUG").is_some() {
                self.debug_views();
            }
            let distinct: BTreeSet<u64> =
                self.hosts.iter().filter_map(|h| h.node.as_ref()).map(|n| n.replica().view_hash()).collect();
            self.fail(format!(
                "liveness: live replicas still differ {:.1} s after faults stopped (bound {} s; {} distinct views)",
                (self.now - start) as f64 / 1e6,
                self.sc.liveness_bound_s,
                distinct.len()
            ));
            return;
        }
        self.after(250_000, Kind::LivenessCheck);
    }

    /// Prints how the first few replicas differ from the most common view.
    fn debug_views(&self) {
        let live: Vec<&Node> = self.hosts.iter().filter_map(|h| h.node.as_ref()).collect();
        let mut counts: std::collections::BTreeMap<u64, usize> = Default::default();
        for n in &live {
            *counts.entry(n.replica().view_hash()).or_default() += 1;
        }
        let (&major, &k) = counts.iter().max_by_key(|(_, c)| **c).expect("live nodes");
        eprintln!("majority view held by {k} of {} live nodes", live.len());
        let reference = live.iter().find(|n| n.replica().view_hash() == major).expect("majority");
        for n in live.iter().filter(|n| n.replica().view_hash() != major).take(4) {
            let mine = n.replica().sorted_records();
            let theirs = reference.replica().sorted_records();
            let own = n.local_record();
            eprintln!(
                "node {} ({} records vs {}; itself gen {} {:?}, {:?}, {} connected, {:?}):",
                n.id(),
                mine.len(),
                theirs.len(),
                own.generation,
                own.state,
                own.reach,
                n.connected_peers().len(),
                n.stats()
            );
            let key = |r: &tela_core::SharedRecord| (r.id, r.generation, r.state, r.models.clone());
            let a: BTreeSet<_> = mine.iter().map(key).collect();
            let b: BTreeSet<_> = theirs.iter().map(key).collect();
            for d in a.symmetric_difference(&b).take(6) {
                let side = if a.contains(d) { "only here " } else { "only there" };
                eprintln!("  {side}: {} gen {} {:?}", d.0, d.1, d.2);
            }
        }
    }

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
