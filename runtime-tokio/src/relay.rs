//! `tela relay`: forwards nodes' TCP+TLS tunnels to gateways without terminating them, for
//! compute nodes whose only way out is a host beside them (a login host, a service node).
//!
//! # The exchange
//!
//! A node (`tela node --relay host:port`) opens a TCP connection to the relay and sends one
//! plaintext line naming the gateway it wants, then waits for one line back:
//!
//! ```text
//! node  → relay   TELA-RELAY 1 gw.example.org:7000\n
//! relay → node    OK\n                       (or: NO <why, in words>\n, then close)
//! ```
//!
//! After `OK` the relay copies bytes both ways until either side closes. The node then runs its
//! ordinary TLS handshake and join-secret admission through it, end to end with the gateway:
//! the relay holds no key, sees only ciphertext, and cannot impersonate either side. (The
//! TLS ClientHello cannot name the gateway instead: every Tela peer is authenticated by key,
//! and clients present one fixed server name.)
//!
//! # Not an open proxy
//!
//! The relay connects only to the gateways it was told to allow (`--allow HOST:PORT`,
//! repeatable; at least one): a target is allowed when its text equals an allowed entry (host
//! names compared without case) or when both resolve to a common address. Anything else is
//! answered `NO` and logged. A preface must arrive within [`PREFACE_TIMEOUT`] and fit in
//! [`MAX_PREFACE`] bytes; at most [`MAX_RELAYED`] tunnels are relayed at once (further
//! connections wait in the kernel's accept queue). Relays keep no state: run several, and nodes
//! use the first that answers (see [`crate::path`]).

use std::collections::HashSet;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// The first word of a node's request, then the exchange's version.
pub const MAGIC: &str = "TELA-RELAY 1";

/// The longest request line, newline included.
pub const MAX_PREFACE: usize = 320;

/// How long a node has to send its request line, and the relay to reach the gateway.
pub const PREFACE_TIMEOUT: Duration = Duration::from_secs(10);

/// Tunnels relayed at once.
pub const MAX_RELAYED: usize = 4096;

/// What `tela relay` runs with.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// Where nodes connect.
    pub listen: SocketAddr,
    /// The gateways (`host:port`) nodes may be relayed to.
    pub allow: Vec<String>,
}

/// The relay could not start.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// No gateway allowed: the relay would forward nothing (or, worse, everything).
    #[error("no gateway to relay to: give at least one --allow HOST:PORT (the gateways' anchor addresses)")]
    NothingAllowed,
    /// An allowed entry is not `host:port`.
    #[error("--allow '{0}' is not HOST:PORT (e.g. gw.example.org:7000)")]
    BadAllow(String),
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(io::Error),
    /// The listening socket.
    #[error("cannot listen on {addr}: {source} — is another process using the port?")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What the OS said.
        source: io::Error,
    },
}

/// A running relay; dropping it stops accepting and ends every relayed tunnel.
pub struct Relay {
    local_addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Relay {
    /// Binds and starts relaying.
    pub async fn start(config: RelayConfig) -> Result<Relay, RelayError> {
        if config.allow.is_empty() {
            return Err(RelayError::NothingAllowed);
        }
        for a in &config.allow {
            if split_host_port(a).is_none() {
                return Err(RelayError::BadAllow(a.clone()));
            }
        }
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| RelayError::Bind { addr: config.listen, source })?;
        let local_addr = listener.local_addr().map_err(|source| RelayError::Bind { addr: config.listen, source })?;
        let allow = Arc::new(Allow::new(&config.allow));
        tracing::info!(
            addr = %local_addr,
            "relaying nodes' tunnels on {local_addr} to {}",
            config.allow.join(", ")
        );
        let task = tokio::spawn(accept_loop(listener, allow));
        Ok(Relay { local_addr, task })
    }

    /// Where nodes connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

/// Run a relay on a host that both the compute nodes and the gateways reach (a login host):
/// it forwards nodes' tunnels (`tela node --relay HOST:PORT`) to the allowed gateways without
/// terminating their TLS; it holds no secret and no key.
///
/// The first line on stdout is `relay on ADDR`. Ctrl-C or SIGTERM stops it (relayed tunnels
/// end; their nodes redial through another relay or this one once it is back).
#[derive(Debug, Clone, clap::Args)]
pub struct RelayArgs {
    /// Where nodes connect.
    #[arg(long, env = "TELA_RELAY_LISTEN", default_value = "127.0.0.1:7100", value_name = "HOST:PORT")]
    pub listen: SocketAddr,

    /// A gateway (its anchor address, as nodes --join it) that nodes may be relayed to;
    /// repeat for each gateway of the federation. Nothing else is relayed.
    #[arg(long, env = "TELA_RELAY_ALLOW", value_delimiter = ',', value_name = "HOST:PORT", required = true)]
    pub allow: Vec<String>,
}

impl RelayArgs {
    /// Relays until Ctrl-C or SIGTERM.
    pub async fn run(self) -> Result<(), RelayError> {
        let relay = Relay::start(RelayConfig { listen: self.listen, allow: self.allow }).await?;
        {
            use std::io::Write;
            // Best effort: a supervisor that closed our stdout must not stop the relay.
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "relay on {}", relay.local_addr());
            let _ = stdout.flush();
        }
        let stop = crate::signals::terminate().map_err(RelayError::Signals)?;
        stop.await;
        tracing::info!("relay stopping");
        Ok(())
    }
}

async fn accept_loop(listener: TcpListener, allow: Arc<Allow>) {
    let slots = Arc::new(Semaphore::new(MAX_RELAYED));
    let mut tunnels = JoinSet::new();
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let (node, from) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("relay: accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            Some(_) = tunnels.join_next(), if !tunnels.is_empty() => continue,
        };
        let allow = allow.clone();
        tunnels.spawn(async move {
            let _permit = permit;
            if let Err(e) = relay_one(node, from, &allow).await {
                tracing::debug!(%from, "relay: tunnel from {from} ended: {e}");
            }
        });
    }
}

/// Reads one node's request, connects it to the gateway if allowed, and copies bytes.
async fn relay_one(mut node: TcpStream, from: SocketAddr, allow: &Allow) -> io::Result<()> {
    let _ = node.set_nodelay(true);
    let setup = async {
        let target = match read_request(&mut node).await {
            Ok(t) => t,
            Err(e) => {
                refuse(&mut node, &e.to_string()).await;
                return Err(e);
            }
        };
        if !allow.permits(&target).await {
            tracing::warn!(%from, "relay: refused {from} a tunnel to {target}: not an allowed gateway");
            refuse(&mut node, &format!("{target} is not a gateway this relay forwards to")).await;
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "target not allowed"));
        }
        match TcpStream::connect(&target).await {
            Ok(gateway) => Ok((target, gateway)),
            Err(e) => {
                refuse(&mut node, &format!("cannot reach {target} from the relay: {e}")).await;
                Err(e)
            }
        }
    };
    let (target, mut gateway) = tokio::time::timeout(PREFACE_TIMEOUT, setup)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no request or no gateway in time"))??;
    let _ = gateway.set_nodelay(true);
    node.write_all(b"OK\n").await?;
    tracing::info!(%from, "relay: tunnel from {from} to {target}");
    let (up, down) = tokio::io::copy_bidirectional(&mut node, &mut gateway).await?;
    tracing::info!(%from, "relay: tunnel from {from} to {target} closed ({up} bytes up, {down} down)");
    Ok(())
}

/// Answers `NO why` and closes gently: what the node sent beyond its request is read and
/// dropped first (briefly), since closing with unread bytes resets the connection and can
/// destroy the answer before the node reads it.
async fn refuse(node: &mut TcpStream, why: &str) {
    if node.write_all(format!("NO {why}\n").as_bytes()).await.is_err() {
        return;
    }
    let _ = node.shutdown().await;
    let mut sink = [0u8; 1024];
    let drain = async {
        for _ in 0..16 {
            if matches!(node.read(&mut sink).await, Ok(0) | Err(_)) {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// Reads `MAGIC target\n`, one byte at a time so nothing after the newline is consumed.
async fn read_request(node: &mut TcpStream) -> io::Result<String> {
    let line = read_line(node).await?;
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
    let target = line.strip_prefix(MAGIC).and_then(|r| r.strip_prefix(' ')).ok_or_else(|| {
        bad("not a Tela relay request (this is a tela relay: point nodes' --relay here, with the same Tela release)")
    })?;
    if split_host_port(target).is_none() {
        return Err(bad("the requested gateway is not HOST:PORT"));
    }
    Ok(target.to_string())
}

/// One line of at most [`MAX_PREFACE`] bytes, without its newline.
async fn read_line(stream: &mut TcpStream) -> io::Result<String> {
    let mut line = Vec::with_capacity(64);
    loop {
        let b = stream.read_u8().await?;
        if b == b'\n' {
            break;
        }
        if line.len() + 1 >= MAX_PREFACE {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
        }
        line.push(b);
    }
    String::from_utf8(line).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "line is not UTF-8"))
}

/// Why no stream to the target came through a relay. The relay's connection, if any, is
/// dropped; the caller may try another relay.
#[derive(Debug, thiserror::Error)]
pub enum RelayDialError {
    /// The relay's address could not be connected to.
    #[error("cannot reach the relay: {0}")]
    Unreachable(#[source] io::Error),
    /// The request would not fit a relay preface.
    #[error("the gateway address {target} is too long for a relay request")]
    TooLong {
        /// The gateway address asked for.
        target: String,
    },
    /// The relay's connection failed while the request was being sent.
    #[error("the relay closed: {0}")]
    Closed(#[source] io::Error),
    /// The relay's answer line could not be read.
    #[error("the relay did not answer ({0})")]
    NoAnswer(#[source] io::Error),
    /// The relay answered `NO`.
    #[error("the relay refused: {why}")]
    Refused {
        /// The reason it gave.
        why: String,
    },
    /// The answer was neither `OK` nor `NO`: not a relay, or another release.
    #[error("the relay answered {answer:.60?}: is it a tela relay of this release?")]
    NotARelay {
        /// What it answered.
        answer: String,
    },
    /// The exchange did not finish in time.
    #[error("no answer within {after:?}")]
    TimedOut {
        /// How long we waited.
        after: Duration,
    },
}

/// Opens a stream to `target` through the relay at `relay`: connects, asks, and returns the
/// TCP connection once the relay said `OK` (bounded by [`PREFACE_TIMEOUT`]).
pub async fn connect_through(relay: &str, target: &str) -> Result<TcpStream, RelayDialError> {
    let exchange = async {
        let mut stream = TcpStream::connect(relay).await.map_err(RelayDialError::Unreachable)?;
        let _ = stream.set_nodelay(true);
        let request = format!("{MAGIC} {target}\n");
        if request.len() > MAX_PREFACE {
            return Err(RelayDialError::TooLong { target: target.to_string() });
        }
        stream.write_all(request.as_bytes()).await.map_err(RelayDialError::Closed)?;
        let answer = read_line(&mut stream).await.map_err(RelayDialError::NoAnswer)?;
        match answer.strip_prefix("NO ") {
            _ if answer == "OK" => Ok(stream),
            Some(why) => Err(RelayDialError::Refused { why: why.to_string() }),
            None => Err(RelayDialError::NotARelay { answer }),
        }
    };
    tokio::time::timeout(PREFACE_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| Err(RelayDialError::TimedOut { after: PREFACE_TIMEOUT }))
}

/// `host:port` split, with `[v6]` brackets removed; `None` when it is not that.
fn split_host_port(s: &str) -> Option<(&str, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    (!host.is_empty() && !host.contains(char::is_whitespace) && !host.contains('/')).then_some((host, port))
}

/// The allowed gateways.
struct Allow {
    /// Entries as given, host in lower case.
    names: HashSet<String>,
    entries: Vec<String>,
}

impl Allow {
    fn new(entries: &[String]) -> Allow {
        Allow { names: entries.iter().map(|e| e.to_ascii_lowercase()).collect(), entries: entries.to_vec() }
    }

    /// Equal text, else a common resolved address (a node may name the gateway by another name
    /// or by its address). Resolution happens per request, so DNS changes apply.
    async fn permits(&self, target: &str) -> bool {
        if self.names.contains(&target.to_ascii_lowercase()) {
            return true;
        }
        let Ok(wanted) = tokio::net::lookup_host(target).await else { return false };
        let wanted: HashSet<SocketAddr> = wanted.collect();
        for entry in &self.entries {
            if let Ok(addrs) = tokio::net::lookup_host(entry.as_str()).await {
                if addrs.into_iter().any(|a| wanted.contains(&a)) {
                    return true;
                }
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn allowed_targets_are_spliced_and_others_refused_in_words() {
        let target = echo_server().await;
        let relay =
            Relay::start(RelayConfig { listen: "127.0.0.1:0".parse().expect("addr"), allow: vec![target.to_string()] })
                .await
                .expect("relay");
        let relay_addr = relay.local_addr().to_string();
        let mut s = connect_through(&relay_addr, &target.to_string()).await.expect("allowed");
        s.write_all(b"ping").await.expect("write");
        let mut got = [0u8; 4];
        s.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"ping");

        let other = echo_server().await;
        let err = connect_through(&relay_addr, &other.to_string()).await.expect_err("not allowed");
        assert!(matches!(err, RelayDialError::Refused { .. }), "{err}");
        assert!(err.to_string().contains("not a gateway this relay forwards to"), "{err}");

        // Another name for an allowed address is allowed.
        let by_name = format!("localhost:{}", target.port());
        if tokio::net::lookup_host(by_name.as_str()).await.is_ok_and(|mut a| a.any(|a| a == target)) {
            connect_through(&relay_addr, &by_name).await.expect("same address by name");
        }
    }

    #[tokio::test]
    async fn a_stranger_gets_told_what_this_is() {
        let relay = Relay::start(RelayConfig {
            listen: "127.0.0.1:0".parse().expect("addr"),
            allow: vec!["127.0.0.1:9".into()],
        })
        .await
        .expect("relay");
        let mut s = TcpStream::connect(relay.local_addr()).await.expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.expect("write");
        let mut answer = String::new();
        s.read_to_string(&mut answer).await.expect("read");
        assert!(answer.starts_with("NO not a Tela relay request"), "{answer}");
    }

    #[tokio::test]
    async fn a_relay_without_allowed_gateways_does_not_start() {
        let err = Relay::start(RelayConfig { listen: "127.0.0.1:0".parse().expect("addr"), allow: vec![] })
            .await
            .err()
            .expect("refused");
        assert!(matches!(err, RelayError::NothingAllowed));
        assert!(split_host_port("[::1]:7000").is_some());
        assert!(split_host_port("gw:0").is_none());
        assert!(split_host_port("gw").is_none());
    }
}
