//! The HTTP face of the simulator: routing, request bodies, and the answer of each endpoint.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};

use super::generate::{count_tokens, embed, generate};
use super::metrics;
use super::openai::{
    completion_body, embeddings_body, model_body, parse_chat, parse_completion, parse_embeddings, ApiError, Endpoint,
    ResponseMeta, Usage,
};
use super::routes::Other;
use super::stream::{StreamCut, StreamPlan, TokenStream};
use super::{unix_now, Counters, FailMode, InFlight, Shared};

/// Every response body: a complete JSON document or a token stream.
pub(crate) type ResponseBody = BoxBody<Bytes, StreamCut>;

/// The service error that makes hyper close the connection without answering.
#[derive(Debug, thiserror::Error)]
#[error("simulated engine failure: connection dropped on purpose (--fail-mode drop)")]
pub(crate) struct DropConnection;

/// Request bodies larger than this get `413`.
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Health,
    Metrics,
    Models,
    Model(String),
    Generation(Endpoint),
    Embeddings,
    Other(Other),
}

impl Route {
    /// The route for `path` and the one method it accepts.
    fn of(path: &str) -> Option<(Route, &'static str)> {
        let route = match path {
            "/health" => (Route::Health, "GET"),
            "/metrics" => (Route::Metrics, "GET"),
            "/v1/models" => (Route::Models, "GET"),
            "/v1/chat/completions" => (Route::Generation(Endpoint::Chat), "POST"),
            "/v1/completions" => (Route::Generation(Endpoint::Completion), "POST"),
            "/v1/embeddings" => (Route::Embeddings, "POST"),
            p if Other::of(p).is_some() => (Route::Other(Other::of(p)?), "POST"),
            _ => match path.strip_prefix("/v1/models/") {
                Some(id) if !id.is_empty() => (Route::Model(id.to_owned()), "GET"),
                _ => return None,
            },
        };
        Some(route)
    }
}

/// Answers one request. `Err` closes the connection without an answer (a `drop` fault).
pub(crate) async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<ResponseBody>, DropConnection> {
    let in_flight = InFlight::enter(&shared);
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    // A serial engine answers one request at a time: wait for the one before to finish, and
    // hold the turn until this response's last byte (the body owns it).
    let turn = if shared.config.serial {
        // `ok()`: the semaphore is never closed.
        Arc::clone(&shared.serial).acquire_owned().await.ok()
    } else {
        None
    };
    let mut result = respond(&shared, request, in_flight).await;
    if let (Some(turn), Ok(response)) = (turn, &mut result) {
        let body = std::mem::replace(response.body_mut(), full_body(Bytes::new()));
        *response.body_mut() = HoldsTurn { body, _turn: turn }.boxed();
    }
    match &result {
        Ok(response) => tracing::debug!(%method, %path, status = response.status().as_u16()),
        Err(e) => tracing::debug!(%method, %path, "{e}"),
    }
    result
}

async fn respond(
    shared: &Arc<Shared>,
    request: Request<Incoming>,
    in_flight: InFlight,
) -> Result<Response<ResponseBody>, DropConnection> {
    let path = request.uri().path();
    let Some((route, allowed)) = Route::of(path) else {
        return Ok(error_response(&ApiError::unknown_path(request.method().as_str(), path)));
    };
    if request.method().as_str() != allowed {
        return Ok(error_response(&ApiError::method_not_allowed(request.method().as_str(), path, allowed)));
    }
    if !shared.is_ready() {
        return Ok(error_response(&ApiError::loading()));
    }
    let config = &shared.config;
    Ok(match route {
        Route::Health => json_response(StatusCode::OK, &json!({"status": "ok"})),
        Route::Metrics => {
            let text = metrics::render(&shared.scheduler.snapshot());
            let body = Full::new(Bytes::from(text)).map_err(|never| match never {}).boxed();
            let mut response = Response::new(body);
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(metrics::CONTENT_TYPE));
            response
        }
        Route::Models => {
            let data: Vec<Value> = config.models.iter().map(|id| model_body(id, shared.created)).collect();
            json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
        }
        Route::Model(id) if config.models.contains(&id) => {
            json_response(StatusCode::OK, &model_body(&id, shared.created))
        }
        Route::Model(id) => error_response(&ApiError::model_not_found(&id, &config.models)),
        Route::Generation(endpoint) => return generation(shared, request, endpoint, in_flight).await,
        Route::Embeddings => return embeddings(shared, request).await,
        Route::Other(other) => {
            let content_type =
                request.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
            match read_bytes(request).await {
                Ok(body) => super::routes::answer(shared, other, &content_type, body).await,
                Err(e) => error_response(&e),
            }
        }
    })
}

/// A response body that keeps a serial engine's turn until hyper drops it (after the last
/// byte, or when the client went away).
struct HoldsTurn {
    body: ResponseBody,
    _turn: tokio::sync::OwnedSemaphorePermit,
}

impl hyper::body::Body for HoldsTurn {
    type Data = Bytes;
    type Error = StreamCut;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, StreamCut>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// Reads a body of at most [`MAX_BODY_BYTES`]; any failure is the client's 4xx.
async fn read_bytes(request: Request<Incoming>) -> Result<Bytes, ApiError> {
    match Limited::new(request.into_body(), MAX_BODY_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::body_too_large(MAX_BODY_BYTES)),
        Err(e) => Err(ApiError::invalid_request(format!("could not read the request body: {e}"))),
    }
}

/// Reads and parses a JSON body; any failure is the client's 4xx.
async fn read_json(request: Request<Incoming>) -> Result<Value, ApiError> {
    let bytes = read_bytes(request).await?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid_request(format!("the request body is not valid JSON: {e}")))
}

/// Applies a drawn fault that ends the request before any answer byte.
fn early_fault(fault: Option<FailMode>, streams: bool) -> Result<(), FaultAnswer> {
    match fault {
        None => Ok(()),
        Some(FailMode::MidStream) if streams => Ok(()),
        Some(FailMode::Drop) => {
            tracing::info!("injecting fault: dropping the connection");
            Err(FaultAnswer::Drop)
        }
        Some(FailMode::Http500 | FailMode::MidStream) => {
            tracing::info!("injecting fault: answering 500");
            Err(FaultAnswer::ServerError)
        }
    }
}

enum FaultAnswer {
    Drop,
    ServerError,
}

impl FaultAnswer {
    fn into_result(self) -> Result<Response<ResponseBody>, DropConnection> {
        match self {
            FaultAnswer::Drop => Err(DropConnection),
            FaultAnswer::ServerError => Ok(error_response(&ApiError::simulated_failure())),
        }
    }
}

async fn generation(
    shared: &Arc<Shared>,
    request: Request<Incoming>,
    endpoint: Endpoint,
    in_flight: InFlight,
) -> Result<Response<ResponseBody>, DropConnection> {
    let config = &shared.config;
    let parsed = match read_json(request).await {
        Ok(body) => match endpoint {
            Endpoint::Chat => parse_chat(body, config),
            Endpoint::Completion => parse_completion(body, config),
        },
        Err(e) => Err(e),
    };
    let request = match parsed {
        Ok(request) => request,
        Err(e) => return Ok(error_response(&e)),
    };
    let fault = shared.draw_fault();
    if let Err(answer) = early_fault(fault, request.stream) {
        return answer.into_result();
    }

    let generation = generate(config.seed, &request.prompt, request.max_tokens);
    // What follows the prompt in the sequence the engine caches: a chat's next turn resends the
    // answer as `assistant: <answer>` (see openai::parse_chat), a completion's continues it.
    let answer = match endpoint {
        Endpoint::Chat => format!("assistant: {}", generation.text()),
        Endpoint::Completion => generation.text(),
    };
    let model = shared.model_index(&request.model);
    let admitted = shared.scheduler.admit(model, &request.prompt, &answer, generation.token_count()).await;
    let usage = Usage {
        prompt_tokens: admitted.prefill.prompt_tokens,
        completion_tokens: generation.token_count(),
        cached_tokens: admitted.prefill.cached_tokens,
    };
    let meta = ResponseMeta {
        id: shared.request_id(match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        }),
        created: unix_now(),
        model: request.model,
    };
    let first_token_at = admitted.first_token_at;
    let interval = config.token_interval();

    if request.stream {
        let body = TokenStream::new(
            StreamPlan {
                endpoint,
                meta,
                generation,
                usage,
                include_usage: request.include_usage,
                first_token_at,
                interval,
                cut: fault == Some(FailMode::MidStream),
            },
            in_flight,
            admitted.running,
        );
        let mut response = Response::new(body.boxed());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok(response);
    }

    // A non-stream answer arrives when its last token would have been generated.
    let tokens = generation.tokens.len();
    let steps = u32::try_from(tokens.saturating_sub(1)).unwrap_or(u32::MAX);
    tokio::time::sleep_until(first_token_at + interval.saturating_mul(steps)).await;
    Counters::bump(&shared.counters.tokens_generated, tokens as u64);
    admitted.running.generated(tokens as u64);
    Counters::bump(&shared.counters.completed, 1);
    Ok(json_response(StatusCode::OK, &completion_body(endpoint, &meta, &generation, usage)))
}

async fn embeddings(
    shared: &Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<ResponseBody>, DropConnection> {
    let config = &shared.config;
    let request = match read_json(request).await.and_then(|body| parse_embeddings(body, config)) {
        Ok(request) => request,
        Err(e) => return Ok(error_response(&e)),
    };
    if let Err(answer) = early_fault(shared.draw_fault(), false) {
        return answer.into_result();
    }
    // One forward pass: the time to first token.
    tokio::time::sleep(config.ttft).await;
    let vectors: Vec<Vec<f32>> = request.inputs.iter().map(|text| embed(text, request.dim)).collect();
    let prompt_tokens = request.inputs.iter().map(|text| count_tokens(text)).fold(0u32, u32::saturating_add);
    Counters::bump(&shared.counters.completed, 1);
    Ok(json_response(StatusCode::OK, &embeddings_body(&request, &vectors, prompt_tokens)))
}

/// A whole body.
pub(crate) fn full_body(bytes: Bytes) -> ResponseBody {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

pub(crate) fn json_response(status: StatusCode, value: &Value) -> Response<ResponseBody> {
    // Serialising a `Value` cannot fail.
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(full_body(Bytes::from(bytes)));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

pub(crate) fn error_response(error: &ApiError) -> Response<ResponseBody> {
    let mut response = json_response(error.status, &error.body());
    if let Some(allow) = error.allow {
        response.headers_mut().insert(ALLOW, HeaderValue::from_static(allow));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_their_methods() {
        assert_eq!(Route::of("/health"), Some((Route::Health, "GET")));
        assert_eq!(Route::of("/metrics"), Some((Route::Metrics, "GET")));
        assert_eq!(Route::of("/v1/chat/completions"), Some((Route::Generation(Endpoint::Chat), "POST")));
        assert_eq!(Route::of("/v1/models/org/name"), Some((Route::Model("org/name".into()), "GET")));
        assert_eq!(Route::of("/v1/models/"), None);
        assert_eq!(Route::of("/v1/chat"), None);
    }
}
