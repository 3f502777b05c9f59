//! [`PeerTable`]: the live connections by peer, written by the driver and read by request
//! handlers (the gateway opens a tunnel stream on the connection a node dialled).
//!
//! A peer may briefly have several connections (it redialled before the old one timed out,
//! or two anchors dialled each other at once); the newest is used, and the peer counts as
//! disconnected only when its last one is gone. Critical sections only move small values.

use crate::sync::{lock, Mutex};
use std::collections::HashMap;
use tela_core::NodeId;

/// Identifies one connection in the table.
pub type ConnId = u64;

/// Connections by peer; `C` is [`tela_transports::Connection`] in the runtime.
#[derive(Debug)]
pub struct PeerTable<C> {
    inner: Mutex<HashMap<NodeId, Vec<(ConnId, C)>>>,
}

impl<C> Default for PeerTable<C> {
    fn default() -> Self {
        PeerTable { inner: Mutex::new(HashMap::new()) }
    }
}

impl<C: Clone> PeerTable<C> {
    /// Adds a connection; returns true if it is the peer's first (the peer just connected).
    pub fn insert(&self, peer: NodeId, id: ConnId, conn: C) -> bool {
        let mut map = lock(&self.inner);
        let conns = map.entry(peer).or_default();
        conns.push((id, conn));
        conns.len() == 1
    }

    /// Removes a connection; returns true if it was the peer's last (the peer is now
    /// disconnected). Removing an unknown connection changes nothing and returns false.
    pub fn remove(&self, peer: NodeId, id: ConnId) -> bool {
        let mut map = lock(&self.inner);
        let Some(conns) = map.get_mut(&peer) else {
            return false;
        };
        let before = conns.len();
        conns.retain(|(c, _)| *c != id);
        let removed = conns.len() < before;
        if conns.is_empty() {
            map.remove(&peer);
        }
        removed && !map.contains_key(&peer)
    }

    /// The newest connection to `peer`.
    pub fn get(&self, peer: &NodeId) -> Option<C> {
        lock(&self.inner).get(peer).and_then(|c| c.last()).map(|(_, c)| c.clone())
    }

    /// Peers with at least one connection, sorted.
    pub fn peers(&self) -> Vec<NodeId> {
        let mut v: Vec<NodeId> = lock(&self.inner).keys().copied().collect();
        v.sort();
        v
    }

    /// Takes every connection out of the table (for shutdown).
    pub fn drain_all(&self) -> Vec<C> {
        lock(&self.inner).drain().flat_map(|(_, conns)| conns.into_iter().map(|(_, c)| c)).collect()
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::Arc;
    use loom::thread;

    const P: NodeId = NodeId::from_u64(1);

    #[test]
    fn loom_readers_see_a_connection_or_none_never_a_removed_one() {
        loom::model(|| {
            let table = Arc::new(PeerTable::<u32>::default());
            assert!(table.insert(P, 1, 10));
            let driver = {
                let table = table.clone();
                thread::spawn(move || {
                    // A redial: the new connection arrives, then the old one closes.
                    assert!(!table.insert(P, 2, 20));
                    assert!(!table.remove(P, 1), "the peer still has connection 2");
                })
            };
            let handler = {
                let table = table.clone();
                thread::spawn(move || {
                    let got = table.get(&P);
                    // Never missing during a redial, and always one that was inserted.
                    assert!(matches!(got, Some(10) | Some(20)), "got {got:?}");
                })
            };
            driver.join().expect("driver");
            handler.join().expect("handler");
            assert_eq!(table.get(&P), Some(20));
            assert!(table.remove(P, 2), "last connection gone: peer disconnected");
            assert_eq!(table.get(&P), None);
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn first_and_last_connections_are_reported() {
        let t = PeerTable::<&str>::default();
        let p = NodeId::from_u64(7);
        assert!(t.insert(p, 1, "a"));
        assert!(!t.insert(p, 2, "b"));
        assert_eq!(t.get(&p), Some("b"));
        assert!(!t.remove(p, 2));
        assert_eq!(t.get(&p), Some("a"));
        assert!(!t.remove(p, 9), "unknown connection changes nothing");
        assert!(t.remove(p, 1));
        assert!(!t.remove(p, 1), "already gone");
        assert_eq!(t.peers(), vec![]);
    }
}
