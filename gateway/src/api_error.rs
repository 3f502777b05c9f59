//! Errors the gateway answers itself, in OpenAI's shape:
//! `{"error":{"message","type","param","code"}}`, so that the official SDKs raise the matching
//! exception class (`AuthenticationError` for 401, `PermissionDeniedError` for 403,
//! `NotFoundError` for 404, `RateLimitError` for 429, `APIStatusError` for the rest).

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};

use crate::body::GatewayBody;

/// An error answered by the gateway before or instead of forwarding a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `server_error`, ...
    pub kind: &'static str,
    /// OpenAI's `code`, machine-readable.
    pub code: &'static str,
    /// What happened and what to do, for people.
    pub message: String,
    /// `param`: the request field at fault, if any.
    pub param: Option<&'static str>,
    /// `Retry-After` in seconds, for 429 and 503.
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, kind, code, message: message.into(), param: None, retry_after: None }
    }

    /// 400: the body is not what the endpoint expects.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", code, message)
    }

    /// 400 naming the field at fault.
    pub fn bad_param(param: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param), ..ApiError::bad_request("invalid_value", message) }
    }

    /// 401: no key or a wrong one.
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", "invalid_api_key", message)
    }

    /// 403: the key is valid but may not use this path.
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "permission_error", "forbidden", message)
    }

    /// 404 for a path the gateway does not serve.
    pub fn no_such_path(method: &http::Method, path: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "unknown_url",
            format!(
                "unknown endpoint {method} {path}; this gateway serves POST /v1/chat/completions, \
                 /v1/completions, /v1/embeddings, GET /v1/models, and the Batch API's /v1/files and /v1/batches"
            ),
        )
    }

    /// 405 for a known path with the wrong method.
    pub fn method_not_allowed(method: &http::Method, path: &str, allowed: &str) -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            format!("{method} is not allowed on {path}; use {allowed}"),
        )
    }

    /// 404: no node serves the model.
    pub fn unknown_model(model: &str, known: &[String]) -> ApiError {
        let known = if known.is_empty() { "none are being served right now".to_string() } else { known.join(", ") };
        ApiError {
            param: Some("model"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
                format!("the model '{model}' does not exist or is not served by any node (available models: {known})"),
            )
        }
    }

    /// 503 with `Retry-After`: hosts exist but none can take the request now.
    pub fn no_capacity(message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "no_capacity", message)
        }
    }

    /// 413: the body exceeds the limit.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            format!("the request body exceeds this gateway's limit of {limit} bytes; send a smaller request"),
        )
    }

    /// 408: the client sent the body too slowly.
    pub fn body_timeout(after: std::time::Duration) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "request_timeout",
            format!("the request body did not arrive within {after:?}"),
        )
    }

    /// 429 with `Retry-After`: the gateway's concurrency limit is reached.
    pub fn overloaded(limit: usize) -> ApiError {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "concurrency_limit",
                format!("this gateway is already serving {limit} requests, its limit; retry shortly"),
            )
        }
    }

    /// 429 for a key over one of its rate limits ([`crate::limits`]), as OpenAI answers it:
    /// code `rate_limit_exceeded`, type `requests` or `tokens` (the limit reached).
    /// `retry_after` is `None` only when retrying cannot help.
    pub fn rate_limited(kind: &'static str, message: impl Into<String>, retry_after: Option<u32>) -> ApiError {
        ApiError { retry_after, ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, kind, "rate_limit_exceeded", message) }
    }

    /// 429 for a key that has spent its token budget for the period: OpenAI's
    /// `insufficient_quota`, with `Retry-After` until the next period.
    pub fn quota_exceeded(message: impl Into<String>, retry_after: Option<u32>) -> ApiError {
        ApiError {
            retry_after,
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "insufficient_quota", "insufficient_quota", message)
        }
    }

    /// 500 for the gateway's own faults.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "internal_error", message)
    }

    /// The JSON body.
    pub fn body(&self) -> Bytes {
        Bytes::from(error_json(&self.message, self.kind, self.param, self.code).to_string())
    }

    /// The full response.
    pub fn into_response(self) -> Response<GatewayBody> {
        let mut response = Response::new(GatewayBody::full(self.body()));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(secs) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(http::header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// OpenAI's error object.
pub fn error_json(message: &str, kind: &str, param: Option<&str>, code: &str) -> serde_json::Value {
    serde_json::json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

/// An SSE event carrying an OpenAI error object: what a stream that broke after its first byte
/// ends with, so that clients see an error instead of a silent cut.
pub fn sse_error_event(message: &str, code: &str) -> Bytes {
    let mut out = String::from("data: ");
    out.push_str(&error_json(message, "server_error", None, code).to_string());
    out.push_str("\n\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_have_the_openai_shape_and_retry_after_where_it_helps() {
        let e = ApiError::unknown_model("gpt-9", &["a".into(), "b".into()]);
        let v: serde_json::Value = serde_json::from_slice(&e.body()).expect("json");
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["param"], "model");
        assert!(v["error"]["message"].as_str().expect("message").contains("a, b"));
        let r = ApiError::no_capacity("busy").into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        let ev = sse_error_event("node lost", "upstream_lost");
        let text = std::str::from_utf8(&ev).expect("utf-8");
        assert!(text.starts_with("data: {") && text.ends_with("\n\n"), "{text}");
    }
}
