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
//!
//! # The engine's usage
//!
//! On the way through, a successful body is read for the token counts the engine reports
//! ([`EngineUsage`]), which [`Ending`] hands to the observer: the key's limits and the usage
//! ledger charge those, not an estimate. How a body is read for them, and how a stream's
//! usage the client did not ask for is taken back out, is `usage`'s part ([`UsageTap`],
//! [`ask_for_usage`]).

use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::io::AsyncRead;

use crate::api_error::sse_error_event;

mod usage;

use usage::Tap;
pub use usage::{ask_for_usage, BodyShape, EngineUsage, UsageTap};

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

/// How a tunnelled body ended, and what it showed on the way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ending {
    /// How it ended.
    pub how: BodyEnd,
    /// The usage the engine reported in it, if it did (and the body was read for it).
    pub usage: Option<EngineUsage>,
    /// When its first byte arrived from the node.
    pub first_byte: Option<Instant>,
}

/// Told once how a tunnelled body ended.
pub type OnEnd = Box<dyn FnOnce(Ending) + Send + Sync>;

/// The gateway's response body.
pub enum GatewayBody {
    /// A complete body (errors, `/v1/models`, `/status`, ...).
    Full(Option<Bytes>),
    /// A response streamed from a node (or an overflow provider, [`crate::overflow`]).
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

/// Where a [`TunnelBody`] reads from: a node's tunnel stream, or an overflow provider's HTTP
/// body.
pub type Source = Box<dyn AsyncRead + Send + Sync + Unpin>;

/// A body read from a tunnel stream; see the module docs.
pub struct TunnelBody {
    recv: Source,
    buf: BytesMut,
    /// Server-sent events: a break becomes an error event.
    sse: bool,
    /// The last bytes sent (at most [`TAIL`]): whether a break fell between two events, and
    /// whether the stream ended with `data: [DONE]`.
    tail: Vec<u8>,
    sent: u64,
    node: String,
    state: State,
    tap: Tap,
    first_byte: Option<Instant>,
    /// The body's `content-length`, if the node gave one, and the bytes read so far: a body
    /// whose length is known ends with its last byte (the client may not ask for more).
    length: Option<u64>,
    received: u64,
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
    pub fn new(
        recv: impl AsyncRead + Send + Sync + Unpin + 'static,
        sse: bool,
        node: String,
        held: Vec<Held>,
        on_end: OnEnd,
    ) -> TunnelBody {
        TunnelBody {
            recv: Box::new(recv),
            buf: BytesMut::new(),
            sse,
            tail: b"\n\n".to_vec(),
            sent: 0,
            node,
            state: State::Streaming,
            tap: Tap::new(UsageTap::Off),
            first_byte: None,
            length: None,
            received: 0,
            on_end: Some(on_end),
            _held: held,
        }
    }

    /// Reads the body for the engine's usage as `tap` says (the default: not at all).
    pub fn with_usage(mut self, tap: UsageTap) -> TunnelBody {
        self.tap = Tap::new(tap);
        self
    }

    /// The body is `length` bytes long (its `content-length`): it is complete at its last
    /// byte, even if the client never polls for the end.
    pub fn with_length(mut self, length: Option<u64>) -> TunnelBody {
        self.length = length;
        self
    }

    fn finish(&mut self, how: BodyEnd) {
        self.state = State::Done;
        if let Some(f) = self.on_end.take() {
            f(Ending { how, usage: self.tap.usage(), first_byte: self.first_byte });
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
    /// Counts `bytes` as sent to the client.
    fn note_sent(&mut self, bytes: &[u8]) {
        self.sent += bytes.len() as u64;
        self.tail.extend_from_slice(&bytes[bytes.len().saturating_sub(TAIL)..]);
        let excess = self.tail.len().saturating_sub(TAIL);
        self.tail.drain(..excess);
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.state == State::Done {
            return Poll::Ready(None);
        }
        loop {
            if self.buf.capacity() < CHUNK {
                self.buf.reserve(CHUNK);
            }
            match ready!(tokio_util::io::poll_read_buf(Pin::new(&mut self.recv), cx, &mut self.buf)) {
                Ok(0) => {
                    // What the tap still held (an unfinished last event) goes out first.
                    let mut out = BytesMut::from(self.tap.finish());
                    self.note_sent(&out);
                    // Every OpenAI-compatible engine ends a stream with `data: [DONE]`. A stream
                    // that ends without it was cut (an engine that died, a node that dropped the
                    // tunnel without resetting it), which must not look like a complete answer.
                    if self.sse && !ends_with_done(&self.tail) {
                        let event = self.error_event("the stream ended without data: [DONE]");
                        tracing::warn!(node = %self.node, "the stream from node {} ended without [DONE] after {} bytes", self.node, self.sent);
                        self.finish(BodyEnd::Broken);
                        out.extend_from_slice(&event);
                        return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
                    }
                    self.finish(BodyEnd::Complete);
                    return Poll::Ready((!out.is_empty()).then(|| Ok(Frame::data(out.freeze()))));
                }
                Ok(n) => {
                    self.first_byte.get_or_insert_with(Instant::now);
                    self.received += n as u64;
                    let chunk = self.buf.split().freeze();
                    let out = self.tap.pass(chunk);
                    if self.length.is_some_and(|l| self.received >= l) {
                        let mut out = BytesMut::from(out);
                        out.extend_from_slice(&self.tap.finish());
                        self.note_sent(&out);
                        self.finish(BodyEnd::Complete);
                        return Poll::Ready((!out.is_empty()).then(|| Ok(Frame::data(out.freeze()))));
                    }
                    if out.is_empty() {
                        // All of it held back (the start of an event) or removed: read on.
                        continue;
                    }
                    self.note_sent(&out);
                    return Poll::Ready(Some(Ok(Frame::data(out))));
                }
                Err(e) => {
                    tracing::warn!(node = %self.node, "the tunnel from node {} broke after {} bytes: {e}", self.node, self.sent);
                    let mut out = BytesMut::from(self.tap.finish());
                    self.note_sent(&out);
                    let event = self.sse.then(|| self.error_event(&e.to_string()));
                    self.finish(BodyEnd::Broken);
                    return match event {
                        Some(event) => {
                            out.extend_from_slice(&event);
                            Poll::Ready(Some(Ok(Frame::data(out.freeze()))))
                        }
                        None => Poll::Ready(Some(Err(e))),
                    };
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
