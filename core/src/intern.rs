//! Where the records a node merges from its peers are kept ([`Intern`], [`Interner`]).

use crate::record::{Record, SharedRecord};
use core::fmt;
use std::sync::Arc;

/// A record's gossip encoding, shared by every queue (and, with a pool, every node) that
/// sends it: one pointer and a length, half the size of a [`bytes::Bytes`] handle, as a full
/// gossip queue holds thousands of them.
pub type Encoding = Arc<[u8]>;

/// A pool of shared records.
///
/// A production node holds one replica, so every record it merges gets its own allocation and
/// every update it queues for gossip its own encoding: that is [`Interner::default`]. A simulator
/// runs thousands of replicas in one process, each holding a copy of nearly the same registry;
/// with an [`Intern`] implementation shared by all of them ([`Interner::shared`]) equal records
/// share one allocation and one encoding. Records are immutable once shared, and sharing only
/// ever hands out a record *equal* to the one given, so no node can tell the difference.
pub trait Intern: Send + Sync + fmt::Debug {
    /// A shared handle to `record`, or to an equal record the pool holds already.
    fn record(&self, record: Record) -> SharedRecord;

    /// The gossip encoding of `record`: one the pool holds for an equal record, or
    /// `encode(record)`, which the pool may keep.
    fn encoding(&self, record: &SharedRecord, encode: &dyn Fn(&Record) -> Option<Encoding>) -> Option<Encoding>;
}

/// The pool a node uses: none (each record its own allocation, the default), or a shared one.
#[derive(Clone, Default)]
pub struct Interner(Option<Arc<dyn Intern>>);

impl Interner {
    /// Records shared through `pool`.
    pub fn shared(pool: Arc<dyn Intern>) -> Interner {
        Interner(Some(pool))
    }

    /// A shared handle to `record`.
    pub fn record(&self, record: Record) -> SharedRecord {
        match &self.0 {
            Some(pool) => pool.record(record),
            None => Arc::new(record),
        }
    }

    /// The gossip encoding of `record`, made by `encode` unless the pool holds one.
    pub fn encoding(&self, record: &SharedRecord, encode: &dyn Fn(&Record) -> Option<Encoding>) -> Option<Encoding> {
        match &self.0 {
            Some(pool) => pool.encoding(record, encode),
            None => encode(record),
        }
    }
}

impl fmt::Debug for Interner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(pool) => pool.fmt(f),
            None => f.write_str("Interner(none)"),
        }
    }
}

impl PartialEq for Interner {
    /// Both unshared, or the same pool.
    fn eq(&self, other: &Interner) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => core::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b)),
            _ => false,
        }
    }
}

impl Eq for Interner {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Hardware, NodeId, Reachability, Role};

    #[test]
    fn without_a_pool_every_record_and_encoding_is_its_own() {
        let interner = Interner::default();
        let r = Record::new(NodeId::from_u64(1), 1, Role::Serving, Hardware::CPU, Reachability::OutboundOnly);
        let a = interner.record(r.clone());
        let b = interner.record(r.clone());
        assert_eq!((*a == r, *b == r), (true, true));
        assert!(!Arc::ptr_eq(&a, &b));
        let encoded = interner.encoding(&a, &|r: &Record| Some(Encoding::from(vec![r.generation as u8])));
        assert_eq!(encoded.as_deref(), Some(&[1u8][..]));
        assert_eq!(interner, Interner::default());
    }
}
