//! The simulator's answers on the OpenAI routes beyond chat, completions and embeddings, so
//! that what the gateway forwards on them can be tested end to end:
//!
//! - `POST /v1/responses` — `input` a string or a list of messages, `max_output_tokens`; the
//!   answer is a `response` object with one `output_text` message (no streaming);
//! - `POST /v1/audio/transcriptions` — a multipart form with `file` and `model` (and
//!   `response_format` `json` or `text`); the "transcript" is generated from the file's bytes;
//! - `POST /v1/images/generations` — `prompt`, `n`; each image is a few bytes of `b64_json`
//!   derived from the prompt (a placeholder, not a picture);
//! - `POST /v1/rerank` — `query`, `documents` (strings or `{text}`), `top_n`; relevance is the
//!   cosine of the simulator's embeddings.
//!
//! Each checks the model like the other routes do and answers after the time to first token.

use std::sync::Arc;

use bytes::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::generate::{base64, count_tokens, embed, generate};
use super::http::{error_response, json_response, ResponseBody};
use super::openai::ApiError;
use super::{unix_now, Counters, Shared};

/// A route of this module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Other {
    Responses,
    Transcriptions,
    Images,
    Rerank,
}

impl Other {
    pub(crate) fn of(path: &str) -> Option<Other> {
        Some(match path {
            "/v1/responses" => Other::Responses,
            "/v1/audio/transcriptions" => Other::Transcriptions,
            "/v1/images/generations" => Other::Images,
            "/v1/rerank" => Other::Rerank,
            _ => return None,
        })
    }
}

/// Answers `body` (sent with `content_type`) on `route`.
pub(crate) async fn answer(
    shared: &Arc<Shared>,
    route: Other,
    content_type: &str,
    body: Bytes,
) -> Response<ResponseBody> {
    let result = match route {
        Other::Transcriptions => transcription(shared, content_type, &body),
        _ => match serde_json::from_slice::<Value>(&body) {
            Ok(v) => match route {
                Other::Responses => responses(shared, &v),
                Other::Images => images(shared, &v),
                _ => rerank(shared, &v),
            },
            Err(e) => Err(ApiError::invalid_request(format!("the request body is not valid JSON: {e}"))),
        },
    };
    match result {
        Ok(response) => {
            tokio::time::sleep(shared.config.ttft).await;
            Counters::bump(&shared.counters.completed, 1);
            response
        }
        Err(e) => error_response(&e),
    }
}

/// The served model a request names, or the error an engine answers.
fn model_of(shared: &Shared, model: Option<&str>) -> Result<String, ApiError> {
    let Some(model) = model.filter(|m| !m.is_empty()) else {
        return Err(ApiError::invalid_request("you must provide a model parameter"));
    };
    if !shared.config.models.iter().any(|m| m == model) {
        return Err(ApiError::model_not_found(model, &shared.config.models));
    }
    Ok(model.to_string())
}

fn responses(shared: &Shared, v: &Value) -> Result<Response<ResponseBody>, ApiError> {
    let model = model_of(shared, v["model"].as_str())?;
    if v["stream"].as_bool() == Some(true) {
        return Err(ApiError::invalid_request("the engine simulator answers /v1/responses without streaming"));
    }
    let input = match &v["input"] {
        Value::String(s) => s.clone(),
        Value::Array(items) => items
            .iter()
            .map(|m| match &m["content"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => return Err(ApiError::invalid_request("'input' must be a string or a list of messages")),
    };
    let max = v["max_output_tokens"].as_u64().map_or(64, |m| u32::try_from(m).unwrap_or(u32::MAX));
    let generation = generate(shared.config.seed, &input, max);
    let (prompt_tokens, output_tokens) = (count_tokens(&input), generation.token_count());
    let body = json!({
        "id": shared.request_id("resp"),
        "object": "response",
        "created_at": unix_now(),
        "status": "completed",
        "model": model,
        "output": [{
            "type": "message",
            "id": shared.request_id("msg"),
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": generation.text(), "annotations": []}],
        }],
        "parallel_tool_calls": true,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + output_tokens,
        },
    });
    Ok(json_response(StatusCode::OK, &body))
}

fn transcription(shared: &Shared, content_type: &str, body: &[u8]) -> Result<Response<ResponseBody>, ApiError> {
    let invalid = |e: crate::batch::multipart::MultipartError| ApiError::invalid_request(e.to_string());
    let boundary = crate::batch::multipart::boundary(content_type).map_err(invalid)?;
    let parts = crate::batch::multipart::parse(body, &boundary).map_err(invalid)?;
    let field = |name: &str| parts.iter().find(|p| p.name == name);
    let text_of = |name: &str| field(name).map(|p| String::from_utf8_lossy(p.data).into_owned());
    model_of(shared, text_of("model").as_deref())?;
    let Some(file) = field("file") else {
        return Err(ApiError::invalid_request("you must provide a 'file' part"));
    };
    // What the "audio" says: generated from its bytes, so equal files give equal transcripts.
    let heard = format!("{:x}", fnv(file.data));
    let text = generate(shared.config.seed, &heard, 32).text();
    match text_of("response_format").as_deref() {
        None | Some("json") => Ok(json_response(StatusCode::OK, &json!({"text": text}))),
        Some("text") => {
            let mut response = json_response(StatusCode::OK, &Value::Null);
            *response.body_mut() = super::http::full_body(Bytes::from(text));
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
            Ok(response)
        }
        Some(other) => {
            Err(ApiError::invalid_request(format!("response_format '{other}' is not simulated (use json or text)")))
        }
    }
}

fn images(shared: &Shared, v: &Value) -> Result<Response<ResponseBody>, ApiError> {
    model_of(shared, v["model"].as_str())?;
    let Some(prompt) = v["prompt"].as_str().filter(|p| !p.is_empty()) else {
        return Err(ApiError::invalid_request("you must provide a prompt"));
    };
    let n = v["n"].as_u64().unwrap_or(1);
    if !(1..=10).contains(&n) {
        return Err(ApiError::invalid_request("'n' must be between 1 and 10"));
    }
    let data: Vec<Value> = (0..n)
        .map(|i| {
            let bytes = fnv(format!("{i}:{prompt}").as_bytes()).to_le_bytes();
            json!({"b64_json": base64(&bytes), "revised_prompt": prompt})
        })
        .collect();
    Ok(json_response(StatusCode::OK, &json!({"created": unix_now(), "data": data})))
}

fn rerank(shared: &Shared, v: &Value) -> Result<Response<ResponseBody>, ApiError> {
    let model = model_of(shared, v["model"].as_str())?;
    let Some(query) = v["query"].as_str() else {
        return Err(ApiError::invalid_request("you must provide a query"));
    };
    let Some(documents) = v["documents"].as_array() else {
        return Err(ApiError::invalid_request("you must provide 'documents', a list"));
    };
    let texts: Vec<String> = documents
        .iter()
        .map(|d| d.as_str().map_or_else(|| d["text"].as_str().unwrap_or_default().to_string(), str::to_string))
        .collect();
    let dim = 64;
    let q = embed(query, dim);
    let mut results: Vec<(usize, f32)> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| (i, embed(t, dim).iter().zip(&q).map(|(a, b)| a * b).sum::<f32>()))
        .collect();
    results.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let top = v["top_n"].as_u64().map_or(results.len(), |n| usize::try_from(n).unwrap_or(usize::MAX));
    let tokens: u32 = texts.iter().map(|t| count_tokens(t)).sum::<u32>() + count_tokens(query);
    let results: Vec<Value> = results
        .into_iter()
        .take(top)
        .map(|(i, score)| json!({"index": i, "document": {"text": texts[i]}, "relevance_score": score}))
        .collect();
    let body = json!({"id": shared.request_id("rerank"), "model": model, "results": results, "usage": {"total_tokens": tokens}});
    Ok(json_response(StatusCode::OK, &body))
}

/// FNV-1a of `bytes`.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_routes_are_named_by_path() {
        assert_eq!(Other::of("/v1/responses"), Some(Other::Responses));
        assert_eq!(Other::of("/v1/audio/transcriptions"), Some(Other::Transcriptions));
        assert_eq!(Other::of("/v1/images/generations"), Some(Other::Images));
        assert_eq!(Other::of("/v1/rerank"), Some(Other::Rerank));
        assert_eq!(Other::of("/v1/audio/speech"), None);
    }
}
