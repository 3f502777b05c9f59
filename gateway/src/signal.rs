//! The signal that ends a long-running subcommand: Ctrl-C everywhere, SIGTERM on Unix (what
//! Slurm, Kubernetes and systemd send first).

use std::future::Future;

/// Installs the handlers now and returns a future that resolves at the first Ctrl-C or
/// SIGTERM. Call it before announcing readiness (e.g. printing the listening address): a
/// supervisor may signal as soon as it sees that, and an uninstalled handler means the
/// process dies at once instead of stopping gracefully. Needs a tokio runtime.
#[cfg(unix)]
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => tracing::info!("Ctrl-C received, shutting down"),
            _ = terminate.recv() => tracing::info!("SIGTERM received, shutting down"),
        }
    })
}

/// Installs the handlers and returns a future that resolves at the first Ctrl-C.
#[cfg(not(unix))]
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send> {
    Ok(async {
        match tokio::signal::ctrl_c().await {
            Ok(()) => tracing::info!("Ctrl-C received, shutting down"),
            Err(e) => {
                tracing::warn!("cannot listen for Ctrl-C: {e}");
                std::future::pending::<()>().await
            }
        }
    })
}
