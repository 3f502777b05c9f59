//! [`Backend`]: the engine's HTTP address and the pooled hyper client that probes it and
//! carries tunnelled requests to it.

use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;
use tela_core::MAX_MODEL_NAME;
use tela_core::{Model, Quantization, MAX_DATAGRAM};

/// The error type of request bodies sent to the engine.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;
/// A request body sent to the engine.
pub type EngineBody = BoxBody<Bytes, BodyError>;

/// Largest `/v1/models` answer read; real ones are a few KB.
const MAX_MODELS_BODY: usize = 1024 * 1024;
/// What the probes accept.
const JSON: &str = "application/json";
/// What a metrics request accepts: the Prometheus text format, not OpenMetrics or protobuf.
const PROMETHEUS: &str = "text/plain;version=0.0.4;q=1,*/*;q=0.1";

/// An engine on (usually) loopback: its base URL and a client with a keep-alive pool.
#[derive(Clone, Debug)]
pub struct Backend {
    url: String,
    scheme_authority: String,
    prefix: String,
    client: Client<HttpConnector, EngineBody>,
}

/// The backend URL is not usable.
#[derive(Debug, thiserror::Error)]
pub enum BackendUrlError {
    /// Not a URL.
    #[error("--backend-url '{url}' is not a URL ({detail}); expected e.g. http://127.0.0.1:8000")]
    Invalid {
        /// What was given.
        url: String,
        /// Why it does not parse.
        detail: String,
    },
    /// Not plain HTTP.
    #[error(
        "--backend-url '{0}' must use http:// (the engine runs next to the node, on loopback; TLS is not needed there)"
    )]
    NotHttp(String),
}

/// Why a readiness probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The request did not get an answer.
    #[error("no answer from {url}: {detail}")]
    Unreachable {
        /// What was requested.
        url: String,
        /// What failed.
        detail: String,
    },
    /// No answer in time.
    #[error("{url} did not answer within {after:?}")]
    TimedOut {
        /// What was requested.
        url: String,
        /// How long we waited.
        after: Duration,
    },
    /// An answer, but not a ready one.
    #[error("{url} answered {status}{}", if *.status == StatusCode::SERVICE_UNAVAILABLE { " (still loading?)" } else { "" })]
    Status {
        /// What was requested.
        url: String,
        /// The status.
        status: StatusCode,
    },
    /// `/v1/models` did not list models in the OpenAI shape.
    #[error("{url} did not return an OpenAI model list: {source}")]
    BadModels {
        /// What was requested.
        url: String,
        /// What was wrong.
        #[source]
        source: ModelListError,
    },
}

/// Why a `/v1/models` answer lists no usable model.
#[derive(Debug, thiserror::Error)]
pub enum ModelListError {
    /// The body is not JSON.
    #[error("not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// The JSON has no `data` array.
    #[error("no \"data\" list")]
    NoDataList,
    /// The `data` array names no model that fits a record.
    #[error("the list has no model")]
    Empty,
}

impl Backend {
    /// A backend at `url` (`http://host:port`, optionally with a path prefix; a trailing
    /// `/v1` is dropped, since tunnelled paths already start with `/v1`).
    pub fn new(url: &str) -> Result<Backend, BackendUrlError> {
        let uri: Uri = url.parse().map_err(|e: http::uri::InvalidUri| BackendUrlError::Invalid {
            url: url.to_string(),
            detail: e.to_string(),
        })?;
        if uri.scheme_str() != Some("http") {
            return Err(BackendUrlError::NotHttp(url.to_string()));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| BackendUrlError::Invalid { url: url.to_string(), detail: "no host".into() })?;
        let mut prefix = uri.path().trim_end_matches('/').to_string();
        if prefix.ends_with("/v1") {
            prefix.truncate(prefix.len() - 3);
        }
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(5)));
        http.set_keepalive(Some(Duration::from_secs(60)));
        let client = Client::builder(TokioExecutor::new())
            // Below the 5 s keep-alive of uvicorn (vLLM, SGLang, llama-cpp-python) and the
            // llama.cpp server: reusing a connection the engine is closing at that moment fails
            // a request whose body cannot be replayed.
            .pool_idle_timeout(Duration::from_secs(4))
            .pool_max_idle_per_host(64)
            .build(http);
        Ok(Backend { url: url.to_string(), scheme_authority: format!("http://{authority}"), prefix, client })
    }

    /// The URL as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `host:port` of the engine (port 80 when the URL names none).
    pub fn host_port(&self) -> String {
        let authority = self.scheme_authority.trim_start_matches("http://");
        let has_port = authority.rsplit_once(':').is_some_and(|(_, p)| !p.is_empty() && !p.ends_with(']'));
        if has_port {
            authority.to_string()
        } else {
            format!("{authority}:80")
        }
    }

    /// Whether something already accepts connections where the engine listens: before launching
    /// an engine, that is another process on its port (another job's engine on a shared host),
    /// which the node must not take for its own.
    pub async fn is_listened_on(&self) -> bool {
        let connect = tokio::net::TcpStream::connect(self.host_port());
        matches!(tokio::time::timeout(Duration::from_secs(1), connect).await, Ok(Ok(_)))
    }

    /// The engine URI for a tunnelled request's path and query.
    pub fn uri_for(&self, path_and_query: &str) -> Result<Uri, http::uri::InvalidUri> {
        let sep = if path_and_query.starts_with('/') { "" } else { "/" };
        format!("{}{}{sep}{path_and_query}", self.scheme_authority, self.prefix).parse()
    }

    /// The pooled client (HTTP/1.1, keep-alive, TCP_NODELAY).
    pub fn client(&self) -> &Client<HttpConnector, EngineBody> {
        &self.client
    }

    /// One readiness probe: `GET /health` must answer 200 — or not exist (404/405/501, as on
    /// the llama.cpp Python server), in which case `/v1/models` decides alone — and
    /// `GET /v1/models` must list the served models.
    pub async fn probe(&self, timeout: Duration) -> Result<Vec<Model>, ProbeError> {
        let (status, _) = self.get("/health", timeout, 0, JSON).await?;
        let health_missing =
            matches!(status, StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED | StatusCode::NOT_IMPLEMENTED);
        if !status.is_success() && !health_missing {
            return Err(ProbeError::Status { url: self.display("/health"), status });
        }
        let url = self.display("/v1/models");
        let (status, body) = self.get("/v1/models", timeout, MAX_MODELS_BODY, JSON).await?;
        if !status.is_success() {
            return Err(ProbeError::Status { url, status });
        }
        parse_models(&body).map_err(|source| ProbeError::BadModels { url, source })
    }

    /// `GET /metrics` (the Prometheus text format): the status and at most `max_body` bytes
    /// of the body.
    pub async fn metrics(&self, timeout: Duration, max_body: usize) -> Result<(StatusCode, Bytes), ProbeError> {
        self.get("/metrics", timeout, max_body, PROMETHEUS).await
    }

    /// The URL of `path` at the engine, for messages.
    pub fn display(&self, path: &str) -> String {
        format!("{}{}{path}", self.scheme_authority, self.prefix)
    }

    async fn get(
        &self,
        path: &str,
        timeout: Duration,
        max_body: usize,
        accept: &'static str,
    ) -> Result<(StatusCode, Bytes), ProbeError> {
        let url = self.display(path);
        let uri =
            self.uri_for(path).map_err(|e| ProbeError::Unreachable { url: url.clone(), detail: e.to_string() })?;
        let request = Request::builder()
            .method(Method::GET)
            .uri(uri)
            .header(http::header::ACCEPT, accept)
            .body(Empty::<Bytes>::new().map_err(|never| match never {}).boxed())
            .map_err(|e| ProbeError::Unreachable { url: url.clone(), detail: e.to_string() })?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| ProbeError::Unreachable { url: url.clone(), detail: error_chain(&e) })?;
            let status = response.status();
            let body = http_body_util::Limited::new(response.into_body(), max_body.max(1024))
                .collect()
                .await
                .map_err(|e| ProbeError::Unreachable { url: url.clone(), detail: format!("reading the body: {e}") })?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| ProbeError::TimedOut { url: url.clone(), after: timeout })?
    }
}

/// An error with its sources, e.g. "client error (Connect): tcp connect error: Connection
/// refused (os error 111)".
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = inner.source();
    }
    s
}

/// The models of an OpenAI `/v1/models` answer (`{"data":[{"id":...}]}`), as the core's
/// [`Model`]s. Names too long for a record are skipped; at most the first eight are kept.
pub fn parse_models(body: &[u8]) -> Result<Vec<Model>, ModelListError> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(ModelListError::NotJson)?;
    let data = value.get("data").and_then(|d| d.as_array()).ok_or(ModelListError::NoDataList)?;
    let mut models = Vec::new();
    for entry in data {
        let Some(id) = entry.get("id").and_then(|i| i.as_str()) else {
            continue;
        };
        if id.is_empty() || id.len() > MAX_MODEL_NAME {
            tracing::warn!("skipping model id of {} bytes (1..={MAX_MODEL_NAME} allowed): {id:.40}…", id.len());
            continue;
        }
        models.push(Model { name: id.to_string(), quant: guess_quantization(id) });
    }
    if models.is_empty() {
        return Err(ModelListError::Empty);
    }
    let max = tela_core::MAX_MODELS;
    if models.len() > max {
        tracing::warn!(
            "the engine lists {} models; announcing the first {max} (one record holds at most {max}; datagrams are at most {MAX_DATAGRAM} bytes)",
            models.len()
        );
        models.truncate(max);
    }
    Ok(models)
}

/// The weight format a model id suggests (engines do not report it; names usually do).
pub fn guess_quantization(id: &str) -> Quantization {
    let n = id.to_ascii_lowercase();
    let has = |s: &str| n.contains(s);
    if has("gguf") {
        Quantization::Gguf
    } else if has("awq") {
        Quantization::Awq
    } else if has("gptq") {
        Quantization::Gptq
    } else if has("fp8") {
        Quantization::Fp8
    } else if has("int4") || has("w4a16") {
        Quantization::Int4
    } else if has("int8") || has("w8a8") {
        Quantization::Int8
    } else if has("bf16") {
        Quantization::Bf16
    } else if has("fp16") {
        Quantization::Fp16
    } else {
        Quantization::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_v1_is_dropped() {
        let b = Backend::new("http://127.0.0.1:8000/v1").expect("valid");
        assert_eq!(b.uri_for("/v1/models?x=1").expect("uri").to_string(), "http://127.0.0.1:8000/v1/models?x=1");
        let b = Backend::new("http://127.0.0.1:8000/engine/").expect("valid");
        assert_eq!(b.uri_for("/v1/models").expect("uri").to_string(), "http://127.0.0.1:8000/engine/v1/models");
        assert!(matches!(Backend::new("https://127.0.0.1:8000"), Err(BackendUrlError::NotHttp(_))));
        let e = Backend::new("not a url").unwrap_err();
        assert!(e.to_string().contains("http://127.0.0.1:8000"), "{e}");
        assert_eq!(Backend::new("http://127.0.0.1:8000/v1").expect("valid").host_port(), "127.0.0.1:8000");
        assert_eq!(Backend::new("http://engine").expect("valid").host_port(), "engine:80");
        assert_eq!(Backend::new("http://[::1]:9000").expect("valid").host_port(), "[::1]:9000");
        assert_eq!(Backend::new("http://[::1]").expect("valid").host_port(), "[::1]:80");
    }

    #[test]
    fn model_lists_parse_and_skip_bad_names() {
        let body = format!(
            r#"{{"object":"list","data":[{{"id":"llama-3-8b-awq"}},{{"id":""}},{{"id":"{}"}},{{"id":"smollm2"}}]}}"#,
            "x".repeat(200)
        );
        let models = parse_models(body.as_bytes()).expect("parses");
        assert_eq!(models.len(), 2);
        assert_eq!(models[0].quant, Quantization::Awq);
        assert_eq!(models[1].name, "smollm2");
        assert!(matches!(parse_models(b"{}"), Err(ModelListError::NoDataList)));
        assert!(matches!(parse_models(br#"{"data":[]}"#), Err(ModelListError::Empty)));
        assert!(parse_models(b"<html>").unwrap_err().to_string().contains("not JSON"));
    }

    #[tokio::test]
    async fn probing_nothing_names_the_url() {
        // A port nobody listens on (bound then released).
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
        let b = Backend::new(&format!("http://127.0.0.1:{port}")).expect("valid");
        let e = b.probe(Duration::from_secs(2)).await.unwrap_err();
        assert!(e.to_string().contains(&format!("127.0.0.1:{port}/health")), "{e}");
    }
}
