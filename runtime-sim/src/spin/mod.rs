//! Model spinning: the core's [`Spinner`] drives simulated Slurm jobs.
//!
//! A simulated gateway tier measures demand per model — the cold-start queues (core
//! [`ColdStartQueue`], one per gateway and model), requests in flight, arrivals over the last
//! minute and the p95 time to first byte — and lists the spinner's jobs (queued with a queue wait
//! drawn from the partition's range, running once started, with the node the job became) and the
//! free nodes of each partition. Every `spin.interval`, and at once when a request finds no
//! replica, it calls [`Spinner::decide`] and executes the commands:
//!
//! - `Submit`: the job waits in its partition's queue, then a fresh serving node starts (JOIN),
//!   its engine loads (`engine_startup_s` of the model), it serves, it gets the walltime drain
//!   signal its model's `drain_window` (or `protocol.drain_window_s`) before the walltime, and
//!   Slurm kills what is left at the walltime — the same world model as the static nodes (`world.rs`), with no requeue: an
//!   ended job frees its partition's nodes and the spinner decides whether to replace it;
//! - `Cancel`: a queued job leaves the queue; a started one (not serving yet) is killed;
//! - `Drain`: the node drains gracefully; in-flight requests finish, then the job exits.
//!
//! Requests for a model with no routable replica wait in the gateway's cold-start queue and are
//! routed when a replica becomes routable at that gateway, or answered with a timeout error.
//! Preemptions hit running spinner jobs (drain signal, kill after the grace period).
//!
//! What it measures (see `report.rs` for the definitions): cold-start waits, GPU-hours used
//! against an oracle that knows the demand in advance, flaps, and a per-minute timeline.
//!
//! The submodules follow the seams of that loop: `demand` holds the arrivals (the daily curve
//! and bursts, thinned from the peak rate) and the cold-start queues; `jobs` the spin view, the
//! decisions and their commands, and the lifecycle of a spinner job from its submission to its
//! end; `usage` the per-minute timeline, GPU-hours against the oracle and the cold-start waits.
//! This module holds the state they share ([`SpinWorld`] and what it measures) and sets spinning
//! up.

mod demand;
mod jobs;
mod usage;

use crate::rng::{self, Stream};
use crate::scenario::{Scenario, SpinPlan};
use crate::sim::{micros, Kind, Micros, Sim};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use tela_core::cold_start::ColdStartQueue;
use tela_core::placement::place;
use tela_core::spin::{DemandMeter, Spinner};

const MINUTE: Micros = 60_000_000;

/// A request waiting in a cold-start queue.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Waiting {
    model: u16,
    arrived: Micros,
    tokens: u32,
}

/// One of the spinner's jobs in the simulated batch system.
#[derive(Clone, Debug)]
pub(crate) struct SimJob {
    model: usize,
    partition: usize,
    nodes: u32,
    gpus: u32,
    walltime: Micros,
    /// The host the job became, once it started.
    host: Option<u32>,
    started: Option<Micros>,
    serving: bool,
    ended: Option<Micros>,
}

#[derive(Debug)]
struct ColdQueue {
    queue: ColdStartQueue<u32>,
    /// The expiry event scheduled for this queue, if any.
    expire_at: Option<Micros>,
}

/// One minute of the day: per model (serving replicas, live jobs, requests queued + in flight,
/// replicas the spinner wanted), and GPUs allocated to running jobs.
#[derive(Clone, Debug, Default)]
pub struct Minute {
    /// Per model: replicas in SERVE.
    pub serving: Vec<u32>,
    /// Per model: requests queued or in flight at the sample.
    pub demand: Vec<u32>,
    /// GPUs held by running jobs.
    pub gpus: u32,
}

/// What spinning measured.
#[derive(Clone, Debug, Default)]
pub(crate) struct SpinMeasures {
    pub submits: u64,
    pub cancels: u64,
    pub drains: u64,
    pub started: u64,
    pub served: u64,
    pub cancelled_before_serving: u64,
    pub submits_in_cooldown: u64,
    pub ended_walltime: u64,
    pub ended_preempted: u64,
    pub ended_drained: u64,
    pub preemptions: u64,
    pub cold_waits_ms: Vec<f64>,
    pub cold_enqueued: u64,
    pub cold_timed_out: u64,
    pub cold_refused: u64,
    pub cold_unrouted: u64,
    pub max_live_jobs: u32,
    pub max_budget_gpu_s: u64,
    pub max_nodes_over: i64,
    /// Per model, per minute: seconds of service demanded and arrivals (the oracle's input).
    pub load_s: Vec<Vec<f64>>,
    pub arrivals: Vec<Vec<u32>>,
    pub timeline: Vec<Minute>,
    /// Every command of the spinner, in order.
    pub commands: Vec<crate::report_spin::SpinCommandRecord>,
}

/// The spinning side of a simulation.
pub(crate) struct SpinWorld {
    pub spinner: Spinner,
    /// The scenario's `[spin]`, checked.
    pub plan: SpinPlan,
    used_nodes: Vec<u32>,
    rng: ChaCha8Rng,
    pub jobs: BTreeMap<u64, SimJob>,
    pub host_job: BTreeMap<u32, u64>,
    cold: Vec<ColdQueue>,
    waiting: Vec<Waiting>,
    /// Per model: demand as the gateway tier measures it (the core's meter).
    meters: Vec<DemandMeter>,
    last_release: Vec<Option<Micros>>,
    lambda_max: f64,
    decide_pending: bool,
    pub m: SpinMeasures,
}

impl SpinWorld {
    fn new(sc: &Scenario, seed: u64, gateways: u32) -> SpinWorld {
        // The scenario was validated; a plan refused now is a bug worth a panic in its own words.
        let plan = sc.spin.plan().unwrap_or_else(|e| panic!("scenario '{}': {e}", sc.name));
        let policies = plan.models.iter().map(|m| m.policy.clone()).collect();
        let spinner = Spinner::new(plan.limits, policies).unwrap_or_else(|e| panic!("scenario '{}': {e}", sc.name));
        let n = plan.models.len();
        let lambda_max = plan.models.iter().map(|m| m.demand.peak_per_s).sum::<f64>()
            + sc.spin.burst.iter().map(|b| b.rate_per_s).sum::<f64>();
        let minutes = (sc.duration_s / 60.0).ceil() as usize + 1;
        let cold = plan.cold_start;
        SpinWorld {
            spinner,
            used_nodes: vec![0; plan.shapes.len()],
            rng: rng::stream(seed, Stream::Spin),
            jobs: BTreeMap::new(),
            host_job: BTreeMap::new(),
            cold: (0..gateways as usize * n)
                .map(|_| ColdQueue { queue: ColdStartQueue::new(cold.capacity, cold.timeout), expire_at: None })
                .collect(),
            waiting: Vec::new(),
            meters: vec![DemandMeter::default(); n],
            last_release: vec![None; n],
            lambda_max,
            decide_pending: false,
            plan,
            m: SpinMeasures {
                load_s: vec![vec![0.0; minutes]; n],
                arrivals: vec![vec![0; minutes]; n],
                ..Default::default()
            },
        }
    }

    fn model_index(&self, name: &str) -> Option<usize> {
        self.plan.models.iter().position(|m| m.name() == name)
    }

    fn queued(&self, m: usize) -> u32 {
        let n = self.plan.models.len();
        self.cold.iter().skip(m).step_by(n).map(|q| q.queue.len() as u32).sum()
    }

    fn live_jobs(&self) -> usize {
        self.jobs.values().filter(|j| j.ended.is_none()).count()
    }

    /// GPUs a replica of model `m` takes where the spinner would put it with every node free.
    pub(crate) fn gpus_per_replica(&self, m: usize) -> u32 {
        place(&self.plan.models[m].policy.spec, &self.plan.shapes).map_or(0, |p| p.gpus())
    }
}

impl Sim {
    /// Sets spinning up, if the scenario names spinnable models.
    pub(crate) fn spin_build(&mut self) {
        if !self.sc.spin.enabled() {
            return;
        }
        let spin = SpinWorld::new(&self.sc, self.seed, self.sc.federation.gateways);
        let lambda = spin.lambda_max;
        self.spin = Some(Box::new(spin));
        self.at(micros(self.spin_interval_s()), Kind::SpinTick);
        self.at(MINUTE, Kind::SpinMinute);
        if lambda > 0.0 {
            let first = self.next_spin_arrival();
            self.at(first, Kind::SpinArrival);
        }
        let trace: Vec<Micros> = self.sc.spin.trace.iter().map(|step| micros(step.at_s)).collect();
        for (i, at) in trace.into_iter().enumerate() {
            self.at(at, Kind::SpinTrace(i as u32));
        }
        let until = self.sc.faults_until_s;
        self.t.preemptions_scheduled += u64::from(self.sc.spin.preemptions);
        for _ in 0..self.sc.spin.preemptions {
            let spin = self.spin.as_mut().expect("just set");
            let t = micros(spin.rng.random_range(0.0..until.max(1e-3)));
            self.at(t, Kind::SpinPreempt);
        }
    }

    /// Seconds between two periodic decisions.
    fn spin_interval_s(&self) -> f64 {
        self.spin.as_ref().map_or(1.0, |s| s.plan.interval.as_secs_f64())
    }
}
