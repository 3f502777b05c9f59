//! A multiplexed connection over one ordered byte pipe: the TCP+TLS fallback and the
//! in-memory pair.
//!
//! # Why yamux
//!
//! The pipe must carry many concurrent bidirectional streams that *either* side can open:
//! the gateway (which accepted the connection) opens one stream per client request toward
//! the node (which dialled it, and has no inbound port). yamux is symmetric by design —
//! both ends open streams, with odd and even ids — and has per-stream flow control, so it
//! gives exactly QUIC's stream model. HTTP/2 (`h2`) only lets the client open streams; it
//! would force reversed roles (the acceptor acting as h2 client) and then a second
//! mechanism for streams in the other direction, plus HTTP framing around every stream.
//!
//! # What is added on top
//!
//! QUIC's datagrams, keep-alive and close-with-reason have no yamux equivalent, so the first
//! stream (opened by the dialler, used for admission) stays open as the *control stream*
//! ([`crate::control`]) and carries length-prefixed datagram, ping and close frames. Ping
//! every keep-alive interval; silence for the idle timeout closes the connection as
//! [`CloseReason::TimedOut`]. Datagrams are dropped, never waited for, when the bounded
//! queues in either direction are full, so gossip cannot block on a slow link.
//!
//! # Tasks
//!
//! Each connection runs one driver task that owns the yamux session and, once admission is
//! done, two child tasks (control reader and writer) in a `JoinSet`. The driver ends when
//! the connection closes for any reason — [`MuxConnection::close`], the peer's close, an I/O
//! error, the idle timeout, or the last handle being dropped (which closes it) — and it
//! aborts its children on the way out; every wait on the way out is bounded.

use crate::connection::{CloseReason, ConnectionError, DatagramError, Transport};
use crate::control::{read_frame, write_frame, Frame, FrameError};
use bytes::Bytes;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::compat::{Compat, FuturesAsyncReadCompatExt, TokioAsyncReadCompatExt};

/// Most streams this side holds open at once (opened plus accepted). Kept well under yamux's
/// own limit (512), which would otherwise tear the whole session down when exceeded.
const MAX_STREAMS: usize = 256;
/// Datagrams queued in each direction before new ones are dropped.
const DATAGRAM_QUEUE: usize = 256;
/// The longest any step of closing may take.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

type Stream = Compat<yamux::Stream>;
type StateTx = Arc<watch::Sender<Option<CloseReason>>>;

/// Which end of the pipe this is; the dialler opens the control stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Dialler,
    Acceptor,
}

/// Timing of the control stream.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    pub keep_alive: Duration,
    pub idle_timeout: Duration,
}

/// The handle side of a multiplexed connection. Clones share one session.
#[derive(Clone)]
pub(crate) struct MuxConnection {
    shared: Arc<Shared>,
}

impl MuxConnection {
    /// Whether `other` is a handle to this very connection.
    pub(crate) fn same_as(&self, other: &MuxConnection) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

struct Shared {
    transport: Transport,
    nodelay: Option<bool>,
    state: StateTx,
    opens: mpsc::Sender<oneshot::Sender<yamux::Stream>>,
    datagrams_out: mpsc::Sender<Bytes>,
    datagrams_in: tokio::sync::Mutex<mpsc::Receiver<Bytes>>,
    inbound: tokio::sync::Mutex<mpsc::Receiver<(yamux::Stream, OwnedSemaphorePermit)>>,
    permits: Arc<Semaphore>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The last handle and the last stream are gone: close, which ends the driver.
        set_if_open(&self.state, CloseReason::Local { reason: "connection dropped".into() });
    }
}

fn set_if_open(state: &watch::Sender<Option<CloseReason>>, reason: CloseReason) {
    state.send_if_modified(|s| {
        if s.is_none() {
            *s = Some(reason);
            true
        } else {
            false
        }
    });
}

/// The control stream's halves, handed to [`Activation::activate`] once admission is done.
pub(crate) struct Control {
    pub read: ReadHalf<Stream>,
    pub write: WriteHalf<Stream>,
}

/// Starts the control tasks after admission.
pub(crate) struct Activation {
    tx: oneshot::Sender<(Control, Timing)>,
}

impl Activation {
    /// Hands the control stream to the driver, which starts datagrams, pings and close
    /// handling on it.
    pub(crate) fn activate(self, control: Control, timing: Timing) {
        let _ = self.tx.send((control, timing));
    }
}

/// Why a multiplexed session could not be started. The session is gone; nothing else changed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MuxStartError {
    /// The session ended before the control stream opened.
    #[error(
        "the session ended before the control stream opened{}",
        .reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default()
    )]
    SessionEnded {
        /// Why it ended, where known.
        reason: Option<CloseReason>,
    },
}

/// Starts a yamux session over `io` and opens (dialler) or accepts (acceptor) the control
/// stream. The dialler's peer only sees the control stream once something is written to it.
pub(crate) async fn start<T>(
    io: T,
    side: Side,
    transport: Transport,
    nodelay: Option<bool>,
) -> Result<(MuxConnection, Control, Activation), MuxStartError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mode = match side {
        Side::Dialler => yamux::Mode::Client,
        Side::Acceptor => yamux::Mode::Server,
    };
    let session = yamux::Connection::new(io.compat(), yamux::Config::default(), mode);
    let (state, _) = watch::channel(None);
    let state = Arc::new(state);
    let (opens_tx, opens_rx) = mpsc::channel(MAX_STREAMS);
    let (dgram_out_tx, dgram_out_rx) = mpsc::channel(DATAGRAM_QUEUE);
    let (dgram_in_tx, dgram_in_rx) = mpsc::channel(DATAGRAM_QUEUE);
    let (inbound_tx, inbound_rx) = mpsc::channel(MAX_STREAMS);
    let (activate_tx, activate_rx) = oneshot::channel();
    let (control_tx, control_rx) = oneshot::channel();
    let permits = Arc::new(Semaphore::new(MAX_STREAMS));
    let driver = Driver {
        io: Io {
            session,
            opens: opens_rx,
            pending_opens: VecDeque::new(),
            inbound: inbound_tx,
            control: (side == Side::Acceptor).then_some(control_tx),
            permits: permits.clone(),
        },
        state: state.clone(),
        activate: activate_rx,
        datagrams_out: dgram_out_rx,
        datagrams_in: dgram_in_tx,
    };
    // The driver's owner is `Shared`: dropping the last handle sets the close state, which
    // ends the driver (see `Driver::run`).
    tokio::spawn(driver.run());
    let conn = MuxConnection {
        shared: Arc::new(Shared {
            transport,
            nodelay,
            state,
            opens: opens_tx,
            datagrams_out: dgram_out_tx,
            datagrams_in: tokio::sync::Mutex::new(dgram_in_rx),
            inbound: tokio::sync::Mutex::new(inbound_rx),
            permits,
        }),
    };
    let control = match side {
        Side::Dialler => {
            let (tx, rx) = oneshot::channel();
            conn.shared.opens.send(tx).await.map_err(|_| MuxStartError::SessionEnded { reason: None })?;
            rx.await
        }
        Side::Acceptor => control_rx.await,
    }
    .map_err(|_| MuxStartError::SessionEnded { reason: conn.close_reason() })?;
    let (read, write) = tokio::io::split(control.compat());
    Ok((conn, Control { read, write }, Activation { tx: activate_tx }))
}

impl MuxConnection {
    pub(crate) fn transport(&self) -> Transport {
        self.shared.transport
    }

    pub(crate) fn tcp_nodelay(&self) -> Option<bool> {
        self.shared.nodelay
    }

    fn closed_error(&self) -> ConnectionError {
        ConnectionError::Closed(self.close_reason().unwrap_or(CloseReason::Lost { detail: "the session ended".into() }))
    }

    pub(crate) fn send_datagram(&self, payload: Bytes) -> Result<(), DatagramError> {
        if let Some(reason) = self.close_reason() {
            return Err(DatagramError::Closed(reason));
        }
        match self.shared.datagrams_out.try_send(payload) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::trace!("datagram queue full; dropping a datagram");
                Ok(())
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                let ConnectionError::Closed(reason) = self.closed_error();
                Err(DatagramError::Closed(reason))
            }
        }
    }

    pub(crate) async fn read_datagram(&self) -> Result<Bytes, ConnectionError> {
        let mut rx = self.shared.datagrams_in.lock().await;
        rx.recv().await.ok_or_else(|| self.closed_error())
    }

    pub(crate) async fn open_stream(&self) -> Result<(MuxSend, MuxRecv), ConnectionError> {
        let permit = tokio::select! {
            p = self.shared.permits.clone().acquire_owned() => p.map_err(|_| self.closed_error())?,
            _ = self.closed() => return Err(self.closed_error()),
        };
        if self.close_reason().is_some() {
            return Err(self.closed_error());
        }
        let (tx, rx) = oneshot::channel();
        self.shared.opens.send(tx).await.map_err(|_| self.closed_error())?;
        let stream = rx.await.map_err(|_| self.closed_error())?;
        Ok(self.wrap(stream, permit))
    }

    pub(crate) async fn accept_stream(&self) -> Result<(MuxSend, MuxRecv), ConnectionError> {
        let mut rx = self.shared.inbound.lock().await;
        match rx.recv().await {
            Some((stream, permit)) => Ok(self.wrap(stream, permit)),
            None => Err(self.closed_error()),
        }
    }

    fn wrap(&self, stream: yamux::Stream, permit: OwnedSemaphorePermit) -> (MuxSend, MuxRecv) {
        let guard = Arc::new(StreamGuard { _permit: permit, _conn: self.shared.clone() });
        let (read, write) = tokio::io::split(stream.compat());
        (MuxSend { io: write, _guard: guard.clone() }, MuxRecv { io: read, _guard: guard })
    }

    pub(crate) fn close(&self, reason: &str) {
        set_if_open(&self.shared.state, CloseReason::Local { reason: reason.to_string() });
    }

    pub(crate) async fn closed(&self) -> CloseReason {
        let mut rx = self.shared.state.subscribe();
        // `Shared` holds the sender, so this cannot fail while `self` exists.
        let reason = match rx.wait_for(Option::is_some).await {
            Ok(r) => r.clone(),
            Err(_) => None,
        };
        reason.unwrap_or(CloseReason::Lost { detail: "the session ended".into() })
    }

    pub(crate) fn close_reason(&self) -> Option<CloseReason> {
        self.shared.state.borrow().clone()
    }
}

/// Keeps a stream's permit and its connection alive as long as either half lives.
struct StreamGuard {
    _permit: OwnedSemaphorePermit,
    _conn: Arc<Shared>,
}

/// The sending half of a multiplexed stream.
pub(crate) struct MuxSend {
    io: WriteHalf<Stream>,
    _guard: Arc<StreamGuard>,
}

/// The receiving half of a multiplexed stream.
pub(crate) struct MuxRecv {
    io: ReadHalf<Stream>,
    _guard: Arc<StreamGuard>,
}

impl AsyncWrite for MuxSend {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl AsyncRead for MuxRecv {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

/// The yamux session and the queues the driver moves streams through.
struct Io<T> {
    session: yamux::Connection<Compat<T>>,
    opens: mpsc::Receiver<oneshot::Sender<yamux::Stream>>,
    pending_opens: VecDeque<oneshot::Sender<yamux::Stream>>,
    inbound: mpsc::Sender<(yamux::Stream, OwnedSemaphorePermit)>,
    /// Acceptor only: where the first inbound stream (the control stream) goes.
    control: Option<oneshot::Sender<yamux::Stream>>,
    permits: Arc<Semaphore>,
}

impl<T: AsyncRead + AsyncWrite + Unpin> Io<T> {
    /// Drives the session: serves open requests, routes inbound streams, moves bytes.
    /// Ready only when the session has ended (`Ok` for a clean end).
    fn poll_session(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), yamux::ConnectionError>> {
        while let Poll::Ready(Some(tx)) = self.opens.poll_recv(cx) {
            self.pending_opens.push_back(tx);
        }
        while let Some(front) = self.pending_opens.front() {
            if front.is_closed() {
                self.pending_opens.pop_front();
                continue;
            }
            match self.session.poll_new_outbound(cx) {
                Poll::Ready(Ok(stream)) => {
                    if let Some(tx) = self.pending_opens.pop_front() {
                        // If the opener gave up meanwhile, the stream is dropped (reset).
                        let _ = tx.send(stream);
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => break,
            }
        }
        loop {
            match self.session.poll_next_inbound(cx) {
                Poll::Ready(Some(Ok(stream))) => self.route_inbound(stream),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn route_inbound(&mut self, stream: yamux::Stream) {
        if let Some(control) = self.control.take() {
            let _ = control.send(stream);
            return;
        }
        match self.permits.clone().try_acquire_owned() {
            // The queue holds at most MAX_STREAMS entries, each with a permit, so it has
            // room whenever a permit was available.
            Ok(permit) => {
                let _ = self.inbound.try_send((stream, permit));
            }
            Err(_) => {
                tracing::debug!("peer exceeded {MAX_STREAMS} open streams; resetting a new one");
                drop(stream);
            }
        }
    }
}

/// Owns the session and the control tasks of one connection; see the module docs.
struct Driver<T> {
    io: Io<T>,
    state: StateTx,
    activate: oneshot::Receiver<(Control, Timing)>,
    datagrams_out: mpsc::Receiver<Bytes>,
    datagrams_in: mpsc::Sender<Bytes>,
}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Driver<T> {
    async fn run(self) {
        let Driver { mut io, state, mut activate, datagrams_out, datagrams_in } = self;
        let mut state_rx = state.subscribe();
        let mut children = JoinSet::new();
        let mut reader = None;
        let mut close_sent = None;
        let mut datagrams = Some((datagrams_out, datagrams_in));
        let mut activated = false;
        let ended = loop {
            if state_rx.borrow_and_update().is_some() {
                break None;
            }
            tokio::select! {
                changed = state_rx.changed() => if changed.is_err() { break None },
                control = &mut activate, if !activated => {
                    activated = true;
                    if let (Ok((control, timing)), Some((out, inn))) = (control, datagrams.take()) {
                        let (sent_tx, sent_rx) = oneshot::channel();
                        close_sent = Some(sent_rx);
                        children.spawn(write_control(control.write, out, state.subscribe(), timing.keep_alive, sent_tx));
                        reader = Some(children.spawn(read_control(control.read, inn, state.clone(), timing.idle_timeout)));
                    }
                }
                ended = poll_fn(|cx| io.poll_session(cx)) => break Some(ended),
            }
        };
        match ended {
            None => {
                // Closing by request (ours or the peer's Close frame): if ours, let the
                // writer put the Close frame in the session first, then close the session,
                // which flushes what the streams queued.
                let ours = matches!(*state.borrow(), Some(CloseReason::Local { .. }));
                if let (true, Some(sent)) = (ours, close_sent) {
                    tokio::select! {
                        _ = sent => {}
                        _ = poll_fn(|cx| io.poll_session(cx)) => {}
                        _ = tokio::time::sleep(CLOSE_GRACE) => {}
                    }
                }
                let _ = tokio::time::timeout(CLOSE_GRACE, poll_fn(|cx| io.session.poll_close(cx))).await;
            }
            Some(result) => {
                // The session ended under us. The peer's Close frame may still sit unread in
                // the control stream's buffer: let the reader see it before concluding.
                if let Some(reader) = reader {
                    let _ = tokio::time::timeout(CLOSE_GRACE, async {
                        while let Some(done) = children.join_next_with_id().await {
                            if done.map(|(id, ())| id).ok() == Some(reader.id()) {
                                break;
                            }
                        }
                    })
                    .await;
                }
                let detail = match result {
                    Ok(()) => "the peer ended the connection without closing it".to_string(),
                    Err(e) => e.to_string(),
                };
                set_if_open(&state, CloseReason::Lost { detail });
            }
        }
        children.shutdown().await;
    }
}

/// Reads the peer's control frames until the connection ends.
async fn read_control(
    mut read: ReadHalf<Stream>,
    datagrams: mpsc::Sender<Bytes>,
    state: StateTx,
    idle_timeout: Duration,
) {
    loop {
        let frame = match tokio::time::timeout(idle_timeout, read_frame(&mut read)).await {
            Err(_) => {
                set_if_open(&state, CloseReason::TimedOut);
                return;
            }
            Ok(frame) => frame,
        };
        match frame {
            Ok(Frame::Datagram(payload)) => {
                // A full queue drops the datagram, as a congested network would.
                let _ = datagrams.try_send(payload);
            }
            Ok(Frame::Ping) => {}
            Ok(Frame::Close(reason)) => {
                set_if_open(&state, CloseReason::Peer { reason });
                return;
            }
            Ok(other) => {
                set_if_open(
                    &state,
                    CloseReason::Lost { detail: format!("protocol violation: unexpected {other:?} frame") },
                );
                return;
            }
            Err(FrameError::Eof) => {
                set_if_open(&state, CloseReason::Lost { detail: "the peer ended the control stream".into() });
                return;
            }
            Err(e) => {
                set_if_open(&state, CloseReason::Lost { detail: e.to_string() });
                return;
            }
        }
    }
}

/// Writes datagrams and pings; on a local close, the Close frame, then finishes.
async fn write_control(
    mut write: WriteHalf<Stream>,
    mut datagrams: mpsc::Receiver<Bytes>,
    mut state: watch::Receiver<Option<CloseReason>>,
    keep_alive: Duration,
    close_sent: oneshot::Sender<()>,
) {
    let mut ping = tokio::time::interval(keep_alive);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let closing = state.borrow_and_update().clone();
        if let Some(reason) = closing {
            if let CloseReason::Local { reason } = reason {
                let _ = write_frame(&mut write, &Frame::Close(reason)).await;
                let _ = tokio::io::AsyncWriteExt::shutdown(&mut write).await;
                let _ = close_sent.send(());
            }
            return;
        }
        let frame = tokio::select! {
            biased;
            changed = state.changed() => {
                if changed.is_err() { return }
                continue;
            }
            datagram = datagrams.recv() => match datagram {
                Some(payload) => Frame::Datagram(payload),
                None => return,
            },
            _ = ping.tick() => Frame::Ping,
        };
        if write_frame(&mut write, &frame).await.is_err() {
            return;
        }
    }
}
