//! A node's byte stream to a gateway through the user's own `ssh` client, for compute nodes
//! whose only way out is their cluster's login host (`tela node --via-ssh user@login`).
//!
//! Each dial spawns `ssh -W gateway:port user@login` as a child and uses its stdin and stdout
//! as the byte stream under the node's TCP+TLS tunnel: the login host's `sshd` opens the TCP
//! connection to the gateway and copies bytes, so the TLS session and the join-secret
//! admission run end to end between node and gateway, and the gateway sees an ordinary
//! outbound-only member. Nothing listens anywhere; nothing needs root.
//!
//! The user's keys, agent, `~/.ssh/config` (host aliases, `ProxyJump`, `ControlMaster`)
//! apply unchanged, since it is their `ssh`. The node adds only options that make a
//! background tunnel behave: `BatchMode=yes` (never prompt: a batch job has no terminal),
//! `ExitOnForwardFailure=yes` (a refused forward ends the child instead of leaving it idle),
//! `ServerAliveInterval=15`/`ServerAliveCountMax=3` (a dead login host ends the child within a
//! minute even when no TCP reset arrives) and `ConnectTimeout=10`. They come after the user's
//! own command, and `ssh` keeps the first value of an option, so `--ssh-command 'ssh -o
//! ServerAliveInterval=5'` wins over them.
//!
//! `--ssh-command` (`TELA_SSH_COMMAND`) replaces the program: a shell command line, run as `sh
//! -c 'exec <command> "$@"'` like git's `GIT_SSH_COMMAND`, so it may carry options (`ssh -p
//! 2222 -i ~/.ssh/cluster`) or name another client. The child's stderr goes to the node's log
//! (debug level) and its last lines into the error when a dial fails. When the stream is
//! dropped (the connection ended, the node left) the child is killed and reaped: no zombie.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, ReadBuf};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// Options the node adds after the user's own (see the module docs).
pub const DEFAULT_OPTIONS: &[&str] = &[
    "-o",
    "BatchMode=yes",
    "-o",
    "ExitOnForwardFailure=yes",
    "-o",
    "ServerAliveInterval=15",
    "-o",
    "ServerAliveCountMax=3",
    "-o",
    "ConnectTimeout=10",
];

/// Lines of the child's stderr kept for error messages.
const STDERR_LINES: usize = 4;

/// How to reach gateways through a login host: the `ssh` destination and the command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshVia {
    /// `[user@]host` (or a `Host` alias from the user's ssh config).
    pub destination: String,
    /// A shell command line replacing `ssh` (`--ssh-command`); `None`: `ssh` from `PATH`.
    pub command: Option<String>,
}

impl SshVia {
    /// The process that forwards its stdio to `target` (`host:port`, resolved by the login
    /// host, so a name only the cluster's network knows works).
    pub fn command(&self, target: &str) -> Command {
        let mut args: Vec<&str> = DEFAULT_OPTIONS.to_vec();
        args.extend(["-W", target, "--", &self.destination]);
        let mut cmd = match &self.command {
            Some(line) => {
                let mut sh = Command::new("sh");
                sh.arg("-c").arg(format!("exec {line} \"$@\"")).arg("tela-ssh");
                sh
            }
            None => Command::new("ssh"),
        };
        cmd.args(args);
        cmd
    }

    /// Spawns the child that carries a stream to `target`.
    pub fn spawn(&self, target: &str) -> io::Result<SshStream> {
        let mut cmd = self.command(target);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(io::Error::other("the ssh child has no stdin or stdout"));
        };
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(err) = child.stderr.take() {
            let keep = stderr.clone();
            let destination = self.destination.clone();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(err).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!("ssh to {destination}: {line}");
                    let mut keep = keep.lock().unwrap_or_else(PoisonError::into_inner);
                    if keep.len() == STDERR_LINES {
                        keep.pop_front();
                    }
                    keep.push_back(line);
                }
            });
        }
        Ok(SshStream { child: Some(child), stdin, stdout, stderr })
    }
}

/// The stdio of an `ssh -W` child as one byte stream; kills and reaps the child when dropped.
#[derive(Debug)]
pub struct SshStream {
    child: Option<Child>,
    stdin: ChildStdin,
    stdout: ChildStdout,
    stderr: Arc<Mutex<VecDeque<String>>>,
}

impl SshStream {
    /// What the child has said on stderr lately (last few lines), for error messages.
    pub fn stderr_tail(&self) -> StderrTail {
        StderrTail(self.stderr.clone())
    }

    /// The child's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }
}

/// A handle on the last lines an `ssh` child wrote to stderr; outlives the stream.
#[derive(Clone, Debug)]
pub struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    /// The lines joined with " / ", or `None` when it said nothing.
    pub fn get(&self) -> Option<String> {
        let lines = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        (!lines.is_empty()).then(|| lines.iter().map(String::as_str).collect::<Vec<_>>().join(" / "))
    }
}

impl Drop for SshStream {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let _ = child.start_kill();
        // Reap it, so that no zombie is left behind for the node's lifetime; without a
        // runtime, tokio's orphan queue reaps it on a later spawn.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = child.wait().await;
            });
        }
    }
}

impl AsyncRead for SshStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stdout).poll_read(cx, buf)
    }
}

impl AsyncWrite for SshStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stdin).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stdin).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stdin).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn args(cmd: &Command) -> Vec<String> {
        cmd.as_std().get_args().map(|a| a.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn the_users_options_come_before_the_nodes() {
        let via = SshVia { destination: "me@login".into(), command: Some("ssh -o ServerAliveInterval=5".into()) };
        let cmd = via.command("gw.internal:7000");
        assert_eq!(cmd.as_std().get_program(), "sh");
        let a = args(&cmd);
        assert_eq!(a[0], "-c");
        assert_eq!(a[1], "exec ssh -o ServerAliveInterval=5 \"$@\"");
        assert!(a.ends_with(&["-W".into(), "gw.internal:7000".into(), "--".into(), "me@login".into()]), "{a:?}");
        assert!(a.contains(&"BatchMode=yes".to_string()));
        let plain = SshVia { destination: "login".into(), command: None }.command("10.0.0.1:7000");
        assert_eq!(plain.as_std().get_program(), "ssh");
    }

    /// A stand-in for `ssh` (`cat`, through the `--ssh-command` path) carries bytes both
    /// ways, and dropping the stream kills and reaps the child.
    #[tokio::test]
    async fn the_child_carries_bytes_and_is_reaped_on_drop() {
        // `exec cat "$@"` would make cat read the arguments as files: ignore them instead.
        let via = SshVia { destination: "unused".into(), command: Some("sh -c 'exec cat' tela-test".into()) };
        let mut stream = via.spawn("gw:7000").expect("spawn");
        let pid = stream.pid().expect("running");
        stream.write_all(b"hello").await.expect("write");
        let mut got = [0u8; 5];
        stream.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"hello");
        drop(stream);
        let proc = format!("/proc/{pid}");
        for _ in 0..100 {
            if !std::path::Path::new(&proc).exists() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("the child {pid} still exists (a zombie or alive) after the stream was dropped");
    }

    #[tokio::test]
    async fn what_the_child_says_on_stderr_is_kept() {
        let via = SshVia { destination: "login".into(), command: Some("sh -c 'echo no route to login >&2' x".into()) };
        let mut stream = via.spawn("gw:7000").expect("spawn");
        let tail = stream.stderr_tail();
        let mut rest = Vec::new();
        stream.read_to_end(&mut rest).await.expect("eof");
        for _ in 0..100 {
            if tail.get().is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(tail.get().as_deref(), Some("no route to login"));
    }
}
