//! The spinning part of a run report.
//!
//! # Definitions
//!
//! - **Cold-start wait**: for a request that found no routable replica of its model and waited in
//!   its gateway's cold-start queue, the time from its arrival until a replica took it. Requests
//!   whose wait reached `spin.cold_start.timeout` are counted as `timed_out` (answered with an
//!   error that says the model is still starting), not in the percentiles.
//! - **GPU-hours used**: for every spinner job, its GPUs × the time from its start (leaving the
//!   batch queue) to its end (drained exit, preemption kill, walltime, cancellation) or the end of
//!   the run: what the allocation held, engine start-up and drains included.
//! - **Oracle**: knows every arrival in advance and starts replicas instantly, with no walltime,
//!   start-up or drain waste. For each model and each minute, it runs the replicas the policy's
//!   scale-up rule asks for that minute's demand: the mean concurrency (service seconds of the
//!   minute's arrivals ÷ 60) over `concurrency_per_replica`, arrivals over
//!   `arrivals_per_replica` when set, at least one replica in any minute with an arrival, within
//!   `min_replicas..=max_replicas`; each replica takes the GPUs placement gives it with every
//!   partition free. `ratio` is used ÷ oracle: 1 is perfect foresight; above 1 is the price of
//!   queue waits, start-up, hysteresis and drains.
//! - **Flaps**: a job cancelled before its node ever served (submitted, then found unneeded), plus
//!   a submission for a model within its policy's `cooldown` after a release (cancel or drain) of
//!   the same model.

use crate::sim::Sim;
use crate::spin::{Minute, SpinWorld};
use serde::Serialize;

/// Jobs the spinner handled.
#[derive(Clone, Debug, Serialize)]
pub struct SpinJobs {
    /// Submitted.
    pub submitted: u64,
    /// Left the batch queue and started a node.
    pub started: u64,
    /// Whose node reached SERVE.
    pub served: u64,
    /// Cancel commands.
    pub cancels: u64,
    /// Drain commands (replicas released).
    pub drains: u64,
    /// Ended at their walltime (killed, or exited after the walltime's drain).
    pub ended_walltime: u64,
    /// Ended by a preemption.
    pub ended_preempted: u64,
    /// Ended after the spinner drained them.
    pub ended_drained: u64,
    /// Preemptions of spinner jobs.
    pub preemptions: u64,
    /// Still live (queued, running or draining) at the end of the run.
    pub live_at_end: u64,
    /// Of those, still in the batch queue.
    pub queued_at_end: u64,
    /// The sum of `min_replicas`: what may legitimately stay up without demand.
    pub min_replicas: u64,
    /// Most live jobs at once, and the cap.
    pub max_live: u32,
    /// `spin.max_concurrent_jobs`.
    pub max_concurrent_jobs: u32,
    /// Most GPU-hours charged to the budget window at once, and the budget (0: none).
    pub max_budget_charged_gpu_hours: f64,
    /// `spin.budget.gpu_hours` (0: no budget).
    pub budget_gpu_hours: u64,
}

/// Cold-start waits.
#[derive(Clone, Debug, Serialize)]
pub struct ColdStart {
    /// Requests that waited in a cold-start queue.
    pub enqueued: u64,
    /// Of those, routed to a replica (the percentiles are over these).
    pub served: usize,
    /// Median wait.
    pub p50_ms: f64,
    /// 99th percentile wait.
    pub p99_ms: f64,
    /// Longest wait.
    pub max_ms: f64,
    /// Answered with a timeout error after `spin.cold_start.timeout`.
    pub timed_out: u64,
    /// Refused at once because the queue was full.
    pub refused: u64,
    /// Released but no replica took them (failed).
    pub unrouted: u64,
    /// Still waiting when the run ended.
    pub waiting_at_end: u64,
}

/// GPU-hours against the oracle.
#[derive(Clone, Debug, Serialize)]
pub struct GpuHours {
    /// Held by the spinner's jobs.
    pub used: f64,
    /// What the oracle needs (see the module docs).
    pub oracle: f64,
    /// used ÷ oracle.
    pub ratio: f64,
}

/// Submit/cancel flaps.
#[derive(Clone, Debug, Serialize)]
pub struct Flaps {
    /// Jobs cancelled before their node served.
    pub cancelled_before_serving: u64,
    /// Submissions within the cooldown after a release of the same model.
    pub submits_in_cooldown: u64,
    /// Both together.
    pub total: u64,
}

/// One model's placement and totals.
#[derive(Clone, Debug, Serialize)]
pub struct SpinModelReport {
    /// The model.
    pub name: String,
    /// Where a replica goes with every partition free.
    pub placement: String,
    /// GPUs per replica there.
    pub gpus_per_replica: u32,
    /// Replicas the oracle runs at its busiest minute.
    pub oracle_peak_replicas: u32,
    /// Most replicas serving at once (minute samples).
    pub peak_serving: u32,
}

/// One partition's share.
#[derive(Clone, Debug, Serialize)]
pub struct SpinPartitionReport {
    /// The partition.
    pub name: String,
    /// Its hardware profile.
    pub hardware: String,
    /// Jobs that started on it.
    pub jobs: u64,
    /// GPU-hours its jobs held.
    pub gpu_hours: f64,
}

/// One command of the spinner.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SpinCommandRecord {
    /// Simulated seconds.
    pub at_s: f64,
    /// `submit`, `cancel` or `drain`.
    pub kind: &'static str,
    /// The model of the job or node.
    pub model: String,
}

/// What model spinning did over the run.
#[derive(Clone, Debug, Serialize)]
pub struct SpinReport {
    /// Jobs.
    pub jobs: SpinJobs,
    /// Cold-start waits.
    pub cold_start: ColdStart,
    /// GPU-hours against the oracle.
    pub gpu_hours: GpuHours,
    /// Flaps.
    pub flaps: Flaps,
    /// Per model.
    pub models: Vec<SpinModelReport>,
    /// Per partition.
    pub partitions: Vec<SpinPartitionReport>,
    /// Every command the spinner gave, in order.
    pub commands: Vec<SpinCommandRecord>,
    /// Per-minute samples, for plots.
    #[serde(skip)]
    pub timeline: Vec<Minute>,
    /// Per model, per minute: the oracle's replicas, for plots.
    #[serde(skip)]
    pub oracle_replicas: Vec<Vec<u32>>,
}

impl SpinReport {
    pub(crate) fn build(sim: &Sim, spin: &SpinWorld) -> SpinReport {
        let m = &spin.m;
        let usage = spin.usage(sim.now);
        let (served, p50, p99, max) = spin.cold_waits();
        let models = spin
            .plan
            .models
            .iter()
            .enumerate()
            .map(|(i, model)| SpinModelReport {
                name: model.name().to_string(),
                placement: tela_core::placement::place(&model.policy.spec, &spin.plan.shapes)
                    .map_or_else(|e| e.to_string(), |p| p.to_string()),
                gpus_per_replica: spin.gpus_per_replica(i),
                oracle_peak_replicas: usage.oracle_replicas[i].iter().copied().max().unwrap_or(0),
                peak_serving: m.timeline.iter().map(|t| t.serving[i]).max().unwrap_or(0),
            })
            .collect();
        SpinReport {
            jobs: SpinJobs {
                submitted: m.submits,
                started: m.started,
                served: m.served,
                cancels: m.cancels,
                drains: m.drains,
                ended_walltime: m.ended_walltime,
                ended_preempted: m.ended_preempted,
                ended_drained: m.ended_drained,
                preemptions: m.preemptions,
                live_at_end: usage.live_at_end,
                queued_at_end: usage.queued_at_end,
                min_replicas: usage.min_replicas,
                max_live: m.max_live_jobs,
                max_concurrent_jobs: spin.plan.limits.max_concurrent_jobs,
                max_budget_charged_gpu_hours: m.max_budget_gpu_s as f64 / 3600.0,
                budget_gpu_hours: spin.plan.limits.budget.map_or(0, |b| b.gpu_hours),
            },
            cold_start: ColdStart {
                enqueued: m.cold_enqueued,
                served,
                p50_ms: p50,
                p99_ms: p99,
                max_ms: max,
                timed_out: m.cold_timed_out,
                refused: m.cold_refused,
                unrouted: m.cold_unrouted,
                waiting_at_end: sim.spin_waiting(),
            },
            gpu_hours: GpuHours {
                used: usage.gpu_hours,
                oracle: usage.oracle_gpu_hours,
                ratio: if usage.oracle_gpu_hours > 0.0 { usage.gpu_hours / usage.oracle_gpu_hours } else { 0.0 },
            },
            flaps: Flaps {
                cancelled_before_serving: m.cancelled_before_serving,
                submits_in_cooldown: m.submits_in_cooldown,
                total: m.cancelled_before_serving + m.submits_in_cooldown,
            },
            models,
            partitions: sim
                .sc
                .spin
                .partition
                .iter()
                .zip(&usage.partitions)
                .map(|(p, (jobs, gpu_hours))| SpinPartitionReport {
                    name: p.name.clone(),
                    hardware: p.hardware().map(|(profile, _)| profile).unwrap_or_default(),
                    jobs: *jobs,
                    gpu_hours: *gpu_hours,
                })
                .collect(),
            commands: m.commands.clone(),
            timeline: m.timeline.clone(),
            oracle_replicas: usage.oracle_replicas,
        }
    }

    /// A few lines for humans.
    pub fn summary(&self) -> String {
        let (j, c, g, f) = (&self.jobs, &self.cold_start, &self.gpu_hours, &self.flaps);
        let mut out = format!(
            "spin jobs: {} submitted, {} started, {} served, {} cancelled, {} drained by the spinner; ended: {} walltime, {} preempted, {} drained; {} live at end ({} min replicas); max live {} of {}; budget charged max {:.0} of {} GPU-h\n\
             cold start: {} waited, {} served after p50 {:.1} s / p99 {:.1} s / max {:.1} s; {} timed out, {} refused, {} unrouted, {} waiting at end\n\
             GPU-hours: {:.1} used vs {:.1} oracle (ratio {:.2}); flaps {} ({} cancelled before serving, {} submits within cooldown of a release)",
            j.submitted, j.started, j.served, j.cancels, j.drains, j.ended_walltime, j.ended_preempted, j.ended_drained,
            j.live_at_end, j.min_replicas, j.max_live, j.max_concurrent_jobs, j.max_budget_charged_gpu_hours,
            j.budget_gpu_hours,
            c.enqueued, c.served, c.p50_ms / 1e3, c.p99_ms / 1e3, c.max_ms / 1e3, c.timed_out, c.refused, c.unrouted,
            c.waiting_at_end,
            g.used, g.oracle, g.ratio, f.total, f.cancelled_before_serving, f.submits_in_cooldown,
        );
        for m in &self.models {
            out.push_str(&format!(
                "\n  {}: {} GPU(s) per replica on {}; peak serving {}, oracle peak {}",
                m.name, m.gpus_per_replica, m.placement, m.peak_serving, m.oracle_peak_replicas
            ));
        }
        let parts: Vec<String> =
            self.partitions.iter().map(|p| format!("{} {} jobs / {:.1} GPU-h", p.name, p.jobs, p.gpu_hours)).collect();
        out.push_str(&format!("\n  partitions: {}", parts.join(", ")));
        out
    }
}
