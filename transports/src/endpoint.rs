//! [`Endpoint`]: listens for QUIC and TCP+TLS on one port number and dials out, yielding only
//! authenticated, admitted [`Connection`]s.
//!
//! A gateway or anchor uses [`Endpoint::listen`] and [`Endpoint::accept`]; a serving node,
//! which has no inbound port, uses [`Endpoint::dialer`] and [`Endpoint::connect`]. How
//! incoming connections are handled is described in the `accept` module.

use crate::accept::{accept_loop, Accepted};
use crate::admission::{Binding, JoinSecret, RefusalReason};
use crate::connection::{Connection, Transport};
use crate::identity::Identity;
use crate::{quic, tcp, tls};
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tela_core::NodeId;
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;

/// Connections and refusals waiting for [`Endpoint::accept`].
const ACCEPT_QUEUE: usize = 64;

/// How an endpoint authenticates and keeps connections alive.
#[derive(Clone, Debug)]
pub struct EndpointConfig {
    /// This node's identity.
    pub identity: Identity,
    /// The federation's join secret.
    pub join_secret: JoinSecret,
    /// How often an idle connection sends a keep-alive (keeps NAT mappings open).
    pub keep_alive: Duration,
    /// How long a connection may hear nothing from the peer before it is closed.
    pub idle_timeout: Duration,
    /// The longest a dial or an incoming connection may take to be authenticated and admitted.
    pub handshake_timeout: Duration,
    /// In [`TransportMode::Auto`], how long to wait for a QUIC handshake before trying TCP.
    pub quic_fallback_after: Duration,
    /// Whether [`Endpoint::listen`] accepts QUIC (UDP).
    pub listen_quic: bool,
    /// Whether [`Endpoint::listen`] accepts TCP+TLS.
    pub listen_tcp: bool,
}

impl EndpointConfig {
    /// Defaults: keep-alive 5 s, idle timeout 30 s, handshake
    /// timeout 10 s, QUIC fallback after 3 s, listening on both QUIC and TCP.
    pub fn new(identity: Identity, join_secret: JoinSecret) -> EndpointConfig {
        EndpointConfig {
            identity,
            join_secret,
            keep_alive: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(10),
            quic_fallback_after: Duration::from_secs(3),
            listen_quic: true,
            listen_tcp: true,
        }
    }
}

/// What the handshakes need; shared by every task of an endpoint.
pub(crate) struct Settings {
    pub identity: Identity,
    pub join_secret: JoinSecret,
    pub keep_alive: Duration,
    pub idle_timeout: Duration,
    pub handshake_timeout: Duration,
    pub alpn: Vec<u8>,
}

impl Settings {
    /// What admission binds its proofs to on a connection to `peer` with TLS exporter
    /// material `exporter`.
    pub(crate) fn binding(&self, exporter: [u8; 32], peer: NodeId) -> Binding<'_> {
        Binding { secret: &self.join_secret, exporter, own: self.identity.node_id(), peer }
    }
}

/// Which transport [`Endpoint::connect`] uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TransportMode {
    /// QUIC, falling back to TCP+TLS when QUIC gets no answer (UDP blocked).
    #[default]
    Auto,
    /// QUIC only.
    Quic,
    /// TCP+TLS only.
    Tcp,
}

impl fmt::Display for TransportMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransportMode::Auto => "auto",
            TransportMode::Quic => "quic",
            TransportMode::Tcp => "tcp",
        })
    }
}

/// A transport mode name that is not `auto`, `quic` or `tcp`.
#[derive(Debug, thiserror::Error)]
#[error("unknown transport {0:?}: use auto, quic or tcp")]
pub struct UnknownTransportMode(String);

impl FromStr for TransportMode {
    type Err = UnknownTransportMode;

    fn from_str(s: &str) -> Result<TransportMode, UnknownTransportMode> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(TransportMode::Auto),
            "quic" => Ok(TransportMode::Quic),
            "tcp" => Ok(TransportMode::Tcp),
            _ => Err(UnknownTransportMode(s.to_string())),
        }
    }
}

impl ConnectError {
    /// Whether dialling the same address again cannot succeed until someone changes a setting
    /// (the join secret, the release) on one side or the other.
    pub fn is_permanent(&self) -> bool {
        match self {
            ConnectError::Refused { reason, .. } => reason.is_permanent(),
            ConnectError::PeerNotAdmitted { .. } | ConnectError::VersionMismatch { .. } => true,
            // One transport reached the peer and was refused for good: the other cannot help.
            ConnectError::NeitherTransport { quic, tcp, .. } => quic.is_permanent() || tcp.is_permanent(),
            _ => false,
        }
    }
}

/// Why a dial did not produce a connection. Nothing is left open after any of these.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The acceptor refused admission.
    #[error("the gateway refused this node: {reason} — {}", .reason.hint())]
    Refused {
        /// Who refused.
        addr: SocketAddr,
        /// Why.
        reason: RefusalReason,
    },
    /// The acceptor could not prove it knows the join secret.
    #[error(
        "the peer at {addr} does not know this federation's join secret (its admission proof \
         is wrong) — check the --join address and --join-secret / TELA_JOIN_SECRET"
    )]
    PeerNotAdmitted {
        /// The peer.
        addr: SocketAddr,
    },
    /// The peer speaks another version of the Tela transport protocol.
    #[error(
        "the peer at {addr} speaks another Tela protocol version ({detail}) — run the same \
         Tela release on both sides"
    )]
    VersionMismatch {
        /// The peer.
        addr: SocketAddr,
        /// What disagreed.
        detail: String,
    },
    /// The TLS handshake or the admission exchange failed.
    #[error(
        "handshake with {addr} over {transport} failed: {detail} — check that the address is a \
         Tela gateway or anchor"
    )]
    Handshake {
        /// The peer.
        addr: SocketAddr,
        /// The transport tried.
        transport: Transport,
        /// What failed.
        detail: String,
    },
    /// The peer could not be reached at all.
    #[error(
        "cannot reach {addr} over {transport}: {detail} — check the address, the port and any \
         firewall"
    )]
    Unreachable {
        /// The peer.
        addr: SocketAddr,
        /// The transport tried.
        transport: Transport,
        /// What the network said.
        detail: String,
    },
    /// No answer in time.
    #[error(
        "no answer from {addr} over {transport} within {after:?} — check the address, the port \
         and any firewall{}",
        if *.transport == Transport::Quic { " (where UDP is blocked, use --transport tcp or auto)" } else { "" }
    )]
    TimedOut {
        /// The peer.
        addr: SocketAddr,
        /// The transport tried.
        transport: Transport,
        /// How long we waited.
        after: Duration,
    },
    /// In auto mode, neither transport reached the peer.
    #[error("cannot connect to {addr} over QUIC ({quic}) nor over TCP ({tcp})")]
    NeitherTransport {
        /// The peer.
        addr: SocketAddr,
        /// Why QUIC failed.
        quic: Box<ConnectError>,
        /// Why TCP failed.
        tcp: Box<ConnectError>,
    },
    /// A local socket or TLS configuration could not be set up.
    #[error("cannot set up the {transport} client: {detail}")]
    Setup {
        /// The transport.
        transport: Transport,
        /// What failed.
        detail: String,
    },
}

impl ConnectError {
    /// Whether the failure says only that the peer could not be reached (so another
    /// transport may do better), rather than that it answered and said no.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            ConnectError::Unreachable { .. } | ConnectError::TimedOut { .. } | ConnectError::NeitherTransport { .. }
        )
    }
}

/// An endpoint could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// A socket could not be bound.
    #[error("cannot listen on {addr} ({protocol}): {source} — is another process using the port?")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// "UDP" or "TCP".
        protocol: &'static str,
        /// What the OS said.
        source: std::io::Error,
    },
    /// Both QUIC and TCP were turned off.
    #[error("the endpoint listens on neither QUIC nor TCP — enable at least one")]
    NothingToListen,
    /// TLS or QUIC configuration failed (a bug, or an unusable identity).
    #[error("cannot configure TLS: {0}")]
    Tls(String),
    /// Called outside a tokio runtime.
    #[error("no tokio runtime is running; create the endpoint from inside one")]
    NoRuntime,
}

/// Listens and dials; see the module docs.
pub struct Endpoint {
    settings: Arc<Settings>,
    quic_fallback_after: Duration,
    local_addr: Option<SocketAddr>,
    server: Option<quinn::Endpoint>,
    dial_v4: Mutex<Option<quinn::Endpoint>>,
    dial_v6: Mutex<Option<quinn::Endpoint>>,
    accepted: tokio::sync::Mutex<Option<mpsc::Receiver<Accepted>>>,
    acceptor: Mutex<Option<AbortOnDropHandle<()>>>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("node_id", &self.node_id())
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// An endpoint that only dials out (a serving node: no inbound port).
    pub fn dialer(config: EndpointConfig) -> Result<Endpoint, EndpointError> {
        tokio::runtime::Handle::try_current().map_err(|_| EndpointError::NoRuntime)?;
        let (settings, fallback) = settings(config);
        tls::client_config(&settings.identity, &settings.alpn).map_err(|e| EndpointError::Tls(e.to_string()))?;
        Ok(Endpoint {
            settings: Arc::new(settings),
            quic_fallback_after: fallback,
            local_addr: None,
            server: None,
            dial_v4: Mutex::new(None),
            dial_v6: Mutex::new(None),
            accepted: tokio::sync::Mutex::new(None),
            acceptor: Mutex::new(None),
        })
    }

    /// Listens on `addr` for QUIC (UDP) and TCP+TLS on the same port number (with port 0,
    /// one free port for both is picked) and starts accepting. It can dial out as well.
    pub fn listen(addr: SocketAddr, config: EndpointConfig) -> Result<Endpoint, EndpointError> {
        tokio::runtime::Handle::try_current().map_err(|_| EndpointError::NoRuntime)?;
        if !config.listen_quic && !config.listen_tcp {
            return Err(EndpointError::NothingToListen);
        }
        let (want_quic, want_tcp) = (config.listen_quic, config.listen_tcp);
        let mut endpoint = Endpoint::dialer(config)?;
        let (udp, tcp) = bind_same_port(addr, want_quic, want_tcp)?;
        let local = match (&udp, &tcp) {
            (Some(u), _) => u.local_addr(),
            (None, Some(t)) => t.local_addr(),
            (None, None) => return Err(EndpointError::NothingToListen),
        }
        .map_err(|source| EndpointError::Bind { addr, protocol: "UDP", source })?;
        let server = match udp {
            Some(udp) => {
                let config = quic::server_config(&endpoint.settings).map_err(|e| EndpointError::Tls(e.to_string()))?;
                let runtime = quinn::default_runtime().ok_or(EndpointError::NoRuntime)?;
                Some(
                    quinn::Endpoint::new(quinn::EndpointConfig::default(), Some(config), udp, runtime)
                        .map_err(|source| EndpointError::Bind { addr: local, protocol: "UDP", source })?,
                )
            }
            None => None,
        };
        let tcp = match tcp {
            Some(t) => Some(tokio::net::TcpListener::from_std(t).map_err(|source| EndpointError::Bind {
                addr: local,
                protocol: "TCP",
                source,
            })?),
            None => None,
        };
        let (tx, rx) = mpsc::channel(ACCEPT_QUEUE);
        let task = tokio::spawn(accept_loop(server.clone(), tcp, endpoint.settings.clone(), tx));
        endpoint.local_addr = Some(local);
        endpoint.server = server;
        endpoint.accepted = tokio::sync::Mutex::new(Some(rx));
        endpoint.acceptor = Mutex::new(Some(AbortOnDropHandle::new(task)));
        tracing::info!(
            addr = %local,
            node = %endpoint.node_id(),
            quic = want_quic,
            tcp = want_tcp,
            "listening"
        );
        Ok(endpoint)
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.settings.identity.node_id()
    }

    /// Where [`Endpoint::listen`] listens; `None` for a dialer.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// The next admitted connection or refusal; `None` once the endpoint stopped accepting
    /// (or never listened).
    pub async fn accept(&self) -> Option<Accepted> {
        let mut rx = self.accepted.lock().await;
        rx.as_mut()?.recv().await
    }

    /// Stops accepting: the accept task and every handshake in progress end, new QUIC
    /// connections are refused and the TCP listener is closed. Established connections are
    /// not affected; close them through their handles.
    pub fn stop_accepting(&self) {
        if let Some(server) = &self.server {
            server.set_server_config(None);
        }
        drop(self.acceptor.lock().unwrap_or_else(PoisonError::into_inner).take());
    }

    /// Dials `addr`, authenticates it and runs admission, over the transport `mode` picks.
    pub async fn connect(&self, addr: SocketAddr, mode: TransportMode) -> Result<Connection, ConnectError> {
        match mode {
            TransportMode::Quic => self.connect_quic(addr, self.settings.handshake_timeout).await,
            TransportMode::Tcp => self.connect_tcp(addr).await,
            TransportMode::Auto => {
                let quic = match self.connect_quic(addr, self.quic_fallback_after).await {
                    Ok(conn) => return Ok(conn),
                    Err(e) if !e.is_unreachable() => return Err(e),
                    Err(e) => e,
                };
                tracing::info!(%addr, "QUIC failed ({quic}); falling back to TCP+TLS");
                match self.connect_tcp(addr).await {
                    Ok(conn) => Ok(conn),
                    Err(tcp) if tcp.is_unreachable() => {
                        Err(ConnectError::NeitherTransport { addr, quic: Box::new(quic), tcp: Box::new(tcp) })
                    }
                    Err(tcp) => Err(tcp),
                }
            }
        }
    }

    /// Authenticates and admits the acceptor at the far end of `io`, a byte stream that
    /// already reaches it by some other way than this endpoint's own TCP dial (an `ssh -W`
    /// child's pipes, a relay that splices bytes): the TLS session runs end to end through it,
    /// exactly as over TCP+TLS, so whatever carries the bytes learns nothing of the tunnel.
    /// `addr` names the acceptor in the connection and in errors; `nodelay` is what the
    /// stream's own socket says of `TCP_NODELAY`, where it has one. Bounded by the handshake
    /// timeout.
    pub async fn connect_over<S>(
        &self,
        io: S,
        addr: SocketAddr,
        nodelay: Option<bool>,
    ) -> Result<Connection, ConnectError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let within = self.settings.handshake_timeout;
        tokio::time::timeout(within, tcp::dial_over(&self.settings, io, addr, nodelay))
            .await
            .unwrap_or(Err(ConnectError::TimedOut { addr, transport: Transport::Tcp, after: within }))
    }

    /// The longest a dial may take to be authenticated and admitted.
    pub fn handshake_timeout(&self) -> Duration {
        self.settings.handshake_timeout
    }

    async fn connect_quic(&self, addr: SocketAddr, handshake_within: Duration) -> Result<Connection, ConnectError> {
        let endpoint = self.dial_endpoint(addr)?;
        quic::dial(&endpoint, &self.settings, addr, handshake_within).await
    }

    async fn connect_tcp(&self, addr: SocketAddr) -> Result<Connection, ConnectError> {
        let within = self.settings.handshake_timeout;
        tokio::time::timeout(within, tcp::dial(&self.settings, addr)).await.unwrap_or(Err(ConnectError::TimedOut {
            addr,
            transport: Transport::Tcp,
            after: within,
        }))
    }

    /// The client-side QUIC socket for `addr`'s address family, bound on first use.
    fn dial_endpoint(&self, addr: SocketAddr) -> Result<quinn::Endpoint, ConnectError> {
        let (slot, bind) = if addr.is_ipv4() {
            (&self.dial_v4, SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)))
        } else {
            (&self.dial_v6, SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)))
        };
        let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(endpoint) = &*slot {
            return Ok(endpoint.clone());
        }
        let endpoint = quinn::Endpoint::client(bind).map_err(|e| ConnectError::Setup {
            transport: Transport::Quic,
            detail: format!("binding a UDP socket on {bind}: {e}"),
        })?;
        *slot = Some(endpoint.clone());
        Ok(endpoint)
    }
}

fn settings(config: EndpointConfig) -> (Settings, Duration) {
    (
        Settings {
            identity: config.identity,
            join_secret: config.join_secret,
            keep_alive: config.keep_alive,
            idle_timeout: config.idle_timeout,
            handshake_timeout: config.handshake_timeout,
            alpn: tls::ALPN.to_vec(),
        },
        config.quic_fallback_after,
    )
}

type Bound = (Option<std::net::UdpSocket>, Option<std::net::TcpListener>);

/// Binds UDP and/or TCP on one port number. With port 0 it asks for a free UDP port and
/// retries when that number is taken on TCP.
fn bind_same_port(addr: SocketAddr, quic: bool, tcp: bool) -> Result<Bound, EndpointError> {
    let bind_udp = |a: SocketAddr| {
        std::net::UdpSocket::bind(a).map_err(|source| EndpointError::Bind { addr: a, protocol: "UDP", source })
    };
    let bind_tcp = |a: SocketAddr| {
        let listener = std::net::TcpListener::bind(a).map_err(|source| EndpointError::Bind {
            addr: a,
            protocol: "TCP",
            source,
        })?;
        listener.set_nonblocking(true).map_err(|source| EndpointError::Bind { addr: a, protocol: "TCP", source })?;
        Ok::<_, EndpointError>(listener)
    };
    if !(quic && tcp && addr.port() == 0) {
        let udp = quic.then(|| bind_udp(addr)).transpose()?;
        let tcp = tcp.then(|| bind_tcp(addr)).transpose()?;
        return Ok((udp, tcp));
    }
    let mut last = None;
    for _ in 0..16 {
        let udp = bind_udp(addr)?;
        let port = udp.local_addr().map_err(|source| EndpointError::Bind { addr, protocol: "UDP", source })?.port();
        match bind_tcp(SocketAddr::new(addr.ip(), port)) {
            Ok(tcp) => return Ok((Some(udp), Some(tcp))),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or(EndpointError::NothingToListen))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(secret: &str) -> EndpointConfig {
        EndpointConfig::new(Identity::generate().expect("identity"), JoinSecret::new(secret).expect("secret"))
    }

    #[test]
    fn transport_modes_parse() {
        assert_eq!("auto".parse::<TransportMode>().ok(), Some(TransportMode::Auto));
        assert_eq!("QUIC".parse::<TransportMode>().ok(), Some(TransportMode::Quic));
        assert_eq!("tcp".parse::<TransportMode>().ok(), Some(TransportMode::Tcp));
        let err = "udp".parse::<TransportMode>().expect_err("not a mode");
        assert!(err.to_string().contains("auto, quic or tcp"));
    }

    #[test]
    fn endpoints_need_a_runtime() {
        assert!(matches!(Endpoint::dialer(config("s")), Err(EndpointError::NoRuntime)));
    }

    /// The dialler's TLS and admission run over a byte stream some other way provides (here an
    /// in-memory pipe spliced to a TCP connection, as ssh or a relay splice theirs).
    #[tokio::test]
    async fn a_dial_runs_over_any_byte_stream_that_reaches_the_acceptor() {
        let listener = Endpoint::listen((Ipv4Addr::LOCALHOST, 0).into(), config("s")).expect("listen");
        let addr = listener.local_addr().expect("bound");
        let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("tcp");
        let (near, mut far) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let _ = tokio::io::copy_bidirectional(&mut far, &mut tcp).await;
        });
        let client = Endpoint::dialer(config("s")).expect("dialer");
        let conn = client.connect_over(near, addr, None).await.expect("admitted over the pipe");
        assert_eq!(conn.peer_id(), listener.node_id());
        assert_eq!(conn.transport(), Transport::Tcp);
        let Some(Accepted::Admitted(theirs)) = listener.accept().await else { panic!("refused") };
        assert_eq!(theirs.peer_id(), client.node_id());
    }

    /// A dialler speaking another ALPN version gets a version-mismatch error on both
    /// transports (the ALPN is not configurable from outside the crate).
    #[tokio::test]
    async fn another_protocol_version_is_a_typed_error() {
        let listener = Endpoint::listen((Ipv4Addr::LOCALHOST, 0).into(), config("s")).expect("listen");
        let addr = listener.local_addr().expect("bound");
        let (mut settings, _) = settings(config("s"));
        settings.alpn = b"tela/999".to_vec();
        let client = Endpoint { settings: Arc::new(settings), ..Endpoint::dialer(config("s")).expect("dialer") };
        for mode in [TransportMode::Quic, TransportMode::Tcp] {
            let err = client.connect(addr, mode).await.expect_err("must be refused");
            assert!(matches!(err, ConnectError::VersionMismatch { .. }), "{mode}: {err}");
            assert!(err.to_string().contains("same Tela release"), "{err}");
        }
    }
}
