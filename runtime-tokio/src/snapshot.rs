//! [`SnapshotCell`]: a value that one writer replaces while many readers take it, so that the
//! gateway's request handlers read the registry without waiting on gossip.
//!
//! The cell holds an `Arc<T>` under a mutex whose critical sections are O(1) on both sides:
//! a reader clones the `Arc` (one atomic increment) and lets go; the writer swaps in a new
//! `Arc` it built beforehand. So:
//!
//! - a reader always gets one complete value — the old one or the new one, never a mix — and
//!   keeps it, unchanged, for as long as it likes;
//! - neither side can hold the lock for long, so the writer is never blocked indefinitely by
//!   readers (however many, however slow their work with the value is) and readers never wait
//!   for the writer to *build* a snapshot;
//! - the old value is dropped outside the lock, by whoever holds the last reference.
//!
//! The loom tests at the bottom of this file check exactly these properties over every
//! interleaving of a writer and readers (see the crate docs for the command).

use crate::sync::{lock, Arc, Mutex};

/// A shared, atomically replaced `Arc<T>`. See the module docs.
#[derive(Debug)]
pub struct SnapshotCell<T> {
    current: Mutex<Arc<T>>,
}

impl<T> SnapshotCell<T> {
    /// A cell holding `value`.
    pub fn new(value: T) -> SnapshotCell<T> {
        SnapshotCell { current: Mutex::new(Arc::new(value)) }
    }

    /// The current value. Never waits for more than another caller's `Arc` clone or swap.
    pub fn load(&self) -> Arc<T> {
        Arc::clone(&lock(&self.current))
    }

    /// Replaces the value; readers that already hold the old one keep it.
    pub fn store(&self, value: Arc<T>) {
        let old = std::mem::replace(&mut *lock(&self.current), value);
        // Dropped here, after the lock is released: a large snapshot's destructor never runs
        // inside the critical section.
        drop(old);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::thread;

    /// A snapshot whose fields must agree: a torn read would show `a != b` or a wrong sum.
    struct Pair {
        seq: u32,
        a: Vec<u32>,
        b: Vec<u32>,
    }

    fn pair(seq: u32) -> Pair {
        Pair { seq, a: vec![seq; 3], b: vec![seq; 3] }
    }

    fn check(p: &Pair) {
        assert_eq!(p.a, p.b, "snapshot {} is torn", p.seq);
        assert!(p.a.iter().all(|&x| x == p.seq), "snapshot {} is torn", p.seq);
    }

    #[test]
    fn loom_readers_see_complete_snapshots_in_order() {
        loom::model(|| {
            let cell = Arc::new(SnapshotCell::new(pair(0)));
            let writer = {
                let cell = cell.clone();
                thread::spawn(move || {
                    for seq in 1..=2 {
                        cell.store(Arc::new(pair(seq)));
                    }
                })
            };
            let reader = {
                let cell = cell.clone();
                thread::spawn(move || {
                    let first = cell.load();
                    check(&first);
                    let second = cell.load();
                    check(&second);
                    // One writer: a later load never goes back in time.
                    assert!(second.seq >= first.seq);
                    // A value once loaded stays as it was even after it is replaced.
                    check(&first);
                })
            };
            // Loom fails the model if any interleaving deadlocks: the writer always finishes.
            writer.join().expect("writer");
            reader.join().expect("reader");
            assert_eq!(cell.load().seq, 2, "the last store wins");
        });
    }

    #[test]
    fn loom_a_reader_holding_a_snapshot_never_blocks_the_writer() {
        loom::model(|| {
            let cell = Arc::new(SnapshotCell::new(pair(0)));
            // The main thread holds a snapshot for the whole model run, as a slow request
            // handler would; the writer must still complete both stores.
            let held = cell.load();
            let writer = {
                let cell = cell.clone();
                thread::spawn(move || {
                    cell.store(Arc::new(pair(1)));
                    cell.store(Arc::new(pair(2)));
                })
            };
            let reader = {
                let cell = cell.clone();
                thread::spawn(move || check(&cell.load()))
            };
            writer.join().expect("writer finishes while a snapshot is held");
            reader.join().expect("reader");
            check(&held);
            assert_eq!(held.seq, 0);
            assert_eq!(cell.load().seq, 2);
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn store_replaces_and_old_snapshots_survive() {
        let cell = SnapshotCell::new(1);
        let old = cell.load();
        cell.store(Arc::new(2));
        assert_eq!((*old, *cell.load()), (1, 2));
    }
}
