//! The client-facing listener: TCP with `TCP_NODELAY` on every accepted socket, optional TLS
//! termination (rustls), and HTTP/1.1 and HTTP/2 on each connection (hyper-util's auto
//! builder, which tells them apart by the client's preface or ALPN).
//!
//! A request whose headers do not arrive within [`Limits::header_timeout`](crate::service::Limits::header_timeout) gets its connection
//! closed (hyper offers no response at that point); a slow body gets `408` from the service.
//! Shutdown stops accepting, lets in-flight responses finish for a grace period, then cuts
//! what is left. Every connection task belongs to the server task.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::service::{handle, Shared};

/// How long a TLS handshake may take.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("cannot read {what} from {path}: {detail} (expected PEM)")]
    Pem {
        /// Certificate or key.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// The certificate and key do not make a server configuration.
    #[error("the TLS certificate and key do not fit together: {0}")]
    Config(String),
}

/// A TLS acceptor for a PEM certificate chain and private key.
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let pem = |what, path: &Path, e: &dyn std::fmt::Display| TlsError::Pem {
        what,
        path: path.to_path_buf(),
        detail: e.to_string(),
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| pem("the certificate chain", cert, &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| pem("the certificate chain", cert, &e))?;
    if certs.is_empty() {
        return Err(pem("the certificate chain", cert, &"no CERTIFICATE block"));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| pem("the private key", key, &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves `listener` until `stop` is cancelled, then drains for at most `grace`.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared>,
    stop: CancellationToken,
    grace: Duration,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(shared.limits.header_timeout).keep_alive(true);
    builder.http2().timer(TokioTimer::new()).keep_alive_interval(Duration::from_secs(20));
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => {
                let (stream, remote) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!("accepting a client connection failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!(%remote, "cannot set TCP_NODELAY: {e}");
                }
                let (shared, builder, tls, watcher) = (shared.clone(), builder.clone(), tls.clone(), graceful.watcher());
                connections.spawn(async move {
                    let service = service_fn(move |req| handle(shared.clone(), req));
                    match tls {
                        None => {
                            let conn = builder.serve_connection(TokioIo::new(stream), service);
                            log_end(remote, watcher.watch(conn.into_owned()).await);
                        }
                        Some(acceptor) => {
                            let tls_stream = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                                Ok(Ok(s)) => s,
                                Ok(Err(e)) => return tracing::debug!(%remote, "TLS handshake failed: {e}"),
                                Err(_) => return tracing::debug!(%remote, "TLS handshake timed out"),
                            };
                            let conn = builder.serve_connection(TokioIo::new(tls_stream), service);
                            log_end(remote, watcher.watch(conn.into_owned()).await);
                        }
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!("responses still open after the {grace:?} shutdown grace; closing them");
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

fn log_end(remote: SocketAddr, result: Result<(), Box<dyn std::error::Error + Send + Sync>>) {
    if let Err(e) = result {
        tracing::debug!(%remote, "client connection from {remote} ended: {e}");
    }
}
