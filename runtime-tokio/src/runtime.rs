//! [`Runtime`]: one running Tela node — the driver task that owns the core's
//! [`Node`](tela_core::Node), and the handle the application holds.
//!
//! The application builds a [`RuntimeConfig`] (the core's config plus where to dial), gives
//! [`Runtime::start`] an [`Endpoint`] and a [`StreamHandler`] for the streams peers open
//! toward it, and then only talks to the handle: local news goes in through [`LocalInputs`]
//! (engine ready or failed, drain, walltime), the registry comes out as [`RegistrySnapshot`]s
//! and [`Event`]s, and [`Runtime::wait`] returns when the node has left (or was shut down).

use crate::clock::Clock;
use crate::driver::{Driver, ToDriver};
use crate::inflight::InFlight;
use crate::load_report::LoadReports;
use crate::path::DialPath;
use crate::peers::PeerTable;
use crate::snapshot::SnapshotCell;
use crate::status::RegistrySnapshot;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;
use tela_core::{Config, Event, Input, Model, NodeId, Role, Time};
use tela_transports::{Connection, Endpoint, RecvStream, SendStream, TransportMode};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

/// Messages queued for the driver before senders wait (datagrams, connections, local inputs).
pub(crate) const DRIVER_QUEUE: usize = 1024;
/// Events kept for slow subscribers; older ones are dropped for them (they see `Lagged`).
const EVENT_QUEUE: usize = 1024;

/// How a [`Runtime`] runs.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// The core's configuration (identity, generation, role, hardware, reachability, timers).
    pub node: Config,
    /// Addresses (`host:port`) of gateways or anchors to keep a connection to, redialled with
    /// backoff for as long as the runtime runs.
    pub join: Vec<String>,
    /// Which transport dials use.
    pub transport: TransportMode,
    /// How dials reach their peers: directly, through ssh or through a relay.
    pub path: DialPath,
    /// First delay before redialling a join address or a public peer.
    pub redial_initial: Duration,
    /// Longest delay between redials.
    pub redial_max: Duration,
    /// Snapshots are republished at most this often for changes of load or record versions
    /// alone; lifecycle and routability changes are published at once.
    pub snapshot_interval: Duration,
    /// Stop ([`Exit::Refused`]) once every join address has refused this node for a reason
    /// retrying cannot fix and no peer holds a connection to it: a serving node in a batch job
    /// must not burn its allocation redialling. Off for gateways and anchors, which serve
    /// whoever connects to them whatever their own joins say.
    pub exit_when_refused: bool,
}

impl RuntimeConfig {
    /// Defaults around a core config: no join addresses, auto transport, redial from 500 ms
    /// up to 10 s, snapshots at most every 100 ms for load-only changes. The cap bounds
    /// how long a node takes to come back once a partition heals or its gateway returns: within
    /// 10 s, well inside the two anti-entropy intervals (20 s) in which replicas must agree
    /// again after a heal; at 10,000 nodes, a returning gateway takes at most 2,000 handshakes a
    /// second, and only until they are all back.
    pub fn new(node: Config) -> RuntimeConfig {
        RuntimeConfig {
            node,
            join: Vec::new(),
            transport: TransportMode::Auto,
            path: DialPath::Direct,
            redial_initial: Duration::from_millis(500),
            redial_max: Duration::from_secs(10),
            snapshot_interval: Duration::from_millis(100),
            exit_when_refused: false,
        }
    }
}

/// A stream a peer opened toward this node, with what a handler needs to serve it.
pub struct IncomingStream {
    /// Who opened it (authenticated by the transport).
    pub peer: NodeId,
    /// The reply direction.
    pub send: SendStream,
    /// The request direction.
    pub recv: RecvStream,
    /// The runtime's shared state (registry snapshot, in-flight counter).
    pub view: RuntimeView,
}

/// Serves one incoming stream; runs in a task owned by the stream's connection.
pub type StreamHandler = Arc<dyn Fn(IncomingStream) -> BoxFuture<'static, ()> + Send + Sync>;

/// A handler that closes every incoming stream at once (roles that serve no requests).
pub fn refuse_streams() -> StreamHandler {
    Arc::new(|incoming: IncomingStream| {
        Box::pin(async move {
            tracing::debug!(peer = %incoming.peer, "closing a stream this role does not serve");
        })
    })
}

/// State shared between the driver and request handlers.
pub(crate) struct Shared {
    pub clock: Clock,
    pub id: NodeId,
    pub snapshot: SnapshotCell<RegistrySnapshot>,
    pub in_flight: InFlight,
    pub peers: PeerTable<Connection>,
    pub load_reports: LoadReports,
    pub tagged: crate::tagged::TaggedDatagrams,
}

/// What request handlers may read: the latest registry snapshot, the in-flight counter and
/// the live connections. Cheap to clone.
#[derive(Clone)]
pub struct RuntimeView {
    pub(crate) shared: Arc<Shared>,
}

impl RuntimeView {
    /// The latest registry snapshot (never waits for gossip).
    pub fn snapshot(&self) -> Arc<RegistrySnapshot> {
        self.shared.snapshot.load()
    }

    /// The in-flight request counter reported to the core as load.
    pub fn in_flight(&self) -> &InFlight {
        &self.shared.in_flight
    }

    /// The newest live connection to `peer` (to open a tunnel stream toward it).
    pub fn connection(&self, peer: &NodeId) -> Option<Connection> {
        self.shared.peers.get(peer)
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.shared.id
    }

    /// The runtime's clock (maps instants onto the core's timeline).
    pub fn clock(&self) -> Clock {
        self.shared.clock
    }

    /// The latest load report of each node that sent one here ([`crate::load_report`]).
    pub fn load_reports(&self) -> &LoadReports {
        &self.shared.load_reports
    }

    /// The handlers of other tagged datagrams than load reports ([`crate::tagged`]).
    pub fn tagged(&self) -> &crate::tagged::TaggedDatagrams {
        &self.shared.tagged
    }

    /// Sends `datagram` on the connection to every connected gateway: every peer whose record
    /// is not a serving node's (one the registry does not know yet counts as a gateway: only
    /// gateways and anchors take connections). Never waits; a datagram that cannot be sent is
    /// dropped, as datagrams are.
    pub fn send_to_gateways(&self, datagram: &bytes::Bytes) {
        let snapshot = self.snapshot();
        for peer in self.shared.peers.peers() {
            let serving = snapshot.replica().get(&peer).is_some_and(|s| s.record().role == Role::Serving);
            if serving {
                continue;
            }
            if let Some(conn) = self.shared.peers.get(&peer) {
                if let Err(e) = conn.send_datagram(datagram.clone()) {
                    tracing::debug!(%peer, "load report to {peer} not sent: {e}");
                }
            }
        }
    }
}

/// Sends local news to the driver. Cheap to clone; every method waits only for room in the
/// driver's bounded queue and fails once the runtime has stopped.
#[derive(Clone)]
pub struct LocalInputs {
    tx: mpsc::Sender<ToDriver>,
    clock: Clock,
}

/// The runtime has stopped; the input was not delivered.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the node runtime has stopped")]
pub struct Stopped;

impl LocalInputs {
    async fn send(&self, input: Input) -> Result<(), Stopped> {
        self.tx.send(ToDriver::Local(input)).await.map_err(|_| Stopped)
    }

    /// The engine answers and serves `models`.
    pub async fn engine_ready(&self, models: Vec<Model>) -> Result<(), Stopped> {
        self.send(Input::EngineReady { models }).await
    }

    /// The engine stopped answering or exited.
    pub async fn engine_failed(&self) -> Result<(), Stopped> {
        self.send(Input::EngineFailed).await
    }

    /// Drain now: DOWN, finish in-flight requests, LEFT, exit.
    pub async fn drain(&self) -> Result<(), Stopped> {
        self.send(Input::DrainRequested).await
    }

    /// The allocation ends at `at`; draining starts one drain window before.
    pub async fn walltime(&self, at: Instant) -> Result<(), Stopped> {
        self.send(Input::Walltime(self.clock.time_of(at))).await
    }

    /// Stops the runtime now without draining: connections close, [`Runtime::wait`] returns
    /// [`Exit::Shutdown`].
    pub async fn shutdown(&self) -> Result<(), Stopped> {
        self.tx.send(ToDriver::Shutdown).await.map_err(|_| Stopped)
    }
}

/// Why a runtime stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// The core issued `Command::Exit`: the node drained, left and spread the news.
    Left,
    /// [`LocalInputs::shutdown`] was called.
    Shutdown,
    /// The driver task ended abnormally (a bug); details are in the log.
    Crashed,
    /// Every join address refused this node for good (see
    /// [`RuntimeConfig::exit_when_refused`]); the reason is in the log.
    Refused,
}

/// A running node. Dropping it stops the driver and closes every connection.
pub struct Runtime {
    view: RuntimeView,
    inputs: LocalInputs,
    events: broadcast::Sender<Event>,
    published: watch::Receiver<u64>,
    stop_engine: CancellationToken,
    driver: Option<AbortOnDropHandle<Exit>>,
    exit: Option<Exit>,
    local_addr: Option<std::net::SocketAddr>,
}

impl Runtime {
    /// Starts the driver on the current tokio runtime.
    ///
    /// If `endpoint` listens, its admitted connections join the federation too (an anchor or
    /// gateway); a dialer only dials the join addresses and public peers.
    pub fn start(config: RuntimeConfig, endpoint: Endpoint, streams: StreamHandler) -> Runtime {
        let clock = Clock::start();
        let now = clock.now();
        let id = config.node.id;
        let node = tela_core::Node::new(config.node.clone(), now);
        let shared = Arc::new(Shared {
            clock,
            id,
            snapshot: SnapshotCell::new(RegistrySnapshot::of(&node, now, 0)),
            in_flight: InFlight::new(),
            peers: PeerTable::default(),
            load_reports: LoadReports::default(),
            tagged: crate::tagged::TaggedDatagrams::default(),
        });
        let view = RuntimeView { shared };
        let (tx, rx) = mpsc::channel(DRIVER_QUEUE);
        let (events, _) = broadcast::channel(EVENT_QUEUE);
        let (published_tx, published) = watch::channel(0);
        let stop_engine = CancellationToken::new();
        let local_addr = endpoint.local_addr();
        let driver = Driver::new(
            node,
            config,
            Arc::new(endpoint),
            view.clone(),
            streams,
            tx.clone(),
            rx,
            events.clone(),
            published_tx,
            stop_engine.clone(),
        );
        let task = tokio::spawn(driver.run());
        Runtime {
            view,
            inputs: LocalInputs { tx, clock },
            events,
            published,
            stop_engine,
            driver: Some(AbortOnDropHandle::new(task)),
            exit: None,
            local_addr,
        }
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.view.node_id()
    }

    /// Where the endpoint listens, for a listening runtime.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.local_addr
    }

    /// The latest registry snapshot (never waits for gossip).
    pub fn snapshot(&self) -> Arc<RegistrySnapshot> {
        self.view.snapshot()
    }

    /// Shared state for request handlers.
    pub fn view(&self) -> RuntimeView {
        self.view.clone()
    }

    /// Sends local news to the driver.
    pub fn inputs(&self) -> LocalInputs {
        self.inputs.clone()
    }

    /// Events from the core (routable, unroutable, discovered, local state, rejected).
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Changes whenever a new snapshot is published (its sequence number).
    pub fn published(&self) -> watch::Receiver<u64> {
        self.published.clone()
    }

    /// Cancelled when the core asks to stop the engine (the node has LEFT).
    pub fn stop_engine(&self) -> CancellationToken {
        self.stop_engine.clone()
    }

    /// Waits for the first snapshot that satisfies `pred`, or `None` after `within`.
    pub async fn wait_for(
        &self,
        within: Duration,
        mut pred: impl FnMut(&RegistrySnapshot) -> bool,
    ) -> Option<Arc<RegistrySnapshot>> {
        let mut published = self.published.clone();
        let deadline = Instant::now() + within;
        loop {
            let snap = self.snapshot();
            if pred(&snap) {
                return Some(snap);
            }
            match tokio::time::timeout_at(deadline, published.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return pred(&self.snapshot()).then(|| self.snapshot()),
                Err(_) => return None,
            }
        }
    }

    /// Waits until the driver stops and says why. Cancel-safe: dropping the future leaves
    /// the driver running.
    pub async fn wait(&mut self) -> Exit {
        let Some(task) = self.driver.as_mut() else {
            return self.exit.unwrap_or(Exit::Shutdown);
        };
        let exit = task.await.unwrap_or_else(|e| {
            tracing::error!("the node driver ended abnormally: {e}");
            Exit::Crashed
        });
        self.driver = None;
        self.exit = Some(exit);
        exit
    }

    /// The core's time now, on this runtime's timeline.
    pub fn now(&self) -> Time {
        self.view.clock().now()
    }
}
