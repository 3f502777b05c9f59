//! The in-memory pair ([`Connection::pair`]): the multiplexed transport of the TCP fallback
//! over an in-process pipe instead of TLS over TCP, so tests of the runtime exercise the same
//! stream, datagram, keep-alive and close behaviour without sockets. No TLS and no admission:
//! the caller names both ids.

use crate::connection::{Connection, Transport};
use crate::control::{read_frame, write_frame, Frame, FrameError};
use crate::mux::{start, MuxStartError, Side, Timing};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;
use tela_core::NodeId;

/// Why one end of an in-memory pair could not be set up (a bug: the pipe cannot fail).
#[derive(Debug, thiserror::Error)]
enum PairError {
    /// The multiplexed session did not start.
    #[error(transparent)]
    Start(#[from] MuxStartError),
    /// The dialler's first ping could not be written.
    #[error(transparent)]
    Ping(std::io::Error),
    /// The acceptor could not read the first control frame.
    #[error("cannot read the first control frame: {0}")]
    FirstFrame(#[source] FrameError),
    /// The first control frame was not the dialler's ping.
    #[error("unexpected first control frame: {0:?}")]
    UnexpectedFrame(Frame),
}

/// A connected in-memory pair; see [`Connection::pair`].
pub(crate) async fn pair(a_id: NodeId, b_id: NodeId) -> (Connection, Connection) {
    let (a_io, b_io) = tokio::io::duplex(256 * 1024);
    let timing = Timing { keep_alive: Duration::from_secs(5), idle_timeout: Duration::from_secs(30) };
    let dial = async {
        let (conn, mut control, activation) = start(a_io, Side::Dialler, Transport::Memory, None).await?;
        // Make the control stream visible to the other end.
        write_frame(&mut control.write, &Frame::Ping).await.map_err(PairError::Ping)?;
        activation.activate(control, timing);
        Ok::<_, PairError>(conn)
    };
    let accept = async {
        let (conn, mut control, activation) = start(b_io, Side::Acceptor, Transport::Memory, None).await?;
        match read_frame(&mut control.read).await {
            Ok(Frame::Ping) => {}
            Ok(other) => return Err(PairError::UnexpectedFrame(other)),
            Err(e) => return Err(PairError::FirstFrame(e)),
        }
        activation.activate(control, timing);
        Ok::<_, PairError>(conn)
    };
    let (a, b) = tokio::join!(dial, accept);
    // Both ends live in this process on a pipe that cannot fail, so an error here is a bug.
    let (a, b) = (a.expect("in-memory dialler set up"), b.expect("in-memory acceptor set up"));
    let local = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    (Connection::from_mux(b_id, local, a), Connection::from_mux(a_id, local, b))
}
