//! The anchor role: a public member with no engine that outbound-only nodes dial.
//!
//! An anchor listens (QUIC and TCP on one port), admits peers that know the join secret (and
//! logs the reason for every refusal), gossips the registry like any member, and is counted
//! as SERVE with no models — it is never routable itself. The gateway embeds one ([`Anchor`]);
//! `tela anchor` runs one on its own ([`AnchorArgs`]).

use crate::clock::generation_now;
use crate::control::{ControlServer, ControlSocketError};
use crate::identity::{load_identity, read_secret, SecretError};
use crate::join::JoinArgs;
use crate::runtime::{refuse_streams, Exit, Runtime, RuntimeConfig, StreamHandler};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tela_core::{Config, Reachability, Role};
use tela_transports::{Endpoint, EndpointConfig, EndpointError, Identity, IdentityError, JoinSecret, TransportMode};

/// How an [`Anchor`] runs.
#[derive(Clone, Debug)]
pub struct AnchorConfig {
    /// Where to listen (QUIC and TCP on the same port number).
    pub listen: SocketAddr,
    /// The address peers should dial, as advertised in the registry; defaults to the bound
    /// address (set it when listening on 0.0.0.0 or behind a port mapping).
    pub advertise: Option<String>,
    /// Its identity.
    pub identity: Identity,
    /// The federation's join secret.
    pub join_secret: JoinSecret,
    /// Other anchors or gateways to keep a connection to.
    pub join: Vec<String>,
    /// Transport for those dials.
    pub transport: TransportMode,
    /// Drain window of the anchor's own record.
    pub drain_window: Duration,
}

/// An anchor could not start.
#[derive(Debug, thiserror::Error)]
pub enum AnchorError {
    /// The listening endpoint could not be set up.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// The advertised address is too long for a record.
    #[error("the advertised address '{0}' is longer than {max} bytes; use a shorter host name or an IP address", max = tela_core::MAX_ADDR)]
    AdvertiseTooLong(String),
}

/// A running anchor. Dropping it stops it.
pub struct Anchor {
    runtime: Runtime,
}

impl Anchor {
    /// Listens and starts gossiping; must run inside a tokio runtime.
    pub async fn start(config: AnchorConfig) -> Result<Anchor, AnchorError> {
        Anchor::start_with(config, refuse_streams()).await
    }

    /// As [`Anchor::start`], serving streams that peers open with `streams` (the gateway).
    pub async fn start_with(config: AnchorConfig, streams: StreamHandler) -> Result<Anchor, AnchorError> {
        let endpoint = EndpointConfig::new(config.identity.clone(), config.join_secret.clone());
        Anchor::start_with_endpoint(config, endpoint, streams).await
    }

    /// As [`Anchor::start_with`], with the listening endpoint's settings given whole (e.g.
    /// shorter keep-alive and idle timeouts, so that a gateway notices a node that vanished
    /// without closing its connection sooner). `endpoint`'s identity and join secret are used;
    /// those of `config` are ignored.
    pub async fn start_with_endpoint(
        config: AnchorConfig,
        endpoint: EndpointConfig,
        streams: StreamHandler,
    ) -> Result<Anchor, AnchorError> {
        let signer = endpoint.identity.signer().clone();
        let endpoint = Endpoint::listen(config.listen, endpoint)?;
        let bound = endpoint.local_addr().unwrap_or(config.listen);
        let advertise = config.advertise.clone().unwrap_or_else(|| bound.to_string());
        if advertise.len() > tela_core::MAX_ADDR {
            return Err(AnchorError::AdvertiseTooLong(advertise));
        }
        // Gateways are nodes in the registry too: they sign with their identity key.
        let mut node = Config::with_identity(signer, generation_now());
        node.role = Role::Gateway;
        node.reach = Reachability::Public(advertise);
        node.drain_window = config.drain_window;
        let mut rc = RuntimeConfig::new(node);
        rc.join = config.join.clone();
        rc.transport = config.transport;
        let runtime = Runtime::start(rc, endpoint, streams);
        // Nothing to wait for: an anchor has no engine, so it serves (no models) at once.
        let _ = runtime.inputs().engine_ready(Vec::new()).await;
        Ok(Anchor { runtime })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.runtime.local_addr().unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// The running node (snapshots, events, connections, inputs).
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Mutable access, for [`Runtime::wait`].
    pub fn runtime_mut(&mut self) -> &mut Runtime {
        &mut self.runtime
    }
}

/// Run an anchor: a public member of the federation with no engine, which outbound-only
/// nodes dial (`tela node --join ADDR`). The gateway embeds one; this runs one on its own.
#[derive(Debug, Clone, clap::Args)]
#[command(
    mut_arg("join", |a| a.help("Other anchors or gateways to keep a connection to (repeatable)")),
    mut_arg("transport", |a| a.help("Transport for dials to other anchors").default_value("auto")),
    mut_arg("identity", |a| a.help("Identity key file (created on first run) [default: ~/.config/tela/anchor.key]")),
)]
pub struct AnchorArgs {
    /// Address to listen on, QUIC (UDP) and TCP on the same port.
    #[arg(long, env = "TELA_LISTEN", default_value = "0.0.0.0:7000", value_name = "HOST:PORT")]
    pub listen: SocketAddr,

    /// Address other members should dial, as advertised in the registry (default: the bound
    /// address; set it when listening on 0.0.0.0).
    #[arg(long, env = "TELA_ADVERTISE", value_name = "HOST:PORT")]
    pub advertise: Option<String>,

    /// The federation, as every role joins it: --join-secret, --join-secret-file, --join,
    /// --transport and --identity.
    #[command(flatten)]
    pub federation: JoinArgs,

    /// Local control socket for `tela status` [default: none].
    #[arg(long, env = "TELA_CONTROL", value_name = "PATH")]
    pub control: Option<PathBuf>,
}

/// `tela anchor` failed.
#[derive(Debug, thiserror::Error)]
pub enum AnchorRunError {
    /// The join secret is missing or unreadable.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// The identity key could not be loaded or created.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The anchor could not start.
    #[error(transparent)]
    Start(#[from] AnchorError),
    /// The control socket could not be opened.
    #[error(transparent)]
    Control(#[from] ControlSocketError),
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
}

impl AnchorArgs {
    /// Runs the anchor until Ctrl-C or SIGTERM.
    pub async fn run(self) -> Result<(), AnchorRunError> {
        let federation = self.federation;
        let join_secret = read_secret(federation.join_secret.as_deref(), federation.join_secret_file.as_deref())?;
        let identity = load_identity(federation.identity.as_deref(), "anchor.key")?;
        let mut anchor = Anchor::start(AnchorConfig {
            listen: self.listen,
            advertise: self.advertise,
            identity,
            join_secret,
            join: federation.join,
            transport: federation.transport.unwrap_or_default(),
            drain_window: Duration::from_secs(5),
        })
        .await?;
        let _control = match &self.control {
            Some(path) => Some(ControlServer::start(path, anchor.runtime())?),
            None => None,
        };
        let stop = crate::signals::terminate()?;
        tokio::select! {
            () = stop => {
                let _ = anchor.runtime().inputs().shutdown().await;
                anchor.runtime_mut().wait().await;
            }
            exit = anchor.runtime_mut().wait() => {
                if exit == Exit::Crashed {
                    tracing::error!("the anchor stopped unexpectedly");
                }
            }
        }
        Ok(())
    }
}

impl From<std::io::Error> for AnchorRunError {
    fn from(e: std::io::Error) -> Self {
        AnchorRunError::Signals(e)
    }
}
