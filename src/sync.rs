//! Locking without poisoning, for the engine's mutexes.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, ignoring poisoning. Every critical section in the engine leaves its data
/// consistent before anything that can panic, so a panicking holder leaves nothing
/// half-done; the one exception, the writer state, is checked separately
/// (`engine::Shared::lock_writer` poisons the store).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
