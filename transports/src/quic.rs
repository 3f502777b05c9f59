//! The QUIC transport (quinn): datagrams for gossip, bidirectional streams for everything
//! reliable, keep-alives so an outbound-only node behind NAT keeps its mapping.

use crate::accept::Refusal;
use crate::admission::{self, DialOutcome, RefusalReason, EXPORTER_LABEL};
use crate::connection::{CloseReason, Connection, ConnectionError, DatagramError, Transport};
use crate::endpoint::{ConnectError, Settings};
use crate::tls::{self, PeerCertError, SessionFactsError};
use bytes::Bytes;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tela_core::{NodeId, MAX_DATAGRAM};
use tokio::io::AsyncWriteExt;

/// Application close code: an ordinary close; the reason is free text.
const CLOSE_NORMAL: u32 = 0;
/// Application close code: the acceptor refused admission; the reason is an encoded
/// [`RefusalReason`].
const CLOSE_REFUSED: u32 = 1;
/// Application close code: the dialler found the acceptor's admission proof wrong.
const CLOSE_NOT_ADMITTED: u32 = 2;

/// The TLS alert `no_application_protocol` (RFC 8446 §6), as a QUIC crypto error.
const NO_APPLICATION_PROTOCOL: u8 = 120;

/// Most bidirectional streams a peer may have open toward us at once.
const MAX_STREAMS: u32 = 256;

/// Why a QUIC configuration could not be built from the endpoint's settings (a bug, or an
/// unusable identity). Nothing is changed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QuicConfigError {
    /// The idle timeout does not fit QUIC's variable-length integer.
    #[error(transparent)]
    IdleTimeout(#[from] quinn::VarIntBoundsExceeded),
    /// rustls refused the identity or the protocol versions.
    #[error(transparent)]
    Tls(#[from] rustls::Error),
    /// The rustls configuration offers no cipher suite QUIC can start with.
    #[error(transparent)]
    CipherSuite(#[from] quinn::crypto::rustls::NoInitialCipherSuite),
}

fn transport_config(s: &Settings) -> Result<quinn::TransportConfig, QuicConfigError> {
    let mut t = quinn::TransportConfig::default();
    t.keep_alive_interval(Some(s.keep_alive));
    t.max_idle_timeout(Some(quinn::IdleTimeout::try_from(s.idle_timeout)?));
    t.max_concurrent_bidi_streams(MAX_STREAMS.into());
    t.max_concurrent_uni_streams(0u32.into());
    // Room for a few hundred gossip datagrams in each direction.
    t.datagram_receive_buffer_size(Some(256 * MAX_DATAGRAM));
    t.datagram_send_buffer_size(256 * MAX_DATAGRAM);
    Ok(t)
}

pub(crate) fn server_config(s: &Settings) -> Result<quinn::ServerConfig, QuicConfigError> {
    let tls = tls::server_config(&s.identity, &s.alpn)?;
    let crypto = QuicServerConfig::try_from(tls)?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(Arc::new(transport_config(s)?));
    Ok(config)
}

pub(crate) fn client_config(s: &Settings) -> Result<quinn::ClientConfig, QuicConfigError> {
    let tls = tls::client_config(&s.identity, &s.alpn)?;
    let crypto = QuicClientConfig::try_from(tls)?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(Arc::new(transport_config(s)?));
    Ok(config)
}

/// Dials `addr` and runs admission. `handshake_within` bounds the QUIC handshake (Auto mode
/// passes its short fallback delay here); admission is bounded by the settings' timeout.
pub(crate) async fn dial(
    endpoint: &quinn::Endpoint,
    settings: &Settings,
    addr: SocketAddr,
    handshake_within: Duration,
) -> Result<Connection, ConnectError> {
    let config = client_config(settings)
        .map_err(|e| ConnectError::Setup { transport: Transport::Quic, detail: e.to_string() })?;
    let connecting = endpoint.connect_with(config, addr, tls::SERVER_NAME).map_err(|e| ConnectError::Unreachable {
        addr,
        transport: Transport::Quic,
        detail: e.to_string(),
    })?;
    let conn = match tokio::time::timeout(handshake_within, connecting).await {
        Err(_) => return Err(ConnectError::TimedOut { addr, transport: Transport::Quic, after: handshake_within }),
        Ok(Err(e)) => return Err(classify(addr, e, handshake_within)),
        Ok(Ok(conn)) => conn,
    };
    let fail = |conn: &quinn::Connection, e: ConnectError| {
        conn.close(CLOSE_NORMAL.into(), b"admission failed");
        e
    };
    let (peer, exporter) = session_facts(&conn).map_err(|e| fail(&conn, handshake_error(addr, e.to_string())))?;
    let binding = settings.binding(exporter, peer);
    let admitted = tokio::time::timeout(settings.handshake_timeout, async {
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| DialOutcome::Broken(e.to_string()))?;
        admission::dial(&mut send, &mut recv, &binding).await?;
        let _ = send.shutdown().await;
        Ok(())
    })
    .await;
    match admitted {
        Ok(Ok(())) => Ok(Connection::from_quic(peer, QuicConnection::new(conn))),
        // Usually the acceptor has closed the connection already; when it welcomed us with
        // another version, we close it.
        Ok(Err(DialOutcome::Refused(reason))) => Err(fail(&conn, ConnectError::Refused { addr, reason })),
        Ok(Err(DialOutcome::PeerNotAdmitted)) => {
            conn.close(CLOSE_NOT_ADMITTED.into(), b"join secret mismatch");
            Err(ConnectError::PeerNotAdmitted { addr })
        }
        Ok(Err(DialOutcome::Broken(detail))) => Err(match conn.close_reason() {
            // The acceptor closed the connection with its refusal before our read saw the
            // Refuse frame.
            Some(quinn::ConnectionError::ApplicationClosed(c)) if c.error_code == CLOSE_REFUSED.into() => {
                ConnectError::Refused { addr, reason: RefusalReason::decode(&c.reason) }
            }
            _ => fail(&conn, handshake_error(addr, detail)),
        }),
        Err(_) => Err(fail(
            &conn,
            ConnectError::TimedOut { addr, transport: Transport::Quic, after: settings.handshake_timeout },
        )),
    }
}

/// Completes an incoming connection and runs admission; the caller bounds the time.
pub(crate) async fn accept(incoming: quinn::Incoming, settings: &Settings) -> Result<Connection, Refusal> {
    let remote = incoming.remote_address();
    let refusal = |peer, reason| Refusal { peer, remote, transport: Transport::Quic, reason };
    let conn = incoming.await.map_err(|e| refusal(None, RefusalReason::Handshake(e.to_string())))?;
    let (peer, exporter) = session_facts(&conn).map_err(|e| {
        let detail = e.to_string();
        conn.close(CLOSE_NORMAL.into(), detail.as_bytes());
        refusal(None, RefusalReason::Handshake(detail))
    })?;
    let binding = settings.binding(exporter, peer);
    let (mut send, mut recv) = conn
        .accept_bi()
        .await
        .map_err(|e| refusal(Some(peer), RefusalReason::ProtocolViolation(format!("no control stream: {e}"))))?;
    match admission::accept(&mut send, &mut recv, &binding).await {
        Ok(()) => {
            let _ = send.shutdown().await;
            Ok(Connection::from_quic(peer, QuicConnection::new(conn)))
        }
        Err(reason) => {
            let _ = send.shutdown().await;
            conn.close(CLOSE_REFUSED.into(), &reason.encode());
            Err(refusal(Some(peer), reason))
        }
    }
}

/// The peer's id and the admission exporter of an established connection.
fn session_facts(conn: &quinn::Connection) -> Result<(NodeId, [u8; 32]), SessionFactsError> {
    let chain = conn
        .peer_identity()
        .and_then(|any| any.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>().ok())
        .ok_or(PeerCertError::Missing)?;
    let peer = tls::peer_node_id(&chain)?;
    let mut exporter = [0u8; 32];
    conn.export_keying_material(&mut exporter, EXPORTER_LABEL, b"").map_err(|_| SessionFactsError::QuicExporter)?;
    Ok((peer, exporter))
}

fn handshake_error(addr: SocketAddr, detail: String) -> ConnectError {
    ConnectError::Handshake { addr, transport: Transport::Quic, detail }
}

/// Turns a failed QUIC handshake into the error a user can act on.
fn classify(addr: SocketAddr, e: quinn::ConnectionError, waited: Duration) -> ConnectError {
    use quinn::ConnectionError as E;
    match e {
        E::ConnectionClosed(close)
            if close.error_code == quinn::TransportErrorCode::crypto(NO_APPLICATION_PROTOCOL) =>
        {
            ConnectError::VersionMismatch {
                addr,
                detail: format!("it does not speak {}", String::from_utf8_lossy(tls::ALPN)),
            }
        }
        E::ConnectionClosed(_) | E::ApplicationClosed(_) | E::TransportError(_) => handshake_error(addr, e.to_string()),
        E::TimedOut => ConnectError::TimedOut { addr, transport: Transport::Quic, after: waited },
        E::VersionMismatch | E::Reset | E::LocallyClosed | E::CidsExhausted => {
            ConnectError::Unreachable { addr, transport: Transport::Quic, detail: e.to_string() }
        }
    }
}

fn close_reason_of(e: &quinn::ConnectionError, local: &OnceLock<String>) -> CloseReason {
    use quinn::ConnectionError as E;
    match e {
        E::ApplicationClosed(c) if c.error_code == CLOSE_REFUSED.into() => {
            // Refusals end connections during admission, where the dialler reads them
            // (`connect`); here only the acceptor's words matter.
            CloseReason::Peer { reason: format!("refused: {}", RefusalReason::decode(&c.reason)) }
        }
        E::ApplicationClosed(c) => CloseReason::Peer { reason: String::from_utf8_lossy(&c.reason).into_owned() },
        E::LocallyClosed => CloseReason::Local { reason: local.get().cloned().unwrap_or_default() },
        E::TimedOut => CloseReason::TimedOut,
        other => CloseReason::Lost { detail: other.to_string() },
    }
}

/// A quinn connection plus the reason this side gave when closing it (quinn keeps only
/// "locally closed").
#[derive(Clone)]
pub(crate) struct QuicConnection {
    conn: quinn::Connection,
    local_reason: Arc<OnceLock<String>>,
}

impl QuicConnection {
    fn new(conn: quinn::Connection) -> QuicConnection {
        QuicConnection { conn, local_reason: Arc::new(OnceLock::new()) }
    }

    fn closed_error(&self, e: &quinn::ConnectionError) -> ConnectionError {
        ConnectionError::Closed(close_reason_of(e, &self.local_reason))
    }

    pub(crate) fn stable_id(&self) -> usize {
        self.conn.stable_id()
    }

    pub(crate) fn remote_address(&self) -> SocketAddr {
        self.conn.remote_address()
    }

    pub(crate) fn send_datagram(&self, payload: Bytes) -> Result<(), DatagramError> {
        let len = payload.len();
        self.conn.send_datagram(payload).map_err(|e| match e {
            quinn::SendDatagramError::TooLarge => {
                DatagramError::TooLarge { len, max: self.conn.max_datagram_size().unwrap_or(0) }
            }
            quinn::SendDatagramError::UnsupportedByPeer | quinn::SendDatagramError::Disabled => {
                DatagramError::Unsupported
            }
            quinn::SendDatagramError::ConnectionLost(e) => {
                DatagramError::Closed(close_reason_of(&e, &self.local_reason))
            }
        })
    }

    pub(crate) async fn read_datagram(&self) -> Result<Bytes, ConnectionError> {
        self.conn.read_datagram().await.map_err(|e| self.closed_error(&e))
    }

    pub(crate) async fn open_stream(&self) -> Result<(quinn::SendStream, quinn::RecvStream), ConnectionError> {
        self.conn.open_bi().await.map_err(|e| self.closed_error(&e))
    }

    pub(crate) async fn accept_stream(&self) -> Result<(quinn::SendStream, quinn::RecvStream), ConnectionError> {
        self.conn.accept_bi().await.map_err(|e| self.closed_error(&e))
    }

    pub(crate) fn close(&self, reason: &str) {
        if self.conn.close_reason().is_some() {
            return;
        }
        let _ = self.local_reason.set(reason.to_string());
        // A close frame must fit one packet; quinn truncates longer reasons itself, but keep
        // it well inside.
        let bytes = &reason.as_bytes()[..reason.len().min(512)];
        self.conn.close(CLOSE_NORMAL.into(), bytes);
    }

    pub(crate) async fn closed(&self) -> CloseReason {
        let e = self.conn.closed().await;
        close_reason_of(&e, &self.local_reason)
    }

    pub(crate) fn close_reason(&self) -> Option<CloseReason> {
        self.conn.close_reason().map(|e| close_reason_of(&e, &self.local_reason))
    }
}
