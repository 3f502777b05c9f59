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
//! - `task`: the spin task's loop, its view of the world and how it carries out commands.
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
mod task;

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
use task::SpinTask;

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
