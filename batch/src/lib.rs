//! Tela's clients for batch systems: how a gateway's spinner turns
//! [`SpinCommand`](tela_core::spin::SpinCommand)s into jobs — submit, look up, cancel, signal —
//! whatever the scheduler's front door is. The spinner's decisions live in `tela-core`
//! ([`tela_core::spin`]); this crate only talks to the scheduler, and knows nothing of the
//! runtime that serves the jobs once they run.
//!
//! [`BatchSystem`] is the one interface the spinner drives. Backends implement it for one front
//! door each: the Slurm command line ([`sbatch`]: `sbatch`, `squeue`, `scancel`), Slurm's REST
//! daemon ([`slurmrest`]: `slurmrestd`, JWT) and CSCS's FirecREST v2 ([`firecrest`]: OIDC
//! client credentials, `POST`/`GET`/`DELETE /compute/{system}/jobs`; resources and the walltime
//! warning travel as `#SBATCH` lines, as v2 has no signal endpoint, and a drain is a `scancel
//! --batch --signal=USR1` run in the job through its `attach` endpoint). The two REST backends
//! share one HTTP exchange (`http`) and one TLS client configuration ([`client_tls`], which the
//! gateway's own outgoing HTTPS uses too).
//!
//! # Driving it
//!
//! 1. Build one backend from its configuration ([`sbatch::Sbatch::new`],
//!    [`slurmrest::SlurmRest::connect`], [`firecrest::Firecrest::new`]) and keep it as a
//!    `dyn BatchSystem`.
//! 2. Render what a job runs with a [`template::JobTemplate`] from the spinner's placement; the
//!    result is a [`JobRequest`].
//! 3. Optionally ask [`BatchSystem::estimate_start`] where the job would start soonest: the
//!    command-line backend answers with `sbatch --test-only`; the REST backends answer
//!    "unknown" (slurmrestd v0.0.38 and FirecREST v2 offer no will-run call).
//! 4. [`BatchSystem::submit`] it and keep the [`BatchJobId`].
//! 5. Poll [`BatchSystem::jobs`] with the ids still live: every id gets an answer, in order,
//!    and a job the scheduler forgot is [`BatchState::Ended`].
//! 6. End a job with [`BatchSystem::signal`] ([`JobSignal::Drain`]: the node finishes its
//!    requests, then exits) or [`BatchSystem::cancel`].
//!
//! The link from a job to the serving node it became is the job's *comment*: the batch script
//! writes `tela-node=<node id>` into it once the node's identity exists, and
//! [`BatchJob::node`] parses it back, so the Slurm backends can report it (FirecREST v2's job
//! answer carries no comment).
//!
//! ```no_run
//! use std::time::Duration;
//! use tela_batch::sbatch::{Sbatch, SbatchConfig};
//! use tela_batch::template::JobTemplate;
//! use tela_batch::{BatchSystem, JobSignal};
//! use tela_core::placement::{place, ModelSpec, NodeShape};
//! use tela_core::{GpuModel, Hardware, Quantization};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let slurm: Box<dyn BatchSystem> = Box::new(Sbatch::new(SbatchConfig::default()));
//! let shapes = [NodeShape::new("a100", Hardware::catalog(GpuModel::A100_80, 4), 2)];
//! let placement = place(&ModelSpec::new("llama-8b", 8_000, Quantization::Bf16), &shapes)?;
//! let template = JobTemplate::new(
//!     "/opt/tela/bin/tela",
//!     vec!["gw.example.org:7000".into()],
//!     "/home/svc/.tela/secret",
//!     "vllm serve {model} --port {port}",
//! );
//! let job = template.render("llama-8b", &placement, Duration::from_secs(3600))?;
//!
//! let id = slurm.submit(&job).await?;
//! let listed = slurm.jobs(&[id]).await?;
//! println!("job {id}: {} on {:?}, node {:?}", listed[0].raw_state, listed[0].hosts, listed[0].node());
//! slurm.signal(id, JobSignal::Drain).await?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod client_tls;
pub mod firecrest;
mod http;
pub mod sbatch;
pub mod slurmrest;
pub mod template;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use tela_core::NodeId;

/// The prefix of a job comment naming the node the job became.
pub const NODE_COMMENT_PREFIX: &str = "tela-node=";

/// The comment a batch script sets on its job once the node's identity is known (the full id in hex).
pub fn node_comment(node: &NodeId) -> String {
    format!("{NODE_COMMENT_PREFIX}{}", node.to_hex())
}

/// A job id as the batch system numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BatchJobId(pub u64);

impl fmt::Display for BatchJobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A job to submit: the rendered batch script and the resources it asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRequest {
    /// The job's name (shown by `squeue`).
    pub name: String,
    /// The whole batch script, starting with `#!`.
    pub script: String,
    /// Partition, if not the cluster's default.
    pub partition: Option<String>,
    /// Account to charge, if any.
    pub account: Option<String>,
    /// Quality of service, if not the account's default.
    pub qos: Option<String>,
    /// Nodes.
    pub nodes: u32,
    /// GPUs per node (0: none asked for).
    pub gpus_per_node: u32,
    /// CPUs for the job's one task per node.
    pub cpus_per_task: u32,
    /// The time limit.
    pub walltime: Duration,
    /// The least time limit Slurm may shrink the job to, to start it in a backfill window
    /// (`--time-min`; `None`: the job runs for `walltime` or not at all).
    pub time_min: Option<Duration>,
    /// How long before the time limit the batch shell gets SIGUSR1 (the drain window).
    pub drain_signal_before: Duration,
    /// Working directory of the job.
    pub working_dir: String,
    /// Environment of the job's processes, beyond what the backend passes itself.
    pub environment: Vec<(String, String)>,
}

/// Where a job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BatchState {
    /// Waiting in the queue (pending, configuring).
    Pending,
    /// Running.
    Running,
    /// Ending: its processes are being stopped (completing).
    Ending,
    /// Over (completed, failed, cancelled, timed out, preempted, gone from the queue).
    Ended,
}

impl BatchState {
    /// Whether the job still holds or waits for an allocation.
    pub fn is_live(self) -> bool {
        !matches!(self, BatchState::Ended)
    }
}

/// One job as the batch system lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchJob {
    /// Its id.
    pub id: BatchJobId,
    /// Its state.
    pub state: BatchState,
    /// The scheduler's own word for the state (`PENDING`, `RUNNING`, ...), for logs.
    pub raw_state: String,
    /// The job's comment (see [`NODE_COMMENT_PREFIX`]).
    pub comment: String,
    /// The hosts it runs on, once running.
    pub hosts: Vec<String>,
    /// Time left before its limit, when running and known.
    pub time_left: Option<Duration>,
}

impl BatchJob {
    /// The serving node the job became, from its comment.
    pub fn node(&self) -> Option<NodeId> {
        self.comment.split([',', ' ', ';']).find_map(|part| NodeId::from_hex(part.strip_prefix(NODE_COMMENT_PREFIX)?))
    }
}

/// A signal a job can be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobSignal {
    /// SIGUSR1: drain (the batch shell forwards it to `tela node`).
    Drain,
}

/// Why a batch system call failed.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// The backend's command or endpoint could not be reached or run.
    #[error("{backend}: cannot reach the batch system: {detail}")]
    Unreachable {
        /// The backend's name.
        backend: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// The batch system refused the request (bad partition, limits, authentication).
    #[error("{backend}: refused: {detail}")]
    Refused {
        /// The backend's name.
        backend: &'static str,
        /// The batch system's words.
        detail: String,
    },
    /// The batch system answered something this backend cannot read.
    #[error("{backend}: unexpected answer: {detail}")]
    Protocol {
        /// The backend's name.
        backend: &'static str,
        /// What was unexpected.
        detail: String,
    },
}

/// A boxed future, so that backends can sit behind `dyn BatchSystem`.
pub type BatchFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, BatchError>> + Send + 'a>>;

/// One front door to a batch system. See the module docs.
pub trait BatchSystem: Send + Sync {
    /// The backend's name, for logs (`sbatch`, `slurmrestd v0.0.38`).
    fn name(&self) -> &str;

    /// Submits a job and returns its id.
    fn submit<'a>(&'a self, job: &'a JobRequest) -> BatchFuture<'a, BatchJobId>;

    /// The listed state of each of `ids`; a job the batch system no longer lists is reported
    /// [`BatchState::Ended`] (so every id gets an answer, in order).
    fn jobs<'a>(&'a self, ids: &'a [BatchJobId]) -> BatchFuture<'a, Vec<BatchJob>>;

    /// Cancels a job, queued or running; cancelling an ended job is not an error.
    fn cancel(&self, id: BatchJobId) -> BatchFuture<'_, ()>;

    /// Sends a signal to the job's batch shell.
    fn signal(&self, id: BatchJobId, signal: JobSignal) -> BatchFuture<'_, ()>;

    /// When the scheduler expects `job` to start were it submitted now, without submitting it;
    /// `None` when this front door cannot tell (the default: slurmrestd v0.0.38 and FirecREST v2
    /// have no will-run endpoint), and the spinner then keeps its configured order.
    fn estimate_start<'a>(&'a self, job: &'a JobRequest) -> BatchFuture<'a, Option<SystemTime>> {
        let _ = job;
        Box::pin(async { Ok(None) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_is_read_back_from_the_comment() {
        let node = NodeId([7; 16]);
        let mut job = BatchJob {
            id: BatchJobId(12),
            state: BatchState::Running,
            raw_state: "RUNNING".into(),
            comment: node_comment(&node),
            hosts: vec![],
            time_left: None,
        };
        assert_eq!(job.node(), Some(node));
        job.comment = format!("owner=alice,{}", node_comment(&node));
        assert_eq!(job.node(), Some(node));
        job.comment = "tela-node=nothex".into();
        assert_eq!(job.node(), None);
        job.comment.clear();
        assert_eq!(job.node(), None);
    }
}
