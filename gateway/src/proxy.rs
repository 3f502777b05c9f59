//! Forwarding one API request to a node through its tunnel, with retries before the first
//! response byte.
//!
//! For each attempt: route ([`crate::routing::choose`], by the gateway's policy on the request's
//! model and leading content), count the request on the node, open a stream on the node's
//! connection, write the [`RequestHead`] and the body (unchanged, already read and
//! size-checked), finish the request side, wait for the node to accept it (a round trip:
//! [`ProxySettings::accept_timeout`]; a silent node is passed over, see
//! [`crate::routing::Silent`]), and wait for the [`ResponseHead`]. Until
//! that head has arrived nothing has reached the client, so any failure — the stream cannot be
//! opened, the connection breaks, the node answers `503` because it is draining or `502`
//! because its engine is unreachable — moves on at once to another node not yet tried, up to
//! [`ProxySettings::max_attempts`] (the policy is the core's [`tela_core::retry`], which the
//! simulator follows too). Once a head arrives, the response is the client's: its
//! body streams through [`TunnelBody`], which turns a later break into an SSE error event.
//!
//! The response body is read for the engine's usage on its way ([`crate::body::UsageTap`]),
//! and the request's [`Charge`] is told how it ended, with those token counts.
//!
//! The header `x-tela-gateway-ms` reports the gateway's own time for the request: from the
//! moment its body was read to the moment the request was written into the tunnel that
//! answered, retries included.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH};
use http::{Response, StatusCode};
use tela_core::retry::{Attempts, Next, Outcome};
use tela_core::routing::{Prefix, RouteError};
use tela_core::NodeId;
use tela_transports::tunnel::{encode_head, read_accepted, read_response_head, RequestHead, ResponseHead};
use tela_transports::{Connection, RecvStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::api_error::ApiError;
use crate::body::{BodyShape, Ending, GatewayBody, Held, TunnelBody};
use crate::ledger::Charge;
use crate::routing::{Choice, Target};
use crate::service::Shared;

/// The response header naming the node that served a request.
pub const NODE_HEADER: &str = "x-tela-node";
/// The response header with the gateway's own added time, in milliseconds.
pub const GATEWAY_MS_HEADER: &str = "x-tela-gateway-ms";

/// This gateway's credentials: never forwarded to a node (hop-by-hop headers neither, see
/// [`not_forwarded`]).
const CREDENTIALS: &[&str] = &["authorization", "api-key"];

/// True for headers that describe one hop (the runtime's list) or carry this gateway's
/// credentials; `name` is lower-case.
fn not_forwarded(name: &str) -> bool {
    tela_runtime::forward::HOP_BY_HOP.contains(&name) || CREDENTIALS.contains(&name)
}

/// How forwarding behaves.
#[derive(Clone, Copy, Debug)]
pub struct ProxySettings {
    /// Nodes tried per request before giving up (each on a different node).
    pub max_attempts: usize,
    /// The longest opening a stream and writing the request into it may take.
    pub write_timeout: Duration,
    /// The longest a node may take to accept a written request (a round trip, not the
    /// engine's time) before the request moves to another node and the node's connection is
    /// [`Silent`](crate::routing::Silent). With no other node to go to, the request keeps
    /// waiting.
    pub accept_timeout: Duration,
}

impl Default for ProxySettings {
    fn default() -> Self {
        ProxySettings {
            max_attempts: 3,
            write_timeout: Duration::from_secs(10),
            accept_timeout: Duration::from_millis(500),
        }
    }
}

/// One API request, read and checked.
pub struct ApiRequest {
    /// The method and path as received.
    pub head: RequestHead,
    /// The body, unchanged.
    pub body: Bytes,
    /// Its `model`.
    pub model: String,
    /// Its leading content, which [`RoutingPolicy::Prefix`](tela_core::routing::RoutingPolicy) keys on.
    pub prefix: Prefix,
    /// Its `stream`.
    pub stream: bool,
    /// When its body had been read.
    pub ready_at: Instant,
    /// Released when the response ends (the concurrency permit).
    pub held: Vec<Held>,
    /// Told how a node's response ended (a gateway's own answer is the caller's to report).
    pub charge: Option<Charge>,
    /// The gateway asked the engine for the stream's usage and the client did not: the usage
    /// event is taken out of the response ([`crate::body::ask_for_usage`]).
    pub strip_usage: bool,
}

impl ApiRequest {
    /// What routing is asked for this request.
    pub fn target(&self) -> Target<'_> {
        Target { model: &self.model, prefix: &self.prefix }
    }
}

/// The request head sent into the tunnel: method, path and the end-to-end headers.
pub fn tunnel_head(parts: &http::request::Parts) -> RequestHead {
    let path_and_query = parts.uri.path_and_query().map_or_else(|| parts.uri.path().to_string(), |p| p.to_string());
    let headers = parts
        .headers
        .iter()
        .filter(|(name, _)| !not_forwarded(name.as_str()))
        .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
        .collect();
    RequestHead { method: parts.method.as_str().to_string(), path_and_query, headers }
}

/// Why an attempt did not produce a response for the client.
struct Failure {
    reason: &'static str,
    detail: String,
}

/// A request no node could take, given back with the answer the gateway would give: routing
/// found no node serving its model (404) or none that could take it (503), or every node tried
/// failed before its first byte (503).
pub struct Unrouted {
    /// The request, untouched: nothing of it reached a client.
    pub request: ApiRequest,
    /// The answer.
    pub error: ApiError,
    /// No node serves the model at all (counted under the model `unknown`).
    pub unknown_model: bool,
}

/// Forwards `request`; see the module docs.
pub async fn forward(shared: &Shared, request: ApiRequest) -> Response<GatewayBody> {
    match try_forward(shared, request).await {
        Ok(response) => response,
        Err(unrouted) => {
            let model = if unrouted.unknown_model { "unknown" } else { unrouted.request.model.as_str() };
            shared.answer_error(unrouted.error, model)
        }
    }
}

/// Forwards `request`, or gives it back when no node could take it (for the caller to send
/// elsewhere, [`crate::overflow`]).
pub async fn try_forward(shared: &Shared, mut request: ApiRequest) -> Result<Response<GatewayBody>, Box<Unrouted>> {
    let mut attempts = Attempts::new(shared.proxy.max_attempts);
    let mut failures: Vec<String> = Vec::new();
    let view = shared.anchor_view();
    while attempts.left() {
        let snapshot = view.snapshot();
        let routing_started = Instant::now();
        let choice = crate::routing::choose(
            &view,
            &snapshot,
            &shared.load,
            &shared.silent,
            shared.routing,
            request.target(),
            attempts.tried(),
        );
        shared.metrics.routing.observe(routing_started.elapsed().as_secs_f64());
        let choice = match choice {
            Ok(c) => c,
            Err(RouteError::UnknownModel { known, .. }) if attempts.tried().is_empty() => {
                let error = ApiError::unknown_model(&request.model, &known);
                return Err(Box::new(Unrouted { request, error, unknown_model: true }));
            }
            Err(RouteError::UnknownModel { .. }) | Err(RouteError::NoCapacity { .. }) => {
                let message = if attempts.tried().is_empty() {
                    format!(
                        "no node can take a request for model '{}' right now: every node serving it is busy \
                         draining or not connected to this gateway; retry shortly",
                        request.model
                    )
                } else {
                    format!(
                        "no node could take the request for model '{}' ({}); retry shortly",
                        request.model,
                        failures.join("; ")
                    )
                };
                let error = ApiError::no_capacity(message);
                return Err(Box::new(Unrouted { request, error, unknown_model: false }));
            }
        };
        attempts.begin(choice.node);
        let guard = shared.load.enter(choice.node);
        match attempt(shared, &choice, &request, &attempts).await {
            Ok(Attempt { head, recv, written_at }) => {
                if attempts.after(Outcome::Answered(head.status)) == Next::Retry {
                    let detail = error_message(recv).await;
                    let reason = if head.status == 503 { "node_unavailable" } else { "engine_unavailable" };
                    tracing::info!(node = %choice.node, "node {} answered {}: {detail}; retrying on another node", choice.node, head.status);
                    failures.push(format!("node {} answered {}: {detail}", choice.node, head.status));
                    shared.metrics.retries.get_or_create(&crate::metrics::ReasonLabel { reason: reason.into() }).inc();
                    continue;
                }
                let added = written_at.saturating_duration_since(request.ready_at);
                shared.metrics.added.observe(added.as_secs_f64());
                let mut held = std::mem::take(&mut request.held);
                held.push(Box::new(guard));
                return Ok(respond(shared, &request, choice.node, head, recv, added, held));
            }
            Err(failure) => {
                tracing::warn!(node = %choice.node, "request to node {} failed before its response began: {}; retrying on another node", choice.node, failure.detail);
                failures.push(format!("node {}: {}", choice.node, failure.detail));
                shared
                    .metrics
                    .retries
                    .get_or_create(&crate::metrics::ReasonLabel { reason: failure.reason.into() })
                    .inc();
            }
        }
    }
    let message = format!(
        "no node could take the request for model '{}' after {} attempts ({}); retry shortly",
        request.model,
        attempts.tried().len(),
        failures.join("; ")
    );
    Err(Box::new(Unrouted { request, error: ApiError::no_capacity(message), unknown_model: false }))
}

struct Attempt {
    head: ResponseHead,
    recv: RecvStream,
    written_at: Instant,
}

async fn attempt(
    shared: &Shared,
    choice: &Choice,
    request: &ApiRequest,
    attempts: &Attempts,
) -> Result<Attempt, Failure> {
    let conn = &choice.connection;
    let write_timeout = shared.proxy.write_timeout;
    let write = async {
        let (mut send, recv) = conn
            .open_stream()
            .await
            .map_err(|e| Failure { reason: "tunnel", detail: format!("cannot open a stream: {e}") })?;
        let io = |e: std::io::Error| Failure { reason: "tunnel", detail: format!("writing the request failed: {e}") };
        // Head and body in one write: one frame (TCP) or one packet (QUIC) for most requests.
        let mut wire = encode_head(&request.head)
            .map_err(|e| Failure { reason: "tunnel", detail: format!("the request head cannot be sent: {e}") })?;
        wire.extend_from_slice(&request.body);
        send.write_all(&wire).await.map_err(io)?;
        send.shutdown().await.map_err(io)?;
        Ok::<_, Failure>(recv)
    };
    let mut recv = tokio::time::timeout(write_timeout, write).await.map_err(|_| Failure {
        reason: "tunnel",
        detail: format!("the request could not be written within {write_timeout:?}"),
    })??;
    let written_at = Instant::now();
    let accept_timeout = shared.proxy.accept_timeout;
    match tokio::time::timeout(accept_timeout, read_accepted(&mut recv)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(Failure { reason: "tunnel", detail: format!("no response: {e}") }),
        Err(_) => {
            // Silent: a gone process (QUIC sends no reset) or one too busy to answer. Others
            // take the next requests; this one moves on too if anyone else can take it.
            shared.silent.mark(choice.node, conn);
            let view = shared.anchor_view();
            let elsewhere = crate::routing::choose(
                &view,
                &view.snapshot(),
                &shared.load,
                &shared.silent,
                shared.routing,
                request.target(),
                attempts.tried(),
            )
            .is_ok();
            if elsewhere && attempts.left() {
                watch_late_acceptance(shared.silent.clone(), choice.node, conn.clone(), recv);
                return Err(Failure {
                    reason: "unresponsive",
                    detail: format!("the node did not accept the request within {accept_timeout:?}"),
                });
            }
            // Nobody else: keep waiting on this node, as long as the transport keeps it.
            read_accepted(&mut recv)
                .await
                .map_err(|e| Failure { reason: "tunnel", detail: format!("no response: {e}") })?;
            shared.silent.clear(choice.node, conn);
        }
    }
    let head = read_response_head(&mut recv)
        .await
        .map_err(|e| Failure { reason: "tunnel", detail: format!("no response: {e}") })?;
    Ok(Attempt { head, recv, written_at })
}

/// Keeps listening on an abandoned attempt: if the node accepts it after all, it is alive and
/// its connection is no longer [`Silent`](crate::routing::Silent). The stream is then dropped,
/// which tells the node to stop (the request went elsewhere).
fn watch_late_acceptance(silent: crate::routing::Silent, node: NodeId, conn: Connection, mut recv: RecvStream) {
    tokio::spawn(async move {
        tokio::select! {
            accepted = read_accepted(&mut recv) => {
                if accepted.is_ok() {
                    tracing::info!(%node, "node {node} accepted a request late; it takes requests again");
                    silent.clear(node, &conn);
                }
            }
            _ = conn.closed() => {}
        }
    });
}

/// The message of a small error body a node answered with (for logs and the final error).
async fn error_message(mut recv: RecvStream) -> String {
    let mut buf = Vec::new();
    let mut limited = (&mut recv).take(8 * 1024);
    if tokio::time::timeout(Duration::from_secs(2), limited.read_to_end(&mut buf)).await.is_err() {
        return "no error body".into();
    }
    serde_json::from_slice::<serde_json::Value>(&buf)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&buf).chars().take(200).collect())
}

fn respond(
    shared: &Shared,
    request: &ApiRequest,
    node: NodeId,
    head: ResponseHead,
    recv: RecvStream,
    added: Duration,
    held: Vec<Held>,
) -> Response<GatewayBody> {
    let status = StatusCode::from_u16(head.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut builder = Response::builder().status(status);
    let mut shape = BodyShape::default();
    let mut named = false;
    for (name, value) in head.headers {
        let lower = name.to_ascii_lowercase();
        if not_forwarded(lower.as_str()) {
            continue;
        }
        let (Ok(name), Ok(value)) = (HeaderName::from_bytes(lower.as_bytes()), HeaderValue::from_bytes(&value)) else {
            continue;
        };
        if name == CONTENT_LENGTH && request.strip_usage {
            // The body may lose its usage event: its length is not the node's.
            continue;
        }
        shape.note(&name, &value);
        named |= name.as_str() == NODE_HEADER;
        builder = builder.header(name, value);
    }
    if !named {
        builder = builder.header(NODE_HEADER, node.to_string());
    }
    builder = builder.header(GATEWAY_MS_HEADER, format!("{:.3}", added.as_secs_f64() * 1000.0));
    shared.metrics.count(&request.model, status.as_u16());
    let (node_name, sent) = (node.to_string(), status.as_u16());
    let on_end = crate::ledger::on_end(
        shared.metrics.clone(),
        &request.model,
        request.stream,
        request.ready_at,
        request.charge.clone(),
        move |charge: &Charge, end: &Ending| charge.ended(&node_name, sent, end),
    );
    let tap = shape.tap(status.is_success(), request.strip_usage);
    let body = TunnelBody::new(recv, shape.sse && status.is_success(), node.to_string(), held, on_end)
        .with_usage(tap)
        .with_length(shape.length);
    builder.body(GatewayBody::Tunnel(Box::new(body))).unwrap_or_else(|e| {
        ApiError::internal(format!("the node's response head could not be forwarded: {e}")).into_response()
    })
}
