//! The driver: one task that owns the core's [`Node`] and is the only place that feeds it.
//!
//! It waits on four things at once — a message from its bounded queue (datagrams read by the
//! connection tasks, connections made or lost, local inputs), the core's deadline, a change
//! of the in-flight count, and the next snapshot publication — feeds each to the node, and
//! then drains the node's outputs: transmits go out as datagrams on the peer's newest
//! connection (a public peer without one is dialled in the background, with backoff, and the
//! datagram dropped), events go to subscribers and the log, commands stop the engine or end
//! the driver. Every second it also dials each gateway in the registry it has no connection
//! to (not only the `--join` addresses): a gateway routes only over connections its nodes
//! opened, and one that crashed is redialled, with backoff, until it returns or leaves.
//!
//! # Tasks and their owners
//!
//! The driver owns, in one `JoinSet`, a task per live connection (reading datagrams and
//! accepting streams; each stream's handler runs in a `JoinSet` of that connection task), a
//! task per join address (dial, wait for the connection to close, back off, redial), one-shot
//! dials of public peers, and the accept loop of a listening endpoint. When the driver ends —
//! `Command::Exit`, a shutdown request, or the [`Runtime`](crate::Runtime) being dropped — the
//! set is dropped, which aborts them all, and every connection is closed with a reason.

use crate::backoff::Backoff;
use crate::runtime::{Exit, RuntimeConfig, RuntimeView, StreamHandler};
use crate::status::RegistrySnapshot;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tela_core::{Command, Event, Input, Lifecycle, Load, Node, NodeId, Output, Reachability, Role, Time, Transmit};
use tela_transports::{Connection, Endpoint};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod connections;

pub(crate) use connections::ToDriver;
use connections::{accept_loop, keep_joined, serve_connection, PERMANENT_REFUSALS_BEFORE_GIVING_UP};

/// How often the driver checks that it is connected to every gateway in the registry.
const GATEWAY_DIAL_INTERVAL: Duration = Duration::from_secs(1);

/// Dial state of one public peer reached on demand.
struct PeerDial {
    in_progress: bool,
    not_before: Instant,
    backoff: Backoff,
}

pub(crate) struct Driver {
    node: Node,
    config: RuntimeConfig,
    endpoint: Arc<Endpoint>,
    view: RuntimeView,
    streams: StreamHandler,
    tx: mpsc::Sender<ToDriver>,
    rx: mpsc::Receiver<ToDriver>,
    events: broadcast::Sender<Event>,
    published: watch::Sender<u64>,
    stop_engine: CancellationToken,
    tasks: JoinSet<()>,
    next_conn: u64,
    dials: HashMap<NodeId, PeerDial>,
    deadline: Time,
    seq: u64,
    /// Something changed since the last snapshot.
    dirty: bool,
    /// A change readers must see at once (lifecycle, routability, connections).
    urgent: bool,
    last_publish: Instant,
    last_local: Option<(u64, Lifecycle)>,
    last_records_changed: u64,
    last_load: u32,
    /// Whether any peer has admitted this node since it started.
    admitted: bool,
    /// `--join` addresses given up after permanent refusals, with the last refusal.
    refused_joins: Vec<(String, String)>,
}

impl Driver {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        node: Node,
        config: RuntimeConfig,
        endpoint: Arc<Endpoint>,
        view: RuntimeView,
        streams: StreamHandler,
        tx: mpsc::Sender<ToDriver>,
        rx: mpsc::Receiver<ToDriver>,
        events: broadcast::Sender<Event>,
        published: watch::Sender<u64>,
        stop_engine: CancellationToken,
    ) -> Driver {
        Driver {
            node,
            config,
            endpoint,
            view,
            streams,
            tx,
            rx,
            events,
            published,
            stop_engine,
            tasks: JoinSet::new(),
            next_conn: 0,
            dials: HashMap::new(),
            deadline: Time::ZERO,
            seq: 0,
            dirty: true,
            urgent: true,
            last_publish: Instant::now(),
            last_local: None,
            last_records_changed: 0,
            last_load: 0,
            admitted: false,
            refused_joins: Vec::new(),
        }
    }

    fn now(&self) -> Time {
        self.view.shared.clock.now()
    }

    pub(crate) async fn run(mut self) -> Exit {
        let record = self.node.local_record().clone();
        tracing::info!(
            node = %record.id,
            generation = record.generation,
            role = ?record.role,
            "node {} starting in generation {} ({:?}, {})",
            record.id,
            record.generation,
            record.role,
            match &record.reach {
                Reachability::Public(a) => format!("public at {a}"),
                Reachability::OutboundOnly => "outbound-only".into(),
            }
        );
        if self.endpoint.local_addr().is_some() {
            self.tasks.spawn(accept_loop(self.endpoint.clone(), self.tx.clone()));
        }
        for addr in self.config.join.clone() {
            self.tasks.spawn(keep_joined(
                addr,
                self.endpoint.clone(),
                self.config.path.clone(),
                self.config.transport,
                Backoff::new(self.config.redial_initial, self.config.redial_max),
                self.tx.clone(),
            ));
        }
        let mut gateways = tokio::time::interval(GATEWAY_DIAL_INTERVAL);
        gateways.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let exit = loop {
            if let Some(exit) = self.drain_outputs() {
                break exit;
            }
            if self.refused_everywhere() {
                break Exit::Refused;
            }
            self.publish_if_due();
            let deadline = self.view.shared.clock.instant_of(self.deadline);
            let publish_at = self.last_publish + self.config.snapshot_interval;
            tokio::select! {
                msg = self.rx.recv() => match msg {
                    Some(ToDriver::Shutdown) | None => break Exit::Shutdown,
                    Some(msg) => self.on_message(msg),
                },
                () = self.view.shared.in_flight.changed() => self.report_load(),
                () = sleep_until(deadline) => {
                    let now = self.now();
                    self.node.handle_input(now, Input::Timeout);
                }
                () = tokio::time::sleep_until(publish_at), if self.dirty => self.publish(),
                _ = gateways.tick() => self.dial_gateways(),
                Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    if let Err(e) = done {
                        if e.is_panic() {
                            tracing::error!("a node task panicked: {e}");
                        }
                    }
                }
            }
        };
        self.finish(exit).await;
        exit
    }

    /// Executes every pending output; returns `Some` when the core asked to exit.
    fn drain_outputs(&mut self) -> Option<Exit> {
        let mut exit = None;
        loop {
            match self.node.poll_output() {
                Output::Transmit(t) => self.transmit(t),
                Output::Event(e) => self.on_event(e),
                Output::Command(Command::StopEngine) => {
                    tracing::info!("the node has left: stopping the engine");
                    self.stop_engine.cancel();
                }
                Output::Command(Command::Exit) => {
                    tracing::info!("the node's departure has been spread: exiting");
                    exit = Some(Exit::Left);
                }
                Output::Timeout(at) => {
                    self.deadline = at;
                    break;
                }
            }
        }
        let records_changed = self.node.stats().records_changed;
        if records_changed != self.last_records_changed {
            self.last_records_changed = records_changed;
            self.dirty = true;
        }
        exit
    }

    fn on_message(&mut self, msg: ToDriver) {
        let now = self.now();
        match msg {
            ToDriver::Datagram { from, payload } => {
                self.node.handle_input(now, Input::Datagram { from, payload });
            }
            ToDriver::Connected(conn) => self.on_connected(conn),
            ToDriver::Closed { peer, conn, reason } => {
                if self.view.shared.peers.remove(peer, conn) {
                    match reason {
                        Some(r) => tracing::info!(%peer, "disconnected from {peer}: {r}"),
                        None => tracing::info!(%peer, "disconnected from {peer}"),
                    }
                    self.node.handle_input(now, Input::PeerDisconnected(peer));
                    self.mark_urgent();
                }
            }
            ToDriver::JoinRefused { addr, error } => self.refused_joins.push((addr, error)),
            ToDriver::DialFailed { peer, error } => {
                if let Some(d) = self.dials.get_mut(&peer) {
                    d.in_progress = false;
                    let delay = d.backoff.next_delay();
                    d.not_before = Instant::now() + delay;
                    tracing::debug!(%peer, "dialling {peer} failed ({error}); next try in {delay:?} at the earliest");
                }
            }
            ToDriver::Local(input) => {
                if matches!(input, Input::DrainRequested) {
                    // The core leaves as soon as it reads zero in flight: give it the count
                    // as of now, not as of the last wake-up.
                    self.report_load();
                }
                self.node.handle_input(now, input);
            }
            ToDriver::Shutdown => {}
        }
    }

    fn log_local_state(&self, generation: u64, state: Lifecycle) {
        let r = self.node.local_record();
        let names: Vec<&str> = r.models.as_slice().iter().map(|m| m.name.as_str()).collect();
        tracing::info!(
            generation,
            state = state.as_str(),
            "this node ({}) is now {} in generation {generation} (models: {})",
            r.id,
            state.as_str(),
            if names.is_empty() { "none".to_string() } else { names.join(", ") }
        );
    }

    /// Whether every `--join` address has refused this node for good while no peer holds a
    /// connection to it: nothing left to wait for. Logs the one line that says why.
    fn refused_everywhere(&self) -> bool {
        if !self.config.exit_when_refused
            || self.config.join.is_empty()
            || self.refused_joins.len() < self.config.join.len()
            || !self.view.shared.peers.peers().is_empty()
        {
            return false;
        }
        let why: Vec<String> = self.refused_joins.iter().map(|(addr, error)| format!("{addr}: {error}")).collect();
        tracing::error!(
            "giving up: every --join address refused this node {PERMANENT_REFUSALS_BEFORE_GIVING_UP} times for a \
             reason retrying cannot fix ({})",
            why.join("; ")
        );
        true
    }

    fn on_connected(&mut self, conn: Connection) {
        let peer = conn.peer_id();
        if peer == self.node.id() {
            tracing::warn!(
                remote = %conn.remote_addr(),
                "connected to this node itself at {} (a --join address pointing at itself?); closing",
                conn.remote_addr()
            );
            conn.close("connected to itself");
            return;
        }
        self.dials.remove(&peer);
        self.next_conn += 1;
        let id = self.next_conn;
        tracing::info!(
            %peer,
            remote = %conn.remote_addr(),
            transport = %conn.transport(),
            "connected to {peer} at {} over {}",
            conn.remote_addr(),
            conn.transport()
        );
        if self.view.shared.peers.insert(peer, id, conn.clone()) {
            let now = self.now();
            self.node.handle_input(now, Input::PeerConnected(peer));
            self.mark_urgent();
        }
        if !self.admitted {
            self.admitted = true;
            if let Some((generation, state)) = self.last_local {
                // Held back until now: a node nobody admitted serves no one.
                self.log_local_state(generation, state);
            }
        }
        self.tasks.spawn(serve_connection(conn, id, self.tx.clone(), self.streams.clone(), self.view.clone()));
    }

    fn transmit(&mut self, t: Transmit) {
        if let Some(conn) = self.view.shared.peers.get(&t.to) {
            if let Err(e) = conn.send_datagram(t.payload) {
                tracing::debug!(peer = %t.to, "datagram to {} not sent: {e}", t.to);
            }
            return;
        }
        // No connection: dial the peer if it is public, and drop this datagram (gossip
        // repeats itself; nothing waits for a path).
        let addr = match self.node.replica().get(&t.to).map(|s| &s.record().reach) {
            Some(Reachability::Public(addr)) => addr.clone(),
            _ => return,
        };
        self.dial_public(t.to, addr);
    }

    /// Dials a public peer in the background unless a dial is under way or backing off (or a
    /// join keeper owns its address).
    fn dial_public(&mut self, peer: NodeId, addr: String) {
        if self.config.join.contains(&addr) {
            return; // its keeper task is on it
        }
        let now = Instant::now();
        let (initial, max) = (self.config.redial_initial, self.config.redial_max);
        let state = self.dials.entry(peer).or_insert_with(|| PeerDial {
            in_progress: false,
            not_before: now,
            backoff: Backoff::new(initial, max),
        });
        if state.in_progress || now < state.not_before {
            return;
        }
        state.in_progress = true;
        let (endpoint, mode, tx) = (self.endpoint.clone(), self.config.transport, self.tx.clone());
        let path = self.config.path.clone();
        tracing::debug!(%peer, "dialling public peer {peer} at {addr} {path}");
        self.tasks.spawn(async move {
            let msg = match path.dial(&endpoint, &addr, mode).await {
                Ok(conn) => ToDriver::Connected(conn),
                Err(error) => ToDriver::DialFailed { peer, error: error.to_string() },
            };
            let _ = tx.send(msg).await;
        });
    }

    /// Keeps a connection to every gateway in the registry, not only the `--join` addresses:
    /// each gateway routes only over connections its nodes opened to it, so a node must be
    /// connected to all of them. A gateway whose connection ended (it crashed or restarted) is
    /// redialled with backoff for as long as its record has not LEFT, so nodes come back to it
    /// by themselves when it returns.
    fn dial_gateways(&mut self) {
        let me = self.node.id();
        let peers = &self.view.shared.peers;
        let targets: Vec<(NodeId, String)> = self
            .node
            .replica()
            .slots()
            .iter()
            .filter_map(|slot| {
                let r = slot.record();
                match &r.reach {
                    Reachability::Public(addr)
                        if r.role == Role::Gateway
                            && r.id != me
                            && r.state < Lifecycle::Left
                            && peers.get(&r.id).is_none() =>
                    {
                        Some((r.id, addr.clone()))
                    }
                    _ => None,
                }
            })
            .collect();
        for (peer, addr) in targets {
            self.dial_public(peer, addr);
        }
    }

    fn on_event(&mut self, event: Event) {
        match &event {
            Event::Routable(id) => {
                let models = self
                    .node
                    .replica()
                    .get(id)
                    .map(|s| {
                        let r = s.record();
                        let names: Vec<&str> = r.models.as_slice().iter().map(|m| m.name.as_str()).collect();
                        format!("generation {}, models: {}", r.generation, names.join(", "))
                    })
                    .unwrap_or_default();
                tracing::info!(peer = %id, "node {id} is routable ({models})");
                self.mark_urgent();
            }
            Event::Unroutable(id) => {
                let why = self
                    .node
                    .replica()
                    .get(id)
                    .map(|s| {
                        let state = s.record().state;
                        if s.is_alive() || state >= Lifecycle::Down {
                            format!("state {}", state.as_str())
                        } else {
                            "suspected by the failure detector".to_string()
                        }
                    })
                    .unwrap_or_default();
                tracing::info!(peer = %id, "node {id} is unroutable ({why})");
                self.mark_urgent();
            }
            Event::Discovered(id) => tracing::info!(peer = %id, "discovered node {id}"),
            Event::LocalState { generation, state } => {
                if self.last_local != Some((*generation, *state)) {
                    if self.admitted || *state != Lifecycle::Serve || self.config.join.is_empty() {
                        self.log_local_state(*generation, *state);
                    } else {
                        tracing::info!(
                            "the engine is ready; this node turns SERVE once a gateway admits it (joining via {})",
                            self.config.join.join(", ")
                        );
                    }
                }
                self.last_local = Some((*generation, *state));
                self.mark_urgent();
            }
            Event::Rejected { from, error } => {
                tracing::warn!(peer = %from, "rejected a datagram from {from}: {error}");
            }
        }
        // Nobody listening is fine: events are also in the log and the snapshot.
        let _ = self.events.send(event);
    }

    fn report_load(&mut self) {
        let in_flight = self.view.shared.in_flight.get();
        if in_flight != self.last_load {
            self.last_load = in_flight;
            let now = self.now();
            self.node.handle_input(now, Input::Load(Load { in_flight, queued: 0 }));
        }
    }

    fn mark_urgent(&mut self) {
        self.dirty = true;
        self.urgent = true;
    }

    fn publish_if_due(&mut self) {
        if self.urgent || (self.dirty && self.last_publish.elapsed() >= self.config.snapshot_interval) {
            self.publish();
        }
    }

    fn publish(&mut self) {
        self.seq += 1;
        let snapshot = RegistrySnapshot::of(&self.node, self.now(), self.seq);
        self.view.shared.snapshot.store(Arc::new(snapshot));
        self.published.send_replace(self.seq);
        self.dirty = false;
        self.urgent = false;
        self.last_publish = Instant::now();
    }

    /// Ends the driver: the final snapshot, every connection closed with a reason, every
    /// task aborted.
    async fn finish(&mut self, exit: Exit) {
        self.publish();
        let reason = match exit {
            Exit::Left => "node left the federation",
            Exit::Shutdown | Exit::Crashed | Exit::Refused => "node shutting down",
        };
        for conn in self.view.shared.peers.drain_all() {
            conn.close(reason);
        }
        self.endpoint.stop_accepting();
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        // Let the close frames leave before the process may exit.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
