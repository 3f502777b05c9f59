//! The synchronisation primitives the shared state is built on: `std`'s in normal builds,
//! loom's under `--cfg loom`, so that the same code is what loom model-checks.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning: every critical section in this crate leaves the data
/// consistent before anything in it can panic (they only move `Arc`s and small values).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
