//! Serving tunnelled requests: a gateway opens a stream on the connection this node dialled,
//! writes a [`RequestHead`] and the body; the node forwards it to the engine on loopback and
//! streams the response back as it arrives.
//!
//! - **No buffering**: body bytes from the engine are written and flushed to the stream as
//!   soon as they arrive, so server-sent events flow token by token; the request body is
//!   streamed to the engine the same way. Frames the engine connection already holds go out
//!   together (the first of them with the response head), so a short answer crosses the
//!   tunnel as one packet; nothing waits for bytes that have not arrived.
//! - **Idle timeouts, not total ones**: the engine may take as long as it likes overall (a
//!   long generation), but a silence longer than [`ForwardConfig::idle_timeout`] before the
//!   response head or between two frames ends the request.
//! - **Load**: every forwarded request counts in [`InFlight`](crate::inflight::InFlight)
//!   from head to last byte, which the driver reports to the core (a drain ends when it
//!   reaches zero).
//! - **Progress**: every request sent to the engine counts in [`EngineTraffic`] until it
//!   ends, with each arrival of bytes and each completed answer, so the engine supervisor
//!   knows a probe that timed out behind a long generation from a stuck engine.
//! - **Accepted at once**: the node answers every request head with the tunnel's accepted
//!   marker — in the same write as the response head when the engine answers within
//!   [`ForwardConfig::accept_within`], alone otherwise — so a gateway learns within a round
//!   trip that the node is alive (see [`tela_transports::tunnel`]).
//! - **Lifecycle**: a node that is not SERVE (still joining, draining, failed, left)
//!   answers new streams with `503` and an OpenAI-shaped error, before touching the engine,
//!   so that the gateway retries on another node at once.
//! - Errors before the response head become OpenAI-shaped `502`/`504` answers; an error after
//!   it ends the stream early (the gateway turns that into an SSE error event).

use crate::engine::{error_chain, Backend, EngineBody, EngineTraffic};
use crate::runtime::{IncomingStream, StreamHandler};
use bytes::Bytes;
use futures::TryStreamExt;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Body, Frame, Incoming};
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tela_core::Lifecycle;
use tela_transports::tunnel::{
    read_request_head, write_accepted, write_response_start, RequestHead, ResponseHead, TunnelError,
};
use tela_transports::SendStream;
use tokio::io::AsyncWriteExt;
use tokio_util::io::ReaderStream;

/// How tunnelled requests are forwarded.
#[derive(Clone, Copy, Debug)]
pub struct ForwardConfig {
    /// The longest silence from the engine (before the head, or between body frames).
    pub idle_timeout: Duration,
    /// The longest a gateway may take to send the request head after opening the stream.
    pub head_timeout: Duration,
    /// How long the accepted marker may wait to travel with the response head; past this it
    /// goes out alone. Far below the gateway's accept timeout (500 ms by default).
    pub accept_within: Duration,
}

impl Default for ForwardConfig {
    fn default() -> Self {
        ForwardConfig {
            idle_timeout: Duration::from_secs(300),
            head_timeout: Duration::from_secs(10),
            accept_within: Duration::from_millis(20),
        }
    }
}

/// Headers that describe one HTTP hop, not the message: never forwarded (the tunnel frames
/// bodies itself, and the engine connection has its own `Host`).
pub const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// The response header naming the node that served a request.
pub const NODE_HEADER: &str = "x-tela-node";

/// A [`StreamHandler`] that forwards every tunnelled request to `backend`, recording its
/// progress in `traffic`.
pub fn tunnel_handler(backend: Backend, config: ForwardConfig, traffic: EngineTraffic) -> StreamHandler {
    let backend = Arc::new(backend);
    Arc::new(move |incoming: IncomingStream| {
        let backend = backend.clone();
        let traffic = traffic.clone();
        Box::pin(async move { serve(incoming, &backend, config, &traffic).await })
    })
}

/// The answering side of a tunnelled request: the accepted marker goes out with the first
/// response head, unless it had to go out alone before (see [`ForwardConfig::accept_within`]).
struct Reply {
    send: SendStream,
    accepted: bool,
}

impl Reply {
    /// Sends the accepted marker now, if it has not gone out yet.
    async fn accept(&mut self) -> Result<(), TunnelError> {
        if !self.accepted {
            write_accepted(&mut self.send).await?;
            self.accepted = true;
        }
        Ok(())
    }

    /// Sends the response head and the first body bytes, with the marker in the same write if
    /// it is still due.
    async fn head(&mut self, head: &ResponseHead, body: &[u8]) -> Result<(), TunnelError> {
        let with_marker = !self.accepted;
        self.accepted = true;
        write_response_start(&mut self.send, with_marker, head, body).await
    }
}

async fn serve(incoming: IncomingStream, backend: &Backend, config: ForwardConfig, traffic: &EngineTraffic) {
    let IncomingStream { peer, send, mut recv, view } = incoming;
    let mut send = Reply { send, accepted: false };
    let head = match tokio::time::timeout(config.head_timeout, read_request_head(&mut recv)).await {
        Ok(Ok(head)) => head,
        Ok(Err(TunnelError::Closed)) => return,
        Ok(Err(e)) => {
            tracing::warn!(%peer, "bad tunnelled request from {peer}: {e}");
            let _ = respond_error(
                &mut send,
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "bad_tunnel_head",
                &e.to_string(),
                view.node_id(),
            )
            .await;
            return;
        }
        Err(_) => {
            tracing::warn!(%peer, "{peer} opened a stream but sent no request head within {:?}", config.head_timeout);
            return;
        }
    };
    // Count first, then look at the state: a drain that starts in between still sees this
    // request, so it cannot reach LEFT while the request goes to the engine.
    let _in_flight = view.in_flight().enter();
    let state = view.snapshot().state();
    if state != Lifecycle::Serve {
        let message =
            format!("node {} is {} and takes no new requests; retry on another node", view.node_id(), state.as_str());
        let _ = respond_error(
            &mut send,
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "node_unavailable",
            &message,
            view.node_id(),
        )
        .await;
        return;
    }
    let method = head.method.clone();
    let path = head.path_and_query.clone();
    let request = match build_request(backend, head, recv) {
        Ok(r) => r,
        Err(e) => {
            let _ = respond_error(
                &mut send,
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "bad_request",
                &e.to_string(),
                view.node_id(),
            )
            .await;
            return;
        }
    };
    // The gateway waits for the accepted marker (not for the engine) to decide whether this
    // node is alive: it goes out with the response head, or alone if the engine is slower.
    let progress = traffic.start();
    let engine = tokio::time::timeout(config.idle_timeout, backend.client().request(request));
    tokio::pin!(engine);
    let answer = tokio::select! {
        biased;
        answer = &mut engine => answer,
        () = tokio::time::sleep(config.accept_within) => {
            if let Err(e) = send.accept().await {
                tracing::debug!(%peer, "{peer} went away before the request was accepted: {e}");
                return;
            }
            engine.await
        }
    };
    let response = match answer {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            let detail = error_chain(&e);
            tracing::warn!("{method} {path}: the engine at {} failed: {detail}", backend.url());
            let _ = respond_error(
                &mut send,
                StatusCode::BAD_GATEWAY,
                "server_error",
                "engine_unavailable",
                &format!("the engine behind node {} failed: {detail}", view.node_id()),
                view.node_id(),
            )
            .await;
            return;
        }
        Err(_) => {
            tracing::warn!("{method} {path}: no response head from the engine within {:?}", config.idle_timeout);
            let _ = respond_error(
                &mut send,
                StatusCode::GATEWAY_TIMEOUT,
                "server_error",
                "engine_timeout",
                &format!("the engine behind node {} did not answer within {:?}", view.node_id(), config.idle_timeout),
                view.node_id(),
            )
            .await;
            return;
        }
    };
    progress.received();
    let (parts, mut body) = response.into_parts();
    let mut headers: Vec<(String, Vec<u8>)> = parts
        .headers
        .iter()
        .filter(|(name, _)| !HOP_BY_HOP.contains(&name.as_str()))
        .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
        .collect();
    headers.push((NODE_HEADER.into(), view.node_id().to_string().into_bytes()));
    let head = ResponseHead { status: parts.status.as_u16(), headers };
    // What the engine has already sent goes out with the head: a short answer crosses the
    // tunnel as one packet (marker, head, body and end) instead of one per part.
    let mut out = Vec::new();
    let mut gathered = gather_ready(&mut body, &mut out).await;
    let mut bytes = out.len() as u64;
    if !out.is_empty() {
        progress.received();
    }
    if send.head(&head, &out).await.is_err() {
        return; // the gateway went away
    }
    let mut send = send.send;
    loop {
        match gathered {
            Gathered::Ended => break,
            Gathered::Broken(e) => {
                tracing::warn!("{method} {path}: the engine's response broke after {bytes} bytes: {}", error_chain(&e));
                return; // ends the stream without a clean finish of the body
            }
            Gathered::More => {}
        }
        out.clear();
        gathered = match tokio::time::timeout(config.idle_timeout, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    out.extend_from_slice(&data);
                }
                gather_ready(&mut body, &mut out).await
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => Gathered::Broken(e),
            Err(_) => {
                tracing::warn!(
                    "{method} {path}: the engine sent nothing for {:?} after {bytes} bytes; ending the response",
                    config.idle_timeout
                );
                return;
            }
        };
        if out.is_empty() {
            continue;
        }
        progress.received();
        bytes += out.len() as u64;
        if send.write_all(&out).await.is_err() || send.flush().await.is_err() {
            // The client or gateway went away; dropping the engine response closes its
            // connection, which stops the generation.
            tracing::debug!("{method} {path}: the gateway stopped reading after {bytes} bytes");
            return;
        }
    }
    progress.completed();
    let _ = send.shutdown().await;
}

/// The most body bytes gathered into one write to the tunnel.
const GATHER_LIMIT: usize = 64 * 1024;

/// How the engine's response stands after [`gather_ready`].
enum Gathered {
    /// More may come.
    More,
    /// The body is complete.
    Ended,
    /// The engine's response broke.
    Broken(hyper::Error),
}

/// Appends to `out` the body frames the engine has already sent, without waiting for any that
/// has not arrived: the engine connection's task gets one turn of the scheduler to hand over
/// what it has read, so a token that is in flight goes out microseconds later, never held back
/// for the next one. Server-sent events thus still flow token by token, while frames that
/// arrived together (a short answer, a burst of events) share one write and one packet.
async fn gather_ready(body: &mut Incoming, out: &mut Vec<u8>) -> Gathered {
    while out.len() < GATHER_LIMIT {
        if body.is_end_stream() {
            return Gathered::Ended;
        }
        let mut yielded = false;
        let ready = poll_fn(|cx| match Pin::new(&mut *body).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(Some(frame)),
            Poll::Pending if !yielded => {
                yielded = true;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Pending => Poll::Ready(None),
        })
        .await;
        match ready {
            None => return Gathered::More,
            Some(None) => return Gathered::Ended,
            Some(Some(Err(e))) => return Gathered::Broken(e),
            Some(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    out.extend_from_slice(&data);
                }
            }
        }
    }
    Gathered::More
}

/// Why a tunnelled request head does not make an HTTP request for the engine. Nothing was
/// sent to the engine; the gateway gets a `400`.
#[derive(Debug, thiserror::Error)]
enum RequestHeadError {
    /// The method is not an HTTP method token.
    #[error("invalid method '{method}'")]
    Method {
        /// The method as sent.
        method: String,
        /// What `http` said.
        #[source]
        source: http::method::InvalidMethod,
    },
    /// The path does not make a URI on the engine.
    #[error("invalid path '{path}': {source}")]
    Path {
        /// The path and query as sent.
        path: String,
        /// What `http` said.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// A header name is not a valid token.
    #[error("invalid header name '{name}'")]
    HeaderName {
        /// The name as sent.
        name: String,
        /// What `http` said.
        #[source]
        source: http::header::InvalidHeaderName,
    },
    /// A header value holds bytes HTTP forbids.
    #[error("invalid value for header '{name}'")]
    HeaderValue {
        /// The header's name.
        name: HeaderName,
        /// What `http` said.
        #[source]
        source: http::header::InvalidHeaderValue,
    },
    /// The request could not be assembled.
    #[error(transparent)]
    Build(#[from] http::Error),
}

fn build_request(
    backend: &Backend,
    head: RequestHead,
    recv: tela_transports::RecvStream,
) -> Result<Request<EngineBody>, RequestHeadError> {
    let method = Method::from_bytes(head.method.as_bytes())
        .map_err(|source| RequestHeadError::Method { method: head.method.clone(), source })?;
    let uri = backend
        .uri_for(&head.path_and_query)
        .map_err(|source| RequestHeadError::Path { path: head.path_and_query.clone(), source })?;
    let mut builder = Request::builder().method(method).uri(uri);
    for (name, value) in head.headers {
        if HOP_BY_HOP.contains(&name.to_ascii_lowercase().as_str()) {
            continue;
        }
        let name = match HeaderName::from_bytes(name.as_bytes()) {
            Ok(n) => n,
            Err(source) => return Err(RequestHeadError::HeaderName { name, source }),
        };
        let value = match HeaderValue::from_bytes(&value) {
            Ok(v) => v,
            Err(source) => return Err(RequestHeadError::HeaderValue { name, source }),
        };
        builder = builder.header(name, value);
    }
    let frames = ReaderStream::new(recv).map_ok(Frame::data).map_err(|e| -> crate::engine::BodyError { Box::new(e) });
    let body = StreamBody::new(frames).boxed();
    Ok(builder.body(body)?)
}

/// Answers with an OpenAI-shaped error and finishes the stream.
async fn respond_error(
    send: &mut Reply,
    status: StatusCode,
    kind: &str,
    code: &str,
    message: &str,
    node: tela_core::NodeId,
) -> Result<(), TunnelError> {
    let body = error_body(message, kind, code);
    let head = ResponseHead {
        status: status.as_u16(),
        headers: vec![
            ("content-type".into(), b"application/json".to_vec()),
            ("content-length".into(), body.len().to_string().into_bytes()),
            (NODE_HEADER.into(), node.to_string().into_bytes()),
        ],
    };
    send.head(&head, &body).await?;
    send.send.shutdown().await?;
    Ok(())
}

/// `{"error":{"message","type","param","code"}}`, as OpenAI's API answers errors.
pub fn error_body(message: &str, kind: &str, code: &str) -> Bytes {
    let v = serde_json::json!({
        "error": {"message": message, "type": kind, "param": null, "code": code}
    });
    Bytes::from(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_have_the_openai_shape() {
        let b = error_body("node x is DOWN", "server_error", "node_unavailable");
        let v: serde_json::Value = serde_json::from_slice(&b).expect("json");
        assert_eq!(v["error"]["code"], "node_unavailable");
        assert_eq!(v["error"]["type"], "server_error");
        assert!(v["error"]["param"].is_null());
    }
}
