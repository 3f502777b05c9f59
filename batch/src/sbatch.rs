//! The Slurm command-line backend: `sbatch`, `squeue` and `scancel`, run as child processes on a
//! host where the Slurm client commands work (a login node, or the gateway's host when it is
//! part of the cluster).
//!
//! - **submit**: `sbatch --parsable` with the script on stdin and every resource as a flag
//!   (`--gres=gpu:N`, `--time`, `--signal=B:USR1@<drain>`, `--chdir`, ...). The job's
//!   environment is the one `sbatch` runs with, which is built from scratch: the variables named
//!   in [`SbatchConfig::pass_env`] (`PATH`, `HOME`, ...) taken from this process, then the
//!   request's own, with `--export=ALL`. Nothing else of this process's environment (say, its
//!   join secret) reaches the job.
//! - **jobs**: `squeue --states=all -j <ids> -o '%i|%T|%L|%N|%k'`, one line per job, the comment
//!   last so that it may contain the separator. `squeue --json` is not used: Slurm 22.05 ignores
//!   `-j` with it. Jobs that ended longer ago than the controller's `MinJobAge` are no longer
//!   listed and are reported [`BatchState::Ended`].
//! - **estimate_start**: `sbatch --test-only` with the same script and options as `submit`
//!   (nothing is queued); Slurm answers on stderr `Job N to start at 2026-12-03T21:20:00 using 1
//!   processors on nodes n1 in partition debug`. It runs with `TZ=UTC` and
//!   `SLURM_TIME_FORMAT=standard`, so that the time is read back without guessing a zone.
//! - **cancel**: `scancel <id>` (silent and successful for a job that already ended).
//! - **signal**: `scancel --batch --signal=USR1 <id>`: the batch shell alone gets the signal, as
//!   with `--signal=B:`; the job template's trap passes it to `tela node`.
//!
//! Every command runs with a timeout ([`SbatchConfig::timeout`]) and is killed when it expires;
//! what a failing command printed on stderr ends up in the [`BatchError`].
//!
//! ```no_run
//! use tela_batch::{sbatch::{Sbatch, SbatchConfig}, BatchJobId, BatchSystem};
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let slurm = Sbatch::new(SbatchConfig::default());
//! let jobs = slurm.jobs(&[BatchJobId(42)]).await?;
//! println!("{:?} on {:?}, node {:?}", jobs[0].state, jobs[0].hosts, jobs[0].node());
//! # Ok(()) }
//! ```

use super::{BatchError, BatchFuture, BatchJob, BatchJobId, BatchState, BatchSystem, JobRequest, JobSignal};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, SystemTime};
use tela_core::spin::parse_slurm_duration;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

const BACKEND: &str = "sbatch";

/// The `squeue` output format: id, state, time left, node list, comment (last: it may contain `|`).
pub const SQUEUE_FORMAT: &str = "%i|%T|%L|%N|%k";

/// How to run the Slurm commands.
#[derive(Clone, Debug)]
pub struct SbatchConfig {
    /// The `sbatch` program (a name looked up in `PATH`, or a path).
    pub sbatch: PathBuf,
    /// The `squeue` program.
    pub squeue: PathBuf,
    /// The `scancel` program.
    pub scancel: PathBuf,
    /// Arguments added to every `sbatch` call, before the backend's own (e.g. `--qos=serve`).
    pub sbatch_args: Vec<String>,
    /// Arguments added to every `squeue` and `scancel` call (e.g. `--clusters=gpu` together with
    /// the same in `sbatch_args`).
    pub query_args: Vec<String>,
    /// Variables of this process's environment that `sbatch` (and so the job) gets.
    pub pass_env: Vec<String>,
    /// Longest a command may run before it is killed and the call fails.
    pub timeout: Duration,
}

impl Default for SbatchConfig {
    fn default() -> Self {
        SbatchConfig {
            sbatch: "sbatch".into(),
            squeue: "squeue".into(),
            scancel: "scancel".into(),
            sbatch_args: Vec::new(),
            query_args: Vec::new(),
            pass_env: ["PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "SLURM_CONF"]
                .map(String::from)
                .to_vec(),
            timeout: Duration::from_secs(30),
        }
    }
}

/// The Slurm command-line backend. See the module docs.
#[derive(Clone, Debug)]
pub struct Sbatch {
    config: SbatchConfig,
}

impl Sbatch {
    /// A backend that runs the commands `config` names.
    pub fn new(config: SbatchConfig) -> Sbatch {
        Sbatch { config }
    }

    /// The arguments `sbatch` gets for `job` (the script goes to its stdin).
    pub fn submit_args(&self, job: &JobRequest) -> Result<Vec<String>, BatchError> {
        check_job(job)?;
        let mut args = self.config.sbatch_args.clone();
        args.push("--parsable".into());
        args.push(format!("--job-name={}", job.name));
        if let Some(p) = &job.partition {
            args.push(format!("--partition={p}"));
        }
        if let Some(a) = &job.account {
            args.push(format!("--account={a}"));
        }
        args.extend(resource_args(job));
        args.push(format!("--chdir={}", job.working_dir));
        args.push("--export=ALL".into());
        Ok(args)
    }

    /// The arguments `sbatch --test-only` gets for `job`: those of [`Sbatch::submit_args`]
    /// without `--parsable`.
    pub fn test_only_args(&self, job: &JobRequest) -> Result<Vec<String>, BatchError> {
        let mut args: Vec<String> = self.submit_args(job)?.into_iter().filter(|a| a != "--parsable").collect();
        args.push("--test-only".into());
        Ok(args)
    }

    /// Runs `program` with `args`, `stdin` written to it, and either this process's environment
    /// or exactly `env`.
    async fn run(
        &self,
        program: &PathBuf,
        args: &[String],
        stdin: Option<&str>,
        env: Option<Vec<(String, String)>>,
    ) -> Result<Output, BatchError> {
        let mut command = Command::new(program);
        if let Some(env) = env {
            command.env_clear().envs(env);
        }
        command.args(args).kill_on_drop(true).stdout(Stdio::piped()).stderr(Stdio::piped());
        command.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let shown = format!("{} {}", program.display(), args.join(" "));
        let unreachable = |detail: String| BatchError::Unreachable { backend: BACKEND, detail };
        let work = async {
            let mut child = command.spawn().map_err(|e| unreachable(format!("cannot run `{shown}`: {e}")))?;
            if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
                pipe.write_all(text.as_bytes())
                    .await
                    .map_err(|e| unreachable(format!("cannot write the script to `{shown}`: {e}")))?;
                drop(pipe);
            }
            child.wait_with_output().await.map_err(|e| unreachable(format!("`{shown}`: {e}")))
        };
        let output = tokio::time::timeout(self.config.timeout, work)
            .await
            .map_err(|_| unreachable(format!("`{shown}` did not finish within {:?}", self.config.timeout)))??;
        Ok(Output {
            success: output.status.success(),
            status: output.status.to_string(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            shown,
        })
    }

    fn environment<'a>(&'a self, job: &'a JobRequest) -> impl Iterator<Item = (String, String)> + 'a {
        let inherited = self.config.pass_env.iter().filter_map(|k| std::env::var(k).ok().map(|v| (k.clone(), v)));
        inherited.chain(job.environment.iter().cloned())
    }
}

struct Output {
    success: bool,
    status: String,
    stdout: String,
    stderr: String,
    shown: String,
}

impl Output {
    /// The failure as an error: what the command printed, or its exit status.
    fn refused(&self) -> BatchError {
        let said = if self.stderr.is_empty() { self.stdout.trim() } else { self.stderr.as_str() };
        BatchError::Refused { backend: BACKEND, detail: format!("`{}` {}: {said}", self.shown, self.status) }
    }
}

impl BatchSystem for Sbatch {
    fn name(&self) -> &str {
        BACKEND
    }

    fn submit<'a>(&'a self, job: &'a JobRequest) -> BatchFuture<'a, BatchJobId> {
        Box::pin(async move {
            let args = self.submit_args(job)?;
            let env: Vec<(String, String)> = self.environment(job).collect();
            let output = self.run(&self.config.sbatch, &args, Some(&job.script), Some(env)).await?;
            if !output.success {
                return Err(output.refused());
            }
            parse_parsable(&output.stdout)
        })
    }

    fn estimate_start<'a>(&'a self, job: &'a JobRequest) -> BatchFuture<'a, Option<SystemTime>> {
        Box::pin(async move {
            let args = self.test_only_args(job)?;
            // The answer is in local time without a zone: make that zone UTC, in ISO form.
            let mut env: Vec<(String, String)> =
                self.environment(job).filter(|(k, _)| k != "TZ" && k != "SLURM_TIME_FORMAT").collect();
            env.push(("TZ".into(), "UTC".into()));
            env.push(("SLURM_TIME_FORMAT".into(), "standard".into()));
            let output = self.run(&self.config.sbatch, &args, Some(&job.script), Some(env)).await?;
            if !output.success {
                return Err(output.refused());
            }
            parse_test_only(&format!("{}\n{}", output.stderr, output.stdout)).map(Some)
        })
    }

    fn jobs<'a>(&'a self, ids: &'a [BatchJobId]) -> BatchFuture<'a, Vec<BatchJob>> {
        Box::pin(async move {
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            let list: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
            let mut args = self.config.query_args.clone();
            args.extend(["--noheader", "--states=all", "--format", SQUEUE_FORMAT].map(String::from));
            args.push(format!("--jobs={}", list.join(",")));
            let output = self.run(&self.config.squeue, &args, None, None).await?;
            let listed = if output.success {
                parse_squeue(&output.stdout)?
            } else if output.stderr.contains("Invalid job id specified") {
                // squeue fails so when none of the ids is known any more.
                Vec::new()
            } else {
                return Err(output.refused());
            };
            Ok(in_order(ids, listed))
        })
    }

    fn cancel(&self, id: BatchJobId) -> BatchFuture<'_, ()> {
        Box::pin(async move {
            let mut args = self.config.query_args.clone();
            args.push(id.to_string());
            let output = self.run(&self.config.scancel, &args, None, None).await?;
            if output.success || gone(&output.stderr) {
                Ok(())
            } else {
                Err(output.refused())
            }
        })
    }

    fn signal(&self, id: BatchJobId, signal: JobSignal) -> BatchFuture<'_, ()> {
        Box::pin(async move {
            let name = match signal {
                JobSignal::Drain => "USR1",
            };
            let mut args = self.config.query_args.clone();
            args.extend(["--batch".to_string(), format!("--signal={name}"), id.to_string()]);
            let output = self.run(&self.config.scancel, &args, None, None).await?;
            // A job that has ended has nothing left to drain.
            if output.success || gone(&output.stderr) {
                Ok(())
            } else {
                Err(output.refused())
            }
        })
    }
}

/// Whether Slurm's complaint means the job is not known (any more).
fn gone(stderr: &str) -> bool {
    stderr.contains("Invalid job id specified") || stderr.contains("already completing or completed")
}

/// The options that ask for `job`'s QoS, resources, time limit and walltime warning (`--qos`, `--nodes`,
/// `--gres`, `--time`, `--time-min`, `--signal=B:USR1@<drain>`, ...): `sbatch` arguments here, `#SBATCH`
/// lines where a front door takes only a script (FirecREST).
pub fn resource_args(job: &JobRequest) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(q) = &job.qos {
        args.push(format!("--qos={q}"));
    }
    args.extend([format!("--nodes={}", job.nodes), "--ntasks-per-node=1".into()]);
    if job.gpus_per_node > 0 {
        args.push(format!("--gres=gpu:{}", job.gpus_per_node));
    }
    args.push(format!("--cpus-per-task={}", job.cpus_per_task));
    args.push(format!("--time={}", slurm_time(job.walltime)));
    if let Some(min) = job.time_min {
        args.push(format!("--time-min={}", slurm_time(min.min(job.walltime))));
    }
    if !job.drain_signal_before.is_zero() {
        // Slurm takes whole seconds and at most 65535.
        let secs = job.drain_signal_before.as_secs().clamp(1, 65_535);
        args.push(format!("--signal=B:USR1@{secs}"));
    }
    args
}

/// Checks what Slurm would otherwise reject with a less helpful message, or what would break
/// the command line.
pub(crate) fn check_job(job: &JobRequest) -> Result<(), BatchError> {
    let bad = |detail: String| Err(BatchError::Refused { backend: BACKEND, detail });
    if job.nodes == 0 {
        return bad(format!("job '{}' asks for 0 nodes", job.name));
    }
    if job.cpus_per_task == 0 {
        return bad(format!("job '{}' asks for 0 CPUs per task", job.name));
    }
    if job.walltime < Duration::from_secs(60) {
        return bad(format!(
            "job '{}': the walltime {:?} is under Slurm's one-minute granularity",
            job.name, job.walltime
        ));
    }
    if !job.script.starts_with("#!") {
        return bad(format!("job '{}': the script must start with #! (Slurm refuses it otherwise)", job.name));
    }
    if job.working_dir.is_empty() {
        return bad(format!("job '{}' has no working directory", job.name));
    }
    for (k, _) in &job.environment {
        if k.is_empty() || k.contains(['=', '\0']) {
            return bad(format!("job '{}': '{k}' is not an environment variable name", job.name));
        }
    }
    Ok(())
}

/// A duration as Slurm's `days-hours:minutes:seconds`, rounded up to whole minutes (Slurm's
/// limits are in minutes).
pub fn slurm_time(d: Duration) -> String {
    let minutes = d.as_secs().div_ceil(60);
    let (days, rest) = (minutes / 1440, minutes % 1440);
    format!("{days}-{:02}:{:02}:00", rest / 60, rest % 60)
}

/// Reads `sbatch --parsable`'s answer: `<id>` or `<id>;<cluster>`.
pub fn parse_parsable(stdout: &str) -> Result<BatchJobId, BatchError> {
    let line = stdout.lines().map(str::trim).rfind(|l| !l.is_empty()).unwrap_or("");
    let id = line.split(';').next().unwrap_or("");
    id.parse::<u64>().map(BatchJobId).map_err(|_| BatchError::Protocol {
        backend: BACKEND,
        detail: format!("sbatch --parsable printed '{}', not a job id", stdout.trim()),
    })
}

/// Reads `sbatch --test-only`'s answer (`sbatch: Job 5 to start at 2026-12-03T21:20:00 using 1
/// processors on nodes n1 in partition debug`), the time being UTC.
pub fn parse_test_only(text: &str) -> Result<SystemTime, BatchError> {
    let protocol = |detail: String| BatchError::Protocol { backend: BACKEND, detail };
    let Some((_, after)) = text.split_once(" to start at ") else {
        return Err(protocol(format!("sbatch --test-only printed no start time: '{}'", text.trim())));
    };
    let stamp = after.split_whitespace().next().unwrap_or("");
    humantime::parse_rfc3339_weak(stamp)
        .map_err(|e| protocol(format!("sbatch --test-only printed a start time '{stamp}' that is not one ({e})")))
}

/// Reads `squeue --noheader --format` [`SQUEUE_FORMAT`] output. Lines that are not job records
/// (such as `CLUSTER: name` with `--clusters`) are skipped; a record with a bad id is an error.
pub fn parse_squeue(stdout: &str) -> Result<Vec<BatchJob>, BatchError> {
    let mut jobs = Vec::new();
    for line in stdout.lines() {
        let mut fields = line.splitn(5, '|');
        let (Some(id), Some(state), Some(left), Some(nodes), Some(comment)) =
            (fields.next(), fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let id = id.trim();
        let id = id.parse::<u64>().map_err(|_| BatchError::Protocol {
            backend: BACKEND,
            detail: format!("squeue listed a job id '{id}' that is not a number: '{line}'"),
        })?;
        let raw_state = state.trim().to_string();
        let state = slurm_state(&raw_state);
        let time_left = match state {
            BatchState::Running => parse_slurm_duration(left).flatten(),
            _ => None,
        };
        let comment = comment.trim_end_matches(['\r', '\n']);
        jobs.push(BatchJob {
            id: BatchJobId(id),
            state,
            raw_state,
            comment: if comment == "(null)" { String::new() } else { comment.to_string() },
            hosts: expand_hostlist(nodes.trim()),
            time_left,
        });
    }
    Ok(jobs)
}

/// One answer per id, in order; ids missing from `listed` ended long enough ago to be purged.
pub(crate) fn in_order(ids: &[BatchJobId], listed: Vec<BatchJob>) -> Vec<BatchJob> {
    ids.iter().map(|id| listed.iter().find(|j| j.id == *id).cloned().unwrap_or_else(|| not_listed(*id))).collect()
}

/// A job the batch system no longer lists: it ended.
pub(crate) fn not_listed(id: BatchJobId) -> BatchJob {
    BatchJob {
        id,
        state: BatchState::Ended,
        raw_state: "NOT_LISTED".into(),
        comment: String::new(),
        hosts: Vec::new(),
        time_left: None,
    }
}

/// Slurm's job state words (`squeue %T`, REST `job_state`) as a [`BatchState`]. Unknown words
/// count as pending: the job is still live, so the spinner neither resubmits nor forgets it.
pub fn slurm_state(raw: &str) -> BatchState {
    // A state may carry flags after '+' or ' ' (REST prints e.g. "CANCELLED by 0" in places).
    let base = raw.split(['+', ' ']).next().unwrap_or("");
    match base {
        "RUNNING" => BatchState::Running,
        "COMPLETING" | "SIGNALING" | "STAGE_OUT" => BatchState::Ending,
        "COMPLETED" | "CANCELLED" | "FAILED" | "TIMEOUT" | "PREEMPTED" | "NODE_FAIL" | "BOOT_FAIL" | "DEADLINE"
        | "OUT_OF_MEMORY" | "SPECIAL_EXIT" | "REVOKED" => BatchState::Ended,
        // PENDING, CONFIGURING, REQUEUED, REQUEUE_HOLD, REQUEUE_FED, RESIZING, SUSPENDED,
        // STOPPED (not running, allocation or not) and anything newer.
        _ => BatchState::Pending,
    }
}

/// Expands a Slurm host list (`gpu[01-03,07],login1`) into host names. Text it cannot read is
/// kept as one name rather than dropped.
pub fn expand_hostlist(list: &str) -> Vec<String> {
    let mut hosts = Vec::new();
    if list.is_empty() || list == "(null)" {
        return hosts;
    }
    // Split at commas outside brackets.
    let mut depth = 0u32;
    let mut start = 0;
    let mut items = Vec::new();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&list[start..]);
    for item in items.into_iter().filter(|i| !i.is_empty()) {
        match expand_one(item) {
            Some(mut names) => hosts.append(&mut names),
            None => hosts.push(item.to_string()),
        }
    }
    hosts
}

/// `prefix[ranges]suffix`, where the suffix may hold further brackets.
fn expand_one(item: &str) -> Option<Vec<String>> {
    let Some(open) = item.find('[') else {
        return Some(vec![item.to_string()]);
    };
    let close = open + item[open..].find(']')?;
    let (prefix, ranges, suffix) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
    let suffixes = expand_one(suffix)?;
    let mut names = Vec::new();
    for range in ranges.split(',') {
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        let width = lo.len();
        let (lo, hi) = (lo.parse::<u64>().ok()?, hi.parse::<u64>().ok()?);
        if hi < lo || hi - lo > 100_000 {
            return None;
        }
        for n in lo..=hi {
            for s in &suffixes {
                names.push(format!("{prefix}{n:0width$}{s}"));
            }
        }
    }
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tela_core::NodeId;

    fn request() -> JobRequest {
        JobRequest {
            name: "tela-llama".into(),
            script: "#!/bin/bash\ntrue\n".into(),
            partition: Some("gpu".into()),
            account: Some("proj1".into()),
            qos: None,
            nodes: 2,
            gpus_per_node: 4,
            cpus_per_task: 16,
            walltime: Duration::from_secs(4 * 3600 + 30),
            time_min: None,
            drain_signal_before: Duration::from_secs(960),
            working_dir: "/scratch/tela".into(),
            environment: vec![("TELA_JOIN".into(), "gw:7000".into())],
        }
    }

    #[test]
    fn submit_flags_carry_every_resource() {
        let s = Sbatch::new(SbatchConfig { sbatch_args: vec!["--qos=serve".into()], ..SbatchConfig::default() });
        let args = s.submit_args(&request()).expect("valid");
        assert_eq!(
            args,
            [
                "--qos=serve",
                "--parsable",
                "--job-name=tela-llama",
                "--partition=gpu",
                "--account=proj1",
                "--nodes=2",
                "--ntasks-per-node=1",
                "--gres=gpu:4",
                "--cpus-per-task=16",
                "--time=0-04:01:00",
                "--signal=B:USR1@960",
                "--chdir=/scratch/tela",
                "--export=ALL",
            ]
        );
        let mut cpu_only = request();
        cpu_only.gpus_per_node = 0;
        cpu_only.partition = None;
        cpu_only.drain_signal_before = Duration::ZERO;
        let args = s.submit_args(&cpu_only).expect("valid");
        assert!(!args
            .iter()
            .any(|a| a.starts_with("--gres") || a.starts_with("--partition") || a.starts_with("--signal")));
        let mut low = request();
        low.qos = Some("low".into());
        assert!(s.submit_args(&low).expect("valid").contains(&"--qos=low".to_string()));
        assert!(s.test_only_args(&low).expect("valid").contains(&"--qos=low".to_string()));
    }

    #[test]
    fn a_backfill_job_asks_for_its_least_time_never_above_its_limit() {
        let s = Sbatch::new(SbatchConfig::default());
        let mut short = request();
        short.walltime = Duration::from_secs(30 * 60);
        short.time_min = Some(Duration::from_secs(10 * 60));
        let args = s.submit_args(&short).expect("valid");
        let at = args.iter().position(|a| a == "--time=0-00:30:00").expect("time limit");
        assert_eq!(args[at + 1], "--time-min=0-00:10:00");
        short.time_min = Some(Duration::from_secs(3600));
        assert!(s.submit_args(&short).expect("valid").contains(&"--time-min=0-00:30:00".to_string()));
        assert!(!s.submit_args(&request()).expect("valid").iter().any(|a| a.starts_with("--time-min")));
    }

    #[test]
    fn test_only_asks_with_the_same_options_without_queueing() {
        let s = Sbatch::new(SbatchConfig::default());
        let submit = s.submit_args(&request()).expect("valid");
        let test = s.test_only_args(&request()).expect("valid");
        assert!(!test.contains(&"--parsable".to_string()));
        assert_eq!(test.last().map(String::as_str), Some("--test-only"));
        assert_eq!(
            &test[..test.len() - 1],
            &submit.iter().filter(|a| *a != "--parsable").cloned().collect::<Vec<_>>()[..]
        );
    }

    #[test]
    fn the_estimated_start_is_read_from_test_only() {
        let said = "sbatch: Job 17 to start at 2026-12-03T21:20:05 using 1 processors on nodes n1 in partition debug\n";
        let at = parse_test_only(said).expect("a start time");
        assert_eq!(at, humantime::parse_rfc3339("2026-12-03T21:20:05Z").expect("time"));
        // Whatever else sbatch prints before it (warnings) does not matter.
        let noisy = format!("sbatch: warning: something\n{said}");
        assert_eq!(parse_test_only(&noisy).expect("a start time"), at);
        for bad in ["", "sbatch: error: Batch job submission failed", "Job 3 to start at soon using 1 processors"] {
            assert!(matches!(parse_test_only(bad), Err(BatchError::Protocol { .. })), "{bad}");
        }
    }

    #[test]
    fn requests_slurm_would_refuse_are_refused_here_with_a_reason() {
        let s = Sbatch::new(SbatchConfig::default());
        let mut r = request();
        r.walltime = Duration::from_secs(30);
        assert!(s.submit_args(&r).unwrap_err().to_string().contains("one-minute"));
        let mut r = request();
        r.script = "echo hi".into();
        assert!(s.submit_args(&r).unwrap_err().to_string().contains("#!"));
        let mut r = request();
        r.nodes = 0;
        assert!(s.submit_args(&r).is_err());
        let mut r = request();
        r.environment.push(("A=B".into(), "x".into()));
        assert!(s.submit_args(&r).unwrap_err().to_string().contains("'A=B'"));
    }

    #[test]
    fn slurm_times_round_up_to_minutes() {
        assert_eq!(slurm_time(Duration::from_secs(60)), "0-00:01:00");
        assert_eq!(slurm_time(Duration::from_secs(61)), "0-00:02:00");
        assert_eq!(slurm_time(Duration::from_secs(26 * 3600)), "1-02:00:00");
    }

    #[test]
    fn parsable_answers_are_read_with_or_without_a_cluster() {
        assert_eq!(parse_parsable("1234\n").unwrap(), BatchJobId(1234));
        assert_eq!(parse_parsable("1234;gpu\n").unwrap(), BatchJobId(1234));
        assert_eq!(parse_parsable("sbatch: warning: x\n77\n").unwrap(), BatchJobId(77));
        assert!(matches!(parse_parsable("Submitted batch job"), Err(BatchError::Protocol { .. })));
        assert!(parse_parsable("").is_err());
    }

    #[test]
    fn squeue_lines_become_jobs() {
        let node = NodeId([0xab; 16]);
        let out = format!(
            "CLUSTER: gpu\n\
             12|RUNNING|1:02:03|gpu[01-02]|tela-node={}\n\
             13|PENDING|4:00:00||(null)\n\
             14|COMPLETING|0:10|gpu03|a|b|c\n\
             15|CANCELLED|4:57|gpu04|\n\
             16|SUSPENDED|1:00|gpu05|\n",
            node.to_hex()
        );
        let jobs = parse_squeue(&out).expect("parses");
        assert_eq!(jobs.len(), 5);
        assert_eq!(jobs[0].id, BatchJobId(12));
        assert_eq!(jobs[0].state, BatchState::Running);
        assert_eq!(jobs[0].hosts, ["gpu01", "gpu02"]);
        assert_eq!(jobs[0].time_left, Some(Duration::from_secs(3723)));
        assert_eq!(jobs[0].node(), Some(node));
        assert_eq!((jobs[1].state, jobs[1].comment.as_str(), jobs[1].time_left), (BatchState::Pending, "", None));
        assert!(jobs[1].hosts.is_empty());
        assert_eq!((jobs[2].state, jobs[2].comment.as_str()), (BatchState::Ending, "a|b|c"));
        assert_eq!((jobs[3].state, jobs[3].time_left), (BatchState::Ended, None));
        assert_eq!(jobs[4].state, BatchState::Pending);
        assert!(matches!(parse_squeue("x1|RUNNING|1:00|n|\n"), Err(BatchError::Protocol { .. })));
    }

    #[test]
    fn jobs_not_listed_are_ended_and_answers_keep_the_order_asked() {
        let listed = parse_squeue("8|RUNNING|5:00|n1|\n").expect("parses");
        let jobs = in_order(&[BatchJobId(9), BatchJobId(8)], listed);
        assert_eq!(
            jobs.iter().map(|j| (j.id.0, j.state)).collect::<Vec<_>>(),
            [(9, BatchState::Ended), (8, BatchState::Running)]
        );
    }

    #[test]
    fn host_lists_expand() {
        assert_eq!(expand_hostlist("vm"), ["vm"]);
        assert_eq!(expand_hostlist("a[1-3],b"), ["a1", "a2", "a3", "b"]);
        assert_eq!(expand_hostlist("gpu[008-010,12]"), ["gpu008", "gpu009", "gpu010", "gpu12"]);
        assert_eq!(expand_hostlist("r[1-2]n[1-2]"), ["r1n1", "r1n2", "r2n1", "r2n2"]);
        assert_eq!(expand_hostlist("bad[x-y]"), ["bad[x-y]"]);
        assert!(expand_hostlist("").is_empty());
        assert!(expand_hostlist("(null)").is_empty());
    }

    #[test]
    fn state_words_map_to_states() {
        for (raw, state) in [
            ("PENDING", BatchState::Pending),
            ("CONFIGURING", BatchState::Pending),
            ("RUNNING", BatchState::Running),
            ("COMPLETING", BatchState::Ending),
            ("TIMEOUT", BatchState::Ended),
            ("NODE_FAIL", BatchState::Ended),
            ("CANCELLED+", BatchState::Ended),
            ("SOMETHING_NEW", BatchState::Pending),
        ] {
            assert_eq!(slurm_state(raw), state, "{raw}");
        }
    }
}
