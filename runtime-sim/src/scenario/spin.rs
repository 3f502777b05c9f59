//! Model spinning in a scenario: the `[spin]` section — the same `[[spin.partition]]`,
//! `[[spin.model]]`, `budget` and `[spin.cold_start]` tables a gateway reads from its
//! `gateway.toml`, checked by the same core functions — plus what only a simulation needs: how
//! long each partition's queue makes a job wait (`[[spin.queue]]`), each model's demand over the
//! day and engine start-up (`[[spin.demand]]`), bursts, a demand trace to replay
//! (`[[spin.trace]]`) and preemptions.
//!
//! ```toml
//! [spin]
//! interval = "15s"
//! max_concurrent_jobs = 20
//! budget = { gpu_hours = 600, window = "24h" }
//! cold_start = { capacity = 5000, timeout = "15m" }
//!
//! [[spin.partition]]
//! name = "l40s"
//! shape = "l40s"
//! nodes = 8
//!
//! [[spin.model]]
//! name = "llama-3.1-8b"
//! params = "8B"
//! quantization = "bf16"
//! kv_headroom = "8GiB"
//!
//! [[spin.queue]]
//! partition = "l40s"
//! wait_s = [60, 600]
//!
//! [[spin.demand]]
//! model = "llama-3.1-8b"
//! peak_per_s = 3.5
//! ```
//!
//! Keys only a batch system needs (a model's `engine`, a partition's `account`, ...) are
//! accepted and have no effect. A model's jobs are told to drain its `drain_window` before
//! their walltime, `protocol.drain_window_s` where it has none.

use super::Workload;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tela_core::placement::NodeShape;
use tela_core::spin::config::{
    limits, positive, BudgetSection, ColdStart, ColdStartSection, Dur, InvalidKey, ModelSection, PartitionSection,
};
use tela_core::spin::{ModelPolicy, SpinConfig};

/// Model spinning: the core's spin controller drives simulated Slurm jobs.
///
/// A simulated gateway measures demand per model, lists the spinner's jobs and the free nodes of
/// each partition, calls the spinner every `interval` and executes its commands: a submit waits
/// in the partition's queue, starts a serving node that joins, loads the engine and serves until
/// the spinner drains it, a preemption ends it, or its walltime does (drain signal
/// `protocol.drain_window_s` before). Requests for a model with no replica wait in the gateway's
/// cold-start queue.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Spin {
    /// Between two periodic decisions (a request that finds no replica also triggers one;
    /// default 5 s, as a gateway's).
    pub interval: Option<Dur>,
    /// Most live spinner jobs at once (queued, running or draining; default 8).
    pub max_concurrent_jobs: Option<u32>,
    /// GPU-hours the jobs submitted within one window may use.
    pub budget: Option<BudgetSection>,
    /// The cold-start queue of each gateway and model.
    pub cold_start: Option<ColdStartSection>,
    /// Preemptions of running spinner jobs, at uniform times before `faults_until_s`; each drains
    /// at once and is killed `jobs.preempt_grace_s` later.
    pub preemptions: u32,
    /// Slurm partitions the spinner may submit to (the gateway's schema).
    pub partition: Vec<PartitionSection>,
    /// Spinnable models and their policy (the gateway's schema).
    pub model: Vec<ModelSection>,
    /// How long a job waits in each partition's queue (default 30–300 s).
    pub queue: Vec<QueueWait>,
    /// Each model's demand over the day and its engine's start-up.
    pub demand: Vec<ModelDemand>,
    /// Bursts of extra demand on top of the models' daily curves.
    pub burst: Vec<Burst>,
    /// Requests at fixed times, on top of the curves: a demand trace to replay.
    pub trace: Vec<TraceStep>,
}

/// `requests` requests for `model` arriving together at `at_s`, each answering `tokens` tokens.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TraceStep {
    /// Seconds from the start of the run.
    pub at_s: f64,
    /// The model.
    pub model: String,
    /// How many requests arrive at once.
    pub requests: u32,
    /// Tokens each response streams (at `workload.tokens_per_s`, after `workload.ttft_ms`).
    pub tokens: u32,
}

/// How long a job waits in one partition's queue.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QueueWait {
    /// The partition.
    pub partition: String,
    /// Uniform range in seconds.
    pub wait_s: [f64; 2],
}

/// The demand for one model over the day, and how long its engine takes to start.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ModelDemand {
    /// The model.
    pub model: String,
    /// Engine start-up (weights loading) time, uniform range in seconds.
    pub engine_startup_s: [f64; 2],
    /// Arrivals per second at the daily low, inside the active hours.
    pub base_per_s: f64,
    /// Arrivals per second at the daily peak.
    pub peak_per_s: f64,
    /// Hour of the day of the peak.
    pub peak_hour: f64,
    /// Hours of the day `[from, to)` with demand; outside, the model is idle.
    pub active_hours: [f64; 2],
    /// Tokens per response, uniform range.
    pub tokens: [u32; 2],
}

/// Extra demand for one model during a stretch of the day.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Burst {
    /// The model.
    pub model: String,
    /// Start, in hours from the beginning of the run.
    pub start_h: f64,
    /// Length in minutes.
    pub minutes: f64,
    /// Arrivals per second added.
    pub rate_per_s: f64,
}

impl Default for ModelDemand {
    fn default() -> Self {
        ModelDemand {
            model: String::new(),
            engine_startup_s: [60.0, 180.0],
            base_per_s: 0.1,
            peak_per_s: 1.0,
            peak_hour: 14.0,
            active_hours: [0.0, 24.0],
            tokens: [64, 1024],
        }
    }
}

impl Default for Burst {
    fn default() -> Self {
        Burst { model: String::new(), start_h: 0.0, minutes: 10.0, rate_per_s: 1.0 }
    }
}

const DEFAULT_QUEUE_WAIT_S: [f64; 2] = [30.0, 300.0];

/// One spinnable model, checked: its policy and its demand.
#[derive(Clone, Debug)]
pub struct PlannedModel {
    /// How it spins.
    pub policy: ModelPolicy,
    /// What it is asked for.
    pub demand: ModelDemand,
    /// How long before the walltime its jobs are told to drain (`None`:
    /// `protocol.drain_window_s`).
    pub drain_window: Option<Duration>,
}

impl PlannedModel {
    /// The model's name.
    pub fn name(&self) -> &str {
        &self.policy.spec.name
    }
}

/// `[spin]`, checked: what the simulated spinner runs with.
#[derive(Clone, Debug)]
pub struct SpinPlan {
    /// Between two periodic decisions.
    pub interval: Duration,
    /// Limits over all models.
    pub limits: SpinConfig,
    /// The cold-start queue of each gateway and model.
    pub cold_start: ColdStart,
    /// Every partition with all its nodes free, in the order written.
    pub shapes: Vec<NodeShape>,
    /// Per partition: the queue wait range in seconds.
    pub queue_wait_s: Vec<[f64; 2]>,
    /// The models, in the order written.
    pub models: Vec<PlannedModel>,
}

impl Spin {
    /// Whether spinning is on.
    pub fn enabled(&self) -> bool {
        !self.model.is_empty()
    }

    /// Checks the section with the gateway's rules and the simulation's own; the error names
    /// the key at fault and says why.
    pub fn plan(&self) -> Result<SpinPlan, InvalidKey> {
        let s = self;
        let interval = positive("spin.interval", s.interval, Duration::from_secs(5))?;
        let limits = limits(s.max_concurrent_jobs, s.budget.as_ref())?;
        let cold_start = ColdStartSection::resolve(s.cold_start.as_ref())?;
        if s.partition.is_empty() {
            return Err(bad("spin.partition", "at least one [[spin.partition]] is needed to place the models"));
        }
        let mut shapes: Vec<NodeShape> = Vec::new();
        for p in &s.partition {
            let (_, hardware) = p.hardware()?;
            if shapes.iter().any(|q| q.name == p.name) {
                return Err(bad(format!("spin.partition[{}]", p.name), "is defined twice"));
            }
            shapes.push(NodeShape::new(p.name.clone(), hardware, p.nodes));
        }
        let mut queue_wait_s = vec![DEFAULT_QUEUE_WAIT_S; shapes.len()];
        for q in &s.queue {
            let key = |field: &str| format!("spin.queue[{}].{field}", q.partition);
            let Some(i) = shapes.iter().position(|p| p.name == q.partition) else {
                return Err(bad(key("partition"), format!("'{}' is not a [[spin.partition]]", q.partition)));
            };
            if q.wait_s[0] > q.wait_s[1] || q.wait_s[0] < 0.0 {
                return Err(bad(key("wait_s"), "must be [low, high] with 0 <= low <= high"));
            }
            queue_wait_s[i] = q.wait_s;
        }
        let mut models: Vec<PlannedModel> = Vec::new();
        for m in &s.model {
            let policy = m.policy(&shapes)?;
            if models.iter().any(|o| o.name() == m.name) {
                return Err(bad(format!("spin.model[{}]", m.name), "is defined twice"));
            }
            let demand = s.demand.iter().find(|d| d.model == m.name).cloned();
            let demand = demand.unwrap_or_else(|| ModelDemand { model: m.name.clone(), ..ModelDemand::default() });
            let key = |field: &str| format!("spin.demand[{}].{field}", m.name);
            let [from, to] = demand.active_hours;
            if !(0.0..=24.0).contains(&from) || !(0.0..=24.0).contains(&to) || from > to {
                return Err(bad(key("active_hours"), "must be [from, to] within 0..=24"));
            }
            if demand.tokens[0] > demand.tokens[1] {
                return Err(bad(key("tokens"), "must be [low, high]"));
            }
            if demand.base_per_s > demand.peak_per_s {
                return Err(bad(key("base_per_s"), "must not be above peak_per_s"));
            }
            models.push(PlannedModel { policy, demand, drain_window: m.drain_window.map(|d| d.0) });
        }
        let named = |name: &str| s.model.iter().any(|m| m.name == name);
        let unknown = |table: &str, model: &str| {
            bad(format!("spin.{table}[{model}].model"), format!("'{model}' is not a [[spin.model]]"))
        };
        if let Some(d) = s.demand.iter().find(|d| !named(&d.model)) {
            return Err(unknown("demand", &d.model));
        }
        if let Some(b) = s.burst.iter().find(|b| !named(&b.model)) {
            return Err(unknown("burst", &b.model));
        }
        if let Some(t) = s.trace.iter().find(|t| !named(&t.model)) {
            return Err(unknown("trace", &t.model));
        }
        if let Some(t) = s.trace.iter().find(|t| t.at_s.is_nan() || t.at_s < 0.0) {
            return Err(bad(
                format!("spin.trace[{}].at_s", t.model),
                format!("must be a time from the start, not {}", t.at_s),
            ));
        }
        // The core's own checks, for anything the ones above do not cover.
        tela_core::spin::Spinner::new(limits, models.iter().map(|m| m.policy.clone()).collect())
            .map_err(|e| bad("spin.model", e.to_string()))?;
        Ok(SpinPlan { interval, limits, cold_start, shapes, queue_wait_s, models })
    }

    /// Checks the spinning section of a scenario whose engines stream `workload.tokens_per_s`;
    /// the error says what is wrong.
    pub(super) fn validate(&self, workload: &Workload) -> Result<(), InvalidKey> {
        if !self.enabled() {
            return Ok(());
        }
        self.plan()?;
        if workload.tokens_per_s <= 0.0 {
            return Err(bad("workload.tokens_per_s", "must be above zero"));
        }
        Ok(())
    }
}

/// A refusal of `key`.
fn bad(key: impl Into<String>, reason: impl Into<String>) -> InvalidKey {
    InvalidKey { key: key.into(), reason: reason.into() }
}
