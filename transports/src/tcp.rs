//! The TCP+TLS fallback for sites that block UDP: TLS 1.3 over one TCP connection with
//! `TCP_NODELAY`, multiplexed by [`crate::mux`], admitted like QUIC. The dialler's half also
//! runs over any other byte stream that reaches the acceptor ([`dial_over`]): an `ssh -W`
//! child's pipes or a relay's spliced connection carry the same TLS session end to end.

use crate::accept::Refusal;
use crate::admission::{self, DialOutcome, RefusalReason, EXPORTER_LABEL};
use crate::connection::{Connection, Transport};
use crate::endpoint::{ConnectError, Settings};
use crate::mux::{self, Side, Timing};
use crate::tls::{self, SessionFactsError};
use std::net::SocketAddr;
use std::sync::Arc;
use tela_core::NodeId;
use tokio::net::TcpStream;

/// Sets `TCP_NODELAY` (tunnelled token streams must not wait for Nagle) and reports what the
/// socket says afterwards.
fn no_delay(tcp: &TcpStream) -> std::io::Result<bool> {
    tcp.set_nodelay(true)?;
    tcp.nodelay()
}

fn timing(s: &Settings) -> Timing {
    Timing { keep_alive: s.keep_alive, idle_timeout: s.idle_timeout }
}

/// Dials `addr` over TCP, runs TLS and admission. The caller bounds the time.
pub(crate) async fn dial(settings: &Settings, addr: SocketAddr) -> Result<Connection, ConnectError> {
    let unreachable = |detail: String| ConnectError::Unreachable { addr, transport: Transport::Tcp, detail };
    let tcp = TcpStream::connect(addr).await.map_err(|e| unreachable(e.to_string()))?;
    let nodelay = no_delay(&tcp).map_err(|e| unreachable(format!("setting TCP_NODELAY: {e}")))?;
    dial_over(settings, tcp, addr, Some(nodelay)).await
}

/// Runs TLS and admission as the dialler over a byte stream that already reaches the acceptor
/// at `addr` (a TCP connection, an `ssh -W` child's pipes, a relay's spliced connection).
/// `nodelay` is what the stream's socket says of `TCP_NODELAY`, where it has one. The caller
/// bounds the time.
pub(crate) async fn dial_over<S>(
    settings: &Settings,
    io: S,
    addr: SocketAddr,
    nodelay: Option<bool>,
) -> Result<Connection, ConnectError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let handshake = |detail: String| ConnectError::Handshake { addr, transport: Transport::Tcp, detail };
    let config = tls::client_config(&settings.identity, &settings.alpn)
        .map_err(|e| ConnectError::Setup { transport: Transport::Tcp, detail: e.to_string() })?;
    let tls =
        tokio_rustls::TlsConnector::from(Arc::new(config)).connect(tls::server_name(), io).await.map_err(|e| {
            match rustls_error(&e) {
                Some(rustls::Error::AlertReceived(rustls::AlertDescription::NoApplicationProtocol)) => {
                    ConnectError::VersionMismatch {
                        addr,
                        detail: format!("it does not speak {}", String::from_utf8_lossy(tls::ALPN)),
                    }
                }
                _ => handshake(e.to_string()),
            }
        })?;
    let (peer, exporter) = {
        let (_, session) = tls.get_ref();
        if session.alpn_protocol() != Some(&settings.alpn[..]) {
            return Err(ConnectError::VersionMismatch { addr, detail: "it agreed on no application protocol".into() });
        }
        session_facts(session.peer_certificates(), |out| session.export_keying_material(out, EXPORTER_LABEL, Some(b"")))
            .map_err(|e| handshake(e.to_string()))?
    };
    let (conn, mut control, activation) =
        mux::start(tls, Side::Dialler, Transport::Tcp, nodelay).await.map_err(|e| handshake(e.to_string()))?;
    let binding = settings.binding(exporter, peer);
    match admission::dial(&mut control.write, &mut control.read, &binding).await {
        Ok(()) => {
            activation.activate(control, timing(settings));
            Ok(Connection::from_mux(peer, addr, conn))
        }
        Err(outcome) => {
            conn.close("admission failed");
            Err(match outcome {
                DialOutcome::Refused(reason) => ConnectError::Refused { addr, reason },
                DialOutcome::PeerNotAdmitted => ConnectError::PeerNotAdmitted { addr },
                DialOutcome::Broken(detail) => handshake(detail),
            })
        }
    }
}

/// Completes an accepted TCP connection: TLS, then admission. The caller bounds the time.
pub(crate) async fn accept(tcp: TcpStream, remote: SocketAddr, settings: &Settings) -> Result<Connection, Refusal> {
    let refusal = |peer, reason| Refusal { peer, remote, transport: Transport::Tcp, reason };
    let nodelay =
        no_delay(&tcp).map_err(|e| refusal(None, RefusalReason::Handshake(format!("setting TCP_NODELAY: {e}"))))?;
    let config = tls::server_config(&settings.identity, &settings.alpn)
        .map_err(|e| refusal(None, RefusalReason::Handshake(e.to_string())))?;
    let tls = tokio_rustls::TlsAcceptor::from(Arc::new(config))
        .accept(tcp)
        .await
        .map_err(|e| refusal(None, RefusalReason::Handshake(e.to_string())))?;
    let (peer, exporter) = {
        let (_, session) = tls.get_ref();
        session_facts(session.peer_certificates(), |out| session.export_keying_material(out, EXPORTER_LABEL, Some(b"")))
            .map_err(|e| refusal(None, RefusalReason::Handshake(e.to_string())))?
    };
    let (conn, mut control, activation) = mux::start(tls, Side::Acceptor, Transport::Tcp, Some(nodelay))
        .await
        .map_err(|e| refusal(Some(peer), RefusalReason::ProtocolViolation(e.to_string())))?;
    let binding = settings.binding(exporter, peer);
    match admission::accept(&mut control.write, &mut control.read, &binding).await {
        Ok(()) => {
            activation.activate(control, timing(settings));
            Ok(Connection::from_mux(peer, remote, conn))
        }
        Err(reason) => {
            // The Refuse frame is queued; finishing the stream and closing the session flush
            // it before the connection ends.
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut control.write).await;
            conn.close(&format!("refused: {reason}"));
            Err(refusal(Some(peer), reason))
        }
    }
}

fn session_facts(
    certs: Option<&[rustls::pki_types::CertificateDer<'static>]>,
    export: impl FnOnce([u8; 32]) -> Result<[u8; 32], rustls::Error>,
) -> Result<(NodeId, [u8; 32]), SessionFactsError> {
    let peer = tls::peer_node_id(certs.unwrap_or_default())?;
    let exporter = export([0u8; 32]).map_err(SessionFactsError::Exporter)?;
    Ok((peer, exporter))
}

/// The rustls error inside an I/O error from tokio-rustls, if any.
fn rustls_error(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alpn_alert_is_found_inside_the_io_error() {
        let e = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::NoApplicationProtocol),
        );
        assert!(matches!(
            rustls_error(&e),
            Some(rustls::Error::AlertReceived(rustls::AlertDescription::NoApplicationProtocol))
        ));
    }
}
