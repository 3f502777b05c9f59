//! One batch request through one node's tunnel, its whole answer read.
//!
//! Unlike an interactive request, nothing of a batch request reaches a client before it is
//! over, so any failure short of a complete answer — the stream cannot be opened, the node does
//! not accept it in time, the connection breaks mid-answer, the node answers `502`, `503` or
//! `429` (draining, engine unreachable, engine full), a `2xx` whose body is not complete JSON —
//! is a [`Retry`]: the line stays pending and the runner sends it again, to whichever node then
//! has room. The request counts in the node's in-flight load ([`crate::routing::NodeLoad`])
//! while it runs, so interactive routing sees it too.

use std::time::{Duration, Instant};

use tela_transports::tunnel::{encode_head, read_accepted, read_response_head, RequestHead};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::routing::Choice;
use crate::service::Shared;

/// The largest answer read.
const MAX_ANSWER: u64 = 64 * 1024 * 1024;

/// The longest an answer may go without a byte once started.
const IDLE: Duration = Duration::from_secs(600);

/// A node's complete answer.
#[derive(Debug)]
pub struct Answer {
    /// Its status.
    pub status: u16,
    /// Its body, as JSON (a non-JSON error body is wrapped in OpenAI's error object).
    pub body: serde_json::Value,
    /// From sending to the response head.
    pub first_byte: Duration,
}

/// The request did not get a complete answer and should be sent again.
#[derive(Debug)]
pub struct Retry(pub String);

/// Sends `body` to `endpoint` on `choice`'s node and reads the whole answer.
pub async fn send(shared: &Shared, choice: &Choice, endpoint: &str, body: &[u8]) -> Result<Answer, Retry> {
    let _counted = shared.load.enter(choice.node);
    let started = Instant::now();
    let head = RequestHead {
        method: "POST".into(),
        path_and_query: endpoint.to_string(),
        headers: vec![
            ("content-type".into(), b"application/json".to_vec()),
            ("content-length".into(), body.len().to_string().into_bytes()),
        ],
    };
    let conn = &choice.connection;
    let write = async {
        let (mut send, recv) = conn.open_stream().await.map_err(|e| Retry(format!("cannot open a stream: {e}")))?;
        let mut wire = encode_head(&head).map_err(|e| Retry(format!("the request head cannot be sent: {e}")))?;
        wire.extend_from_slice(body);
        send.write_all(&wire).await.map_err(|e| Retry(format!("writing the request failed: {e}")))?;
        send.shutdown().await.map_err(|e| Retry(format!("writing the request failed: {e}")))?;
        Ok::<_, Retry>(recv)
    };
    let write_timeout = shared.proxy.write_timeout;
    let mut recv = tokio::time::timeout(write_timeout, write)
        .await
        .map_err(|_| Retry(format!("the request could not be written within {write_timeout:?}")))??;
    let accept_timeout = shared.proxy.accept_timeout;
    match tokio::time::timeout(accept_timeout, read_accepted(&mut recv)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(Retry(format!("no response: {e}"))),
        Err(_) => {
            shared.silent.mark(choice.node, conn);
            return Err(Retry(format!("the node did not accept the request within {accept_timeout:?}")));
        }
    }
    let response = tokio::time::timeout(IDLE, read_response_head(&mut recv))
        .await
        .map_err(|_| Retry(format!("no response head within {IDLE:?}")))?
        .map_err(|e| Retry(format!("no response: {e}")))?;
    let first_byte = started.elapsed();
    let mut bytes = Vec::new();
    let mut limited = (&mut recv).take(MAX_ANSWER);
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::time::timeout(IDLE, limited.read(&mut chunk))
            .await
            .map_err(|_| Retry(format!("the answer stalled for {IDLE:?}")))?
            .map_err(|e| Retry(format!("the answer broke off: {e}")))?;
        if n == 0 {
            break;
        }
        bytes.extend_from_slice(&chunk[..n]);
    }
    if matches!(response.status, 429 | 502 | 503) {
        let text = String::from_utf8_lossy(&bytes).chars().take(200).collect::<String>();
        return Err(Retry(format!("the node answered {}: {text}", response.status)));
    }
    let body = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(v) => v,
        Err(e) if (200..300).contains(&response.status) => {
            return Err(Retry(format!("the answer is not complete JSON: {e}")));
        }
        Err(_) => {
            let text = String::from_utf8_lossy(&bytes).chars().take(2000).collect::<String>();
            crate::api_error::error_json(&text, "server_error", None, "engine_error")
        }
    };
    Ok(Answer { status: response.status, body, first_byte })
}
