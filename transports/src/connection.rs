//! [`Connection`]: one authenticated, admitted link to a peer, whatever carries it.
//!
//! # Why an enum and not a trait object
//!
//! The set of transports is closed (QUIC, TCP+TLS, in-memory) and lives in this crate, so a
//! `Connection` is a struct over a private enum rather than `Box<dyn Transport>`: calls are
//! plain `async fn`s with no boxed futures or `async-trait`, the stream types are concrete and
//! `Unpin`, every match is exhaustive (adding a transport makes the compiler list every place
//! that must learn about it), and the runtime can still hold "a connection" without generics.
//! The TCP+TLS transport and the in-memory pair share one implementation (a yamux session,
//! see the `mux` module) that differs only in the byte pipe underneath, which is exactly what
//! makes the in-memory pair a faithful stand-in for the real transports in tests.
//!
//! # Semantics every transport honours
//!
//! - **Datagrams** ([`Connection::send_datagram`], [`Connection::read_datagram`]): at most
//!   [`MAX_DATAGRAM`] bytes, unreliable, unordered in principle; when a queue is full the
//!   datagram is dropped, never waited for. Larger payloads are rejected, not sent.
//! - **Streams** ([`Connection::open_stream`], [`Connection::accept_stream`]): reliable,
//!   ordered, bidirectional, and either side may open them — in particular the side that
//!   *accepted* the connection opens streams toward the outbound-only node that dialled it.
//!   The peer learns of a new stream when the opener first writes to it. Finish the send
//!   side with `AsyncWriteExt::shutdown` (the reader then sees end of stream); a
//!   [`SendStream`] dropped unfinished may reach the peer as a reset rather than a clean end.
//! - **Close**: [`Connection::close`] with a reason the peer sees in [`Connection::closed`].
//!   Handles are cheap clones; the connection closes when the last handle *and* the last
//!   stream are dropped.

use crate::mux::{MuxConnection, MuxRecv, MuxSend};
use crate::quic::QuicConnection;
use bytes::Bytes;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use tela_core::{NodeId, MAX_DATAGRAM};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What carries a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// QUIC over UDP, with the datagram extension.
    Quic,
    /// TLS over TCP, multiplexed with yamux: the fallback where UDP is blocked.
    Tcp,
    /// An in-process pipe, for tests; no TLS, no admission.
    Memory,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Quic => "QUIC",
            Transport::Tcp => "TCP+TLS",
            Transport::Memory => "memory",
        })
    }
}

/// Why a connection ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// This side called [`Connection::close`] (or dropped every handle).
    Local {
        /// The reason given.
        reason: String,
    },
    /// The peer closed the connection.
    Peer {
        /// The reason it gave.
        reason: String,
    },
    /// Nothing was heard from the peer for the idle timeout.
    TimedOut,
    /// The connection broke (reset, protocol error, end of the underlying pipe).
    Lost {
        /// What was observed.
        detail: String,
    },
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseReason::Local { reason } => write!(f, "closed by this side: {reason}"),
            CloseReason::Peer { reason } => write!(f, "closed by the peer: {reason}"),
            CloseReason::TimedOut => f.write_str(
                "the peer stopped answering (idle timeout) — check the network path; \
                 a NAT or firewall may have dropped the connection",
            ),
            CloseReason::Lost { detail } => write!(f, "connection lost: {detail}"),
        }
    }
}

/// An operation failed because the connection is closed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionError {
    /// The connection is closed; nothing more can be sent or received on it.
    #[error("the connection is closed ({0})")]
    Closed(CloseReason),
}

/// A datagram was not sent. No error here changes the connection's state.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DatagramError {
    /// The payload is larger than a datagram may be.
    #[error("datagram of {len} bytes exceeds the {max}-byte limit; send it on a stream instead")]
    TooLarge {
        /// The payload's size.
        len: usize,
        /// The limit on this connection (at most [`MAX_DATAGRAM`]).
        max: usize,
    },
    /// The peer did not enable datagrams (a non-Tela QUIC peer).
    #[error("the peer does not accept datagrams")]
    Unsupported,
    /// The connection is closed.
    #[error("the connection is closed ({0})")]
    Closed(CloseReason),
}

#[derive(Clone)]
enum Inner {
    Quic(QuicConnection),
    Mux(MuxConnection),
}

/// An authenticated, admitted connection to one peer. Cheap to clone; all clones are the
/// same connection.
#[derive(Clone)]
pub struct Connection {
    peer: NodeId,
    remote: SocketAddr,
    inner: Inner,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.peer)
            .field("remote", &self.remote)
            .field("transport", &self.transport())
            .finish()
    }
}

impl Connection {
    pub(crate) fn from_quic(peer: NodeId, conn: QuicConnection) -> Connection {
        Connection { peer, remote: conn.remote_address(), inner: Inner::Quic(conn) }
    }

    pub(crate) fn from_mux(peer: NodeId, remote: SocketAddr, conn: MuxConnection) -> Connection {
        Connection { peer, remote, inner: Inner::Mux(conn) }
    }

    /// A connected in-memory pair `(a, b)`: `a` sees peer `b_id`, `b` sees peer `a_id`.
    ///
    /// Both ends behave like a TCP+TLS connection (same multiplexer, datagram framing,
    /// keep-alive and close semantics) without sockets, TLS or admission. Their
    /// [`Connection::remote_addr`] is `127.0.0.1:0`. Needs a tokio runtime.
    pub async fn pair(a_id: NodeId, b_id: NodeId) -> (Connection, Connection) {
        crate::memory::pair(a_id, b_id).await
    }

    /// The peer's id, derived from the key it proved in the TLS handshake.
    pub fn peer_id(&self) -> NodeId {
        self.peer
    }

    /// The peer's address as seen from here (for QUIC: the current path).
    pub fn remote_addr(&self) -> SocketAddr {
        match &self.inner {
            Inner::Quic(c) => c.remote_address(),
            Inner::Mux(_) => self.remote,
        }
    }

    /// Whether `other` is a handle to this very connection (not merely one to the same peer).
    pub fn same_as(&self, other: &Connection) -> bool {
        match (&self.inner, &other.inner) {
            (Inner::Quic(a), Inner::Quic(b)) => a.stable_id() == b.stable_id(),
            (Inner::Mux(a), Inner::Mux(b)) => a.same_as(b),
            _ => false,
        }
    }

    /// What carries this connection.
    pub fn transport(&self) -> Transport {
        match &self.inner {
            Inner::Quic(_) => Transport::Quic,
            Inner::Mux(m) => m.transport(),
        }
    }

    /// For TCP connections, whether `TCP_NODELAY` is set on the socket (as the socket reported
    /// it after setup); `None` for transports without a TCP socket.
    pub fn tcp_nodelay(&self) -> Option<bool> {
        match &self.inner {
            Inner::Quic(_) => None,
            Inner::Mux(m) => m.tcp_nodelay(),
        }
    }

    /// Sends an unreliable datagram of at most [`MAX_DATAGRAM`] bytes; never waits. A
    /// datagram that does not fit the send queue is dropped, as on a congested network.
    pub fn send_datagram(&self, payload: Bytes) -> Result<(), DatagramError> {
        if payload.len() > MAX_DATAGRAM {
            return Err(DatagramError::TooLarge { len: payload.len(), max: MAX_DATAGRAM });
        }
        match &self.inner {
            Inner::Quic(c) => c.send_datagram(payload),
            Inner::Mux(m) => m.send_datagram(payload),
        }
    }

    /// Waits for the next datagram from the peer.
    pub async fn read_datagram(&self) -> Result<Bytes, ConnectionError> {
        match &self.inner {
            Inner::Quic(c) => c.read_datagram().await,
            Inner::Mux(m) => m.read_datagram().await,
        }
    }

    /// Opens a bidirectional stream toward the peer. Waits while the per-connection stream
    /// limit is reached.
    pub async fn open_stream(&self) -> Result<(SendStream, RecvStream), ConnectionError> {
        match &self.inner {
            Inner::Quic(c) => {
                c.open_stream().await.map(|(s, r)| (SendStream(SendInner::Quic(s)), RecvStream(RecvInner::Quic(r))))
            }
            Inner::Mux(m) => {
                m.open_stream().await.map(|(s, r)| (SendStream(SendInner::Mux(s)), RecvStream(RecvInner::Mux(r))))
            }
        }
    }

    /// Waits for the peer to open a bidirectional stream.
    pub async fn accept_stream(&self) -> Result<(SendStream, RecvStream), ConnectionError> {
        match &self.inner {
            Inner::Quic(c) => {
                c.accept_stream().await.map(|(s, r)| (SendStream(SendInner::Quic(s)), RecvStream(RecvInner::Quic(r))))
            }
            Inner::Mux(m) => {
                m.accept_stream().await.map(|(s, r)| (SendStream(SendInner::Mux(s)), RecvStream(RecvInner::Mux(r))))
            }
        }
    }

    /// Closes the connection, telling the peer `reason`. Returns at once; open streams fail.
    /// Closing twice keeps the first reason.
    pub fn close(&self, reason: &str) {
        match &self.inner {
            Inner::Quic(c) => c.close(reason),
            Inner::Mux(m) => m.close(reason),
        }
    }

    /// Waits until the connection is closed, for whatever reason, and says why.
    pub async fn closed(&self) -> CloseReason {
        match &self.inner {
            Inner::Quic(c) => c.closed().await,
            Inner::Mux(m) => m.closed().await,
        }
    }

    /// Why the connection closed, or `None` while it is open.
    pub fn close_reason(&self) -> Option<CloseReason> {
        match &self.inner {
            Inner::Quic(c) => c.close_reason(),
            Inner::Mux(m) => m.close_reason(),
        }
    }
}

enum SendInner {
    Quic(quinn::SendStream),
    Mux(MuxSend),
}

enum RecvInner {
    Quic(quinn::RecvStream),
    Mux(MuxRecv),
}

/// The sending half of a stream: a tokio [`AsyncWrite`]. `shutdown()` finishes the stream.
pub struct SendStream(SendInner);

/// The receiving half of a stream: a tokio [`AsyncRead`]; a read of 0 bytes is the peer's
/// finish.
pub struct RecvStream(RecvInner);

impl fmt::Debug for SendStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SendStream")
    }
}

impl fmt::Debug for RecvStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RecvStream")
    }
}

impl AsyncWrite for SendStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().0 {
            SendInner::Quic(s) => AsyncWrite::poll_write(Pin::new(s), cx, buf),
            SendInner::Mux(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            SendInner::Quic(s) => AsyncWrite::poll_flush(Pin::new(s), cx),
            SendInner::Mux(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            SendInner::Quic(s) => AsyncWrite::poll_shutdown(Pin::new(s), cx),
            SendInner::Mux(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

impl AsyncRead for RecvStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            RecvInner::Quic(r) => AsyncRead::poll_read(Pin::new(r), cx, buf),
            RecvInner::Mux(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_send_and_sync() {
        fn check<T: Send + Sync + 'static>() {}
        check::<Connection>();
        check::<crate::Endpoint>();
        fn check_send<T: Send + 'static>() {}
        check_send::<SendStream>();
        check_send::<RecvStream>();
    }
}
