//! What happens on the global timeline: the event kinds, the tags the determinism hash takes
//! of them, and the order of the event queue (time, then the sequence of scheduling).

use super::Micros;
use bytes::Bytes;
use std::cmp::Ordering;

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
    /// Step `i` of the scenario's demand trace (`[[spin.trace]]`).
    SpinTrace(u32),
}

impl Kind {
    /// The event's identity in the determinism hash: a kind number and up to two operands.
    pub(super) fn tag(&self) -> (u8, u32, u32) {
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
            Kind::SpinTrace(i) => (25, *i, 0),
        }
    }
}

/// One scheduled event; the queue pops the earliest, and of equal times the first scheduled.
#[derive(Debug)]
pub(super) struct Ev {
    pub(super) at: Micros,
    pub(super) seq: u64,
    pub(super) kind: Kind,
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
