//! The HTTP/1.1 exchange the REST backends share (slurmrestd, FirecREST): one client with a
//! connect timeout, one limit on the whole exchange, the answer read into memory up to a bound,
//! and every failure to get an answer typed as [`BatchError::Unreachable`] in words.

use super::BatchError;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// Largest answer read (a `GET /jobs` of a big cluster is a few MB).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// One HTTP answer, read whole.
pub(crate) struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The body.
    pub body: Bytes,
}

/// An HTTP client bound to one backend's name and timeout.
pub(crate) struct HttpClient {
    backend: &'static str,
    timeout: Duration,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl HttpClient {
    /// A client whose connects and exchanges each take at most `timeout`.
    pub fn new(backend: &'static str, timeout: Duration) -> HttpClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        HttpClient { backend, timeout, client: Client::builder(TokioExecutor::new()).build(connector) }
    }

    /// Sends `request` and reads the answer; `what` names the call in errors (never a secret).
    pub async fn exchange(&self, what: &str, request: Request<Full<Bytes>>) -> Result<Answer, BatchError> {
        let unreachable = |detail: String| BatchError::Unreachable { backend: self.backend, detail };
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| unreachable(format!("{what}: {e}")))?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| unreachable(format!("{what}: reading the answer: {e}")))?
                .to_bytes();
            Ok(Answer { status, body })
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| unreachable(format!("{what}: no answer within {:?}", self.timeout)))?
    }
}

/// The start of an answer body on one line, for error messages.
pub(crate) fn preview(body: &[u8]) -> String {
    String::from_utf8_lossy(&body[..body.len().min(300)]).split_whitespace().collect::<Vec<_>>().join(" ")
}
