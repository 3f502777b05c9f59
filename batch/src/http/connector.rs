//! The connector under the REST backends' HTTP client: TCP for `http://`, TCP then a rustls
//! handshake for `https://` (SNI and certificate check against the URL's host), and handshake
//! failures turned into words an operator can act on ([`TlsFailure`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::uri::Scheme;
use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rustls::CertificateError;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tower_service::Service;

/// A TLS connection to `host` failed; the words name the host and, where it helps, the fix.
#[derive(Debug, thiserror::Error)]
#[error("TLS: {0}")]
pub(crate) struct TlsFailure(String);

impl TlsFailure {
    /// The failure of the handshake with `host`, from the error tokio-rustls returned.
    fn handshake(host: &str, error: &io::Error) -> TlsFailure {
        let Some(tls) = error.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) else {
            return TlsFailure(format!("handshake with {host} failed: {error}"));
        };
        TlsFailure(match tls {
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer | CertificateError::BadSignature) => {
                format!(
                    "certificate not trusted for host {host} (its issuer is not in the system's store: give the \
                     site's CA certificate as ca_cert = \"path\" in [spin.backend])"
                )
            }
            rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            ) => format!("certificate not valid for host {host}: {tls} (use the host name the certificate names)"),
            rustls::Error::InvalidCertificate(
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. },
            ) => format!("certificate of host {host} is out of its validity period: {tls}"),
            rustls::Error::InvalidCertificate(_) => format!("certificate not trusted for host {host}: {tls}"),
            rustls::Error::InvalidMessage(_) => {
                format!("handshake with {host} failed: {tls} (does it speak plain HTTP? then use an http:// URL)")
            }
            _ => format!("handshake with {host} failed: {tls}"),
        })
    }
}

/// Opens connections for `http://` and `https://` URIs.
#[derive(Clone)]
pub(crate) struct Connector {
    tcp: HttpConnector,
    /// `None`: the backend has no `https://` URL, and an `https://` URI is refused.
    tls: Option<TlsConnector>,
}

impl Connector {
    /// TCP connects within `timeout`; TLS with `tls` (HTTP/1.1 is offered by ALPN).
    pub fn new(timeout: std::time::Duration, tls: Option<rustls::ClientConfig>) -> Connector {
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(timeout));
        tcp.enforce_http(false);
        let tls = tls.map(|mut config| {
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            TlsConnector::from(Arc::new(config))
        });
        Connector { tcp, tls }
    }
}

impl Service<Uri> for Connector {
    type Response = Stream;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.tcp.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let mut tcp = self.tcp.clone();
        let tls = self.tls.clone();
        Box::pin(async move {
            let https = uri.scheme() == Some(&Scheme::HTTPS);
            // An IPv6 literal comes bracketed; its SNI/IP check wants it bare.
            let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_string();
            let stream = tcp.call(uri).await?;
            if !https {
                return Ok(Stream::Plain(stream));
            }
            let Some(tls) = tls else {
                return Err(TlsFailure(format!("no TLS set up for host {host}")).into());
            };
            let name = ServerName::try_from(host.clone())
                .map_err(|e| TlsFailure(format!("'{host}' is not a host name TLS can check: {e}")))?;
            let stream = tls.connect(name, stream.into_inner()).await.map_err(|e| TlsFailure::handshake(&host, &e))?;
            Ok(Stream::Tls(Box::new(TokioIo::new(stream))))
        })
    }
}

/// A connection, plain or TLS.
pub(crate) enum Stream {
    /// `http://`.
    Plain(TokioIo<TcpStream>),
    /// `https://` (boxed: a TLS session is large).
    Tls(Box<TokioIo<TlsStream<TcpStream>>>),
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        match self {
            Stream::Plain(s) => s.connected(),
            Stream::Tls(s) => s.inner().get_ref().0.connected(),
        }
    }
}

impl Read for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl Write for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }
}
