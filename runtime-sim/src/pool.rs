//! The record pool every simulated node on a thread shares: equal records merged by different
//! replicas are one allocation, and their gossip encoding is made once. Without it each of
//! 1,000 replicas holds its own decoded copy of each of 1,000 records; the pool changes no
//! node's behaviour (a node is only ever handed a record equal to the one it decoded).

use foldhash::fast::FixedState;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tela_core::{Encoding, Intern, Interner, Record, SharedRecord};

/// The pool shared by the simulated nodes of this thread.
pub(crate) fn shared_interner() -> Interner {
    SHARED.with(|pool| Interner::shared(pool.clone()))
}

/// Records the pool of this thread holds.
pub(crate) fn pooled_records() -> usize {
    SHARED.with(|pool| pool.lock().held.len())
}

thread_local! {
    static SHARED: Arc<Pool> = Arc::new(Pool::default());
}

/// Pooled records no replica holds any more are dropped when the pool has doubled since the
/// last sweep (and holds at least this many).
const MIN_SWEEP: usize = 1 << 16;

#[derive(Debug, Default)]
struct Pool {
    inner: Mutex<Records>,
}

#[derive(Debug, Default)]
struct Records {
    /// Each distinct record once, with its gossip encoding once a node has queued it.
    held: HashMap<SharedRecord, Option<Encoding>, FixedState>,
    sweep_at: usize,
}

impl Records {
    fn sweep_if_due(&mut self) {
        if self.held.len() < self.sweep_at.max(MIN_SWEEP) {
            return;
        }
        // Only the pool holds it: no replica, queue or datagram in flight refers to it.
        self.held.retain(|record, _| Arc::strong_count(record) > 1);
        self.sweep_at = 2 * self.held.len();
    }
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, Records> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Intern for Pool {
    fn record(&self, record: Record) -> SharedRecord {
        let mut records = self.lock();
        if let Some((held, _)) = records.held.get_key_value(&record) {
            return held.clone();
        }
        records.sweep_if_due();
        let shared = Arc::new(record);
        records.held.insert(shared.clone(), None);
        shared
    }

    fn encoding(&self, record: &SharedRecord, encode: &dyn Fn(&Record) -> Option<Encoding>) -> Option<Encoding> {
        let mut records = self.lock();
        match records.held.get_mut(record) {
            Some(Some(bytes)) => Some(bytes.clone()),
            Some(slot) => {
                let bytes = encode(record)?;
                *slot = Some(bytes.clone());
                Some(bytes)
            }
            // Not pooled (the node's own record, or a join of two versions): not kept.
            None => encode(record),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tela_core::{Hardware, NodeId, Reachability, Role};

    fn record(heartbeat: u64) -> Record {
        let mut r = Record::new(NodeId::from_u64(3), 1, Role::Serving, Hardware::CPU, Reachability::OutboundOnly);
        r.heartbeat = heartbeat;
        r
    }

    #[test]
    fn equal_records_share_one_allocation_and_one_encoding() {
        let pool = Pool::default();
        let a = pool.record(record(1));
        let b = pool.record(record(1));
        let c = pool.record(record(2));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(*c, record(2));
        let calls = std::cell::Cell::new(0);
        let encode = |r: &Record| {
            calls.set(calls.get() + 1);
            Some(Encoding::from(vec![r.heartbeat as u8]))
        };
        assert_eq!(pool.encoding(&a, &encode).as_deref(), Some(&[1u8][..]));
        assert_eq!(pool.encoding(&b, &encode).as_deref(), Some(&[1u8][..]));
        assert_eq!(pool.encoding(&c, &encode).as_deref(), Some(&[2u8][..]));
        assert_eq!(calls.get(), 2, "one encoding per distinct record");
    }

    #[test]
    fn records_no_replica_holds_are_swept() {
        let pool = Pool::default();
        let kept = pool.record(record(0));
        for hb in 1..=(MIN_SWEEP as u64 + 1) {
            drop(pool.record(record(hb)));
        }
        let records = pool.lock();
        assert!(records.held.len() < 10, "{} records left", records.held.len());
        assert!(records.held.contains_key(&*kept));
    }
}
