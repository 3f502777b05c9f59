//! Overflow to outside providers, opt-in: when the federation cannot take a request, a key
//! allowed to overflow is served by an OpenAI-compatible provider outside it instead.
//!
//! Each `[[overflow]]` section of `gateway.toml` ([`OverflowSection`]) names a provider: its
//! base URL (what an OpenAI SDK takes as `base_url`, e.g. `https://api.openai.com/v1`), its API
//! key (read once at start from an environment variable or a file; never logged, never in
//! `/status`, redacted in `Debug`, sent only as the provider's `Authorization: Bearer`), and the
//! models it may take. A key overflows only if its key-file line says `overflow=yes`
//! ([`crate::auth`]); a gateway without keys (`--no-auth`) never overflows, since nobody could
//! be charged.
//!
//! # When a request overflows
//!
//! For a key allowed to overflow, asking for a model the first provider listing it takes:
//!
//! - **no node serves the model** (routing's "unknown model"), or none can take it: every
//!   node serving it is draining, unreachable or failed before its first byte (routing's "no
//!   capacity", [`crate::proxy`]), or the cold start of a spinnable model gave up;
//! - **saturation past the bound**: fair queueing ([`crate::fairness`]) gives a model
//!   `fair_slots_per_node` slots per node serving it here. When every slot holds a request, a
//!   request that may overflow waits for a slot at most the provider's `after_wait` (default
//!   `0s`: it does not wait at all) and then goes to the provider, instead of waiting up to
//!   `fair_max_wait` and getting a 429. With fair queueing off (`fair_slots_per_node = 0`) the
//!   gateway does not see saturation, and only the first case overflows.
//!
//! Everything else stays as it was: a key's own limits (429), a model the key may not use
//! (404), a key not allowed to overflow (the usual 404 or 503).
//!
//! # What the provider gets, and what the client gets back
//!
//! The request as the client sent it (its body unchanged, except that a stream asks for its
//! final usage as for engines, [`crate::body::ask_for_usage`]), at `base_url` plus the path
//! after `/v1` (`/v1/chat/completions` goes to `<base_url>/chat/completions`), with the
//! client's end-to-end headers but neither its credentials nor `accept-encoding` (so that the
//! answer's usage can be read), over HTTP/1.1 or HTTPS (the system's roots, plus `ca_cert`),
//! one connection per request. The answer streams back to the client as it arrives, through
//! the same body as a node's ([`crate::body::TunnelBody`]): unbuffered, read for its usage on
//! the way, and a stream cut short ends with an error event. It carries
//! `x-tela-node: overflow:<name>`. A provider that cannot be reached or does not answer within
//! `timeout` gives the client a 502 in OpenAI's error shape, naming the provider and why.
//!
//! # Charging
//!
//! An overflowed request is charged to its key exactly as a node's: its limits and budget
//! learn the provider's token counts, and its ledger row ([`crate::ledger`]) has
//! `node = 'overflow:<name>'` and `provider = '<name>'` (`tela usage --by provider`).
//!
//! `GET /v1/models` lists the overflow models to keys allowed to overflow (within their
//! `models=`), and only to them. `/status` lists the providers (never their keys) with their
//! requests, failures and requests in flight.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::TryStreamExt as _;
use http::header::{HeaderName, HeaderValue, AUTHORIZATION, CONTENT_LENGTH, HOST};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyDataStream, Full};
use hyper::body::Incoming;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::api_error::ApiError;
use crate::body::{BodyShape, Ending, GatewayBody, Held, TunnelBody};
use crate::ledger::Charge;
use crate::metrics::Metrics;

mod provider;

pub use provider::{ApiKey, OverflowSection, Provider, DEFAULT_TIMEOUT};

/// The response header naming who served a request (the same as [`crate::proxy::NODE_HEADER`]).
const NODE_HEADER: &str = "x-tela-node";

/// Request headers never sent to a provider: one hop's, the client's credentials for this
/// gateway, and those the gateway sets itself.
const NOT_SENT: &[&str] = &["authorization", "api-key", "host", "content-length", "accept-encoding"];

/// A provider at work: its TLS client and its counts.
pub struct Outlet {
    /// The provider.
    pub provider: Provider,
    tls: Option<tokio_rustls::TlsConnector>,
    requests: AtomicU64,
    failed: AtomicU64,
    in_flight: Arc<AtomicU64>,
}

impl Outlet {
    /// `overflow:<name>`: what `x-tela-node` and the ledger's `node` say.
    pub fn label(&self) -> String {
        format!("overflow:{}", self.provider.name)
    }
}

/// Why the overflow providers cannot be readied. Nothing has started.
#[derive(Debug, thiserror::Error)]
pub enum OverflowStartError {
    /// A provider's TLS client could not be set up (its `ca_cert`, or no trusted roots).
    #[error("overflow provider '{provider}': {source:#}")]
    Tls {
        /// The provider's name.
        provider: String,
        /// Why.
        #[source]
        source: anyhow::Error,
    },
}

/// Every provider of this gateway.
pub struct Overflow {
    outlets: Vec<Arc<Outlet>>,
}

/// Counts a request in flight at a provider until dropped.
struct InFlight(Arc<AtomicU64>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Overflow {
    /// Readies `providers` (their TLS clients); `None` for none.
    pub fn start(providers: Vec<Provider>) -> Result<Option<Arc<Overflow>>, OverflowStartError> {
        if providers.is_empty() {
            return Ok(None);
        }
        let mut outlets = Vec::with_capacity(providers.len());
        for provider in providers {
            let tls = if provider.https {
                let connector = crate::client_tls::connector(provider.ca_cert.as_deref())
                    .map_err(|source| OverflowStartError::Tls { provider: provider.name.clone(), source })?;
                Some(connector)
            } else {
                None
            };
            tracing::info!("{}", provider.describe());
            outlets.push(Arc::new(Outlet {
                provider,
                tls,
                requests: AtomicU64::new(0),
                failed: AtomicU64::new(0),
                in_flight: Arc::new(AtomicU64::new(0)),
            }));
        }
        Ok(Some(Arc::new(Overflow { outlets })))
    }

    /// The first provider that takes `model`.
    pub fn outlet_for(&self, model: &str) -> Option<&Arc<Outlet>> {
        self.outlets.iter().find(|o| o.provider.models.contains(model))
    }

    /// Every model some provider takes.
    pub fn models(&self) -> BTreeSet<String> {
        self.outlets.iter().flat_map(|o| o.provider.models.iter().cloned()).collect()
    }

    /// The providers for `/status`: never their keys.
    pub fn status_json(&self) -> Value {
        let providers: Vec<Value> = self
            .outlets
            .iter()
            .map(|o| {
                json!({
                    "name": o.provider.name,
                    "base_url": o.provider.base_url,
                    "models": o.provider.models,
                    "after_wait_ms": u64::try_from(o.provider.after_wait.as_millis()).unwrap_or(u64::MAX),
                    "requests": o.requests.load(Ordering::Relaxed),
                    "failed": o.failed.load(Ordering::Relaxed),
                    "in_flight": o.in_flight.load(Ordering::Relaxed),
                })
            })
            .collect();
        Value::Array(providers)
    }
}

/// A request for a provider: what the client sent (headers already without its credentials
/// and hop-by-hop ones) and what must last as long as the answer.
pub struct Outgoing {
    /// The method.
    pub method: String,
    /// The path and query as received (`/v1/chat/completions`).
    pub path_and_query: String,
    /// The client's end-to-end headers.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Bytes,
    /// Its `model`.
    pub model: String,
    /// Its `stream`.
    pub stream: bool,
    /// The gateway asked for the stream's usage and the client did not.
    pub strip_usage: bool,
    /// When its body had been read.
    pub ready_at: Instant,
    /// Released when the answer ends.
    pub held: Vec<Held>,
    /// Told how the answer ended.
    pub charge: Option<Charge>,
}

/// Sends `request` to `outlet`'s provider and streams its answer back (see the module docs).
pub async fn forward(outlet: &Arc<Outlet>, metrics: &Arc<Metrics>, request: Outgoing) -> Response<GatewayBody> {
    let provider = &outlet.provider;
    outlet.requests.fetch_add(1, Ordering::Relaxed);
    outlet.in_flight.fetch_add(1, Ordering::Relaxed);
    let in_flight = InFlight(outlet.in_flight.clone());
    let sent = tokio::time::timeout(provider.timeout, send(outlet, &request)).await;
    let failure = match sent {
        Ok(Ok((response, written_at))) => {
            if response.status().is_server_error() {
                outlet.failed.fetch_add(1, Ordering::Relaxed);
            }
            return respond(outlet, metrics, request, response, written_at, in_flight);
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {}", humantime::format_duration(provider.timeout)),
    };
    outlet.failed.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(provider = %provider.name, "overflow provider '{}' ({}) failed: {failure}", provider.name, provider.base_url);
    let message = format!(
        "no node could take model '{}' and the outside provider '{}' it overflows to failed: {failure}; retry shortly",
        request.model, provider.name
    );
    let error = ApiError {
        status: StatusCode::BAD_GATEWAY,
        kind: "server_error",
        code: "overflow_provider_unavailable",
        message,
        param: None,
        retry_after: Some(1),
    };
    metrics.count(&request.model, error.status.as_u16());
    if let Some(charge) = &request.charge {
        charge.provider_failed(&provider.name, error.status.as_u16());
    }
    error.into_response()
}

/// Why a provider gave no answer head. The request may have reached the provider (after
/// [`SendError::NoAnswer`] it may even have run); the gateway answers the client `502`.
#[derive(Debug, thiserror::Error)]
enum SendError {
    /// The request could not be built from what the client sent.
    #[error("the request cannot be sent: {0}")]
    Request(#[source] http::Error),
    /// No TCP connection to the provider.
    #[error("cannot connect to {host}:{port}: {source}")]
    Connect {
        /// The provider's host.
        host: String,
        /// Its port.
        port: u16,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The provider's host is no name TLS can check.
    #[error("'{host}' is not a valid TLS server name: {source}")]
    ServerName {
        /// The provider's host.
        host: String,
        /// Why.
        #[source]
        source: rustls_pki_types::InvalidDnsNameError,
    },
    /// The TLS handshake failed (certificate, protocol).
    #[error("TLS handshake with {host}:{port} failed: {source}")]
    Tls {
        /// The provider's host.
        host: String,
        /// Its port.
        port: u16,
        /// What TLS said.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP/1 handshake failed.
    #[error("HTTP handshake failed: {0}")]
    Handshake(#[source] hyper::Error),
    /// The request was sent (or partly sent) and no answer head came back.
    #[error("no answer: {0}")]
    NoAnswer(#[source] hyper::Error),
}

/// Connects, sends, and waits for the answer's head; gives the answer and when the request
/// was written.
async fn send(outlet: &Outlet, request: &Outgoing) -> Result<(Response<Incoming>, Instant), SendError> {
    let provider = &outlet.provider;
    let tail = request.path_and_query.strip_prefix("/v1").unwrap_or(&request.path_and_query);
    let mut builder = Request::builder().method(request.method.as_str()).uri(format!("{}{tail}", provider.base_path));
    for (name, value) in &request.headers {
        let lower = name.to_ascii_lowercase();
        if NOT_SENT.contains(&lower.as_str()) || tela_runtime::forward::HOP_BY_HOP.contains(&lower.as_str()) {
            continue;
        }
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(lower.as_bytes()), HeaderValue::from_bytes(value)) {
            builder = builder.header(name, value);
        }
    }
    let authority = match (provider.https, provider.port) {
        (true, 443) | (false, 80) => provider.host.clone(),
        _ if provider.host.contains(':') => format!("[{}]:{}", provider.host, provider.port),
        _ => format!("{}:{}", provider.host, provider.port),
    };
    builder = builder.header(HOST, authority).header(CONTENT_LENGTH, request.body.len());
    if let Some(bearer) = provider.key.as_ref().and_then(ApiKey::bearer) {
        builder = builder.header(AUTHORIZATION, bearer);
    }
    let http_request = builder.body(Full::new(request.body.clone())).map_err(SendError::Request)?;
    let (host, port) = (provider.host.as_str(), provider.port);
    let tcp = tokio::net::TcpStream::connect((host, port)).await.map_err(|source| SendError::Connect {
        host: host.to_string(),
        port,
        source,
    })?;
    let _ = tcp.set_nodelay(true);
    match &outlet.tls {
        None => exchange(tcp, http_request).await,
        Some(tls) => {
            let name = rustls_pki_types::ServerName::try_from(host.to_string())
                .map_err(|source| SendError::ServerName { host: host.to_string(), source })?;
            let stream = tls.connect(name, tcp).await.map_err(|source| SendError::Tls {
                host: host.to_string(),
                port,
                source,
            })?;
            exchange(stream, http_request).await
        }
    }
}

async fn exchange<S>(io: S, request: Request<Full<Bytes>>) -> Result<(Response<Incoming>, Instant), SendError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io)).await.map_err(SendError::Handshake)?;
    // The connection's own task: it ends when the answer's body has been read or dropped.
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("overflow connection ended: {e}");
        }
    });
    let written_at = Instant::now();
    let response = sender.send_request(request).await.map_err(SendError::NoAnswer)?;
    Ok((response, written_at))
}

fn respond(
    outlet: &Outlet,
    metrics: &Arc<Metrics>,
    request: Outgoing,
    response: Response<Incoming>,
    written_at: Instant,
    in_flight: InFlight,
) -> Response<GatewayBody> {
    let (parts, body) = response.into_parts();
    let status = parts.status;
    let mut builder = Response::builder().status(status);
    let mut shape = BodyShape::default();
    for (name, value) in &parts.headers {
        let lower = name.as_str();
        if tela_runtime::forward::HOP_BY_HOP.contains(&lower) || lower == NODE_HEADER {
            continue;
        }
        if name == CONTENT_LENGTH && request.strip_usage {
            // The body may lose its usage event: its length is not the provider's.
            continue;
        }
        shape.note(name, value);
        builder = builder.header(name, value);
    }
    let label = outlet.label();
    let added = written_at.saturating_duration_since(request.ready_at);
    builder = builder
        .header(NODE_HEADER, label.as_str())
        .header("x-tela-gateway-ms", format!("{:.3}", added.as_secs_f64() * 1000.0));
    metrics.count(&request.model, status.as_u16());
    let (provider, sent) = (outlet.provider.name.clone(), status.as_u16());
    let on_end = crate::ledger::on_end(
        metrics.clone(),
        &request.model,
        request.stream,
        request.ready_at,
        request.charge.clone(),
        move |charge: &Charge, end: &Ending| charge.overflowed(&provider, sent, end),
    );
    let tap = shape.tap(status.is_success(), request.strip_usage);
    let reader = tokio_util::io::StreamReader::new(BodyDataStream::new(body).map_err(std::io::Error::other));
    let mut held = request.held;
    held.push(Box::new(in_flight));
    let body = TunnelBody::new(reader, shape.sse && status.is_success(), label, held, on_end)
        .with_usage(tap)
        .with_length(if request.strip_usage { None } else { shape.length });
    builder.body(GatewayBody::Tunnel(Box::new(body))).unwrap_or_else(|e| {
        ApiError::internal(format!("the overflow provider's response head could not be forwarded: {e}")).into_response()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_provider_listing_a_model_takes_it() {
        let p = |name: &str, models: &str| {
            let text = format!("name = \"{name}\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [{models}]");
            let section: OverflowSection = toml::from_str(&text).expect("a section");
            Provider::resolve(&section, 0, &|_| None).expect("valid")
        };
        let overflow =
            Overflow::start(vec![p("a", "\"m1\""), p("b", "\"m1\", \"m2\"")]).expect("starts").expect("some");
        assert_eq!(overflow.outlet_for("m1").map(|o| o.label()), Some("overflow:a".to_string()));
        assert_eq!(overflow.outlet_for("m2").map(|o| o.provider.name.clone()), Some("b".to_string()));
        assert!(overflow.outlet_for("m3").is_none());
        assert_eq!(overflow.models().into_iter().collect::<Vec<_>>(), ["m1", "m2"]);
        let status = overflow.status_json();
        assert_eq!(status[1]["name"], "b");
        assert_eq!(status[0]["requests"], 0);
        assert!(Overflow::start(Vec::new()).expect("nothing to start").is_none());
    }
}
