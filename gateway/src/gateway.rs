//! [`Gateway`]: the ingress — an embedded anchor that serving nodes dial (QUIC and TCP on
//! `--anchor-listen`), and the OpenAI-compatible HTTP API on `--listen` that routes each request
//! over those nodes' connections.
//!
//! ```no_run
//! use tela_gateway::gateway::{Gateway, GatewayConfig};
//! use tela_transports::{Identity, JoinSecret};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let mut config = GatewayConfig::new(Identity::generate()?, JoinSecret::new("federation secret")?);
//! config.listen = "127.0.0.1:0".parse()?;
//! config.anchor_listen = "127.0.0.1:0".parse()?;
//! let gateway = Gateway::start(config).await?;
//! println!("OpenAI base URL: {}/v1; nodes dial {}", gateway.base_url(), gateway.anchor_addr());
//! gateway.shutdown().await;
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tela_core::routing::RoutingPolicy;
use tela_runtime::anchor::{Anchor, AnchorConfig, AnchorError};
use tela_runtime::runtime::refuse_streams;
use tela_runtime::Runtime;
use tela_transports::{EndpointConfig, Identity, JoinSecret, TransportMode};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::auth::{Access, KeyFile, KeyFileError};
use crate::metrics::Metrics;
use crate::proxy::ProxySettings;
use crate::server::TlsError;
use crate::service::{Limits, Shared};

/// How long a stopping gateway spends announcing that it leaves.
const LEAVE_WITHIN: Duration = Duration::from_secs(3);

/// Who may call the API.
#[derive(Clone, Debug)]
pub enum AuthConfig {
    /// Anyone: only for loopback demos and tests.
    Open,
    /// Holders of a key whose hash is in this file (reloaded on change).
    KeyFile(PathBuf),
}

/// Everything a gateway needs.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// Where the HTTP API listens.
    pub listen: SocketAddr,
    /// Where the anchor listens for nodes (QUIC and TCP on one port number).
    pub anchor_listen: SocketAddr,
    /// The anchor address advertised in the registry, which nodes dial (default: the bound one).
    pub public_addr: Option<String>,
    /// The gateway's identity.
    pub identity: Identity,
    /// The federation's join secret.
    pub join_secret: JoinSecret,
    /// Other gateways or anchors to keep a connection to.
    pub join: Vec<String>,
    /// Transport for those dials.
    pub transport: TransportMode,
    /// API keys.
    pub auth: AuthConfig,
    /// TLS certificate chain and key (PEM), to terminate HTTPS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Serve `/status` and `/metrics` without a key.
    pub open_status: bool,
    /// Client limits.
    pub limits: Limits,
    /// Forwarding.
    pub proxy: ProxySettings,
    /// How a node is picked among a model's candidates (default: prefix affinity).
    pub routing: RoutingPolicy,
    /// A node connection that hears nothing for this long is closed (and the node avoided).
    pub node_idle_timeout: Duration,
    /// How long shutdown waits for open responses.
    pub shutdown_grace: Duration,
    /// Model spinning (`[spin]` of the configuration file), if any.
    pub spin: Option<crate::spin::SpinSetup>,
    /// The usage ledger's database, if the gateway keeps one ([`crate::ledger`]).
    pub ledger: Option<crate::ledger::LedgerConfig>,
    /// How often spend counts go to the other gateways, for budgets ([`crate::budgets`]).
    pub budget_exchange: Duration,
    /// Fair queueing of keys in front of saturated models ([`crate::fairness`]).
    pub fairness: crate::fairness::FairSettings,
    /// Batch inference, if the gateway runs batches ([`crate::batch`]).
    pub batch: Option<crate::batch::BatchConfig>,
    /// Outside providers that keys allowed to overflow may be sent to ([`crate::overflow`]).
    pub overflow: Vec<crate::overflow::Provider>,
}

impl GatewayConfig {
    /// Defaults: API on 127.0.0.1:8080, anchor on 0.0.0.0:7000, [`AuthConfig::Open`] (the
    /// command line insists on a key file or an explicit `--no-auth`), prefix routing, node idle
    /// timeout 5 s, shutdown grace 30 s, no usage ledger (the command line keeps one by default).
    pub fn new(identity: Identity, join_secret: JoinSecret) -> GatewayConfig {
        GatewayConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            anchor_listen: SocketAddr::from(([0, 0, 0, 0], 7000)),
            public_addr: None,
            identity,
            join_secret,
            join: Vec::new(),
            transport: TransportMode::Auto,
            auth: AuthConfig::Open,
            tls: None,
            open_status: false,
            limits: Limits::default(),
            proxy: ProxySettings::default(),
            routing: RoutingPolicy::default(),
            node_idle_timeout: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(30),
            spin: None,
            ledger: None,
            batch: None,
            overflow: Vec::new(),
            budget_exchange: crate::budgets::DEFAULT_EXCHANGE,
            fairness: crate::fairness::FairSettings::default(),
        }
    }
}

/// A gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The anchor could not start.
    #[error("the node-facing anchor could not start: {0}")]
    Anchor(#[from] AnchorError),
    /// The API listener could not bind.
    #[error("cannot listen on {addr} for the API: {source} (is another process using the port? pass --listen)")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The key file is unusable.
    #[error(transparent)]
    Keys(#[from] KeyFileError),
    /// TLS could not be set up.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The spin plan was refused.
    #[error("spinning cannot start: {0}")]
    Spin(#[source] tela_core::spin::SpinConfigError),
    /// An overflow provider cannot be used.
    #[error("overflow cannot start: {0}")]
    Overflow(#[source] crate::overflow::OverflowStartError),
}

/// A running gateway. Dropping it stops everything at once; [`Gateway::shutdown`] lets open
/// responses finish first.
pub struct Gateway {
    anchor: Anchor,
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    tls: bool,
    stop: CancellationToken,
    server: Option<AbortOnDropHandle<()>>,
    _keys: Option<KeyFile>,
    _spin: Option<crate::spin::SpinTasks>,
    _batch: Option<AbortOnDropHandle<()>>,
    _budgets: AbortOnDropHandle<()>,
    ledger: Option<crate::ledger::Ledger>,
}

impl Gateway {
    /// Starts the anchor and the API; must run inside a tokio runtime.
    pub async fn start(config: GatewayConfig) -> Result<Gateway, GatewayError> {
        let (keys, access) = match &config.auth {
            AuthConfig::Open => (None, Access::Open),
            AuthConfig::KeyFile(path) => {
                let file = KeyFile::watch(path.clone())?;
                let access = file.access();
                (Some(file), access)
            }
        };
        let tls = match &config.tls {
            Some((cert, key)) => Some(crate::server::tls_acceptor(cert, key)?),
            None => None,
        };
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| GatewayError::Bind { addr: config.listen, source })?;
        let local_addr = listener.local_addr().map_err(|source| GatewayError::Bind { addr: config.listen, source })?;
        let mut endpoint = EndpointConfig::new(config.identity.clone(), config.join_secret.clone());
        endpoint.idle_timeout = config.node_idle_timeout;
        endpoint.keep_alive = (config.node_idle_timeout / 4).max(Duration::from_millis(200));
        let anchor = Anchor::start_with_endpoint(
            AnchorConfig {
                listen: config.anchor_listen,
                advertise: config.public_addr.clone(),
                identity: config.identity.clone(),
                join_secret: config.join_secret.clone(),
                join: config.join.clone(),
                transport: config.transport,
                drain_window: Duration::from_secs(5),
            },
            endpoint,
            refuse_streams(),
        )
        .await?;
        let metrics = Arc::new(Metrics::new());
        let budgets = crate::budgets::BudgetExchange::start(anchor.runtime().view(), access.clone());
        let mut shared = Shared::new(
            anchor.runtime().view(),
            metrics.clone(),
            access,
            config.open_status,
            config.limits,
            config.proxy,
        );
        shared.routing = config.routing;
        shared.overflow = crate::overflow::Overflow::start(config.overflow).map_err(GatewayError::Overflow)?;
        if shared.overflow.is_some() && matches!(config.auth, AuthConfig::Open) {
            tracing::warn!("[[overflow]] is set but the gateway has no API keys: nothing overflows (only keys with overflow=yes do)");
        }
        shared.fair = crate::fairness::FairShare::new(config.fairness);
        // Stamp each engine load report with this gateway's own count on its node: routing
        // counts its own requests itself and takes only the others' from the report.
        let own = shared.load.clone();
        anchor.runtime().view().load_reports().count_local_with(move |node| own.get(node));
        // Before the ledger's writer: both open one file, and this brings it to the schema.
        let batch = match config.batch {
            Some(b) => crate::batch::BatchShared::open_for_gateway(b).await,
            None => None,
        };
        shared.batch = batch.clone();
        let ledger = config.ledger.map(|l| {
            tracing::info!("usage ledger in {}", l.path.display());
            crate::ledger::Ledger::start(l, metrics.ledger_counters())
        });
        shared.ledger = ledger.clone();
        let stop = CancellationToken::new();
        let spin = match config.spin {
            None => None,
            Some(setup) => {
                let view = anchor.runtime().view();
                let spin = crate::spin::shared(&setup, &view);
                shared.spin = Some(spin.clone());
                let parts = crate::spin::GatewayParts {
                    view,
                    published: anchor.runtime().published(),
                    load: shared.load.clone(),
                    metrics,
                    stop: stop.clone(),
                    batch: batch.clone(),
                    access: shared.access.clone(),
                };
                Some(crate::spin::start(setup, spin, parts).map_err(GatewayError::Spin)?)
            }
        };
        let shared = Arc::new(shared);
        let budgets = tokio::spawn(crate::budgets::run(budgets, config.budget_exchange, stop.clone()));
        let batch_runner = batch.map(|b| crate::batch::runner::start(shared.clone(), b, stop.clone()));
        let server = tokio::spawn(crate::server::serve(
            listener,
            tls.clone(),
            shared.clone(),
            stop.clone(),
            config.shutdown_grace,
        ));
        tracing::info!(
            "gateway {} serving the OpenAI API on {}://{local_addr}/v1; nodes join at {}",
            anchor.runtime().node_id(),
            if tls.is_some() { "https" } else { "http" },
            anchor.local_addr()
        );
        Ok(Gateway {
            anchor,
            shared,
            local_addr,
            tls: tls.is_some(),
            stop,
            server: Some(AbortOnDropHandle::new(server)),
            _keys: keys,
            _spin: spin,
            _batch: batch_runner,
            _budgets: AbortOnDropHandle::new(budgets),
            ledger,
        })
    }

    /// Where the API listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// `http://ADDR` or `https://ADDR`.
    pub fn base_url(&self) -> String {
        format!("{}://{}", if self.tls { "https" } else { "http" }, self.local_addr)
    }

    /// Where nodes dial.
    pub fn anchor_addr(&self) -> SocketAddr {
        self.anchor.local_addr()
    }

    /// The embedded anchor's runtime (registry snapshots, events).
    pub fn runtime(&self) -> &Runtime {
        self.anchor.runtime()
    }

    /// The `/status` document as of now.
    pub fn status(&self) -> serde_json::Value {
        crate::status::status_json(&self.shared)
    }

    /// Waits until the API server stops by itself (it does not, short of a bug).
    pub async fn wait(&mut self) {
        if let Some(server) = self.server.as_mut() {
            let _ = server.await;
            self.server = None;
        }
    }

    /// Stops accepting, lets open responses finish (up to the shutdown grace), then leaves the
    /// federation: its record goes DOWN and LEFT, so that nodes stop redialling it (a gateway
    /// that is killed instead keeps being redialled, with backoff, until it returns).
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
        if let Some(ledger) = self.ledger.take() {
            // The responses are over: their rows are in the channel; write them.
            let _ = tokio::task::spawn_blocking(move || ledger.close()).await;
        }
        let runtime = self.anchor.runtime_mut();
        let _ = runtime.inputs().drain().await;
        if tokio::time::timeout(LEAVE_WITHIN, runtime.wait()).await.is_err() {
            tracing::warn!("the gateway did not finish leaving the federation within {LEAVE_WITHIN:?}; closing");
            let _ = runtime.inputs().shutdown().await;
            runtime.wait().await;
        }
    }
}
