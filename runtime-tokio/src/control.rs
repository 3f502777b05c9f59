//! The local control socket: how `tela drain` and `tela status` talk to a running node or
//! anchor on the same machine.
//!
//! A Unix socket (in a directory only the user can enter, by default), one request line per
//! connection — `drain` or `status` — and one JSON line back: `{"ok":true,...}` or
//! `{"ok":false,"error":"..."}`. No network exposure, no authentication beyond file
//! permissions, which is what a local operator command needs.

use crate::runtime::{LocalInputs, Runtime, RuntimeView};
use serde_json::{json, Value};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::task::AbortOnDropHandle;

/// Longest a control request may take on either side.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The default control socket: `$XDG_RUNTIME_DIR/tela/node.sock` (or under the temporary
/// directory), with the Slurm job id in the name inside a job so that two jobs sharing a
/// machine do not collide (`tela drain` run inside the same job finds the right one).
pub fn default_control_path() -> PathBuf {
    let dir = dirs::runtime_dir().map(|d| d.join("tela")).unwrap_or_else(|| {
        let user = std::env::var("USER").unwrap_or_else(|_| "user".into());
        std::env::temp_dir().join(format!("tela-{user}"))
    });
    match std::env::var("SLURM_JOB_ID") {
        Ok(job) if !job.is_empty() && job.bytes().all(|b| b.is_ascii_alphanumeric()) => {
            dir.join(format!("node-{job}.sock"))
        }
        _ => dir.join("node.sock"),
    }
}

/// The control socket could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum ControlSocketError {
    /// Another live process answers on the socket.
    #[error(
        "another tela process is already using the control socket {0}; stop it or pass --control with another path"
    )]
    InUse(PathBuf),
    /// Binding failed.
    #[error("cannot open the control socket {path}: {source}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// Nobody listens there.
    #[error(
        "no tela node answers on {path} ({source}); is it running? pass --control with the path it was started with"
    )]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The exchange failed.
    #[error("the control request to {path} failed: {detail}")]
    Exchange {
        /// The socket path.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// The node answered with an error.
    #[error("the node refused: {0}")]
    Refused(String),
}

/// A running control socket; removes the socket file when dropped.
pub struct ControlServer {
    path: PathBuf,
    _task: AbortOnDropHandle<()>,
}

impl ControlServer {
    /// Binds `path` and serves requests for `runtime` until dropped.
    pub fn start(path: &Path, runtime: &Runtime) -> Result<ControlServer, ControlSocketError> {
        let listener = bind(path)?;
        tracing::info!("control socket at {} (tela drain / tela status --control {0})", path.display());
        let (inputs, view) = (runtime.inputs(), runtime.view());
        let task = tokio::spawn(async move {
            // Requests are served by tasks this one owns, each bounded in time, so a stuck
            // client can hold up neither the next request nor shutdown.
            let mut requests = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => {
                            let (inputs, view) = (inputs.clone(), view.clone());
                            requests.spawn(async move {
                                let _ = tokio::time::timeout(REQUEST_TIMEOUT, serve(stream, inputs, view)).await;
                            });
                        }
                        Err(e) => {
                            tracing::debug!("control socket accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    },
                    Some(_) = requests.join_next(), if !requests.is_empty() => {}
                }
            }
        });
        Ok(ControlServer { path: path.to_path_buf(), _task: AbortOnDropHandle::new(task) })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn bind(path: &Path) -> Result<UnixListener, ControlSocketError> {
    let bind_err = |source| ControlSocketError::Bind { path: path.to_path_buf(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(bind_err)?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ControlSocketError::InUse(path.to_path_buf()));
        }
        // A socket left behind by a process that died: take it over.
        let _ = std::fs::remove_file(path);
    }
    UnixListener::bind(path).map_err(bind_err)
}

async fn serve(stream: UnixStream, inputs: LocalInputs, view: RuntimeView) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read).take(1024);
    if reader.read_line(&mut line).await.is_err() {
        return;
    }
    let answer = match line.trim() {
        "drain" => match inputs.drain().await {
            Ok(()) => {
                tracing::info!("drain requested over the control socket");
                json!({"ok": true, "message": "draining: no new requests; exits once in-flight requests finish"})
            }
            Err(e) => json!({"ok": false, "error": e.to_string()}),
        },
        "status" => json!({"ok": true, "status": view.snapshot().to_json()}),
        other => json!({"ok": false, "error": format!("unknown request '{other}' (expected drain or status)")}),
    };
    let mut out = answer.to_string();
    out.push('\n');
    let _ = write.write_all(out.as_bytes()).await;
    let _ = write.shutdown().await;
}

/// Sends one request (`drain` or `status`) to the socket at `path`; returns the answer's
/// JSON on success.
pub async fn request(path: &Path, what: &str) -> Result<Value, ControlSocketError> {
    let exchange = |detail: String| ControlSocketError::Exchange { path: path.to_path_buf(), detail };
    let stream = UnixStream::connect(path)
        .await
        .map_err(|source| ControlSocketError::Connect { path: path.to_path_buf(), source })?;
    let run = async {
        let (read, mut write) = stream.into_split();
        write.write_all(format!("{what}\n").as_bytes()).await.map_err(|e| exchange(e.to_string()))?;
        let mut line = String::new();
        BufReader::new(read).take(16 * 1024 * 1024).read_line(&mut line).await.map_err(|e| exchange(e.to_string()))?;
        serde_json::from_str::<Value>(&line).map_err(|e| exchange(format!("bad answer: {e}")))
    };
    let answer = tokio::time::timeout(REQUEST_TIMEOUT, run)
        .await
        .map_err(|_| exchange(format!("no answer within {REQUEST_TIMEOUT:?}")))??;
    if answer["ok"] == true {
        Ok(answer)
    } else {
        Err(ControlSocketError::Refused(answer["error"].as_str().unwrap_or("no reason given").to_string()))
    }
}

/// Ask the node on this machine to drain and exit: it stops taking new requests, finishes
/// those in flight, leaves the federation and exits 0 (through its local control socket).
#[derive(Debug, Clone, clap::Args)]
pub struct DrainArgs {
    /// The node's control socket [default: $XDG_RUNTIME_DIR/tela/node[-$SLURM_JOB_ID].sock].
    #[arg(long, env = "TELA_CONTROL", value_name = "PATH")]
    pub control: Option<PathBuf>,
}

impl DrainArgs {
    /// Sends the drain request and prints the node's answer.
    pub async fn run(self) -> Result<(), ControlSocketError> {
        let path = self.control.unwrap_or_else(default_control_path);
        let answer = request(&path, "drain").await?;
        println!("{}", answer["message"].as_str().unwrap_or("draining"));
        Ok(())
    }
}

/// Print the registry as the node or anchor on this machine sees it (through its local
/// control socket).
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// The control socket [default: $XDG_RUNTIME_DIR/tela/node[-$SLURM_JOB_ID].sock].
    #[arg(long, env = "TELA_CONTROL", value_name = "PATH")]
    pub control: Option<PathBuf>,

    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl StatusArgs {
    /// Queries and prints.
    pub async fn run(self) -> Result<(), ControlSocketError> {
        let path = self.control.unwrap_or_else(default_control_path);
        let answer = request(&path, "status").await?;
        let status = &answer["status"];
        if self.json {
            println!("{status}");
        } else {
            print!("{}", crate::status::format_table(status));
        }
        Ok(())
    }
}
