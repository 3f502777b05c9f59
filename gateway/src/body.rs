//! [`GatewayBody`]: what the gateway answers with — either a small body it made itself or a
//! response streamed from a node's tunnel, chunk by chunk, as it arrives.
//!
//! A tunnelled body holds everything that must last exactly as long as the response: the
//! node's in-flight guard, the concurrency permit and the metrics record. They are released
//! when the body ends, fails, or is dropped because the client went away — every path, with
//! no bookkeeping left to a caller.
//!
//! When the tunnel breaks after the first byte of a server-sent-event stream, the body ends
//! with one more event, `data: {"error": {...}}`, and then a clean end of stream, so that
//! clients (the OpenAI SDKs raise `APIError`) see an error instead of a silent cut. A broken
//! non-stream body cannot be repaired that way; it fails, and hyper cuts the connection,
//! which clients see as an incomplete response rather than a short, valid-looking one.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tela_transports::RecvStream;

use crate::api_error::sse_error_event;

/// Read size for tunnel bodies: what one poll may return at most.
const CHUNK: usize = 16 * 1024;

/// How many trailing bytes a body remembers.
const TAIL: usize = 16;

/// Something released when a response body ends (a guard, a permit, a metrics record).
pub type Held = Box<dyn std::any::Any + Send + Sync>;

/// How a tunnelled body ended, reported to [`TunnelBody`]'s observer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyEnd {
    /// The node finished the body.
    Complete,
    /// The tunnel broke after the first byte.
    Broken,
    /// The client went away before the end.
    Abandoned,
}

/// Told once how a tunnelled body ended.
pub type OnEnd = Box<dyn FnOnce(BodyEnd) + Send + Sync>;

/// The gateway's response body.
pub enum GatewayBody {
    /// A complete body (errors, `/v1/models`, `/status`, ...).
    Full(Option<Bytes>),
    /// A response streamed from a node.
    Tunnel(Box<TunnelBody>),
}

impl GatewayBody {
    /// A complete body.
    pub fn full(bytes: impl Into<Bytes>) -> GatewayBody {
        GatewayBody::Full(Some(bytes.into()))
    }

    /// An empty body.
    pub fn empty() -> GatewayBody {
        GatewayBody::Full(None)
    }
}

/// A body read from a tunnel stream; see the module docs.
pub struct TunnelBody {
    recv: RecvStream,
    buf: BytesMut,
    /// Server-sent events: a break becomes an error event.
    sse: bool,
    /// The last bytes sent (at most [`TAIL`]): whether a break fell between two events, and
    /// whether the stream ended with `data: [DONE]`.
    tail: Vec<u8>,
    sent: u64,
    node: String,
    state: State,
    on_end: Option<OnEnd>,
    _held: Vec<Held>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Streaming,
    Done,
}

impl TunnelBody {
    /// Streams `recv` (positioned after the response head) to the client. `sse` says whether
    /// the response is `text/event-stream`; `node` names the node in error events; `held`
    /// is released when the body ends or is dropped; `on_end` learns how it ended.
    pub fn new(recv: RecvStream, sse: bool, node: String, held: Vec<Held>, on_end: OnEnd) -> TunnelBody {
        TunnelBody {
            recv,
            buf: BytesMut::new(),
            sse,
            tail: b"\n\n".to_vec(),
            sent: 0,
            node,
            state: State::Streaming,
            on_end: Some(on_end),
            _held: held,
        }
    }

    fn finish(&mut self, how: BodyEnd) {
        self.state = State::Done;
        if let Some(f) = self.on_end.take() {
            f(how);
        }
        // Release the guards now, not when hyper gets round to dropping the body.
        self._held.clear();
    }

    fn error_event(&self, detail: &str) -> Bytes {
        let message = format!("the response from node {} broke off after {} bytes: {detail}", self.node, self.sent);
        let event = sse_error_event(&message, "upstream_stream_broken");
        if self.tail.ends_with(b"\n\n") || self.tail.ends_with(b"\r\n\r\n") {
            event
        } else {
            // Cut in the middle of an event: end it first so ours parses on its own.
            let mut out = BytesMut::with_capacity(event.len() + 2);
            out.extend_from_slice(b"\n\n");
            out.extend_from_slice(&event);
            out.freeze()
        }
    }
}

impl Drop for TunnelBody {
    fn drop(&mut self) {
        if self.state == State::Streaming {
            self.finish(BodyEnd::Abandoned);
        }
    }
}

impl Body for GatewayBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.get_mut() {
            GatewayBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            GatewayBody::Tunnel(t) => t.as_mut().poll(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            GatewayBody::Full(bytes) => bytes.is_none(),
            GatewayBody::Tunnel(t) => t.state == State::Done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            GatewayBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            GatewayBody::Full(None) => SizeHint::with_exact(0),
            GatewayBody::Tunnel(_) => SizeHint::default(),
        }
    }
}

impl TunnelBody {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.state == State::Done {
            return Poll::Ready(None);
        }
        if self.buf.capacity() < CHUNK {
            self.buf.reserve(CHUNK);
        }
        match ready!(tokio_util::io::poll_read_buf(Pin::new(&mut self.recv), cx, &mut self.buf)) {
            Ok(0) => {
                // Every OpenAI-compatible engine ends a stream with `data: [DONE]`. A stream that
                // ends without it was cut (an engine that died, a node that dropped the tunnel
                // without resetting it), which must not look like a complete answer.
                if self.sse && !ends_with_done(&self.tail) {
                    let event = self.error_event("the stream ended without data: [DONE]");
                    tracing::warn!(node = %self.node, "the stream from node {} ended without [DONE] after {} bytes", self.node, self.sent);
                    self.finish(BodyEnd::Broken);
                    return Poll::Ready(Some(Ok(Frame::data(event))));
                }
                self.finish(BodyEnd::Complete);
                Poll::Ready(None)
            }
            Ok(n) => {
                let chunk = self.buf.split().freeze();
                self.sent += n as u64;
                self.tail.extend_from_slice(&chunk[n.saturating_sub(TAIL)..]);
                let excess = self.tail.len().saturating_sub(TAIL);
                self.tail.drain(..excess);
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            Err(e) => {
                tracing::warn!(node = %self.node, "the tunnel from node {} broke after {} bytes: {e}", self.node, self.sent);
                let event = self.sse.then(|| self.error_event(&e.to_string()));
                self.finish(BodyEnd::Broken);
                match event {
                    Some(event) => Poll::Ready(Some(Ok(Frame::data(event)))),
                    None => Poll::Ready(Some(Err(e))),
                }
            }
        }
    }
}

/// Whether an event stream's last bytes are its `data: [DONE]` terminator.
fn ends_with_done(tail: &[u8]) -> bool {
    let trimmed = tail.strip_suffix(b"\n").unwrap_or(tail);
    let trimmed = trimmed.strip_suffix(b"\r").unwrap_or(trimmed);
    let trimmed = trimmed.strip_suffix(b"\n").unwrap_or(trimmed);
    let trimmed = trimmed.strip_suffix(b"\r").unwrap_or(trimmed);
    trimmed.ends_with(b"[DONE]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn done_terminators_are_recognised_with_either_line_ending() {
        assert!(ends_with_done(b"data: [DONE]\n\n"));
        assert!(ends_with_done(b"data: [DONE]\r\n\r\n"));
        assert!(ends_with_done(b"data: [DONE]"));
        assert!(!ends_with_done(b"data: {\"x\":1}\n\n"));
        assert!(!ends_with_done(b""));
    }
}
