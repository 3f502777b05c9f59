//! Request and answer shapes of FirecREST v2's compute API (tag 2.5.6), and how Tela's jobs map
//! onto them. Only the fields Tela sends or reads are modelled; unknown fields are ignored.
//!
//! What v2 does, verified against the real server in front of Slurm 22.05:
//! - `POST /compute/{system}/jobs` runs `sbatch --export='ALL,<env>' --chdir=... --job-name=...`
//!   over SSH with the script on its standard input, and answers 201 `{"jobId": "123"}`; it
//!   takes no resource fields, hence the `#SBATCH` lines.
//! - `GET /compute/{system}/jobs/{id}` answers `{"jobs": [{"jobId", "name", "status": {"state",
//!   ...}, "nodes", "time": {"start", "limit", ...}, ...}]}` from `sacct` and `squeue` (state
//!   words as sacct prints them, e.g. `CANCELLED by 0`), or 404 `{"message": "Job not found."}`.
//! - Errors are `{"errorType", "message", "causedBy", "user"}`, or FastAPI's `{"detail"}`.

use super::BACKEND;
use crate::http::preview;
use crate::sbatch::{expand_hostlist, resource_args, slurm_state};
use crate::{node_comment, BatchError, BatchJob, BatchJobId, BatchState, JobRequest};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `POST /compute/{system}/jobs` body.
#[derive(Debug, Serialize)]
pub struct SubmitRequest<'a> {
    /// The job.
    pub job: JobDescription<'a>,
}

/// v2's job description, the part Tela sets.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobDescription<'a> {
    /// Job name.
    pub name: &'a str,
    /// Working directory.
    pub working_directory: &'a str,
    /// The script, with the resources as `#SBATCH` lines.
    pub script: String,
    /// Environment added to the job's (FirecREST passes it as `--export=ALL,...`).
    pub env: BTreeMap<&'a str, &'a str>,
    /// Partition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<&'a str>,
    /// Account.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<&'a str>,
}

impl<'a> SubmitRequest<'a> {
    /// The body for `job`; refuses environment values FirecREST's `--export` would split.
    pub fn new(job: &'a JobRequest) -> Result<SubmitRequest<'a>, BatchError> {
        let mut env = BTreeMap::new();
        // An empty env would become `--export=ALL,`; name the front door instead.
        env.insert("TELA_BATCH_BACKEND", BACKEND);
        for (k, v) in &job.environment {
            if v.contains([',', '\'', '\n']) {
                return Err(BatchError::Refused {
                    backend: BACKEND,
                    detail: format!(
                        "job '{}': the value of {k} holds a comma, quote or newline, which FirecREST's --export cannot pass",
                        job.name
                    ),
                });
            }
            env.insert(k.as_str(), v.as_str());
        }
        Ok(SubmitRequest {
            job: JobDescription {
                name: &job.name,
                working_directory: &job.working_dir,
                script: script_with_directives(job),
                env,
                partition: job.partition.as_deref(),
                account: job.account.as_deref(),
            },
        })
    }
}

/// The job's script with its resources as `#SBATCH` lines after the `#!` line.
pub fn script_with_directives(job: &JobRequest) -> String {
    let (shebang, rest) = job.script.split_once('\n').unwrap_or((&job.script, ""));
    let mut script = String::with_capacity(job.script.len() + 256);
    script.push_str(shebang);
    script.push('\n');
    script.push_str("# resources, time limit and walltime warning, added by Tela's FirecREST backend\n");
    for arg in resource_args(job) {
        script.push_str("#SBATCH ");
        script.push_str(&arg);
        script.push('\n');
    }
    script.push_str(rest);
    script
}

/// `POST /compute/{system}/jobs` answer.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SubmitAnswer {
    pub(super) job_id: Option<serde_json::Value>,
}

/// `GET /compute/{system}/jobs/{id}` answer.
#[derive(Debug, Deserialize)]
pub(super) struct JobsAnswer {
    #[serde(default)]
    pub(super) jobs: Option<Vec<JobEntry>>,
}

/// One job as v2 lists it (the fields Tela reads).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct JobEntry {
    job_id: serde_json::Value,
    status: JobEntryStatus,
    #[serde(default)]
    nodes: Option<String>,
    #[serde(default)]
    time: Option<JobEntryTime>,
}

/// A job's status.
#[derive(Debug, Deserialize)]
pub(super) struct JobEntryStatus {
    state: String,
}

/// Times in seconds (`start` since 1970, `limit` the time limit).
#[derive(Debug, Deserialize)]
pub(super) struct JobEntryTime {
    #[serde(default)]
    start: Option<u64>,
    #[serde(default)]
    limit: Option<u64>,
}

impl JobEntry {
    /// The job id, a string in v2 (a number is read too).
    pub(super) fn id(&self) -> Option<u64> {
        match &self.job_id {
            serde_json::Value::String(s) => s.trim().parse().ok(),
            serde_json::Value::Number(n) => n.as_u64(),
            _ => None,
        }
    }

    /// The job as the spinner sees it (`now` for its time left).
    pub(super) fn to_batch_job(&self, id: BatchJobId, now: SystemTime) -> BatchJob {
        let state = slurm_state(&self.status.state);
        let time_left = match (state, self.time.as_ref()) {
            (BatchState::Running, Some(JobEntryTime { start: Some(start), limit: Some(limit) })) => {
                let end = UNIX_EPOCH + Duration::from_secs(start.saturating_add(*limit));
                Some(end.duration_since(now).unwrap_or_default())
            }
            _ => None,
        };
        let hosts = match self.nodes.as_deref().map(str::trim) {
            Some(n) if !n.is_empty() && !n.starts_with("None") && state.is_live() => expand_hostlist(n),
            _ => Vec::new(),
        };
        BatchJob { id, state, raw_state: self.status.state.clone(), comment: String::new(), hosts, time_left }
    }
}

/// The comment naming the node, from the job template's line `tela: job <id> is node <hex>`.
pub(super) fn node_in_output(text: &str, id: BatchJobId) -> Option<String> {
    let prefix = format!("tela: job {id} is node ");
    let hex = text.lines().find_map(|l| l.trim().strip_prefix(prefix.as_str()))?.trim();
    tela_core::NodeId::from_hex(hex).map(|node| node_comment(&node))
}

/// What FirecREST says went wrong, from its error answer (`message` and `causedBy`, or
/// FastAPI's `detail`), else the start of the body.
pub fn error_words(body: &[u8]) -> String {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else { return preview(body) };
    let mut words = Vec::new();
    if let Some(m) = value.get("message").and_then(|m| m.as_str()) {
        words.push(m.trim().to_string());
    }
    if let Some(causes) = value.get("causedBy").and_then(|c| c.as_array()) {
        words.extend(causes.iter().filter_map(|c| c.as_str()).map(|c| format!("caused by: {}", c.trim())));
    }
    match value.get("detail") {
        Some(serde_json::Value::String(d)) => words.push(d.trim().to_string()),
        Some(serde_json::Value::Array(items)) => words.extend(items.iter().map(|i| {
            let msg = i.get("msg").and_then(|m| m.as_str()).unwrap_or("invalid");
            let loc = i.get("loc").map(|l| l.to_string()).unwrap_or_default();
            format!("{msg} at {loc}")
        })),
        _ => {}
    }
    words.retain(|w| !w.is_empty());
    if words.is_empty() {
        preview(body)
    } else {
        words.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> JobRequest {
        JobRequest {
            name: "tela-smol".into(),
            script: "#!/bin/bash\nset -eu\necho hi\n".into(),
            partition: Some("debug".into()),
            account: None,
            qos: None,
            nodes: 1,
            gpus_per_node: 2,
            cpus_per_task: 4,
            walltime: Duration::from_secs(3600),
            time_min: None,
            drain_signal_before: Duration::from_secs(660),
            working_dir: "/tmp".into(),
            environment: vec![("HF_HOME".into(), "/scratch/hf cache".into())],
        }
    }

    #[test]
    fn resources_and_the_drain_warning_become_sbatch_lines_after_the_shebang() {
        let script = script_with_directives(&job());
        let lines: Vec<&str> = script.lines().collect();
        assert_eq!(lines[0], "#!/bin/bash");
        for want in [
            "#SBATCH --nodes=1",
            "#SBATCH --gres=gpu:2",
            "#SBATCH --cpus-per-task=4",
            "#SBATCH --time=0-01:00:00",
            "#SBATCH --signal=B:USR1@660",
        ] {
            assert!(lines.contains(&want), "{want} missing from\n{script}");
        }
        // Every directive comes before the first command, or sbatch ignores it.
        let first_command = lines.iter().position(|l| *l == "set -eu").expect("body kept");
        assert!(lines.iter().rposition(|l| l.starts_with("#SBATCH")).expect("directives") < first_command);
        assert!(script.ends_with("echo hi\n"));
    }

    #[test]
    fn a_backfill_job_carries_its_least_time_as_a_directive() {
        let mut short = job();
        short.time_min = Some(Duration::from_secs(600));
        let script = script_with_directives(&short);
        assert!(script.lines().any(|l| l == "#SBATCH --time-min=0-00:10:00"), "{script}");
        assert!(!script_with_directives(&job()).contains("--time-min"));
    }

    #[test]
    fn submit_bodies_use_v2_names_and_refuse_what_export_would_split() {
        let body = serde_json::to_value(SubmitRequest::new(&job()).expect("valid")).expect("json");
        assert_eq!(body["job"]["workingDirectory"], "/tmp");
        assert_eq!(body["job"]["name"], "tela-smol");
        assert_eq!(body["job"]["partition"], "debug");
        assert_eq!(body["job"]["env"]["HF_HOME"], "/scratch/hf cache");
        assert!(body["job"].get("account").is_none());
        let mut bad = job();
        bad.environment.push(("LIST".into(), "a,b".into()));
        let err = SubmitRequest::new(&bad).unwrap_err();
        assert!(err.to_string().contains("LIST") && err.to_string().contains("comma"), "{err}");
    }

    #[test]
    fn firecrest_errors_are_read_in_words() {
        let body = br#"{"errorType":"error","message":"Error executing Slurm command.","causedBy":["sbatch: error: invalid partition"]}"#;
        assert_eq!(error_words(body), "Error executing Slurm command.; caused by: sbatch: error: invalid partition");
        assert_eq!(error_words(br#"{"detail":"Job not found."}"#), "Job not found.");
        let v = br#"{"detail":[{"loc":["body","job","script"],"msg":"field required"}]}"#;
        assert!(error_words(v).starts_with("field required at"), "{}", error_words(v));
        assert_eq!(error_words(b"<html>Bad Gateway</html>"), "<html>Bad Gateway</html>");
    }

    #[test]
    fn job_entries_map_to_states_and_hosts() {
        let answer: JobsAnswer = serde_json::from_str(
            r#"{"jobs":[{"jobId":"42","name":"x","status":{"state":"RUNNING"},"nodes":"n[1-2]","time":{"start":1000,"limit":120}}]}"#,
        )
        .expect("parses");
        let now = UNIX_EPOCH + Duration::from_secs(1100);
        let job = answer.jobs.expect("jobs")[0].to_batch_job(BatchJobId(42), now);
        assert_eq!(job.state, BatchState::Running);
        assert_eq!(job.hosts, ["n1", "n2"]);
        assert_eq!(job.time_left, Some(Duration::from_secs(20)));
        let pending: JobEntry =
            serde_json::from_str(r#"{"jobId":7,"status":{"state":"PENDING"},"nodes":"None assigned"}"#)
                .expect("parses");
        assert_eq!(pending.id(), Some(7));
        assert!(pending.to_batch_job(BatchJobId(7), now).hosts.is_empty());
        let cancelled: JobEntry =
            serde_json::from_str(r#"{"jobId":"8","status":{"state":"CANCELLED by 0"}}"#).expect("parses");
        assert_eq!(cancelled.to_batch_job(BatchJobId(8), now).state, BatchState::Ended);
    }

    #[test]
    fn the_node_is_read_from_the_job_templates_first_line() {
        let node = tela_core::NodeId([0xab; 16]);
        let text = format!("starting\ntela: job 12 is node {}\nmore\n", node.to_hex());
        assert_eq!(node_in_output(&text, BatchJobId(12)), Some(node_comment(&node)));
        assert_eq!(node_in_output(&text, BatchJobId(13)), None, "another job's line");
        assert_eq!(node_in_output("tela: job 12 is node zz\n", BatchJobId(12)), None);
    }
}
