//! The event loop: virtual time, the hosts that run core nodes, and the network between them.
//!
//! One thread, one priority queue of `(time, sequence)` events. A host is woken only at the
//! deadline its node reported (stale wake-ups are recognised and skipped), so idle nodes cost
//! nothing. Each host has its own clock (offset and drift): the node is always fed its local
//! time, and its local deadlines are mapped back onto the global timeline.
//!
//! This module holds the loop: scheduling, dispatch, and feeding nodes and draining their
//! outputs. `event` defines the events, `host` the hosts and their clocks, `network` the
//! datagrams between them, `connections` the connections to gateways and their timeouts,
//! `sample` the once-a-second sample and resource guards, `liveness` the liveness phase.

mod connections;
mod event;
mod host;
mod liveness;
mod network;
mod sample;

pub(crate) use connections::Stop;
pub(crate) use event::Kind;
pub(crate) use host::{host_of, id_of, Host};

use crate::rng::{self, Stream};
use crate::scenario::Scenario;
use crate::track::Trackers;
use event::Ev;
use foldhash::fast::FixedState;
use rand_chacha::ChaCha8Rng;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;
use tela_core::{Input, Output};

/// Microseconds on the global (true) timeline.
pub type Micros = u64;

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
            Kind::SpinTrace(i) => self.spin_trace(i),
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
        let via = match &input {
            Input::Datagram { payload, .. } if self.t.tracing => payload.get(1).copied(),
            _ => None,
        };
        node.handle_input(local, input);
        let changed = node.stats().records_changed != before;
        if changed {
            self.after_merge(h, via);
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

    /// Builds the hosts and schedules the world (see `world.rs`).
    fn setup(&mut self) {
        crate::world::build(self);
    }
}
