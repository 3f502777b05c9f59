//! Request and answer shapes of slurmrestd's OpenAPI plugin `v0.0.38` (Slurm 22.05; also served
//! by 23.02). Only the fields Tela sends or reads are modelled; unknown fields are ignored.
//!
//! What 22.05 does, verified against a real slurmrestd:
//! - `POST /slurm/v0.0.38/job/submit` wants `environment`; `time_limit` is in minutes; `nodes`
//!   is `[min, max]`; `signal` must not start with `B:` (HTTP 400), so a REST job cannot ask for
//!   the walltime warning to go to its batch shell.
//! - `GET /slurm/v0.0.38/job/{id}` of a purged job answers HTTP 500 with error number 2017
//!   (invalid job id). An expired token also gives HTTP 500, with other error numbers.
//! - `DELETE /slurm/v0.0.38/job/{id}?signal=SIGUSR1` signals the *whole* job: the batch shell,
//!   every process it started, and every step (`KILL_FULL_JOB`), not the batch shell alone.

use super::super::{BatchJob, BatchJobId, JobRequest};
use super::BACKEND;
use crate::sbatch::{expand_hostlist, slurm_state};
use crate::BatchError;
use crate::BatchState;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Slurm's error number for an unknown (or purged) job id.
pub const ESLURM_INVALID_JOB_ID: i64 = 2017;

/// `POST job/submit` body.
#[derive(Debug, Serialize)]
pub struct SubmitRequest<'a> {
    /// The batch script.
    pub script: &'a str,
    /// The job's properties.
    pub job: JobProperties<'a>,
}

/// `v0.0.38_job_properties`, the part Tela sets.
#[derive(Debug, Serialize)]
pub struct JobProperties<'a> {
    /// Job name.
    pub name: &'a str,
    /// Partition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<&'a str>,
    /// Account.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<&'a str>,
    /// Quality of service.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos: Option<&'a str>,
    /// `[min, max]` nodes.
    pub nodes: [u32; 2],
    /// Tasks in all (one per node).
    pub tasks: u32,
    /// Tasks per node.
    pub tasks_per_node: u32,
    /// CPUs per task.
    pub cpus_per_task: u32,
    /// `gpu:N` per node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gres: Option<String>,
    /// Time limit in minutes.
    pub time_limit: u64,
    /// The least time limit in minutes Slurm may shrink the job to (backfill).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_minimum: Option<u64>,
    /// Working directory.
    pub current_working_directory: &'a str,
    /// The job's whole environment.
    pub environment: BTreeMap<&'a str, &'a str>,
}

impl<'a> SubmitRequest<'a> {
    /// The body for `job`, its environment being `base` overridden by the job's own.
    pub fn new(job: &'a JobRequest, base: &'a [(String, String)]) -> SubmitRequest<'a> {
        let mut environment = BTreeMap::new();
        for (k, v) in base.iter().chain(&job.environment) {
            environment.insert(k.as_str(), v.as_str());
        }
        SubmitRequest {
            script: &job.script,
            job: JobProperties {
                name: &job.name,
                partition: job.partition.as_deref(),
                account: job.account.as_deref(),
                qos: job.qos.as_deref(),
                nodes: [job.nodes, job.nodes],
                tasks: job.nodes,
                tasks_per_node: 1,
                cpus_per_task: job.cpus_per_task,
                gres: (job.gpus_per_node > 0).then(|| format!("gpu:{}", job.gpus_per_node)),
                time_limit: job.walltime.as_secs().div_ceil(60),
                time_minimum: job.time_min.map(|m| m.min(job.walltime).as_secs().div_ceil(60)),
                current_working_directory: &job.working_dir,
                environment,
            },
        }
    }
}

/// One entry of an answer's `errors`.
#[derive(Debug, Default, Deserialize)]
pub struct RestErrorEntry {
    /// Slurm's error number (`error_number`, or `error_code` in some answers).
    #[serde(default, alias = "error_code")]
    pub error_number: Option<i64>,
    /// Slurm's words.
    #[serde(default)]
    pub error: Option<String>,
    /// More words.
    #[serde(default)]
    pub description: Option<String>,
}

impl RestErrorEntry {
    /// The entry as one readable line.
    pub fn text(&self) -> String {
        let mut text = String::new();
        if let Some(d) = self.description.as_deref().filter(|d| !d.is_empty()) {
            text.push_str(d);
        }
        if let Some(e) = self.error.as_deref().filter(|e| !e.is_empty()) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(e);
        }
        if let Some(n) = self.error_number {
            text.push_str(&format!(" (error {n})"));
        }
        text
    }
}

/// The part every answer has.
#[derive(Debug, Default, Deserialize)]
pub struct Errors {
    /// What went wrong, if anything.
    #[serde(default)]
    pub errors: Vec<RestErrorEntry>,
}

impl Errors {
    /// Whether Slurm said the job id is unknown.
    pub fn job_unknown(&self) -> bool {
        self.errors.iter().any(|e| e.error_number == Some(ESLURM_INVALID_JOB_ID))
    }

    /// All errors on one line.
    pub fn text(&self) -> String {
        self.errors.iter().map(RestErrorEntry::text).collect::<Vec<_>>().join("; ")
    }
}

/// `POST job/submit` answer.
#[derive(Debug, Deserialize)]
pub struct SubmitResponse {
    /// Errors.
    #[serde(flatten)]
    pub errors: Errors,
    /// The new job's id.
    #[serde(default)]
    pub job_id: Option<u64>,
}

/// `GET job/{id}` and `GET jobs` answer.
#[derive(Debug, Deserialize)]
pub struct JobsResponse {
    /// Errors.
    #[serde(flatten)]
    pub errors: Errors,
    /// The jobs.
    #[serde(default)]
    pub jobs: Vec<JobInfo>,
}

/// `v0.0.38_job_response_properties`, the part Tela reads.
#[derive(Debug, Deserialize)]
pub struct JobInfo {
    /// Id.
    pub job_id: u64,
    /// `PENDING`, `RUNNING`, ...
    #[serde(default)]
    pub job_state: String,
    /// Comment.
    #[serde(default)]
    pub comment: Option<String>,
    /// Allocated nodes as a host list.
    #[serde(default)]
    pub nodes: Option<String>,
    /// When the job ends at the latest (seconds since 1970).
    #[serde(default)]
    pub end_time: Option<u64>,
}

impl JobInfo {
    /// As a [`BatchJob`]; the time left is measured against `now`.
    pub fn to_batch_job(&self, now: SystemTime) -> BatchJob {
        let state = slurm_state(&self.job_state);
        let time_left = match (state, self.end_time) {
            (BatchState::Running, Some(end)) if end > 0 => {
                let end = UNIX_EPOCH + Duration::from_secs(end);
                Some(end.duration_since(now).unwrap_or(Duration::ZERO))
            }
            _ => None,
        };
        BatchJob {
            id: BatchJobId(self.job_id),
            state,
            raw_state: self.job_state.clone(),
            comment: self.comment.clone().unwrap_or_default(),
            hosts: self.nodes.as_deref().map(expand_hostlist).unwrap_or_default(),
            time_left,
        }
    }
}

/// Reads an answer body, or says why it cannot.
pub fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, BatchError> {
    serde_json::from_slice(body)
        .map_err(|e| BatchError::Protocol { backend: BACKEND, detail: format!("{e} in '{}'", preview(body)) })
}

/// The start of a body, for messages.
pub fn preview(body: &[u8]) -> String {
    crate::http::preview(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tela_core::NodeId;

    #[test]
    fn submit_bodies_carry_every_resource() {
        let job = JobRequest {
            name: "tela-llama".into(),
            script: "#!/bin/bash\ntrue\n".into(),
            partition: Some("gpu".into()),
            account: None,
            qos: None,
            nodes: 2,
            gpus_per_node: 4,
            cpus_per_task: 8,
            walltime: Duration::from_secs(3600 + 1),
            time_min: None,
            drain_signal_before: Duration::from_secs(960),
            working_dir: "/scratch".into(),
            environment: vec![("PATH".into(), "/opt/tela/bin:/usr/bin".into()), ("TELA_JOIN".into(), "gw:7000".into())],
        };
        let base = [("PATH".to_string(), "/usr/bin:/bin".to_string()), ("LANG".to_string(), "C.UTF-8".to_string())];
        let body = serde_json::to_value(SubmitRequest::new(&job, &base)).expect("serializes");
        assert_eq!(
            body,
            serde_json::json!({
                "script": "#!/bin/bash\ntrue\n",
                "job": {
                    "name": "tela-llama",
                    "partition": "gpu",
                    "nodes": [2, 2],
                    "tasks": 2,
                    "tasks_per_node": 1,
                    "cpus_per_task": 8,
                    "gres": "gpu:4",
                    "time_limit": 61,
                    "current_working_directory": "/scratch",
                    "environment": {"PATH": "/opt/tela/bin:/usr/bin", "LANG": "C.UTF-8", "TELA_JOIN": "gw:7000"},
                }
            })
        );
    }

    #[test]
    fn a_backfill_job_asks_for_its_least_time_in_minutes() {
        let job = JobRequest {
            name: "tela-llama".into(),
            script: "#!/bin/bash\ntrue\n".into(),
            partition: None,
            account: None,
            qos: None,
            nodes: 1,
            gpus_per_node: 1,
            cpus_per_task: 8,
            walltime: Duration::from_secs(30 * 60),
            time_min: Some(Duration::from_secs(10 * 60 + 1)),
            drain_signal_before: Duration::from_secs(120),
            working_dir: "/scratch".into(),
            environment: Vec::new(),
        };
        let body = serde_json::to_value(SubmitRequest::new(&job, &[])).expect("serializes");
        assert_eq!((body["job"]["time_limit"].as_u64(), body["job"]["time_minimum"].as_u64()), (Some(30), Some(11)));
    }

    #[test]
    fn job_answers_become_jobs() {
        let node = NodeId([3; 16]);
        let body = format!(
            r#"{{"meta": {{"plugin": {{"type": "openapi/v0.0.38"}}}}, "errors": [], "jobs": [
                {{"job_id": 7, "job_state": "RUNNING", "comment": "tela-node={}", "nodes": "gpu[1-2]",
                  "end_time": 1000, "start_time": 400, "gres_detail": ["gpu:1(IDX:0)"]}},
                {{"job_id": 8, "job_state": "PENDING", "comment": "", "nodes": "", "end_time": 0}}
            ]}}"#,
            node.to_hex()
        );
        let answer: JobsResponse = parse(body.as_bytes()).expect("parses");
        let now = UNIX_EPOCH + Duration::from_secs(940);
        let jobs: Vec<BatchJob> = answer.jobs.iter().map(|j| j.to_batch_job(now)).collect();
        assert_eq!(jobs[0].state, BatchState::Running);
        assert_eq!(jobs[0].node(), Some(node));
        assert_eq!(jobs[0].hosts, ["gpu1", "gpu2"]);
        assert_eq!(jobs[0].time_left, Some(Duration::from_secs(60)));
        assert_eq!((jobs[1].state, jobs[1].time_left, jobs[1].hosts.len()), (BatchState::Pending, None, 0));
    }

    #[test]
    fn unknown_jobs_and_other_errors_are_told_apart() {
        let gone: JobsResponse = parse(
            br#"{"errors":[{"description":"Unable to find JobId=999","error_number":2017,"error":"Invalid job id specified","source":"slurm_load_job"}],"jobs":[]}"#,
        )
        .expect("parses");
        assert!(gone.errors.job_unknown());
        assert!(gone.errors.text().contains("Unable to find JobId=999: Invalid job id specified (error 2017)"));
        // What an expired token looks like in 22.05: not a missing job.
        let expired: JobsResponse = parse(
            br#"{"errors":[{"description":"Unable to find JobId=4","error_number":-1,"error":"Unspecified error"}],"jobs":[]}"#,
        )
        .expect("parses");
        assert!(!expired.errors.job_unknown());
        let refused: SubmitResponse =
            parse(br#"{"errors":[{"error_code":2000,"error":"Invalid partition name specified"}]}"#).expect("parses");
        assert_eq!(refused.job_id, None);
        assert_eq!(refused.errors.text(), "Invalid partition name specified (error 2000)");
        assert!(matches!(parse::<JobsResponse>(b"<html>"), Err(BatchError::Protocol { .. })));
    }
}
