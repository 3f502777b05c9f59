//! The accept side of an [`Endpoint`](crate::Endpoint): one task per listening endpoint
//! accepts on the QUIC and TCP sockets and runs every incoming handshake (TLS, then admission)
//! in a child task it owns, at most [`MAX_PENDING_HANDSHAKES`] at once, each bounded by the
//! handshake timeout — so a slow or hostile peer never holds up the others. Outcomes reach
//! [`Endpoint::accept`](crate::Endpoint::accept)(crate::Endpoint::accept) through a bounded queue: admissions wait for
//! room (backpressure), refusals are dropped when it is full (a flood of bad peers must not
//! hold up good ones). Every refusal is logged; those of identified peers as warnings.

use crate::admission::RefusalReason;
use crate::connection::{Connection, Transport};
use crate::endpoint::Settings;
use crate::{quic, tcp};
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tela_core::NodeId;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// Handshakes (TLS plus admission) in progress at once on one endpoint; more are turned away.
pub const MAX_PENDING_HANDSHAKES: usize = 256;

/// An incoming connection that was not admitted; also logged at the endpoint.
#[derive(Clone, Debug)]
pub struct Refusal {
    /// The peer's id, when its TLS handshake got that far.
    pub peer: Option<NodeId>,
    /// Where it came from.
    pub remote: SocketAddr,
    /// Over what.
    pub transport: Transport,
    /// Why it was refused.
    pub reason: RefusalReason,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.peer {
            Some(peer) => write!(f, "refused node {peer} at {}", self.remote)?,
            None => write!(f, "refused an unidentified peer at {}", self.remote)?,
        }
        write!(f, " over {}: {}", self.transport, self.reason)
    }
}

/// What [`Endpoint::accept`](crate::Endpoint::accept) yields.
#[derive(Debug)]
pub enum Accepted {
    /// A peer passed TLS and admission.
    Admitted(Connection),
    /// A peer was turned away (already logged).
    Refused(Refusal),
}

/// Accepts on both sockets until the endpoint stops; owns every handshake task.
pub(crate) async fn accept_loop(
    quic: Option<quinn::Endpoint>,
    tcp: Option<tokio::net::TcpListener>,
    settings: Arc<Settings>,
    out: mpsc::Sender<Accepted>,
) {
    let mut handshakes = JoinSet::new();
    loop {
        tokio::select! {
            incoming = next_quic(quic.as_ref()) => {
                let Some(incoming) = incoming else { break };
                if handshakes.len() >= MAX_PENDING_HANDSHAKES {
                    tracing::warn!(remote = %incoming.remote_address(), "too many handshakes in progress; turning a QUIC connection away");
                    incoming.refuse();
                    continue;
                }
                let (settings, out) = (settings.clone(), out.clone());
                handshakes.spawn(async move {
                    let remote = incoming.remote_address();
                    let result = tokio::time::timeout(settings.handshake_timeout, quic::accept(incoming, &settings)).await;
                    report(result, remote, Transport::Quic, &out).await;
                });
            }
            accepted = next_tcp(tcp.as_ref()) => match accepted {
                Ok((stream, remote)) => {
                    if handshakes.len() >= MAX_PENDING_HANDSHAKES {
                        tracing::warn!(%remote, "too many handshakes in progress; turning a TCP connection away");
                        continue;
                    }
                    let (settings, out) = (settings.clone(), out.clone());
                    handshakes.spawn(async move {
                        let result = tokio::time::timeout(settings.handshake_timeout, tcp::accept(stream, remote, &settings)).await;
                        report(result, remote, Transport::Tcp, &out).await;
                    });
                }
                Err(e) => {
                    // Typically out of file descriptors: back off instead of spinning.
                    tracing::warn!("accepting a TCP connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
        }
    }
}

async fn next_quic(endpoint: Option<&quinn::Endpoint>) -> Option<quinn::Incoming> {
    match endpoint {
        Some(e) => e.accept().await,
        None => std::future::pending().await,
    }
}

async fn next_tcp(listener: Option<&tokio::net::TcpListener>) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Logs the outcome of one incoming handshake and hands it to [`Endpoint::accept`](crate::Endpoint::accept).
async fn report(
    result: Result<Result<Connection, Refusal>, tokio::time::error::Elapsed>,
    remote: SocketAddr,
    transport: Transport,
    out: &mpsc::Sender<Accepted>,
) {
    let refusal = match result {
        Ok(Ok(conn)) => {
            tracing::info!(peer = %conn.peer_id(), %remote, %transport, "admitted node {} at {remote}", conn.peer_id());
            // Waits when the application is behind: backpressure on admissions.
            let _ = out.send(Accepted::Admitted(conn)).await;
            return;
        }
        Ok(Err(refusal)) => refusal,
        Err(_) => Refusal { peer: None, remote, transport, reason: RefusalReason::TimedOut },
    };
    match refusal.peer {
        Some(peer) => tracing::warn!(
            %peer,
            remote = %refusal.remote,
            transport = %refusal.transport,
            reason = %refusal.reason,
            "{refusal}"
        ),
        // TLS failures from unidentified peers are mostly scanners: not worth a warning.
        None => tracing::info!(remote = %refusal.remote, reason = %refusal.reason, "{refusal}"),
    }
    // Refusals never wait: a flood of bad peers must not hold up admissions.
    let _ = out.try_send(Accepted::Refused(refusal));
}
