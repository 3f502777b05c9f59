//! Choosing the node for a request: the core's decision ([`tela_core::route`]) over the
//! anchor's latest registry snapshot, with what only this gateway knows — which nodes have a
//! live tunnel connection here, which were already tried for this request, and how many
//! requests this gateway has in flight on each.
//!
//! A node is usable when the snapshot lists it as routable for the model (alive, SERVE — so a
//! draining node is skipped the moment its DOWN reaches this gateway), it has a connection to
//! this gateway that is not closed and not [`Silent`], and it has not been tried for this request. A connection
//! that closes is taken out of the runtime's peer table as soon as the transport reports it, so
//! a node that died (its TCP connection reset, its QUIC connection timed out) stops being
//! picked at once, before any gossip says so.
//!
//! In-flight counts are this gateway's own: a [`NodeGuard`] per forwarded request, held by the
//! response body until it ends on any path (see [`crate::body`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tela_core::{NodeId, RouteError};
use tela_runtime::status::RegistrySnapshot;
use tela_runtime::RuntimeView;
use tela_transports::Connection;

use crate::metrics::NodeLabel;

/// In-flight requests per node, as this gateway counts them.
#[derive(Clone)]
pub struct NodeLoad {
    counts: Arc<Mutex<HashMap<NodeId, Arc<AtomicU32>>>>,
    gauge: Family<NodeLabel, Gauge>,
}

/// One request in flight on a node; leaves when dropped.
#[must_use = "the request counts as in flight only while the guard is held"]
pub struct NodeGuard {
    count: Arc<AtomicU32>,
    gauge: Gauge,
}

impl Drop for NodeGuard {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
        self.gauge.dec();
    }
}

impl NodeLoad {
    /// Counts into `gauge` (the `/metrics` family) as well.
    pub fn new(gauge: Family<NodeLabel, Gauge>) -> NodeLoad {
        NodeLoad { counts: Arc::default(), gauge }
    }

    fn counter(&self, node: NodeId) -> Arc<AtomicU32> {
        let mut map = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        map.entry(node).or_default().clone()
    }

    /// Requests in flight on `node` now.
    pub fn get(&self, node: &NodeId) -> u32 {
        let map = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(node).map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// Counts one more request on `node` until the guard is dropped.
    pub fn enter(&self, node: NodeId) -> NodeGuard {
        let count = self.counter(node);
        count.fetch_add(1, Ordering::AcqRel);
        let gauge = self.gauge.get_or_create(&NodeLabel { node: node.to_string() }).clone();
        gauge.inc();
        NodeGuard { count, gauge }
    }
}

/// Tunnel connections that went silent: a request was written into them and the node did not
/// accept it within [`ProxySettings::accept_timeout`](crate::proxy::ProxySettings). Such a
/// node is not picked while that same connection stays silent — a killed process behind QUIC
/// sends no reset, and waiting for the idle timeout would send it requests for seconds. The
/// mark is lifted when the late acceptance arrives, or when the node comes back on a new
/// connection; the connection itself still closes on the transport's idle timeout.
#[derive(Clone, Default)]
pub struct Silent {
    marks: Arc<Mutex<HashMap<NodeId, Connection>>>,
}

impl Silent {
    /// Marks `connection` to `node` silent.
    pub fn mark(&self, node: NodeId, connection: &Connection) {
        self.marks.lock().unwrap_or_else(PoisonError::into_inner).insert(node, connection.clone());
    }

    /// Lifts the mark on `connection` to `node` (it answered after all).
    pub fn clear(&self, node: NodeId, connection: &Connection) {
        let mut marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        if marks.get(&node).is_some_and(|c| c.same_as(connection)) {
            marks.remove(&node);
        }
    }

    /// Whether `connection` to `node` is marked silent; a mark on an older connection is dropped.
    pub fn is_silent(&self, node: &NodeId, connection: &Connection) -> bool {
        let mut marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        match marks.get(node) {
            Some(c) if c.same_as(connection) => true,
            Some(_) => {
                marks.remove(node);
                false
            }
            None => false,
        }
    }
}

/// The routing decision for one attempt.
pub struct Choice {
    /// The node.
    pub node: NodeId,
    /// Its live connection.
    pub connection: Connection,
}

/// Picks a node for `model` that is not in `tried`; see the module docs.
pub fn choose(
    view: &RuntimeView,
    snapshot: &RegistrySnapshot,
    load: &NodeLoad,
    silent: &Silent,
    model: &str,
    tried: &[NodeId],
) -> Result<Choice, RouteError> {
    let mut connections: Vec<(NodeId, Connection)> = Vec::new();
    let mut usable = |id: NodeId| {
        if tried.contains(&id) {
            return false;
        }
        if connections.iter().any(|(n, _)| *n == id) {
            return true;
        }
        match view.connection(&id) {
            Some(conn) if conn.close_reason().is_none() && !silent.is_silent(&id, &conn) => {
                connections.push((id, conn));
                true
            }
            _ => false,
        }
    };
    let node = tela_core::route(snapshot.replica(), model, &mut usable, |id| load.get(&id), &mut rand::rng())?;
    let connection = match connections.into_iter().find(|(n, _)| *n == node) {
        Some((_, c)) => c,
        // `route` only returns nodes it found usable, which cached their connection.
        None => view.connection(&node).ok_or(RouteError::NoCapacity { model: model.to_string(), hosts: 0 })?,
    };
    Ok(Choice { node, connection })
}

/// Every model served by a routable node, sorted.
pub fn models(snapshot: &RegistrySnapshot) -> Vec<String> {
    let mut names: Vec<String> = snapshot.replica().routable_models().into_iter().map(str::to_string).collect();
    names.sort();
    names.dedup();
    names
}
