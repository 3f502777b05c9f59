//! The body of a streamed answer: SSE chunks produced on the simulated engine's clock.
//!
//! The body is a state machine polled by the connection, not a task feeding a channel: each
//! chunk is rendered when its time comes and handed to hyper, which writes and flushes it at
//! once. When the client goes away hyper drops the body, which ends the request — there is
//! nothing left running to leak.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use tokio::time::{Instant, Sleep};

use super::generate::Generation;
use super::openai::{chunk_body, ChunkKind, Endpoint, ResponseMeta, Usage};
use super::scheduler::Running;
use super::{sse, Counters, InFlight, Shared};

/// The body error that makes hyper cut the connection mid-stream (`--fail-mode mid-stream`).
#[derive(Debug, thiserror::Error)]
#[error("simulated engine failure: stream cut on purpose (--fail-mode mid-stream)")]
pub(crate) struct StreamCut;

/// What the stream sends next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Role,
    Token(usize),
    Finish,
    Usage,
    Done,
    Ended,
}

/// A streamed chat or text completion.
pub(crate) struct TokenStream {
    shared: Arc<Shared>,
    _in_flight: InFlight,
    /// Holds the request's slot and counts it as running until the stream ends or is dropped.
    running: Running,
    endpoint: Endpoint,
    meta: ResponseMeta,
    generation: Generation,
    usage: Usage,
    include_usage: bool,
    /// Token `i` is due at `first_token_at + i * interval`.
    first_token_at: Instant,
    interval: Duration,
    /// With a mid-stream fault: the index of the token before which the connection is cut.
    cut_before_token: Option<usize>,
    /// Whether the stream already yielded once at the cut, so hyper flushed what it buffered.
    cut_flushed: bool,
    next: Step,
    sleep: Pin<Box<Sleep>>,
}

/// How a stream should be produced.
pub(crate) struct StreamPlan {
    pub(crate) endpoint: Endpoint,
    pub(crate) meta: ResponseMeta,
    pub(crate) generation: Generation,
    pub(crate) usage: Usage,
    pub(crate) include_usage: bool,
    pub(crate) first_token_at: Instant,
    pub(crate) interval: Duration,
    /// Cut the connection after a few chunks instead of finishing.
    pub(crate) cut: bool,
}

/// Content chunks sent before a mid-stream fault cuts the connection (fewer if the answer is
/// shorter).
const CHUNKS_BEFORE_CUT: usize = 2;

impl TokenStream {
    pub(crate) fn new(plan: StreamPlan, in_flight: InFlight, running: Running) -> Self {
        let tokens = plan.generation.tokens.len();
        Self {
            shared: Arc::clone(&in_flight.0),
            _in_flight: in_flight,
            running,
            endpoint: plan.endpoint,
            cut_before_token: plan.cut.then(|| CHUNKS_BEFORE_CUT.min(tokens.saturating_sub(1))),
            cut_flushed: false,
            next: match plan.endpoint {
                Endpoint::Chat => Step::Role,
                Endpoint::Completion => Step::Token(0),
            },
            sleep: Box::pin(tokio::time::sleep_until(plan.first_token_at)),
            meta: plan.meta,
            generation: plan.generation,
            usage: plan.usage,
            include_usage: plan.include_usage,
            first_token_at: plan.first_token_at,
            interval: plan.interval,
        }
    }

    /// When `step` may be sent; `None` means right after the previous one.
    fn due(&self, step: Step) -> Option<Instant> {
        match step {
            // The role chunk goes out with the first token, as engines send it.
            Step::Role => Some(self.first_token_at),
            Step::Token(i) => {
                let offset = self.interval.saturating_mul(u32::try_from(i).unwrap_or(u32::MAX));
                Some(self.first_token_at + offset)
            }
            Step::Finish | Step::Usage | Step::Done | Step::Ended => None,
        }
    }

    fn after(&self, step: Step) -> Step {
        match step {
            Step::Role => Step::Token(0),
            Step::Token(i) if i + 1 < self.generation.tokens.len() => Step::Token(i + 1),
            Step::Token(_) => Step::Finish,
            Step::Finish if self.include_usage => Step::Usage,
            Step::Finish | Step::Usage => Step::Done,
            Step::Done | Step::Ended => Step::Ended,
        }
    }

    fn render(&self, step: Step) -> Bytes {
        let kind = match step {
            Step::Role => ChunkKind::Role,
            Step::Token(i) => ChunkKind::Token(&self.generation.tokens[i]),
            Step::Finish => ChunkKind::Finish(self.generation.finish_reason),
            Step::Usage => ChunkKind::Usage(self.usage),
            Step::Done | Step::Ended => return Bytes::from_static(sse::DONE),
        };
        sse::json_event(&chunk_body(self.endpoint, &self.meta, kind, self.include_usage))
    }
}

impl Body for TokenStream {
    type Data = Bytes;
    type Error = StreamCut;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, StreamCut>>> {
        let this = self.get_mut();
        let step = this.next;
        if step == Step::Ended {
            return Poll::Ready(None);
        }
        if let Some(due) = this.due(step) {
            if this.sleep.deadline() != due {
                this.sleep.as_mut().reset(due);
            }
            ready!(this.sleep.as_mut().poll(cx));
        }
        if let Step::Token(i) = step {
            if this.cut_before_token == Some(i) {
                // hyper drops buffered bytes when a body fails; yield once so the chunks sent
                // so far reach the client, as they would before a real engine crashed.
                if !this.cut_flushed {
                    this.cut_flushed = true;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                this.next = Step::Ended;
                tracing::info!(id = %this.meta.id, "injecting fault: cutting the stream");
                return Poll::Ready(Some(Err(StreamCut)));
            }
            Counters::bump(&this.shared.counters.tokens_generated, 1);
            this.running.generated(1);
        }
        if step == Step::Done {
            Counters::bump(&this.shared.counters.completed, 1);
        }
        let bytes = this.render(step);
        this.next = this.after(step);
        Poll::Ready(Some(Ok(Frame::data(bytes))))
    }

    fn is_end_stream(&self) -> bool {
        self.next == Step::Ended
    }
}

impl Drop for TokenStream {
    fn drop(&mut self) {
        if self.next != Step::Ended {
            Counters::bump(&self.shared.counters.client_disconnects, 1);
            tracing::debug!(id = %self.meta.id, "client went away mid-stream");
        }
    }
}
