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
use crate::engine::{Shared, View, WriterState};
use crate::error::Result;
use crate::format::Lsn;
use crate::options::Durability;
use crate::wal::Record;
use std::sync::{Arc, MutexGuard};

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
    let (out, logged) = log_and_apply(shared, &mut w, record, apply)?;
    drop(w);
    logged.publish(shared, durability)?;
    Ok(out)
}

/// The half of [`log_and_publish`] done under the writer lock: logs `record` at the
/// next LSN and applies it. What it returns is to be published once the lock is let
/// go ([`Logged::publish`]).
pub(crate) fn log_and_apply<T>(
    shared: &Shared,
    w: &mut WriterState,
    record: &Record<'_>,
    apply: impl FnOnce(&mut WriterState, Lsn) -> Result<T>,
) -> Result<(T, Logged)> {
    let lsn = w.last_lsn.next();
    shared.wal.append(lsn, record)?;
    let out = apply(w, lsn).inspect_err(|e| shared.poison(e))?;
    w.last_lsn = lsn;
    let logged = Logged {
        lsn,
        view: shared.view_of(w),
        checkpoint_due: shared.checkpoint_due(w.dirty_bytes),
    };
    Ok((out, logged))
}

/// A change logged and applied, not yet durable or visible to new readers.
pub(crate) struct Logged {
    lsn: Lsn,
    view: Arc<View>,
    checkpoint_due: bool,
}

impl Logged {
    /// The half of [`log_and_publish`] done after the writer lock is let go: waits for
    /// the fsync (under `Immediate`), publishes the view, and asks for a checkpoint
    /// if one is due.
    pub(crate) fn publish(self, shared: &Shared, durability: Durability) -> Result<()> {
        if durability == Durability::Immediate {
            sync_to(shared, self.lsn)?;
        } else {
            // Bounds the log's buffer between syncs. A failure poisons the store and
            // shows on the next write; this change is applied and visible either way.
            let _ = shared.wal.write_out().inspect_err(|e| shared.poison(e));
        }
        shared.publish(self.view);
        if self.checkpoint_due {
            // The change is durable whatever happens here; a failed checkpoint poisons
            // the store and shows on the next write.
            let _ = checkpoint::request(shared);
        }
        Ok(())
    }
}

/// Waits until everything up to `lsn` is durable; an error poisons the store.
pub(crate) fn sync_to(shared: &Shared, lsn: Lsn) -> Result<()> {
    shared
        .wal
        .sync_to(lsn, &shared.segments)
        .inspect_err(|e| shared.poison(e))
}
