//! Where the simulator's memory goes: a counting allocator for the live heap (the `cap`
//! crate's, installed as the global allocator of every program that links the simulator with
//! its default feature `count-heap`; without it the live-heap figures are 0), and
//! the nodes' tables by kind ([`tela_core::HeapBytes`]), sampled every five simulated seconds;
//! the report keeps the sample with the largest live heap.

use serde::Serialize;
use std::collections::BTreeMap;
use tela_core::HeapBytes;

/// The system allocator, counting the bytes it holds (a few relaxed atomic operations an
/// allocation). Every program that links the simulator counts.
#[cfg(feature = "count-heap")]
#[global_allocator]
static ALLOCATOR: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

/// Bytes the program holds now (0 without `count-heap`).
pub fn live_bytes() -> u64 {
    #[cfg(feature = "count-heap")]
    return ALLOCATOR.allocated() as u64;
    #[cfg(not(feature = "count-heap"))]
    0
}

/// The most bytes the program held at once (0 without `count-heap`).
pub fn peak_bytes() -> u64 {
    #[cfg(feature = "count-heap")]
    return ALLOCATOR.max_allocated() as u64;
    #[cfg(not(feature = "count-heap"))]
    0
}

/// One sample of where the memory was.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct HeapSample {
    /// Simulated second of the sample.
    pub at_s: u64,
    /// Bytes held, as the allocator counts them.
    pub live_bytes: u64,
    /// The most held at once over the whole run, by the allocator.
    pub peak_live_bytes: u64,
    /// Running nodes.
    pub nodes: usize,
    /// Member entries: the running nodes' replica sizes added up.
    pub entries: u64,
    /// The nodes' tables, bytes by table, all nodes together ([`HeapBytes`]).
    pub tables: BTreeMap<&'static str, u64>,
    /// Records in the shared pool.
    pub pooled_records: usize,
}

impl HeapSample {
    pub(crate) fn take(at_s: u64, tables: HeapBytes, nodes: usize, entries: u64, pooled_records: usize) -> HeapSample {
        HeapSample {
            at_s,
            live_bytes: live_bytes(),
            peak_live_bytes: peak_bytes(),
            nodes,
            entries,
            tables: tables.fields().into_iter().collect(),
            pooled_records,
        }
    }

    /// The nodes' tables together.
    pub fn tables_total(&self) -> u64 {
        self.tables.values().sum()
    }

    /// One line for humans: the live heap, the tables' bytes per entry, the four largest tables.
    pub fn line(&self) -> String {
        let mb = |b: u64| b as f64 / 1e6;
        let mut tables: Vec<_> = self.tables.iter().collect();
        tables.sort_by(|a, b| b.1.cmp(a.1));
        let top: Vec<String> = tables.iter().take(4).map(|(name, b)| format!("{name} {:.0}", mb(**b))).collect();
        format!(
            "heap at {} s: {:.0} MB live (peak {:.0}); node tables {:.0} MB, {:.1} B per entry over {} entries, MB: {}; {} pooled records",
            self.at_s,
            mb(self.live_bytes),
            mb(self.peak_live_bytes),
            mb(self.tables_total()),
            self.tables_total() as f64 / self.entries.max(1) as f64,
            self.entries,
            top.join(", "),
            self.pooled_records
        )
    }
}
