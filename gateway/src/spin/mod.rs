//! Model spinning in the gateway: batch jobs that start serving nodes when requests want a model
//! that nobody serves, and that are drained or cancelled when demand goes away.
//!
//! - [`config`]: the `[spin]` section of `gateway.toml` and its checks.
//! - [`job`]: the batch script and resources of one job.
//! - [`cold_start`]: requests for a spinnable model with no usable replica wait there.
//! - [`demand`]: in-flight requests, arrivals and time to first byte per spinnable model.
//! - [`backend`]: the [`BatchSystem`] a plan's `[spin.backend]` names.
//! - [`queue`]: before each submission, where the scheduler would start the job soonest.
//! - [`batch_demand`]: the batch API's backlog as low-priority demand (`[spin.batch]`), and
//!   the GPU-hours each key's backlog spent (`batch_gpu_hours=`).
//!
//! The **spin task** (`start`) decides every `interval`, and at once when a request starts
//! waiting: it asks the batch system about its jobs ([`BatchSystem::jobs`]; a job's node comes
//! from its comment), builds a [`SpinView`] — demand per model, the registry's replicas of
//! spinnable models with this gateway's in-flight counts, its jobs, the partitions' free nodes,
//! and with `[spin.batch]` the batch backlog read from the database ([`batch_demand`]) —
//! calls the core's [`Spinner::decide`] and executes the commands: `Submit` asks the batch system
//! when the job would start in each partition that could take it, moves it to the soonest
//! ([`queue`], within `start_estimate_timeout`), renders the job ([`job::render`]) and submits it, `Cancel` cancels, `Drain` sends the drain signal to the
//! node's job. A failing batch call is logged and counted (`tela_gateway_spin_batch_errors_total`)
//! and the task carries on; a job whose submission failed counts as ended, so the spinner may
//! try again — after a pause that doubles with each failed submission in a row (up to a
//! minute). The **release task** lets waiting requests go when their model becomes usable.
//!
//! Jobs are known by the ids this gateway gave them; a restarted gateway does not adopt the
//! jobs of its previous run (they drain at their walltime).

pub mod backend;
pub mod batch_demand;
pub mod cold_start;
pub mod config;
pub mod demand;
pub mod job;
pub mod queue;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};
use tela_batch::{BatchJobId, BatchState, BatchSystem, JobSignal};
use tela_core::placement::Placement;
use tela_core::spin::{Blocked, Demand, JobId, JobStatus, SpinCommand, SpinConfigError, SpinView, Spinner};
use tela_core::NodeId;
use tela_runtime::status::{hex, RegistrySnapshot};
use tela_runtime::RuntimeView;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::auth::Access;
use crate::batch::BatchShared;
use crate::metrics::{Metrics, ModelLabel, OpLabel};
use crate::routing::NodeLoad;
use batch_demand::ModelBacklog;
use cold_start::WaitingRoom;
use config::SpinPlan;
use demand::DemandTracker;

/// The least time between two decisions, however often requests start waiting.
const MIN_DECISION_GAP: Duration = Duration::from_millis(200);
/// How often the release task looks while requests wait (connections can follow the registry).
const RELEASE_POLL: Duration = Duration::from_millis(250);

/// A spin plan and the batch system it drives.
#[derive(Clone)]
pub struct SpinSetup {
    /// The checked `[spin]` section.
    pub plan: SpinPlan,
    /// The front door to the batch system.
    pub batch: Arc<dyn BatchSystem>,
}

impl std::fmt::Debug for SpinSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpinSetup").field("plan", &self.plan).field("batch", &self.batch.name()).finish()
    }
}

/// One job as the spin task tracks it.
#[derive(Clone, Debug)]
struct TrackedJob {
    model: String,
    partition: String,
    nodes: u32,
    batch: Option<BatchJobId>,
    /// `None` while it is being submitted.
    state: Option<BatchState>,
    raw_state: String,
    node: Option<NodeId>,
    hosts: Vec<String>,
    submitted: Instant,
    released: Option<&'static str>,
    /// Started for the batch backlog only: a short, backfill-friendly job.
    for_backlog: bool,
    /// The key its GPU-hours were charged to (its name), for such a job.
    charged_to: Option<String>,
}

/// The last decision, for `/status`.
#[derive(Default)]
struct Report {
    models: BTreeMap<String, (u32, u32, Option<String>)>,
    jobs: Vec<(JobId, TrackedJob)>,
    live_jobs: usize,
    budget_used_gpu_secs: u64,
    last_error: Option<String>,
    decisions: u64,
    /// The last placement choice per model.
    choices: BTreeMap<String, queue::Choice>,
    /// The batch backlog per model, as the last decision counted it.
    backlog: BTreeMap<String, ModelBacklog>,
}

/// What request handlers and `/status` share with the spin task.
pub struct SpinShared {
    models: BTreeSet<String>,
    backend: String,
    /// Waiting requests.
    pub room: WaitingRoom,
    /// Measured demand.
    pub demand: DemandTracker,
    wake: Notify,
    report: Mutex<Report>,
}

impl SpinShared {
    /// Whether `model` may spin.
    pub fn is_spinnable(&self, model: &str) -> bool {
        self.models.contains(model)
    }

    /// The spinnable models, sorted.
    pub fn models(&self) -> impl Iterator<Item = &String> {
        self.models.iter()
    }

    /// Asks the spin task to decide now.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// The `spin` part of `/status`.
    pub fn status_json(&self) -> Value {
        let report = self.report.lock().unwrap_or_else(PoisonError::into_inner);
        let models: Vec<Value> = self
            .models
            .iter()
            .map(|m| {
                let (wanted, supply, blocked) = report.models.get(m).cloned().unwrap_or_default();
                let queued = u32::try_from(self.room.queued(m)).unwrap_or(u32::MAX);
                let measured = self.demand.measure(m, queued);
                json!({
                    "name": m,
                    "wanted": wanted,
                    "supply": supply,
                    "blocked": blocked,
                    "queued": queued,
                    "in_flight": measured.in_flight,
                    "arrivals_per_min": measured.arrivals_per_min,
                    "p95_ttfb_ms": measured.p95_latency.map(|d| d.as_millis() as u64),
                    "last_choice": report.choices.get(m).map(queue::Choice::json),
                    "batch_backlog": report.backlog.get(m).map_or(0, |b| b.counted),
                    "batch_backlog_over_budget": report.backlog.get(m).map_or(0, |b| b.over_budget),
                })
            })
            .collect();
        let jobs: Vec<Value> = report
            .jobs
            .iter()
            .map(|(id, j)| {
                json!({
                    "job": id.0,
                    "batch_id": j.batch.map(|b| b.to_string()),
                    "model": j.model,
                    "partition": j.partition,
                    "state": j.state.map_or("SUBMITTING", state_name),
                    "raw_state": j.raw_state,
                    "node": j.node.map(|n| hex(&n)),
                    "node_short": j.node.map(|n| n.to_string()),
                    "hosts": j.hosts,
                    "released": j.released,
                    "batch": j.for_backlog,
                    "charged_to": j.charged_to,
                    "age_s": j.submitted.elapsed().as_secs(),
                })
            })
            .collect();
        json!({
            "backend": self.backend,
            "models": models,
            "jobs": jobs,
            "live_jobs": report.live_jobs,
            "budget_used_gpu_hours": report.budget_used_gpu_secs as f64 / 3600.0,
            "decisions": report.decisions,
            "last_error": report.last_error,
        })
    }
}

fn state_name(state: BatchState) -> &'static str {
    match state {
        BatchState::Pending => "PENDING",
        BatchState::Running => "RUNNING",
        BatchState::Ending => "ENDING",
        BatchState::Ended => "ENDED",
    }
}

fn blocked_text(blocked: &Blocked) -> String {
    match blocked {
        Blocked::Cooldown => "cooldown".into(),
        Blocked::ConcurrentJobs => "max_concurrent_jobs".into(),
        Blocked::Budget => "gpu_hour_budget".into(),
        Blocked::NoPlacement(reason) => format!("no_placement: {reason}"),
    }
}

/// Whether `model` has a replica that a request could be routed to here now: routable in the
/// registry, hosting the model, with a live connection to this gateway.
pub fn usable(view: &RuntimeView, snapshot: &RegistrySnapshot, model: &str) -> bool {
    snapshot.replica().slots().iter().any(|slot| {
        let r = slot.record();
        slot.is_routable()
            && r.models.as_slice().iter().any(|m| m.name == model)
            && view.connection(&r.id).is_some_and(|c| c.close_reason().is_none())
    })
}

/// The running spin and release tasks; they stop when `stop` is cancelled.
pub(crate) struct SpinTasks {
    _spin: tokio_util::task::AbortOnDropHandle<()>,
    _release: tokio_util::task::AbortOnDropHandle<()>,
}

/// What the spin task needs from the gateway.
pub(crate) struct GatewayParts {
    pub view: RuntimeView,
    pub published: watch::Receiver<u64>,
    pub load: NodeLoad,
    pub metrics: Arc<Metrics>,
    pub stop: CancellationToken,
    /// The batch API's database, for the backlog (`[spin.batch]`).
    pub batch: Option<Arc<BatchShared>>,
    /// The keys, for their `batch_gpu_hours`.
    pub access: Access,
}

/// The handler-side state for `setup`.
pub(crate) fn shared(setup: &SpinSetup, view: &RuntimeView) -> Arc<SpinShared> {
    let plan = &setup.plan;
    Arc::new(SpinShared {
        models: plan.models.iter().map(|m| m.name().to_string()).collect(),
        backend: setup.batch.name().to_string(),
        room: WaitingRoom::new(view.clock(), plan.cold_start_capacity, plan.cold_start_timeout),
        demand: DemandTracker::new(view.clock(), plan.models.iter().map(|m| m.name())),
        wake: Notify::new(),
        report: Mutex::default(),
    })
}

/// Starts the spin and release tasks.
pub(crate) fn start(
    setup: SpinSetup,
    spin: Arc<SpinShared>,
    parts: GatewayParts,
) -> Result<SpinTasks, SpinConfigError> {
    let spinner = Spinner::new(setup.plan.limits, setup.plan.models.iter().map(|m| m.policy.clone()).collect())?;
    let release =
        tokio::spawn(release_loop(spin.clone(), parts.view.clone(), parts.published.clone(), parts.stop.clone()));
    if setup.plan.batch.is_some() && parts.batch.is_none() {
        tracing::warn!("[spin.batch] is set but batch inference is off: no backlog to spin for");
    }
    let task = SpinTask {
        backoff: None,
        plan: setup.plan,
        batch: setup.batch,
        spinner,
        jobs: BTreeMap::new(),
        backlog: BTreeMap::new(),
        spin,
        parts,
    };
    tracing::info!(
        "spinning {} with {}",
        task.plan.models.iter().map(|m| m.name()).collect::<Vec<_>>().join(", "),
        task.batch.name()
    );
    Ok(SpinTasks {
        _spin: tokio_util::task::AbortOnDropHandle::new(tokio::spawn(task.run())),
        _release: tokio_util::task::AbortOnDropHandle::new(release),
    })
}

/// Lets waiting requests go when their model becomes usable; answers those that waited too long.
async fn release_loop(
    spin: Arc<SpinShared>,
    view: RuntimeView,
    mut published: watch::Receiver<u64>,
    stop: CancellationToken,
) {
    let mut publishing = true;
    loop {
        let waiting = !spin.room.waiting_models().is_empty();
        let next = match (spin.room.next_deadline(), waiting) {
            (Some(d), _) => d.min(tokio::time::Instant::now() + RELEASE_POLL),
            (None, true) => tokio::time::Instant::now() + RELEASE_POLL,
            (None, false) => tokio::time::Instant::now() + Duration::from_secs(3600),
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = published.changed(), if publishing => publishing = changed.is_ok(),
            _ = spin.room.arrived.notified() => {}
            _ = tokio::time::sleep_until(next) => {}
        }
        spin.room.expire();
        let models = spin.room.waiting_models();
        if models.is_empty() {
            continue;
        }
        let snapshot = view.snapshot();
        for model in models {
            if usable(&view, &snapshot, &model) {
                let n = spin.room.release(&model);
                tracing::info!(model, "a replica of '{model}' is usable: {n} waiting request(s) proceed");
            }
        }
    }
}

/// The longest pause after failed submissions.
const MAX_SUBMIT_BACKOFF: Duration = Duration::from_secs(60);

struct SpinTask {
    /// After a failed submission no decision is made before this instant; the pause doubles
    /// with every failure in a row (from the interval up to [`MAX_SUBMIT_BACKOFF`]), so that a
    /// refusing batch system is not asked again on every waiting request.
    backoff: Option<(Instant, Duration)>,
    plan: SpinPlan,
    batch: Arc<dyn BatchSystem>,
    spinner: Spinner,
    jobs: BTreeMap<JobId, TrackedJob>,
    /// The batch backlog per model, read before each decision.
    backlog: BTreeMap<String, ModelBacklog>,
    spin: Arc<SpinShared>,
    parts: GatewayParts,
}

impl SpinTask {
    async fn run(mut self) {
        let mut last = Instant::now() - MIN_DECISION_GAP;
        loop {
            let gap = MIN_DECISION_GAP.saturating_sub(last.elapsed());
            tokio::select! {
                _ = self.parts.stop.cancelled() => return,
                _ = tokio::time::sleep(self.plan.interval) => {}
                _ = async { self.spin.wake.notified().await; tokio::time::sleep(gap).await } => {}
            }
            if self.backoff.is_some_and(|(until, _)| Instant::now() < until) {
                continue;
            }
            last = Instant::now();
            self.tick().await;
        }
    }

    fn error(&self, op: &'static str, message: String) {
        tracing::warn!("spinning: {message}");
        self.parts.metrics.spin_batch_errors.get_or_create(&OpLabel { op: op.into() }).inc();
        self.spin.report.lock().unwrap_or_else(PoisonError::into_inner).last_error = Some(message);
    }

    /// One decision: refresh the jobs, decide, execute.
    async fn tick(&mut self) {
        self.refresh_jobs().await;
        self.read_backlog().await;
        let view = self.view();
        let now = self.parts.view.clock().now();
        let commands = self.spinner.decide(now, &view);
        let mut refused = false;
        for command in commands {
            // One refusal is enough: the rest of this decision's submissions wait for the next
            // try (the spinner counts them as ended, so it asks again).
            if refused && matches!(command, SpinCommand::Submit { .. }) {
                continue;
            }
            refused |= !self.execute(command).await;
        }
        let mut report = self.spin.report.lock().unwrap_or_else(PoisonError::into_inner);
        report.decisions += 1;
        report.models = self
            .plan
            .models
            .iter()
            .map(|m| {
                let s = self.spinner.status(m.name()).cloned().unwrap_or_default();
                (m.name().to_string(), (s.wanted, s.supply, s.blocked.as_ref().map(blocked_text)))
            })
            .collect();
        report.jobs = self.jobs.iter().map(|(id, j)| (*id, j.clone())).collect();
        report.live_jobs = self.spinner.live_jobs();
        report.budget_used_gpu_secs = self.spinner.budget_used_gpu_secs();
        report.backlog = self.backlog.clone();
        for m in &self.plan.models {
            let queued = self.spin.room.queued(m.name());
            self.parts
                .metrics
                .cold_start_queued
                .get_or_create(&ModelLabel { model: m.name().into() })
                .set(queued as i64);
        }
    }

    /// Asks the batch system about every job it has an id for; forgets the ended ones.
    async fn refresh_jobs(&mut self) {
        let ids: Vec<BatchJobId> = self.jobs.values().filter_map(|j| j.batch).collect();
        if ids.is_empty() {
            return;
        }
        match self.batch.jobs(&ids).await {
            Ok(listed) => {
                for job in listed {
                    let Some(tracked) = self.jobs.values_mut().find(|j| j.batch == Some(job.id)) else { continue };
                    if tracked.state != Some(job.state) {
                        tracing::info!(
                            model = tracked.model,
                            "job {} ({}) is {}{}",
                            job.id,
                            tracked.model,
                            job.raw_state,
                            if job.hosts.is_empty() { String::new() } else { format!(" on {}", job.hosts.join(",")) }
                        );
                    }
                    tracked.state = Some(job.state);
                    tracked.raw_state = job.raw_state.clone();
                    if let Some(node) = job.node() {
                        tracked.node = Some(node);
                    }
                    if !job.hosts.is_empty() {
                        tracked.hosts = job.hosts.clone();
                    }
                }
            }
            Err(e) => self.error("jobs", format!("cannot list the jobs: {e}")),
        }
        self.jobs.retain(|_, j| j.state != Some(BatchState::Ended));
    }

    /// Reads the batch backlog of the spinnable models, leaving out keys over their
    /// `batch_gpu_hours` ([`batch_demand`]); on a database error the last reading stays.
    async fn read_backlog(&mut self) {
        let (Some(_), Some(batch)) = (self.plan.batch, self.parts.batch.clone()) else { return };
        // The budgets of the keys now in the key file: (hash prefix match, GPU-seconds, period).
        let keys = match &self.parts.access {
            Access::Keys(keys) => Some(keys.load()),
            Access::Open => None,
        };
        let now = crate::batch::now_s();
        let read = batch
            .db(move |c| {
                let entries = batch_demand::backlog(c, now)?;
                let mut over: Vec<String> = Vec::new();
                let hashes: BTreeSet<&str> = entries.iter().filter_map(|e| e.key_hash.as_deref()).collect();
                for hash in hashes {
                    let Some(entry) = keys.as_ref().and_then(|k| k.entry_by_hash_prefix(hash).cloned()) else {
                        continue;
                    };
                    let Some(budget) = entry.limits.batch_gpu_hours else { continue };
                    let (from, to) = budget.period.bounds(u64::try_from(now).unwrap_or(0));
                    let spent = batch_demand::spent(
                        c,
                        hash,
                        i64::try_from(from).unwrap_or(i64::MAX),
                        i64::try_from(to).unwrap_or(i64::MAX),
                    )?;
                    if spent >= budget.hours.saturating_mul(3600) {
                        over.push(hash.to_string());
                    }
                }
                Ok((entries, over))
            })
            .await;
        match read {
            Ok((entries, over)) => {
                let tallied = batch_demand::tally(&entries, |k| over.iter().any(|o| o == k));
                self.backlog = tallied.into_iter().filter(|(m, _)| self.spin.is_spinnable(m)).collect();
            }
            Err(e) => self.error("backlog", format!("cannot read the batch backlog: {e}")),
        }
    }

    /// What the spinner looks at.
    fn view(&self) -> SpinView {
        let snapshot = self.parts.view.snapshot();
        let me = self.parts.view.node_id();
        let mut view = SpinView::default();
        for m in &self.plan.models {
            let queued = u32::try_from(self.spin.room.queued(m.name())).unwrap_or(u32::MAX);
            let demand = Demand {
                batch_replicas: match (&self.plan.batch, self.backlog.get(m.name())) {
                    (Some(settings), Some(b)) => b.replicas(settings),
                    _ => 0,
                },
                ..self.spin.demand.measure(m.name(), queued)
            };
            if !demand.is_idle() || demand.p95_latency.is_some() {
                view.demand.insert(m.name().to_string(), demand);
            }
        }
        view.add_replicas(snapshot.replica(), me, |m| self.spin.is_spinnable(m), |id| self.parts.load.get(id));
        for (id, j) in &self.jobs {
            view.jobs.push(match j.state {
                None | Some(BatchState::Pending) => JobStatus::queued(*id),
                Some(_) => JobStatus::running(*id, j.node),
            });
        }
        view.shapes = self
            .plan
            .partitions
            .iter()
            .map(|p| {
                let used: u32 = self.jobs.values().filter(|j| j.partition == p.name).map(|j| j.nodes).sum();
                p.shape(p.nodes.saturating_sub(used))
            })
            .collect();
        view
    }

    /// Where `model`'s job on `placement` starts soonest: asks the batch system about every
    /// candidate partition (bounded by `start_estimate_timeout`), records and logs the choice,
    /// and returns the placement moved there. See [`queue`].
    async fn choose_partition(&mut self, model: &str, placement: Placement, walltime: Duration) -> Placement {
        let timeout = self.plan.start_estimate_timeout;
        if timeout.is_zero() {
            return placement;
        }
        let free = |name: &str| {
            let used: u32 = self.jobs.values().filter(|j| j.partition == name).map(|j| j.nodes).sum();
            self.plan.partition(name).map_or(0, |p| p.nodes.saturating_sub(used))
        };
        let partitions = queue::candidates(&self.plan, model, &placement, free);
        if partitions.is_empty() {
            return placement;
        }
        let asked_at = SystemTime::now();
        let candidates =
            queue::estimate(self.batch.as_ref(), &self.plan, model, &placement, walltime, &partitions, timeout).await;
        let fallback = candidates.iter().position(|c| c.partition == placement.shape_name).unwrap_or(0);
        let index = queue::choose(&candidates, fallback);
        let failed: Vec<String> = candidates
            .iter()
            .filter_map(|c| match &c.estimate {
                queue::Estimate::Failed(e) => Some(format!("{}: {e}", c.partition)),
                _ => None,
            })
            .collect();
        if !failed.is_empty() {
            tracing::warn!(model, "spinning: no start estimate for '{model}' from {}", failed.join("; "));
        }
        let partition = partitions[index];
        let choice = queue::Choice {
            partition: partition.name.clone(),
            estimated_start: match candidates[index].estimate {
                queue::Estimate::At(t) => Some(t),
                _ => None,
            },
            asked_at,
            candidates,
        };
        tracing::info!(model, "placing '{model}' on {}", choice.summary());
        let moved = queue::moved(&placement, &self.plan, partition);
        self.spin.report.lock().unwrap_or_else(PoisonError::into_inner).choices.insert(model.to_string(), choice);
        moved
    }

    /// Charges `gpu_secs` of backlog job `job` of `model` to the key with the largest backlog
    /// of the model ([`batch_demand`]'s rule), in the database.
    async fn charge_backlog(&mut self, job: JobId, model: &str, gpu_secs: u64) {
        let Some(hash) = self.backlog.get(model).and_then(|b| b.charge_to.clone()) else { return };
        let Some(batch) = self.parts.batch.clone() else { return };
        let name = match &self.parts.access {
            Access::Keys(keys) => keys.load().entry_by_hash_prefix(&hash).map(|e| e.name.clone()),
            Access::Open => None,
        };
        let name = name.unwrap_or_else(|| format!("sha256:{hash}"));
        if let Some(j) = self.jobs.get_mut(&job) {
            j.charged_to = Some(name.clone());
        }
        let (m, at) = (model.to_string(), crate::batch::now_s());
        match batch.db(move |c| batch_demand::charge(c, &hash, &m, at, gpu_secs)).await {
            Ok(()) => tracing::info!(
                model,
                "charged {:.2} GPU-hours of job {} for '{model}' to key {name}",
                gpu_secs as f64 / 3600.0,
                job.0
            ),
            Err(e) => self.error("charge", format!("cannot record the GPU-hours of a backlog job for '{model}': {e}")),
        }
    }

    /// Executes one command; `false` when a submission failed.
    async fn execute(&mut self, command: SpinCommand) -> bool {
        match command {
            SpinCommand::Submit { job, model, placement, walltime, batch: for_backlog } => {
                let placement = self.choose_partition(&model, placement, walltime).await;
                let Some(spec) = self.plan.model(&model) else { return true };
                let Some(partition) = self.plan.partition(&placement.shape_name) else { return true };
                let time_min = self.plan.batch.filter(|_| for_backlog).map(|b| b.job_time_min);
                let request = match job::render(&self.plan.job, partition, spec, &placement, walltime, time_min) {
                    Ok(r) => r,
                    Err(e) => {
                        // Checked with the configuration, so not expected; the job counts as ended.
                        self.error("submit", format!("cannot render the job for '{model}': {e}"));
                        return true;
                    }
                };
                self.jobs.insert(
                    job,
                    TrackedJob {
                        model: model.clone(),
                        partition: partition.name.clone(),
                        nodes: placement.pipeline_stages,
                        batch: None,
                        state: None,
                        raw_state: "SUBMITTING".into(),
                        node: None,
                        hosts: Vec::new(),
                        submitted: Instant::now(),
                        released: None,
                        for_backlog,
                        charged_to: None,
                    },
                );
                match self.batch.submit(&request).await {
                    Ok(id) => {
                        let kind = if for_backlog { "batch-backlog job" } else { "job" };
                        tracing::info!(model, "submitted {kind} {id} for '{model}': {placement}");
                        if for_backlog {
                            let gpu_secs = u64::from(placement.gpus()) * walltime.as_secs().max(1);
                            self.charge_backlog(job, &model, gpu_secs).await;
                        }
                        self.parts.metrics.spin_submits.get_or_create(&ModelLabel { model: model.clone() }).inc();
                        self.backoff = None;
                        if let Some(j) = self.jobs.get_mut(&job) {
                            j.batch = Some(id);
                            j.state = Some(BatchState::Pending);
                            j.raw_state = "PENDING".into();
                        }
                        true
                    }
                    Err(e) => {
                        // Not listed from now on: the spinner counts it as ended.
                        self.jobs.remove(&job);
                        let pause = self.backoff.map_or(self.plan.interval, |(_, d)| (d * 2).min(MAX_SUBMIT_BACKOFF));
                        self.backoff = Some((Instant::now() + pause, pause));
                        self.error(
                            "submit",
                            format!(
                                "cannot submit a job for '{model}': {e} (next try in {})",
                                humantime::format_duration(pause)
                            ),
                        );
                        false
                    }
                }
            }
            SpinCommand::Cancel { job } => {
                let Some(tracked) = self.jobs.get_mut(&job) else { return true };
                tracked.released = Some("cancelled");
                let (model, batch) = (tracked.model.clone(), tracked.batch);
                let Some(id) = batch else { return true };
                match self.batch.cancel(id).await {
                    Ok(()) => {
                        tracing::info!(model, "cancelled job {id} of '{model}' (not needed any more)");
                        self.parts.metrics.spin_cancels.get_or_create(&ModelLabel { model }).inc();
                    }
                    Err(e) => self.error("cancel", format!("cannot cancel job {id} of '{model}': {e}")),
                }
                true
            }
            SpinCommand::Drain { node } => {
                let Some(tracked) = self.jobs.values_mut().find(|j| j.node == Some(node)) else {
                    self.error("drain", format!("no job of this gateway runs node {node}; not drained"));
                    return true;
                };
                tracked.released = Some("drained");
                let (model, batch) = (tracked.model.clone(), tracked.batch);
                let Some(id) = batch else { return true };
                match self.batch.signal(id, JobSignal::Drain).await {
                    Ok(()) => {
                        tracing::info!(model, "draining node {node} (job {id}) of '{model}': demand went away");
                        self.parts.metrics.spin_drains.get_or_create(&ModelLabel { model }).inc();
                    }
                    Err(e) => self.error("drain", format!("cannot signal job {id} of '{model}' to drain: {e}")),
                }
                true
            }
        }
    }
}
