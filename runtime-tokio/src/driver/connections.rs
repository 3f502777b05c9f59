//! What reaches the driver ([`ToDriver`]), and the tasks that bring most of it: one per live
//! connection (its datagrams and the streams its peer opens), the accept loop of a listening
//! endpoint, and one per `--join` address that keeps a connection to it. The driver owns them
//! all in its `JoinSet`; see the parent module's docs.

use crate::backoff::Backoff;
use crate::load_report::is_load_report;
use crate::path::{DialError, DialPath};
use crate::runtime::{IncomingStream, RuntimeView, StreamHandler};
use bytes::Bytes;
use std::sync::Arc;
use tela_core::{Input, NodeId};
use tela_transports::{Accepted, CloseReason, ConnectError, Connection, ConnectionError, Endpoint, TransportMode};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// Refusals in a row, each for a reason retrying cannot fix (wrong join secret, another
/// release), after which a join address is given up. More than one,
/// so that a gateway restarting with its new settings half-applied does not end a node.
pub(super) const PERMANENT_REFUSALS_BEFORE_GIVING_UP: u32 = 3;

/// What the driver's queue carries.
pub(crate) enum ToDriver {
    /// A connection was made (dialled or accepted) and admitted.
    Connected(Connection),
    /// A datagram arrived on a connection.
    Datagram { from: NodeId, payload: Bytes },
    /// A connection ended.
    Closed { peer: NodeId, conn: u64, reason: Option<CloseReason> },
    /// A background dial of a public peer failed.
    DialFailed { peer: NodeId, error: String },
    /// A `--join` address refused this node for good, and is no longer dialled.
    JoinRefused { addr: String, error: String },
    /// Local news for the core.
    Local(Input),
    /// Stop now.
    Shutdown,
}

/// Reads one connection's datagrams into the driver (load reports into the runtime's table
/// instead) and serves the streams the peer opens.
pub(super) async fn serve_connection(
    conn: Connection,
    id: u64,
    tx: mpsc::Sender<ToDriver>,
    streams: StreamHandler,
    view: RuntimeView,
) {
    let peer = conn.peer_id();
    let mut handlers = JoinSet::new();
    let reason = loop {
        tokio::select! {
            datagram = conn.read_datagram() => match datagram {
                Ok(payload) if is_load_report(&payload) => {
                    // The runtime's own, not the core's: kept for routing, never gossiped.
                    if let Err(e) = view.shared.load_reports.receive(peer, &payload, std::time::Instant::now()) {
                        tracing::debug!(%peer, "dropped a load report from {peer}: {e}");
                    }
                }
                Ok(payload) if crate::tagged::is_tagged(&payload) => view.shared.tagged.deliver(peer, &payload),
                Ok(payload) => {
                    // Waits when the driver is behind: backpressure reaches the transport,
                    // which drops datagrams rather than queue them without bound.
                    if tx.send(ToDriver::Datagram { from: peer, payload }).await.is_err() {
                        return;
                    }
                }
                Err(ConnectionError::Closed(r)) => break Some(r),
            },
            stream = conn.accept_stream() => match stream {
                Ok((send, recv)) => {
                    handlers.spawn((streams)(IncomingStream { peer, send, recv, view: view.clone() }));
                }
                Err(ConnectionError::Closed(r)) => break Some(r),
            },
            Some(_) = handlers.join_next(), if !handlers.is_empty() => {}
        }
    };
    let _ = tx.send(ToDriver::Closed { peer, conn: id, reason }).await;
}

/// Accepts connections on a listening endpoint; refusals are logged with the reason.
pub(super) async fn accept_loop(endpoint: Arc<Endpoint>, tx: mpsc::Sender<ToDriver>) {
    while let Some(accepted) = endpoint.accept().await {
        match accepted {
            Accepted::Admitted(conn) => {
                if tx.send(ToDriver::Connected(conn)).await.is_err() {
                    return;
                }
            }
            Accepted::Refused(refusal) => {
                tracing::warn!(
                    remote = %refusal.remote,
                    reason = %refusal.reason,
                    "{refusal} — the peer was told to {}",
                    refusal.reason.hint()
                );
            }
        }
    }
}

/// Keeps a connection to one join address for as long as the driver runs: dial, hand the
/// connection to the driver, wait for it to close, back off, redial.
pub(super) async fn keep_joined(
    addr: String,
    endpoint: Arc<Endpoint>,
    path: DialPath,
    mode: TransportMode,
    mut backoff: Backoff,
    tx: mpsc::Sender<ToDriver>,
) {
    let mut failures = 0u32;
    let mut permanent = 0u32;
    loop {
        match path.dial(&endpoint, &addr, mode).await {
            Ok(conn) => {
                failures = 0;
                permanent = 0;
                backoff.reset();
                if tx.send(ToDriver::Connected(conn.clone())).await.is_err() {
                    return;
                }
                let reason = conn.closed().await;
                tracing::warn!("connection to {addr} ended ({reason}); redialling {path}");
            }
            Err(e) => {
                failures += 1;
                let refused_for_good = matches!(&e, DialError::Connect(ce) if ce.is_permanent());
                // Refusals in a row only: any other failure starts the count again.
                permanent = if refused_for_good { permanent + 1 } else { 0 };
                match &e {
                    DialError::Connect(ce) if refused_for_good => {
                        tracing::warn!(
                            "cannot join via {addr} (refusal {permanent} of {PERMANENT_REFUSALS_BEFORE_GIVING_UP}): {ce}"
                        );
                        if permanent >= PERMANENT_REFUSALS_BEFORE_GIVING_UP {
                            let _ = tx.send(ToDriver::JoinRefused { addr, error: ce.to_string() }).await;
                            return;
                        }
                    }
                    DialError::Connect(ce @ ConnectError::Refused { .. }) => {
                        tracing::error!("cannot join via {addr}: {ce}");
                    }
                    _ if failures == 1 || failures.is_power_of_two() => {
                        tracing::warn!("cannot join via {addr} (attempt {failures}): {e}");
                    }
                    _ => tracing::debug!("cannot join via {addr} (attempt {failures}): {e}"),
                }
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}
