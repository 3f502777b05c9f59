//! Tagged datagrams: the runtime's side channel between peers that bypasses the core, for
//! what the embedding application exchanges over the federation's connections itself (a
//! gateway's spend counts: `tela_core::spend`).
//!
//! A datagram whose first byte is at least [`FIRST_TAG`] is not the core's (the core's start
//! with its small wire version, `tela_core::WIRE_VERSION`). Load reports (`0xF0`,
//! [`crate::load_report`]) are the runtime's own; any other tag goes to the handler the
//! application registered for it ([`TaggedDatagrams::handle`]), and a tag nobody handles is
//! dropped (counted in [`TaggedDatagrams::unhandled`]) — never handed to the core. Each kind
//! carries its own version after its tag, so that peers of different releases ignore what they
//! cannot read.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use tela_core::NodeId;

/// The lowest tag of a side-channel datagram.
pub const FIRST_TAG: u8 = 0xF0;

/// Whether `datagram` belongs to the side channel rather than to the core.
pub fn is_tagged(datagram: &[u8]) -> bool {
    datagram.first().is_some_and(|&b| b >= FIRST_TAG)
}

/// Takes a datagram of its tag from the (authenticated) peer that sent it.
pub type TaggedHandler = Arc<dyn Fn(NodeId, &[u8]) + Send + Sync>;

/// The handlers of tagged datagrams, by tag.
#[derive(Default)]
pub struct TaggedDatagrams {
    handlers: RwLock<HashMap<u8, TaggedHandler>>,
    unhandled: AtomicU64,
}

impl std::fmt::Debug for TaggedDatagrams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaggedDatagrams").field("unhandled", &self.unhandled()).finish_non_exhaustive()
    }
}

impl TaggedDatagrams {
    /// Hands every datagram starting with `tag` to `handler` from now on (replacing any
    /// previous one). The handler runs on the connection's task: it must not block.
    pub fn handle(&self, tag: u8, handler: impl Fn(NodeId, &[u8]) + Send + Sync + 'static) {
        self.handlers.write().unwrap_or_else(PoisonError::into_inner).insert(tag, Arc::new(handler));
    }

    /// Delivers one tagged datagram from `peer`.
    pub fn deliver(&self, peer: NodeId, datagram: &[u8]) {
        let Some(&tag) = datagram.first() else { return };
        let handler = self.handlers.read().unwrap_or_else(PoisonError::into_inner).get(&tag).cloned();
        match handler {
            Some(handler) => handler(peer, datagram),
            None => {
                self.unhandled.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Datagrams dropped because no handler took their tag.
    pub fn unhandled(&self) -> u64 {
        self.unhandled.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn datagrams_go_to_their_tags_handler_and_unknown_tags_are_dropped() {
        let tagged = TaggedDatagrams::default();
        let got = Arc::new(Mutex::new(Vec::new()));
        let sink = got.clone();
        tagged.handle(0xF1, move |peer, d| sink.lock().expect("lock").push((peer, d.to_vec())));
        let peer = NodeId::from_u64(9);
        tagged.deliver(peer, &[0xF1, 1, 2]);
        tagged.deliver(peer, &[0xF7, 1]);
        tagged.deliver(peer, &[]);
        assert_eq!(*got.lock().expect("lock"), vec![(peer, vec![0xF1, 1, 2])]);
        assert_eq!(tagged.unhandled(), 1);
        assert!(is_tagged(&[0xF0]) && is_tagged(&[0xF1]) && !is_tagged(&[tela_core::WIRE_VERSION]));
        assert!(!is_tagged(&[]));
    }
}
