//! Spinning: turning demand per model into batch jobs that start serving nodes, and back.
//!
//! A [`Spinner`] holds one [`ModelPolicy`] per model the operator allows to spin and a ledger of
//! the jobs it submitted. The runtime calls [`Spinner::decide`] periodically (every few seconds)
//! and whenever something changed, with `now` and a [`SpinView`] of what it observes: demand per
//! model, the registry's replicas, the spinner's jobs the batch system still lists, and the free
//! [`NodeShape`]s. It gets back [`SpinCommand`]s to execute (sbatch, scancel, `tela drain`).
//! Time never goes backwards: an earlier `now` is treated as the latest one seen.
//!
//! # Contract with the runtime
//!
//! - Every [`SpinCommand::Submit`] carries a [`JobId`] chosen by the spinner. The runtime records
//!   the job the moment it receives the command and lists it in [`SpinView::jobs`] — queued while
//!   it is submitting or waiting in the batch queue, running once it runs, with the node it became
//!   once that is known — until the job has ended (or its submission failed). A job missing from
//!   the view has ended: its allocation is released.
//! - [`SpinView::replicas`] lists the registry's nodes hosting a spinnable model, whatever started
//!   them. Nodes that are not the spinner's jobs (workstations, static allocations) count as
//!   capacity but are never drained by it.
//!
//! # Rules
//!
//! *Supply* is the replicas that serve or will serve: the spinner's live jobs it has not released
//! and whose node is not draining, plus other nodes in JOIN or SERVE. Draining (DOWN) replicas do
//! not count — a node that starts draining before its walltime is replaced if demand still wants it.
//!
//! - **Scale up** to `ceil((queued + in_flight) / concurrency_per_replica)`, to
//!   `ceil(arrivals / arrivals_per_replica)` if set, and to one more than the serving replicas
//!   when the p95 latency is above its target and nothing is starting; at least one replica as
//!   soon as any request waits; never below `min_replicas` nor above `max_replicas`. Extra jobs
//!   are submitted at once (a burst gets all its replicas in one decision), then no further
//!   scale-up happens for `cooldown` — except for a model with no replica at all, whose waiting
//!   requests are never held back.
//! - **Scale down** only when demand stayed below what fewer replicas carry at
//!   `scale_down_percent` of their thresholds (the hysteresis band: by default a replica must be
//!   half as loaded as the scale-up threshold) for a whole `scale_down_after`, counted from the last
//!   action. Then supply drops to the most replicas needed at any moment of that period. Jobs not
//!   serving yet are cancelled first (newest first), then serving nodes are drained, the least
//!   busy first, gracefully: their in-flight requests finish.
//! - **Batch backlog** ([`Demand::batch_replicas`]) is low-priority demand: it raises the
//!   replicas wanted (within `max_replicas`) and holds them from scale-down while it lasts, but
//!   its shortfalls are granted only after every interactive one, and a job submitted when
//!   interactive demand alone is covered is a batch job: [`SpinCommand::Submit::batch`], with
//!   [`ModelPolicy::batch_walltime`]. Such replicas are released like any other once the
//!   backlog and the other demand are gone.
//! - **Budgets** bound what is submitted: at most `max_concurrent_jobs` live jobs (queued,
//!   running or draining) and, per sliding `window`, at most `gpu_hours` GPU-hours. A job's
//!   GPU-hours count against the window of its submission: GPUs × walltime while it is live (the
//!   most it can use), GPUs × the time it ran once it ended (cancelled in the queue: nothing). When
//!   budgets cannot grant every wanted replica, models with no replica at all come first, then the
//!   largest shortfalls.
//! - **Placement** of each job is [`place`] over the free shapes the model may use
//!   ([`ModelPolicy::shapes`], in its order; all of them when it names none); each submission
//!   takes its nodes out of the free count for the rest of the decision.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tela_core::placement::{KvHeadroom, ModelSpec, NodeShape};
//! use tela_core::spin::{Demand, ModelPolicy, SpinCommand, SpinConfig, SpinView, Spinner};
//! use tela_core::{GpuModel, Hardware, Quantization, Time};
//!
//! let spec = ModelSpec::new("llama-8b", 8_000, Quantization::Bf16).with_kv(KvHeadroom::gib(2));
//! let mut spinner = Spinner::new(SpinConfig::default(), vec![ModelPolicy::new(spec)]).unwrap();
//! let mut view = SpinView::default();
//! view.shapes.push(NodeShape::new("gpu", Hardware::catalog(GpuModel::A100_80, 4), 8));
//! view.demand.insert("llama-8b".into(), Demand { queued: 3, ..Demand::default() });
//!
//! let commands = spinner.decide(Time::ZERO, &view);
//! let [SpinCommand::Submit { job, placement, .. }] = commands.as_slice() else { panic!("{commands:?}") };
//! assert_eq!(placement.gpus(), 1);
//! // The runtime ran sbatch and lists the job from now on; nothing more is wanted.
//! view.jobs.push(tela_core::spin::JobStatus::queued(*job));
//! assert!(spinner.decide(Time::from_secs(5), &view).is_empty());
//! ```

use crate::id::NodeId;
use crate::placement::{place, NoPlacement, NodeShape, Placement};
use crate::record::Lifecycle;
use crate::time::Time;
use core::cmp::Reverse;
use core::time::Duration;
use std::collections::{BTreeMap, BTreeSet};

pub mod config;
mod demand;
mod policy;
mod slurm_time;
mod view;
pub use demand::DemandMeter;
pub use policy::{GpuHourBudget, ModelPolicy, SpinConfig, SpinConfigError};
pub use slurm_time::parse_slurm_duration;
pub use view::{Demand, JobId, JobState, JobStatus, ReplicaStatus, SpinCommand, SpinView};

/// Why a model did not get all the replicas it wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    /// The last scaling action is more recent than the policy's cooldown.
    Cooldown,
    /// The live-job cap is reached.
    ConcurrentJobs,
    /// The GPU-hour budget of the window is spent.
    Budget,
    /// No free shape hosts the model.
    NoPlacement(NoPlacement),
}

/// The last decision for one model, for metrics and the dashboard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelStatus {
    /// Replicas the demand wants (within min/max).
    pub wanted: u32,
    /// Replicas that serve or will serve.
    pub supply: u32,
    /// Why fewer than `wanted` were started, if so.
    pub blocked: Option<Blocked>,
}

/// Counts of commands issued since the spinner started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpinStats {
    /// Jobs submitted.
    pub submits: u64,
    /// Jobs cancelled.
    pub cancels: u64,
    /// Nodes drained.
    pub drains: u64,
}

#[derive(Debug, Clone)]
struct JobEntry {
    model: String,
    gpus: u32,
    walltime: Duration,
    submitted_at: Time,
    /// The last time the job was seen not running: its start is no earlier.
    not_running_at: Time,
    started_at: Option<Time>,
    ended_at: Option<Time>,
    node: Option<NodeId>,
    /// Cancelled or drained by the spinner: no longer supply.
    released: bool,
}

impl JobEntry {
    fn live(&self) -> bool {
        self.ended_at.is_none()
    }

    /// GPU-seconds charged to the window of its submission.
    fn charge(&self) -> u64 {
        let secs = match (self.started_at, self.ended_at) {
            (_, None) => self.walltime,
            (None, Some(_)) => Duration::ZERO,
            (Some(start), Some(end)) => (end - start).min(self.walltime),
        };
        u64::from(self.gpus) * ceil_secs(secs)
    }
}

#[derive(Debug, Clone)]
struct ModelState {
    policy: ModelPolicy,
    last_action: Option<Time>,
    /// Since when demand has been low enough to release replicas, and the most replicas needed
    /// meanwhile.
    low: Option<(Time, u32)>,
    status: ModelStatus,
}

/// One of the spinner's jobs of a model, as the view shows it now.
enum Readiness {
    /// Not serving yet (queued, starting, node in JOIN): cancel to release.
    NotServing(JobId),
    /// Serving: drain to release.
    Serving { node: NodeId, in_flight: u32, started: Time },
}

/// The spin controller.
///
/// Drive it with [`Spinner::decide`] every few seconds and whenever demand, the registry or a job
/// changed; execute the returned commands in order, recording each submitted job so that the next
/// [`SpinView::jobs`] lists it. It keeps its hysteresis and the job ledger between calls; see the
/// module docs for the rules and the example.
#[derive(Debug, Clone)]
pub struct Spinner {
    config: SpinConfig,
    models: BTreeMap<String, ModelState>,
    jobs: BTreeMap<JobId, JobEntry>,
    next_job: u64,
    now: Time,
    stats: SpinStats,
}

impl Spinner {
    /// A spinner for the given models; fails on an inconsistent policy.
    pub fn new(config: SpinConfig, policies: Vec<ModelPolicy>) -> Result<Spinner, SpinConfigError> {
        if config.budget.is_some_and(|b| b.window.is_zero()) {
            return Err(SpinConfigError::ZeroBudgetWindow);
        }
        let mut models = BTreeMap::new();
        for policy in policies {
            policy.validate()?;
            let name = policy.spec.name.clone();
            let state = ModelState { policy, last_action: None, low: None, status: ModelStatus::default() };
            if models.insert(name.clone(), state).is_some() {
                return Err(SpinConfigError::DuplicateModel(name));
            }
        }
        Ok(Spinner {
            next_job: config.first_job_id,
            config,
            models,
            jobs: BTreeMap::new(),
            now: Time::ZERO,
            stats: SpinStats::default(),
        })
    }

    /// Whether requests for `model` should wait for a replica (it may spin) rather than fail.
    pub fn is_spinnable(&self, model: &str) -> bool {
        self.models.contains_key(model)
    }

    /// The last decision for `model`.
    pub fn status(&self, model: &str) -> Option<&ModelStatus> {
        self.models.get(model).map(|m| &m.status)
    }

    /// Commands issued so far.
    pub fn stats(&self) -> SpinStats {
        self.stats
    }

    /// Live jobs (queued, running or draining).
    pub fn live_jobs(&self) -> usize {
        self.jobs.values().filter(|j| j.live()).count()
    }

    /// GPU-hours charged to the current window, in GPU-seconds.
    pub fn budget_used_gpu_secs(&self) -> u64 {
        let window = self.config.budget.map_or(Duration::MAX, |b| b.window);
        self.jobs.values().filter(|j| j.submitted_at + window > self.now).map(JobEntry::charge).sum()
    }

    /// Decides what to do now, given what the runtime observes; see the module docs.
    pub fn decide(&mut self, now: Time, view: &SpinView) -> Vec<SpinCommand> {
        let now = now.max(self.now);
        self.now = now;
        self.reconcile(now, view);
        let mut commands = Vec::new();
        let mut shortfalls = Vec::new();
        let Spinner { models, jobs, stats, .. } = self;
        for (name, state) in models.iter_mut() {
            let policy = &state.policy;
            let demand = view.demand.get(name).copied().unwrap_or_default();
            let (own, others) = observe(name, jobs, view);
            let supply = u32::try_from(own.len()).unwrap_or(u32::MAX).saturating_add(others.joining + others.serving);
            let serving = others.serving + own.iter().filter(|r| matches!(r, Readiness::Serving { .. })).count() as u32;
            let latency_high = matches!((demand.p95_latency, policy.latency_target), (Some(l), Some(t)) if l > t);
            let clamp = |n: u32| n.clamp(policy.min_replicas, policy.max_replicas);
            let mut up = policy.replicas_for(&demand, 100);
            if latency_high && serving > 0 {
                up = up.max(serving + 1);
            }
            // Replicas interactive demand alone wants; the batch backlog may add low-priority ones.
            let interactive = clamp(up);
            let up = clamp(up.max(demand.batch_replicas));
            let keep = clamp(
                if latency_high { supply } else { policy.replicas_for(&demand, policy.scale_down_percent) }
                    .max(demand.batch_replicas),
            );
            state.status = ModelStatus { wanted: up, supply, blocked: None };

            let cooled = cooled(state.last_action, now, policy.cooldown);
            if up > supply {
                state.low = None;
                if cooled || supply == 0 {
                    // Interactive shortfalls first; what only the backlog wants comes last.
                    let batch_only = interactive <= supply;
                    shortfalls.push((batch_only, supply > 0, Reverse(up - supply), name.clone()));
                } else {
                    state.status.blocked = Some(Blocked::Cooldown);
                }
            } else if keep < supply {
                let (since, peak) = state.low.get_or_insert((now, keep));
                *peak = (*peak).max(keep);
                if now - *since >= policy.scale_down_after && cooled {
                    // Supply may have dropped meanwhile (walltimes): release only what is above the peak.
                    let release = supply.saturating_sub(*peak).min(own.len() as u32);
                    if release > 0 {
                        release_jobs(own, release, jobs, stats, &mut commands);
                        state.last_action = Some(now);
                        state.low = None;
                    } else {
                        // The period's peak is no longer below supply, but demand still is: a new
                        // period starts now, or the stale peak would hold the replicas until
                        // their walltime.
                        state.low = Some((now, keep));
                    }
                }
            } else {
                state.low = None;
            }
        }
        // Budgets go to models without any replica first, then to the largest shortfalls.
        shortfalls.sort();
        let mut shapes = view.shapes.clone();
        for (batch, _, Reverse(missing), name) in shortfalls {
            self.submit(now, &name, missing, batch, &mut shapes, &mut commands);
        }
        commands
    }

    /// Brings the job ledger up to date with the jobs the runtime lists.
    fn reconcile(&mut self, now: Time, view: &SpinView) {
        let listed: BTreeMap<JobId, JobState> = view.jobs.iter().map(|s| (s.job, s.state)).collect();
        for (id, job) in self.jobs.iter_mut().filter(|(_, j)| j.live()) {
            match listed.get(id) {
                None => job.ended_at = Some(now),
                Some(JobState::Queued) => job.not_running_at = now,
                Some(JobState::Running { node }) => {
                    job.started_at.get_or_insert(job.not_running_at);
                    if node.is_some() {
                        job.node = *node;
                    }
                }
            }
        }
        if let Some(budget) = self.config.budget {
            // Ended jobs outside the window no longer count for anything.
            self.jobs.retain(|_, j| j.live() || j.submitted_at + budget.window > now);
        } else {
            self.jobs.retain(|_, j| j.live());
        }
    }

    /// Submits up to `missing` jobs for `name`, within the caps; `batch`: for the backlog only.
    fn submit(
        &mut self,
        now: Time,
        name: &str,
        missing: u32,
        batch: bool,
        shapes: &mut [NodeShape],
        out: &mut Vec<SpinCommand>,
    ) {
        let Some(state) = self.models.get(name) else { return };
        let walltime =
            if batch { state.policy.batch_walltime.unwrap_or(state.policy.walltime) } else { state.policy.walltime };
        let spec = state.policy.spec.clone();
        // The shapes the model may use, in its order of preference, as indices into `shapes`.
        let allowed: Vec<usize> = if state.policy.shapes.is_empty() {
            (0..shapes.len()).collect()
        } else {
            state.policy.shapes.iter().filter_map(|n| shapes.iter().position(|s| s.name == *n)).collect()
        };
        let mut blocked = None;
        let mut submitted = 0;
        for _ in 0..missing {
            if self.live_jobs() >= self.config.max_concurrent_jobs as usize {
                blocked = Some(Blocked::ConcurrentJobs);
                break;
            }
            let candidates: Vec<NodeShape> = allowed.iter().map(|&i| shapes[i].clone()).collect();
            let placement = match place(&spec, &candidates) {
                Ok(p) => Placement { shape: allowed[p.shape], ..p },
                Err(reason) => {
                    blocked = Some(Blocked::NoPlacement(reason));
                    break;
                }
            };
            let gpus = placement.gpus();
            if let Some(budget) = self.config.budget {
                let cost = u64::from(gpus) * ceil_secs(walltime);
                if self.budget_used_gpu_secs().saturating_add(cost) > budget.gpu_hours.saturating_mul(3600) {
                    blocked = Some(Blocked::Budget);
                    break;
                }
            }
            let shape = &mut shapes[placement.shape];
            shape.free_nodes = shape.free_nodes.saturating_sub(placement.pipeline_stages);
            let job = JobId(self.next_job);
            self.next_job += 1;
            self.jobs.insert(
                job,
                JobEntry {
                    model: name.to_string(),
                    gpus,
                    walltime,
                    submitted_at: now,
                    not_running_at: now,
                    started_at: None,
                    ended_at: None,
                    node: None,
                    released: false,
                },
            );
            out.push(SpinCommand::Submit { job, model: name.to_string(), placement, walltime, batch });
            self.stats.submits += 1;
            submitted += 1;
        }
        if let Some(state) = self.models.get_mut(name) {
            if submitted > 0 {
                state.last_action = Some(now);
            }
            state.status.blocked = blocked;
        }
    }
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Whether `cooldown` has passed since `last` (or nothing happened yet).
fn cooled(last: Option<Time>, now: Time, cooldown: Duration) -> bool {
    last.map_or(true, |at| now - at >= cooldown)
}

/// Replicas of `model` that are not the spinner's.
#[derive(Default)]
struct Others {
    joining: u32,
    serving: u32,
}

/// The spinner's unreleased jobs of `model` that are not draining, and other nodes hosting it.
fn observe(model: &str, jobs: &BTreeMap<JobId, JobEntry>, view: &SpinView) -> (Vec<Readiness>, Others) {
    let replicas: BTreeMap<NodeId, &ReplicaStatus> =
        view.replicas.iter().filter(|r| r.model == model).map(|r| (r.node, r)).collect();
    let mut own = Vec::new();
    for (id, job) in jobs.iter().filter(|(_, j)| j.model == model && j.live()) {
        let replica = job.node.and_then(|n| replicas.get(&n));
        if job.released || replica.is_some_and(|r| r.lifecycle >= Lifecycle::Down) {
            continue;
        }
        own.push(match replica {
            Some(r) if r.lifecycle == Lifecycle::Serve => Readiness::Serving {
                node: r.node,
                in_flight: r.in_flight,
                started: job.started_at.unwrap_or(job.submitted_at),
            },
            _ => Readiness::NotServing(*id),
        });
    }
    let mut others = Others::default();
    let own_nodes: BTreeSet<NodeId> = jobs.values().filter(|j| j.live()).filter_map(|j| j.node).collect();
    for r in replicas.values().filter(|r| !own_nodes.contains(&r.node)) {
        match r.lifecycle {
            Lifecycle::Join => others.joining += 1,
            Lifecycle::Serve => others.serving += 1,
            Lifecycle::Down | Lifecycle::Left => {}
        }
    }
    (own, others)
}

/// Releases `count` of `own`: jobs not serving first (newest first), then the least busy nodes.
fn release_jobs(
    mut own: Vec<Readiness>,
    count: u32,
    jobs: &mut BTreeMap<JobId, JobEntry>,
    stats: &mut SpinStats,
    out: &mut Vec<SpinCommand>,
) {
    own.sort_by_key(|r| match r {
        Readiness::NotServing(job) => (0, Reverse(job.0), 0, Time::ZERO),
        Readiness::Serving { in_flight, started, .. } => (1, Reverse(0), *in_flight, *started),
    });
    for r in own.into_iter().take(count as usize) {
        match r {
            Readiness::NotServing(job) => {
                if let Some(j) = jobs.get_mut(&job) {
                    j.released = true;
                }
                out.push(SpinCommand::Cancel { job });
                stats.cancels += 1;
            }
            Readiness::Serving { node, .. } => {
                if let Some(j) = jobs.values_mut().find(|j| j.node == Some(node) && j.live()) {
                    j.released = true;
                }
                out.push(SpinCommand::Drain { node });
                stats.drains += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::{GpuModel, Hardware};
    use crate::placement::{KvHeadroom, ModelSpec};
    use crate::record::Quantization;
    use proptest::prelude::*;

    const MIN: Duration = Duration::from_secs(60);
    const HOUR: Duration = Duration::from_secs(3600);

    fn small() -> ModelSpec {
        ModelSpec::new("small", 8_000, Quantization::Bf16).with_kv(KvHeadroom::gib(2))
    }

    /// Needs four A100-80s with tensor parallelism.
    fn big() -> ModelSpec {
        ModelSpec::new("big", 70_000, Quantization::Fp16).with_kv(KvHeadroom::gib(3))
    }

    fn policy(spec: ModelSpec) -> ModelPolicy {
        ModelPolicy { concurrency_per_replica: 10, max_replicas: 6, ..ModelPolicy::new(spec) }
    }

    fn load(n: u32) -> Demand {
        Demand { in_flight: n, ..Demand::default() }
    }

    /// A job in the simulated batch system.
    struct SimJob {
        model: String,
        gpus: u32,
        submitted: Time,
        start: Time,
        walltime: Duration,
        node: NodeId,
        drain_from: Option<Time>,
        end: Option<Time>,
    }

    /// A tiny batch system and registry: jobs queue, boot, serve, drain and end.
    struct World {
        now: Time,
        queue_wait: Duration,
        boot: Duration,
        drain: Duration,
        jobs: BTreeMap<JobId, SimJob>,
        others: Vec<ReplicaStatus>,
        shapes: Vec<NodeShape>,
        log: Vec<(Time, SpinCommand)>,
    }

    impl World {
        fn new() -> World {
            World {
                now: Time::ZERO,
                queue_wait: 2 * MIN,
                boot: 3 * MIN,
                drain: 5 * MIN,
                jobs: BTreeMap::new(),
                others: Vec::new(),
                shapes: vec![NodeShape::new("a100", Hardware::catalog(GpuModel::A100_80, 8), 1000)],
                log: Vec::new(),
            }
        }

        fn view(&self, demand: &[(&str, Demand)]) -> SpinView {
            let now = self.now;
            let mut view = SpinView {
                demand: demand.iter().map(|(m, d)| (m.to_string(), *d)).collect(),
                replicas: self.others.clone(),
                jobs: Vec::new(),
                shapes: self.shapes.clone(),
            };
            for (id, j) in self.jobs.iter().filter(|(_, j)| j.end.is_none()) {
                if now < j.start {
                    view.jobs.push(JobStatus::queued(*id));
                    continue;
                }
                view.jobs.push(JobStatus::running(*id, Some(j.node)));
                let lifecycle = if j.drain_from.is_some_and(|d| d <= now) {
                    Lifecycle::Down
                } else if now < j.start + self.boot {
                    Lifecycle::Join
                } else {
                    Lifecycle::Serve
                };
                view.replicas.push(ReplicaStatus { node: j.node, model: j.model.clone(), lifecycle, in_flight: 1 });
            }
            view
        }

        fn apply(&mut self, commands: Vec<SpinCommand>) {
            let now = self.now;
            for c in commands {
                match &c {
                    SpinCommand::Submit { job, model, placement, walltime, .. } => {
                        let start = now + self.queue_wait;
                        let sim = SimJob {
                            model: model.clone(),
                            gpus: placement.gpus(),
                            submitted: now,
                            start,
                            walltime: *walltime,
                            node: NodeId::from_u64(1000 + job.0),
                            // Nodes drain on their own before the walltime.
                            drain_from: Some(start + walltime.saturating_sub(self.drain)),
                            end: None,
                        };
                        assert!(self.jobs.insert(*job, sim).is_none(), "job id reused: {c:?}");
                    }
                    SpinCommand::Cancel { job } => {
                        let j = self.jobs.get_mut(job).expect("cancel of an unknown job");
                        j.end.get_or_insert(now);
                    }
                    SpinCommand::Drain { node } => {
                        let j =
                            self.jobs.values_mut().find(|j| j.node == *node).expect("drain of a node it never started");
                        assert!(now >= j.start + self.boot, "drained a node that was not serving");
                        j.drain_from = Some(j.drain_from.map_or(now, |d| d.min(now)));
                    }
                }
                self.log.push((now, c));
            }
        }

        fn advance(&mut self, to: Time) {
            self.now = to;
            for j in self.jobs.values_mut().filter(|j| j.end.is_none()) {
                let killed = j.start + j.walltime;
                let drained = j.drain_from.map(|d| d + self.drain);
                let end = drained.map_or(killed, |d| d.min(killed)).max(j.start);
                if end <= to {
                    j.end = Some(end);
                }
            }
        }

        /// GPU-seconds a job really used, up to the end of the run.
        fn used(&self, j: &SimJob) -> u64 {
            let end = j.end.unwrap_or(self.now);
            u64::from(j.gpus) * end.saturating_since(j.start).min(j.walltime).as_secs()
        }

        fn submits(&self, model: &str) -> usize {
            self.log.iter().filter(|(_, c)| matches!(c, SpinCommand::Submit { model: m, .. } if m == model)).count()
        }

        fn releases(&self) -> Vec<Time> {
            self.log.iter().filter(|(_, c)| !matches!(c, SpinCommand::Submit { .. })).map(|(t, _)| *t).collect()
        }

        /// Times the direction of scaling changed for `model` (up after down or down after up).
        fn reversals(&self, model: &str) -> usize {
            let node_model = |n: &NodeId| self.jobs.values().find(|j| j.node == *n).map(|j| j.model.as_str());
            let dirs: Vec<bool> = self
                .log
                .iter()
                .filter_map(|(_, c)| match c {
                    SpinCommand::Submit { model: m, .. } => (m == model).then_some(true),
                    SpinCommand::Cancel { job } => (self.jobs[job].model == model).then_some(false),
                    SpinCommand::Drain { node } => (node_model(node) == Some(model)).then_some(false),
                })
                .collect();
            dirs.windows(2).filter(|w| w[0] != w[1]).count()
        }
    }

    /// Runs `spinner` against `world` every `tick` until `until`, checking the caps each tick.
    fn run(
        spinner: &mut Spinner,
        world: &mut World,
        until: Time,
        tick: Duration,
        demand: impl Fn(Time) -> Vec<(&'static str, Demand)>,
    ) {
        while world.now < until {
            let view = world.view(&demand(world.now));
            let commands = spinner.decide(world.now, &view);
            world.apply(commands);
            check_caps(spinner, world);
            let next = world.now + tick;
            world.advance(next);
        }
    }

    fn check_caps(spinner: &Spinner, world: &World) {
        let live = world.jobs.values().filter(|j| j.end.is_none());
        assert!(live.count() <= spinner.config.max_concurrent_jobs as usize, "too many live jobs");
        for (name, state) in &spinner.models {
            let now = world.now;
            let active = world
                .jobs
                .values()
                .filter(|j| j.model == *name && j.end.is_none() && j.drain_from.map_or(true, |d| d > now))
                .count();
            let others = world.others.iter().filter(|r| r.model == *name && r.lifecycle <= Lifecycle::Serve).count();
            assert!(active + others <= state.policy.max_replicas.max(others as u32) as usize, "over max for {name}");
        }
    }

    /// The most GPU-seconds the jobs submitted within any one window really used.
    fn worst_window(world: &World, window: Duration) -> u64 {
        let jobs: Vec<_> = world.jobs.values().collect();
        jobs.iter()
            .map(|last| {
                let from = last.submitted.saturating_sub(window);
                jobs.iter()
                    .filter(|j| j.submitted > from && j.submitted <= last.submitted)
                    .map(|j| world.used(j))
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn a_burst_gets_all_its_replicas_in_one_decision() {
        let mut s = Spinner::new(SpinConfig::default(), vec![policy(small())]).unwrap();
        let mut w = World::new();
        run(&mut s, &mut w, Time::from_secs(600), MIN, |_| vec![]);
        assert!(w.log.is_empty());
        let view = w.view(&[("small", Demand { queued: 45, ..Demand::default() })]);
        let commands = s.decide(w.now, &view);
        assert_eq!(commands.len(), 5, "ceil(45 / 10) replicas at once: {commands:?}");
        assert!(commands.iter().all(|c| matches!(c, SpinCommand::Submit { placement, .. } if placement.gpus() == 1)));
        // More demand right after waits for the cooldown; the starting replicas count as supply.
        w.apply(commands);
        let view = w.view(&[("small", Demand { queued: 100, ..Demand::default() })]);
        assert!(s.decide(w.now + Duration::from_secs(10), &view).is_empty());
        assert_eq!(s.status("small").map(|st| (st.wanted, st.supply)), Some((6, 5)));
        assert_eq!(s.status("small").and_then(|st| st.blocked.clone()), Some(Blocked::Cooldown));
        assert_eq!(s.decide(w.now + 2 * MIN, &view).len(), 1);
    }

    #[test]
    fn a_batch_backlog_spins_short_jobs_after_interactive_demand_and_holds_them_while_it_lasts() {
        let short = ModelPolicy { batch_walltime: Some(MIN * 30), ..policy(small()) };
        let mut s = Spinner::new(SpinConfig::default(), vec![short.clone(), policy(big())]).unwrap();
        let w = World::new();
        // Interactive demand for `big` and a backlog for `small`: both get their replicas, the
        // backlog's as short batch jobs submitted after the interactive ones.
        let view = w.view(&[
            ("small", Demand { batch_replicas: 2, ..Demand::default() }),
            ("big", Demand { queued: 1, ..Demand::default() }),
        ]);
        let commands = s.decide(w.now, &view);
        let submits: Vec<(&str, Duration, bool)> = commands
            .iter()
            .filter_map(|c| match c {
                SpinCommand::Submit { model, walltime, batch, .. } => Some((model.as_str(), *walltime, *batch)),
                _ => None,
            })
            .collect();
        assert_eq!(submits, [("big", HOUR * 4, false), ("small", MIN * 30, true), ("small", MIN * 30, true)]);
        // Interactive demand on top of the backlog: the job is an ordinary one.
        let mut s = Spinner::new(SpinConfig::default(), vec![short]).unwrap();
        let view = w.view(&[("small", Demand { queued: 1, batch_replicas: 1, ..Demand::default() })]);
        let commands = s.decide(w.now, &view);
        assert!(matches!(commands.as_slice(), [SpinCommand::Submit { batch: false, .. }]), "{commands:?}");
    }

    #[test]
    fn replicas_wanted_by_a_backlog_are_kept_until_it_is_gone() {
        let mut s = Spinner::new(SpinConfig::default(), vec![policy(small())]).unwrap();
        let mut w = World::new();
        let gone_at = Time::from_secs(3600);
        run(&mut s, &mut w, Time::from_secs(2 * 3600), Duration::from_secs(30), |now| {
            vec![("small", Demand { batch_replicas: u32::from(now < gone_at), ..Demand::default() })]
        });
        assert_eq!(w.submits("small"), 1);
        let releases = w.releases();
        assert_eq!(releases.len(), 1, "{:?}", w.log);
        assert!(
            releases[0] >= gone_at + Duration::from_secs(15 * 60),
            "released while the backlog lasted: {releases:?}"
        );
    }

    #[test]
    fn replicas_are_released_only_after_the_idle_period() {
        let mut s = Spinner::new(SpinConfig::default(), vec![policy(small())]).unwrap();
        let mut w = World::new();
        let busy_until = Time::from_secs(3600);
        run(&mut s, &mut w, Time::from_secs(3 * 3600), Duration::from_secs(30), |now| {
            vec![("small", if now < busy_until { load(30) } else { Demand::default() })]
        });
        assert_eq!(w.submits("small"), 3);
        let releases = w.releases();
        assert_eq!(releases.len(), 3, "{:?}", w.log);
        let idle = Duration::from_secs(15 * 60);
        assert!(releases.iter().all(|t| *t >= busy_until + idle && *t <= busy_until + idle + MIN), "{releases:?}");
        assert!(w.jobs.values().all(|j| j.end.is_some()), "every allocation released");
    }

    #[test]
    fn a_partial_dip_releases_only_what_the_peak_of_the_period_did_not_need() {
        let mut s = Spinner::new(SpinConfig::default(), vec![policy(small())]).unwrap();
        let mut w = World::new();
        // 40 requests want 4 replicas; then 12 keep ceil(12 / 5) = 3 at the 50% band.
        run(&mut s, &mut w, Time::from_secs(2 * 3600), Duration::from_secs(30), |now| {
            vec![("small", load(if now < Time::from_secs(1800) { 40 } else { 12 }))]
        });
        assert_eq!((w.submits("small"), w.releases().len()), (4, 1));
    }

    #[test]
    fn replicas_left_after_supply_dropped_during_a_low_period_are_still_released() {
        let mut s = Spinner::new(SpinConfig::default(), vec![policy(small())]).unwrap();
        let mut w = World::new();
        // A node the spinner did not start serves too; 20 requests want a second replica.
        w.others.push(ReplicaStatus {
            node: NodeId::from_u64(1),
            model: "small".into(),
            lifecycle: Lifecycle::Serve,
            in_flight: 0,
        });
        let demand = |now: Time| {
            let n = if now < Time::from_secs(600) {
                20
            } else if now < Time::from_secs(900) {
                4
            } else {
                0
            };
            vec![("small", load(n))]
        };
        // From 10 min the dip needs one replica (the period's peak); then demand stops, and the
        // other node leaves before the period ends: supply has fallen to that peak by itself.
        run(&mut s, &mut w, Time::from_secs(1200), Duration::from_secs(30), demand);
        assert_eq!(w.submits("small"), 1);
        w.others.clear();
        run(&mut s, &mut w, Time::from_secs(3 * 3600), Duration::from_secs(30), demand);
        assert_eq!(w.releases().len(), 1, "the idle replica is drained, not kept to its walltime: {:?}", w.log);
        // The first period (from 10 min) ends with nothing to release; the next one releases.
        assert!(w.releases()[0] <= Time::from_secs(600 + 2 * 15 * 60 + 60), "{:?}", w.releases());
        assert!(w.jobs.values().all(|j| j.end.is_some()), "every allocation released");
    }

    #[test]
    fn demand_oscillating_near_a_threshold_does_not_flap() {
        let day = Time::from_secs(24 * 3600);
        // Load alternates every minute just below and above 1, 2 and 3 replicas' worth; and a
        // model that is busy and idle for 5 minutes in turn.
        // Every minute `small` carries 18 to 22 requests — just below and above two replicas'
        // worth — in a scrambled order; `big` is busy and idle for 5 minutes in turn.
        let near = |now: Time| {
            let minute = now.as_micros() / 60_000_000;
            let jitter = (minute.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 61) as u32 % 5;
            let on = (minute / 5) % 2 == 0;
            vec![("small", load(18 + jitter)), ("big", if on { load(5) } else { Demand::default() })]
        };
        let mut s = Spinner::new(SpinConfig::default(), vec![policy(small()), policy(big())]).unwrap();
        let mut w = World::new();
        run(&mut s, &mut w, day, Duration::from_secs(20), near);
        assert!(w.reversals("small") <= 1, "small flapped {} times", w.reversals("small"));
        assert!(w.reversals("big") <= 1, "big flapped {} times", w.reversals("big"));
        // Only walltime replacements after the first scale-up: 3 replicas × 6 walltimes a day.
        assert!(w.submits("small") <= 3 * 7, "{}", w.submits("small"));

        // The same trace without hysteresis flaps all day: the bound above means something.
        let eager = |spec| ModelPolicy {
            cooldown: Duration::ZERO,
            scale_down_after: Duration::ZERO,
            scale_down_percent: 100,
            ..policy(spec)
        };
        let mut s = Spinner::new(SpinConfig::default(), vec![eager(small()), eager(big())]).unwrap();
        let mut w = World::new();
        run(&mut s, &mut w, day, Duration::from_secs(20), near);
        assert!(w.reversals("small") > 100 && w.reversals("big") > 100, "{}", w.reversals("small"));
    }

    #[test]
    fn the_gpu_hour_budget_caps_submissions_and_refunds_unused_time() {
        let config = SpinConfig {
            budget: Some(GpuHourBudget { gpu_hours: 10, window: Duration::from_secs(24 * 3600) }),
            max_concurrent_jobs: 20,
            ..SpinConfig::default()
        };
        let mut s = Spinner::new(config, vec![policy(small())]).unwrap();
        let mut w = World::new();
        let view = w.view(&[("small", load(60))]);
        let commands = s.decide(w.now, &view);
        // 4 h walltime × 1 GPU each: two fit in 10 GPU-hours, a third would not.
        assert_eq!(commands.len(), 2);
        assert_eq!(s.status("small").and_then(|st| st.blocked.clone()), Some(Blocked::Budget));
        assert_eq!(s.budget_used_gpu_secs(), 8 * 3600);
        w.apply(commands);
        // An hour of serving, then idle: released after 15 minutes, charged for what they ran.
        run(&mut s, &mut w, Time::from_secs(3 * 3600), MIN, |now| {
            vec![("small", if now < Time::from_secs(3600) { load(60) } else { Demand::default() })]
        });
        let used = s.budget_used_gpu_secs();
        assert!(used < 4 * 3600, "refunded down to the time really used: {used}");
        assert!(worst_window(&w, Duration::from_secs(24 * 3600)) <= 10 * 3600);
        // The refund lets demand spin again: one more 4 h job fits.
        let view = w.view(&[("small", load(60))]);
        assert_eq!(s.decide(w.now, &view).len(), 1);
        assert!(s.budget_used_gpu_secs() <= 10 * 3600);
    }

    #[test]
    fn the_job_cap_serves_models_without_a_replica_first() {
        let config = SpinConfig { max_concurrent_jobs: 3, ..SpinConfig::default() };
        let mut s = Spinner::new(config, vec![policy(small()), policy(big())]).unwrap();
        let mut w = World::new();
        // `small` has a workstation serving it already; `big` has nothing.
        w.others.push(ReplicaStatus {
            node: NodeId::from_u64(7),
            model: "small".into(),
            lifecycle: Lifecycle::Serve,
            in_flight: 3,
        });
        let view = w.view(&[("small", load(50)), ("big", load(20))]);
        let commands = s.decide(w.now, &view);
        let models: Vec<&str> = commands
            .iter()
            .filter_map(|c| match c {
                SpinCommand::Submit { model, .. } => Some(model.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(models, ["big", "big", "small"]);
        assert_eq!(s.status("small").and_then(|st| st.blocked.clone()), Some(Blocked::ConcurrentJobs));
        // The big model's placement is four GPUs with tensor parallelism.
        assert!(commands
            .iter()
            .any(|c| matches!(c, SpinCommand::Submit { placement, .. } if placement.tensor_parallel == 4)));
    }

    #[test]
    fn nodes_it_did_not_start_are_counted_but_never_drained() {
        let mut s = Spinner::new(SpinConfig::default(), vec![policy(small())]).unwrap();
        let mut w = World::new();
        let workstation = NodeId::from_u64(7);
        w.others.push(ReplicaStatus {
            node: workstation,
            model: "small".into(),
            lifecycle: Lifecycle::Serve,
            in_flight: 0,
        });
        run(&mut s, &mut w, Time::from_secs(3 * 3600), MIN, |now| {
            vec![("small", if now < Time::from_secs(3600) { load(15) } else { Demand::default() })]
        });
        assert_eq!(w.submits("small"), 1, "the workstation covers the first 10");
        assert!(w.log.iter().all(|(_, c)| *c != SpinCommand::Drain { node: workstation }));
        assert_eq!(w.releases().len(), 1);
    }

    #[test]
    fn jobs_not_serving_yet_are_cancelled_before_serving_nodes_are_drained() {
        let mut s = Spinner::new(SpinConfig::default(), vec![policy(small())]).unwrap();
        let mut w = World::new();
        w.queue_wait = 10 * HOUR;
        let view = w.view(&[("small", load(20))]);
        w.apply(s.decide(w.now, &view));
        // Idle right away: both jobs still wait in the queue and are cancelled, not drained.
        run(&mut s, &mut w, Time::from_secs(3600), MIN, |_| vec![]);
        assert!(w.log[2..].iter().all(|(_, c)| matches!(c, SpinCommand::Cancel { .. })), "{:?}", w.log);
        assert_eq!(w.releases().len(), 2);
    }

    #[test]
    fn high_latency_adds_one_replica_at_a_time() {
        let p = ModelPolicy { latency_target: Some(Duration::from_secs(2)), ..policy(small()) };
        let mut s = Spinner::new(SpinConfig::default(), vec![p]).unwrap();
        let mut w = World::new();
        let slow = Demand { in_flight: 4, p95_latency: Some(Duration::from_secs(5)), ..Demand::default() };
        run(&mut s, &mut w, Time::from_secs(20 * 60), MIN, |now| {
            vec![("small", if now < Time::from_secs(6 * 60) { load(4) } else { slow })]
        });
        // One for the load, then one more each time the previous one is serving.
        let submits: Vec<Time> = w.log.iter().map(|(t, _)| *t).collect();
        assert_eq!(submits.len(), 4, "{:?}", w.log);
        assert!(submits[2..].iter().zip(&submits[1..]).all(|(b, a)| *b - *a >= w.queue_wait + w.boot));
    }

    #[test]
    fn min_replicas_stay_up_without_demand() {
        let p = ModelPolicy { min_replicas: 1, ..policy(small()) };
        let mut s = Spinner::new(SpinConfig::default(), vec![p]).unwrap();
        let mut w = World::new();
        run(&mut s, &mut w, Time::from_secs(3 * 3600), MIN, |_| vec![]);
        assert_eq!(w.submits("small"), 1);
        assert!(w.releases().is_empty());
        // The 4 h walltime passes: the draining node is replaced ahead of its end.
        run(&mut s, &mut w, Time::from_secs(5 * 3600), MIN, |_| vec![]);
        assert_eq!(w.submits("small"), 2);
    }

    #[test]
    fn a_model_nothing_can_host_is_blocked_with_the_reason() {
        let mut s = Spinner::new(SpinConfig::default(), vec![policy(big())]).unwrap();
        let mut w = World::new();
        w.shapes = vec![NodeShape::new("ws", Hardware::catalog(GpuModel::Rtx4090, 2), 3)];
        let view = w.view(&[("big", load(1))]);
        assert!(s.decide(w.now, &view).is_empty());
        let blocked = s.status("big").and_then(|st| st.blocked.clone());
        assert!(matches!(blocked, Some(Blocked::NoPlacement(NoPlacement::TooLarge { .. }))), "{blocked:?}");
        assert!(!s.is_spinnable("other") && s.is_spinnable("big"));
    }

    #[test]
    fn a_model_runs_only_on_the_shapes_it_names_in_their_order() {
        let p = ModelPolicy { shapes: vec!["h100".into(), "a100-b".into()], ..policy(small()) };
        let mut s = Spinner::new(SpinConfig::default(), vec![p]).unwrap();
        let mut w = World::new();
        // The 4090 would win by tier and `a100` by order, but the model may use neither.
        w.shapes = vec![
            NodeShape::new("rtx4090", Hardware::catalog(GpuModel::Rtx4090, 1), 8),
            NodeShape::new("a100", Hardware::catalog(GpuModel::A100_80, 8), 8),
            NodeShape::new("a100-b", Hardware::catalog(GpuModel::A100_80, 8), 1),
            NodeShape::new("h100", Hardware::catalog(GpuModel::H100, 8), 8),
        ];
        let view = w.view(&[("small", load(15))]);
        let shapes: Vec<(usize, String)> = s
            .decide(w.now, &view)
            .into_iter()
            .filter_map(|c| match c {
                SpinCommand::Submit { placement, .. } => Some((placement.shape, placement.shape_name)),
                _ => None,
            })
            .collect();
        // Tier first (A100 before H100), the free count of `a100-b` is respected, and the index
        // points into the view's own list.
        assert_eq!(shapes, [(2, "a100-b".to_string()), (3, "h100".to_string())]);
    }

    #[test]
    fn inconsistent_policies_are_refused_with_the_fix() {
        let bad = |f: fn(&mut ModelPolicy)| {
            let mut p = policy(small());
            f(&mut p);
            Spinner::new(SpinConfig::default(), vec![p]).unwrap_err().to_string()
        };
        assert!(bad(|p| p.min_replicas = 9).contains("min_replicas 9 is above max_replicas 6"));
        assert!(bad(|p| p.concurrency_per_replica = 0).contains("at least 1"));
        assert!(bad(|p| p.scale_down_percent = 0).contains("1..=100"));
        assert!(bad(|p| p.walltime = Duration::ZERO).contains("walltime"));
        let e = Spinner::new(SpinConfig::default(), vec![policy(small()), policy(small())]).unwrap_err();
        assert_eq!(e, SpinConfigError::DuplicateModel("small".into()));
        let config = SpinConfig {
            budget: Some(GpuHourBudget { gpu_hours: 1, window: Duration::ZERO }),
            ..SpinConfig::default()
        };
        assert_eq!(Spinner::new(config, vec![]).unwrap_err(), SpinConfigError::ZeroBudgetWindow);
    }

    #[test]
    fn time_going_backwards_is_treated_as_the_latest_time() {
        let mut s = Spinner::new(SpinConfig::default(), vec![policy(small())]).unwrap();
        let mut w = World::new();
        let view = w.view(&[("small", load(5))]);
        let commands = s.decide(Time::from_secs(100), &view);
        assert_eq!(commands.len(), 1);
        w.apply(commands);
        let view = w.view(&[("small", load(50))]);
        // Earlier than the last decision: still inside the cooldown, nothing new.
        assert!(s.decide(Time::from_secs(10), &view).is_empty());
    }

    fn arb_demand() -> impl Strategy<Value = Demand> {
        (0u32..120, 0u32..120, 0u32..600, proptest::option::of(0u64..10)).prop_map(|(queued, in_flight, rate, lat)| {
            Demand {
                queued,
                in_flight,
                arrivals_per_min: rate,
                p95_latency: lat.map(Duration::from_secs),
                batch_replicas: 0,
            }
        })
    }

    fn arb_policy(spec: ModelSpec) -> impl Strategy<Value = ModelPolicy> {
        (0u32..3, 1u32..6, 1u32..30, proptest::option::of(1u32..100), 1u64..6, 0u64..20, 0u64..30, 1u32..=100).prop_map(
            move |(min, extra, conc, rate, wall_h, cool_min, down_min, pct)| ModelPolicy {
                spec: spec.clone(),
                walltime: HOUR * wall_h as u32,
                batch_walltime: None,
                min_replicas: min,
                max_replicas: min + extra,
                concurrency_per_replica: conc,
                arrivals_per_replica: rate,
                latency_target: Some(Duration::from_secs(3)),
                cooldown: MIN * cool_min as u32,
                scale_down_after: MIN * down_min as u32,
                scale_down_percent: pct,
                shapes: Vec::new(),
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Over arbitrary demand the caps hold at every step: max replicas, concurrent jobs, and the
        /// GPU-hours really used by the jobs of any window.
        #[test]
        fn caps_hold_over_arbitrary_demand(
            small_policy in arb_policy(small()),
            big_policy in arb_policy(big()),
            max_jobs in 1u32..10,
            budget_h in proptest::option::of((1u64..60, 1u64..24)),
            trace in proptest::collection::vec((1u64..90, arb_demand(), arb_demand()), 1..30),
            statics in 0usize..3,
        ) {
            let budget = budget_h.map(|(gpu_hours, window_h)| GpuHourBudget { gpu_hours, window: HOUR * window_h as u32 });
            let config = SpinConfig { max_concurrent_jobs: max_jobs, budget, first_job_id: 1 };
            let mut s = Spinner::new(config, vec![small_policy, big_policy]).unwrap();
            let mut w = World::new();
            for i in 0..statics {
                w.others.push(ReplicaStatus { node: NodeId::from_u64(i as u64), model: "small".into(), lifecycle: Lifecycle::Serve, in_flight: 0 });
            }
            let mut ends = Vec::new();
            let mut t = Time::ZERO;
            for (minutes, a, b) in &trace {
                t = t + MIN * *minutes as u32;
                ends.push((t, *a, *b));
            }
            run(&mut s, &mut w, t, Duration::from_secs(45), |now| {
                let (_, a, b) = ends.iter().find(|(end, ..)| now < *end).copied().unwrap_or((t, Demand::default(), Demand::default()));
                vec![("small", a), ("big", b)]
            });
            if let Some(b) = budget {
                prop_assert!(worst_window(&w, b.window) <= b.gpu_hours * 3600);
            }
        }
    }
}
