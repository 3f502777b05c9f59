//! Process signals: what stops a long-running role (anchor, relay, gateway, engine simulator,
//! demo), and what drains a node.

use std::future::Future;
use tokio::signal::unix::{signal, SignalKind};

/// Installs the handlers now and returns a future that resolves at the first Ctrl-C or
/// SIGTERM (what Slurm, Kubernetes and systemd send first). Call it before announcing
/// readiness (e.g. printing the listening address): a supervisor may signal as soon as it sees
/// that, and an uninstalled handler means the process dies at once instead of stopping
/// gracefully. Needs a tokio runtime.
pub fn terminate() -> std::io::Result<impl Future<Output = ()> + Send> {
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => tracing::info!("Ctrl-C received, shutting down"),
            _ = terminate.recv() => tracing::info!("SIGTERM received, shutting down"),
        }
    })
}

/// A signal a serving node reacts to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeSignal {
    /// SIGTERM (Slurm at the time limit, Kubernetes, systemd): drain.
    Terminate,
    /// SIGUSR1 (Slurm's `--signal=B:USR1@N` warning): drain.
    User1,
    /// Ctrl-C: drain; a second one stops at once.
    Interrupt,
}

/// The signals a node listens to, installed at creation.
pub struct NodeSignals {
    term: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl NodeSignals {
    /// Installs the handlers for SIGTERM, SIGUSR1 and SIGINT.
    pub fn install() -> std::io::Result<NodeSignals> {
        Ok(NodeSignals {
            term: signal(SignalKind::terminate())?,
            usr1: signal(SignalKind::user_defined1())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next signal.
    pub async fn next(&mut self) -> NodeSignal {
        tokio::select! {
            _ = self.term.recv() => NodeSignal::Terminate,
            _ = self.usr1.recv() => NodeSignal::User1,
            _ = self.int.recv() => NodeSignal::Interrupt,
        }
    }
}
