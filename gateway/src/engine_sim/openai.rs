//! The OpenAI wire format as the simulator speaks it: request bodies and their validation,
//! response and chunk bodies, and the error shape.

use hyper::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};

use super::generate::{FinishReason, Generation};
use super::EngineSimConfig;

/// `max_tokens` when a request gives none (vLLM's and OpenAI's legacy completions default).
pub(crate) const DEFAULT_MAX_TOKENS: u32 = 16;

/// An error as OpenAI returns it: `{"error":{"message","type","param","code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) kind: &'static str,
    pub(crate) param: Option<&'static str>,
    pub(crate) code: Option<&'static str>,
    /// For 405: the methods the path does accept.
    pub(crate) allow: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), kind, param: None, code: None, allow: None }
    }

    pub(crate) fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    fn invalid_param(param: &'static str, message: impl Into<String>) -> Self {
        Self { param: Some(param), ..Self::invalid_request(message) }
    }

    fn missing(param: &'static str) -> Self {
        Self::invalid_param(param, format!("you must provide '{param}'"))
    }

    pub(crate) fn model_not_found(model: &str, served: &[String]) -> Self {
        Self {
            param: Some("model"),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("the model '{model}' does not exist on this engine (served: {})", served.join(", ")),
            )
        }
    }

    pub(crate) fn unknown_path(method: &str, path: &str) -> Self {
        Self {
            code: Some("unknown_url"),
            ..Self::new(StatusCode::NOT_FOUND, "invalid_request_error", format!("invalid URL ({method} {path})"))
        }
    }

    pub(crate) fn method_not_allowed(method: &str, path: &str, allow: &'static str) -> Self {
        Self {
            code: Some("method_not_allowed"),
            allow: Some(allow),
            ..Self::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                format!("method {method} is not allowed on {path} (use {allow})"),
            )
        }
    }

    pub(crate) fn body_too_large(limit: usize) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", format!("request body exceeds {limit} bytes"))
    }

    pub(crate) fn loading() -> Self {
        Self {
            code: Some("engine_loading"),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable_error",
                "the engine is still loading its model; retry shortly",
            )
        }
    }

    pub(crate) fn simulated_failure() -> Self {
        Self {
            code: Some("simulated_failure"),
            ..Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "the engine simulator failed this request on purpose (--fail-rate)",
            )
        }
    }

    pub(crate) fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// Which generation endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Chat,
    Completion,
}

/// A validated generation request, whichever endpoint it came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GenerationRequest {
    pub(crate) endpoint: Endpoint,
    pub(crate) model: String,
    /// The prompt flattened to text: the seed of the answer and the base of `prompt_tokens`.
    pub(crate) prompt: String,
    pub(crate) max_tokens: u32,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: Option<String>,
    #[serde(default)]
    content: Value,
}

#[derive(Debug, Deserialize)]
struct ChatRequest {
    model: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    n: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    model: Option<String>,
    prompt: Option<Value>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<u32>,
    n: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct EmbeddingRequest {
    model: Option<String>,
    input: Option<Value>,
    encoding_format: Option<String>,
    dimensions: Option<u32>,
}

/// A validated embeddings request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EmbeddingsRequest {
    pub(crate) model: String,
    pub(crate) inputs: Vec<String>,
    pub(crate) base64: bool,
    pub(crate) dim: usize,
}

fn typed<T: for<'de> Deserialize<'de>>(body: Value) -> Result<T, ApiError> {
    serde_json::from_value(body).map_err(|e| ApiError::invalid_request(format!("invalid request body: {e}")))
}

fn served_model(model: Option<String>, config: &EngineSimConfig) -> Result<String, ApiError> {
    let model = model.ok_or_else(|| ApiError::missing("model"))?;
    if config.models.contains(&model) {
        Ok(model)
    } else {
        Err(ApiError::model_not_found(&model, &config.models))
    }
}

fn check_n(n: Option<u32>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(n) => Err(ApiError::invalid_param("n", format!("the engine simulator supports only n = 1, not {n}"))),
    }
}

fn check_max_tokens(param: &'static str, value: Option<u32>, config: &EngineSimConfig) -> Result<u32, ApiError> {
    match value {
        None => Ok(DEFAULT_MAX_TOKENS.min(config.max_tokens_limit)),
        Some(0) => Err(ApiError::invalid_param(param, format!("'{param}' must be at least 1"))),
        Some(v) if v > config.max_tokens_limit => Err(ApiError::invalid_param(
            param,
            format!("'{param}' is {v}, more than this engine's limit of {}", config.max_tokens_limit),
        )),
        Some(v) => Ok(v),
    }
}

/// The text of a message's `content`: a string, or the `text` of each part of a list.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => {
            parts.iter().filter_map(|part| part.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("")
        }
        _ => String::new(),
    }
}

pub(crate) fn parse_chat(body: Value, config: &EngineSimConfig) -> Result<GenerationRequest, ApiError> {
    let request: ChatRequest = typed(body)?;
    let messages = request.messages.ok_or_else(|| ApiError::missing("messages"))?;
    if messages.is_empty() {
        return Err(ApiError::invalid_param("messages", "'messages' must hold at least one message"));
    }
    let mut prompt = String::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message
            .role
            .as_deref()
            .ok_or_else(|| ApiError::invalid_param("messages", format!("messages[{i}] has no 'role'")))?;
        prompt.push_str(role);
        prompt.push_str(": ");
        prompt.push_str(&content_text(&message.content));
        prompt.push('\n');
    }
    check_n(request.n)?;
    // The newer name wins, as in OpenAI's API.
    let max_tokens = match request.max_completion_tokens {
        Some(v) => check_max_tokens("max_completion_tokens", Some(v), config)?,
        None => check_max_tokens("max_tokens", request.max_tokens, config)?,
    };
    let model = served_model(request.model, config)?;
    let stream = request.stream.unwrap_or(false);
    Ok(GenerationRequest {
        endpoint: Endpoint::Chat,
        model,
        prompt,
        max_tokens,
        stream,
        include_usage: stream && request.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
    })
}

pub(crate) fn parse_completion(body: Value, config: &EngineSimConfig) -> Result<GenerationRequest, ApiError> {
    let request: CompletionRequest = typed(body)?;
    let prompt = match request.prompt.ok_or_else(|| ApiError::missing("prompt"))? {
        Value::String(s) => s,
        Value::Array(items) if items.len() == 1 && items[0].is_string() => {
            items[0].as_str().unwrap_or_default().to_owned()
        }
        // One prompt given as token ids: the ids stand in for the text.
        Value::Array(items) if items.iter().all(Value::is_u64) && !items.is_empty() => {
            items.iter().map(Value::to_string).collect::<Vec<_>>().join(" ")
        }
        Value::Array(items) if items.len() > 1 => {
            return Err(ApiError::invalid_param(
                "prompt",
                "the engine simulator takes one prompt per request, not a batch",
            ))
        }
        _ => return Err(ApiError::invalid_param("prompt", "'prompt' must be a string (or a list holding one string)")),
    };
    check_n(request.n)?;
    let max_tokens = check_max_tokens("max_tokens", request.max_tokens, config)?;
    let model = served_model(request.model, config)?;
    let stream = request.stream.unwrap_or(false);
    Ok(GenerationRequest {
        endpoint: Endpoint::Completion,
        model,
        prompt,
        max_tokens,
        stream,
        include_usage: stream && request.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
    })
}

pub(crate) fn parse_embeddings(body: Value, config: &EngineSimConfig) -> Result<EmbeddingsRequest, ApiError> {
    let request: EmbeddingRequest = typed(body)?;
    let not_text = || {
        ApiError::invalid_param("input", "'input' must be a non-empty string or a non-empty list of non-empty strings")
    };
    let inputs = match request.input.ok_or_else(|| ApiError::missing("input"))? {
        Value::String(s) => vec![s],
        Value::Array(items) => items
            .into_iter()
            .map(|item| match item {
                Value::String(s) => Ok(s),
                _ => Err(not_text()),
            })
            .collect::<Result<Vec<_>, _>>()?,
        _ => return Err(not_text()),
    };
    if inputs.is_empty() || inputs.iter().any(String::is_empty) {
        return Err(not_text());
    }
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "encoding_format",
                format!("'encoding_format' must be 'float' or 'base64', not '{other}'"),
            ))
        }
    };
    let dim = match request.dimensions {
        None => config.embedding_dim,
        Some(d @ 1..=65_536) => d as usize,
        Some(d) => {
            return Err(ApiError::invalid_param(
                "dimensions",
                format!("'dimensions' must be between 1 and 65536, not {d}"),
            ))
        }
    };
    let model = served_model(request.model, config)?;
    Ok(EmbeddingsRequest { model, inputs, base64, dim })
}

/// Token accounting for `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) prompt_tokens: u32,
    pub(crate) completion_tokens: u32,
    /// Prompt tokens found in the prefix cache (`prompt_tokens_details.cached_tokens`).
    pub(crate) cached_tokens: u32,
}

impl Usage {
    pub(crate) fn body(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens.saturating_add(self.completion_tokens),
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

/// What identifies one response and its chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResponseMeta {
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: String,
}

/// The non-stream answer of either generation endpoint.
pub(crate) fn completion_body(endpoint: Endpoint, meta: &ResponseMeta, generation: &Generation, usage: Usage) -> Value {
    let finish = generation.finish_reason.as_str();
    let (object, choice) = match endpoint {
        Endpoint::Chat => (
            "chat.completion",
            json!({
                "index": 0,
                "message": {"role": "assistant", "content": generation.text()},
                "logprobs": null,
                "finish_reason": finish,
            }),
        ),
        Endpoint::Completion => (
            "text_completion",
            json!({
                "index": 0,
                "text": generation.text(),
                "logprobs": null,
                "finish_reason": finish,
            }),
        ),
    };
    json!({
        "id": meta.id,
        "object": object,
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
        "usage": usage.body(),
    })
}

/// One part of a stream, in the order it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChunkKind<'a> {
    /// Chat only: the first chunk, carrying the assistant role.
    Role,
    /// One token of content.
    Token(&'a str),
    /// The last choice chunk, carrying the finish reason.
    Finish(FinishReason),
    /// After the finish chunk when `stream_options.include_usage`: no choices, only usage.
    Usage(Usage),
}

/// A stream chunk's JSON. With `include_usage`, OpenAI adds `"usage": null` to every chunk but
/// the usage chunk itself.
pub(crate) fn chunk_body(endpoint: Endpoint, meta: &ResponseMeta, kind: ChunkKind<'_>, include_usage: bool) -> Value {
    let object = match endpoint {
        Endpoint::Chat => "chat.completion.chunk",
        Endpoint::Completion => "text_completion",
    };
    let (choices, usage) = match (endpoint, kind) {
        (_, ChunkKind::Usage(usage)) => (json!([]), usage.body()),
        (Endpoint::Chat, ChunkKind::Role) => (
            json!([{"index": 0, "delta": {"role": "assistant", "content": ""},
                    "logprobs": null, "finish_reason": null}]),
            Value::Null,
        ),
        (Endpoint::Chat, ChunkKind::Token(text)) => (
            json!([{"index": 0, "delta": {"content": text},
                    "logprobs": null, "finish_reason": null}]),
            Value::Null,
        ),
        (Endpoint::Chat, ChunkKind::Finish(reason)) => (
            json!([{"index": 0, "delta": {},
                    "logprobs": null, "finish_reason": reason.as_str()}]),
            Value::Null,
        ),
        (Endpoint::Completion, ChunkKind::Role) | (Endpoint::Completion, ChunkKind::Token(_)) => {
            let text = match kind {
                ChunkKind::Token(text) => text,
                _ => "",
            };
            (json!([{"index": 0, "text": text, "logprobs": null, "finish_reason": null}]), Value::Null)
        }
        (Endpoint::Completion, ChunkKind::Finish(reason)) => (
            json!([{"index": 0, "text": "", "logprobs": null,
                    "finish_reason": reason.as_str()}]),
            Value::Null,
        ),
    };
    let mut chunk = json!({
        "id": meta.id,
        "object": object,
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
    });
    if include_usage || !usage.is_null() {
        chunk["usage"] = usage;
    }
    chunk
}

/// The answer of `/v1/embeddings`; each vector as floats or as base64 of little-endian `f32`.
pub(crate) fn embeddings_body(request: &EmbeddingsRequest, vectors: &[Vec<f32>], prompt_tokens: u32) -> Value {
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = if request.base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(super::generate::base64(&bytes))
            } else {
                json!(vector)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": request.model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })
}

/// `/v1/models` and `/v1/models/{id}` entries.
pub(crate) fn model_body(id: &str, created: u64) -> Value {
    json!({"id": id, "object": "model", "created": created, "owned_by": super::OWNED_BY})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> EngineSimConfig {
        EngineSimConfig { models: vec!["a".into(), "b".into()], ..EngineSimConfig::default() }
    }

    #[test]
    fn chat_defaults_and_precedence_of_max_completion_tokens() {
        let r = parse_chat(json!({"model": "a", "messages": [{"role": "user", "content": "hi"}]}), &config()).unwrap();
        assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS);
        assert!(!r.stream && !r.include_usage);
        assert_eq!(r.prompt, "user: hi\n");
        let r = parse_chat(
            json!({"model": "a", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                   "max_tokens": 9, "max_completion_tokens": 3}),
            &config(),
        )
        .unwrap();
        assert_eq!(r.max_tokens, 3);
        assert_eq!(r.prompt, "user: hi\n");
    }

    #[test]
    fn invalid_chat_requests_name_the_offending_param() {
        let cases = [
            (json!({"messages": [{"role": "user", "content": "x"}]}), "model", 400),
            (json!({"model": "a"}), "messages", 400),
            (json!({"model": "a", "messages": []}), "messages", 400),
            (json!({"model": "a", "messages": [{"content": "x"}]}), "messages", 400),
            (json!({"model": "a", "messages": [{"role": "user"}], "n": 2}), "n", 400),
            (json!({"model": "a", "messages": [{"role": "user"}], "max_tokens": 0}), "max_tokens", 400),
            (json!({"model": "a", "messages": [{"role": "user"}], "max_tokens": 5000}), "max_tokens", 400),
            (json!({"model": "zz", "messages": [{"role": "user"}]}), "model", 404),
        ];
        for (body, param, status) in cases {
            let e = parse_chat(body.clone(), &config()).unwrap_err();
            assert_eq!(e.param, Some(param), "{body}");
            assert_eq!(e.status.as_u16(), status, "{body}");
        }
    }

    #[test]
    fn unknown_model_names_the_served_ones() {
        let e = parse_completion(json!({"model": "x", "prompt": "p"}), &config()).unwrap_err();
        assert_eq!(e.code, Some("model_not_found"));
        assert!(e.message.contains("a, b"), "{}", e.message);
    }

    #[test]
    fn completion_prompt_forms() {
        for prompt in [json!("p"), json!(["p"])] {
            let r = parse_completion(json!({"model": "a", "prompt": prompt}), &config()).unwrap();
            assert_eq!(r.prompt, "p");
        }
        let r = parse_completion(json!({"model": "a", "prompt": [1, 2]}), &config()).unwrap();
        assert_eq!(r.prompt, "1 2");
        for prompt in [json!(["p", "q"]), json!(7), json!([])] {
            let e = parse_completion(json!({"model": "a", "prompt": prompt}), &config());
            assert_eq!(e.unwrap_err().param, Some("prompt"));
        }
    }

    #[test]
    fn embedding_inputs() {
        let r = parse_embeddings(json!({"model": "b", "input": ["x", "y"]}), &config()).unwrap();
        assert_eq!(r.inputs, ["x", "y"]);
        assert_eq!(r.dim, 64);
        for input in [json!(""), json!([]), json!([1]), json!(["ok", ""])] {
            let e = parse_embeddings(json!({"model": "b", "input": input}), &config());
            assert_eq!(e.unwrap_err().param, Some("input"));
        }
    }

    #[test]
    fn usage_null_on_ordinary_chunks_only_when_requested() {
        let meta = ResponseMeta { id: "x".into(), created: 1, model: "a".into() };
        let plain = chunk_body(Endpoint::Chat, &meta, ChunkKind::Token("t"), false);
        assert!(plain.get("usage").is_none());
        let with = chunk_body(Endpoint::Chat, &meta, ChunkKind::Token("t"), true);
        assert_eq!(with["usage"], Value::Null);
    }
}
