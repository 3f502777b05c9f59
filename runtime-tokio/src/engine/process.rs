//! [`EngineProcess`]: an engine the node launched (`--engine-cmd`), in its own process group
//! so that stopping it reaches every process the command started (a shell, a Python
//! launcher and its workers), with its output in the node's log.
//!
//! The group also goes when the node dies without a word (`kill -9`, the OOM killer, a
//! crash): a small wrapper shell runs the command beside a *lifeline*, a `cat` reading a pipe
//! whose only writer is the node. The kernel closes the pipe with the node, however the node
//! ends; `cat` sees the end and the wrapper kills its whole group, so no engine is left holding
//! a GPU for a node that is gone. (Under Slurm the job's cgroup does this too; on a bare
//! workstation nothing else would.)

use futures::StreamExt;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::task::JoinSet;
use tokio_util::codec::{FramedRead, LinesCodec};

/// Longest engine log line passed on whole; longer ones are cut.
const MAX_LOG_LINE: usize = 8 * 1024;

/// Runs the engine command (`$1`) in the background with the lifeline beside it and waits for
/// the engine, passing on its exit status. The lifeline reads the pipe through fd 3: a
/// background list's stdin is `/dev/null` in a shell without job control. SIGTERM reaches the
/// whole group. Once both are started the wrapper catches it (a trap, set only then so that
/// neither inherits it) and keeps waiting, so the node sees the engine's own exit after its
/// graceful shutdown; before, it ends the wrapper with the rest of the group. The lifeline dies
/// of it.
const WRAPPER: &str = r#"exec 3<&0
(cat <&3 >/dev/null; kill -KILL 0) &
sh -c "$1" </dev/null 3<&- &
engine=$!
trap : TERM
while :; do
  wait "$engine"
  status=$?
  kill -0 "$engine" 2>/dev/null || exit "$status"
done"#;

/// A launched engine. Dropping it kills the whole process group.
#[derive(Debug)]
pub struct EngineProcess {
    child: Child,
    pid: Option<u32>,
    command: String,
    exited: Option<ExitStatus>,
    /// The write end of the lifeline: never written; closing it (the node's exit) ends the group.
    lifeline: Option<tokio::process::ChildStdin>,
    _logs: JoinSet<()>,
}

impl EngineProcess {
    /// Runs `command` with `sh -c` in a new process group, beside the lifeline (see the
    /// module docs); its stdout and stderr lines go to the log (target `engine`). The engine's
    /// stdin is `/dev/null`.
    pub fn spawn(command: &str) -> std::io::Result<EngineProcess> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(WRAPPER)
            .arg("tela-engine")
            .arg(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id();
        let lifeline = child.stdin.take();
        let mut logs = JoinSet::new();
        if let Some(out) = child.stdout.take() {
            logs.spawn(forward_lines(FramedRead::new(out, LinesCodec::new_with_max_length(MAX_LOG_LINE)), "stdout"));
        }
        if let Some(err) = child.stderr.take() {
            logs.spawn(forward_lines(FramedRead::new(err, LinesCodec::new_with_max_length(MAX_LOG_LINE)), "stderr"));
        }
        tracing::info!(pid = pid.unwrap_or(0), "launched the engine (pid {}): {command}", pid.unwrap_or(0));
        Ok(EngineProcess { child, pid, command: command.to_string(), exited: None, lifeline, _logs: logs })
    }

    /// The process id of the wrapper shell that runs the command (also its process group id).
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The command line.
    pub fn command(&self) -> &str {
        &self.command
    }

    /// Waits for the engine to exit by itself. Cancel-safe.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(status) = self.exited {
            return Ok(status);
        }
        let status = self.child.wait().await?;
        self.exited = Some(status);
        Ok(status)
    }

    /// Stops the engine: SIGTERM to its process group, then SIGKILL after `grace`.
    pub async fn stop(mut self, grace: Duration) {
        if self.exited.is_some() {
            return;
        }
        self.signal(Signal::SIGTERM);
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(Ok(status)) => {
                tracing::info!("the engine stopped ({status})");
                self.exited = Some(status);
            }
            Ok(Err(e)) => tracing::warn!("waiting for the engine failed: {e}"),
            Err(_) => {
                tracing::warn!("the engine did not stop within {grace:?} of SIGTERM; sending SIGKILL");
                self.signal(Signal::SIGKILL);
                if let Ok(Ok(status)) = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await {
                    self.exited = Some(status);
                }
            }
        }
        // Children that ignored the group signal or left the group are not ours to chase;
        // what is left of the group goes with SIGKILL on drop.
    }

    /// Closes the lifeline as the node's death would (for tests: the group should go).
    #[doc(hidden)]
    pub fn cut_lifeline(&mut self) {
        self.lifeline = None;
    }

    fn signal(&self, signal: Signal) {
        let Some(pid) = self.pid.and_then(|p| i32::try_from(p).ok()) else {
            return;
        };
        if let Err(e) = killpg(Pid::from_raw(pid), signal) {
            tracing::debug!("signalling the engine's process group {pid} with {signal}: {e}");
        }
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        // The group, not just the shell: kill_on_drop alone would leave the engine itself.
        self.signal(Signal::SIGKILL);
    }
}

async fn forward_lines<R: tokio::io::AsyncRead + Unpin>(mut lines: FramedRead<R, LinesCodec>, stream: &'static str) {
    while let Some(line) = lines.next().await {
        match line {
            Ok(line) => tracing::info!(target: "engine", stream, "{line}"),
            Err(e) => {
                tracing::debug!(target: "engine", stream, "engine output: {e}");
                if matches!(e, tokio_util::codec::LinesCodecError::Io(_)) {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stop_reaches_the_whole_group_and_wait_reports_exit() {
        // The shell starts a child that ignores nothing; SIGTERM to the group ends both.
        let p = EngineProcess::spawn("sleep 30 & sleep 30; wait").expect("spawn");
        assert!(p.pid().is_some());
        let started = std::time::Instant::now();
        p.stop(Duration::from_secs(5)).await;
        assert!(started.elapsed() < Duration::from_secs(5), "SIGTERM was enough");

        let mut p = EngineProcess::spawn("exit 3").expect("spawn");
        let status = tokio::time::timeout(Duration::from_secs(5), p.wait()).await.expect("exits").expect("status");
        assert_eq!(status.code(), Some(3));
    }

    #[tokio::test]
    async fn an_engine_ignoring_sigterm_is_killed_after_the_grace() {
        let p = EngineProcess::spawn("trap '' TERM; sleep 30").expect("spawn");
        tokio::time::sleep(Duration::from_millis(200)).await; // let the trap be set
        let started = std::time::Instant::now();
        p.stop(Duration::from_millis(300)).await;
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    /// Processes of group `pgid` that still run (zombies, which an init that does not reap
    /// orphans may keep around, do not count), from `/proc`.
    fn group_alive(pgid: u32) -> bool {
        let Ok(dir) = std::fs::read_dir("/proc") else { return false };
        dir.flatten().any(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            // pid (comm) state ppid pgrp ...: the command may hold spaces and parentheses.
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { return false };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            fields.len() > 2 && fields[0] != "Z" && fields[2] == pgid.to_string()
        })
    }

    #[tokio::test]
    async fn the_group_goes_when_the_lifeline_is_cut_and_not_before() {
        let mut p = EngineProcess::spawn("sleep 30").expect("spawn");
        let pid = p.pid().expect("pid");
        // The lifeline holds while the node lives: nothing ends by itself.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(group_alive(pid), "the engine's group ended with the lifeline intact");
        assert!(tokio::time::timeout(Duration::from_millis(100), p.wait()).await.is_err());
        // The node's death closes its end of the pipe: the whole group goes.
        p.cut_lifeline();
        let status = tokio::time::timeout(Duration::from_secs(5), p.wait()).await.expect("ends").expect("status");
        assert!(!status.success(), "{status}");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while group_alive(pid) {
            assert!(std::time::Instant::now() < deadline, "processes of the group outlived the lifeline");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        std::mem::forget(p); // no kill on drop: the lifeline alone did it
    }
}
