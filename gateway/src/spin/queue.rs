//! Spinning by the queue: before a job is submitted, the scheduler is asked when it would start
//! in each partition that could take it ([`BatchSystem::estimate_start`]), and the job goes
//! where the model would be up soonest.
//!
//! The candidates of a submission are the partition the core chose and the model's other
//! partitions (`partitions` of its `[[spin.model]]`, or every `[[spin.partition]]`) whose nodes
//! have the same profile and that have enough free nodes for the placement, in the order they
//! are configured. [`choose`] takes the earliest estimate; ties, and candidates without an
//! estimate (a REST backend, a timeout, a refusal), keep the configured order; when no candidate
//! has an estimate the core's choice stands. The last [`Choice`] of each model shows in `/status`
//! and in the log.
//!
//! A pending job of the model counts as supply in the core's decision, so while one waits in the
//! queue no second one is submitted for the same demand: the spinner waits for it.

use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use tela_batch::BatchSystem;
use tela_core::placement::Placement;

use super::config::{Partition, SpinPlan};
use super::job;

/// What the scheduler said about one candidate partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Estimate {
    /// It expects the job to start then.
    At(SystemTime),
    /// The front door cannot tell.
    Unknown,
    /// Asking failed or took too long (the reason).
    Failed(String),
}

impl Estimate {
    fn time(&self) -> Option<SystemTime> {
        match self {
            Estimate::At(t) => Some(*t),
            _ => None,
        }
    }
}

/// One partition a submission could go to, and its estimate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The `[[spin.partition]]` name.
    pub partition: String,
    /// When the job would start there.
    pub estimate: Estimate,
}

/// Where one submission went and why, for `/status` and the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The partition chosen.
    pub partition: String,
    /// Its estimated start, when known.
    pub estimated_start: Option<SystemTime>,
    /// When the scheduler was asked.
    pub asked_at: SystemTime,
    /// Every candidate, in configured order.
    pub candidates: Vec<Candidate>,
}

impl Choice {
    /// The choice as `/status` shows it.
    pub fn json(&self) -> Value {
        let stamp = |t: SystemTime| humantime::format_rfc3339_seconds(t).to_string();
        let candidates: Vec<Value> = self
            .candidates
            .iter()
            .map(|c| {
                let (start, error) = match &c.estimate {
                    Estimate::At(t) => (Some(stamp(*t)), None),
                    Estimate::Unknown => (None, None),
                    Estimate::Failed(e) => (None, Some(e.clone())),
                };
                json!({ "partition": c.partition, "estimated_start": start, "error": error })
            })
            .collect();
        json!({
            "partition": self.partition,
            "estimated_start": self.estimated_start.map(stamp),
            "asked_at": stamp(self.asked_at),
            "candidates": candidates,
        })
    }

    /// One line for the log: `gpu-b (start 2026-12-03T21:20:00Z; gpu-a 2026-12-03T22:00:00Z)`.
    pub fn summary(&self) -> String {
        let text = |e: &Estimate| match e {
            Estimate::At(t) => humantime::format_rfc3339_seconds(*t).to_string(),
            Estimate::Unknown => "unknown".into(),
            Estimate::Failed(e) => format!("failed: {e}"),
        };
        let others: Vec<String> = self
            .candidates
            .iter()
            .filter(|c| c.partition != self.partition)
            .map(|c| format!("{} {}", c.partition, text(&c.estimate)))
            .collect();
        let start = self.estimated_start.map_or("unknown".to_string(), |t| text(&Estimate::At(t)));
        if others.is_empty() {
            format!("{} (start {start})", self.partition)
        } else {
            format!("{} (start {start}; {})", self.partition, others.join(", "))
        }
    }
}

/// The index of the candidate to submit to: the earliest estimate, ties in configured order;
/// `fallback` (the core's choice) when no candidate has an estimate.
pub fn choose(candidates: &[Candidate], fallback: usize) -> usize {
    candidates
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.estimate.time().map(|t| (t, i)))
        .min()
        .map_or(fallback, |(_, i)| i)
}

/// The partitions `placement` (on the core's choice) could go to, in configured order: the
/// model's partitions with the same node profile and at least `placement`'s nodes free.
pub fn candidates<'p>(
    plan: &'p SpinPlan,
    model: &str,
    placement: &Placement,
    free: impl Fn(&str) -> u32,
) -> Vec<&'p Partition> {
    let Some(chosen) = plan.partition(&placement.shape_name) else { return Vec::new() };
    let allowed = plan.model(model).map(|m| m.policy.shapes.clone()).unwrap_or_default();
    let ordered: Vec<&Partition> = if allowed.is_empty() {
        plan.partitions.iter().collect()
    } else {
        allowed.iter().filter_map(|name| plan.partition(name)).collect()
    };
    ordered
        .into_iter()
        .filter(|p| {
            p.name == chosen.name
                || (p.profile == chosen.profile
                    && p.hardware == chosen.hardware
                    && free(&p.name) >= placement.pipeline_stages.max(1))
        })
        .collect()
}

/// `placement` moved to `partition` (same hardware, so the rest holds).
pub fn moved(placement: &Placement, plan: &SpinPlan, partition: &Partition) -> Placement {
    let mut moved = placement.clone();
    moved.shape_name = partition.name.clone();
    moved.shape = plan.partitions.iter().position(|p| p.name == partition.name).unwrap_or(placement.shape);
    moved
}

/// Asks `batch` for the start of `model`'s job on each of `partitions`, all within `timeout`
/// (what is not answered by then is [`Estimate::Failed`]).
pub async fn estimate(
    batch: &dyn BatchSystem,
    plan: &SpinPlan,
    model: &str,
    placement: &Placement,
    walltime: Duration,
    partitions: &[&Partition],
    timeout: Duration,
) -> Vec<Candidate> {
    let Some(spec) = plan.model(model) else { return Vec::new() };
    let asks = partitions.iter().map(|p| async move {
        let estimate = match job::render(&plan.job, p, spec, &moved(placement, plan, p), walltime, None) {
            Err(e) => Estimate::Failed(format!("cannot render the job: {e}")),
            Ok(request) => match tokio::time::timeout(timeout, batch.estimate_start(&request)).await {
                Err(_) => Estimate::Failed(format!("no answer within {}", humantime::format_duration(timeout))),
                Ok(Err(e)) => Estimate::Failed(e.to_string()),
                Ok(Ok(None)) => Estimate::Unknown,
                Ok(Ok(Some(t))) => Estimate::At(t),
            },
        };
        Candidate { partition: p.name.clone(), estimate }
    });
    futures::future::join_all(asks).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> Estimate {
        Estimate::At(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
    }

    fn cands(estimates: Vec<Estimate>) -> Vec<Candidate> {
        estimates
            .into_iter()
            .enumerate()
            .map(|(i, estimate)| Candidate { partition: format!("p{i}"), estimate })
            .collect()
    }

    #[test]
    fn the_earliest_estimate_wins_and_ties_keep_the_configured_order() {
        assert_eq!(choose(&cands(vec![at(100), at(50), at(70)]), 0), 1);
        assert_eq!(choose(&cands(vec![at(50), at(50)]), 1), 0);
        assert_eq!(choose(&cands(vec![at(90), at(10), at(10)]), 0), 1);
    }

    #[test]
    fn without_estimates_the_cores_choice_stands() {
        assert_eq!(choose(&cands(vec![Estimate::Unknown, Estimate::Unknown]), 1), 1);
        assert_eq!(choose(&cands(vec![Estimate::Failed("timeout".into()), Estimate::Unknown]), 0), 0);
        assert_eq!(choose(&[], 0), 0);
        // A known estimate beats candidates that have none.
        assert_eq!(choose(&cands(vec![Estimate::Unknown, Estimate::Failed("x".into()), at(500)]), 0), 2);
    }

    #[test]
    fn status_and_log_show_the_choice_and_the_alternatives() {
        let choice = Choice {
            partition: "p1".into(),
            estimated_start: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(60)),
            asked_at: SystemTime::UNIX_EPOCH,
            candidates: cands(vec![at(3600), at(60), Estimate::Failed("refused".into())]),
        };
        let v = choice.json();
        assert_eq!(v["partition"], "p1");
        assert_eq!(v["estimated_start"], "1970-01-01T00:01:00Z");
        assert_eq!(v["asked_at"], "1970-01-01T00:00:00Z");
        assert_eq!(v["candidates"][0]["estimated_start"], "1970-01-01T01:00:00Z");
        assert_eq!(v["candidates"][2]["error"], "refused");
        assert_eq!(choice.summary(), "p1 (start 1970-01-01T00:01:00Z; p0 1970-01-01T01:00:00Z, p2 failed: refused)");
    }

    fn plan() -> SpinPlan {
        let text = r#"
[spin]
[spin.backend]
kind = "sbatch"
[spin.job]
tela = "/opt/tela"
join = ["gw:7000"]
join_secret_file = "/etc/secret"
[[spin.partition]]
name = "a"
shape = "a100-80x4"
nodes = 2
[[spin.partition]]
name = "h"
shape = "h100x8"
nodes = 2
[[spin.partition]]
name = "b"
shape = "a100-80x4"
nodes = 1
[[spin.partition]]
name = "c"
slurm_partition = "a"
qos = "low"
shape = "a100-80x4"
nodes = 1
[[spin.model]]
name = "small"
params = "8B"
quantization = "bf16"
kv_headroom = "2GiB"
engine = "serve --port {port}"
partitions = ["c", "a", "h", "b"]
"#;
        crate::config::LoadedConfig::parse(text, "test.toml").expect("valid").spin.expect("[spin]")
    }

    #[test]
    fn candidates_are_the_models_partitions_of_the_same_hardware_with_room() {
        let plan = plan();
        let a = plan.partition("a").expect("a");
        let placement = moved(&plan.placements()[0].placement.clone().expect("placed"), &plan, a);
        let names = |free: &dyn Fn(&str) -> u32| -> Vec<String> {
            candidates(&plan, "small", &placement, free).into_iter().map(|p| p.name.clone()).collect()
        };
        // The model's order, without the H100 partition; the core's choice stays even when full.
        assert_eq!(names(&|_| 1), ["c", "a", "b"]);
        assert_eq!(names(&|p| u32::from(p != "b" && p != "a")), ["c", "a"]);
        let moved_b = moved(&placement, &plan, plan.partition("b").expect("b"));
        assert_eq!((moved_b.shape_name.as_str(), moved_b.shape), ("b", 2));
    }

    #[test]
    fn an_alternative_may_be_the_same_slurm_partition_with_another_qos() {
        let plan = plan();
        let c = plan.partition("c").expect("c");
        let placement = moved(&plan.placements()[0].placement.clone().expect("placed"), &plan, c);
        let spec = plan.model("small").expect("model");
        let job = job::render(&plan.job, c, spec, &placement, Duration::from_secs(3600), None).expect("renders");
        assert_eq!((job.partition.as_deref(), job.qos.as_deref()), (Some("a"), Some("low")));
        let a = plan.partition("a").expect("a");
        let job = job::render(&plan.job, a, spec, &moved(&placement, &plan, a), Duration::from_secs(3600), None)
            .expect("renders");
        assert_eq!((job.partition.as_deref(), job.qos.as_deref()), (Some("a"), None));
        assert!(plan.describe().contains("(Slurm partition a, QoS low)"), "{}", plan.describe());
    }
}
