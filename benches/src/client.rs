//! The load tools' HTTP client: keep-alive HTTP/1.1 connections with `TCP_NODELAY` (a
//! per-stream stall on keep-alive connections would show up as ~40 ms), one-shot calls,
//! readiness waits, and percentiles of the latencies measured.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

/// The load tools' result: any error, printed by `main`.
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// A one-shot [`call`] whose response headers take longer than this fails.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// An HTTP/1.1 connection to `addr` with `TCP_NODELAY`, driven by a task of its own.
pub async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// One request on a fresh connection (with `Bearer key` when given); the status and the whole
/// body.
pub async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    content_type: &str,
    body: Bytes,
) -> Result<(u16, Bytes)> {
    let mut sender = connect(addr).await?;
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", content_type);
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let resp = tokio::time::timeout(CALL_TIMEOUT, sender.send_request(req.body(Full::new(body))?)).await??;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((status, bytes))
}

/// Waits (polling every 50 ms, for at most `within`) until `GET path` answers 200 with a body
/// that passes `check`.
pub async fn wait_until(
    addr: SocketAddr,
    path: &str,
    key: Option<&str>,
    within: Duration,
    check: impl Fn(&[u8]) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if let Ok((200, body)) = call(addr, "GET", path, key, "application/json", Bytes::new()).await {
            if check(&body) {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(format!("{addr}{path} not ready within {within:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the gateway at `addr` counts `n` serving nodes on its `/health`.
pub async fn serving_nodes(addr: SocketAddr, n: u64, within: Duration) -> Result<()> {
    wait_until(addr, "/health", None, within, |b| {
        serde_json::from_slice::<serde_json::Value>(b).is_ok_and(|v| v["serving_nodes"] == n)
    })
    .await
    .map_err(|_| format!("the gateway at {addr} did not count {n} serving nodes within {within:?}").into())
}

/// The `p` quantile (0 to 1, nearest rank) of `sorted`, in milliseconds; NaN when empty.
pub fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// The body of the tools' short chat request: one user message, 16 tokens, for `model`.
pub fn short_chat(model: &str, stream: bool) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": "Benchmark prompt: say something."}],
            "max_tokens": 16,
            "stream": stream,
        })
        .to_string(),
    )
}

/// POSTs `body` to `/v1/chat/completions` on the keep-alive connection `sender` (to `addr`,
/// with `Bearer key` when given) and reads the whole answer; `true` when it was a 200 with a
/// body, within `timeout`.
pub async fn chat_ok(
    sender: &mut SendRequest<Full<Bytes>>,
    addr: SocketAddr,
    key: Option<&str>,
    body: Bytes,
    timeout: Duration,
) -> bool {
    let mut req = hyper::Request::post("/v1/chat/completions")
        .header("host", addr.to_string())
        .header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let Ok(req) = req.body(Full::new(body)) else { return false };
    let exchange = async {
        sender.ready().await.ok()?;
        let resp = sender.send_request(req).await.ok()?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await.ok()?.to_bytes();
        (status == 200 && !bytes.is_empty()).then_some(())
    };
    tokio::time::timeout(timeout, exchange).await.ok().flatten().is_some()
}
