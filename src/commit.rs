//! The commit protocol every logged change follows: transactions, snapshots, branches
//! and drops alike.
//!
//! ```text
//! writer lock held ── append record (next LSN) ── apply to the writer state
//!   ── view of the new roots ── unlock ── fsync (group commit; Immediate only)
//!   ── publish the view ── request a checkpoint if one is due
//! ```
//! The record is appended under the writer lock, so LSN order is commit order. The
//! new roots are published only once durable (under `Immediate`), so a reader never
//! sees state a crash could take back. A failed append changes nothing; a failed
//! fsync, or a failed apply after the append, poisons the store (memory and log may
//! disagree), and recovery restores the last durable state.

use crate::checkpoint;
use crate::engine::{Shared, WriterState};
use crate::error::Result;
use crate::format::Lsn;
use crate::options::Durability;
use crate::wal::Record;
use std::sync::MutexGuard;

/// Logs `record` at the next LSN, applies it with `apply`, and publishes the result.
///
/// The caller holds the writer lock (`w`) and has checked everything `apply` could
/// refuse, so that a record once logged always applies. Returns what `apply` returns.
pub(crate) fn log_and_publish<T>(
    shared: &Shared,
    mut w: MutexGuard<'_, WriterState>,
    record: &Record<'_>,
    durability: Durability,
    apply: impl FnOnce(&mut WriterState, Lsn) -> Result<T>,
) -> Result<T> {
    let lsn = w.last_lsn.next();
    shared.wal.append(lsn, record)?;
    let out = apply(&mut w, lsn).inspect_err(|e| shared.poison(e))?;
    w.last_lsn = lsn;
    let view = shared.view_of(&w);
    let due = shared.checkpoint_due(w.dirty_bytes);
    drop(w);
    if durability == Durability::Immediate {
        sync_to(shared, lsn)?;
    }
    shared.publish(view);
    if due {
        // The change is durable whatever happens here; a failed checkpoint poisons
        // the store and shows on the next write.
        let _ = checkpoint::request(shared);
    }
    Ok(out)
}

/// Waits until everything up to `lsn` is durable; an error poisons the store.
pub(crate) fn sync_to(shared: &Shared, lsn: Lsn) -> Result<()> {
    shared
        .wal
        .sync_to(lsn, &shared.segments)
        .inspect_err(|e| shared.poison(e))
}
