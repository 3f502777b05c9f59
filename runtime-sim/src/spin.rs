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
//!   signal `protocol.drain_window_s` before the walltime, and Slurm kills what is left at the
//!   walltime — the same world model as the static nodes (`world.rs`), with no requeue: an
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

use crate::rng::{self, Stream};
use crate::scenario::{ModelDemand, Scenario, SpinPlan};
use crate::sim::{host_of, id_of, micros, Kind, Micros, Sim, Stop};
use crate::track::quantile;
use crate::world::Routed;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::time::Duration;
use tela_core::cold_start::{ColdStartQueue, Enqueued};
use tela_core::placement::{place, NodeShape};
use tela_core::spin::{DemandMeter, JobId, JobStatus, ModelPolicy, SpinCommand, SpinView, Spinner};
use tela_core::{Lifecycle, Model, Time};

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
}

/// The spinning side of a simulation.
pub(crate) struct SpinWorld {
    pub spinner: Spinner,
    /// The scenario's `[spin]`, checked.
    pub plan: SpinPlan,
    pub policies: Vec<ModelPolicy>,
    /// Every partition with all its nodes free.
    pub shapes: Vec<NodeShape>,
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

fn uniform(rng: &mut ChaCha8Rng, [lo, hi]: [f64; 2]) -> f64 {
    if hi > lo {
        rng.random_range(lo..hi)
    } else {
        lo
    }
}

/// Arrivals per second for model `m` at `t`: the daily curve inside the active hours, plus bursts.
pub(crate) fn rate_at(sc: &Scenario, demand: &ModelDemand, t: Micros) -> f64 {
    let secs = t as f64 / 1e6;
    let hour = (secs / 3600.0) % 24.0;
    let [from, to] = demand.active_hours;
    let mut rate = 0.0;
    if hour >= from && hour < to {
        let phase = 2.0 * std::f64::consts::PI * (hour - demand.peak_hour) / 24.0;
        rate = demand.base_per_s + (demand.peak_per_s - demand.base_per_s) * (1.0 + phase.cos()) / 2.0;
    }
    for b in sc.spin.burst.iter().filter(|b| b.model == demand.model) {
        let start = b.start_h * 3600.0;
        if secs >= start && secs < start + b.minutes * 60.0 {
            rate += b.rate_per_s;
        }
    }
    rate
}

impl SpinWorld {
    fn new(sc: &Scenario, seed: u64, gateways: u32) -> SpinWorld {
        // The scenario was validated; a plan refused now is a bug worth a panic in its own words.
        let plan = sc.spin.plan().unwrap_or_else(|e| panic!("scenario '{}': {e}", sc.name));
        let policies: Vec<ModelPolicy> = plan.models.iter().map(|m| m.policy.clone()).collect();
        let spinner =
            Spinner::new(plan.limits, policies.clone()).unwrap_or_else(|e| panic!("scenario '{}': {e}", sc.name));
        let n = plan.models.len();
        let lambda_max = plan.models.iter().map(|m| m.demand.peak_per_s).sum::<f64>()
            + sc.spin.burst.iter().map(|b| b.rate_per_s).sum::<f64>();
        let minutes = (sc.duration_s / 60.0).ceil() as usize + 1;
        let cold = plan.cold_start;
        SpinWorld {
            spinner,
            policies,
            shapes: plan.shapes.clone(),
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
        place(&self.policies[m].spec, &self.shapes).map_or(0, |p| p.gpus())
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

    fn next_spin_arrival(&mut self) -> Micros {
        let rate = self.spin.as_ref().map_or(0.0, |s| s.lambda_max);
        let u: f64 = self.work_rng.random_range(f64::EPSILON..1.0);
        self.now + micros(-u.ln() / rate)
    }

    /// A candidate arrival at the peak rate, kept with probability rate(t) / peak (thinning).
    pub(crate) fn spin_arrival(&mut self) {
        let next = self.next_spin_arrival();
        self.at(next, Kind::SpinArrival);
        let Some(spin) = self.spin.as_ref() else { return };
        let n = spin.plan.models.len();
        let mut u = self.work_rng.random_range(0.0..spin.lambda_max);
        let mut picked = None;
        for m in 0..n {
            let r = rate_at(&self.sc, &spin.plan.models[m].demand, self.now);
            if u < r {
                picked = Some(m);
                break;
            }
            u -= r;
        }
        let Some(m) = picked else { return };
        let tokens = {
            let [lo, hi] = spin.plan.models[m].demand.tokens;
            self.work_rng.random_range(lo..=hi.max(lo))
        };
        let w = &self.sc.workload;
        let service_s = w.ttft_ms / 1e3 + f64::from(tokens) / w.tokens_per_s;
        let now = self.now;
        let spin = self.spin.as_mut().expect("checked");
        let minute = (now / MINUTE) as usize;
        if let Some(slot) = spin.m.load_s[m].get_mut(minute) {
            *slot += service_s;
            spin.m.arrivals[m][minute] += 1;
        }
        spin.meters[m].arrive(Time(now));
        self.t.sent += 1;
        let name = spin.plan.models[m].name().to_string();
        let Some(g) = self.client_gateway() else { return };
        match self.route_request(g, &name, Some(tokens), Some(m as u16), now) {
            Routed::Placed | Routed::Stopped => {}
            Routed::Exhausted => self.t.failed += 1,
            Routed::NoReplica => self.cold_enqueue(g, m, Waiting { model: m as u16, arrived: now, tokens }),
        }
    }

    fn cold_enqueue(&mut self, g: u32, m: usize, w: Waiting) {
        let now = self.now;
        let spin = self.spin.as_mut().expect("spinning");
        let n = spin.plan.models.len();
        let was_idle = spin.queued(m) == 0;
        let id = spin.waiting.len() as u32;
        spin.waiting.push(w);
        let q = &mut spin.cold[g as usize * n + m];
        match q.queue.enqueue(Time(now), id) {
            Enqueued::Accepted { deadline } => {
                spin.m.cold_enqueued += 1;
                let at = deadline.as_micros();
                let expire = q.expire_at.map_or(true, |e| e > at);
                if expire {
                    q.expire_at = Some(at);
                }
                // A model with waiting requests and no replica: decide now, not at the next tick.
                let decide = was_idle && !spin.decide_pending;
                spin.decide_pending |= decide;
                if expire {
                    self.at(at, Kind::ColdExpire { gateway: g, model: m as u32 });
                }
                if decide {
                    self.at(now, Kind::SpinDecide);
                }
            }
            Enqueued::Full(_) => {
                spin.m.cold_refused += 1;
                self.t.failed += 1;
            }
        }
    }

    pub(crate) fn cold_expire(&mut self, g: u32, m: u32) {
        let now = self.now;
        let Some(spin) = self.spin.as_mut() else { return };
        let n = spin.plan.models.len();
        let q = &mut spin.cold[g as usize * n + m as usize];
        if q.expire_at != Some(now) {
            return;
        }
        let expired = q.queue.expire(Time(now));
        q.expire_at = q.queue.next_deadline().map(|d| d.as_micros());
        if let Some(at) = q.expire_at {
            self.at(at, Kind::ColdExpire { gateway: g, model: m });
        }
        let spin = self.spin.as_mut().expect("spinning");
        spin.m.cold_timed_out += expired.len() as u64;
        self.t.failed += expired.len() as u64;
    }

    /// Gateway `g` now routes to node `n`: release the requests waiting for its models.
    pub(crate) fn cold_release(&mut self, g: u32, n: u32) {
        let Some(spin) = self.spin.as_ref() else { return };
        if !self.hosts[g as usize].gateway {
            return;
        }
        let models: Vec<usize> =
            self.hosts[n as usize].models.iter().filter_map(|m| spin.model_index(&m.name)).collect();
        let now = self.now;
        for m in models {
            let spin = self.spin.as_mut().expect("spinning");
            let n_models = spin.plan.models.len();
            let released = spin.cold[g as usize * n_models + m].queue.on_replica_ready(Time(now));
            for id in released {
                let spin = self.spin.as_ref().expect("spinning");
                let (w, name) = (spin.waiting[id as usize], spin.plan.models[m].name().to_string());
                match self.route_request(g, &name, Some(w.tokens), Some(w.model), w.arrived) {
                    Routed::Placed => {
                        let spin = self.spin.as_mut().expect("spinning");
                        spin.m.cold_waits_ms.push((now - w.arrived) as f64 / 1e3);
                    }
                    Routed::Stopped => {}
                    Routed::NoReplica | Routed::Exhausted => {
                        self.spin.as_mut().expect("spinning").m.cold_unrouted += 1;
                        self.t.failed += 1;
                    }
                }
            }
        }
    }

    /// A spin request was placed: count it in flight and note its time to first byte.
    pub(crate) fn spin_placed(&mut self, m: u16, ttfb: Micros) {
        let now = self.now;
        if let Some(spin) = self.spin.as_mut() {
            let meter = &mut spin.meters[m as usize];
            meter.enter();
            meter.first_byte(Time(now), Duration::from_micros(ttfb));
        }
    }

    /// A spin request finished or failed.
    pub(crate) fn spin_request_over(&mut self, m: u16) {
        if let Some(spin) = self.spin.as_mut() {
            spin.meters[m as usize].leave();
        }
    }

    /// What the gateway observes, for the spinner.
    fn spin_view(&mut self) -> SpinView {
        let now = self.now;
        let gw = (0..self.sc.federation.gateways).find(|&g| self.hosts[g as usize].running());
        let spin = self.spin.as_mut().expect("spinning");
        let mut view = SpinView::default();
        for (m, model) in spin.plan.models.iter().enumerate() {
            let queued = spin.queued(m);
            view.demand.insert(model.name().to_string(), spin.meters[m].demand(Time(now), queued));
        }
        for (id, job) in spin.jobs.iter().filter(|(_, j)| j.ended.is_none()) {
            view.jobs.push(match job.host {
                None => JobStatus::queued(JobId(*id)),
                Some(h) => JobStatus::running(JobId(*id), Some(id_of(h))),
            });
        }
        view.shapes = spin.shapes.clone();
        for (shape, used) in view.shapes.iter_mut().zip(&spin.used_nodes) {
            shape.free_nodes = shape.free_nodes.saturating_sub(*used);
        }
        if let Some(node) = gw.and_then(|g| self.hosts[g as usize].node.as_ref()) {
            // As the gateway's spinner sees them: one rule, in the core.
            let gateways = self.sc.federation.gateways;
            view.add_replicas(
                node.replica(),
                node.local_record().id,
                |m| spin.model_index(m).is_some(),
                |id| (0..gateways).map(|g| self.hosts[g as usize].load_of(host_of(id))).sum(),
            );
        }
        view
    }

    /// One decision of the spinner, and its commands executed.
    pub(crate) fn spin_decide(&mut self, periodic: bool) {
        if periodic {
            self.after(micros(self.spin_interval_s()), Kind::SpinTick);
        } else if let Some(spin) = self.spin.as_mut() {
            spin.decide_pending = false;
        }
        if self.spin.is_none() {
            return;
        }
        let view = self.spin_view();
        let now = self.now;
        let spin = self.spin.as_mut().expect("spinning");
        let commands = spin.spinner.decide(Time(now), &view);
        for c in commands {
            self.spin_execute(c);
        }
        self.spin_check_caps();
    }

    fn spin_check_caps(&mut self) {
        let spin = self.spin.as_mut().expect("spinning");
        let live = spin.live_jobs() as u32;
        spin.m.max_live_jobs = spin.m.max_live_jobs.max(live);
        let used = spin.spinner.budget_used_gpu_secs();
        spin.m.max_budget_gpu_s = spin.m.max_budget_gpu_s.max(used);
        let over = spin.used_nodes.iter().zip(&spin.shapes).map(|(u, s)| i64::from(*u) - i64::from(s.free_nodes)).max();
        spin.m.max_nodes_over = spin.m.max_nodes_over.max(over.unwrap_or(0));
        let limits = spin.plan.limits;
        let mut broken = None;
        if live > limits.max_concurrent_jobs {
            broken = Some(format!(
                "spinner holds {live} live jobs, above max_concurrent_jobs {}",
                limits.max_concurrent_jobs
            ));
        } else if let Some(b) = limits.budget.filter(|b| used > b.gpu_hours * 3600) {
            broken = Some(format!(
                "spinner charged {:.1} GPU-hours in its window, above the budget of {}",
                used as f64 / 3600.0,
                b.gpu_hours
            ));
        } else if over.unwrap_or(0) > 0 {
            broken = Some("spinner jobs hold more nodes than a partition has".to_string());
        }
        if let Some(msg) = broken {
            self.fail(msg);
        }
    }

    fn spin_execute(&mut self, c: SpinCommand) {
        let now = self.now;
        let spin = self.spin.as_mut().expect("spinning");
        match c {
            SpinCommand::Submit { job, model, placement, walltime, .. } => {
                let Some(m) = spin.model_index(&model) else { return };
                spin.m.submits += 1;
                if let Some(at) = spin.last_release[m] {
                    if now - at < micros(spin.policies[m].cooldown.as_secs_f64()) {
                        spin.m.submits_in_cooldown += 1;
                    }
                }
                let p = placement.shape;
                spin.used_nodes[p] += placement.pipeline_stages;
                spin.jobs.insert(
                    job.0,
                    SimJob {
                        model: m,
                        partition: p,
                        nodes: placement.pipeline_stages,
                        gpus: placement.gpus(),
                        walltime: micros(walltime.as_secs_f64()),
                        host: None,
                        started: None,
                        serving: false,
                        ended: None,
                    },
                );
                let wait = micros(uniform(&mut spin.rng, spin.plan.queue_wait_s[p]));
                self.after(wait, Kind::SpinStart(job.0 as u32));
            }
            SpinCommand::Cancel { job } => {
                spin.m.cancels += 1;
                let Some(j) = spin.jobs.get(&job.0).cloned() else { return };
                if j.ended.is_some() {
                    return;
                }
                spin.last_release[j.model] = Some(now);
                if !j.serving {
                    spin.m.cancelled_before_serving += 1;
                }
                match j.host {
                    None => self.spin_job_over(job.0, None),
                    Some(h) => {
                        self.stop_process(h, Stop::Exit);
                        self.spin_job_over(job.0, None);
                    }
                }
            }
            SpinCommand::Drain { node } => {
                spin.m.drains += 1;
                let h = host_of(&node);
                if let Some(&id) = spin.host_job.get(&h) {
                    let m = spin.jobs[&id].model;
                    spin.last_release[m] = Some(now);
                }
                self.t.drain_cause.insert(h, crate::track::DrainCause::Release);
                self.hosts[h as usize].ending = true;
                self.feed(h, tela_core::Input::DrainRequested);
            }
        }
    }

    /// A job leaves the queue: a fresh serving node starts.
    pub(crate) fn spin_start(&mut self, job: u64) {
        let now = self.now;
        let Some(spin) = self.spin.as_mut() else { return };
        let Some(j) = spin.jobs.get(&job) else { return };
        if j.ended.is_some() {
            return;
        }
        let (m, p, walltime) = (j.model, j.partition, j.walltime);
        let hardware = spin.shapes[p].hardware.clone();
        let model = Model::named(spin.plan.models[m].name().to_string());
        let sites = self.sc.network.sites;
        let h = self.hosts.len() as u32;
        self.new_host(false, false, p as u32 % sites, hardware, vec![model]);
        self.hosts[h as usize].walltime = Some(now + walltime);
        let spin = self.spin.as_mut().expect("spinning");
        spin.host_job.insert(h, job);
        let j = spin.jobs.get_mut(&job).expect("listed");
        j.host = Some(h);
        j.started = Some(now);
        spin.m.started += 1;
        self.start(h);
    }

    /// The engine start-up range of a spinner job's host, if `h` is one.
    pub(crate) fn spin_startup(&self, h: u32) -> Option<[f64; 2]> {
        let spin = self.spin.as_ref()?;
        let job = spin.host_job.get(&h)?;
        Some(spin.plan.models[spin.jobs[job].model].demand.engine_startup_s)
    }

    /// Whether host `h` runs a spinner job.
    pub(crate) fn is_spin_host(&self, h: u32) -> bool {
        self.spin.as_ref().is_some_and(|s| s.host_job.contains_key(&h))
    }

    /// A spinner job's node started serving.
    pub(crate) fn spin_serving(&mut self, h: u32) {
        if let Some(spin) = self.spin.as_mut() {
            if let Some(j) = spin.host_job.get(&h).and_then(|id| spin.jobs.get_mut(id)) {
                if !j.serving {
                    j.serving = true;
                    spin.m.served += 1;
                }
            }
        }
    }

    /// A spinner job's process ended (walltime, kill after preemption, exit after its drain).
    pub(crate) fn spin_host_stopped(&mut self, h: u32, how: crate::track::DrainCause) {
        let Some(spin) = self.spin.as_mut() else { return };
        let Some(&job) = spin.host_job.get(&h) else { return };
        match how {
            crate::track::DrainCause::Walltime => spin.m.ended_walltime += 1,
            crate::track::DrainCause::Preemption => spin.m.ended_preempted += 1,
            crate::track::DrainCause::Release => spin.m.ended_drained += 1,
        }
        self.spin_job_over(job, Some(h));
    }

    fn spin_job_over(&mut self, job: u64, host: Option<u32>) {
        let now = self.now;
        let spin = self.spin.as_mut().expect("spinning");
        if let Some(h) = host {
            spin.host_job.remove(&h);
        }
        if let Some(j) = spin.jobs.get_mut(&job) {
            if j.ended.is_none() {
                j.ended = Some(now);
                spin.used_nodes[j.partition] = spin.used_nodes[j.partition].saturating_sub(j.nodes);
            }
        }
    }

    /// Slurm preempts one running spinner job, drawn uniformly. With none running (the night),
    /// the preemption waits ten minutes for one, until faults stop.
    pub(crate) fn spin_preempt(&mut self) {
        let Some(spin) = self.spin.as_ref() else { return };
        let eligible: Vec<u32> = spin
            .host_job
            .keys()
            .copied()
            .filter(|&h| self.hosts[h as usize].running() && self.hosts[h as usize].state < Lifecycle::Down)
            .collect();
        if eligible.is_empty() {
            if self.now + 10 * MINUTE < micros(self.sc.faults_until_s) {
                self.after(10 * MINUTE, Kind::SpinPreempt);
            }
            return;
        }
        let spin = self.spin.as_mut().expect("spinning");
        let h = eligible[spin.rng.random_range(0..eligible.len())];
        spin.m.preemptions += 1;
        self.preempt(h);
    }

    /// The once-a-minute sample of the timeline.
    pub(crate) fn spin_minute(&mut self) {
        self.after(MINUTE, Kind::SpinMinute);
        let Some(spin) = self.spin.as_ref() else { return };
        let n = spin.plan.models.len();
        let mut minute = Minute { serving: vec![0; n], demand: vec![0; n], gpus: 0 };
        for (&h, job) in &spin.host_job {
            let j = &spin.jobs[job];
            minute.gpus += j.gpus;
            if self.hosts[h as usize].state == Lifecycle::Serve {
                minute.serving[j.model] += 1;
            }
        }
        for m in 0..n {
            minute.demand[m] = spin.queued(m) + spin.meters[m].in_flight();
        }
        self.spin.as_mut().expect("spinning").m.timeline.push(minute);
    }

    /// Requests still waiting in cold-start queues.
    pub(crate) fn spin_waiting(&self) -> u64 {
        self.spin.as_ref().map_or(0, |s| s.cold.iter().map(|q| q.queue.len() as u64).sum())
    }
}

/// GPU-hours and jobs, computed at the end of a run.
pub(crate) struct Usage {
    pub gpu_hours: f64,
    pub oracle_gpu_hours: f64,
    pub live_at_end: u64,
    pub queued_at_end: u64,
    pub min_replicas: u64,
    pub oracle_replicas: Vec<Vec<u32>>,
    /// Per partition: jobs started and GPU-hours used.
    pub partitions: Vec<(u64, f64)>,
}

impl SpinWorld {
    /// The replicas the oracle runs for model `m` in each minute: the policy's scale-up rule
    /// applied to that minute's demand, known in advance (mean concurrency = service seconds
    /// demanded / 60 over `concurrency_per_replica`; arrivals over `arrivals_per_replica`; at
    /// least one replica in any minute with an arrival), within min/max.
    fn oracle(&self, m: usize) -> Vec<u32> {
        let p = &self.policies[m];
        self.m.load_s[m]
            .iter()
            .zip(&self.m.arrivals[m])
            .map(|(load, arrivals)| {
                let by_load = (load / 60.0 / f64::from(p.concurrency_per_replica)).ceil() as u32;
                let by_rate = p.arrivals_per_replica.map_or(0, |r| arrivals.div_ceil(r));
                by_load.max(by_rate).max(u32::from(*arrivals > 0)).clamp(p.min_replicas, p.max_replicas)
            })
            .collect()
    }

    pub(crate) fn usage(&self, now: Micros) -> Usage {
        let gpu_s: f64 = self
            .jobs
            .values()
            .filter_map(|j| Some(f64::from(j.gpus) * (j.ended.unwrap_or(now) - j.started?) as f64 / 1e6))
            .sum();
        let mut partitions = vec![(0u64, 0.0f64); self.shapes.len()];
        for j in self.jobs.values() {
            if let Some(start) = j.started {
                partitions[j.partition].0 += 1;
                partitions[j.partition].1 += f64::from(j.gpus) * (j.ended.unwrap_or(now) - start) as f64 / 3.6e9;
            }
        }
        let oracle_replicas: Vec<Vec<u32>> = (0..self.plan.models.len()).map(|m| self.oracle(m)).collect();
        let elapsed = (now.div_ceil(MINUTE) as usize).min(self.m.load_s.first().map_or(0, Vec::len));
        let oracle_gpu_h: f64 = oracle_replicas
            .iter()
            .enumerate()
            .map(|(m, per_min)| {
                let total: u64 = per_min.iter().take(elapsed).map(|r| u64::from(*r)).sum();
                total as f64 * f64::from(self.gpus_per_replica(m)) / 60.0
            })
            .sum();
        Usage {
            gpu_hours: gpu_s / 3600.0,
            oracle_gpu_hours: oracle_gpu_h,
            live_at_end: self.jobs.values().filter(|j| j.ended.is_none()).count() as u64,
            queued_at_end: self.jobs.values().filter(|j| j.ended.is_none() && j.host.is_none()).count() as u64,
            min_replicas: self.policies.iter().map(|p| u64::from(p.min_replicas)).sum(),
            oracle_replicas,
            partitions,
        }
    }

    /// Cold-start waits, sorted percentiles in ms: (count, p50, p99, max).
    pub(crate) fn cold_waits(&self) -> (usize, f64, f64, f64) {
        let mut v = self.m.cold_waits_ms.clone();
        (v.len(), quantile(&mut v, 0.5), quantile(&mut v, 0.99), quantile(&mut v, 1.0))
    }
}
