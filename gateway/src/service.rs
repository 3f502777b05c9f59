//! The HTTP service: which path does what, who may call it, and the limits every API request
//! passes before it is forwarded.
//!
//! | path | auth | what |
//! |---|---|---|
//! | `POST /v1/chat/completions`, `/v1/completions`, `/v1/embeddings` | key | forwarded to a node ([`crate::proxy`]) |
//! | `GET /v1/models`, `/v1/models/{id}` | key | every model some node serves, OpenAI list shape |
//! | `/v1/files…`, `/v1/batches…` | key | OpenAI's Batch API ([`crate::batch::api`]) |
//! | `POST` any other `/v1/…` naming a `model` in its JSON or form | key | forwarded unchanged like the above: `/v1/responses`, `/v1/audio/transcriptions` (multipart), `/v1/images/generations`, `/v1/rerank`, whatever the engines serve |
//! | `GET /status` | key, unless `--open-status` | the federation as JSON ([`crate::status`]) |
//! | `GET /metrics` | key, unless `--open-status` | Prometheus text ([`crate::metrics`]) |
//! | `GET /health` | none | `{"status":"ok"}` and counts, nothing secret |
//! | `GET /` | none | the dashboard page (it fetches `/status` with the key it is given) |
//!
//! Order of checks for an API request: the key (401), the concurrency limit (429), the declared
//! and then the actual body size (413) and the body's arrival time (408), the JSON (or the
//! multipart form) and its `model` (400), whether the key may use that model (the same 404 as a model nobody serves,
//! listing only the key's models) and the key's own limits (429, [`crate::limits`]), then
//! routing (404 for a model nobody serves, 503 when no node can take it). Every `/v1/` response
//! to a key with rate limits carries OpenAI's `x-ratelimit-*` headers; a key limited to some
//! models sees only those in `/v1/models`, and may not read `/status` or `/metrics` (403),
//! which name every model.
//! When every slot of the model's nodes is taken, a request waits its key's turn
//! ([`crate::fairness`]: per-key queues served by deficit round robin; 429 when the key's queue
//! is full). A request for a spinnable model with no usable replica first waits in the cold-start queue
//! ([`crate::spin::cold_start`]): 503 with `Retry-After` when no replica came in time, 429 when
//! the queue is full.
//!
//! For a key allowed to overflow (`overflow=yes`) and a model an `[[overflow]]` provider takes,
//! a request the federation cannot take — no node serves the model, none can take it, or the
//! model is saturated past the provider's `after_wait` — goes to that provider instead of the
//! 404, 503 or 429 ([`crate::overflow`]); such a key also sees the provider's models in
//! `/v1/models`.
//!
//! Every inference request that named a model is accounted once it ends ([`crate::ledger`]):
//! per-key and per-model counters, the key's limits corrected to the engine's token counts,
//! and a row in the usage ledger when the gateway keeps one. A streamed request whose client
//! did not ask for the final usage is forwarded asking for it, and the usage is taken out of
//! what the client receives ([`crate::body`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use tela_core::routing::RoutingPolicy;
use tela_runtime::RuntimeView;
use tokio::sync::Semaphore;

use crate::api_error::ApiError;
use crate::auth::{Access, Caller, ModelScope};
use crate::body::{GatewayBody, Held};
use crate::ledger::Charge;
use crate::metrics::Metrics;
use crate::proxy::{ApiRequest, ProxySettings};
use crate::routing::NodeLoad;

/// Limits against clients that send too much or too slowly.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The largest request body accepted (413 above).
    pub max_body_bytes: usize,
    /// The longest a request's headers may take to arrive (the connection is closed after).
    pub header_timeout: Duration,
    /// The longest a request's body may take to arrive (408 after).
    pub body_timeout: Duration,
    /// API requests served at once (429 above).
    pub max_concurrent: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 4 * 1024 * 1024,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_concurrent: 1024,
        }
    }
}

/// What every request handler shares.
pub struct Shared {
    pub(crate) view: RuntimeView,
    pub(crate) load: NodeLoad,
    pub(crate) silent: crate::routing::Silent,
    /// How a node is picked among a model's candidates.
    pub(crate) routing: RoutingPolicy,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) access: Access,
    pub(crate) open_status: bool,
    pub(crate) limits: Limits,
    pub(crate) proxy: ProxySettings,
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) started: Instant,
    /// Spinning and the cold-start queue, when the gateway spins models.
    pub(crate) spin: Option<Arc<crate::spin::SpinShared>>,
    /// Where each request's row goes, when the gateway keeps a usage ledger.
    pub(crate) ledger: Option<crate::ledger::Ledger>,
    /// Keys' fair shares of saturated models ([`crate::fairness`]).
    pub(crate) fair: Arc<crate::fairness::FairShare>,
    /// Batch inference's database and runner wake-up, when the gateway runs batches.
    pub(crate) batch: Option<Arc<crate::batch::BatchShared>>,
    /// Outside providers, when the gateway has `[[overflow]]` sections.
    pub(crate) overflow: Option<Arc<crate::overflow::Overflow>>,
}

impl Shared {
    /// Shared state over the embedded anchor's `view`.
    pub fn new(
        view: RuntimeView,
        metrics: Arc<Metrics>,
        access: Access,
        open_status: bool,
        limits: Limits,
        proxy: ProxySettings,
    ) -> Shared {
        Shared {
            load: NodeLoad::new(metrics.in_flight.clone()),
            silent: crate::routing::Silent::default(),
            routing: RoutingPolicy::default(),
            view,
            metrics,
            access,
            open_status,
            permits: Arc::new(Semaphore::new(limits.max_concurrent)),
            limits,
            proxy,
            started: Instant::now(),
            spin: None,
            ledger: None,
            fair: crate::fairness::FairShare::new(crate::fairness::FairSettings::default()),
            batch: None,
            overflow: None,
        }
    }

    /// The provider `caller`'s request for `model` would overflow to, if the caller may
    /// overflow and a provider takes the model.
    pub(crate) fn outlet_for(&self, caller: &Caller, model: &str) -> Option<Arc<crate::overflow::Outlet>> {
        if !caller.may_overflow() || !caller.models().allows(model) {
            return None;
        }
        self.overflow.as_ref()?.outlet_for(model).cloned()
    }

    pub(crate) fn anchor_view(&self) -> RuntimeView {
        self.view.clone()
    }

    pub(crate) fn answer_error(&self, error: ApiError, model: &str) -> Response<GatewayBody> {
        self.metrics.count(model, error.status.as_u16());
        error.into_response()
    }
}

/// The fields of an API request body the gateway reads; the rest passes through unread.
#[derive(Deserialize, Default)]
struct Peek<'a> {
    #[serde(borrow, default)]
    model: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
    /// A chat request's messages, read into the [`Prefix`](tela_core::routing::Prefix) routing keys on.
    #[serde(default)]
    messages: Option<crate::routing::Messages>,
    /// A completions request's prompt, likewise.
    #[serde(default)]
    prompt: Option<crate::routing::Prompt>,
    /// Whether the client asked for a stream's final usage itself.
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

/// `stream_options` of a request.
#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// Serves one request.
pub async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Response<GatewayBody>, Infallible> {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = match (path.as_str(), &method) {
        ("/", &Method::GET) | ("/index.html", &Method::GET) => crate::dashboard::page(),
        ("/health", &Method::GET) => crate::status::health(&shared),
        ("/status", &Method::GET) => match authorize_status(&shared, &request) {
            Ok(()) => crate::status::status(&shared),
            Err(e) => e.into_response(),
        },
        ("/metrics", &Method::GET) => match authorize_status(&shared, &request) {
            Ok(()) => metrics(&shared),
            Err(e) => e.into_response(),
        },
        (p, m) if p.starts_with("/v1/") => match authorize(&shared, &request) {
            Err(e) => shared.answer_error(e, "-"),
            Ok(mut caller) => {
                let mut response = match (p, m) {
                    ("/v1/chat/completions" | "/v1/completions" | "/v1/embeddings", &Method::POST) => {
                        api(&shared, request, &mut caller).await
                    }
                    ("/v1/chat/completions" | "/v1/completions" | "/v1/embeddings", _) => {
                        ApiError::method_not_allowed(m, p, "POST").into_response()
                    }
                    (p, _) if crate::batch::api::serves(p) => {
                        crate::batch::api::handle(&shared, request, &caller).await
                    }
                    ("/v1/models", &Method::GET) => models_for(&shared, &caller),
                    (p, &Method::GET) if p.starts_with("/v1/models/") => {
                        model_for(&shared, &caller, &p["/v1/models/".len()..])
                    }
                    // Every other OpenAI route names its model in the body (JSON or a form):
                    // Responses, audio, images, rerank, whatever the engines serve.
                    (p, &Method::POST) if !p.starts_with("/v1/models") => api(&shared, request, &mut caller).await,
                    _ => ApiError::no_such_path(m, p).into_response(),
                };
                caller.stamp(response.headers_mut());
                response
            }
        },
        ("/" | "/health" | "/status" | "/metrics", m) => ApiError::method_not_allowed(m, &path, "GET").into_response(),
        (p, m) => ApiError::no_such_path(m, p).into_response(),
    };
    Ok(response)
}

fn authorize(shared: &Shared, request: &Request<Incoming>) -> Result<Caller, ApiError> {
    let headers = request.headers();
    shared
        .access
        .check(headers.get("authorization").map(|h| h.as_bytes()), headers.get("api-key").map(|h| h.as_bytes()))
        .map_err(ApiError::unauthorized)
}

fn authorize_status(shared: &Shared, request: &Request<Incoming>) -> Result<(), ApiError> {
    if shared.open_status {
        return Ok(());
    }
    match authorize(shared, request)?.models() {
        ModelScope::All => Ok(()),
        // The federation's page names every model, which such a key must not learn.
        ModelScope::Only(_) => Err(ApiError::forbidden(
            "this key may use only some models, and the status of the federation names them all; \
             use a key with models=* (or ask the operator for --open-status)",
        )),
    }
}

fn metrics(shared: &Shared) -> Response<GatewayBody> {
    crate::status::refresh_node_gauges(shared);
    let mut response = Response::new(GatewayBody::full(shared.metrics.encode()));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"));
    response
}

/// The `model` and `stream` fields of a `multipart/form-data` request (audio transcriptions,
/// image edits): the form passes on unchanged.
fn peek_form(content_type: &str, body: &[u8]) -> Result<Peek<'static>, ApiError> {
    use crate::batch::multipart;
    let bad = |e: multipart::MultipartError| ApiError::bad_request("invalid_multipart", e.to_string());
    let parts = multipart::parse(body, &multipart::boundary(content_type).map_err(bad)?).map_err(bad)?;
    let text = |name: &str| {
        parts
            .iter()
            .find(|p| p.name == name && p.filename.is_none())
            .map(|p| String::from_utf8_lossy(p.data).trim().to_string())
    };
    Ok(Peek {
        model: text("model").map(std::borrow::Cow::Owned),
        stream: text("stream").map(|s| s.eq_ignore_ascii_case("true")),
        ..Peek::default()
    })
}

/// An inference request: limits, the cheap parse, then forwarding.
async fn api(shared: &Shared, request: Request<Incoming>, caller: &mut Caller) -> Response<GatewayBody> {
    let (arrived, started) = (SystemTime::now(), Instant::now());
    let Ok(permit) = shared.permits.clone().try_acquire_owned() else {
        return shared.answer_error(ApiError::overloaded(shared.limits.max_concurrent), "-");
    };
    let (parts, body) = request.into_parts();
    let max = shared.limits.max_body_bytes;
    let declared = parts.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return shared.answer_error(ApiError::too_large(max), "-");
    }
    let body = match read_body(body, max, shared.limits.body_timeout).await {
        Ok(b) => b,
        Err(e) => return shared.answer_error(e, "-"),
    };
    let ready_at = Instant::now();
    let content_type = parts.headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let form = content_type.trim_start().get(..19).is_some_and(|t| t.eq_ignore_ascii_case("multipart/form-data"));
    let peek: Peek<'_> = if form {
        match peek_form(content_type, &body) {
            Ok(p) => p,
            Err(e) => return shared.answer_error(e, "-"),
        }
    } else {
        match serde_json::from_slice(&body) {
            Ok(p) => p,
            Err(e) => {
                return shared.answer_error(
                    ApiError::bad_request("invalid_json", format!("the request body is not valid JSON: {e}")),
                    "-",
                )
            }
        }
    };
    let Some(model) = peek.model.filter(|m| !m.is_empty()).map(|m| m.into_owned()) else {
        return shared
            .answer_error(ApiError::bad_param("model", "the request has no 'model'; name one of GET /v1/models"), "-");
    };
    let stream = peek.stream.unwrap_or(false);
    let path = parts.uri.path();
    let asked = crate::ledger::Asked { model: model.clone(), endpoint: path.to_string(), stream, arrived, started };
    let payer = caller.entry().map(|entry| crate::ledger::Payer {
        key: entry.name.clone(),
        hash: crate::ledger::key_hash(
            parts.headers.get("authorization").map(|h| h.as_bytes()),
            parts.headers.get("api-key").map(|h| h.as_bytes()),
        ),
        account: entry.account.clone(),
    });
    let charge = |settlement| {
        Charge::new(shared.metrics.clone(), shared.ledger.clone(), payer.clone(), asked.clone(), settlement)
    };
    // A form (audio, image edits) is estimated by its completion alone: its file's bytes are
    // not tokens.
    let estimated = |body: &Bytes| -> Bytes {
        if form {
            Bytes::from_static(b"{}")
        } else {
            body.clone()
        }
    };
    let key_guard = match admit_key(shared, caller, &model, path, &estimated(&body)) {
        Ok(guard) => guard,
        Err(refused) => {
            charge(None).refused(refused.status().as_u16());
            return *refused;
        }
    };
    let generates = matches!(path, "/v1/chat/completions" | "/v1/completions");
    let asked_usage = peek.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);
    // Messages win over a prompt; a request with neither keys on nothing (least-loaded).
    let prefix = [peek.messages.map(|m| m.0), peek.prompt.map(|p| p.0)]
        .into_iter()
        .flatten()
        .find(|p| p.key().is_some())
        .unwrap_or_default();
    // Asked of the engine, so that the stream's tokens are counted (see the module docs).
    let with_usage = (stream && generates && !asked_usage).then(|| crate::body::ask_for_usage(&body)).flatten();
    let strip_usage = with_usage.is_some();
    let body = with_usage.unwrap_or(body);
    let mut held: Vec<Held> = vec![Box::new(permit)];
    let settlement = key_guard.as_ref().map(|g| g.settlement());
    let charge = charge(settlement.clone());
    held.extend(key_guard.map(|g| Box::new(g) as Held));
    let outlet = shared.outlet_for(caller, &model);
    // Why the request goes to the outside provider before any node is tried, if it does.
    let mut overflow_now: Option<String> = None;
    if let Some(spin) = shared.spin.as_ref().filter(|s| s.is_spinnable(&model)) {
        if let Err(e) = crate::spin::cold_start::admit(shared, spin, &model).await {
            if outlet.is_some() {
                overflow_now = Some(format!("the cold start gave up: {}", e.message));
            } else {
                let response = shared.answer_error(e, &model);
                charge.refused(response.status().as_u16());
                return response;
            }
        }
        if let Some(guard) = spin.demand.enter(&model) {
            held.push(Box::new(guard));
        }
    }
    let estimated = estimated(&body);
    let flow = caller.entry().map_or_else(|| "-".to_string(), |e| e.name.clone());
    let nodes = crate::fairness::nodes_serving(&shared.view, &model);
    if overflow_now.is_none() {
        let cost = || crate::limits::estimate_tokens(path, &estimated);
        let entered = match &outlet {
            // Saturated past the provider's bound: it overflows (see crate::overflow).
            Some(o) => shared.fair.enter_within(&model, &flow, nodes, cost, o.provider.after_wait).await,
            None => shared.fair.enter(&model, &flow, nodes, cost).await,
        };
        match entered {
            Ok(Some(slot)) => held.push(Box::new(slot)),
            Ok(None) => {}
            Err(e) if outlet.is_some() => overflow_now = Some(format!("the model is saturated: {}", e.message)),
            Err(e) => {
                let labels = crate::metrics::KeyLimitLabels { key: flow, limit: "fair_queue".to_string() };
                shared.metrics.key_refusals.get_or_create(&labels).inc();
                let response = shared.answer_error(e, &model);
                charge.refused(response.status().as_u16());
                return response;
            }
        }
    }
    let model_name = model.clone();
    let mut head = crate::proxy::tunnel_head(&parts);
    if strip_usage {
        // The body grew: the node passes the client's headers on to the engine.
        for (_, value) in head.headers.iter_mut().filter(|(name, _)| name == "content-length") {
            *value = body.len().to_string().into_bytes();
        }
    }
    let request =
        ApiRequest { head, body, model, prefix, stream, ready_at, held, charge: Some(charge.clone()), strip_usage };
    let routed_at = Instant::now();
    let response = match (outlet, overflow_now) {
        (None, _) => crate::proxy::forward(shared, request).await,
        (Some(outlet), Some(why)) => overflow(shared, &outlet, &flow, request, &why).await,
        (Some(outlet), None) => match crate::proxy::try_forward(shared, request).await {
            Ok(response) => response,
            Err(unrouted) => overflow(shared, &outlet, &flow, unrouted.request, &unrouted.error.message).await,
        },
    };
    let tunnelled = matches!(response.body(), GatewayBody::Tunnel(_));
    if let Some(settlement) = settlement {
        // A node answered: the key's tokens are spent (they are refunded otherwise).
        if response.status().is_success() && tunnelled {
            settlement.answered();
        }
    }
    if !tunnelled {
        charge.refused(response.status().as_u16());
    }
    let overflowed =
        response.headers().get(crate::proxy::NODE_HEADER).is_some_and(|v| v.as_bytes().starts_with(b"overflow:"));
    if let Some(spin) = shared.spin.as_ref().filter(|_| !overflowed) {
        spin.demand.first_byte(&model_name, routed_at.elapsed());
    }
    response
}

/// Sends `request`, which the federation could not take (`why`), to the outside provider of
/// `outlet` ([`crate::overflow`]).
async fn overflow(
    shared: &Shared,
    outlet: &Arc<crate::overflow::Outlet>,
    key: &str,
    request: ApiRequest,
    why: &str,
) -> Response<GatewayBody> {
    tracing::info!(
        provider = %outlet.provider.name,
        "key '{key}': model '{}' overflows to the outside provider '{}': {why}",
        request.model,
        outlet.provider.name
    );
    let outgoing = crate::overflow::Outgoing {
        method: request.head.method,
        path_and_query: request.head.path_and_query,
        headers: request.head.headers,
        body: request.body,
        model: request.model,
        stream: request.stream,
        strip_usage: request.strip_usage,
        ready_at: request.ready_at,
        held: request.held,
        charge: request.charge,
    };
    crate::overflow::forward(outlet, &shared.metrics, outgoing).await
}

async fn read_body(body: Incoming, max: usize, timeout: Duration) -> Result<Bytes, ApiError> {
    match tokio::time::timeout(timeout, Limited::new(body, max).collect()).await {
        Err(_) => Err(ApiError::body_timeout(timeout)),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(ApiError::too_large(max)),
        Ok(Err(e)) => Err(ApiError {
            status: StatusCode::BAD_REQUEST,
            ..ApiError::bad_request("body_read_failed", format!("the request body could not be read: {e}"))
        }),
    }
}

/// A key's checks on an inference request for `model`: the key may use the model (else the
/// same 404 as a model nobody serves, naming only the key's models) and is within its limits
/// (else 429). Gives the guard the response must hold, if the key has limits.
fn admit_key(
    shared: &Shared,
    caller: &mut Caller,
    model: &str,
    path: &str,
    body: &[u8],
) -> Result<Option<crate::limits::KeyGuard>, Box<Response<GatewayBody>>> {
    let scope = caller.models();
    if let ModelScope::Only(_) = scope {
        let served = crate::routing::models(&shared.view.snapshot());
        let spinnable = shared.spin.as_ref().is_some_and(|s| s.is_spinnable(model));
        let overflows = shared.outlet_for(caller, model).is_some();
        if !scope.allows(model) || !(spinnable || overflows || served.iter().any(|m| m == model)) {
            let visible: Vec<String> = served.into_iter().filter(|m| scope.allows(m)).collect();
            return Err(Box::new(shared.answer_error(ApiError::unknown_model(model, &visible), "unknown")));
        }
    }
    caller.admit(|| crate::limits::estimate_tokens(path, body), crate::limits::Now::current()).map_err(|refusal| {
        let key = caller.entry().map_or_else(String::new, |e| e.name.clone());
        let labels = crate::metrics::KeyLimitLabels { key, limit: refusal.limit.to_string() };
        shared.metrics.key_refusals.get_or_create(&labels).inc();
        Box::new(shared.answer_error(refusal.error, "-"))
    })
}

/// The models `caller` may see: those some routable node serves, the spinnable ones, and,
/// if it may overflow, those of the outside providers.
fn models_in_scope(shared: &Shared, caller: &Caller) -> Vec<String> {
    let mut names = crate::routing::models(&shared.view.snapshot());
    if let Some(spin) = &shared.spin {
        names.extend(spin.models().cloned());
    }
    if let Some(overflow) = shared.overflow.as_ref().filter(|_| caller.may_overflow()) {
        names.extend(overflow.models());
    }
    names.sort();
    names.dedup();
    names.retain(|m| caller.models().allows(m));
    names
}

/// Whether `caller` sees the federation's model list as `/status` does: every model, and no
/// outside provider's.
fn sees_the_federation(shared: &Shared, caller: &Caller) -> bool {
    matches!(caller.models(), ModelScope::All) && (shared.overflow.is_none() || !caller.may_overflow())
}

fn model_object(name: &str) -> serde_json::Value {
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    serde_json::json!({"id": name, "object": "model", "created": created, "owned_by": "tela"})
}

fn json_response(value: &serde_json::Value) -> Response<GatewayBody> {
    let mut response = Response::new(GatewayBody::full(value.to_string()));
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// `GET /v1/models`, listing only the models the caller's key may use.
fn models_for(shared: &Shared, caller: &Caller) -> Response<GatewayBody> {
    if sees_the_federation(shared, caller) {
        return crate::status::models(shared);
    }
    let data: Vec<serde_json::Value> = models_in_scope(shared, caller).iter().map(|m| model_object(m)).collect();
    shared.metrics.count("-", 200);
    json_response(&serde_json::json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}`: a model the caller's key may not use is not found, as at OpenAI.
fn model_for(shared: &Shared, caller: &Caller, id: &str) -> Response<GatewayBody> {
    if sees_the_federation(shared, caller) {
        return crate::status::model(shared, id);
    }
    let known = models_in_scope(shared, caller);
    if known.iter().any(|m| m == id) {
        json_response(&model_object(id))
    } else {
        shared.answer_error(ApiError::unknown_model(id, &known), "unknown")
    }
}
