//! The HTTP/1.1 exchange the REST backends share (slurmrestd, FirecREST and its token
//! endpoint): one client with a connect timeout, `http://` or `https://` (rustls, the system's
//! roots plus an optional CA file, see [`crate::client_tls`]), one limit on the whole
//! exchange, the answer read into memory up to a bound, and every failure to get an answer
//! typed as [`BatchError::Unreachable`] in words — a TLS failure says so and names the host
//! ("TLS: certificate not trusted for host …").

mod connector;

use super::BatchError;
use bytes::Bytes;
use connector::{Connector, TlsFailure};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::path::Path;
use std::time::Duration;

/// Largest answer read (a `GET /jobs` of a big cluster is a few MB).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// One HTTP answer, read whole.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The body.
    pub body: Bytes,
}

/// A backend's URL, checked: `http://` or `https://` with a host, without a trailing `/`;
/// `key` and `example` name it in the refusal.
pub(crate) fn check_url(backend: &'static str, url: &str, key: &str, example: &str) -> Result<String, BatchError> {
    let url = url.trim().trim_end_matches('/').to_string();
    match url.parse::<Uri>() {
        Ok(uri) if matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some() => Ok(url),
        _ => Err(BatchError::Refused {
            backend,
            detail: format!("{key} '{url}' is not an http:// or https:// URL (e.g. {example})"),
        }),
    }
}

/// Whether `url` (checked by [`check_url`]) is an `https://` one.
pub(crate) fn is_https(url: &str) -> bool {
    url.starts_with("https://")
}

/// The TLS a backend needs: none when none of its URLs is `https://` (a CA file is then a
/// mistake worth saying), else the system's roots plus `ca_cert`.
pub(crate) fn tls_for(
    backend: &'static str,
    https: bool,
    ca_cert: Option<&Path>,
) -> Result<Option<rustls::ClientConfig>, BatchError> {
    match (https, ca_cert) {
        (false, None) => Ok(None),
        (false, Some(path)) => Err(BatchError::Refused {
            backend,
            detail: format!(
                "ca_cert {} is given but no URL is https://: drop it, or name the service's https:// URL",
                path.display()
            ),
        }),
        (true, ca_cert) => crate::client_tls::client_config(ca_cert)
            .map(Some)
            .map_err(|e| BatchError::Refused { backend, detail: e.to_string() }),
    }
}

/// An HTTP client bound to one backend's name and timeout.
pub(crate) struct HttpClient {
    backend: &'static str,
    timeout: Duration,
    client: Client<Connector, Full<Bytes>>,
}

impl HttpClient {
    /// A client whose connects and exchanges each take at most `timeout`; `https://` URLs need
    /// `tls` (see [`tls_for`]).
    pub fn new(backend: &'static str, timeout: Duration, tls: Option<rustls::ClientConfig>) -> HttpClient {
        let connector = Connector::new(timeout, tls);
        HttpClient { backend, timeout, client: Client::builder(TokioExecutor::new()).build(connector) }
    }

    /// Sends `request` and reads the answer; `what` names the call in errors (never a secret).
    pub async fn exchange(&self, what: &str, request: Request<Full<Bytes>>) -> Result<Answer, BatchError> {
        let unreachable = |detail: String| BatchError::Unreachable { backend: self.backend, detail };
        let exchange = async {
            let response =
                self.client.request(request).await.map_err(|e| unreachable(format!("{what}: {}", words(&e))))?;
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

/// An error and its causes on one line; a TLS failure alone, as it already says everything
/// (hyper's "client error (Connect)" around it says nothing).
fn words(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<TlsFailure>() {
            return tls.to_string();
        }
        let text = e.to_string();
        if !parts.last().is_some_and(|last| last.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

/// The start of an answer body on one line, for error messages.
pub(crate) fn preview(body: &[u8]) -> String {
    String::from_utf8_lossy(&body[..body.len().min(300)]).split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Loopback HTTP and HTTPS servers for the REST backends' tests.
#[cfg(test)]
pub(crate) mod test_server {
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    /// A TLS acceptor with a self-signed certificate for `localhost`, and that certificate
    /// written as a CA file into `dir`.
    pub(crate) fn localhost_tls(dir: &Path) -> (tokio_rustls::TlsAcceptor, PathBuf) {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
        let ca = dir.join("site-ca.pem");
        std::fs::write(&ca, cert.cert.pem()).expect("write the CA file");
        let key = rustls_pki_types::PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der());
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key.into())
            .expect("server config");
        (tokio_rustls::TlsAcceptor::from(Arc::new(config)), ca)
    }

    /// A loopback HTTP/1.1 server for one test: answers each request with `answer(head, body)`
    /// and keeps every request it got; over HTTPS when `tls` is given (then its URL names
    /// `localhost`).
    pub(crate) async fn serve_on(
        answer: impl Fn(&str, &str) -> (u16, String) + Send + Sync + 'static,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let base = match tls {
            Some(_) => format!("https://localhost:{port}"),
            None => format!("http://127.0.0.1:{port}"),
        };
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let answer: Answerer = std::sync::Arc::new(answer);
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let (answer, log, tls) = (answer.clone(), log.clone(), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        Some(tls) => {
                            if let Ok(stream) = tls.accept(stream).await {
                                answer_requests(stream, answer, log).await;
                            }
                        }
                        None => answer_requests(stream, answer, log).await,
                    }
                });
            }
        });
        (base, seen)
    }

    type Answerer = std::sync::Arc<dyn Fn(&str, &str) -> (u16, String) + Send + Sync>;

    /// Answers the requests of one connection until it closes.
    async fn answer_requests(
        mut stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
        answer: Answerer,
        log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = Vec::new();
        loop {
            let mut chunk = [0u8; 4096];
            let Ok(n) = stream.read(&mut chunk).await else { return };
            if n == 0 {
                return;
            }
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).to_string();
            let Some((head, body)) = text.split_once("\r\n\r\n") else { continue };
            let length = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            if body.len() < length {
                continue;
            }
            let (head, body) = (head.to_string(), body[..length].to_string());
            buf.drain(..head.len() + 4 + length);
            log.lock().expect("log").push(format!("{head}\n\n{body}"));
            let (status, reply) = answer(&head, &body);
            let out = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{reply}",
                reply.len()
            );
            if stream.write_all(out.as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An HTTPS server on loopback that answers every request `200 ok` and reports the SNI
    /// name of each handshake; its URL names `localhost`.
    async fn https_server(acceptor: tokio_rustls::TlsAcceptor) -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (names, seen) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { return };
                let (acceptor, names) = (acceptor.clone(), names.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                    let _ = names.send(tls.get_ref().1.server_name().unwrap_or("").to_string());
                    let mut head = Vec::new();
                    while !head.ends_with(b"\r\n\r\n") {
                        let mut byte = [0u8; 1];
                        if tls.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let _ = tls.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        (port, seen)
    }

    fn get(url: &str) -> Request<Full<Bytes>> {
        Request::get(url).body(Full::default()).expect("request")
    }

    #[tokio::test]
    async fn https_works_with_the_site_ca_and_sends_the_host_as_sni() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (acceptor, ca) = test_server::localhost_tls(dir.path());
        let (port, mut names) = https_server(acceptor).await;
        let tls = tls_for("test", true, Some(&ca)).expect("TLS config");
        let client = HttpClient::new("test", Duration::from_secs(10), tls);
        let answer =
            client.exchange("GET ping", get(&format!("https://localhost:{port}/ping"))).await.expect("answered");
        assert_eq!((answer.status, &answer.body[..]), (StatusCode::OK, &b"ok"[..]));
        assert_eq!(names.recv().await.as_deref(), Some("localhost"));
    }

    #[tokio::test]
    async fn an_untrusted_or_misnamed_certificate_is_a_tls_error_naming_the_host() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (acceptor, ca) = test_server::localhost_tls(dir.path());
        let (port, _names) = https_server(acceptor).await;

        // Neither the system's roots nor another site's CA trust this self-signed certificate.
        let elsewhere = tempfile::tempdir().expect("tempdir");
        let (_, other_ca) = test_server::localhost_tls(elsewhere.path());
        let untrusted = |err: BatchError| {
            assert!(matches!(err, BatchError::Unreachable { .. }), "{err}");
            let text = err.to_string();
            assert!(text.contains("GET ping: TLS: certificate not trusted for host localhost"), "{text}");
            assert!(text.contains("ca_cert"), "says what to do: {text}");
        };
        let url = format!("https://localhost:{port}/ping");
        let client =
            HttpClient::new("test", Duration::from_secs(10), tls_for("test", true, Some(&other_ca)).expect("TLS"));
        untrusted(client.exchange("GET ping", get(&url)).await.unwrap_err());
        // The system's roots alone (an empty store, in a bare container, is a setup error that
        // says what to give instead).
        match tls_for("test", true, None) {
            Ok(tls) => untrusted(
                HttpClient::new("test", Duration::from_secs(10), tls)
                    .exchange("GET ping", get(&url))
                    .await
                    .unwrap_err(),
            ),
            Err(err) => assert!(err.to_string().contains("no trusted certificates"), "{err}"),
        }

        let tls = tls_for("test", true, Some(&ca)).expect("TLS config");
        let client = HttpClient::new("test", Duration::from_secs(10), tls);
        let err = client.exchange("GET ping", get(&format!("https://127.0.0.1:{port}/ping"))).await.unwrap_err();
        assert!(err.to_string().contains("TLS: certificate not valid for host 127.0.0.1"), "{err}");
    }

    #[tokio::test]
    async fn a_plain_http_server_behind_an_https_url_fails_the_handshake_in_words() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = tcp.read(&mut buf).await;
                let _ = tcp.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").await;
            }
        });
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, ca) = test_server::localhost_tls(dir.path());
        let client = HttpClient::new("test", Duration::from_secs(10), tls_for("test", true, Some(&ca)).expect("TLS"));
        let err = client.exchange("GET ping", get(&format!("https://localhost:{port}/"))).await.unwrap_err();
        assert!(err.to_string().contains("TLS: handshake with localhost failed"), "{err}");
    }

    #[test]
    fn urls_may_be_https_and_a_ca_file_needs_one() {
        assert_eq!(
            check_url("t", " https://api.example.org/v2/ ", "the URL", "x").expect("https"),
            "https://api.example.org/v2"
        );
        assert!(check_url("t", "http://127.0.0.1:6820", "the URL", "x").is_ok());
        let err = check_url("t", "ftp://host", "the URL", "https://x").unwrap_err();
        assert!(err.to_string().contains("not an http:// or https:// URL"), "{err}");
        assert!(tls_for("t", false, None).expect("plain").is_none());
        let err = tls_for("t", false, Some(Path::new("/etc/tela/ca.pem"))).unwrap_err();
        assert!(err.to_string().contains("no URL is https://"), "{err}");
        let err = tls_for("t", true, Some(Path::new("/nonexistent/ca.pem"))).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }
}
