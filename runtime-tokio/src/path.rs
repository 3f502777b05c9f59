//! How a node's dials reach a gateway: directly, through the login host's `ssh`
//! ([`crate::ssh`]), or through a `tela relay` ([`crate::relay`]).
//!
//! Every dial of the runtime — the `--join` keepers and the gateways learned from the
//! registry — goes through one [`DialPath`]. Through ssh or a relay the tunnel is always
//! TCP+TLS (QUIC's UDP cannot be carried by either): the byte stream comes from the path, and
//! the TLS handshake and admission run end to end over it ([`Endpoint::connect_over`]). The
//! gateway address is resolved at the far end (by the login host's `sshd`, by the relay), so
//! names that only the cluster's network knows work. A broken path ends the connection like a
//! broken TCP connection does, and the keeper redials through the path with backoff.

use crate::relay;
use crate::ssh::SshVia;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use tela_transports::{ConnectError, Connection, Endpoint, TransportMode};

/// The way to the gateways; see the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DialPath {
    /// The node's own UDP or TCP socket.
    #[default]
    Direct,
    /// `ssh -W gateway:port` through a login host.
    Ssh(SshVia),
    /// The first of these relays (`host:port`) that answers.
    Relays(Vec<String>),
}

impl fmt::Display for DialPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DialPath::Direct => f.write_str("directly"),
            DialPath::Ssh(via) => write!(f, "through ssh to {}", via.destination),
            DialPath::Relays(relays) => write!(f, "through the relay {}", relays.join(" or ")),
        }
    }
}

/// Why a dial through a path failed.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The gateway's name did not resolve (direct dials only).
    #[error(transparent)]
    Resolve(ResolveError),
    /// The path itself failed: ssh could not be started or exited, no relay answered.
    #[error("{0}")]
    Path(String),
    /// The gateway was reached and the handshake or admission failed.
    #[error("{0}")]
    Connect(ConnectError),
}

impl DialError {
    /// Whether dialling again cannot succeed until someone changes a setting.
    pub fn is_permanent(&self) -> bool {
        matches!(self, DialError::Connect(e) if e.is_permanent())
    }
}

impl DialPath {
    /// Dials `addr` (`host:port`) over this path. `mode` applies to direct dials; the other
    /// paths carry TCP+TLS.
    pub async fn dial(&self, endpoint: &Endpoint, addr: &str, mode: TransportMode) -> Result<Connection, DialError> {
        match self {
            DialPath::Direct => {
                let target = resolve(addr).await.map_err(DialError::Resolve)?;
                endpoint.connect(target, mode).await.map_err(DialError::Connect)
            }
            DialPath::Ssh(via) => dial_ssh(via, endpoint, addr).await,
            DialPath::Relays(relays) => dial_relays(relays, endpoint, addr).await,
        }
    }

    /// Whether this path can carry `mode` (only direct dials can carry QUIC).
    pub fn carries(&self, mode: TransportMode) -> bool {
        *self == DialPath::Direct || mode != TransportMode::Quic
    }
}

async fn dial_ssh(via: &SshVia, endpoint: &Endpoint, addr: &str) -> Result<Connection, DialError> {
    let stream = via.spawn(addr).map_err(|e| {
        DialError::Path(format!(
            "cannot start ssh for {} ({e}); is `ssh` on PATH, or --ssh-command right?",
            via.destination
        ))
    })?;
    let tail = stream.stderr_tail();
    match endpoint.connect_over(stream, label(addr), None).await {
        Ok(conn) => Ok(conn),
        Err(e) if e.is_permanent() => Err(DialError::Connect(e)),
        Err(e) => {
            // The child has usually said why (host key, permission, no route): give it a moment.
            for _ in 0..20 {
                if tail.get().is_some() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(DialError::Path(match tail.get() {
                Some(said) => format!("through ssh to {}: {e} (ssh said: {said})", via.destination),
                None => format!("through ssh to {}: {e}", via.destination),
            }))
        }
    }
}

async fn dial_relays(relays: &[String], endpoint: &Endpoint, addr: &str) -> Result<Connection, DialError> {
    let mut failures = Vec::new();
    for r in relays {
        match relay::connect_through(r, addr).await {
            Ok(stream) => {
                let nodelay = stream.nodelay().ok();
                let at = match addr.parse::<SocketAddr>() {
                    Ok(a) => a,
                    Err(_) => stream.peer_addr().unwrap_or_else(|_| unspecified(addr)),
                };
                return endpoint.connect_over(stream, at, nodelay).await.map_err(DialError::Connect);
            }
            Err(e) => {
                tracing::debug!("relay {r} did not carry a tunnel to {addr}: {e}");
                failures.push(format!("{r}: {e}"));
            }
        }
    }
    Err(DialError::Path(format!("no relay carried a tunnel to {addr} ({})", failures.join("; "))))
}

/// The address a connection through ssh is labelled with: the gateway's, when `addr` is one,
/// else the unspecified address with its port. Not resolved here: the login host resolves it,
/// and a compute node's resolver may take long to fail for names outside its network.
fn label(addr: &str) -> SocketAddr {
    addr.parse().unwrap_or_else(|_| unspecified(addr))
}

fn unspecified(addr: &str) -> SocketAddr {
    let port = addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap_or(0);
    SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))
}

/// Why a gateway's `host:port` did not resolve on this host. Nothing was dialled.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The resolver failed (unknown name, no DNS, not `host:port`).
    #[error("cannot resolve {addr}: {source}")]
    Lookup {
        /// The address as given.
        addr: String,
        /// What the resolver said.
        #[source]
        source: std::io::Error,
    },
    /// The name resolved to an empty list.
    #[error("{addr} resolves to no address")]
    NoAddress {
        /// The address as given.
        addr: String,
    },
}

/// Resolves `host:port` on this host.
pub(crate) async fn resolve(addr: &str) -> Result<SocketAddr, ResolveError> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(a);
    }
    let mut addrs = tokio::net::lookup_host(addr)
        .await
        .map_err(|source| ResolveError::Lookup { addr: addr.to_string(), source })?;
    addrs.next().ok_or_else(|| ResolveError::NoAddress { addr: addr.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_direct_dials_carry_quic() {
        let ssh = DialPath::Ssh(SshVia { destination: "login".into(), command: None });
        assert!(DialPath::Direct.carries(TransportMode::Quic));
        assert!(!ssh.carries(TransportMode::Quic));
        assert!(ssh.carries(TransportMode::Auto));
        assert!(DialPath::Relays(vec!["r:1".into()]).carries(TransportMode::Tcp));
        assert_eq!(unspecified("gw.internal:7000"), SocketAddr::from((Ipv4Addr::UNSPECIFIED, 7000)));
    }

    /// When ssh fails (no route, refused key), the node's error carries what ssh said.
    #[tokio::test]
    async fn a_failing_ssh_is_quoted_in_the_error() {
        use tela_transports::{EndpointConfig, Identity, JoinSecret};
        let secret = JoinSecret::new("s").expect("secret");
        let endpoint =
            Endpoint::dialer(EndpointConfig::new(Identity::generate().expect("identity"), secret)).expect("dialer");
        let said = "ssh: connect to host login port 22: Connection refused";
        let path = DialPath::Ssh(SshVia {
            destination: "me@login".into(),
            command: Some(format!("sh -c 'echo {said} >&2; exit 255' x")),
        });
        let err = path.dial(&endpoint, "gw.internal:7000", TransportMode::Tcp).await.expect_err("ssh failed");
        assert!(matches!(err, DialError::Path(_)), "{err}");
        let text = err.to_string();
        assert!(text.contains("through ssh to me@login") && text.contains(said), "{text}");
        assert!(!err.is_permanent(), "a failing ssh is retried");
    }
}
