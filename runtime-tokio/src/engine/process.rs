//! [`EngineProcess`]: an engine the node launched (`--engine-cmd`), in its own process group
//! so that stopping it reaches every process the command started (a shell, a Python
//! launcher and its workers), with its output in the node's log.

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

/// A launched engine. Dropping it kills the whole process group.
#[derive(Debug)]
pub struct EngineProcess {
    child: Child,
    pid: Option<u32>,
    command: String,
    exited: Option<ExitStatus>,
    _logs: JoinSet<()>,
}

impl EngineProcess {
    /// Runs `command` with `sh -c` in a new process group; its stdout and stderr lines go to
    /// the log (target `engine`).
    pub fn spawn(command: &str) -> std::io::Result<EngineProcess> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(command)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id();
        let mut logs = JoinSet::new();
        if let Some(out) = child.stdout.take() {
            logs.spawn(forward_lines(FramedRead::new(out, LinesCodec::new_with_max_length(MAX_LOG_LINE)), "stdout"));
        }
        if let Some(err) = child.stderr.take() {
            logs.spawn(forward_lines(FramedRead::new(err, LinesCodec::new_with_max_length(MAX_LOG_LINE)), "stderr"));
        }
        tracing::info!(pid = pid.unwrap_or(0), "launched the engine (pid {}): {command}", pid.unwrap_or(0));
        Ok(EngineProcess { child, pid, command: command.to_string(), exited: None, _logs: logs })
    }

    /// The process id of the shell that runs the command (also its process group id).
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
}
